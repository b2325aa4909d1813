"""The per-chat worker pool on in-memory rows: order, one worker per chat, stop, stalls."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bot.service.chat_pool import ChatPool
from bot.service.retry import Backoff
from tests.support.waits import until


class Rows:
    """Pending rows per chat, the order they were processed in, and a gate to hold one."""

    def __init__(self, rows: dict[int, list[str]]) -> None:
        self.rows = rows
        self.done: list[str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.hold: set[str] = set()
        self.fail: set[str] = set()

    async def pending_chats(self) -> list[int]:
        return [chat for chat, rows in self.rows.items() if rows]

    async def pending(self, chat_id: int) -> list[str]:
        return list(self.rows[chat_id])

    async def process(self, row: str) -> bool:
        if row in self.hold:
            self.started.set()
            await self.release.wait()
        if row in self.fail:
            self.fail.discard(row)
            return False
        self.done.append(row)
        for rows in self.rows.values():
            if row in rows:
                rows.remove(row)
        return True


def _pool(rows: Rows, poll_interval_s: float = 0.05, **kw: object) -> ChatPool[str]:
    return ChatPool(
        "test",
        pending_chats=rows.pending_chats,
        pending=rows.pending,
        process=rows.process,
        poll_interval_s=poll_interval_s,
        **kw,  # type: ignore[arg-type]
    )


async def test_rows_of_a_chat_in_order_chats_at_once() -> None:
    rows = Rows({1: ["1a", "1b", "1c"], 2: ["2a", "2b"]})
    pool = _pool(rows)
    await pool.start()
    await until(lambda: len(rows.done) == 5, within_s=10, what="all five rows done")
    await pool.stop(1.0)
    assert [r for r in rows.done if r[0] == "1"] == ["1a", "1b", "1c"]
    assert [r for r in rows.done if r[0] == "2"] == ["2a", "2b"]


async def test_a_stop_takes_no_new_row_even_for_a_worker_waiting_for_a_slot() -> None:
    # Found in review: a worker that waited for a concurrency slot started its row after the
    # stop had come (the inbox worker must finish only the row in hand).
    rows = Rows({1: ["a"], 2: ["b"]})
    rows.hold = {"a"}
    pool = _pool(rows, max_concurrent=1)
    await pool.start()
    await asyncio.wait_for(rows.started.wait(), 5)
    await asyncio.sleep(0.05)  # chat 2's worker now waits for the slot
    stopping = asyncio.create_task(pool.stop(5.0))
    await asyncio.sleep(0.05)
    rows.release.set()
    await stopping
    assert rows.done == ["a"]


async def test_a_stalled_chat_pauses_outside_the_slot_then_goes_on() -> None:
    rows = Rows({1: ["a", "b"], 2: ["c"]})
    rows.fail = {"a"}
    pauses: list[bool] = []
    pool: ChatPool[str]

    async def after_stall() -> None:
        # The slot is free while the failed chat pauses: chat 2 is not held up.
        pauses.append(pool._slots is not None and not pool._slots.locked())
        await asyncio.sleep(0.1)

    pool = _pool(rows, max_concurrent=1, after_stall=after_stall)
    await pool.start()
    await until(lambda: len(rows.done) == 3, within_s=10, what="all three rows done")
    await pool.stop(1.0)
    assert pauses == [True]
    assert [r for r in rows.done if r != "c"] == ["a", "b"]  # the chat's order held
    assert "c" in rows.done


async def test_drain_on_stop_finishes_what_is_pending() -> None:
    rows = Rows({1: ["a"]})
    pool = _pool(rows, poll_interval_s=60, drain_on_stop=True)  # only stop() scans again
    await pool.start()
    await until(lambda: rows.done == ["a"], within_s=5, what="the first scan's row")
    rows.rows[2] = ["late"]  # queued by the last turns, after the last scan
    await pool.stop(2.0)
    assert rows.done == ["a", "late"]


async def test_a_failing_read_is_retried_by_the_worker_not_logged_as_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rows = Rows({1: ["a"]})
    original = rows.pending
    failures = {"left": 2}

    async def flaky(chat_id: int) -> list[str]:
        if failures["left"]:
            failures["left"] -= 1
            raise OSError("database is down")
        return await original(chat_id)

    rows.pending = flaky  # type: ignore[method-assign]
    pool = ChatPool(
        "test",
        pending_chats=rows.pending_chats,
        pending=rows.pending,
        process=rows.process,
        backoff=Backoff(initial_s=0.01, cap_s=0.02),
        poll_interval_s=60,
    )
    caplog.set_level(logging.WARNING)
    await pool.start()
    await until(lambda: bool(rows.done), within_s=10, what="a row done")
    await pool.stop(1.0)
    assert rows.done == ["a"]
    assert not [r for r in caplog.records if "crashed" in r.getMessage()]
    assert len([r for r in caplog.records if "reading chat 1 failed" in r.getMessage()]) == 2


class Lanes:
    """Chats 1-4 on lane "a", 5-8 on lane "b"; the number of lanes can change at run time."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes

    async def lane_of(self, chat_id: int) -> str:
        return "a" if chat_id <= 4 else "b"

    def lane_ready(self, name: str) -> bool:
        return True


async def test_a_lanes_share_of_the_slots_follows_the_number_of_lanes() -> None:
    """4 slots over 2 lanes: lane a holds at most 2 at once; once a variant is removed at run
    time (1 lane), a may use all 4."""
    rows = Rows({chat: [f"{chat}x"] for chat in range(1, 5)})
    busy = {"now": 0, "most": 0}
    gate = asyncio.Event()

    async def process(row: str) -> bool:
        busy["now"] += 1
        busy["most"] = max(busy["most"], busy["now"])
        await gate.wait()
        busy["now"] -= 1
        return await rows.process(row)

    lanes = Lanes(2)
    pool = ChatPool(
        "test",
        pending_chats=rows.pending_chats,
        pending=rows.pending,
        process=process,
        poll_interval_s=0.05,
        max_concurrent=4,
        lanes=lanes,
    )
    await pool.start()
    try:
        await until(lambda: busy["now"] >= 2, within_s=5, what="lane a taking its slots")
        # Nothing more may start: a chat let past the share would within a poll (0.05 s).
        await asyncio.sleep(0.15)
        assert busy["now"] == 2  # ceil(4 / 2): the other lane's share stays free
        lanes.lanes = 1  # the other variant was removed
        # waiters look again within a second
        await until(lambda: busy["now"] >= 4, within_s=3, what="lane a taking all slots")
        assert busy["now"] == 4
        gate.set()
        for _ in range(100):
            if len(rows.done) == 4:
                break
            await asyncio.sleep(0.02)
        assert sorted(rows.done) == ["1x", "2x", "3x", "4x"]
    finally:
        gate.set()
        await pool.stop(1.0)


async def test_rows_handed_to_a_chat_whose_worker_is_ending_are_not_left_to_a_scan() -> None:
    # start_chat after the worker's last read, while it works on the last row it read: the
    # chat's rows are read again (in the worker, or by the chat started again when the worker
    # ends), with scans that find nothing.
    rows = Rows({1: ["1a"]})
    pool = _pool(rows, poll_interval_s=60.0)
    reads = 0
    original_pending, original_process = rows.pending, rows.process

    async def pending(chat_id: int) -> list[str]:
        nonlocal reads
        reads += 1
        return await original_pending(chat_id)

    async def process(row: str) -> bool:
        done = await original_process(row)
        if row == "1a":  # the worker read before this row was committed
            rows.rows[1].append("1b")
            assert pool.start_chat(1)
        return done

    async def no_scan() -> list[int]:
        return []

    pool.pending, pool.process, pool.pending_chats = pending, process, no_scan
    assert not pool.start_chat(1)  # not started yet: the caller scans instead
    await pool.start()
    assert pool.start_chat(1)
    await until(lambda: rows.done == ["1a", "1b"], within_s=5, what="the handed row done")
    await until(lambda: pool.busy == 0, within_s=5, what="the worker ended")
    assert reads == 2  # 1a, then 1b: nothing was handed after that, so no read found nothing
    await pool.stop(1.0)
    assert not pool.start_chat(1)  # stopping: the caller scans instead


async def test_a_worker_reads_again_only_when_rows_may_have_come_since_its_read() -> None:
    rows = Rows({1: ["1a", "1b"]})
    pool = _pool(rows, poll_interval_s=60.0)  # no periodic scan within the test
    reads: list[list[str]] = []
    original = rows.pending

    async def pending(chat_id: int) -> list[str]:
        reads.append(await original(chat_id))
        return reads[-1]

    pool.pending = pending
    await pool.start()
    await until(lambda: len(rows.done) == 2 and pool.busy == 0, within_s=5, what="the rows")
    assert reads == [["1a", "1b"]]  # one read; none that finds nothing

    # A bare wake (rows committed without naming their chat) during the run: read again.
    rows.rows[1] += ["1c"]
    rows.hold = {"1c"}
    rows.started.clear()
    reads.clear()
    assert pool.start_chat(1)
    await asyncio.wait_for(rows.started.wait(), 5)
    pool.wake()
    rows.release.set()
    await until(lambda: "1c" in rows.done and pool.busy == 0, within_s=5, what="1c done")
    assert reads[:2] == [["1c"], []]
    await pool.stop(1.0)


async def test_a_worker_that_ends_scans_again_only_after_a_wake_or_a_failed_row() -> None:
    rows = Rows({1: ["1a"], 2: ["2a"]})
    scans = 0
    original = rows.pending_chats

    async def counted() -> list[int]:
        nonlocal scans
        scans += 1
        return await original()

    pool = _pool(rows, poll_interval_s=60.0)  # no periodic scan within the test
    pool.pending_chats = counted
    await pool.start()
    await until(lambda: len(rows.done) == 2 and pool.busy == 0, within_s=5, what="both rows")
    await asyncio.sleep(0.05)
    assert scans == 1  # the first scan only: two workers ended without a scan each

    # A wake while a worker runs: its rows may have come after the worker's last read.
    rows.rows[1] += ["1b"]
    rows.hold = {"1b"}
    rows.started.clear()
    assert pool.start_chat(1)
    await asyncio.wait_for(rows.started.wait(), 5)
    rows.rows[2] += ["2b"]  # committed with a wake, no chat named
    pool.wake()
    await until(lambda: scans == 2, within_s=5, what="the wake's own scan")
    rows.release.set()
    await until(lambda: "2b" in rows.done and pool.busy == 0, within_s=5, what="2b done")
    await until(lambda: scans == 3, within_s=5, what="a scan after the woken worker ended")

    # A failed row stays pending: a scan after the worker's pause tries it again.
    rows.rows[2] += ["2c"]
    rows.fail = {"2c"}
    assert pool.start_chat(2)
    await until(lambda: "2c" in rows.done, within_s=5, what="the failed row retried")
    await pool.stop(1.0)
