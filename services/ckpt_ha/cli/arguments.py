"""The `ckpt-ha` command line: every command, flag and help text, and the argument types that
turn a bad value into one line (exit 2)."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

from ckpt_ha.contracts.checkpoint import CheckpointState
from ckpt_ha.runtime.catalog import SERVICE_NAMES

DISTRIBUTION = "ckpt-ha"


class UsageError(Exception):
    """A bad argument: one line, exit 2."""


def version() -> str:
    """The installed distribution's version."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


class _Version(argparse.Action):
    """``--version``, reading the installed metadata only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        print(f"{parser.prog} {version()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _text(value: str) -> str:
    """A non-empty, single-line argument (reasons and names end up in audit records)."""
    value = value.strip()
    if not value or any(c in value for c in "\r\n\x00"):
        raise argparse.ArgumentTypeError("must be non-empty text on one line")
    return value


def _positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return number


def _non_negative(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError("must be >= 0")
    return number


def _count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return number


_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_AGE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _code(value: str) -> str:
    """A dead letter's error code (``max_deliver``, ``not_ready``): lower case and underscores."""
    if not _CODE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an error code (e.g. max_deliver)")
    return value


def _since(value: str) -> datetime:
    """An ISO 8601 time (UTC unless it names a zone) or an age back from now (``30m``, ``2h``)."""
    age = _AGE.fullmatch(value.strip())
    if age is not None:
        return datetime.now(UTC) - timedelta(seconds=float(age.group(1)) * _UNIT_S[age.group(2)])
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither an ISO 8601 time nor an age such as 30m, 2h, 1d"
        ) from None
    when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    if when > datetime.now(UTC):
        raise argparse.ArgumentTypeError(f"{value!r} is in the future")
    return when


def needs_s3_endpoint(storage: str | None, env: dict[str, str]) -> None:
    """A drill on ``s3://`` runs against a local S3-compatible server the user started: without
    ``AWS_ENDPOINT_URL`` there is none to put the storage link in front of (`UsageError`)."""
    if storage and storage.startswith("s3://") and not env.get("AWS_ENDPOINT_URL"):
        raise UsageError(
            f"--storage {storage} needs AWS_ENDPOINT_URL set to a local S3-compatible server "
            "(e.g. http://127.0.0.1:9000) with the bucket created, and its credentials in "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
        )


def _storage_root(value: str) -> str:
    """``s3://bucket/prefix``, ``file:///path`` or a local path (made absolute)."""
    parts = urlsplit(value)
    if parts.scheme == "s3":
        if not parts.netloc or any(c in value for c in " \r\n\x00"):
            raise argparse.ArgumentTypeError(f"{value!r} is not s3://bucket/prefix")
        return value.rstrip("/")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise argparse.ArgumentTypeError(f"{value!r} is not file:///absolute/path")
        return value
    if parts.scheme or not value.strip():
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither s3://bucket/prefix nor a local path"
        )
    return str(Path(value).expanduser().absolute())


_STORAGE_HELP = (
    "the storage root of the stack: a local path or s3://bucket/prefix on the S3-compatible "
    "server of AWS_ENDPOINT_URL (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), "
    "reached through a storage link the storage-outage drill cuts"
)


def _json(p: argparse.ArgumentParser) -> None:
    """`--json`, the same on every command that reports: stdout carries only the document."""
    p.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON document on stdout (progress and errors: stderr)",
    )


def _progress(p: argparse.ArgumentParser) -> None:
    """`--progress` on long work: shown on stderr anyway when stderr is a terminal."""
    p.add_argument(
        "--progress",
        action="store_true",
        help="report progress on stderr even when it is not a terminal (it always is when it "
        "is one); never on stdout",
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ckpt-ha", description="Make ML-training checkpoints really recoverable.")
    p.add_argument("--version", action=_Version, help="print the installed version and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = sub.add_parser("serve", help="run one service process")
    serve.add_argument("name", choices=SERVICE_NAMES)

    up = sub.add_parser(
        "up", help="start the embedded local stack (NATS, Redis, the five services)"
    )
    up.add_argument("--storage", type=_storage_root, metavar="ROOT", help=_STORAGE_HELP)
    _json(up)
    _json(sub.add_parser("down", help="stop exactly the processes `up` started"))
    st = sub.add_parser("status", help="each component of the local stack and its health")
    _json(st)

    ck = sub.add_parser("checkpoints", help="query the checkpoint registry")
    ck_sub = ck.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ls = ck_sub.add_parser("list", help="a job's checkpoints, newest step first")
    ls.add_argument("--job", required=True)
    ls.add_argument("--state", choices=[s.value for s in CheckpointState])
    _json(ls)
    show = ck_sub.add_parser("show", help="one checkpoint with its history")
    show.add_argument("checkpoint_id")
    _json(show)

    reg = sub.add_parser("registry", help="registry maintenance")
    reg_sub = reg.add_subparsers(dest="action", required=True, parser_class=_Parser)
    rb = reg_sub.add_parser(
        "rebuild",
        help="replay the event stream into an empty registry: checkpoint records, declared "
        "tiers, the restore-coordinator's state and pins",
    )
    rb.add_argument(
        "--clear",
        action="store_true",
        help="first delete everything the rebuild restores (the reconcile log is kept)",
    )
    rb.add_argument(
        "--accept-new-stream",
        action="store_true",
        help="rebuild from an event stream that is not the one the registry was built from "
        "(deleted and created again): only when it is meant to start afresh",
    )
    _json(rb)
    _progress(rb)

    sm = sub.add_parser("streams", help="the event and dead-letter streams (operator only)")
    sm_sub = sm.add_subparsers(dest="action", required=True, parser_class=_Parser)
    _json(
        sm_sub.add_parser(
            "provision", help="create the streams or bring them to the required configuration"
        )
    )
    _json(sm_sub.add_parser("check", help="exit 0 only if both streams are configured as required"))

    rs = sub.add_parser(
        "restores",
        help="a job's restore decisions: plans with their reasons, escalations with the "
        "differences behind them, load outcomes, continuity",
    )
    rs.add_argument("--job", required=True, type=_text)
    _json(rs)

    actor_help = "who acts (default: $CKPT_HA_ACTOR, else the login name); recorded with the action"
    jb = sub.add_parser(
        "job",
        help="a job's timeline (attempts, failures, plans, loads, verdicts, escalations) and the "
        "operator's acts on it: hold, unhold, restore --to, stop",
    )
    jb_sub = jb.add_subparsers(dest="action", required=True, parser_class=_Parser)
    _json(jb_sub.add_parser("list", help="every job in the event stream and where it stands"))
    jsh = jb_sub.add_parser(
        "show", help="one job: attempts, failures, plans, loads, verdicts, escalations, pins"
    )
    jsh.add_argument("job", type=_text)
    _json(jsh)
    for name, text in (
        ("hold", "pause automatic restores of a job (its failures are recorded, not planned)"),
        ("unhold", "resume automatic restores (the latest failure is planned if still undecided)"),
        ("restore", "restore a job from a chosen valid checkpoint of its own (newer ones stay)"),
        ("stop", "stop a job: its runner stops the running attempt and ends the run"),
    ):
        act = jb_sub.add_parser(name, help=text)
        act.add_argument("job", type=_text)
        if name == "restore":
            act.add_argument("--to", required=True, type=_text, metavar="CHECKPOINT_ID",
                             help="a valid checkpoint of this job")  # fmt: skip
        act.add_argument("--reason", type=_text, help="why (recorded)")
        act.add_argument("--actor", type=_text, help=actor_help)
        _json(act)

    dlq = sub.add_parser("dead-letters", help="list dead-lettered messages and why")
    dlq.add_argument("--limit", type=_count, default=50)
    _json(dlq)
    dlq_sub = dlq.add_subparsers(dest="action", parser_class=_Parser)
    rp = dlq_sub.add_parser(
        "replay",
        help="after a fix: re-publish dead letters (original bytes and headers), each once",
        description="Re-publishes the selected dead letters that were not replayed before on "
        "their original subjects, and records each replay in the dead-letter stream; running it "
        "again publishes nothing twice. Refusals of who may say what (location_not_owned, "
        "job_mismatch, forged, unsigned, subject_mismatch, outside_storage_root) are never "
        "replayed.",
    )
    rp.add_argument(
        "--reason",
        type=_code,
        metavar="CODE",
        help="only dead letters with this error code (max_deliver, not_ready, ...)",
    )
    rp.add_argument(
        "--since",
        type=_since,
        metavar="T",
        help="only those dead-lettered since T: an ISO 8601 time (UTC unless it names a zone) "
        "or an age such as 30m, 2h, 1d",
    )
    rp.add_argument(
        "--consumer",
        type=_text,
        metavar="C",
        help="only those refused by this durable consumer (registrar--checkpoints)",
    )
    rp.add_argument("--dry-run", action="store_true", help="show what would be replayed")
    rp.add_argument("--actor", type=_text, help=actor_help)
    _json(rp)

    vf = sub.add_parser(
        "verify", help="offline verdict for one checkpoint folder or file (exit 0 only if valid)"
    )
    vf.add_argument("path", help="a local folder or file, or s3://bucket/prefix")
    _json(vf)
    _progress(vf)
    vf.add_argument("--checksum", choices=["xxh3_64", "sha256"], default="xxh3_64")

    lv = sub.add_parser(
        "latest-valid", help="the newest valid checkpoint under a run's root, and why newer failed"
    )
    lv.add_argument("root", help="a local directory, or s3://bucket/prefix")
    _json(lv)
    _progress(lv)

    qu = sub.add_parser("quarantine", help="take a checkpoint out of restore candidates by hand")
    qu.add_argument("checkpoint_id")
    qu.add_argument("--reason", required=True, type=_text)
    qu.add_argument("--actor", type=_text, help=actor_help)
    _json(qu)
    rl = sub.add_parser(
        "release", help="after a human check: verify a quarantined checkpoint again"
    )
    rl.add_argument("checkpoint_id")
    rl.add_argument("--reason", required=True, type=_text)
    rl.add_argument("--actor", type=_text, help=actor_help)
    _json(rl)

    ow = sub.add_parser("owner", help="which project owns a job's checkpoints")
    ow_sub = ow.add_subparsers(dest="action", required=True, parser_class=_Parser)
    tr = ow_sub.add_parser("transfer", help="move jobs from one project to another (recorded)")
    tr.add_argument("--from", dest="from_project", type=_text, help="the current owner")
    tr.add_argument("--to", dest="to_project", required=True, type=_text)
    tr.add_argument("--job", action="append", type=_text, help="only these jobs (repeatable)")
    tr.add_argument("--reason", required=True, type=_text)
    tr.add_argument("--actor", type=_text, help=actor_help)
    _json(tr)
    osh = ow_sub.add_parser(
        "show", help="a job's owner and its ownership log, or the jobs a project owns"
    )
    which = osh.add_mutually_exclusive_group(required=True)
    which.add_argument("--job")
    which.add_argument("--project", help="every job the project owns, deleted ones included")
    _json(osh)

    po = sub.add_parser("policy", help="checkpoint policy")
    po_sub = po.add_subparsers(dest="action", required=True, parser_class=_Parser)
    adv = po_sub.add_parser(
        "advise",
        help="how often to checkpoint: Young's and Daly's interval, time lost, storage per day",
        description="Either --job J (measured from the registry; any other option overrides "
        "the measured value) or --write-seconds and --mtbf-hours. All numbers are model "
        "estimates. Exit codes: 0 advice given (warnings possible); 1 no interval is workable "
        "(write time >= MTBF), nothing to measure, or a dependency is unreachable; 2 bad "
        "arguments.",
    )
    adv.add_argument("--job", type=_text, help="measure from this job's registry records")
    adv.add_argument("--write-seconds", type=_positive, metavar="S",
                     help="time one checkpoint write holds training up")  # fmt: skip
    adv.add_argument("--mtbf-hours", type=_positive, metavar="H",
                     help="mean time between failures")  # fmt: skip
    adv.add_argument("--restart-seconds", type=_non_negative, metavar="R",
                     help="failure to training again: relaunch + load (default 0)")  # fmt: skip
    adv.add_argument("--current-interval-seconds", type=_positive, metavar="C",
                     help="compute time between checkpoints now (end of one write to the "
                     "start of the next)")  # fmt: skip
    adv.add_argument("--checkpoint-bytes", type=_non_negative, metavar="B",
                     help="size of one checkpoint (with --job: median total_bytes)")  # fmt: skip
    adv.add_argument("--keep", type=_count, metavar="N",
                     help="retention keeps the last N (steady-state footprint)")  # fmt: skip
    adv.add_argument("--prior-mtbf-hours", type=_positive, default=24.0, metavar="H",
                     help="with --job: the MTBF prior, worth one failure (default 24)")  # fmt: skip
    _json(adv)

    pn = sub.add_parser(
        "pin", help="keep a checkpoint for an evaluation or candidate model (retention honours it)"
    )
    pn.add_argument("checkpoint_id")
    pn.add_argument("--by", required=True, type=_text, help="who holds it, e.g. eval:mmlu")
    pn.add_argument("--reason", type=_text, help="default: held by the --by name")
    pn.add_argument("--actor", type=_text, help=actor_help)
    _json(pn)
    up = sub.add_parser("unpin", help="release a pin (retention may then expire the checkpoint)")
    up.add_argument("checkpoint_id")
    up.add_argument("--by", required=True, type=_text)
    up.add_argument("--reason", type=_text, help="default: released by the --by name")
    up.add_argument("--actor", type=_text, help=actor_help)
    _json(up)

    au = sub.add_parser(
        "audit", help="tombstones, expiries and pins: who removed or kept what, when and why"
    )
    au.add_argument("--job")
    au.add_argument("--checkpoint")
    _json(au)

    rc = sub.add_parser(
        "reconcile", help="storage objects the registry does not know (deleted only with --delete)"
    )
    rc.add_argument("--delete", action="store_true", help="delete the reported objects")
    rc.add_argument(
        "--min-age",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="only objects older than this are reported for deletion (default 3600: never a "
        "write in progress)",
    )
    rc.add_argument("--reason", type=_text, help="required with --delete; recorded")
    rc.add_argument("--actor", type=_text, help=actor_help)
    _json(rc)
    _progress(rc)

    rt = sub.add_parser("retention", help="retention by tier")
    rt_sub = rt.add_subparsers(dest="action", required=True, parser_class=_Parser)
    rp = rt_sub.add_parser(
        "plan", help="dry run: what the janitor would expire or delete now, and what protects what"
    )
    rp.add_argument("--job")
    rp.add_argument("--all", action="store_true", help="also list checkpoints simply kept")
    _json(rp)

    ti = sub.add_parser("tier", help="a job's protection tier")
    ti_sub = ti.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ts = ti_sub.add_parser("set", help="record an explicit tier choice for a job")
    ts.add_argument("--job", required=True, type=_text)
    ts.add_argument("tier", type=_text)
    ts.add_argument("--reason", required=True, type=_text)
    ts.add_argument("--actor", type=_text, help=actor_help)
    _json(ts)
    tsh = ti_sub.add_parser("show", help="a job's tier, where it comes from, and the tier table")
    tsh.add_argument("--job")
    _json(tsh)

    run = sub.add_parser(
        "run",
        help="run a training command; on failure relaunch it from the restore-coordinator's plan",
        description="Exit codes: 0 the command succeeded; 1 gave up (--max-attempts) or a "
        "dependency is unreachable; 2 bad arguments; 3 escalated to a human (reason and next "
        "step on stderr); 4 no resume plan within --plan-timeout; 5 a user cancelled the "
        "attempt (scancel; never restored); 128+N stopped by signal N.",
    )
    run.add_argument("--job", required=True, type=_text)
    pol = run.add_mutually_exclusive_group()
    pol.add_argument("--policy", type=Path, help="the job's JobPolicy as a JSON file")
    pol.add_argument("--tier", type=_text, help="only a tier name; the other policy defaults")
    run.add_argument("--run-id", type=_text, help="default: a new id")
    run.add_argument(
        "--plan-timeout",
        type=_positive,
        default=120.0,
        metavar="SECONDS",
        help="after a failure, how long to wait for the coordinator's plan (default 120)",
    )
    run.add_argument("--max-attempts", type=int, metavar="N", help="stop after N attempts")
    run.add_argument(
        "--world-size",
        type=int,
        help="recorded topology (default: torchrun's --nproc-per-node x --nnodes, else 1)",
    )
    run.add_argument("--code-version", type=_text, help="default: $CKPT_HA_CODE_VERSION")
    run.add_argument(
        "--scheduler",
        choices=["local", "slurm"],
        default="local",
        help="local: a child process (default); slurm: each attempt is an sbatch job "
        "(--no-requeue), its end read from scontrol (docs/SCHEDULERS.md)",
    )
    run.add_argument("--partition", type=_text, help="with --scheduler slurm: sbatch --partition")
    run.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="with --scheduler slurm: one more sbatch option, as --sbatch-arg=--mem=4G "
        "(repeatable)",
    )
    run.add_argument(
        "--heartbeat-s",
        type=float,
        metavar="SECONDS",
        help="publish job.heartbeat this often while an attempt runs (default "
        "$CKPT_HA_HEARTBEAT_S, else 10; 0: never, and the attempt is never declared lost)",
    )
    run.add_argument(
        "--deadline-s",
        type=_positive,
        metavar="SECONDS",
        help="silence (no progress, no heartbeat) after which the restore-coordinator declares "
        "an attempt lost (default $CKPT_HA_DEADLINE_S, else the tier's: `ckpt-ha tier show`); "
        "above --heartbeat-s",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="take over a lost run (same --job and --run-id): wait for the coordinator's plan "
        "after the attempt the run's state folder records, then carry on",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")

    dr = sub.add_parser(
        "drill", help="inject a fault into a real job on the embedded stack and prove recovery"
    )
    dr.add_argument(
        "--scenario",
        required=True,
        choices=["node-exit", "storage-outage", "corrupt-checkpoint", "restart-loop",
                 "env-mismatch", "torchrun-dcp", "hf-trainer", "slurm-node-lost", "all"],
        help="the fault to inject; all: every scenario in turn on one stack (the framework "
        "drills only where the torch and hf extras are installed; the others say so) except "
        "slurm-node-lost, which needs Slurm (scripts/slurm-tools)",
    )  # fmt: skip
    dr.add_argument("--json", action="store_true",
                    help="the evidence as JSON: one object, a list of them for all")  # fmt: skip
    dr.add_argument("--report", metavar="DIR",
                    help="write report.md, report.json and a standalone report.html")  # fmt: skip
    dr.add_argument("--budget", type=float, default=300.0, metavar="SECONDS",
                    help="per drill: stop it and report it failed when it runs longer")  # fmt: skip
    dr.add_argument("--storage", type=_storage_root, metavar="ROOT",
                    help=_STORAGE_HELP + " (default: the running stack's, else "
                    "$CKPT_HA_STORAGE_ROOT, else ~/.ckpt-ha/storage)")  # fmt: skip

    co = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Prints a static completion script generated from this command line. "
        'bash: eval "$(ckpt-ha completion bash)" in ~/.bashrc; zsh: eval '
        '"$(ckpt-ha completion zsh)" in ~/.zshrc (after compinit).',
    )
    co.add_argument("shell", choices=["bash", "zsh"])

    demo = sub.add_parser("demo", help="start the stack, write a checkpoint, show it registered")
    demo.add_argument("--job", default="demo-job")
    demo.add_argument("--step", type=int, default=100)
    return p
