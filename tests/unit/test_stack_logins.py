"""Every process of the embedded stack gets exactly its own login (no processes started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_ha.bus import permissions
from ckpt_ha.cli import context
from ckpt_ha.registry import acl
from ckpt_ha.runner.settings import RunnerSettings
from ckpt_ha.runtime import local_stack


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> local_stack.StackState:
    for name in ("NATS_URL", "REDIS_URL", "CKPT_HA_NATS_USER", "CKPT_HA_NATS_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    keep = local_stack.StackSecrets.of(tmp_path)
    keep.ensure()
    found = local_stack.StackState(
        tmp_path, "nats://127.0.0.1:1", "redis://127.0.0.1:2/0", str(tmp_path), (),
        nats_secured=True, redis_secured=True,
    )  # fmt: skip
    found.save()
    return found


def test_secrets_are_generated_once_private_and_distinct(state: local_stack.StackState) -> None:
    keep = state.secrets
    files = sorted(keep.folder.iterdir())
    assert {p.name for p in files} == {
        *(f"nats-{u}.password" for u in permissions.users()),
        *(f"redis-{u}.password" for u in acl.users()),
        "signing.key",
    }
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files)
    values = [p.read_text() for p in files]
    assert len(set(values)) == len(values)
    keep.ensure()
    assert [p.read_text() for p in files] == values  # kept, never regenerated
    assert len(bytes.fromhex(keep.read(keep.signing_key).get_secret_value())) == 32


def test_each_service_gets_its_own_users_and_files_never_values(
    state: local_stack.StackState,
) -> None:
    env = local_stack.login_env(state, "registrar")
    assert env == {
        "CKPT_HA_NATS_USER": "registrar",
        "CKPT_HA_NATS_PASSWORD": "",
        "CKPT_HA_NATS_PASSWORD_FILE": str(state.secrets.nats("registrar")),
        "CKPT_HA_REDIS_USER": "registrar",
        "CKPT_HA_REDIS_PASSWORD": "",
        "CKPT_HA_REDIS_PASSWORD_FILE": str(state.secrets.redis("registrar")),
        "CKPT_HA_SIGNING_KEY": "",
        "CKPT_HA_SIGNING_KEY_FILE": str(state.secrets.signing_key),
    }


def test_the_cli_is_the_operator_and_the_runner_hands_the_job_login_on(
    state: local_stack.StackState,
) -> None:
    cli = context.settings({}, state.home)
    assert (cli.nats_user, cli.redis_user) == ("operator", "operator")
    assert cli.nats_password == state.secrets.read(state.secrets.nats("operator"))
    assert cli.signing_key == state.secrets.read(state.secrets.signing_key)
    runner = context.settings_of(RunnerSettings, {}, state.home, "runner")
    assert (runner.nats_user, runner.redis_user) == ("runner", None)
    job = runner.job_bus()
    assert job is not None
    assert job.user == local_stack.JOB
    assert job.password == state.secrets.read(state.secrets.nats(local_stack.JOB))


def test_endpoints_given_by_url_keep_the_environments_credentials_and_never_the_stacks(
    state: local_stack.StackState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NATS_URL", "nats://elsewhere:4222")
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:6379/0")
    monkeypatch.setenv("CKPT_HA_NATS_USER", "someone")
    monkeypatch.setenv("CKPT_HA_NATS_PASSWORD", "theirs")
    for name in ("CKPT_HA_STORAGE_ROOT", "CKPT_HA_SIGNING_KEY", "CKPT_HA_SIGNING_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    env = {"NATS_URL": "nats://elsewhere:4222", "REDIS_URL": "redis://elsewhere:6379/0"}
    s = context.settings(env, state.home)
    assert (s.nats_url, s.nats_user) == ("nats://elsewhere:4222", "someone")
    assert s.nats_password is not None
    assert s.nats_password.get_secret_value() == "theirs"
    # Nothing of the local stack: not its Redis login, its signing key or its storage root.
    assert (s.redis_url, s.redis_user) == ("redis://elsewhere:6379/0", None)
    assert s.signing_key is None
    assert s.storage_root != state.storage_root
