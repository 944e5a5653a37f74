"""The fast tier's guard (`tests.support.fast_tier`): every unit and contract test runs inside it,
so a test here that connects, starts a process or imports torch fails, and says where it belongs."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys

import pytest

from tests.support.fast_tier import FastTierViolation

BELONGS = "move it to tests/integration"


def test_a_connection_fails_and_no_oserror_handler_swallows_it() -> None:
    def connect() -> None:
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=1)
        except OSError:  # what code around a connect catches: the guard is not one of those
            pytest.fail("the guard's refusal was taken for a network error")

    with pytest.raises(FastTierViolation, match=f"opens no network socket.*{BELONGS}"):
        connect()
    with socket.socket() as sock, pytest.raises(FastTierViolation):
        sock.connect_ex(("127.0.0.1", 9))


async def test_an_asyncio_connection_fails_while_the_loop_itself_still_works() -> None:
    await asyncio.sleep(0)  # the loop's self-pipe is a socketpair: allowed
    with pytest.raises(FastTierViolation, match="opens no network socket"):
        await asyncio.open_connection("127.0.0.1", 9)


def test_starting_a_process_fails() -> None:
    with pytest.raises(FastTierViolation, match=f"starts no process.*{BELONGS}"):
        subprocess.run(["true"], check=False)
    with pytest.raises(FastTierViolation, match="starts no process"):
        os.fork()
    with pytest.raises(FastTierViolation, match="starts no process"):
        os.posix_spawn("/bin/true", ["true"], {})


async def test_an_asyncio_subprocess_fails() -> None:
    with pytest.raises(FastTierViolation, match="starts no process"):
        await asyncio.create_subprocess_exec("true")


def test_torch_is_absent_as_on_a_machine_without_it() -> None:
    assert importlib.util.find_spec("torch") is None
    assert importlib.util.find_spec("transformers") is None
    with pytest.raises(ModuleNotFoundError, match=r"fast tier .* runs without torch"):
        import torch  # noqa: F401
    assert "torch" not in sys.modules or sys.modules["torch"] is not None


def test_a_unit_test_that_connects_or_spawns_is_reported_failed(
    pytester: pytest.Pytester,
) -> None:
    """The hooks of tests/unit/conftest.py, in a session of their own: set-up and body count."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makeconftest("from tests.unit.conftest import *  # noqa: F403\n")
    pytester.makepyfile(
        """
        import socket
        import subprocess

        import pytest


        @pytest.fixture
        def server():
            return socket.create_connection(("127.0.0.1", 9))


        def test_connects_in_its_fixture(server):
            pass


        def test_spawns():
            subprocess.run(["true"], check=False)


        def test_pure():
            assert sum([1, 2]) == 3
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*FastTierViolation*opens no network socket*"])
    result.stdout.fnmatch_lines(["*FastTierViolation*starts no process*"])
