"""The one per-chat worker pool: a chat's rows one at a time and in order, chats in parallel.

The inbox worker (updates -> replies) and delivery (outbox -> Telegram) both are such a pool,
over their own table. A scan finds the chats with pending rows and starts one worker per chat
that has none. A worker takes a concurrency slot, then the chat's lease, and only then reads
the chat's rows (aiogram #1317: load state after taking the lock), so rows another process
handled meanwhile are not handled twice; it works through them in order, renewing the lease
before each, and reads again if rows were handed to it (or committed with a bare wake)
meanwhile. A chat whose lease another process holds gives its slot back and tries again after
a pause; a chat waiting for a slot holds no lease, so another replica with room can take it.
Rows left by a crash are found by the first scan. Where this process committed the rows
itself, it names their chats (`start_chat`): their workers start at once, without a scan.

Lanes (the inbox worker's: a chat's lane is its model variant; delivery's: private chats and
groups) split the slots further: no lane holds more than its share of them, so chats stuck on
one variant's hung worker cannot starve the other variants; and a chat whose lane is not ready
(its worker stalled or restarting) is not taken, or given back between rows, so a replica whose
worker is up answers it meanwhile. With `slot_hold_s`, a chat still at work after that long
gives its slots back and goes on without them (delivery: a chat waiting out Telegram).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import KW_ONLY, InitVar, dataclass, field
from functools import partial
from math import ceil
from typing import Generic, Protocol, TypeVar

from bot.service.leases import Leases
from bot.service.retry import Backoff, wait_event
from bot.tasks import cancel_and_wait

log = logging.getLogger(__name__)
R = TypeVar("R")

# Waiting for another process's lease of a chat: it lingers about a second after its work.
CLAIM_BACKOFF = Backoff(initial_s=0.1, factor=2.0, cap_s=1.0)
# A row read under the chat's lease this recently is not read again before its first try
# (`read_recently`); the pool's users say what fences the rare change in between.
FRESH_S = 1.0


def read_recently(read_at: float | None) -> bool:
    """Whether a row stamped `read_at` (time.monotonic() when `pending` read it under the
    chat's lease) is recent enough to be worked on without reading it again."""
    return read_at is not None and time.monotonic() - read_at < FRESH_S


class Lanes(Protocol):
    """What a pool needs to know of its lanes (bot.engine.router.VariantResponder)."""

    @property
    def lanes(self) -> int:
        """How many lanes share the slots."""
        ...

    async def lane_of(self, chat_id: int) -> str:
        """The chat's lane."""
        ...

    def lane_ready(self, name: str) -> bool:
        """Whether the lane takes work now."""
        ...


@dataclass(eq=False, repr=False)
class ChatPool(Generic[R]):
    """Runs `process` on every pending row, per chat in order, chats concurrently.

    - `pending_chats()`: the chats that have pending rows (the scan);
    - `pending(chat_id)`: that chat's pending rows in order, read under its lease;
    - `process(row)`: True to go on with the chat's next row, False to leave the chat's
      remaining rows to a later scan (the row failed and stays pending, or the chat refuses);
    - `after_stall()`: awaited (outside the concurrency slot) after `process` said False,
      before the chat is looked at again: a pause before retrying a failed row.
    """

    name: str
    _: KW_ONLY
    pending_chats: Callable[[], Awaitable[list[int]]]
    pending: Callable[[int], Awaitable[list[R]]]
    process: Callable[[R], Awaitable[bool]]
    after_stall: Callable[[], Awaitable[object]] | None = None
    # Other processes may share the database: a chat's rows are worked on only by the
    # holder of its lease (None: this process is alone, as in some unit tests).
    leases: Leases | None = None
    backoff: InitVar[Backoff | None] = None
    poll_interval_s: float = 5.0
    max_concurrent: int | None = None
    # On stop: finish every chat's rows within the grace time (delivery), or only the row
    # in hand (the inbox worker: what is left stays pending for the next start).
    drain_on_stop: bool = False
    lanes: Lanes | None = None
    # A chat at work this long gives its slots back early (None: it keeps them to the end).
    slot_hold_s: float | None = None
    # Chats holding each lane's share of the slots now; the share follows the number of
    # lanes, which changes when a variant is added or removed at run time.
    _lane_busy: dict[str, int] = field(init=False, default_factory=dict)
    _lane_freed: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _wake: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _workers: dict[int, asyncio.Task[None]] = field(init=False, default_factory=dict)
    # Chats handed new rows (start_chat) while their worker ran: started again at its end.
    _again: set[int] = field(init=False, default_factory=set)
    # wake() calls so far, and their count when each running worker started: a worker that
    # ends after a wake may have read before that wake's rows were committed, so a scan
    # follows; one with no wake during its run leaves nothing a scan would find sooner.
    _wakes: int = field(init=False, default=0)
    _wakes_at_start: dict[int, int] = field(init=False, default_factory=dict)
    # Chats whose worker stopped at a failed row: a scan follows its end.
    _rescan: set[int] = field(init=False, default_factory=set)
    _runner: asyncio.Task[None] | None = field(init=False, default=None)
    _stopping: bool = field(init=False, default=False)

    def __post_init__(self, backoff: Backoff | None) -> None:
        self._backoff = backoff or Backoff(initial_s=0.5, cap_s=10.0)
        self._slots = asyncio.Semaphore(self.max_concurrent) if self.max_concurrent else None

    @property
    def busy(self) -> int:
        """Chats being worked on now."""
        return len(self._workers)

    def wake(self) -> None:
        """New rows were committed: scan now."""
        self._wakes += 1
        self._wake.set()

    def offer(self, chats: Collection[int]) -> None:
        """New rows of `chats` were committed by this process: start their workers now
        (`start_chat`); with no chat named, or before the start or once stopping, scan."""
        if not chats:
            self.wake()
        for chat_id in chats:
            if not self.start_chat(chat_id):
                self.wake()

    def start_chat(self, chat_id: int) -> bool:
        """New rows of this chat were committed: start its worker now, without a scan. A worker
        that runs already may have read the chat's rows before these came, so the chat is
        started again when it ends. False before the start and once stopping (then scan)."""
        if self._runner is None or self._stopping:
            return False
        if chat_id in self._workers:
            self._again.add(chat_id)
        else:
            self._start_worker(chat_id)
        return True

    async def start(self) -> None:
        """Start scanning; the first scan picks up whatever an earlier run left pending."""
        self._runner = asyncio.create_task(self._run(), name=self.name)

    async def stop(self, grace_s: float) -> None:
        """Take no new chats; give the workers `grace_s` seconds, then cancel them.

        A cancelled row stays pending (its transaction never committed) for the next start.
        """
        self._stopping = True
        if self._runner is None:
            return  # never started
        await cancel_and_wait(self._runner)
        if self.drain_on_stop:
            try:
                await self.scan()  # rows queued by the last moments' work
            except Exception:
                log.exception("%s: could not scan while stopping", self.name)
        workers = list(self._workers.values())
        if not workers:
            return
        _, left = await asyncio.wait(workers, timeout=grace_s)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        if left:
            log.warning(
                "%s: %d chats still had work after %.1fs; it waits for the next start",
                self.name,
                len(left),
                grace_s,
            )

    async def scan(self) -> None:
        """Start a worker for every chat with pending rows that has none running."""
        for chat_id in await self.pending_chats():
            if self._running():
                self._start_worker(chat_id)

    def _running(self) -> bool:
        return not self._stopping or self.drain_on_stop

    async def _run(self) -> None:
        failures = 0
        while not self._stopping:
            self._wake.clear()
            try:
                await self.scan()
                failures = 0
            except Exception as err:  # noqa: BLE001 - whatever the database does, keep going
                failures += 1
                log.warning("%s: scan failed (%s); retry %d", self.name, err, failures)
                await self._backoff.sleep(failures)
                continue
            await wait_event(self._wake, self.poll_interval_s)

    def _start_worker(self, chat_id: int) -> None:
        if chat_id in self._workers:
            return
        task = asyncio.create_task(self._work(chat_id), name=f"{self.name}:{chat_id}")
        self._workers[chat_id] = task
        self._wakes_at_start[chat_id] = self._wakes
        task.add_done_callback(partial(self._worker_done, chat_id))

    def _worker_done(self, chat_id: int, task: asyncio.Task[None]) -> None:
        self._workers.pop(chat_id, None)
        woken = self._wakes_at_start.pop(chat_id, None) != self._wakes
        if chat_id in self._rescan:
            self._rescan.discard(chat_id)
            woken = True
        again = chat_id in self._again
        self._again.discard(chat_id)
        if not task.cancelled() and task.exception() is not None:
            # A bug, not a fault of the row: the chat is tried again at the next poll.
            log.error(
                "%s: worker of chat %s crashed", self.name, chat_id, exc_info=task.exception()
            )
            return
        if again and not self._stopping:
            self._start_worker(chat_id)  # handed rows while it ran (start_chat)
        if woken:
            # Rows committed with a wake (no chat named) may have come between the worker's
            # last read and its end. Rows handed to it come back through `again`; another
            # process's rows, and a backlog beyond one scan's chats, are found by the periodic
            # scan (scanning after every worker was two scans a turn, a tenth of the pools'
            # statements).
            self._wake.set()

    async def _work(self, chat_id: int) -> None:
        attempt = 0
        lane = await self._lane_of(chat_id)
        try:
            while self._running():
                if lane is not None and not self._lane_ready(lane):
                    attempt += 1
                    await CLAIM_BACKOFF.sleep(attempt)
                    # Asked again: a chat with no variant yet goes where a served one is now
                    # (bot.engine.router.lane_of), instead of waiting on a lane that may never
                    # come up; an assigned chat keeps its variant's lane.
                    lane = await self._lane_of(chat_id)
                    continue
                # The concurrency slot first, then the chat's lease: a chat waiting for a slot
                # holds no lease (a replica with room takes it meanwhile), and a chat whose
                # lease another process holds waits without a slot.
                async with self._slot(lane):
                    if not self._running():
                        return
                    outcome = await self._work_rows(chat_id, lane)
                if outcome == "closed" and self.leases is not None:
                    await self.leases.release(chat_id)  # another replica may answer it now
                if outcome in ("busy", "closed"):
                    attempt += 1
                    await CLAIM_BACKOFF.sleep(attempt)
                    continue
                if outcome == "stalled":
                    if self.after_stall is not None and self._running():
                        await self.after_stall()
                    self._rescan.add(chat_id)  # its failed row is tried again after the pause
                return
        finally:
            if self.leases is not None:
                await self.leases.release(chat_id)

    @contextlib.asynccontextmanager
    async def _slot(self, lane: str | None) -> AsyncIterator[None]:
        """One of the lane's share of the slots, then a concurrency slot (in this order: a
        chat waiting for its lane's share holds none of the others' slots). With
        `slot_hold_s`, a chat still at work after that long gives both back early (it goes
        on without them): a chat that is slow, waiting out Telegram, blocks no other."""
        given_back = False
        returns: list[Callable[[], object]] = []

        def give_back() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                for give in reversed(returns):
                    give()

        try:
            if lane is not None and self._lane_share() is not None:
                await self._take_lane_share(lane)
                returns.append(partial(self._give_lane_share, lane))
            if self._slots is not None:
                await self._slots.acquire()
                returns.append(self._slots.release)
            timer = None
            if self.slot_hold_s is not None and returns:
                timer = asyncio.get_running_loop().call_later(self.slot_hold_s, give_back)
            try:
                yield
            finally:
                if timer is not None:
                    timer.cancel()
        finally:
            give_back()

    def _lane_share(self) -> int | None:
        """Each lane's share of the slots (an equal one: weights steer new chats, not load);
        None: no limit (one lane, or no concurrency limit)."""
        lanes = self.lanes.lanes if self.lanes is not None else 1
        if not self.max_concurrent or lanes <= 1:
            return None
        return ceil(self.max_concurrent / lanes)

    async def _take_lane_share(self, lane: str) -> None:
        while True:
            share = self._lane_share()
            if share is None or self._lane_busy.get(lane, 0) < share:
                break
            # Woken when a chat of any lane leaves, or after a second (the number of lanes,
            # hence the share, may have grown meanwhile). No await between the check and
            # taking the event: nothing can slip in between on one event loop.
            await wait_event(self._lane_freed, 1.0)
        self._lane_busy[lane] = self._lane_busy.get(lane, 0) + 1

    def _give_lane_share(self, lane: str) -> None:
        left = self._lane_busy.get(lane, 1) - 1
        if left > 0:
            self._lane_busy[lane] = left
        else:
            self._lane_busy.pop(lane, None)
        freed, self._lane_freed = self._lane_freed, asyncio.Event()
        freed.set()

    async def _lane_of(self, chat_id: int) -> str | None:
        if self.lanes is None:
            return None
        try:
            return await self.lanes.lane_of(chat_id)
        except Exception as err:  # noqa: BLE001 - the database is down: the rows will wait
            log.warning("%s: the lane of chat %s is unknown (%s)", self.name, chat_id, err)
            return None

    def _lane_ready(self, lane: str | None) -> bool:
        return lane is None or self.lanes is None or self.lanes.lane_ready(lane)

    async def _work_rows(self, chat_id: int, lane: str | None = None) -> str:
        """The chat's rows in order while its lease is ours: "done", "stalled" (a row failed
        and stays pending), "busy" (another process holds the chat's lease) or "closed" (the
        chat's lane stopped taking work)."""
        failures = 0
        while self._running():
            if not self._lane_ready(lane):
                return "closed"
            if not await self._claim(chat_id):
                return "busy"
            wakes = self._wakes
            self._again.discard(chat_id)  # this read finds what was handed to it so far
            try:
                rows = await self.pending(chat_id)
            except Exception as err:  # noqa: BLE001 - the database is down: wait for it
                failures += 1
                log.warning(
                    "%s: reading chat %s failed (%s); retry %d", self.name, chat_id, err, failures
                )
                await self._backoff.sleep(failures)
                continue
            failures = 0
            if not rows:
                return "done"
            for row in rows:
                if not self._running():
                    return "done"
                if not self._lane_ready(lane):
                    return "closed"
                if not await self._claim(chat_id):
                    return "busy"
                if not await self.process(row):
                    return "stalled"
                # One pass of the event loop before the chat's next row: the other chats' ready
                # work (a reply's delivery, their own rows) goes first. On the loop's SQLite a
                # row that needs no model may not wait at all, and a chat's backlog would hold
                # the loop for all of its rows.
                await asyncio.sleep(0)
            # Read again only if rows may have come since this read: handed to this chat
            # (start_chat) or committed with a bare wake; or if the lease was found lost
            # (`process` left its row to the new holder: the next claim says who that is, and
            # takes the chat back once this replica may again). Else the read would find
            # nothing: the rows this process commits are handed over, and another process's
            # are found by the periodic scan, as for a chat with no worker. It was one read a
            # chat's turn in each pool, two of a turn's statements.
            held = self.leases is None or self.leases.holds(chat_id)
            if held and chat_id not in self._again and self._wakes == wakes:
                return "done"
        return "done"

    async def _claim(self, chat_id: int) -> bool:
        """Take or renew the chat's lease (one try); False if another process holds it or
        the database cannot say."""
        if self.leases is None:
            return True
        try:
            return await self.leases.acquire(chat_id)
        except Exception as err:  # noqa: BLE001 - the database is down: wait for it
            log.warning("%s: taking the lease of chat %s failed (%s)", self.name, chat_id, err)
            return False
