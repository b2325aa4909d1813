"""One send budget per bot: replies first, drafts only from what replies leave.

Telegram allows a bot about 30 requests per second in all, whichever method and whichever
process sends them. Replies and notices (the application's Bot, through PTB's AIORateLimiter)
and drafts (bot/tg/drafts.py, a client of their own) therefore draw on one leaky bucket
(aiolimiter, which PTB's limiter uses too): a reply waits for its turn, a draft never waits. A
draft goes only while no reply is waiting, no reply's 429 is being waited out, and the bucket
stays at most `DRAFT_SHARE` full after it, so a reply that comes right after still finds room.

Replicas share the bot's budget: at every heartbeat each replica counts the live ones in the
database (bot/service/heartbeat.py), and with N alive every request costs N units of the bucket, so
each replica sends at most 1/N of the bot's rate. This is an even split, not a pool: a busy
replica cannot borrow an idle one's share, and for the few seconds after a replica dies (until
its heartbeat is stale) the others keep their smaller shares.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

from aiolimiter import AsyncLimiter
from telegram.error import RetryAfter
from telegram.ext import AIORateLimiter

from bot.service.retry import retry_after_s

# Requests per second for the whole bot (Telegram: about 30 messages per second overall).
SENDS_PER_S = 30.0
# Drafts go only while the bucket stays at most this full after them.
DRAFT_SHARE = 2 / 3


class SendBudget:
    """The bot's requests per second, split between the live replicas; replies first."""

    def __init__(self, rate: float | None = None) -> None:
        self.limiter = AsyncLimiter(SENDS_PER_S if rate is None else rate, 1.0)
        self.replicas = 1
        self.paused_until = 0.0  # monotonic: a reply's 429 is waited out until then
        self._waiting = 0  # replies waiting for their turn

    def share(self, replicas: int) -> None:
        """`replicas` are alive (this one included): send 1/replicas of the bot's rate."""
        self.replicas = max(1, replicas)

    @property
    def cost(self) -> float:
        """The bucket units one request of this replica takes."""
        return float(min(self.replicas, self.limiter.max_rate))

    async def reply(self) -> None:
        """Wait for a reply's turn."""
        self._waiting += 1
        try:
            await self.limiter.acquire(self.cost)
        finally:
            self._waiting -= 1

    async def draft(self) -> bool:
        """Take a draft's turn if replies leave one now; never waits."""
        if self._waiting or time.monotonic() < self.paused_until:
            return False
        if not self.limiter.has_capacity(self.cost + self.limiter.max_rate * (1 - DRAFT_SHARE)):
            return False
        await self.limiter.acquire(self.cost)  # there is capacity: this does not wait
        return True

    def pause(self, seconds: float) -> None:
        """Telegram asked the bot to wait (a reply's 429): no draft before that is over."""
        self.paused_until = max(self.paused_until, time.monotonic() + seconds)


Callback = Callable[..., Coroutine[Any, Any, bool | dict[str, Any] | list[dict[str, Any]]]]


class BudgetedRateLimiter(AIORateLimiter):
    """PTB's AIORateLimiter (group limits, 429s waited out `max_retries` times) whose overall
    rate is the bot's `SendBudget`, which drafts share."""

    def __init__(self, budget: SendBudget, *, max_retries: int) -> None:
        super().__init__(overall_max_rate=0, max_retries=max_retries)
        self.budget = budget

    async def process_request(
        self,
        callback: Callback,
        args: Any,
        kwargs: dict[str, Any],
        endpoint: str,
        data: dict[str, Any],
        rate_limit_args: int | None,
    ) -> bool | dict[str, Any] | list[dict[str, Any]]:
        """Every try of a request to a chat takes a turn of the budget (as PTB's overall
        limiter does); a 429 pauses the drafts too."""
        if data.get("chat_id") is None:
            return await super().process_request(
                callback, args, kwargs, endpoint, data, rate_limit_args
            )

        async def budgeted(*a: Any, **kw: Any) -> bool | dict[str, Any] | list[dict[str, Any]]:
            await self.budget.reply()
            try:
                return await callback(*a, **kw)
            except RetryAfter as err:
                self.budget.pause(retry_after_s(err))
                raise

        return await super().process_request(
            budgeted, args, kwargs, endpoint, data, rate_limit_args
        )
