"""A Telegram Bot API server on loopback, for tests (aiohttp).

It speaks the real HTTP API at `http://127.0.0.1:PORT/bot<token>/<method>`: GET query strings,
form bodies (what python-telegram-bot sends: strings raw, everything else JSON-encoded), multipart
and JSON bodies; every answer is `{"ok": true, "result": ...}` or
`{"ok": false, "error_code": ..., "description": ..., "parameters": ...}` like Telegram's.

Updates are queued by the test (`user_message`, `add_update`, `redeliver`) and handed out by
`getUpdates` (offset confirms, timeout long-polls, a newer call ends an older one with 409) or,
once `setWebhook` is called, POSTed to the webhook URL with the secret header, retried on any
non-2xx answer the way Telegram does. `inject` queues faults: a 429 with retry_after, 5xx, 403,
409, delays longer than the client's timeout.

Run it alone (`python -m tests.support.fakebotapi --port 8081 --token ...`) to point a real
bot at it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
BOT_ID = 7000001
BOT_USERNAME = "loopback_test_bot"
MAX_TEXT_UTF16 = 4096
# A waiting long poll or the webhook pusher wakes when an update is queued, as Telegram's
# answers at once; and looks again this often (for a close, a conflicting poll, an update
# queued from another thread).
POLL_S = 0.01


def utf16_len(text: str) -> int:
    """Length as Telegram counts it: UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


class ApiError(Exception):
    """An error answer: HTTP status, description and optional response parameters."""

    def __init__(
        self, status: int, description: str, parameters: dict[str, Any] | None = None
    ) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters


@dataclass
class Fault:
    """One injected fault, matched by method (case-insensitive) and optionally chat id.

    `status` None only delays, then the call proceeds normally; a status answers that error
    (after the delay, if any). `hold` keeps the call waiting until the test sets it (a request
    on its way, for as long as the test needs). `times` counts how many calls it hits, after
    `skip` matching calls went through unharmed.
    """

    method: str
    status: int | None = 500
    description: str | None = None
    retry_after: int | None = None
    delay: float = 0.0
    times: int = 1
    chat_id: int | None = None
    skip: int = 0  # let this many matching calls through first
    hold: asyncio.Event | None = None

    def matches(self, method: str, chat_id: int | None) -> bool:
        """Whether this fault applies to a call."""
        return (
            self.times > 0
            and self.method.lower() == method.lower()
            and (self.chat_id is None or self.chat_id == chat_id)
        )

    def error(self) -> ApiError | None:
        """The error to answer, if any."""
        if self.status is None:
            return None
        defaults = {
            400: "Bad Request",
            403: "Forbidden: bot was blocked by the user",
            409: "Conflict: terminated by other getUpdates request; make sure that only one bot "
            "instance is running",
            429: f"Too Many Requests: retry after {self.retry_after or 1}",
            500: "Internal Server Error",
            502: "Bad Gateway",
        }
        params = {"retry_after": self.retry_after} if self.retry_after is not None else None
        if self.status == 429 and params is None:
            params = {"retry_after": 1}
        return ApiError(self.status, self.description or defaults.get(self.status, "Error"), params)


@dataclass
class Sent:
    """A message the bot sent."""

    message_id: int
    chat_id: int
    text: str
    at: float
    reply_to: int | None = None
    parse_mode: str | None = None
    # The inline keyboard (Bot API JSON), as sent and as edited since.
    reply_markup: dict[str, Any] | None = None


@dataclass
class Draft:
    """A sendMessageDraft the bot made (a preview in a private chat, not a message)."""

    chat_id: int
    draft_id: int
    text: str
    at: float


@dataclass
class Call:
    """One API call as the server saw it."""

    method: str
    params: dict[str, Any]
    at: float
    status: int | None = None  # None until answered


@dataclass
class WebhookState:
    """What setWebhook configured."""

    url: str = ""
    secret: str | None = None
    allowed_updates: list[str] | None = None
    max_connections: int = 40


@dataclass
class Params:
    """Request parameters with the typed access Telegram's server applies."""

    raw: dict[str, Any] = field(default_factory=dict)

    def str(self, name: str, default: str | None = None) -> str | None:
        """A string parameter."""
        value = self.raw.get(name, default)
        return None if value is None else str(value)

    def int(self, name: str, default: int | None = None) -> int | None:
        """An integer parameter (form values arrive as text)."""
        value = self.raw.get(name)
        if value is None or value == "":
            return default
        try:
            return int(value)
        except (TypeError, ValueError) as err:
            raise ApiError(400, f"Bad Request: invalid {name}") from err

    def json(self, name: str) -> Any:
        """A structured parameter: JSON text in forms, a value in JSON bodies."""
        value = self.raw.get(name)
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError as err:
                raise ApiError(400, f"Bad Request: can't parse {name} JSON object") from err
        return value


class FakeBotAPI:
    """The loopback server and the state a test inspects."""

    def __init__(
        self,
        token: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        webhook_retry_s: float = 0.2,
        updates_tick_s: float | None = None,
    ) -> None:
        self.token = token
        self.host = host
        self.port = port
        self.webhook_retry_s = webhook_retry_s
        # A waiting getUpdates answers at once when an update is queued (None), as Telegram's
        # does; or only at its next look, this often: updates that come meanwhile go out
        # together, like those a bot's round trip to Telegram lets pile up (bench.e2e
        # --updates-tick-ms; this server's way until 2026-12-04, every 10 ms).
        self.updates_tick_s = updates_tick_s
        self.updates: list[dict[str, Any]] = []  # not yet confirmed, in update_id order
        self.history: list[dict[str, Any]] = []  # every update ever queued
        self.duplicates: list[dict[str, Any]] = []  # handed out once more, whatever the offset
        # duplicates a getUpdates answer handed out: no offset confirms them (theirs is passed
        # already), so they count as unconfirmed until the poller asks again, which it does
        # only once it has stored its batch
        self.duplicates_in_flight: list[dict[str, Any]] = []
        self.sent: list[Sent] = []
        self.calls: list[Call] = []
        self.faults: list[Fault] = []
        self.commands: list[dict[str, str]] = []  # the menu set without a language_code
        # setMyCommands, setMyDescription, setMyShortDescription by language_code (None: the
        # default that clients of every other language see)
        self.commands_by_language: dict[str | None, list[dict[str, str]]] = {}
        self.descriptions: dict[str | None, str] = {}
        self.short_descriptions: dict[str | None, str] = {}
        self.webhook = WebhookState()
        self.webhook_posts: list[tuple[int, int]] = []  # (update_id, HTTP status or 0)
        self.offsets: list[int | None] = []  # offset of every getUpdates call, in order
        self.on_get_updates: Callable[[int | None], None] | None = None
        # False: getUpdates hands out every kind, whatever allowed_updates asks for.
        self.honours_allowed_updates = True
        self._next_update_id = itertools.count(100001)
        self._next_message_id = itertools.count(1)
        self._next_query_id = itertools.count(1)
        self.callback_queries: set[str] = set()
        self.callback_answers: dict[str, str] = {}  # query id -> the answer's text
        self.edits: list[tuple[int, int, str, str]] = []  # chat, message, old text, new text
        self.drafts: list[Draft] = []  # every sendMessageDraft that succeeded
        self._poll_generation = 0
        # Set (and replaced) when an update is queued: wakes the waiting long poll and pusher.
        self._queued = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._pusher: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closing = False

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The value for TELEGRAM_BASE_URL."""
        return f"http://{self.host}:{self.port}/bot"

    async def start(self) -> FakeBotAPI:
        """Listen on loopback (a free port unless one was given)."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_route("*", "/bot{token}/", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        """Stop pushing and serving (pending long polls return at once)."""
        self._closing = True
        await self._stop_pusher()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeBotAPI:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- what tests do ---------------------------------------------------------------------

    def inject(self, *faults: Fault) -> None:
        """Queue faults; each hits the next `times` matching calls."""
        self.faults.extend(faults)

    def add_update(self, update: dict[str, Any]) -> int:
        """Queue a raw update (its update_id is assigned when missing); returns the update_id."""
        if "update_id" not in update:
            update = {"update_id": next(self._next_update_id), **update}
        self.history.append(update)
        self.updates.append(update)
        self.updates.sort(key=lambda u: u["update_id"])
        self._wake_pollers()
        return int(update["update_id"])

    def _wake_pollers(self) -> None:
        """An update was queued: a waiting getUpdates answers now, not at its next look."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # queued from outside the loop (before the start): found by the next look
        queued, self._queued = self._queued, asyncio.Event()
        queued.set()

    async def _until_queued(self) -> None:
        """Until an update is queued, or POLL_S at most (with `updates_tick_s`: that long)."""
        if self.updates_tick_s is not None:
            await asyncio.sleep(self.updates_tick_s)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queued.wait(), POLL_S)

    @property
    def unconfirmed(self) -> bool:
        """Whether an update is still to be confirmed: queued and not yet passed by an offset,
        to be redelivered, or redelivered to a poller that has not asked again since."""
        return bool(self.updates or self.duplicates or self.duplicates_in_flight)

    def redeliver(self, update_id: int) -> None:
        """Hand an update out once more, even if an offset confirmed it already.

        Telegram's delivery is at-least-once; this is the duplicate a bot must survive.
        """
        for update in self.history:
            if update["update_id"] == update_id:
                self.duplicates.append(json.loads(json.dumps(update)))
                self._wake_pollers()
                return
        raise KeyError(update_id)

    def user_message(
        self,
        chat_id: int,
        text: str | None = None,
        *,
        user_id: int | None = None,
        chat_type: str = "private",
        extra: dict[str, Any] | None = None,
        reply_to_bot: bool = False,
        kind: str = "message",
        message_id: int | None = None,
        language_code: str | None = None,
    ) -> int:
        """Queue a message from a user; returns its update_id.

        `text` starting with "/" gets a bot_command entity; `extra` adds fields such as
        `sticker` or `photo`; `kind="edited_message"` makes an edit; `language_code` is the
        sender's Telegram client language (absent when None, as Telegram may send it).
        """
        user_id = user_id if user_id is not None else abs(chat_id)
        message: dict[str, Any] = {
            # an edit names the message it changes; a new message gets a new id
            "message_id": message_id if message_id is not None else next(self._next_message_id),
            "date": int(time.time()),
            "chat": self._chat(chat_id, chat_type, user_id),
            "from": self._user(user_id, language_code),
        }
        if text is not None:
            message["text"] = text
            entities = self._entities(text)
            if entities:
                message["entities"] = entities
        if reply_to_bot:
            message["reply_to_message"] = {
                "message_id": next(self._next_message_id),
                "date": int(time.time()),
                "chat": message["chat"],
                "from": self.me(),
                "text": "earlier reply",
            }
        if kind == "edited_message":
            message["edit_date"] = int(time.time())
        message.update(extra or {})
        return self.add_update({kind: message})

    def press(
        self,
        chat_id: int,
        message_id: int,
        data: str,
        *,
        user_id: int | None = None,
        language_code: str | None = None,
    ) -> tuple[int, str]:
        """Queue a press of an inline button under the bot's message `message_id` (any data,
        forged or not); returns (update_id, callback query id)."""
        user_id = user_id if user_id is not None else abs(chat_id)
        sent = next(
            (s for s in self.sent if s.chat_id == chat_id and s.message_id == message_id), None
        )
        message: dict[str, Any] = {
            "message_id": message_id,
            "date": int(sent.at if sent else time.time()),
            "chat": self._chat(chat_id, "private" if chat_id > 0 else "group", user_id),
            "from": self.me(),
            "text": sent.text if sent else "a message",
        }
        query_id = f"q{next(self._next_query_id)}"
        self.callback_queries.add(query_id)
        update_id = self.add_update(
            {
                "callback_query": {
                    "id": query_id,
                    "from": self._user(user_id, language_code),
                    "chat_instance": f"ci{chat_id}",
                    "message": message,
                    "data": data,
                }
            }
        )
        return update_id, query_id

    def react(
        self, chat_id: int, message_id: int, emoji: list[str], *, user_id: int | None = None
    ) -> int:
        """Queue a message_reaction update: `user_id` now reacts with `emoji` (empty: none)."""
        user_id = user_id if user_id is not None else abs(chat_id)
        return self.add_update(
            {
                "message_reaction": {
                    "chat": self._chat(chat_id, "private" if chat_id > 0 else "group", user_id),
                    "message_id": message_id,
                    "user": {"id": user_id, "is_bot": False, "first_name": f"User{user_id}"},
                    "date": int(time.time()),
                    "old_reaction": [],
                    "new_reaction": [{"type": "emoji", "emoji": e} for e in emoji],
                }
            }
        )

    def last_sent(self, chat_id: int) -> Sent:
        """The newest message the bot sent to a chat."""
        return [s for s in self.sent if s.chat_id == chat_id][-1]

    def channel_post(self, chat_id: int, text: str) -> int:
        """Queue a channel post; returns its update_id."""
        post = {
            "message_id": next(self._next_message_id),
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": "channel", "title": "A channel"},
            "text": text,
        }
        return self.add_update({"channel_post": post})

    def texts(self, chat_id: int) -> list[str]:
        """Texts sent to a chat, in order."""
        return [s.text for s in self.sent if s.chat_id == chat_id]

    def calls_to(self, method: str) -> list[Call]:
        """Calls of one method, in order."""
        return [c for c in self.calls if c.method.lower() == method.lower()]

    async def wait_for(
        self, predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition"
    ) -> None:
        """Wait until `predicate()` holds; fail with `what` after `timeout_s` seconds."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
            await asyncio.sleep(0.02)

    async def wait_for_texts(self, chat_id: int, count: int, timeout_s: float = 10.0) -> list[str]:
        """Wait until a chat received at least `count` messages; returns them."""
        await self.wait_for(
            lambda: len(self.texts(chat_id)) >= count,
            timeout_s,
            f"{count} messages to chat {chat_id} (got {self.texts(chat_id)!r})",
        )
        return self.texts(chat_id)

    # --- the Bot API -----------------------------------------------------------------------

    def me(self) -> dict[str, Any]:
        """The bot's own User object."""
        return {
            "id": BOT_ID,
            "is_bot": True,
            "first_name": "Loopback",
            "username": BOT_USERNAME,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info.get("method", "")
        if request.match_info["token"] != self.token:
            return self._error(ApiError(401, "Unauthorized"))
        try:
            params = await self._params(request)
        except ApiError as err:
            return self._error(err)
        call = Call(method, params.raw, time.time())
        self.calls.append(call)
        try:
            chat_id = params.int("chat_id")
        except ApiError:
            chat_id = None
        try:
            for fault in self.faults:
                if fault.matches(method, chat_id):
                    if fault.skip > 0:
                        fault.skip -= 1
                        continue
                    fault.times -= 1
                    if fault.delay:
                        await asyncio.sleep(fault.delay)
                    if fault.hold is not None:
                        await fault.hold.wait()
                    error = fault.error()
                    if error is not None:
                        raise error
                    break
            handler = getattr(self, f"_m_{method.lower()}", None)
            if handler is None:
                raise ApiError(404, "Not Found")
            result = await handler(params)
        except ApiError as err:
            call.status = err.status
            return self._error(err)
        call.status = 200
        return web.json_response({"ok": True, "result": result})

    @staticmethod
    def _error(err: ApiError) -> web.Response:
        body: dict[str, Any] = {
            "ok": False,
            "error_code": err.status,
            "description": err.description,
        }
        if err.parameters:
            body["parameters"] = err.parameters
        return web.json_response(body, status=err.status)

    @staticmethod
    async def _params(request: web.Request) -> Params:
        raw: dict[str, Any] = dict(request.query)
        if request.method == "POST" and request.can_read_body:
            ctype = request.content_type
            if ctype == "application/json":
                try:
                    body = await request.json()
                except ValueError as err:
                    raise ApiError(400, "Bad Request: invalid JSON") from err
                if not isinstance(body, dict):
                    raise ApiError(400, "Bad Request: parameters must be an object")
                raw.update(body)
            elif ctype in ("application/x-www-form-urlencoded", "multipart/form-data"):
                form = await request.post()
                for key, value in form.items():
                    raw[key] = value if isinstance(value, str) else value.file.read()
        return Params(raw)

    async def _m_getme(self, p: Params) -> Any:
        return self.me()

    async def _m_logout(self, p: Params) -> Any:
        return True

    async def _m_close(self, p: Params) -> Any:
        return True

    async def _m_getupdates(self, p: Params) -> Any:
        if self.webhook.url:
            raise ApiError(409, "Conflict: can't use getUpdates method while webhook is active")
        offset = p.int("offset")
        limit = p.int("limit", 100) or 100
        timeout = p.int("timeout", 0) or 0
        allowed = p.json("allowed_updates")
        self.offsets.append(offset)
        self.duplicates_in_flight = []
        if self.on_get_updates is not None:
            self.on_get_updates(offset)
        if offset is not None:
            # Confirm everything below the offset, as Telegram does.
            self.updates = [u for u in self.updates if u["update_id"] >= offset]
        self._poll_generation += 1
        generation = self._poll_generation
        deadline = time.monotonic() + timeout

        def ready() -> list[dict[str, Any]]:
            out = [u for u in self.updates if offset is None or u["update_id"] >= offset]
            duplicates, self.duplicates = self.duplicates, []
            if duplicates:
                out = sorted([*out, *duplicates], key=lambda u: u["update_id"])
            if allowed and self.honours_allowed_updates:
                out = [u for u in out if any(k in allowed for k in u if k != "update_id")]
            out = out[:limit]
            if duplicates:
                self.duplicates_in_flight = [d for d in duplicates if any(d is u for u in out)]
            return out

        while True:
            batch = ready()
            if batch:
                return batch
            if generation != self._poll_generation:
                raise ApiError(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only one "
                    "bot instance is running",
                )
            if time.monotonic() >= deadline or self._closing:
                return []
            await self._until_queued()

    async def _m_sendmessage(self, p: Params) -> Any:
        chat_id = p.int("chat_id")
        text = p.str("text")
        if chat_id is None:
            raise ApiError(400, "Bad Request: chat_id is empty")
        if not text or not text.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > MAX_TEXT_UTF16:
            raise ApiError(400, "Bad Request: message is too long")
        reply_to = p.int("reply_to_message_id")
        reply_parameters = p.json("reply_parameters")
        if isinstance(reply_parameters, dict):
            reply_to = reply_parameters.get("message_id")
        sent = Sent(
            next(self._next_message_id),
            chat_id,
            text,
            time.time(),
            reply_to=reply_to,
            parse_mode=p.str("parse_mode"),
            reply_markup=self._inline_keyboard(p.json("reply_markup")),
        )
        self.sent.append(sent)
        return {
            "message_id": sent.message_id,
            "date": int(sent.at),
            "chat": self._chat(chat_id, "private" if chat_id > 0 else "group", chat_id),
            "from": self.me(),
            "text": text,
        }

    async def _m_answercallbackquery(self, p: Params) -> Any:
        query_id = p.str("callback_query_id")
        if query_id not in self.callback_queries:
            raise ApiError(400, "Bad Request: query is too old and response timeout expired")
        if query_id in self.callback_answers:
            raise ApiError(400, "Bad Request: query is already answered")
        self.callback_answers[query_id] = p.str("text") or ""
        return True

    async def _m_editmessagetext(self, p: Params) -> Any:
        chat_id, message_id, text = p.int("chat_id"), p.int("message_id"), p.str("text")
        sent = next(
            (s for s in self.sent if s.chat_id == chat_id and s.message_id == message_id), None
        )
        if sent is None:
            raise ApiError(400, "Bad Request: message to edit not found")
        if not text or not text.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        markup = self._inline_keyboard(p.json("reply_markup"))
        if text == sent.text and markup == sent.reply_markup:
            raise ApiError(400, "Bad Request: message is not modified")
        self.edits.append((chat_id, message_id, sent.text, text))
        sent.text, sent.reply_markup = text, markup
        return {
            "message_id": sent.message_id,
            "date": int(sent.at),
            "chat": self._chat(sent.chat_id, "private" if sent.chat_id > 0 else "group", 1),
            "from": self.me(),
            "text": text,
            "edit_date": int(time.time()),
        }

    async def _m_editmessagereplymarkup(self, p: Params) -> Any:
        chat_id, message_id = p.int("chat_id"), p.int("message_id")
        sent = next(
            (s for s in self.sent if s.chat_id == chat_id and s.message_id == message_id), None
        )
        if sent is None:
            raise ApiError(400, "Bad Request: message to edit not found")
        markup = self._inline_keyboard(p.json("reply_markup"))
        if markup == sent.reply_markup:
            raise ApiError(400, "Bad Request: message is not modified")
        sent.reply_markup = markup
        return {
            "message_id": sent.message_id,
            "date": int(sent.at),
            "chat": self._chat(sent.chat_id, "private" if sent.chat_id > 0 else "group", 1),
            "text": sent.text,
        }

    def fail_drafts(self, status: int | None = 400, delay: float = 0.0) -> None:
        """From now on every sendMessageDraft fails: `status` (400 as an older client's
        server, 429 with retry_after 30), or with None and a `delay` hangs that long first."""
        retry_after = 30 if status == 429 else None
        self.inject(
            Fault("sendMessageDraft", status, retry_after=retry_after, delay=delay, times=10**9)
        )

    def drafts_to(self, chat_id: int) -> list[str]:
        """The texts of the drafts shown in a chat, in order."""
        return [d.text for d in self.drafts if d.chat_id == chat_id]

    async def _m_sendmessagedraft(self, p: Params) -> Any:
        chat_id, draft_id = p.int("chat_id"), p.int("draft_id")
        text = p.str("text") or ""  # empty: the client shows "Thinking…"
        if chat_id is None or not draft_id:
            raise ApiError(400, "Bad Request: chat_id or draft_id is empty")
        if chat_id < 0:
            raise ApiError(400, "Bad Request: drafts can be sent to private chats only")
        if utf16_len(text) > MAX_TEXT_UTF16:
            raise ApiError(400, "Bad Request: text is too long")
        self.drafts.append(Draft(chat_id, draft_id, text, time.time()))
        return True

    async def _m_sendchataction(self, p: Params) -> Any:
        if p.int("chat_id") is None or not p.str("action"):
            raise ApiError(400, "Bad Request: chat_id or action is empty")
        return True

    async def _m_setmycommands(self, p: Params) -> Any:
        commands = p.json("commands")
        if not isinstance(commands, list):
            raise ApiError(400, "Bad Request: commands must be an array")
        language = self._language_code(p)
        self.commands_by_language[language] = commands
        if language is None:
            self.commands = commands
        return True

    async def _m_setmydescription(self, p: Params) -> Any:
        return self._set_description(p, "description", 512, self.descriptions)

    async def _m_setmyshortdescription(self, p: Params) -> Any:
        return self._set_description(p, "short_description", 120, self.short_descriptions)

    def _set_description(
        self, p: Params, key: str, limit: int, by_language: dict[str | None, str]
    ) -> bool:
        """Store the `key` text (at most `limit` characters) for the call's language."""
        text = p.str(key, "") or ""
        if len(text) > limit:
            raise ApiError(400, f"Bad Request: {key.replace('_', ' ')} is too long")
        by_language[self._language_code(p)] = text
        return True

    @staticmethod
    def _language_code(p: Params) -> str | None:
        """A two-letter ISO 639-1 code or empty (the Bot API's rule for language_code)."""
        code = p.str("language_code") or None
        if code is not None and not (len(code) == 2 and code.isalpha() and code.islower()):
            raise ApiError(400, "Bad Request: invalid language code specified")
        return code

    async def _m_getmycommands(self, p: Params) -> Any:
        return self.commands_by_language.get(self._language_code(p), self.commands)

    async def _m_deletewebhook(self, p: Params) -> Any:
        await self._stop_pusher()
        self.webhook = WebhookState()
        if p.str("drop_pending_updates") in ("true", "True", "1"):
            self.updates.clear()
        return True

    async def _m_setwebhook(self, p: Params) -> Any:
        url = p.str("url") or ""
        secret = p.str("secret_token")
        if secret is not None and not (
            1 <= len(secret) <= 256
            and all(c.isascii() and (c.isalnum() or c in "_-") for c in secret)
        ):
            raise ApiError(400, "Bad Request: secret token contains unallowed characters")
        allowed = p.json("allowed_updates")
        await self._stop_pusher()
        self.webhook = WebhookState(url, secret, allowed, p.int("max_connections", 40) or 40)
        if url:
            self._pusher = asyncio.get_running_loop().create_task(self._push_loop())
        return True

    async def _m_getwebhookinfo(self, p: Params) -> Any:
        return {
            "url": self.webhook.url,
            "has_custom_certificate": False,
            "pending_update_count": len(self.updates),
            "max_connections": self.webhook.max_connections,
            "allowed_updates": self.webhook.allowed_updates or [],
        }

    # --- webhook pushing -------------------------------------------------------------------

    async def _stop_pusher(self) -> None:
        if self._pusher is not None:
            self._pusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pusher
            self._pusher = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _push_loop(self) -> None:
        """POST each update in order until the bot answers 2xx; retry otherwise."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        while True:
            allowed = self.webhook.allowed_updates
            if self.duplicates:
                self.updates = sorted(
                    [*self.duplicates, *self.updates], key=lambda u: u["update_id"]
                )
                self.duplicates = []
            batch = [
                u
                for u in self.updates
                if not allowed or any(k in allowed for k in u if k != "update_id")
            ]
            if not batch:
                await self._until_queued()
                continue
            update = batch[0]
            headers = {SECRET_HEADER: self.webhook.secret} if self.webhook.secret else {}
            status = 0
            try:
                async with self._session.post(
                    self.webhook.url, json=update, headers=headers
                ) as resp:
                    status = resp.status
                    await resp.read()
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            self.webhook_posts.append((update["update_id"], status))
            if 200 <= status < 300:
                self.updates = [u for u in self.updates if u is not update]
            else:
                await asyncio.sleep(self.webhook_retry_s)

    async def post_to_webhook(
        self, update: dict[str, Any], secret: str | None, url: str | None = None
    ) -> int:
        """POST one update to the webhook now, with the given secret (None: no header)."""
        headers = {SECRET_HEADER: secret} if secret is not None else {}
        async with (
            aiohttp.ClientSession() as session,
            session.post(url or self.webhook.url, json=update, headers=headers) as resp,
        ):
            await resp.read()
            return resp.status

    # --- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _inline_keyboard(markup: Any) -> dict[str, Any] | None:
        """An inline keyboard checked as Telegram does (1-64 bytes of callback_data)."""
        if markup is None:
            return None
        rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
        if not isinstance(rows, list):
            raise ApiError(400, "Bad Request: can't parse inline keyboard button")
        for row in rows:
            for button in row:
                data = button.get("callback_data")
                if data is not None and not 1 <= len(data.encode()) <= 64:
                    raise ApiError(400, "Bad Request: BUTTON_DATA_INVALID")
        return dict(markup)

    @staticmethod
    def _user(user_id: int, language_code: str | None) -> dict[str, Any]:
        user: dict[str, Any] = {"id": user_id, "is_bot": False, "first_name": f"User{user_id}"}
        if language_code is not None:
            user["language_code"] = language_code
        return user

    @staticmethod
    def _chat(chat_id: int, chat_type: str, user_id: int) -> dict[str, Any]:
        if chat_type == "private":
            return {"id": chat_id, "type": "private", "first_name": f"User{user_id}"}
        return {"id": chat_id, "type": chat_type, "title": f"Group {chat_id}"}

    @staticmethod
    def _entities(text: str) -> list[dict[str, Any]]:
        entities: list[dict[str, Any]] = []
        # As Telegram marks a command: "/" and up to 32 of [A-Za-z0-9_], an optional @bot;
        # "/help." is the command /help followed by a dot.
        command = re.match(r"/[A-Za-z0-9_]{1,32}(@[A-Za-z0-9_]{1,64})?", text)
        if command:
            entities.append(
                {"type": "bot_command", "offset": 0, "length": utf16_len(command.group())}
            )
        start = 0
        while (at := text.find("@", start)) != -1:
            end = at + 1
            while end < len(text) and (text[end].isalnum() or text[end] == "_"):
                end += 1
            if end - at > 1 and not (entities and at < entities[0]["length"]):
                offset = utf16_len(text[:at])
                entities.append(
                    {"type": "mention", "offset": offset, "length": utf16_len(text[at:end])}
                )
            start = end
        return entities


async def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--token", required=True)
    args = parser.parse_args()
    api = await FakeBotAPI(args.token, port=args.port).start()
    print(f"TELEGRAM_BASE_URL={api.base_url}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main())
