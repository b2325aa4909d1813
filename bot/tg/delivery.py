"""Delivery: send what the outbox holds, per chat in order, retried, never twice.

Every reply and notice is an outbox row written in the same transaction as the change it reports.
This worker sends pending rows oldest first, one chat at a time per chat and many chats at once.
A long text goes out in parts; `parts_sent` is committed after each part, so a crash or a retry
resumes after the last part Telegram accepted instead of sending the whole text again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from telegram import Bot, Message, ReplyParameters
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)

from bot.db import outbox
from bot.db.outbox import OutboxRow
from bot.tg.backoff import Backoff, retry_after_s, wait_event
from bot.tg.leases import Leases

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

# sendMessage takes 1-4096 characters, counted in UTF-16 code units.
MAX_MESSAGE_UTF16 = 4096
# Telegram rejects empty text; a blank reply still deserves an answer.
EMPTY_TEXT = "…"
# Give up on a text after this many failures that are not Telegram's ordinary faults (bugs).
MAX_UNEXPECTED_FAILURES = 5
# Boundaries preferred for splitting, best first: paragraph, line, sentence, word.
_SEPARATORS = ("\n\n", "\n", ". ", " ")


def utf16_len(text: str) -> int:
    """Length as Telegram counts it: UTF-16 code units (an emoji outside the BMP counts 2)."""
    return len(text.encode("utf-16-le")) // 2


def _fit(text: str, limit: int) -> int:
    """How many code points of `text` fit in `limit` UTF-16 code units."""
    units = 0
    for i, ch in enumerate(text):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > limit:
            return i
    return len(text)


def split_message(text: str, limit: int = MAX_MESSAGE_UTF16) -> list[str]:
    """Split a text into Telegram-sized parts, at natural boundaries where possible.

    Deterministic, so that `parts_sent` means the same parts after a restart.
    """
    text = text.strip()
    if not text:
        return [EMPTY_TEXT]
    parts: list[str] = []
    while utf16_len(text) > limit:
        cut = _fit(text, limit)
        window = text[:cut]
        best = cut
        for sep in _SEPARATORS:
            at = window.rfind(sep)
            if at >= cut // 2:  # do not make tiny parts for the sake of a nice boundary
                best = at + len(sep)
                break
        parts.append(text[:best].rstrip())
        text = text[best:].lstrip()
    if text:
        parts.append(text)
    return parts


class Delivery:
    """The outbox worker: woken when something is queued, and polling now and then."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        bot: Bot,
        *,
        max_concurrent: int = 64,
        backoff: Backoff | None = None,
        poll_interval_s: float = 15.0,
        leases: Leases | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.bot = bot
        self.backoff = backoff or Backoff(initial_s=0.5, cap_s=60.0)
        self.poll_interval_s = poll_interval_s
        # Other processes may share the database: only the holder of a chat's lease sends its
        # texts, so none goes out twice (None: this process is alone, as in some unit tests).
        self.leases = leases
        self._slots = asyncio.Semaphore(max_concurrent)
        self._wake = asyncio.Event()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._runner: asyncio.Task[None] | None = None
        self._stopping = False

    def wake(self) -> None:
        """Something was queued: look at the outbox now."""
        self._wake.set()

    async def start(self) -> None:
        """Start sending, beginning with whatever an earlier run left undelivered."""
        self._runner = asyncio.create_task(self._run(), name="delivery")

    async def stop(self, timeout_s: float) -> None:
        """Send what is pending for at most `timeout_s` seconds, then stop; the rest waits."""
        self._stopping = True
        if self._runner is None:
            return  # never started
        self._runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._runner
        try:
            await self._scan()  # texts queued by the last turns
        except Exception:
            log.exception("could not read the outbox while stopping")
        tasks = list(self._tasks.values())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if pending:
                log.info(
                    "%d chats still have unsent texts; they go out at the next start", len(pending)
                )

    async def _run(self) -> None:
        failures = 0
        while not self._stopping:
            self._wake.clear()
            try:
                await self._scan()
                failures = 0
            except Exception as err:  # noqa: BLE001 - whatever the database does, keep going
                failures += 1
                log.warning("reading the outbox failed (%s); retrying", err)
                await self.backoff.sleep(failures)
                continue
            await wait_event(self._wake, self.poll_interval_s)

    async def _scan(self) -> None:
        """Start a sender for every chat with pending texts that has none running."""
        async with self.sessionmaker() as db:
            rows = await outbox.pending(db)
        for chat_id in dict.fromkeys(r.chat_id for r in rows):
            if chat_id not in self._tasks:
                task = asyncio.create_task(self._deliver_chat(chat_id), name=f"deliver:{chat_id}")
                self._tasks[chat_id] = task
                task.add_done_callback(partial(self._chat_done, chat_id))

    def _chat_done(self, chat_id: int, task: asyncio.Task[None]) -> None:
        self._tasks.pop(chat_id, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("delivery to chat %s failed", chat_id, exc_info=task.exception())
        # A text queued while this sender was finishing needs a new one.
        self._wake.set()

    async def _deliver_chat(self, chat_id: int) -> None:
        """Send a chat's pending texts in order until none is left."""
        try:
            while True:
                if not await self._claim(chat_id):
                    return
                # Read after taking the lease: another process may have sent some meanwhile.
                async with self.sessionmaker() as db:
                    rows = await outbox.pending(db, chat_id)
                if not rows:
                    return
                for row in rows:
                    if not await self._claim(chat_id):
                        return
                    if not await self._send(row):
                        await self._give_up_chat(
                            chat_id, "Forbidden: the bot cannot write to this chat"
                        )
                        return
        finally:
            if self.leases is not None:
                await self.leases.release(chat_id)

    async def _claim(self, chat_id: int) -> bool:
        """Take or renew the chat's lease; False (after a pause) if another process has it."""
        if self.leases is None:
            return True
        try:
            if await self.leases.acquire(chat_id):
                return True
        except Exception as err:  # noqa: BLE001 - the database is down: try again later
            log.warning("taking the outbox lease of chat %s failed (%s)", chat_id, err)
        # The holder sends this chat's texts; look again in a moment in case it just finished
        # (this sender's end wakes the scan, so without the pause it would spin).
        await asyncio.sleep(1.0)
        return False

    async def _send(self, row: OutboxRow) -> bool:
        """Send one outbox text (all its remaining parts); False if the chat refuses the bot."""
        parts = split_message(row.text)
        failures = 0
        while True:
            # Re-read the row before every part: a /forget (or another process) may have
            # deleted or sent it since the chat's rows were read.
            current = await self._write(outbox.still_pending, row.id)
            if current is None or current >= len(parts):
                return True
            sent = current
            reply = None
            if sent == 0 and row.reply_to_message_id is not None and row.chat_id < 0:
                # In groups the reply shows which message it answers; in private chats it is noise.
                reply = ReplyParameters(row.reply_to_message_id, allow_sending_without_reply=True)
            try:
                async with self._slots:
                    message: Message = await self.bot.send_message(
                        row.chat_id, parts[sent], reply_parameters=reply
                    )
            except RetryAfter as err:
                wait = retry_after_s(err)
                log.info("Telegram asks to wait %.1fs before writing to chat %s", wait, row.chat_id)
                await self._failed(row.id, f"429: retry after {wait}s")
                await asyncio.sleep(wait)
                continue
            except Forbidden as err:
                log.info("chat %s does not accept messages from the bot: %s", row.chat_id, err)
                return False
            except (BadRequest, ChatMigrated) as err:
                # Retrying the same request cannot succeed.
                log.warning(
                    "Telegram refused outbox row %s for chat %s: %s; giving up",
                    row.id,
                    row.chat_id,
                    err,
                )
                await self._failed(row.id, str(err), give_up=True)
                return True
            except (NetworkError, InvalidToken) as err:
                # Timeouts, connection errors and 5xx: Telegram will be back; the text waits.
                failures += 1
                log.warning(
                    "sending to chat %s failed (%s: %s); retry %d",
                    row.chat_id,
                    type(err).__name__,
                    err,
                    failures,
                )
                await self._failed(row.id, f"{type(err).__name__}: {err}")
                await self.backoff.sleep(failures)
                continue
            except (TelegramError, ValueError, TypeError) as err:
                failures += 1
                log.exception("unexpected error sending outbox row %s", row.id)
                give_up = failures >= MAX_UNEXPECTED_FAILURES
                await self._failed(row.id, repr(err), give_up=give_up)
                if give_up:
                    return True
                await self.backoff.sleep(failures)
                continue
            sent += 1
            if sent < len(parts):
                await self._write(outbox.part_sent, row.id, sent)
            else:
                await self._write(outbox.sent, row.id, message.message_id)
                return True

    async def _give_up_chat(self, chat_id: int, reason: str) -> None:
        async def give_up(db: AsyncSession) -> None:
            for row in await outbox.pending(db, chat_id):
                await outbox.attempt_failed(db, row.id, reason, give_up=True)

        await self._write(give_up)  # type: ignore[arg-type]

    async def _failed(self, outbox_id: int, error: str, give_up: bool = False) -> None:
        await self._write(outbox.attempt_failed, outbox_id, error[:1000], give_up)

    async def _write(
        self,
        change: Callable[Concatenate[AsyncSession, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Commit a bookkeeping change (or read), retrying until the database takes it.

        After a successful send this is what keeps the text from going out twice, so it does
        not give up (a stop cancels it; then the text is resent at the next start).
        """
        attempt = 0
        while True:
            try:
                async with self.sessionmaker.begin() as db:
                    return await change(db, *args, **kwargs)
            except Exception as err:  # noqa: BLE001 - retried until the database is back
                attempt += 1
                log.warning("outbox bookkeeping failed (%s); retry %d", err, attempt)
                await self.backoff.sleep(attempt)
