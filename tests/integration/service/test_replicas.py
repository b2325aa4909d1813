"""Replica heartbeats on both databases: takeover of a dead replica's leases (also one with our
host name and PID, as a container restarted in place has), fencing, and the turn fence."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import inbox, replicas
from bot.db.inbox import UpdateRef
from bot.db.leases import LeaseLost
from bot.db.models import ChatLease, Inbox, InboxStatus, Replica, utcnow
from bot.service.heartbeat import HOST, PID_NAMESPACE, Heartbeat, new_owner
from bot.service.leases import Leases
from tests.support.fakebotapi import FakeBotAPI, Fault
from tests.support.service_harness import TOKEN as IN_PROCESS_TOKEN
from tests.support.service_harness import EchoResponder, make_settings, running_service
from tests.support.waits import until

# What a container restarted with the same host name (and so the same PID 1, or any reused
# PID) looks like: our host, namespace and PID, another random part.
SAME_HOST_AND_PID = f"{HOST}:{PID_NAMESPACE}:{os.getpid()}:0ldc0de1"


async def _plant(
    sm: async_sessionmaker[AsyncSession],
    owner: str,
    *,
    chat_id: int = 7,
    heartbeat_age_s: float | None,
    lease_left_s: float = 60.0,
) -> None:
    """A lease of `owner` that runs for `lease_left_s` more, and (unless None) its replica row
    with a heartbeat `heartbeat_age_s` old."""
    now = utcnow()
    async with sm.begin() as db:
        if heartbeat_age_s is not None:
            db.add(
                Replica(
                    owner=owner,
                    host=HOST,
                    pid=os.getpid(),
                    started_at=now - timedelta(hours=1),
                    heartbeat_at=now - timedelta(seconds=heartbeat_age_s),
                    info="{}",
                )
            )
        db.add(
            ChatLease(
                chat_id=chat_id,
                kind="inbox",
                owner=owner,
                lease_until=now + timedelta(seconds=lease_left_s),
            )
        )


async def _owner(sm: async_sessionmaker[AsyncSession], chat_id: int = 7) -> str | None:
    async with sm() as db:
        return await db.scalar(
            select(ChatLease.owner).where(ChatLease.chat_id == chat_id, ChatLease.kind == "inbox")
        )


@asynccontextmanager
async def _replica(
    sm: async_sessionmaker[AsyncSession], dead_after_s: float = 5.0
) -> AsyncIterator[tuple[Heartbeat, Leases]]:
    """A replica's heartbeat (started) and its inbox leases; at the end both stopped, as the
    service stops them (the leases given back first)."""
    heartbeat = Heartbeat(sm, new_owner(), dead_after_s=dead_after_s)
    await heartbeat.start()
    leases = Leases(sm, "inbox", owner=heartbeat.owner, heartbeat=heartbeat)
    try:
        yield heartbeat, leases
    finally:
        await leases.stop()
        await heartbeat.stop()


async def test_a_dead_replica_with_our_host_name_and_pid_loses_its_lease_at_once(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    # Its lease would run for another minute, and the PID it names is alive (it is us): only
    # its stale heartbeat says it is gone.
    await _plant(sessionmaker, SAME_HOST_AND_PID, heartbeat_age_s=6.0)
    taken: list[str] = []
    async with _replica(sessionmaker) as (_, leases):
        leases.on_takeover = taken.append
        assert await leases.acquire(7)
        assert await _owner(sessionmaker) == leases.owner
        assert taken == ["inbox"]


async def test_a_live_replica_keeps_its_lease(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await _plant(sessionmaker, SAME_HOST_AND_PID, heartbeat_age_s=1.0)
    async with _replica(sessionmaker) as (_, leases):
        assert not await leases.acquire(7)
        assert await _owner(sessionmaker) == SAME_HOST_AND_PID


async def test_an_owner_without_a_heartbeat_row_is_judged_by_its_lease_alone(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    # A process of an older version (no replicas row): it is not declared dead early.
    await _plant(sessionmaker, SAME_HOST_AND_PID, heartbeat_age_s=None)
    async with _replica(sessionmaker) as (_, leases):
        assert not await leases.acquire(7)


async def test_a_replica_whose_heartbeats_fail_fences_itself_then_resumes(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    async with (
        _replica(sessionmaker, dead_after_s=1.0) as (heartbeat, leases),  # fences after 0.6 s
        _replica(sessionmaker, dead_after_s=1.0) as (_, other),
    ):
        assert await leases.acquire(7)
        assert leases.held == {7}
        # Its heartbeats stop landing (the loop is gone, as when the database is unreachable).
        heartbeat.pause()
        # Fenced (0.6 s) before anyone may take over (1.0 s): it forgets the lease, takes no row.
        await until(lambda: not heartbeat.alive, within_s=5, what="the fence")
        assert not await leases.acquire(7)
        assert leases.held == frozenset()
        # Then its heartbeat goes stale for the others: the lease moves.
        await until(lambda: other.acquire(7), within_s=5, every_s=0.05, what="the takeover")
        assert await other.acquire(7)
        assert await _owner(sessionmaker) == other.owner
        # Heartbeats land again: back to work, but the chat is the other replica's now.
        await heartbeat.beat()
        assert not await leases.acquire(7)


async def test_a_replica_whose_event_loop_stalled_forgets_its_leases_when_it_wakes(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    # Found in review: nothing read `alive` during the stall, and the first heartbeat after
    # it landed, so the fence never happened and the lease was trusted from memory.
    async with (
        _replica(sessionmaker, dead_after_s=1.0) as (heartbeat, leases),
        _replica(sessionmaker, dead_after_s=1.0) as (_, other),
    ):
        assert await leases.acquire(7)
        heartbeat.pause()  # the stall: no heartbeat, and nobody looks at `alive`
        # (the other replica's acquire reads its own heartbeat, never this one's `alive`)
        await until(lambda: other.acquire(7), within_s=5, every_s=0.05, what="the takeover")
        assert await other.acquire(7)  # the stalled replica is dead to the others
        await heartbeat.beat()  # it wakes, and its first heartbeat lands
        assert not await leases.acquire(7)
        assert await _owner(sessionmaker) == other.owner


async def test_a_turn_cannot_commit_once_its_chat_was_taken_over(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    now = utcnow()
    async with sessionmaker.begin() as db:
        db.add(Inbox(update_id=501, chat_id=7, kind="message", payload="{}", received_at=now))
    await _plant(sessionmaker, "someone-else", heartbeat_age_s=0.0)
    with pytest.raises(LeaseLost):
        async with sessionmaker.begin() as db:
            await inbox.finish(db, UpdateRef(501, owner="me"))
    async with sessionmaker() as db:
        assert await inbox.status_of(db, 501) == InboxStatus.PENDING
    # The holder itself commits.
    async with sessionmaker.begin() as db:
        await inbox.finish(db, UpdateRef(501, owner="someone-else"))
    async with sessionmaker() as db:
        assert await inbox.status_of(db, 501) == InboxStatus.DONE


def _skew_clock(monkeypatch: pytest.MonkeyPatch, minutes: float) -> None:
    """This process's wall clock, as the bot's code reads it, `minutes` off."""

    def skewed() -> datetime:
        return datetime.now(UTC) + timedelta(minutes=minutes)

    for name, module in list(sys.modules.items()):
        if name.startswith("bot.") and hasattr(module, "utcnow"):
            monkeypatch.setattr(module, "utcnow", skewed)


async def test_replicas_whose_clocks_disagree_go_by_the_databases_clock(
    sessionmaker: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica whose clock is ten minutes slow beats and holds a lease; one whose clock is
    ten minutes fast sees it alive and its lease running: heartbeats and lease expiry are
    written and compared with the database's clock, the replicas' clocks never meet."""
    _skew_clock(monkeypatch, -10)
    async with _replica(sessionmaker) as (slow_heartbeat, slow):
        assert await slow.acquire(7)
        await slow_heartbeat.beat()
        _skew_clock(monkeypatch, +10)
        async with _replica(sessionmaker) as (_, fast):
            assert not await fast.acquire(7)
            assert await _owner(sessionmaker) == slow.owner


async def test_each_replica_learns_how_many_are_alive_at_every_heartbeat(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """The send budget's share (bot/service/budget.py): a stopped replica's row is gone, a dead
    one's heartbeat goes stale; either way the others count one less."""
    seen: list[int] = []
    one = Heartbeat(sessionmaker, new_owner(), on_alive=seen.append)
    two = Heartbeat(sessionmaker, new_owner())
    await one.start()
    await two.start()
    try:
        await one.beat()
        assert seen[-1] == 2
        await two.stop()
        await one.beat()
        assert seen[-1] == 1
    finally:
        await one.stop()


async def test_a_clean_stop_removes_the_heartbeat_row(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    heartbeat = Heartbeat(sessionmaker, new_owner())
    await heartbeat.start()
    async with sessionmaker() as db:
        assert await db.scalar(select(Replica.owner)) == heartbeat.owner
    await heartbeat.stop()
    async with sessionmaker() as db:
        assert await db.scalar(select(Replica.owner)) is None


async def test_each_running_replica_reports_itself_in_its_heartbeat_row(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with FakeBotAPI(IN_PROCESS_TOKEN) as api:
        settings = make_settings(sqlite_url, api, tmp_path)
        async with (
            running_service(settings, EchoResponder()) as one,
            running_service(settings, EchoResponder()) as two,
        ):
            for _ in range(150):
                # A session per look: SQLite's engine has one connection, the service's own.
                async with one.sessionmaker() as db:
                    rows = {r.owner: r for r in await replicas.all_replicas(db)}
                infos = [rows[s.owner].info if s.owner in rows else {} for s in (one, two)]
                # (refreshed every 5 s: the first may predate the election)
                if all(infos) and sum(bool(i.get("poller")) for i in infos) == 1:
                    break
                await asyncio.sleep(0.1)
            # Exactly one of them polls (the election runs in the background of each).
            assert sorted([rows[one.owner].info["poller"], rows[two.owner].info["poller"]]) == [
                False,
                True,
            ]
            for service in (one, two):
                info = rows[service.owner].info
                assert info["mode"] == "polling"
                assert info["ready"] is True and info["problems"] == []
                assert rows[service.owner].pid == os.getpid()
        async with one.sessionmaker() as db:
            assert await replicas.all_replicas(db) == []  # both stopped cleanly


async def test_a_fenced_replica_sends_nothing_more_after_a_failed_send(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Found in review: delivery retried a send (after a 5xx backoff, or a 429 wait) without
    # asking whether the chat's outbox lease was still its own; a fenced replica sent anyway.
    async with FakeBotAPI(IN_PROCESS_TOKEN) as api:
        settings = make_settings(sqlite_url, api, tmp_path, takeover_after_s=1.0)
        async with running_service(settings, EchoResponder()) as service:
            api.inject(Fault("sendMessage", status=502, delay=1.0, chat_id=403))
            api.user_message(403, "hello")
            await api.wait_for(lambda: bool(api.calls_to("sendMessage")), 10, "the send")
            service.heartbeat.pause()  # fenced 0.6 s later, while the send fails
            # The retry after the 502 (and its backoff) asks whether the lease is still ours.
            await until(
                lambda: "chat 403: outbox lease lost" in caplog.text,
                within_s=10,
                what="delivery noticing the fence",
            )
            assert [c.status for c in api.calls_to("sendMessage")] == [502]
            assert api.texts(403) == []
            await service.heartbeat.beat()  # heartbeats land again: it sends after all
            await api.wait_for_texts(403, 1, timeout_s=15)
    assert api.texts(403) == ["echo 403: hello"]


async def test_a_status_collector_cancelled_as_its_report_comes_back_ends(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """stop() cancels the status collector; when its report came back in that same moment,
    the cancellation must still end it. Python 3.11's `asyncio.wait_for` returned the report
    and dropped the cancellation, the collector went on, and stop() waited for it forever (a
    CI run hung in a service's teardown). The two are made to meet here directly: the report
    and the cancellation in one step."""
    report: asyncio.Future[dict[str, object]] = asyncio.get_running_loop().create_future()
    asked = asyncio.Event()

    async def status() -> dict[str, object]:
        asked.set()
        return await report

    heartbeat = Heartbeat(sessionmaker, new_owner(), info=status, info_every_s=30.0)
    await heartbeat.start()
    try:
        await asked.wait()
        collector = heartbeat._info_task
        assert collector is not None
        report.set_result({"ready": True})
        collector.cancel()
        await asyncio.wait([collector], timeout=2.0)
        assert collector.cancelled()
    finally:
        async with asyncio.timeout(5):
            await heartbeat.stop()
