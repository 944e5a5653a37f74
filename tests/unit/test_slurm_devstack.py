"""The pure parts of ckpt_ha.lab.devstack.slurm: reading scontrol records, writing slurm.conf."""

from __future__ import annotations

from pathlib import Path

from ckpt_ha.lab.devstack import slurm

NODE_DOWN = (
    "NodeName=ckpt-node Arch=x86_64 CoresPerSocket=1 State=DOWN+NOT_RESPONDING"
    " Reason=Not responding [root@2026-12-01T13:23:55] CfgTRES=cpu=2,mem=1M,billing=2"
)


def test_a_record_keeps_values_with_spaces_and_equals_signs() -> None:
    record = slurm.parse_record(NODE_DOWN)
    assert record["State"] == "DOWN+NOT_RESPONDING"
    assert record["Reason"] == "Not responding [root@2026-12-01T13:23:55]"
    assert record["CfgTRES"] == "cpu=2,mem=1M,billing=2"


def test_a_job_record_with_slashes_and_colons_in_its_keys() -> None:
    line = "JobId=7 JobState=FAILED Reason=JobLaunchFailure ExitCode=0:9 CPUs/Task=1 Power="
    record = slurm.parse_record(line)
    assert record == {
        "JobId": "7",
        "JobState": "FAILED",
        "Reason": "JobLaunchFailure",
        "ExitCode": "0:9",
        "CPUs/Task": "1",
        "Power": "",
    }
    assert slurm.parse_record("") == {}


def test_the_config_keeps_everything_under_its_folder(tmp_path: Path) -> None:
    text = slurm._config(
        tmp_path,
        controller_port=7001,
        node_port=7002,
        cpus=2,
        kill_wait_s=2,
        slurmd_timeout_s=3,
        cred_expire_s=5,
        epilog_slurmctld=tmp_path / "epilog.sh",
    )
    settings = dict(line.split("=", 1) for line in text.splitlines() if line)
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldLogFile", "SlurmdPidFile"):
        assert settings[key].startswith(str(tmp_path)), key
    assert f"socket={tmp_path}/munge/munge.socket" in settings["AuthInfo"]
    assert (settings["SlurmctldPort"], settings["SlurmdPort"]) == ("7001", "7002")
    assert settings["PreemptType"] == "preempt/partition_prio"
    assert settings["EpilogSlurmctld"] == str(tmp_path / "epilog.sh")
    assert "CPUs=2" in settings["NodeName"]
