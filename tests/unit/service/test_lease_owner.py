"""Lease owner names: what `new_owner` writes and what `_dead_here` reads back from them.

tests/integration/service/test_leases.py covers taking over an exited holder and keeping the leases
of holders on other machines, in other PID namespaces or with old-style names; these are the
cases it does not reach: this process, a live process, a zombie, and names that do not parse.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bot.service import heartbeat, leases
from bot.service.heartbeat import HOST, PID_NAMESPACE, new_owner
from bot.service.leases import _dead_here


def _owner(pid: int) -> str:
    return f"{HOST}:{PID_NAMESPACE}:{pid}:0123abcd"


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_new_owner_names_this_host_namespace_and_process_uniquely() -> None:
    owner = new_owner()
    host, namespace, pid, random_part = owner.rsplit(":", 3)
    assert (host, namespace, int(pid)) == (HOST, PID_NAMESPACE, os.getpid())
    assert re.fullmatch(r"[0-9a-f]{8}", random_part), random_part
    assert new_owner() != owner  # several services in one process


def test_this_process_is_never_dead() -> None:
    assert not _dead_here(new_owner())


def test_a_live_process_here_is_not_dead(child: subprocess.Popen[bytes]) -> None:
    assert not _dead_here(_owner(child.pid))


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="zombies are seen in /proc")
def test_a_killed_process_is_dead_even_before_it_is_reaped(
    child: subprocess.Popen[bytes],
) -> None:
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    # A zombie until wait(): its /proc entry is still there.
    while not _dead_here(_owner(child.pid)):
        assert time.monotonic() < deadline, "a killed, unreaped child was not judged dead"
        time.sleep(0.01)
    assert os.path.exists(f"/proc/{child.pid}")
    child.wait()
    assert _dead_here(_owner(child.pid))  # reaped: no such process at all


@pytest.mark.parametrize(
    "owner", ["", "garbage", f"{HOST}:{PID_NAMESPACE}:not-a-pid:0123abcd", "a:b:c"]
)
def test_a_name_that_does_not_parse_is_judged_by_expiry_alone(owner: str) -> None:
    assert not _dead_here(owner)


def test_a_host_name_with_colons_still_parses(
    monkeypatch: pytest.MonkeyPatch, child: subprocess.Popen[bytes]
) -> None:
    monkeypatch.setattr(heartbeat, "HOST", "fe80::1:host")  # what new_owner writes
    monkeypatch.setattr(leases, "HOST", "fe80::1:host")  # what _dead_here compares
    owner = f"fe80::1:host:{PID_NAMESPACE}:{child.pid}:0123abcd"
    assert new_owner().startswith(f"fe80::1:host:{PID_NAMESPACE}:{os.getpid()}:")
    assert not _dead_here(owner)
    child.kill()
    child.wait()
    assert _dead_here(owner)
