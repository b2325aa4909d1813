"""The bot's one send budget (bot/service/budget.py): replies first, drafts only from what they
leave, and each replica's share by the live replica count. A real aiolimiter bucket; it leaks
30 units a second, which the counts below allow for (one unit per 33 ms)."""

from __future__ import annotations

import asyncio

from bot.service.budget import DRAFT_SHARE, SendBudget


async def _drafts_until_refused(budget: SendBudget) -> int:
    taken = 0
    while await budget.draft():
        taken += 1
    return taken


async def test_drafts_leave_a_third_of_the_bucket_to_replies() -> None:
    budget = SendBudget(30.0)
    taken = await _drafts_until_refused(budget)
    assert 30 * DRAFT_SHARE <= taken <= 30 * DRAFT_SHARE + 1
    assert budget.limiter.has_capacity(30 * (1 - DRAFT_SHARE) - 1)  # room left for replies


async def test_no_draft_while_a_reply_waits_or_a_429_is_waited_out() -> None:
    budget = SendBudget(30.0)
    budget.share(30)  # a reply costs the whole bucket: the second one waits for it to drain
    await budget.reply()
    waiting = asyncio.create_task(budget.reply())
    await asyncio.sleep(0)  # it asks for the whole bucket
    budget.share(1)
    await asyncio.sleep(0.5)  # half drained: room for a draft, but a reply waits
    assert not waiting.done()
    assert not await budget.draft()
    await waiting
    budget.pause(60.0)
    await asyncio.sleep(0.5)  # the bucket drains well below the drafts' share
    assert not await budget.draft()


async def test_with_three_replicas_alive_each_request_costs_three() -> None:
    budget = SendBudget(30.0)
    budget.share(3)
    taken = await _drafts_until_refused(budget)
    assert 30 * DRAFT_SHARE / 3 - 1 <= taken <= 30 * DRAFT_SHARE / 3 + 1
    budget.share(0)  # never less than this replica itself
    assert budget.cost == 1.0
