"""Inputs Telegram (or whoever holds the webhook secret) could send that the service cannot use.

Each one gets a 4xx, or is stored as `ignored` (or with its text repaired) and gets a 200, on the
webhook; polling stores or skips it the same way and keeps going. Never a 500, never a stall:
after every bad input a following good update is still answered.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bot.tg.api_request import MAX_JSON_DEPTH
from bot.tg.poller import ElectedPolling
from tests.support.botprocess import free_port
from tests.support.fakebotapi import SECRET_HEADER, FakeBotAPI
from tests.support.service_harness import TOKEN, EchoResponder, make_settings, rows, running_service

SECRET = "bad-input-Secret_0123456789"
HUGE = 2**64  # beyond any 64-bit column
DEEP = 200_000  # far beyond json.loads' recursion limit (about 1,000)


def message(chat: int, text: str = "hello", **fields: Any) -> dict[str, Any]:
    """A private text message from the chat's user."""
    return {
        "message_id": 7, "date": 1_700_000_000, "text": text,
        "chat": {"id": chat, "type": "private", "first_name": "U"},
        "from": {"id": chat, "is_bot": False, "first_name": "U"},
        **fields,
    }  # fmt: skip


def deep_json(levels: int) -> str:
    return "[" * levels + "]" * levels


async def post(url: str, body: bytes, *, secret: str | None = SECRET, ctype: str = "") -> int:
    headers = {"Content-Type": ctype or "application/json"}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as r:
        await r.read()
        return r.status


async def raw_post(port: int, path: str, header_value: bytes, body: bytes) -> int:
    """POST with header bytes no HTTP client library will send; the status code."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n" + SECRET_HEADER.encode() + b": " + header_value
        + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
        + body
    )  # fmt: skip
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    return int(status_line.split()[1])


async def test_webhook_answers_bad_inputs_with_4xx_or_stores_them_and_keeps_answering(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    chat = 7100
    settings = make_settings(
        sqlite_url, api, tmp_path, webhook_url=url, webhook_secret=SECRET,
        webhook_listen="127.0.0.1", webhook_port=port,
    )  # fmt: skip
    async with running_service(settings, EchoResponder()) as svc:
        await api.wait_for(lambda: api.webhook.url != "", 10, "setWebhook")
        next_id = iter(range(500, 600))
        answered = 0

        async def still_answers() -> None:
            nonlocal answered
            update = {"update_id": next(next_id), "message": message(chat, f"good {answered}")}
            assert await post(url, json.dumps(update).encode()) == 200
            answered += 1
            await api.wait_for_texts(chat, answered)

        # Without the secret: header bytes that are not text get 403, like any wrong secret.
        good = json.dumps({"update_id": 1, "message": message(chat)}).encode()
        for header in (b"\xff\xfe", b"\xc3\xa9t\xc3\xa9", SECRET.encode() + b"\xff"):
            assert await raw_post(port, "/hook", header, good) == 403
        assert await rows(svc, "SELECT update_id FROM inbox") == []
        await still_answers()

        # Malformed bodies: 400, nothing stored.
        u = next(next_id)
        body = json.dumps({"update_id": u, "message": message(chat)}).encode()
        not_updates = [
            (body, "application/json; charset=nosuch"),
            (b"[" * DEEP, ""),
            (deep_json(DEEP).encode(), ""),
            (b'{"update_id": true, "message": {}}', ""),
            (json.dumps({"update_id": HUGE, "message": message(chat)}).encode(), ""),
            (b'{"update_id": "5", "message": {}}', ""),
            (b"\xff\xfe{}", ""),
        ]
        for bad, ctype in not_updates:
            assert await post(url, bad, ctype=ctype) == 400, bad[:60]
            await still_answers()
        stored = {r[0] for r in await rows(svc, "SELECT update_id FROM inbox")}
        assert not stored & {u, 1}  # (true would have been update 1)

        # Well-formed updates the service cannot use: stored as ignored, 200, no reply.
        big_chat = next(next_id)
        unusable = {"update_id": big_chat, "message": message(HUGE)}
        assert await post(url, json.dumps(unusable).encode()) == 200
        big_date = next(next_id)  # python-telegram-bot cannot make a datetime of it
        unusable = {"update_id": big_date, "message": message(chat, date=2**62)}
        assert await post(url, json.dumps(unusable).encode()) == 200
        await still_answers()
        got = await rows(
            svc, "SELECT update_id, chat_id, status FROM inbox WHERE update_id IN (:a, :b)",
            a=big_chat, b=big_date,
        )  # fmt: skip
        assert sorted(got) == [(big_chat, None, "ignored"), (big_date, chat, "ignored")]

        # Usable ones, repaired: a lone surrogate becomes U+FFFD; deep nesting becomes null.
        lone = next(next_id)
        text = json.dumps({"update_id": lone, "message": message(chat, "hi ")})
        text = text.replace('"hi "', '"hi \\ud800"')
        assert await post(url, text.encode()) == 200
        await api.wait_for_texts(chat, answered + 1)
        deep = next(next_id)
        text = json.dumps({"update_id": deep, "message": message(chat, "deep", x="DEEP")})
        assert await post(url, text.replace('"DEEP"', deep_json(DEEP)).encode()) == 200
        await api.wait_for_texts(chat, answered + 2)
        assert api.texts(chat)[-2:] == [f"echo {chat}: hi \ufffd", f"echo {chat}: deep"]
        ((payload,),) = await rows(svc, "SELECT payload FROM inbox WHERE update_id=:u", u=deep)
        nested = json.loads(payload)["message"]["x"]
        for _ in range(MAX_JSON_DEPTH - 3):  # x's list is the third container
            (nested,) = nested
        assert nested == [None]
        answered += 2
        await still_answers()
    assert all(status != 500 for _, status in api.webhook_posts)


class RawUpdatesAPI(FakeBotAPI):
    """The fake Bot API, able to hand out message objects as raw JSON text in getUpdates
    (JSON nested deeper than Python's json module can write)."""

    def __init__(self, token: str) -> None:
        super().__init__(token)
        self.raw_messages: dict[str, str] = {}

    def add_raw_message(self, message_json: str) -> int:
        marker = f"__raw_message_{len(self.raw_messages)}__"
        self.raw_messages[json.dumps(marker)] = message_json
        return self.add_update({"message": marker})

    async def _handle(self, request: web.Request) -> web.Response:
        response = await super()._handle(request)
        if request.match_info.get("method", "").lower() != "getupdates" or not response.text:
            return response
        body = response.text
        for marker, raw in self.raw_messages.items():
            body = body.replace(marker, raw)
        return web.Response(text=body, status=response.status, content_type="application/json")


async def test_polling_stores_or_skips_bad_updates_and_keeps_answering(
    sqlite_url: str, tmp_path: Path
) -> None:
    chat = 7200
    async with RawUpdatesAPI(TOKEN) as api:
        settings = make_settings(sqlite_url, api, tmp_path)
        async with running_service(settings, EchoResponder()) as svc:
            answered = 0

            async def still_answers() -> None:
                nonlocal answered
                api.user_message(chat, f"good {answered}")
                answered += 1
                await api.wait_for_texts(chat, answered)

            await still_answers()
            # No usable update_id: skipped, never stored; polling goes on past it.
            api.add_update({"update_id": True, "message": message(chat)})
            await still_answers()
            api.add_update({"update_id": HUGE, "message": message(chat)})
            await still_answers()
            await still_answers()  # and on, while that one is still offered every time
            stored = {r[0] for r in await rows(svc, "SELECT update_id FROM inbox")}
            assert 1 not in stored  # (true would have been update 1)
            assert api.offsets[-1] is not None and api.offsets[-1] < HUGE
            # A chat id beyond 64 bits: stored as ignored, with no chat id.
            big_chat = api.add_update({"message": message(HUGE)})
            await still_answers()
            # A lone surrogate (valid JSON, not valid Unicode): answered, as U+FFFD.
            text = json.dumps(message(chat, "hi ")).replace('"hi "', '"hi \\ud800"')
            lone = api.add_raw_message(text)
            answered += 1
            await api.wait_for_texts(chat, answered)
            # A message nested 200,000 levels deep: read with the deep part as null, answered.
            text = json.dumps(message(chat, "deep", x="DEEP")).replace('"DEEP"', deep_json(DEEP))
            deep = api.add_raw_message(text)
            answered += 1
            await api.wait_for_texts(chat, answered)
            await still_answers()
            assert api.texts(chat)[-3:-1] == [f"echo {chat}: hi \ufffd", f"echo {chat}: deep"]
            got = await rows(
                svc, "SELECT update_id, chat_id, status FROM inbox WHERE update_id IN (:a, :b, :c)",
                a=big_chat, b=lone, c=deep,
            )  # fmt: skip
            assert sorted(got) == [(big_chat, None, "ignored"), (lone, chat, "done"),
                                   (deep, chat, "done")]  # fmt: skip
            assert isinstance(svc.ingest, ElectedPolling) and svc.ingest.current is not None
            polling = svc.ingest.current.done  # the getUpdates loop did not die
            assert polling is not None and not polling.done()
