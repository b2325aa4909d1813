"""The loopback Bot API's long poll answers when an update comes, as Telegram's does, not at its
next look: bench.e2e's "polling and the inbox row" is the bot's time, not the fake's."""

from __future__ import annotations

import asyncio
import time

import pytest
from telegram import Bot

from bot.tg.aiohttp_request import AiohttpRequest
from tests.support import fakebotapi
from tests.support.fakebotapi import FakeBotAPI
from tests.support.service_harness import TOKEN


async def test_a_waiting_get_updates_answers_when_an_update_is_queued(
    api: FakeBotAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Looks this far apart would leave the poll waiting out its whole timeout.
    monkeypatch.setattr(fakebotapi, "POLL_S", 60.0)
    async with Bot(TOKEN, base_url=api.base_url, request=AiohttpRequest(2)) as bot:
        polling = asyncio.create_task(bot.get_updates(timeout=20, read_timeout=30))
        await asyncio.sleep(0.2)  # the poll waits
        assert not polling.done()
        queued_at = time.monotonic()
        update_id = api.user_message(5, "hello")
        updates = await asyncio.wait_for(polling, 10)
    assert [u.update_id for u in updates] == [update_id]
    assert time.monotonic() - queued_at < 10  # answered well before the poll's timeout


async def test_a_redelivered_update_wakes_the_waiting_poll_too(
    api: FakeBotAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fakebotapi, "POLL_S", 60.0)
    update_id = api.user_message(5, "hello")
    async with Bot(TOKEN, base_url=api.base_url, request=AiohttpRequest(2)) as bot:
        assert [u.update_id for u in await bot.get_updates()] == [update_id]
        polling = asyncio.create_task(
            bot.get_updates(offset=update_id + 1, timeout=20, read_timeout=30)
        )
        await asyncio.sleep(0.2)
        api.redeliver(update_id)
        updates = await asyncio.wait_for(polling, 10)
    assert [u.update_id for u in updates] == [update_id]


async def test_a_redelivered_update_stays_unconfirmed_until_the_poller_asks_again(
    api: FakeBotAPI,
) -> None:
    """settled() must not take a duplicate for done while the bot still handles it: no offset
    confirms it, so the poller's next getUpdates (made once it has stored the batch) does. A
    service test once read its duplicate counter before the bot had stored the duplicate."""
    update_id = api.user_message(5, "hello")
    async with Bot(TOKEN, base_url=api.base_url, request=AiohttpRequest(2)) as bot:
        await bot.get_updates()
        await bot.get_updates(offset=update_id + 1)
        assert not api.unconfirmed
        api.redeliver(update_id)
        assert api.unconfirmed
        assert [u.update_id for u in await bot.get_updates(offset=update_id + 1)] == [update_id]
        assert api.unconfirmed  # handed out, not yet stored by the bot
        assert await bot.get_updates(offset=update_id + 1) == ()
    assert not api.unconfirmed
