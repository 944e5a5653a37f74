"""A private single-node Slurm cluster under one folder, for tests and drills.

`start` launches a MUNGE daemon with its own key and socket, a ``slurmctld`` and a ``slurmd``
on free loopback ports, all configured by ``HOME/slurm.conf`` (state, spool, logs and pid files
under ``HOME``); `stop` cancels what still runs on it and stops exactly those processes, by pid.
Clients reach the cluster through ``SLURM_CONF`` (`SlurmCluster.env`, `SlurmCluster.run`). No
system configuration is read or written: several clusters can run side by side, next to a
system Slurm if there is one. The binaries come from Debian's ``slurmctld``, ``slurmd``,
``slurm-client`` and ``munge`` packages (``scripts/slurm-tools`` installs them).

The configuration is the smallest one that shows every way a batch job can end:

* one node ``NODE`` with the machine's CPUs (``SlurmdParameters=config_overrides``: what the
  config says is what the node has, so a container's odd topology never drains it);
* two partitions: ``low`` (the default, ``PriorityTier=1``) and ``high`` (``PriorityTier=10``),
  with ``PreemptType=preempt/partition_prio`` and ``PreemptMode=REQUEUE``: a job in ``high``
  that needs the CPUs preempts the ``low`` jobs, which are requeued (or, submitted with
  ``--no-requeue``, end as ``PREEMPTED``);
* ``ReturnToService=2``: a node set DOWN by ``scontrol update`` comes back as soon as its
  ``slurmd`` answers; ``SlurmdTimeout`` short, so a dead ``slurmd`` is a DOWN node in seconds;
* the scheduler runs every second;
* ``KillWait`` short (SIGTERM, then SIGKILL that much later), ``MinJobAge`` long (finished jobs
  stay visible to ``scontrol show job``), ``cred_expire`` short (a requeued job waits
  ``cred_expire + 1`` seconds before it may start again);
* ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``: no cgroups needed, hence no
  ``OUT_OF_MEMORY`` state either (a kernel OOM kill is a job FAILED by signal 9);
* no accounting daemon: ``sacct`` has nothing; ``scontrol show job`` is the record.

The daemons run as the calling user (``SlurmUser``/``SlurmdUser``), which need not be root: a
cluster started by an unprivileged user runs that user's jobs. Only installing the packages needs
root.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_ha.core.scontrol import parse_record
from ckpt_ha.lab.devstack import procs
from ckpt_ha.lab.devstack.procs import ManagedProcess

__all__ = [
    "HIGH_PARTITION",
    "LOW_PARTITION",
    "NODE",
    "SlurmCluster",
    "SlurmCommandFailed",
    "SlurmError",
    "binary",
    "cluster",
    "parse_record",
    "record_epilog",
    "restart_slurmd",
    "start",
    "stop",
]

NODE = "ckpt-node"
"""The one node's name (``slurmd -N``); it listens on 127.0.0.1 whatever the host is called."""
LOW_PARTITION = "low"
HIGH_PARTITION = "high"
SERVER_BINARIES = ("munged", "slurmctld", "slurmd", "slurmstepd")
CLIENT_BINARIES = ("sbatch", "scontrol", "squeue", "sinfo", "scancel")
_INSTALL_HINT = "run scripts/slurm-tools (Debian's slurmctld, slurmd, slurm-client and munge)"
_STOP_JOBS_TIMEOUT = 15.0
_SERVING = {"IDLE", "ALLOCATED", "MIXED", "COMPLETING"}


class SlurmError(Exception):
    """The private cluster could not be started, reached or stopped."""


class SlurmCommandFailed(SlurmError):
    """A Slurm client command exited non-zero; ``stderr`` says why."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"{' '.join(argv)} exited {returncode}: {stderr.strip()}")


def binary(name: str) -> Path:
    """The path of a Slurm or MUNGE program (daemons live in /usr/sbin, often not on PATH)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        raise SlurmError(f"{name} not found on PATH nor in /usr/sbin; {_INSTALL_HINT}")
    return Path(found)


@dataclass(frozen=True)
class SlurmCluster:
    """A running private cluster: where its files are and the processes that serve it."""

    home: Path
    controller_port: int
    node_port: int
    cpus: int
    processes: tuple[ManagedProcess, ...] = field(repr=False)
    startup_s: float = 0.0

    @property
    def conf(self) -> Path:
        return self.home / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The variables a Slurm client needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def process(self, name: str) -> ManagedProcess:
        """One of ``munged``, ``slurmctld``, ``slurmd``."""
        for proc in self.processes:
            if proc.name == name:
                return proc
        raise KeyError(name)

    def run(self, *argv: str, timeout: float = 20, check: bool = True) -> str:
        """Run a client (``sbatch``, ``scontrol``, ...) against this cluster; its stdout."""
        args = [str(binary(argv[0])), *argv[1:]]
        done = subprocess.run(
            args,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise SlurmCommandFailed(argv, done.returncode, done.stderr)
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o JOB_ID`` as a dict (``JobState``, ``Reason``, ``ExitCode``...)."""
        return parse_record(self.run("scontrol", "show", "job", "-o", job_id).strip())

    def node(self) -> dict[str, str]:
        """``scontrol show node -o NODE`` as a dict (``State``, ``Reason``, ...)."""
        return parse_record(self.run("scontrol", "show", "node", "-o", NODE).strip())

    def jobs(self) -> list[str]:
        """The ids of the jobs ``squeue`` still lists (pending, running, completing)."""
        return self.run("squeue", "-h", "-o", "%i").split()


def _config(
    home: Path,
    *,
    controller_port: int,
    node_port: int,
    cpus: int,
    kill_wait_s: int,
    slurmd_timeout_s: int,
    cred_expire_s: int,
    epilog_slurmctld: Path | None,
) -> str:
    host = socket.gethostname().split(".")[0]  # slurmctld refuses to run on a host not named
    user = pwd.getpwuid(os.geteuid()).pw_name  # the daemons run as whoever starts them
    lines = [
        "ClusterName=ckptha",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={controller_port}",
        f"SlurmdPort={node_port}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={home / 'munge' / 'munge.socket'},cred_expire={cred_expire_s}",
        f"StateSaveLocation={home / 'state'}",
        f"SlurmdSpoolDir={home / 'spool'}",
        f"SlurmctldPidFile={home / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={home / 'run' / 'slurmd.pid'}",
        f"SlurmctldLogFile={home / 'logs' / 'slurmctld.daemon.log'}",
        f"SlurmdLogFile={home / 'logs' / 'slurmd.daemon.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SchedulerType=sched/backfill",
        # Schedule every second (defaults: batch jobs delayed up to 3 s, pending jobs looked at
        # again every 30 s by backfill, 60 s by the main loop), so a requeued job restarts soon
        # after its cred_expire + 1 seconds.
        "SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "JobRequeue=1",
        "ReturnToService=2",
        f"SlurmdTimeout={slurmd_timeout_s}",
        "MessageTimeout=3",
        f"KillWait={kill_wait_s}",
        "MinJobAge=86400",
        "SlurmdParameters=config_overrides",
        f"NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName={LOW_PARTITION} Nodes={NODE} Default=YES PriorityTier=1"
        " PreemptMode=REQUEUE MaxTime=INFINITE State=UP",
        f"PartitionName={HIGH_PARTITION} Nodes={NODE} PriorityTier=10"
        " PreemptMode=OFF MaxTime=INFINITE State=UP",
    ]
    if epilog_slurmctld is not None:
        lines.append(f"EpilogSlurmctld={epilog_slurmctld}")
    return "\n".join(lines) + "\n"


def _node_serving(conf: Path) -> bool:
    """Whether the controller counts the node as up (idle, or running jobs) and responding."""
    done = subprocess.run(
        [str(binary("scontrol")), "show", "node", "-o", NODE],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    state = parse_record(done.stdout.strip()).get("State", "").split("+")
    return done.returncode == 0 and state[0] in _SERVING and "NOT_RESPONDING" not in state


def _start_slurmd(home: Path, timeout: float) -> ManagedProcess:
    conf = home / "slurm.conf"
    return procs.start_process(
        "slurmd",
        [str(binary("slurmd")), "-D", "-f", str(conf), "-N", NODE],
        home=home,
        env={"SLURM_CONF": str(conf)},
        marker="slurmd",
        ready=lambda: _node_serving(conf),
        timeout=timeout,
    )


def restart_slurmd(cluster: SlurmCluster, *, timeout: float = 30) -> SlurmCluster:
    """Start the node's ``slurmd`` again (after a drill killed it) and wait until the
    controller counts the node as up; the same cluster with the new process."""
    try:
        fresh = _start_slurmd(cluster.home, timeout)
    except procs.ProcsError as exc:
        raise SlurmError(f"slurmd of the cluster in {cluster.home} did not restart: {exc}") from exc
    kept = tuple(p for p in cluster.processes if p.name != "slurmd")
    return dataclasses.replace(cluster, processes=(*kept, fresh))


def start(
    home: Path,
    *,
    cpus: int | None = None,
    kill_wait_s: int = 2,
    slurmd_timeout_s: int = 3,
    cred_expire_s: int = 5,
    epilog_slurmctld: Path | None = None,
    timeout: float = 30,
) -> SlurmCluster:
    """Start a cluster in ``home`` (which should be fresh) and wait until its node is IDLE.

    ``epilog_slurmctld`` is a script the controller runs when each job ends (Slurm's
    ``EpilogSlurmctld``; it gets ``SLURM_JOB_ID``, ``SLURM_JOB_EXIT_CODE2`` and the like, but
    not ``SLURM_CONF``). Raises `SlurmError` (with the log of the daemon that failed) on
    failure, after stopping whatever it had started.
    """
    for name in (*SERVER_BINARIES, *CLIENT_BINARIES):
        binary(name)
    began = time.monotonic()
    home = home.resolve()
    for sub in ("munge", "state", "spool", "run", "logs"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    key = home / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    controller_port, node_port = procs.free_port(), procs.free_port()
    cpus = cpus or os.cpu_count() or 1
    conf = home / "slurm.conf"
    conf.write_text(
        _config(
            home,
            controller_port=controller_port,
            node_port=node_port,
            cpus=cpus,
            kill_wait_s=kill_wait_s,
            slurmd_timeout_s=slurmd_timeout_s,
            cred_expire_s=cred_expire_s,
            epilog_slurmctld=epilog_slurmctld,
        )
    )
    socket_path = home / "munge" / "munge.socket"
    env = {"SLURM_CONF": str(conf)}
    started: list[ManagedProcess] = []
    try:
        # -f: run even when a folder above the socket is not searchable by everyone (a 0700
        # temporary folder); only root and this user use the socket.
        started.append(
            procs.start_process(
                "munged",
                [
                    str(binary("munged")),
                    "--foreground",
                    "--force",
                    f"--key-file={key}",
                    f"--socket={socket_path}",
                    f"--pid-file={home / 'run' / 'munged.pid'}",
                    f"--seed-file={home / 'munge' / 'munged.seed'}",
                    f"--log-file={home / 'logs' / 'munged.daemon.log'}",
                ],
                home=home,
                ready=socket_path.exists,
                timeout=timeout,
            )
        )
        started.append(
            procs.start_process(
                "slurmctld",
                [str(binary("slurmctld")), "-D", "-i", "-f", str(conf)],
                home=home,
                env=env,
                port=controller_port,
                timeout=timeout,
            )
        )
        started.append(_start_slurmd(home, timeout))
    except procs.ProcsError as exc:
        for proc in reversed(started):
            procs.stop(proc, timeout=5)
        raise SlurmError(f"the private Slurm cluster in {home} did not start: {exc}") from exc
    return SlurmCluster(
        home=home,
        controller_port=controller_port,
        node_port=node_port,
        cpus=cpus,
        processes=tuple(started),
        startup_s=time.monotonic() - began,
    )


def _own_leftovers(conf: Path) -> list[int]:
    """Pids of processes started for this cluster that outlive its daemons: each slurmstepd
    and job process inherits ``SLURM_CONF`` pointing at this cluster's config."""
    wanted = f"SLURM_CONF={conf}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def stop(cluster: SlurmCluster) -> None:
    """Cancel its jobs, stop its daemons, and SIGKILL any job process left. Idempotent."""
    with contextlib.suppress(SlurmError, OSError, subprocess.TimeoutExpired):
        pending = cluster.jobs()
        if pending:
            cluster.run("scancel", *pending, check=False)
            deadline = time.monotonic() + _STOP_JOBS_TIMEOUT
            while cluster.jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
    for proc in reversed(cluster.processes):
        procs.stop(proc, timeout=5)
    for pid in _own_leftovers(cluster.conf):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def cluster(
    home: Path | None = None, *, epilog: bool = False, cpus: int | None = None
) -> Iterator[SlurmCluster]:
    """`start` a cluster (in a new temporary folder, removed afterwards, when ``home`` is None)
    and `stop` it on the way out, however the block ends. ``epilog``: with `record_epilog`'s
    script as its ``EpilogSlurmctld``."""
    own = home is None
    folder = Path(tempfile.mkdtemp(prefix="ckpt-ha-slurm-")) if home is None else home
    try:
        script = record_epilog(folder) if epilog else None
        running = start(folder, cpus=cpus, epilog_slurmctld=script)
        try:
            yield running
        finally:
            stop(running)
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)


def record_epilog(home: Path) -> Path:
    """Write an ``EpilogSlurmctld`` script that records, for each job end, the environment the
    controller gave it and what ``scontrol show job`` said at that moment, in
    ``home/epilog/<job id>.<nanoseconds>.{env,job}``; returns its path."""
    conf = home.resolve() / "slurm.conf"
    folder = home.resolve() / "epilog"
    folder.mkdir(parents=True, exist_ok=True)
    script = home.resolve() / "epilog-slurmctld.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'out="{folder}/$SLURM_JOB_ID.$(date +%s%N)"\n'
        'env | sort > "$out.env.tmp" && mv "$out.env.tmp" "$out.env"\n'
        f'SLURM_CONF="{conf}" {binary("scontrol")} show job -o "$SLURM_JOB_ID"'
        ' > "$out.job.tmp" 2>&1\n'
        'mv "$out.job.tmp" "$out.job"\n'
    )
    script.chmod(0o755)
    return script
