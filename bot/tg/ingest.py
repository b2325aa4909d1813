"""Ingest: Telegram updates into the inbox, acknowledged only once the row is committed.

Polling: an update is confirmed by the next getUpdates whose offset is above its update_id, so
the offset only moves past a batch of updates after the transaction that stores the whole batch
(`store_entries`) committed. Webhook: the HTTP 200
is the acknowledgement, so it is answered after the commit; anything else makes Telegram
retry. The inbox's unique update_id makes every redelivery a no-op.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from aiohttp import web
from telegram import Bot, Update
from telegram.constants import ChatType
from telegram.error import (
    BadRequest,
    Conflict,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.warnings import PTBUserWarning

from bot.conversations.store import ConversationStore
from bot.db import inbox
from bot.db.models import InboxStatus
from bot.service.access import Access, Sender
from bot.service.metrics import Metrics
from bot.service.retry import (
    Backoff,
    Interrupted,
    retry,
    retry_after_s,
    wait_event,
)
from bot.tasks import wait_ended
from bot.tg.api_request import loads_json

log = logging.getLogger(__name__)

# What we ask Telegram for. Channel posts and the rest never reach a chat conversation.
# callback_query: the feedback buttons; message_reaction: 👍/👎 reactions, which Telegram sends
# only from chats where the bot is an administrator (never from private chats).
ALLOWED_UPDATES = ["message", "edited_message", "callback_query", "message_reaction"]
# Kinds the handlers look at; any other kind is stored already closed ("ignored").
HANDLED_KINDS = frozenset(ALLOWED_UPDATES)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# Long-poll duration of getUpdates (seconds).
POLL_TIMEOUT_S = 25
# The inbox's integer columns (update_id, chat_id, ...) are signed 64-bit; so are Telegram's ids.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_update_id(value: object) -> TypeGuard[int]:
    """An update_id the inbox can key on: an integer (a bool is not one) that fits 64 bits."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return INT64_MIN <= value <= INT64_MAX


def update_kind(data: Mapping[str, Any]) -> str:
    """The update's kind: the one field besides update_id (message, edited_message, ...)."""
    return next((key for key in data if key != "update_id"), "unknown")


def _db_int(value: object) -> int | None:
    """An id for an inbox column: None unless it is an integer that fits 64 bits."""
    return value if valid_update_id(value) else None


def _unusable(data: object) -> str | None:
    """Why the service cannot use an update it could store: an integer beyond 64 bits
    (no Telegram id is; the handlers' tables could not hold it), or None."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, int) and not isinstance(item, bool) and _db_int(item) is None:
            return "an integer beyond 64 bits"
    return None


def _clean(text: str) -> str:
    """Text the database can store: a lone surrogate (valid JSON, not valid Unicode) is
    replaced by U+FFFD, as any UTF-8 decoder would."""
    return _SURROGATE.sub("\ufffd", text)


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """One update as the inbox will store it: its row's values, or the sender it refuses."""

    update_id: int
    kind: str
    values: Mapping[str, Any]
    # Set when access refuses the sender: the row is stored closed and without content.
    refused: Sender | None = None
    language: str | None = None

    @property
    def handled(self) -> bool:
        """Whether the inbox worker will handle it (stored pending, with a chat)."""
        return (
            self.refused is None
            and self.values["status"] == InboxStatus.PENDING
            and self.values["chat_id"] is not None
        )

    @property
    def chat_id(self) -> int:
        return int(self.values["chat_id"])


async def inbox_entry(update: Update, payload: str, access: Access | None = None) -> InboxEntry:
    """What the inbox keeps of an update. With `access`, an update from a sender who is not
    allowed is stored closed and without its content, and never handled
    (bot/service/access.py)."""
    payload = _clean(payload)
    data = json.loads(payload)
    kind = _clean(update_kind(data))[:32]
    chat = update.effective_chat
    user = update.effective_user
    unusable = _unusable(data)
    if unusable:
        log.warning("update %s holds %s; stored as ignored", update.update_id, unusable)
    handled = kind in HANDLED_KINDS and chat is not None and not unusable
    refused = None
    if handled and access is not None and chat is not None:
        sender = Sender(
            user_id=user.id if user else None,
            username=user.username if user else None,
            chat_id=chat.id,
            chat_username=chat.username,
            private=chat.type == ChatType.PRIVATE,
        )
        if not await access.allows(sender):
            refused = sender
    values = {
        "update_id": update.update_id,
        "chat_id": _db_int(chat.id) if chat else None,
        "user_id": _db_int(user.id) if user else None,
        "kind": kind,
        "payload": payload,
        "status": InboxStatus.PENDING if handled else InboxStatus.IGNORED,
    }
    language = user.language_code if user else None
    return InboxEntry(update.update_id, kind, values, refused, language)


def unreadable_entry(data: Mapping[str, Any]) -> InboxEntry:
    """An update python-telegram-bot cannot parse, kept closed ("ignored"), for the record."""
    chat = next(
        (v.get("chat") for k, v in data.items() if k != "update_id" and isinstance(v, dict)),
        None,
    )
    kind = _clean(update_kind(data))[:32]
    values = {
        "update_id": int(data["update_id"]),
        "chat_id": _db_int(chat.get("id")) if isinstance(chat, dict) else None,
        "user_id": None,
        "kind": kind,
        "payload": _clean(json.dumps(data, ensure_ascii=False)),
        "status": InboxStatus.IGNORED,
    }
    return InboxEntry(int(data["update_id"]), kind, values)


async def store_entries(
    store: ConversationStore,
    entries: Sequence[InboxEntry],
    metrics: Metrics | None = None,
    access: Access | None = None,
) -> list[bool]:
    """Commit updates to the inbox in one transaction (a getUpdates batch is one commit, not
    one per update); for each, False if its update_id was there already."""
    async with store.write() as db:
        new = []
        for entry in entries:
            if entry.refused is not None and access is not None:
                new.append(
                    await access.refuse(
                        db,
                        entry.refused,
                        update_id=entry.update_id,
                        kind=entry.kind,
                        language=entry.language,
                    )
                )
            else:
                new.append(await inbox.insert(db, **entry.values))
    for entry, fresh in zip(entries, new, strict=True):
        if fresh:
            if entry.refused is not None and access is not None:
                access.refused()
            continue
        if entry.refused is None:
            log.info("update %s was delivered again; already stored", entry.update_id)
        if metrics is not None:
            metrics.duplicate()
    return new


async def store_update(
    store: ConversationStore,
    update: Update,
    payload: str,
    metrics: Metrics | None = None,
    access: Access | None = None,
) -> bool:
    """Commit one update to the inbox; False if its update_id was there already."""
    entry = await inbox_entry(update, payload, access)
    return (await store_entries(store, [entry], metrics, access))[0]


async def store_unreadable(store: ConversationStore, data: Mapping[str, Any]) -> bool:
    """Keep an update python-telegram-bot cannot parse, closed ("ignored"), for the record."""
    return (await store_entries(store, [unreadable_entry(data)]))[0]


@dataclass(eq=False, repr=False)
class _Ingest:
    """What both ways in are given: the bot, where an update is stored, who is told, and the
    pace of the retries while the database is away."""

    bot: Bot
    store: ConversationStore
    # told the chats with new updates to handle (none named: scan the inbox)
    on_stored: Callable[[Collection[int]], None]
    _: KW_ONLY
    backoff: InitVar[Backoff | None] = None
    metrics: Metrics | None = None
    access: Access | None = None

    def __post_init__(self, backoff: Backoff | None) -> None:
        self._backoff = backoff or Backoff(initial_s=0.5, cap_s=30.0)


@dataclass(eq=False, repr=False, kw_only=True)
class PollingIngest(_Ingest):
    """getUpdates long polling with an offset that moves only past committed updates."""

    _stopping: bool = field(init=False, default=False)
    # set by stop(): ends any retry wait at once
    _stop: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _fetch: asyncio.Task[tuple[Update, ...]] | None = field(init=False, default=None)
    _task: asyncio.Task[None] | None = field(init=False, default=None)

    async def start(self, stop: asyncio.Event | None = None) -> None:
        """Remove any webhook (getUpdates refuses to work while one is set) and start polling.

        Raises Interrupted when `stop` is set while deleteWebhook is still being retried.
        """
        await _call_with_retry(
            lambda: self.bot.delete_webhook(), "deleteWebhook", self._backoff, stop
        )
        self._task = asyncio.create_task(self._run(), name="polling")

    async def stop(self) -> None:
        """Stop fetching. An update being stored is finished; a pending long poll is dropped."""
        self._stopping = True
        self._stop.set()
        if self._fetch is not None:
            self._fetch.cancel()
        if self._task is not None:
            await wait_ended(self._task)

    @property
    def done(self) -> asyncio.Task[None] | None:
        """The polling task (it ends with an exception on a fatal error such as a bad token)."""
        return self._task

    async def _run(self) -> None:
        # None at start: Telegram hands out everything it has not seen confirmed. A remembered
        # offset would be wrong after a week of silence, when update_ids restart at random.
        offset: int | None = None
        failures = 0
        idle = 0  # polls in a row that brought only updates that cannot be confirmed
        while not self._stopping:
            self._fetch = asyncio.create_task(
                self.bot.get_updates(
                    offset=offset,
                    timeout=POLL_TIMEOUT_S,
                    allowed_updates=ALLOWED_UPDATES,
                )
            )
            batch: Sequence[Update | dict[str, Any]]
            try:
                batch = await self._fetch
            except asyncio.CancelledError:
                if self._stopping:
                    return
                raise
            except InvalidToken:
                raise
            except Conflict as err:
                failures += 1
                log.warning("getUpdates conflict (is another instance polling?): %s", err)
                await self._backoff.sleep(failures, self._stop)
                continue
            except RetryAfter as err:
                await wait_event(self._stop, retry_after_s(err))
                continue
            except (NetworkError, TelegramError) as err:
                failures += 1
                log.warning(
                    "getUpdates failed (%s: %s); retry %d", type(err).__name__, err, failures
                )
                await self._backoff.sleep(failures, self._stop)
                continue
            except Exception as err:  # noqa: BLE001 - any other error: reading the batch failed
                # python-telegram-bot could not read an update of the batch (malformed, a kind
                # newer than the library, a date out of range: TypeError, KeyError, OSError...).
                # Polling must not die on it, or every restart would fetch the same update and
                # die again: read the batch raw instead.
                log.warning("getUpdates returned an update that cannot be parsed: %s", err)
                raw = await self._fetch_raw(offset)
                if raw is None:
                    failures += 1
                    await self._backoff.sleep(failures, self._stop)
                    continue
                batch = raw
            finally:
                self._fetch = None
            failures = 0
            items: list[Update | dict[str, Any]] = []
            for item in batch:
                update_id = item.update_id if isinstance(item, Update) else item.get("update_id")
                if not valid_update_id(update_id):
                    # No offset can confirm it without risking real updates: the offset only
                    # ever moves past stored ones, and it is dropped with the next of those.
                    log.warning("getUpdates returned an update_id %.40r; skipped", update_id)
                    continue
                if self.metrics is not None:
                    self.metrics.received(
                        update_kind(item.to_dict() if isinstance(item, Update) else item)
                    )
                items.append(item)
            if not items:
                if batch:
                    # Only skipped updates: Telegram answers at once again; do not spin.
                    idle += 1
                    await self._backoff.sleep(idle, self._stop)
                continue
            chats = await self._store_batch(items)
            if chats is None:
                return  # stopping while the database is down: Telegram keeps the batch
            last = items[-1]
            offset = (last.update_id if isinstance(last, Update) else last["update_id"]) + 1
            if self.metrics is not None:
                for _ in items:
                    self.metrics.acknowledged_updates()
            idle = 0
            # The batch's updates became visible together, in one commit: their chats' workers
            # start now (no scan of the inbox needed to find them).
            self.on_stored(chats)

    async def _fetch_raw(self, offset: int | None) -> list[dict[str, Any]] | None:
        """The pending batch as plain JSON objects (no long poll); None if that failed too."""
        try:
            with warnings.catch_warnings():
                # PTB suggests get_updates, which is exactly what could not parse this batch.
                warnings.simplefilter("ignore", PTBUserWarning)
                result = await self.bot.do_api_request(
                    "getUpdates",
                    api_kwargs={"offset": offset, "timeout": 0, "allowed_updates": ALLOWED_UPDATES},
                )
        except TelegramError as err:
            log.warning("raw getUpdates failed (%s)", err)
            return None
        if not isinstance(result, list):
            log.warning("raw getUpdates returned %s, not a list", type(result).__name__)
            return None
        return [d for d in result if isinstance(d, dict)]

    def _readable(self, item: Update | dict[str, Any]) -> Update | InboxEntry:
        """A raw update parsed if possible, else its closed "unreadable" entry."""
        if isinstance(item, Update):
            return item
        try:
            return Update.de_json(item, self.bot)
        except Exception as err:  # noqa: BLE001 - whatever the library raises on bad data
            log.warning(
                "update %s cannot be parsed (%s); stored as ignored", item["update_id"], err
            )
            return unreadable_entry(item)

    async def _store_batch(self, items: Sequence[Update | dict[str, Any]]) -> set[int] | None:
        """Store a batch in one transaction, retrying until the database takes it: the chats
        with new updates to handle; None if stopping first (then nothing of it was stored, or
        all of it)."""
        readable = [self._readable(item) for item in items]

        async def store() -> set[int]:
            entries = [
                u
                if isinstance(u, InboxEntry)
                else await inbox_entry(u, json.dumps(u.to_dict(), ensure_ascii=False), self.access)
                for u in readable
            ]
            new = await store_entries(self.store, entries, self.metrics, self.access)
            return {e.chat_id for e, fresh in zip(entries, new, strict=True) if fresh and e.handled}

        first = readable[0].update_id
        # Not stored = not confirmed to Telegram: retry until the database is back or we stop
        # (a write in progress is finished first).
        try:
            return await retry(
                store,
                what=f"storing update {first}" + (".." if len(readable) > 1 else ""),
                backoff=self._backoff,
                stop=self._stop,
                finish_call=True,
            )
        except Interrupted:
            return None


@dataclass(eq=False, repr=False, kw_only=True)
class WebhookIngest(_Ingest):
    """An aiohttp server that answers Telegram's POST only after the update is committed."""

    url: str
    secret: InitVar[str]
    listen: str
    port: int
    max_connections: int = 40
    _runner: web.AppRunner | None = field(init=False, default=None)

    def __post_init__(self, backoff: Backoff | None, secret: str) -> None:
        if not secret:
            raise ValueError("webhook mode needs a secret")
        super().__post_init__(backoff)
        self.path = urlsplit(self.url).path or "/"
        self._secret = secret.encode()

    def make_app(self) -> web.Application:
        """The aiohttp application (one POST route at the webhook URL's path)."""
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post(self.path, self._handle)
        return app

    async def start(self, stop: asyncio.Event | None = None) -> None:
        """Listen, then tell Telegram where to post (with the secret and the update kinds).

        Raises Interrupted when `stop` is set while setWebhook is still being retried.
        """
        self._runner = web.AppRunner(self.make_app(), shutdown_timeout=5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.listen, self.port).start()
        log.info("webhook server listening on %s:%s%s", self.listen, self.port, self.path)
        secret = self._secret.decode()
        await _call_with_retry(
            lambda: self.bot.set_webhook(
                url=self.url,
                secret_token=secret,
                allowed_updates=ALLOWED_UPDATES,
                max_connections=self.max_connections,
            ),
            "setWebhook",
            self._backoff,
            stop,
        )

    async def stop(self) -> None:
        """Stop accepting; requests in progress finish (store, then 200). Telegram retries the
        rest later, so the webhook itself stays registered."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _authorized(self, request: web.Request) -> bool:
        given = request.headers.get(SECRET_HEADER, "")
        # A secret is ASCII (A-Za-z0-9_-); other header bytes cannot match it, and would not
        # encode for the comparison.
        return given.isascii() and hmac.compare_digest(given.encode("ascii"), self._secret)

    async def _handle(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            log.warning("webhook request from %s without the right secret: 403", request.remote)
            return web.Response(status=403, text="forbidden")
        try:
            data = await _read_update(request)
        except NotAnUpdate as err:
            # A malformed body does not get better by retrying; say so and move on.
            log.warning("webhook got something that is not an update: %s", err)
            return web.Response(status=400, text="not an update")
        if self.metrics is not None:
            self.metrics.received(update_kind(data))
        try:
            update = Update.de_json(data, self.bot)
        except Exception as err:  # noqa: BLE001 - whatever the library raises on bad data
            # An update the library cannot read: keep it closed and answer 200, or Telegram
            # would post it again and again.
            log.warning(
                "update %s cannot be parsed (%s); stored as ignored", data["update_id"], err
            )
            try:
                await store_unreadable(self.store, data)
            except Exception as db_err:  # noqa: BLE001
                log.warning(
                    "storing update %s failed (%s); answering 500", data["update_id"], db_err
                )
                return web.Response(status=500, text="try again")
            return self._acknowledge()
        try:
            await store_update(
                self.store,
                update,
                json.dumps(data, ensure_ascii=False),
                self.metrics,
                self.access,
            )
        except Exception as err:  # noqa: BLE001 - any failure means "not stored"
            # Not stored, so not acknowledged: Telegram will post it again.
            log.warning("storing update %s failed (%s); answering 500", update.update_id, err)
            return web.Response(status=500, text="try again")
        self.on_stored(())  # a scan finds it
        return self._acknowledge()

    def _acknowledge(self) -> web.Response:
        """The 200 that tells Telegram the update is ours (it is committed)."""
        if self.metrics is not None:
            self.metrics.acknowledged_updates()
        return web.Response(status=200)


class NotAnUpdate(Exception):
    """A webhook request body that is no Telegram update (answered 400)."""


async def _read_update(request: web.Request) -> dict[str, Any]:
    """The request's JSON object with a valid update_id, or NotAnUpdate saying why not."""
    body = await request.read()
    try:
        text = body.decode(request.charset or "utf-8")
    except LookupError as err:
        raise NotAnUpdate(f"unknown charset {request.charset!r:.40}") from err
    except UnicodeDecodeError as err:
        raise NotAnUpdate(f"not {request.charset or 'utf-8'} text: {err}") from err
    try:
        data = loads_json(text)
    except ValueError as err:
        raise NotAnUpdate(f"not JSON: {err}") from err
    if not isinstance(data, dict):
        raise NotAnUpdate(f"a JSON {type(data).__name__}, not an object")
    if not valid_update_id(data.get("update_id")):
        raise NotAnUpdate(f"update_id {data.get('update_id')!r:.40} is not a 64-bit integer")
    return data


async def _call_with_retry(
    call: Callable[[], Any], what: str, backoff: Backoff, stop: asyncio.Event | None = None
) -> None:
    """A start-up API call that must succeed: retry network faults and 429s; fail on others.

    Raises Interrupted as soon as `stop` is set (SIGTERM/SIGINT), even mid-request.
    """
    await retry(
        call, what=what, backoff=backoff, on=(NetworkError,), never=(BadRequest,), stop=stop
    )
