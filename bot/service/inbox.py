"""The inbox worker (the per-chat sequencer): one update at a time per chat, in update_id
order; chats in parallel.

The inbox table is the queue, worked through by the per-chat pool (bot/service/chat_pool.py): a
chat's pending rows are read after taking its lease, and the first thing done with each row is
to re-read its status, so an update closed meanwhile (by a redelivery race or another replica)
is not processed twice. Pending rows left by a crash are simply found by the first scan.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot import texts
from bot.conversations.outcome import FAILED
from bot.db import chat_settings, inbox, outbox
from bot.db.engine import in_session
from bot.db.inbox import InboxRow, UpdateRef
from bot.db.leases import LeaseLost
from bot.db.models import InboxStatus, OutboxKind
from bot.logs import log_context
from bot.service.chat_pool import ChatPool, Lanes, read_recently
from bot.service.leases import Leases
from bot.service.metrics import Metrics
from bot.service.retry import Backoff

log = logging.getLogger(__name__)

# Tries of one update before it is closed as failed and the chat gets an apology.
MAX_ATTEMPTS = 3


# A row's handler, given the owner of the chat's inbox lease (None: no leases), which the
# commit that closes the update checks again (bot.db.inbox.finish).
Handle = Callable[[InboxRow, str | None], Awaitable[None]]


class InboxWorker:
    """Runs `handle` for every pending inbox row with per-chat order and bounded parallelism."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        handle: Handle,
        *,
        max_concurrent: int = 64,
        on_processed: Callable[[Collection[int]], None] = lambda chats: None,
        backoff: Backoff | None = None,
        poll_interval_s: float = 5.0,
        leases: Leases | None = None,
        metrics: Metrics | None = None,
        lanes: Lanes | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.handle = handle
        self.metrics = metrics
        self.on_processed = on_processed
        self.backoff = backoff or Backoff(initial_s=0.5, cap_s=10.0)
        self.pool: ChatPool[InboxRow] = ChatPool(
            "inbox-worker",
            pending_chats=in_session(sessionmaker, inbox.pending_chats),
            pending=self._pending,
            process=self._work_one,
            # The row is still pending: the chat's later rows wait (their order holds) and the
            # chat is looked at again after a pause.
            after_stall=lambda: self.backoff.sleep(MAX_ATTEMPTS),
            leases=leases,
            backoff=self.backoff,
            poll_interval_s=poll_interval_s,
            max_concurrent=max_concurrent,
            # A chat's lane is its variant: a share of the slots each, and a variant whose
            # worker is down takes no chat here (bot/service/chat_pool.py).
            lanes=lanes,
        )
        # Whose inbox leases the rows are handled under (None: no leases, one process).
        self._owner = leases.owner if leases is not None else None
        self._read_pending = in_session(sessionmaker, inbox.pending_of_chat)

    def wake(self) -> None:
        """New rows were committed: scan now."""
        self.pool.wake()

    def offer(self, chats: Collection[int]) -> None:
        """Updates of `chats` were committed: start their workers without a scan."""
        self.pool.offer(chats)

    async def start(self) -> None:
        """Start scanning; the first scan picks up whatever an earlier run left pending."""
        await self.pool.start()

    @property
    def busy(self) -> int:
        """Chats with an update in progress."""
        return self.pool.busy

    async def stop(self, grace_s: float) -> None:
        """Take no new updates; give the ones in progress `grace_s` seconds, then cancel them.

        A cancelled update stays pending in the inbox (its transaction never committed) and is
        processed at the next start.
        """
        await self.pool.stop(grace_s)

    async def _work_one(self, row: InboxRow) -> bool:
        """Process one row (the chat's lease is held); False leaves the chat for later."""
        with (
            log_context(chat_id=row.chat_id, update_id=row.update_id),
            outbox.watching_queued() as queued,
        ):
            closed = await self._process(row)
        self.on_processed(queued.chats)
        return closed

    async def _pending(self, chat_id: int) -> list[InboxRow]:
        """The chat's pending rows, stamped with when they were read."""
        now = time.monotonic()
        return [replace(row, read_at=now) for row in await self._read_pending(chat_id)]

    async def _status(self, update_id: int) -> str | None:
        async with self.sessionmaker() as db:
            return await inbox.status_of(db, update_id)

    async def _process(self, row: InboxRow) -> bool:
        """Handle one row with retries; True once the row is closed (or was already)."""
        attempts = row.attempts
        # Read as pending a moment ago (chat_pool.FRESH_S): the first try need not read it
        # again. The commit that closes it is the fence (bot.db.inbox.finish rolls the turn
        # back when the row was closed meanwhile). The re-read cost 18 ms p50 a turn at 50 users.
        fresh = read_recently(row.read_at)
        while True:
            try:
                status = InboxStatus.PENDING if fresh else await self._status(row.update_id)
                fresh = False  # a retry reads it again
                if status != InboxStatus.PENDING:
                    # Closed meanwhile (a redelivery race, another replica), or deleted by an
                    # admin's forget (a user's /forget keeps the updates that came after it).
                    return True
                await self.handle(row, self._owner)
                return True
            except LeaseLost as err:
                # Another replica has the chat now: our turn was rolled back; it answers. Forget
                # the lease, or the next try would trust it from memory and generate again.
                log.warning("update %s: %s; leaving the chat to its new holder", row.update_id, err)
                if self.pool.leases is not None and row.chat_id is not None:
                    self.pool.leases.forget(row.chat_id)
                return False
            except Exception as err:  # any failure of a handler is retried
                attempts += 1
                log.warning(
                    "update %s failed (attempt %d of %d): %s",
                    row.update_id,
                    attempts,
                    MAX_ATTEMPTS,
                    err,
                    exc_info=err,
                )
                attempts = await self._count_failure(row, err, attempts)
                if attempts >= MAX_ATTEMPTS:
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
                    # In the language the update would have been answered in.
                    stored = await chat_settings.language_of(db, row.chat_id)
                    language = texts.choose(stored, sender_language(row.payload))
                    await outbox.enqueue(
                        db,
                        chat_id=row.chat_id,
                        kind=OutboxKind.NOTICE,
                        text=texts.for_language(language).APOLOGY,
                        update_id=row.update_id,
                    )
                await inbox.finish(
                    db,
                    UpdateRef(row.update_id, self._owner),
                    status=InboxStatus.FAILED,
                    error=_describe(err),
                )
        except Exception as db_err:  # noqa: BLE001 - the row stays pending for a later try
            log.error(
                "could not mark update %s failed (%s); it stays pending", row.update_id, db_err
            )
            return False
        log.error("update %s failed %d times; gave up and apologised", row.update_id, MAX_ATTEMPTS)
        if self.metrics is not None:
            self.metrics.turn(FAILED)
        return True


def sender_language(payload: str) -> str | None:
    """The `from.language_code` of a stored update (its message, edit or button press)."""
    try:
        update = json.loads(payload)
    except ValueError:
        return None
    for part in update.values() if isinstance(update, dict) else ():
        sender = part.get("from") if isinstance(part, dict) else None
        code = sender.get("language_code") if isinstance(sender, dict) else None
        if isinstance(code, str):
            return code
    return None


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:1000]
