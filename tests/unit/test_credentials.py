"""Secrets come from NAME or NAME_FILE (one place), are SecretStr, and never show in a repr, a
log line, an error message or a URL shown to an operator."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import SecretStr

from ckpt_ha import credentials, sdk
from ckpt_ha.bus.config import BusConfig
from ckpt_ha.cli.main import main
from ckpt_ha.contracts.checkpoint import RuntimeEnvironment
from ckpt_ha.registry.client import RedisConfig
from ckpt_ha.runner.launch import RunSpec, child_env
from ckpt_ha.runner.settings import RunnerSettings
from ckpt_ha.runtime.settings import ServiceSettings
from ckpt_ha.sdk import protocol

SECRET = "s3cr3t-value-that-must-not-leak"
SIGNING_KEY = "5ec7e7" * 11


def test_a_secret_comes_from_the_variable_or_from_its_file(tmp_path: Path) -> None:
    file = tmp_path / "pw"
    file.write_text(SECRET + "\n\n")
    assert credentials.read_secret({}, "X") is None
    assert credentials.read_secret({"X": ""}, "X") is None
    found = credentials.read_secret({"X": SECRET}, "X")
    assert found is not None
    assert found.get_secret_value() == SECRET
    from_file = credentials.read_secret({"X_FILE": str(file)}, "X")
    assert from_file is not None
    # One trailing newline is what `echo pw > file` adds; a second one is the secret's own.
    assert from_file.get_secret_value() == SECRET + "\n"


def test_an_unreadable_file_or_both_forms_are_one_line_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(credentials.SecretUnreadable) as exc:
        credentials.read_secret({"X_FILE": str(missing)}, "X")
    assert str(exc.value) == f"$X_FILE: cannot read {missing}: No such file or directory"
    with pytest.raises(credentials.SecretUnreadable, match=r"set \$X or \$X_FILE, not both"):
        credentials.read_secret({"X": "a", "X_FILE": str(missing)}, "X")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        (f"redis://registrar:{SECRET}@h:6379/0", "redis://registrar:***@h:6379/0"),
        (f"rediss://:{SECRET}@h:6380", "rediss://:***@h:6380"),
        (f"nats://{SECRET}@h:4222", "nats://***@h:4222"),
        (f"tls://u:{SECRET}@h:4222", "tls://u:***@h:4222"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert credentials.redact_url(url) == shown


def test_service_settings_read_every_secret_from_a_file_and_hide_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("NATS_PASSWORD", "REDIS_PASSWORD"):
        path = tmp_path / name
        path.write_text(f"{SECRET}-{name}\n")
        monkeypatch.setenv(f"CKPT_HA_{name}_FILE", str(path))
    (tmp_path / "signing.key").write_text(SIGNING_KEY + "\n")
    monkeypatch.setenv("CKPT_HA_SIGNING_KEY_FILE", str(tmp_path / "signing.key"))
    monkeypatch.setenv("CKPT_HA_REDIS_USER", "registrar")
    monkeypatch.setenv("REDIS_URL", f"redis://u:{SECRET}@127.0.0.1:1/0")
    s = ServiceSettings()
    assert s.nats_password == SecretStr(f"{SECRET}-NATS_PASSWORD")
    assert s.redis_password == SecretStr(f"{SECRET}-REDIS_PASSWORD")
    assert s.signing_key == SecretStr(SIGNING_KEY)
    assert s.bus().signing_keys == (bytes.fromhex(SIGNING_KEY),)
    redis_cfg, bus_cfg = s.redis(), s.bus()
    assert redis_cfg.user == "registrar"
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("test").info("settings %r %s %r %r", s, s, redis_cfg, bus_cfg)
    shown = [repr(s), str(s), repr(redis_cfg), repr(bus_cfg), caplog.text, redis_cfg.shown_url]
    assert all(f"{SECRET}-" not in text and SIGNING_KEY not in text for text in shown)
    assert redis_cfg.shown_url == "redis://u:***@127.0.0.1:1/0"


def test_runner_settings_read_the_job_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "job").write_text(SECRET)
    monkeypatch.setenv("CKPT_HA_JOB_NATS_USER", "job")
    monkeypatch.setenv("CKPT_HA_JOB_NATS_PASSWORD_FILE", str(tmp_path / "job"))
    job_bus = RunnerSettings().job_bus()
    assert job_bus is not None
    assert (job_bus.user, job_bus.password) == ("job", SecretStr(SECRET))


def test_a_ca_file_with_a_plaintext_url_is_refused() -> None:
    with pytest.raises(credentials.PlaintextWithCa, match="CKPT_HA_NATS_CA_FILE"):
        BusConfig(url="nats://h:4222", ca_file="/ca.pem")
    with pytest.raises(credentials.PlaintextWithCa, match="CKPT_HA_REDIS_CA_FILE"):
        RedisConfig(url=f"redis://:{SECRET}@h:6379", ca_file="/ca.pem")
    with pytest.raises(credentials.PlaintextWithCa) as exc:
        sdk.BusEndpoint("nats://h:4222", ca_file="/ca.pem")
    assert SECRET not in str(exc.value)
    assert BusConfig(url="tls://h:4222", ca_file=None).tls() is not None  # system trust store
    assert BusConfig(url="nats://h:4222").tls() is None


def test_the_sdk_reads_its_password_file_and_says_which_variable_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text(SECRET + "\n")
    env = {
        protocol.JOB: "j",
        protocol.NATS_URL: "nats://h:4222",
        protocol.NATS_USER: "job",
        protocol.NATS_PASSWORD + "_FILE": str(tmp_path / "pw"),
    }
    ctx = sdk.context(env)
    assert ctx is not None
    assert ctx.bus is not None
    assert ctx.bus.password == SecretStr(SECRET)
    assert SECRET not in repr(ctx)
    env[protocol.NATS_PASSWORD + "_FILE"] = str(tmp_path / "gone")
    with pytest.raises(protocol.BadContext, match=r"^\$CKPT_HA_NATS_PASSWORD_FILE: cannot read"):
        sdk.context(env)


def test_the_training_process_gets_the_job_login_and_none_of_the_runners(tmp_path: Path) -> None:
    spec = RunSpec("job-e", "run-e", ("train",), "/data/ckpt", tmp_path)
    base = {
        "PATH": "/bin",
        "CKPT_HA_NATS_USER": "runner",
        "CKPT_HA_NATS_PASSWORD_FILE": "/secrets/nats-runner.password",
        "CKPT_HA_REDIS_PASSWORD": "runner-redis",
        "CKPT_HA_SIGNING_KEY_FILE": "/secrets/signing.key",
        "CKPT_HA_JOB_NATS_PASSWORD": "job-pw",
    }
    job_bus = BusConfig(url="tls://n:4222", user="job", password=SecretStr("job-pw"), ca_file="/ca")
    env = child_env(base, spec, job_bus, 1, RuntimeEnvironment(python_version="3.11"), None)
    assert env[protocol.NATS_USER] == "job"
    assert env[protocol.NATS_PASSWORD] == "job-pw"
    assert env[protocol.NATS_CA_FILE] == "/ca"
    for name in ("CKPT_HA_NATS_PASSWORD_FILE", "CKPT_HA_REDIS_PASSWORD", "CKPT_HA_SIGNING_KEY_FILE",
                 "CKPT_HA_JOB_NATS_PASSWORD"):  # fmt: skip
        assert name not in env, name
    ctx = sdk.context(env)
    assert ctx is not None
    assert ctx.bus is not None
    assert (ctx.bus.user, ctx.bus.ca_file) == ("job", "/ca")


def test_a_missing_password_file_is_one_line_from_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CKPT_HA_HOME", str(tmp_path))
    monkeypatch.setenv("CKPT_HA_REDIS_PASSWORD_FILE", str(tmp_path / "missing"))
    # The configuration names a secret that cannot be read: a usage error.
    assert (
        main(["checkpoints", "list", "--job", "j"]) == 2
    )  # the configuration names a secret that cannot be read
    err = capsys.readouterr().err
    assert err == (
        f"ckpt-ha: $CKPT_HA_REDIS_PASSWORD_FILE: cannot read {tmp_path / 'missing'}: "
        "No such file or directory\n"
    )


def test_status_shows_component_urls_without_passwords(tmp_path: Path) -> None:
    from ckpt_ha.lab.devstack import stack
    from ckpt_ha.lab.devstack.procs import ManagedProcess
    from ckpt_ha.runtime import local_stack

    proc = ManagedProcess(
        name="redis", pid=2**22 + 1, port=1, url=f"redis://op:{SECRET}@h:1/0", log_path=tmp_path
    )
    state = local_stack.StackState(tmp_path, "", "", str(tmp_path), (proc,))
    [row] = stack.status(state)
    assert row.url == "redis://op:***@h:1/0"


def test_the_stack_state_file_is_the_owners_alone(tmp_path: Path) -> None:
    """A URL given with a password in it is kept in stack.json as given: owner-only."""
    from ckpt_ha.runtime import local_stack

    state = local_stack.StackState(tmp_path, f"nats://op:{SECRET}@h:1", "", str(tmp_path), ())
    (tmp_path / local_stack.STATE_FILE).write_text("{}")  # an older, world-readable one is replaced
    (tmp_path / local_stack.STATE_FILE).chmod(0o644)
    state.save()
    assert (tmp_path / local_stack.STATE_FILE).stat().st_mode & 0o777 == 0o600
    loaded = local_stack.StackState.load(tmp_path)
    assert loaded is not None
    assert loaded.nats_url == state.nats_url


def test_the_sdk_logs_its_bus_without_the_password(caplog: pytest.LogCaptureFixture) -> None:
    import time

    from ckpt_ha.sdk import publisher

    bus = sdk.BusEndpoint(f"nats://job:{SECRET}@127.0.0.1:9", timeout_s=0.2, retry_after_s=0.1)
    ctx = protocol.Context(job_id="j", run_id="r", attempt=1, storage_root=None, bus=bus)
    with caplog.at_level(logging.DEBUG, logger="ckpt_ha.sdk"):
        sdk.progress(10, metrics={"loss": 1.0}, ctx=ctx)
        deadline = time.monotonic() + 10
        while "cannot reach NATS" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        publisher.close_all()
    assert "cannot reach NATS at nats://job:***@127.0.0.1:9" in caplog.text
    assert SECRET not in caplog.text
