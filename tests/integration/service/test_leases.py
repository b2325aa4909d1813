"""Chat leases on a real SQLite file: the release race, and who counts as dead."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import ChatLease, utcnow
from bot.service.heartbeat import HOST, PID_NAMESPACE
from bot.service.leases import Leases

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
async def sessionmaker(sqlite_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = make_engine(sqlite_url)
    yield make_sessionmaker(engine)
    await engine.dispose()


async def _owner_of(sm: async_sessionmaker[AsyncSession], chat_id: int) -> str | None:
    async with sm() as db:
        return await db.scalar(
            select(ChatLease.owner).where(ChatLease.chat_id == chat_id, ChatLease.kind == "inbox")
        )


async def test_acquire_after_the_release_timer_fired_keeps_the_lease(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    # Suspected in issue 11, confirmed: acquire() between _release_soon (the linger timer) and
    # the delete it schedules returned True from memory, then the delete removed the row while
    # the chat was being worked on, and another process could take the chat.
    mine = Leases(sessionmaker, "inbox", linger_s=0.0)
    other = Leases(sessionmaker, "inbox")
    assert await mine.acquire(1)
    mine._release_soon(1)  # the linger timer fires; the delete is a task not yet run
    assert await mine.acquire(1)  # the next update of the chat arrives at that moment
    await asyncio.gather(*mine._releasing)
    assert await _owner_of(sessionmaker, 1) == mine.owner
    assert not await other.acquire(1)
    await mine.stop()
    assert await _owner_of(sessionmaker, 1) is None
    assert await other.acquire(1)


async def _plant(sm: async_sessionmaker[AsyncSession], chat_id: int, owner: str) -> None:
    async with sm.begin() as db:
        db.add(
            ChatLease(
                chat_id=chat_id, kind="inbox", owner=owner, lease_until=utcnow() + timedelta(60)
            )
        )


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return int(proc.stdout)


async def test_a_dead_holder_of_this_machine_is_taken_over_at_once(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await _plant(sessionmaker, 2, f"{HOST}:{PID_NAMESPACE}:{_dead_pid()}:deadbeef")
    assert await Leases(sessionmaker, "inbox").acquire(2)


@pytest.mark.parametrize(
    "owner",
    [
        f"{HOST}:999999999:{{pid}}:feedf00d",  # the same host name, another PID namespace
        f"elsewhere:{PID_NAMESPACE}:{{pid}}:feedf00d",  # another machine
        f"{HOST}:{{pid}}:feedf00d",  # an owner name of the previous version
    ],
)
async def test_a_holder_that_cannot_be_checked_keeps_its_lease_until_it_expires(
    sessionmaker: async_sessionmaker[AsyncSession], owner: str
) -> None:
    await _plant(sessionmaker, 3, owner.format(pid=_dead_pid()))
    assert not await Leases(sessionmaker, "inbox").acquire(3)


HOLDER = """
import asyncio, os, sys
from bot.db.engine import make_engine, make_sessionmaker
from bot.service.leases import Leases

async def main() -> None:
    leases = Leases(make_sessionmaker(make_engine(sys.argv[1])), "inbox")
    assert await leases.acquire(4)
    print(os.getpid(), leases.owner, flush=True)
    await asyncio.to_thread(sys.stdin.read)  # hold it until the test closes stdin

# The PID this process has in its own namespace must not exist in the outer one, so that a
# check by PID alone would wrongly find it dead.
while os.path.exists(f"/proc/{os.getpid()}"):
    child = os.fork()
    if child:
        os._exit(os.waitpid(child, 0)[1] >> 8)
asyncio.run(main())
"""


async def test_a_live_holder_in_another_pid_namespace_keeps_its_lease(
    sessionmaker: async_sessionmaker[AsyncSession], sqlite_url: str
) -> None:
    # Suspected in issue 11, confirmed: containers that share a host name but not a PID
    # namespace took each other's live leases, because host name + PID was taken to name a
    # process. A real process in a new PID namespace (unshare, as root) holds a lease.
    probe = await asyncio.to_thread(
        subprocess.run, ["unshare", "--pid", "--fork", "true"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a PID namespace here (unshare: {probe.stderr.decode()[:200]})")
    proc = await asyncio.create_subprocess_exec(
        "unshare", "--pid", "--fork", sys.executable, "-c", HOLDER, sqlite_url,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().split()
        inner_pid, owner = int(line[0]), line[1]
        # Its PID means nothing here.
        assert not await asyncio.to_thread(os.path.exists, f"/proc/{inner_pid}")
        assert await _owner_of(sessionmaker, 4) == owner
        assert not await Leases(sessionmaker, "inbox").acquire(4)
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 30)


async def test_a_lease_taken_over_is_not_renewed_from_memory(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    # Found in review: renew_all marked every held chat renewed without checking the UPDATE,
    # so after a partition longer than the TTL a replica went on working on a chat another
    # replica had taken over (and both sent its texts).
    mine = Leases(sessionmaker, "inbox")
    assert await mine.acquire(5)
    async with sessionmaker.begin() as db:  # our lease ran out; another process took it
        lease = await db.scalar(
            select(ChatLease).where(ChatLease.chat_id == 5, ChatLease.kind == "inbox")
        )
        assert lease is not None
        lease.owner, lease.lease_until = "elsewhere:1:2:3", utcnow() + timedelta(seconds=60)
    await mine.renew_all()
    assert 5 not in mine.held
    assert not await mine.acquire(5)  # asks the database, which says no
    assert await _owner_of(sessionmaker, 5) == "elsewhere:1:2:3"


async def test_a_release_during_a_renewal_gives_the_row_back(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    # Found in review: a release that ran while a renewal committed deleted nothing (the row's
    # expiry had just changed) and left the chat leased for a whole TTL.
    mine = Leases(sessionmaker, "inbox", linger_s=0.0)
    assert await mine.acquire(6)
    renewal = asyncio.create_task(mine.renew_all())
    await asyncio.sleep(0)  # the renewal has read which chats it renews
    mine._release_soon(6)
    await renewal
    await asyncio.gather(*mine._releasing)
    assert await _owner_of(sessionmaker, 6) is None


async def test_leases_due_together_are_given_back_in_one_statement(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    # The chats of a model batch end together: their leases go back in one DELETE
    # (RELEASE_GATHER_S), not a session each; one taken again meanwhile stays.
    mine = Leases(sessionmaker, "inbox", linger_s=0.0)
    other = Leases(sessionmaker, "inbox")
    for chat_id in (11, 12, 13, 14):
        assert await mine.acquire(chat_id)
    deletes: list[str] = []

    def count(*args: object) -> None:
        if str(args[2]).lstrip().upper().startswith("DELETE"):
            deletes.append(str(args[2]))

    engine = sessionmaker.kw["bind"].sync_engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        for chat_id in (11, 12, 13, 14):
            await mine.release(chat_id)
        await asyncio.sleep(0.01)  # the linger timers fired; the leases wait to be given back
        assert mine._gathering is not None and not mine.holds(14)
        assert await mine.acquire(14)  # its next update: taken again, from the database
        await asyncio.gather(*mine._releasing)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(deletes) == 1, deletes
    for chat_id in (11, 12, 13):
        assert await _owner_of(sessionmaker, chat_id) is None
        assert await other.acquire(chat_id)
    assert await _owner_of(sessionmaker, 14) == mine.owner
    await mine.stop()
    await other.stop()
    assert await _owner_of(sessionmaker, 14) is None  # stop gives back what is left
