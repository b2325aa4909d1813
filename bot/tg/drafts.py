"""Streamed drafts in private chats: `sendMessageDraft` previews while a reply generates.

A turn in a private chat (STREAM_REPLIES=on) opens a `DraftStream`: an empty draft at once
(Telegram shows "Thinking…"), then every draft the model worker reports (the start of the
reply as far as it is settled, whole words, at most about one per second per chat: each draft
begins the reply, so none takes a word back). The final reply still goes through
the outbox as a `sendMessage` whose text is exactly the stored reply (docs/guarantees.md,
invariant 12); a draft is only a preview.

Every draft is fire-and-forget: its own task, a short timeout, no retries, errors logged at
DEBUG and dropped. A draft that fails (a 400 from an older client or a group, a 429, a timeout)
therefore never loses the final reply, and delays it at most by the timeout of the one draft in
flight. Drafts go through a Bot client of their own (`DraftSender`), not the application's:
PTB's AIORateLimiter would retry them after a 429 (a stale preview, seconds later) and hold its
other requests during that wait, which is right for replies and wrong for previews. They draw
on the bot's one send budget all the same (bot/service/budget.py): only what the replies leave,
nothing while a reply waits for its turn or a reply's 429 is waited out. A 429 on a draft
pauses drafts only, for its retry_after. While one draft is in flight the next is dropped (the
one after it brings newer text anyway).

Order: a draft must never reach the chat after its turn's reply (it would show a stale preview
under the answer). Before the turn writes its reply to the outbox, `DraftStream.done()` closes
the stream and waits for the draft in flight, which holds the stream's lock for its HTTP call
and checks the stream right before it under that lock; the outbox row, which any replica may
send, exists only after that. With the safety gate on, a draft the classifier flags is not
shown, nor anything after it in that turn (the final reply passes the gate as always).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field

from telegram import Bot
from telegram.error import RetryAfter

from bot.service.budget import SendBudget
from bot.service.retry import retry_after_s
from bot.tg.aiohttp_request import AiohttpRequest

log = logging.getLogger(__name__)

DRAFT_TIMEOUT_S = 2.0
MAX_DRAFT_CHARS = 4096

Check = Callable[[Sequence[str]], Awaitable[list[bool]]]


class DraftSender:
    """The service's drafts client: a Bot without PTB's rate limiter, a small connection pool,
    turns from the bot's send budget, and a pause after a draft's 429."""

    def __init__(self, token: str, base_url: str, budget: SendBudget) -> None:
        self.request = AiohttpRequest(8)
        self.bot = Bot(token, base_url=base_url, request=self.request)
        self.budget = budget
        self.paused_until = 0.0
        self._ready = False

    async def turn(self) -> bool:
        """Whether one more draft may go now (not paused by a 429, and replies leave room)."""
        return time.monotonic() >= self.paused_until and await self.budget.draft()

    async def send(self, chat_id: int, draft_id: int, text: str, timeout_s: float) -> None:
        """One sendMessageDraft, at most `timeout_s`; errors are the caller's to drop."""
        if not self._ready:
            await self.request.initialize()  # no getMe: the application's bot did that
            self._ready = True
        try:
            # A deadline on this task, not wait_for's task of its own: on Python 3.11 that was
            # a task and three more loop callbacks for every draft (docs/benchmarks.md).
            async with asyncio.timeout(timeout_s):
                await self.bot.send_message_draft(
                    chat_id,
                    draft_id,
                    text,
                    read_timeout=timeout_s,
                    write_timeout=timeout_s,
                    connect_timeout=timeout_s,
                    pool_timeout=timeout_s,
                )
        except RetryAfter as err:
            self.paused_until = time.monotonic() + retry_after_s(err)
            raise

    async def close(self) -> None:
        """Release the client's connections."""
        if self._ready:
            await self.request.shutdown()
            self._ready = False


@dataclass(eq=False, repr=False)
class DraftStream:
    """One turn's drafts in one private chat."""

    sender: DraftSender
    chat_id: int
    _: KW_ONLY
    check: Check | None = None
    timeout_s: float = field(init=False, default_factory=lambda: DRAFT_TIMEOUT_S)
    # Changes to one non-zero draft id are animated as one growing draft.
    draft_id: int = field(init=False, default_factory=lambda: random.randint(1, 2**31 - 1))
    sent: int = field(init=False, default=0)
    _task: asyncio.Task[None] | None = field(init=False, default=None)
    _closed: bool = field(init=False, default=False)
    _lock: asyncio.Lock = field(
        init=False, default_factory=asyncio.Lock
    )  # held by a draft's HTTP call

    def start(self) -> None:
        """The empty draft: "Thinking…" at once."""
        self.send("")

    def send(self, text: str) -> None:
        """Show `text` as the draft, unless the turn is done or a draft is still in flight."""
        if self._closed or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(
            self._send(text[:MAX_DRAFT_CHARS]), name=f"draft:{self.chat_id}"
        )

    async def _send(self, text: str) -> None:
        try:
            if text and self.check is not None and (await self.check([text]))[0]:
                self._closed = True  # flagged: no more previews in this turn
                return
            async with self._lock:
                # Right before the call, under the lock done() waits for: once done() has
                # closed the stream, no draft of this turn starts any more.
                if self._closed or not await self.sender.turn():
                    return
                await self.sender.send(self.chat_id, self.draft_id, text, self.timeout_s)
            self.sent += 1
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a preview: whatever went wrong, drop it
            log.debug("draft for chat %s dropped: %s: %s", self.chat_id, type(err).__name__, err)

    async def done(self) -> None:
        """No more drafts in this turn, and none in flight (that one may take its timeout):
        the turn's reply may be sent after this."""
        self._closed = True
        async with self._lock:
            pass
        if self._task is not None and not self._task.done():
            self._task.cancel()  # still in the safety check: it would not send anyway
