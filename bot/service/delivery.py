"""Delivery: send what the outbox holds, per chat in order, retried, never twice.

Every reply and notice is an outbox row written in the same transaction as the change it reports.
This worker sends pending rows oldest first, one chat at a time per chat and many chats at once.
A long text goes out in parts; `parts_sent` is committed after each part, so a crash or a retry
resumes after the last part Telegram accepted instead of sending the whole text again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace
from datetime import UTC, datetime
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from telegram import Bot, Chat, InlineKeyboardMarkup, Message, ReplyParameters
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)

from bot import texts
from bot.db import outbox
from bot.db.engine import in_session
from bot.db.outbox import OutboxRow
from bot.logs import log_context
from bot.service.chat_pool import ChatPool, read_recently
from bot.service.leases import Leases
from bot.service.metrics import GAVE_UP, RETRY, Metrics
from bot.service.retry import Backoff, retry, retry_after_s

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

# sendMessage takes 1-4096 characters, counted in UTF-16 code units.
MAX_MESSAGE_UTF16 = 4096
# A chat still being sent to after this long (waiting out a 429 or a slow network) gives its
# slot of `concurrency` back: it blocks no other chat (a tenth of a second is a normal send).
SLOT_HOLD_S = 1.0
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
        return [texts.EMPTY_REPLY]
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


class ChatKinds:
    """Delivery's lanes (bot/service/chat_pool.py): private chats and groups, each with half of
    the chats sent to at once, so groups waiting out Telegram's limit of 20 messages a minute
    in a group (inside PTB's rate limiter) do not take the private chats' share. For a second
    at most: a chat still at it after SLOT_HOLD_S gives its share back, and beyond that only
    the client's connections (`max_concurrent`, 64) bound the chats waiting, as before."""

    lanes = 2

    async def lane_of(self, chat_id: int) -> str:
        """Telegram's ids: a user's private chat is positive, a group's negative."""
        return "private" if chat_id > 0 else "group"

    def lane_ready(self, name: str) -> bool:
        """Both always take work."""
        return True


class Delivery:
    """The outbox worker: woken when something is queued, and polling now and then.

    At most `concurrency` chats start being sent to at once (None: as many as have texts);
    one still at it after SLOT_HOLD_S no longer counts. When a batch of replies is committed
    together, the replies then go out a few at a time, in the
    order they were committed, instead of all of them, and the updates that come meanwhile,
    sharing the event loop in small steps. On a small machine that loop is what a burst
    waits for (docs/benchmarks.md, "fifth pass"). A few at a time keep up with Telegram's
    rate: about 30 messages a second for the whole bot (bot/service/budget.py), which 4
    sends in flight reach at round trips up to about 130 ms. A chat still at it after
    SLOT_HOLD_S (a 429 waited out inside PTB's rate limiter, a slow network) gives its slot
    back, so a slow chat never holds up another one for longer than that.
    """

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        bot: Bot,
        *,
        max_concurrent: int = 64,
        concurrency: int | None = None,
        backoff: Backoff | None = None,
        poll_interval_s: float = 15.0,
        leases: Leases | None = None,
        markup: Callable[[OutboxRow], InlineKeyboardMarkup | None] = lambda row: None,
        metrics: Metrics | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.bot = bot
        self.metrics = metrics
        # The keyboard of a text's last part (bot.tg.feedback.outbox_markup: the 👍/👎 of a
        # reply, a notice's own buttons).
        self.markup = markup
        self.backoff = backoff or Backoff(initial_s=0.5, cap_s=60.0)
        self._slots = asyncio.Semaphore(max_concurrent)
        self._read_pending = in_session(sessionmaker, outbox.pending)
        # Only the holder of a chat's outbox lease sends its texts, so none goes out twice.
        self.pool: ChatPool[OutboxRow] = ChatPool(
            "delivery",
            pending_chats=in_session(sessionmaker, outbox.pending_chats),
            pending=self._pending,
            process=self._deliver,
            leases=leases,
            backoff=self.backoff,
            poll_interval_s=poll_interval_s,
            drain_on_stop=True,
            max_concurrent=concurrency,
            lanes=ChatKinds() if concurrency is not None else None,
            slot_hold_s=SLOT_HOLD_S,
        )

    async def _pending(self, chat_id: int) -> list[OutboxRow]:
        """The chat's waiting texts, the first stamped with when it was read: the others are
        sent after it, by which time a /forget may have deleted them (issue 11.5), so they
        are read again first."""
        rows = await self._read_pending(chat_id)
        if rows:
            rows[0] = replace(rows[0], read_at=time.monotonic())
        return rows

    def wake(self) -> None:
        """Something was queued: look at the outbox now."""
        self.pool.wake()

    def offer(self, chats: Collection[int]) -> None:
        """Texts were queued (and committed) for `chats`: send them without a scan."""
        self.pool.offer(chats)

    @property
    def busy(self) -> int:
        """Chats with texts being sent now."""
        return self.pool.busy

    async def start(self) -> None:
        """Start sending, beginning with whatever an earlier run left undelivered."""
        await self.pool.start()

    async def stop(self, timeout_s: float) -> None:
        """Send what is pending for at most `timeout_s` seconds, then stop; the rest waits."""
        await self.pool.stop(timeout_s)

    async def _deliver(self, row: OutboxRow) -> bool:
        """Send one text (its chat's lease is held); False when the chat refuses the bot."""
        with log_context(chat_id=row.chat_id):
            if await self._send(row):
                return True
        await self._give_up_chat(row.chat_id, "Forbidden: the bot cannot write to this chat")
        return False

    async def _send(self, row: OutboxRow) -> bool:
        """Send one outbox text (all its remaining parts); False if the chat refuses the bot."""
        parts = split_message(row.text)
        failures = 0
        # Read under the chat's lease a moment ago (chat_pool.FRESH_S): the first try need not
        # read it again. A /forget or an edit that withdraws it in between is the race the
        # re-read had too (between it and the request), in a window now up to FRESH_S long
        # instead of one round trip: `outbox.sent` then finds the row gone, and
        # `withdrawn_reply_went_out` makes a replacing reply already queued edit this one.
        fresh = read_recently(row.read_at)
        while True:
            # Still ours before every attempt, also after a 429 wait or a backoff: a replica
            # fenced or taken over meanwhile must not send (the new holder does).
            if not await self._still_ours(row.chat_id):
                log.warning("chat %s: outbox lease lost; its new holder sends", row.chat_id)
                return True  # the row stays pending; the pool finds the lease gone next
            # Re-read the row before every part but a fresh row's first: a /forget (or another
            # process) may have deleted or sent it since the chat's rows were read.
            if fresh:
                current: int | None = row.parts_sent
                fresh = False  # a retry reads it again
            else:
                current = await self._write(outbox.still_pending, row.id)
            if current is None:
                return True
            if current >= len(parts):
                # Every part went out (the text or its splitting changed since): close it.
                await self._write(outbox.sent, row.id)
                return True
            sent = current
            editing = sent == 0 and row.edit_message_id is not None
            method = "editMessageText" if editing else "sendMessage"
            try:
                message = await self._send_part(row, parts, sent)
            except RetryAfter as err:
                wait = retry_after_s(err)
                log.info("Telegram asks to wait %.1fs before writing to chat %s", wait, row.chat_id)
                await self._failed(row.id, f"429: retry after {wait}s")
                self._count(method, RETRY)
                await asyncio.sleep(wait)
                continue
            except Forbidden as err:
                log.info("chat %s does not accept messages from the bot: %s", row.chat_id, err)
                self._count(method, GAVE_UP)
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
                self._count(method, GAVE_UP)
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
                self._count(method, RETRY)
                await self.backoff.sleep(failures)
                continue
            except (TelegramError, ValueError, TypeError) as err:
                failures += 1
                log.exception("unexpected error sending outbox row %s", row.id)
                give_up = failures >= MAX_UNEXPECTED_FAILURES
                await self._failed(row.id, repr(err), give_up=give_up)
                self._count(method, GAVE_UP if give_up else RETRY)
                if give_up:
                    return True
                await self.backoff.sleep(failures)
                continue
            sent += 1
            if sent < len(parts):
                await self._write(outbox.part_sent, row.id, sent)
            else:
                if not await self._write(outbox.sent, row.id, message.message_id):
                    await self._write(outbox.withdrawn_reply_went_out, row, message.message_id)
                return True

    async def _send_part(self, row: OutboxRow, parts: list[str], sent: int) -> Message:
        """One Bot API call for part `sent` of the row's text: the first part edits the old
        reply where the row says so (an edited message's new reply), else a new message; the
        last part carries the row's buttons."""
        reply = None
        if sent == 0 and row.reply_to_message_id is not None and row.chat_id < 0:
            # In groups the reply shows which message it answers; in private chats it is noise.
            reply = ReplyParameters(row.reply_to_message_id, allow_sending_without_reply=True)
        markup = self.markup(row) if sent == len(parts) - 1 else None
        async with self._slots:
            if sent == 0 and row.edit_message_id is not None:
                return await self._edit(row, parts[0], markup)
            return await self.bot.send_message(
                row.chat_id, parts[sent], reply_parameters=reply, reply_markup=markup
            )

    async def _still_ours(self, chat_id: int) -> bool:
        """Whether this process still holds the chat's outbox lease (renewed if due)."""
        leases = self.pool.leases
        if leases is None:
            return True
        try:
            return await leases.acquire(chat_id)
        except Exception as err:  # noqa: BLE001 - the database cannot say: do not send
            log.warning("checking the outbox lease of chat %s failed: %s", chat_id, err)
            return False

    def _count(self, method: str, action: str) -> None:
        if self.metrics is not None:
            self.metrics.telegram_failure(method, action)

    async def _edit(
        self, row: OutboxRow, text: str, markup: InlineKeyboardMarkup | None
    ) -> Message:
        """A regenerated reply into the old reply's message (editMessageText); a message that
        is gone (deleted by the user) gets a new one instead."""
        assert row.edit_message_id is not None
        try:
            edited = await self.bot.edit_message_text(
                text, chat_id=row.chat_id, message_id=row.edit_message_id, reply_markup=markup
            )
        except BadRequest as err:
            reason = str(err).lower()
            if "not modified" in reason:  # the same text again: nothing to change
                return await self._stand_in(row)
            if "not found" not in reason and "can't be edited" not in reason:
                raise
            log.info("the reply to edit in chat %s is gone (%s); sending it anew", row.chat_id, err)
            return await self.bot.send_message(row.chat_id, text, reply_markup=markup)
        if isinstance(edited, Message):
            return edited
        return await self._stand_in(row)

    @staticmethod
    async def _stand_in(row: OutboxRow) -> Message:
        """The edited message as delivery records it (its id is all that is read)."""
        assert row.edit_message_id is not None
        kind = Chat.PRIVATE if row.chat_id > 0 else Chat.GROUP
        return Message(row.edit_message_id, datetime.now(UTC), Chat(row.chat_id, kind))

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

        async def once() -> T:
            async with self.sessionmaker.begin() as db:
                return await change(db, *args, **kwargs)

        return await retry(once, what="outbox bookkeeping", backoff=self.backoff)
