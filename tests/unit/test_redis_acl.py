"""deploy/redis/users.acl is the table of `ckpt_ha.registry.acl`, with no password in it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from ckpt_ha.registry import acl
from ckpt_ha.retention_janitor import store as janitor_store
from ckpt_ha.writer_watcher.api import state_keys

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "redis"


def test_committed_acl_matches_the_table() -> None:
    assert acl.main(["--check"]) == 0, "run: python -m ckpt_ha.registry.acl"
    assert Path(str(acl.CONF)).resolve() == DEPLOY / "users.acl"


def test_the_committed_file_lets_nobody_in() -> None:
    lines = (DEPLOY / "users.acl").read_text().splitlines()
    assert lines[0] == "user default off resetchannels resetkeys -@all"
    for line in lines:
        assert " nopass" not in line
        assert not any(word.startswith((">", "#")) for word in line.split()), line


def test_the_watcher_state_pattern_is_the_watchers_own() -> None:
    assert acl.key_spaces("p")["watcher-state"] == state_keys("p")


def test_a_key_space_has_one_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    def claims_the_records(prefix: str) -> dict[str, str]:
        return {"checkpoints": f"{prefix}:mine:*"}

    thief = acl.RedisUser("thief", ("checkpoints",), (), (), key_spaces=claims_the_records)
    monkeypatch.setattr(acl, "USERS", (*acl.USERS, thief))
    with pytest.raises(ValueError, match=r"two owners \(thief and another\): \['checkpoints'\]"):
        acl.key_spaces("p")


def test_the_janitor_view_pattern_is_the_janitors_own() -> None:
    assert acl.key_spaces("p")["janitor-view"] == janitor_store.pattern("p")
    assert janitor_store.key("p", "job-1").startswith(janitor_store.pattern("p")[:-1])


def _matches(pattern: str, key: str) -> bool:
    """Redis glob patterns as this table writes them: a literal, or a literal then ``*``."""
    return key.startswith(pattern[:-1]) if pattern.endswith("*") else key == pattern


def test_the_janitor_is_granted_nothing_of_the_coordinators_keys() -> None:
    """No shared database: the janitor keeps its own view of resumes, and its Redis user can
    neither read nor write a key of the restore-coordinator's (its state, its pins)."""
    spaces = acl.key_spaces("p")
    [janitor] = [u for u in acl.USERS if u.user == "retention-janitor"]
    [coordinator] = [u for u in acl.USERS if u.user == "restore-coordinator"]
    granted = [spaces[name] for name in (*janitor.writes, *janitor.reads)]
    owned = [spaces[name] for name in coordinator.writes if name != "leases"]
    assert owned == ["p:coord:*", "p:pins:*"]
    for pattern in owned:
        example = pattern.replace("*", "job-1:1")
        assert not [g for g in granted if _matches(g, example) or _matches(pattern, g[:-1])], (
            pattern
        )
    line = next(x for x in acl.render().splitlines() if x.startswith("user retention-janitor "))
    assert ":coord:" not in line
    assert ":pins:" not in line


def test_every_user_names_known_key_spaces_and_no_admin_command() -> None:
    spaces = acl.key_spaces("p")
    for user in acl.USERS:
        assert {*user.writes, *user.reads} <= set(spaces), user.user
        assert not {"flushall", "flushdb", "config", "keys", "acl", "eval", "debug"} & set(
            user.commands
        ), user.user


def test_a_deployment_renders_password_hashes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for user in acl.users():
        monkeypatch.setenv(acl.env_password(user), f"pw-of-{user}")
    text = acl.render(acl.passwords_from(os.environ), prefix="tenant-a")
    digest = hashlib.sha256(b"pw-of-registrar").hexdigest()
    assert f"user registrar on #{digest} " in text
    assert "pw-of-" not in text
    assert "~tenant-a:ckpt:*" in text
    assert acl.password_hash(SecretStr("x")) == "#" + hashlib.sha256(b"x").hexdigest()


def test_render_from_env_names_the_missing_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for user in acl.users():
        monkeypatch.delenv(acl.env_password(user), raising=False)
        monkeypatch.delenv(acl.env_password(user) + "_FILE", raising=False)
    assert acl.main(["render", "--passwords-from-env"]) == 1
    assert capsys.readouterr().err == (
        "ckpt_ha.registry.acl: $CKPT_HA_REDIS_PASSWORD_WRITER_WATCHER: "
        "no password for writer-watcher\n"
    )
    assert acl.main(["render"]) == 2
