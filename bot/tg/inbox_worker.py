"""The inbox worker (the per-chat sequencer): one update at a time per chat, in update_id
order; chats in parallel.

The inbox table is the queue. A scan reads pending rows oldest first and appends each to its
chat's in-memory queue; one worker per chat drains that queue, and at most `max_concurrent`
updates are processed at once. Pending rows left by a crash are simply found by the first scan.

Rule from aiogram #1317: take the chat's lock *before* reading the chat's state. Here the lock is
"being that chat's only worker", and the first thing a worker does with a row is re-read its
status, so an update closed meanwhile (by a redelivery race or, later, another replica) is not
processed twice. Scale-out (DESIGN.md) replaces the in-process worker map with a per-chat
advisory lock on PostgreSQL; nothing here assumes the process is alone in the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import inbox, outbox
from bot.db.inbox import InboxRow
from bot.db.models import InboxStatus, OutboxKind
from bot.tg.backoff import Backoff, wait_event
from bot.tg.leases import Leases

log = logging.getLogger(__name__)

APOLOGY = "Sorry, something went wrong on my side with that message. Please send it again."

Handle = Callable[[InboxRow], Awaitable[None]]


class InboxWorker:
    """Runs `handle` for every pending inbox row with per-chat order and bounded parallelism."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        handle: Handle,
        *,
        max_concurrent: int = 64,
        on_processed: Callable[[], None] = lambda: None,
        max_attempts: int = 3,
        backoff: Backoff | None = None,
        poll_interval_s: float = 5.0,
        scan_limit: int = 1000,
        leases: Leases | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.handle = handle
        self.on_processed = on_processed
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff(initial_s=0.5, cap_s=10.0)
        self.poll_interval_s = poll_interval_s
        self.scan_limit = scan_limit
        # Other processes may share the database: a chat's rows are worked on only by the
        # holder of its lease (None: this process is alone, as in some unit tests).
        self.leases = leases
        self._slots = asyncio.Semaphore(max_concurrent)
        self._wake = asyncio.Event()
        self._queues: dict[int, deque[InboxRow]] = {}
        self._workers: dict[int, asyncio.Task[None]] = {}
        self._known: set[int] = set()  # update_ids queued or in progress here
        self._runner: asyncio.Task[None] | None = None
        self._stopping = False

    def wake(self) -> None:
        """New rows were committed: scan now."""
        self._wake.set()

    async def start(self) -> None:
        """Start scanning; the first scan picks up whatever an earlier run left pending."""
        self._runner = asyncio.create_task(self._run(), name="inbox-worker")

    @property
    def busy(self) -> int:
        """Updates queued or in progress."""
        return len(self._known)

    async def stop(self, grace_s: float) -> None:
        """Take no new updates; give the ones in progress `grace_s` seconds, then cancel them.

        A cancelled update stays pending in the inbox (its transaction never committed) and is
        processed at the next start.
        """
        self._stopping = True
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        workers = list(self._workers.values())
        if not workers:
            return
        _, pending = await asyncio.wait(workers, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if pending:
            log.warning(
                "%d chats had an update in progress after %.1fs; it stays pending",
                len(pending),
                grace_s,
            )

    async def _run(self) -> None:
        failures = 0
        while not self._stopping:
            self._wake.clear()
            try:
                async with self.sessionmaker() as db:
                    rows = await inbox.pending(db, limit=self.scan_limit)
                failures = 0
            except Exception as err:  # noqa: BLE001 - whatever the database does, keep going
                failures += 1
                log.warning("reading the inbox failed (%s); retry %d", err, failures)
                await self.backoff.sleep(failures)
                continue
            for row in rows:
                self._dispatch(row)
            await wait_event(self._wake, self.poll_interval_s)

    def _dispatch(self, row: InboxRow) -> None:
        if row.update_id in self._known:
            return
        self._known.add(row.update_id)
        # Rows without a chat are never pending (ingest closes them); key them apart anyway.
        key = row.chat_id if row.chat_id is not None else -(2**62) - row.update_id
        self._queues.setdefault(key, deque()).append(row)
        if key not in self._workers:
            self._start_worker(key)

    def _start_worker(self, key: int) -> None:
        task = asyncio.create_task(self._work(key), name=f"chat:{key}")
        self._workers[key] = task
        task.add_done_callback(partial(self._worker_done, key))

    def _worker_done(self, key: int, task: asyncio.Task[None]) -> None:
        self._workers.pop(key, None)
        crashed = not task.cancelled() and task.exception() is not None
        if crashed:
            log.error("worker of chat %s crashed", key, exc_info=task.exception())
        queue = self._queues.get(key)
        if queue and not self._stopping and not crashed:
            # Rows arrived between the worker's last look and its end.
            self._start_worker(key)
            return
        if queue:
            self._known.difference_update(r.update_id for r in queue)
        self._queues.pop(key, None)
        self._wake.set()

    async def _work(self, key: int) -> None:
        queue = self._queues[key]
        try:
            while queue and not self._stopping:
                if not await self._claim(key):
                    break
                await self._work_one(key, queue)
        finally:
            if self.leases is not None:
                await self.leases.release(key)

    async def _claim(self, key: int) -> bool:
        """Hold the chat's lease before each row; wait while another process holds it."""
        if self.leases is None:
            return True
        attempt = 0
        while not self._stopping:
            try:
                if await self.leases.acquire(key):
                    return True
            except Exception as err:  # noqa: BLE001 - the database is down: wait for it
                log.warning("taking the lease of chat %s failed (%s)", key, err)
            attempt += 1
            # Another process works on this chat; its rows are re-read after we get the lease.
            await asyncio.sleep(min(2.0, 0.1 * attempt))
        return False

    async def _work_one(self, key: int, queue: deque[InboxRow]) -> None:
        """Process the chat's next row under its lease."""
        row = queue[0]
        async with self._slots:
            if self._stopping:
                return
            closed = await self._process(row)
        queue.popleft()
        self._known.discard(row.update_id)
        self.on_processed()
        if not closed:
            # The row is still pending: leave it, and the chat's later rows, to a later scan
            # so that their order holds.
            self._known.difference_update(r.update_id for r in queue)
            queue.clear()
            await self.backoff.sleep(self.max_attempts)
            self._wake.set()

    async def _status(self, update_id: int) -> str | None:
        async with self.sessionmaker() as db:
            return await inbox.status_of(db, update_id)

    async def _process(self, row: InboxRow) -> bool:
        """Handle one row with retries; True once the row is closed (or was already)."""
        attempts = row.attempts
        while True:
            try:
                status = await self._status(row.update_id)
                if status != InboxStatus.PENDING:
                    # Closed meanwhile (a redelivery race, another replica), or deleted by an
                    # admin's forget (a user's /forget keeps the updates that came after it).
                    return True
                await self.handle(row)
                return True
            except Exception as err:  # any failure of a handler is retried
                attempts += 1
                log.warning(
                    "update %s failed (attempt %d of %d): %s",
                    row.update_id,
                    attempts,
                    self.max_attempts,
                    err,
                    exc_info=err,
                )
                attempts = await self._count_failure(row, err, attempts)
                if attempts >= self.max_attempts:
                    return await self._give_up(row, err)
                await self.backoff.sleep(attempts)

    async def _count_failure(self, row: InboxRow, err: Exception, attempts: int) -> int:
        try:
            async with self.sessionmaker.begin() as db:
                return max(attempts, await inbox.count_failure(db, row.update_id, _describe(err)))
        except Exception:  # noqa: BLE001
            return attempts  # the database is what failed; count in memory

    async def _give_up(self, row: InboxRow, err: Exception) -> bool:
        """Close the row as failed and apologise to the chat, in one transaction."""
        try:
            async with self.sessionmaker.begin() as db:
                if row.chat_id is not None:
                    await outbox.enqueue(
                        db,
                        chat_id=row.chat_id,
                        kind=OutboxKind.NOTICE,
                        text=APOLOGY,
                        update_id=row.update_id,
                    )
                await inbox.finish(
                    db, row.update_id, status=InboxStatus.FAILED, error=_describe(err)
                )
        except Exception as db_err:  # noqa: BLE001 - the row stays pending for a later try
            log.error(
                "could not mark update %s failed (%s); it stays pending", row.update_id, db_err
            )
            return False
        log.error(
            "update %s failed %d times; gave up and apologised", row.update_id, self.max_attempts
        )
        return True


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:1000]
