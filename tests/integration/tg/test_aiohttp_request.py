"""PTB's Bot on bot/tg/aiohttp_request.py against the loopback Bot API: answers parsed, Telegram's
errors raised as PTB raises them, timeouts and refused connections as TimedOut and NetworkError,
files uploaded as multipart, a request written whole in one step, the environment's proxy."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from telegram import Bot
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TimedOut
from telegram.request import RequestData
from telegram.request._requestparameter import RequestParameter

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


RESPONSE = (
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'
)


async def accept(server: socket.socket) -> socket.socket:
    """The next connection to a non-blocking listening socket (within 5 s), non-blocking."""
    async with asyncio.timeout(5):
        while True:
            try:
                conn, _ = server.accept()
            except BlockingIOError:
                await asyncio.sleep(0.001)
                continue
            conn.setblocking(False)
            return conn


async def read_request(conn: socket.socket) -> bytes:
    """One request from a non-blocking socket (these requests end with their body)."""
    data = b""
    async with asyncio.timeout(5):
        while b"chat_id=" not in data:
            try:
                data += conn.recv(65536)
            except BlockingIOError:
                await asyncio.sleep(0.001)
    return data


def form(**values: object) -> RequestData:
    return RequestData([RequestParameter.from_input(k, v) for k, v in values.items()])


async def test_a_request_goes_out_whole_before_the_loop_runs_anything_else() -> None:
    """Headers and body leave in the request's first step: no task, thread or pass of the
    event loop in between, each of which waits behind everything else ready on a busy loop
    (aiohttp's trust_env looked the proxy and ~/.netrc up in threads; its body writer waited
    for its turn in a task of its own)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    url = f"http://127.0.0.1:{server.getsockname()[1]}/bot{TOKEN}/sendMessage"
    request = AiohttpRequest(1)
    await request.initialize()
    try:
        first = asyncio.create_task(request.do_request(url, "POST", form(chat_id=5, text="a")))
        conn = await accept(server)
        await read_request(conn)
        conn.sendall(RESPONSE)
        assert await first == (200, b'{"ok":true}')
        # The connection is kept: the next request's first step writes it all.
        second = asyncio.create_task(request.do_request(url, "POST", form(chat_id=6, text="b")))
        await asyncio.sleep(0)  # one pass of the loop: `second`'s first step, then this
        assert conn.recv(65536).endswith(b"chat_id=6&text=b")
        conn.sendall(RESPONSE)
        assert await second == (200, b'{"ok":true}')
        conn.close()
    finally:
        await request.shutdown()
        server.close()


async def test_requests_go_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY (and friends) as httpx reads them, and NO_PROXY: read once per origin."""
    proxy = socket.create_server(("127.0.0.1", 0))
    proxy.setblocking(False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.getsockname()[1]}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    url = f"http://api.telegram.example/bot{TOKEN}/sendMessage"
    request = AiohttpRequest(1)
    await request.initialize()
    try:
        answer = asyncio.create_task(request.do_request(url, "POST", form(chat_id=5, text="a")))
        conn = await accept(proxy)
        # A proxy is asked for the whole URL.
        assert (await read_request(conn)).startswith(f"POST {url} HTTP/1.1".encode())
        conn.sendall(RESPONSE)
        assert await answer == (200, b'{"ok":true}')
        conn.close()
        monkeypatch.setenv("NO_PROXY", "api.other.example")
        other = AiohttpRequest(1)
        assert other._proxy(f"http://api.other.example/bot{TOKEN}/getMe") == (None, None)
        assert request._proxy(url)[0] is not None
    finally:
        await request.shutdown()
        proxy.close()
