"""Named contexts and the rule behind them: one command talks to one platform. A context names
NATS, Redis and the storage together; endpoints half from the environment, a half-set context,
or a context beside NATS_URL are one line and exit 2, before anything is reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_ha.cli import context, contexts
from ckpt_ha.cli.arguments import UsageError
from ckpt_ha.cli.main import main
from ckpt_ha.runner.settings import RunnerSettings
from ckpt_ha.runtime import local_stack

ENDPOINT_VARIABLES = ("NATS_URL", "REDIS_URL", "CKPT_HA_STORAGE_ROOT", "CKPT_HA_CONTEXT",
                      "CKPT_HA_CONTEXTS", "CKPT_HA_NATS_USER", "CKPT_HA_NATS_PASSWORD",
                      "CKPT_HA_REDIS_USER", "CKPT_HA_REDIS_PASSWORD")  # fmt: skip


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CKPT_HA_HOME", str(tmp_path))
    (tmp_path / "nats-viewer").write_text("nats-secret\n")
    (tmp_path / "contexts.toml").write_text(
        """
current = "staging"

[contexts.prod]
nats_url = "tls://nats.prod:4222"
redis_url = "rediss://redis.prod:6379/0"
storage_root = "s3://ckpt/prod"
nats_user = "viewer"
nats_password_file = "nats-viewer"
registry_prefix = "prod"

[contexts.prod.health]
registrar = ["http://registrar-0:8080", "http://registrar-1:8080"]

[contexts.staging]
nats_url = "nats://nats.staging:4222"
redis_url = "redis://redis.staging:6379/0"
storage_root = "/mnt/staging"

[contexts.half]
nats_url = "nats://nats.half:4222"
storage_root = "/mnt/half"
"""
    )
    return tmp_path


@pytest.fixture
def stack(home: Path) -> local_stack.StackState:
    """A local stack's state file beside the contexts: never used when a context is chosen."""
    local_stack.StackSecrets.of(home).ensure()
    state = local_stack.StackState(
        home, "nats://127.0.0.1:1", "redis://127.0.0.1:2/0", str(home / "local"), (),
        nats_secured=True, redis_secured=True,
    )  # fmt: skip
    state.save()
    return state


def test_a_chosen_context_gives_every_endpoint_and_reads_its_secrets_from_files(
    home: Path, stack: local_stack.StackState
) -> None:
    s = context.settings({"CKPT_HA_CONTEXT": "prod"}, home)
    assert (s.nats_url, s.redis_url, s.storage_root) == (
        "tls://nats.prod:4222", "rediss://redis.prod:6379/0", "s3://ckpt/prod",
    )  # fmt: skip
    assert (s.nats_user, s.registry_prefix) == ("viewer", "prod")
    assert s.nats_password is not None
    assert s.nats_password.get_secret_value() == "nats-secret"  # relative to the file
    assert s.redis_user is None  # nothing of the local stack's logins
    assert s.signing_key is None
    where = context.where({"CKPT_HA_CONTEXT": "prod"}, home)
    assert where.context is not None
    assert where.context.health["registrar"] == ("http://registrar-0:8080",
                                                 "http://registrar-1:8080")  # fmt: skip
    assert where.describe(home) == f"prod (from {home / 'contexts.toml'})"


def test_the_files_current_context_applies_unless_one_is_chosen(home: Path) -> None:
    assert context.settings({}, home).nats_url == "nats://nats.staging:4222"
    assert context.settings({"CKPT_HA_CONTEXT": "prod"}, home).nats_url == "tls://nats.prod:4222"


def test_no_context_file_and_no_endpoints_is_the_local_stack(
    home: Path, stack: local_stack.StackState
) -> None:
    (home / "contexts.toml").unlink()
    s = context.settings({}, home)
    assert (s.nats_url, s.redis_url, s.storage_root) == (
        stack.nats_url, stack.redis_url, stack.storage_root,
    )  # fmt: skip
    assert (s.nats_user, s.redis_user) == ("operator", "operator")
    assert context.where({}, home).describe(home) == f"none: the local stack under {home}"


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--context", "half"], {}, "context 'half'"),
        (["--context", "nope"], {}, "no context 'nope' in"),
        (["--context", "prod"], {"NATS_URL": "nats://x:4222"}, "context 'prod' and $NATS_URL"),
        ([], {"CKPT_HA_CONTEXT": "prod", "CKPT_HA_STORAGE_ROOT": "/x"}, "$CKPT_HA_STORAGE_ROOT"),
        ([], {"CKPT_HA_CONTEXT": "", "NATS_URL": "nats://x:4222"}, "$NATS_URL is set but"),
    ],
)
def test_a_mix_of_endpoints_is_one_line_and_exit_2(
    home: Path,
    stack: local_stack.StackState,
    argv: list[str],
    env: dict[str, str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if "CKPT_HA_CONTEXT" in env and not env["CKPT_HA_CONTEXT"]:
        (home / "contexts.toml").unlink()  # no current context: the environment's half
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main([*argv, "checkpoint", "list", "--job", "j"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("ckpt-ha: ")
    assert says in err


def test_a_half_set_context_says_what_it_lacks(home: Path) -> None:
    with pytest.raises(UsageError, match="names nats_url, storage_root but not redis_url"):
        context.settings({"CKPT_HA_CONTEXT": "half"}, home)


def test_redis_url_alone_is_refused_without_a_local_stack_too(home: Path) -> None:
    (home / "contexts.toml").unlink()
    with pytest.raises(UsageError, match=r"\$REDIS_URL is set but \$NATS_URL is not"):
        context.settings({"REDIS_URL": "redis://x:6379/0"}, home)


def test_the_runner_talks_to_nats_only_so_nats_url_alone_is_whole(
    home: Path, stack: local_stack.StackState, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / "contexts.toml").unlink()
    monkeypatch.setenv("NATS_URL", "nats://cluster:4222")
    runner = context.settings_of(RunnerSettings, {"NATS_URL": "nats://cluster:4222"}, home,
                                 "runner")  # fmt: skip
    assert (runner.nats_url, runner.nats_user) == ("nats://cluster:4222", None)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[contexts.a]\nnats_password = "x"', "nats_password by value; name its file"),
        ('[contexts.a]\nnats_ur = "x"', "unknown setting 'nats_ur'"),
        ('[contexts.a]\nhealth = "x"', "health = { SERVICE"),
        ("current = [", "cannot read the contexts"),
    ],
)
def test_a_bad_contexts_file_names_itself(home: Path, text: str, says: str) -> None:
    (home / "contexts.toml").write_text(text)
    with pytest.raises(UsageError, match=says) as caught:
        contexts.load(home / "contexts.toml")
    assert str(home / "contexts.toml") in str(caught.value)
