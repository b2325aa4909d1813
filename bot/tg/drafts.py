"""Streamed drafts in private chats: `sendMessageDraft` previews while a reply generates.

A turn in a private chat (STREAM_REPLIES=on) opens a `DraftStream`: an empty draft at once
(Telegram shows "Thinking…"), then every draft the model worker reports (the best hypothesis so
far, whole words, at most about one per second per chat). The final reply still goes through
the outbox as a `sendMessage` whose text is exactly the stored reply (DESIGN.md invariant 12);
a draft is only a preview.

Every draft is fire-and-forget: its own task, a short timeout, no retries, errors logged at
DEBUG and dropped. A draft that fails (a 400 from an older client or a group, a 429, a timeout)
therefore never delays or loses the final reply: nothing waits for it. Drafts go through a Bot
client of their own (`DraftSender`), not the application's: PTB's AIORateLimiter would count
them against the replies' budget, retry them after a 429 (a stale preview, seconds later) and
hold its other requests during that wait, which is right for replies and wrong for previews.
A 429 on a draft pauses drafts only, for its retry_after. While
one draft is in flight the next is dropped (the one after it brings newer text anyway), and all
drafts of the service share one rate gate well under Telegram's 30 requests/s, so that replies
keep the room. With the safety gate on, a draft the classifier flags is not shown, nor anything
after it in that turn (the final reply passes the gate as always).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence

from telegram import Bot
from telegram.error import RetryAfter
from telegram.request import HTTPXRequest

log = logging.getLogger(__name__)

DRAFT_TIMEOUT_S = 2.0
# Drafts per second for the whole service (Telegram: about 30 requests/s per bot in all).
DRAFTS_PER_S = 15.0
MAX_DRAFT_CHARS = 4096

Check = Callable[[Sequence[str]], Awaitable[list[bool]]]


class RateGate:
    """A token bucket: `take()` is True while the rate allows one more."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = time.monotonic()

    def take(self) -> bool:
        """Spend a token if there is one."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class DraftSender:
    """The service's drafts client: a Bot without a rate limiter, a small connection pool, one
    rate gate, and a pause after a 429."""

    def __init__(self, token: str, base_url: str, *, rate: float = DRAFTS_PER_S) -> None:
        self.request = HTTPXRequest(connection_pool_size=8)
        self.bot = Bot(token, base_url=base_url, request=self.request)
        self.gate = RateGate(rate, rate)
        self.paused_until = 0.0
        self._ready = False

    def allowed(self) -> bool:
        """Whether one more draft may go now (not paused by a 429, within the rate)."""
        return time.monotonic() >= self.paused_until and self.gate.take()

    async def send(self, chat_id: int, draft_id: int, text: str, timeout_s: float) -> None:
        """One sendMessageDraft, at most `timeout_s`; errors are the caller's to drop."""
        if not self._ready:
            await self.request.initialize()  # no getMe: the application's bot did that
            self._ready = True
        try:
            await asyncio.wait_for(
                self.bot.send_message_draft(
                    chat_id,
                    draft_id,
                    text,
                    read_timeout=timeout_s,
                    write_timeout=timeout_s,
                    connect_timeout=timeout_s,
                    pool_timeout=timeout_s,
                ),
                timeout_s,
            )
        except RetryAfter as err:
            with warnings.catch_warnings():  # PTB 22 warns that it becomes a timedelta
                warnings.simplefilter("ignore")
                wait = err.retry_after
            seconds = wait.total_seconds() if isinstance(wait, dt.timedelta) else float(wait)
            self.paused_until = time.monotonic() + seconds
            raise

    async def close(self) -> None:
        """Release the client's connections."""
        if self._ready:
            await self.request.shutdown()
            self._ready = False


class DraftStream:
    """One turn's drafts in one private chat."""

    def __init__(
        self,
        sender: DraftSender,
        chat_id: int,
        *,
        check: Check | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.sender = sender
        self.chat_id = chat_id
        self.check = check
        self.timeout_s = DRAFT_TIMEOUT_S if timeout_s is None else timeout_s
        # Changes to one non-zero draft id are animated as one growing draft.
        self.draft_id = random.randint(1, 2**31 - 1)
        self.sent = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        """The empty draft: "Thinking…" at once."""
        self.send("")

    def send(self, text: str) -> None:
        """Show `text` as the draft, unless one is still in flight or the rate is spent."""
        if self._closed or (self._task is not None and not self._task.done()):
            return
        if not self.sender.allowed():
            return
        self._task = asyncio.create_task(
            self._send(text[:MAX_DRAFT_CHARS]), name=f"draft:{self.chat_id}"
        )

    async def _send(self, text: str) -> None:
        try:
            if text and self.check is not None and (await self.check([text]))[0]:
                self._closed = True  # flagged: no more previews in this turn
                return
            await self.sender.send(self.chat_id, self.draft_id, text, self.timeout_s)
            self.sent += 1
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a preview: whatever went wrong, drop it
            log.debug("draft for chat %s dropped: %s: %s", self.chat_id, type(err).__name__, err)

    def close(self) -> None:
        """No more drafts; one still in flight is abandoned (the final reply is on its way)."""
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
