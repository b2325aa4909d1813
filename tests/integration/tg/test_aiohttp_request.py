"""PTB's Bot on bot/tg/aiohttp_request.py against the loopback Bot API: answers parsed, Telegram's
errors raised as PTB raises them, timeouts and refused connections as TimedOut and NetworkError,
files uploaded as multipart."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from telegram import Bot
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TimedOut

from bot.tg.aiohttp_request import AiohttpRequest
from tests.support.botprocess import free_port
from tests.support.fakebotapi import FakeBotAPI, Fault
from tests.support.service_harness import TOKEN


@pytest.fixture
async def bot(api: FakeBotAPI) -> AsyncIterator[Bot]:
    async with Bot(TOKEN, base_url=api.base_url, request=AiohttpRequest(4)) as bot:
        yield bot


async def test_a_message_goes_out_and_its_answer_is_parsed(api: FakeBotAPI, bot: Bot) -> None:
    sent = await bot.send_message(5, "hello, ünïcode & = signs")
    assert sent.text == "hello, ünïcode & = signs" and sent.chat.id == 5
    assert api.texts(5) == ["hello, ünïcode & = signs"]
    assert (await bot.get_me()).id == bot.id


async def test_telegrams_errors_are_ptbs(api: FakeBotAPI, bot: Bot) -> None:
    api.inject(Fault("sendMessage", status=429, retry_after=3))
    with pytest.raises(RetryAfter) as waited:
        await bot.send_message(5, "too fast")
    assert waited.value.retry_after in (3, 3.0) or waited.value.retry_after.total_seconds() == 3  # type: ignore[union-attr]
    api.inject(Fault("sendMessage", status=403, description="Forbidden: bot was blocked"))
    with pytest.raises(Forbidden):
        await bot.send_message(5, "blocked")
    api.inject(Fault("sendMessage", status=400, description="Bad Request: chat not found"))
    with pytest.raises(BadRequest):
        await bot.send_message(5, "nowhere")
    api.inject(Fault("sendMessage", status=502))
    with pytest.raises(NetworkError):
        await bot.send_message(5, "bad gateway")
    assert api.texts(5) == []


async def test_a_slow_answer_times_out_and_a_closed_port_is_a_network_error(
    api: FakeBotAPI, bot: Bot
) -> None:
    api.inject(Fault("sendMessage", status=None, delay=2.0))
    started = time.monotonic()
    with pytest.raises(TimedOut):
        await bot.send_message(5, "slow", read_timeout=0.3)
    assert time.monotonic() - started < 1.5
    nobody = f"http://127.0.0.1:{free_port()}/bot"
    request = AiohttpRequest(1)
    lonely = Bot(TOKEN, base_url=nobody, request=request)
    await request.initialize()
    try:
        with pytest.raises(NetworkError):
            await lonely.send_message(5, "nobody listens")
    finally:
        await request.shutdown()


async def test_a_file_goes_as_multipart() -> None:
    received: dict[str, object] = {}

    async def send_document(request: web.Request) -> web.Response:
        form = await request.post()
        upload = form["document"]
        assert isinstance(upload, web.FileField)
        received.update(chat=form["chat_id"], name=upload.filename, body=upload.file.read())
        message = {
            "message_id": 1,
            "date": 0,
            "chat": {"id": 5, "type": "private"},
            "document": {"file_id": "f", "file_unique_id": "u", "file_name": upload.filename},
        }
        return web.json_response({"ok": True, "result": message})

    app = web.Application()
    app.router.add_post("/bot{token}/sendDocument", send_document)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    request = AiohttpRequest(1)
    bot = Bot(TOKEN, base_url=f"http://127.0.0.1:{port}/bot", request=request)
    await request.initialize()
    try:
        sent = await bot.send_document(5, b"line one\nline two\n", filename="export.txt")
    finally:
        await request.shutdown()
        await runner.cleanup()
    assert received == {"chat": "5", "name": "export.txt", "body": b"line one\nline two\n"}
    assert sent.document is not None and sent.document.file_name == "export.txt"
