"""Ingest: Telegram updates into the inbox, acknowledged only once the row is committed.

Polling: an update is confirmed by the next getUpdates whose offset is above its update_id, so
the offset only moves past an update after `SessionStore.ingest` committed it. Webhook: the HTTP
200 is the acknowledgement, so it is answered after the commit; anything else makes Telegram
retry. The inbox's unique update_id makes every redelivery a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from telegram import Bot, Update
from telegram.error import (
    BadRequest,
    Conflict,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.warnings import PTBUserWarning

from bot.service.backoff import Backoff, retry_after_s
from bot.sessions import SessionStore

log = logging.getLogger(__name__)

# What we ask Telegram for. Channel posts and the rest never reach a chat conversation.
ALLOWED_UPDATES = ["message", "edited_message"]
# Kinds the handlers look at; any other kind is stored already closed ("ignored").
HANDLED_KINDS = frozenset(ALLOWED_UPDATES)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# Long-poll duration of getUpdates (seconds).
POLL_TIMEOUT_S = 25


def update_kind(data: Mapping[str, Any]) -> str:
    """The update's kind: the one field besides update_id (message, edited_message, ...)."""
    return next((key for key in data if key != "update_id"), "unknown")


async def store_update(store: SessionStore, update: Update, payload: str) -> bool:
    """Commit one update to the inbox; False if its update_id was there already."""
    data = json.loads(payload)
    kind = update_kind(data)
    chat = update.effective_chat
    user = update.effective_user
    new = await store.ingest(
        update_id=update.update_id,
        chat_id=chat.id if chat else None,
        user_id=user.id if user else None,
        kind=kind,
        payload=payload,
        status="pending" if kind in HANDLED_KINDS and chat is not None else "ignored",
    )
    if not new:
        log.info("update %s was delivered again; already stored", update.update_id)
    return new


async def store_unreadable(store: SessionStore, data: Mapping[str, Any]) -> bool:
    """Keep an update python-telegram-bot cannot parse, closed ("ignored"), for the record."""
    chat = next(
        (v.get("chat") for k, v in data.items() if k != "update_id" and isinstance(v, dict)),
        None,
    )
    chat_id = chat.get("id") if isinstance(chat, dict) else None
    return await store.ingest(
        update_id=int(data["update_id"]),
        chat_id=chat_id if isinstance(chat_id, int) else None,
        user_id=None,
        kind=update_kind(data)[:32],
        payload=json.dumps(data, ensure_ascii=False),
        status="ignored",
    )


class PollingIngest:
    """getUpdates long polling with an offset that moves only past committed updates."""

    def __init__(
        self,
        bot: Bot,
        store: SessionStore,
        on_stored: Callable[[], None],
        *,
        poll_timeout_s: int = POLL_TIMEOUT_S,
        backoff: Backoff | None = None,
    ) -> None:
        self.bot = bot
        self.store = store
        self.on_stored = on_stored
        self.poll_timeout_s = poll_timeout_s
        self.backoff = backoff or Backoff(initial_s=0.5, cap_s=30.0)
        self._stopping = False
        self._fetch: asyncio.Task[tuple[Update, ...]] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Remove any webhook (getUpdates refuses to work while one is set) and start polling."""
        await _call_with_retry(lambda: self.bot.delete_webhook(), "deleteWebhook", self.backoff)
        self._task = asyncio.create_task(self._run(), name="polling")

    async def stop(self) -> None:
        """Stop fetching. An update being stored is finished; a pending long poll is dropped."""
        self._stopping = True
        if self._fetch is not None:
            self._fetch.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def done(self) -> asyncio.Task[None] | None:
        """The polling task (it ends with an exception on a fatal error such as a bad token)."""
        return self._task

    async def _run(self) -> None:
        # None at start: Telegram hands out everything it has not seen confirmed. A remembered
        # offset would be wrong after a week of silence, when update_ids restart at random.
        offset: int | None = None
        failures = 0
        while not self._stopping:
            self._fetch = asyncio.create_task(
                self.bot.get_updates(
                    offset=offset,
                    timeout=self.poll_timeout_s,
                    allowed_updates=ALLOWED_UPDATES,
                )
            )
            try:
                updates = await self._fetch
            except asyncio.CancelledError:
                if self._stopping:
                    return
                raise
            except InvalidToken:
                raise
            except (TypeError, ValueError, KeyError) as err:
                # python-telegram-bot could not read an update of the batch (malformed, or a
                # kind newer than the library). Polling must not die on it, or every restart
                # would fetch the same update and die again: read the batch raw instead.
                log.warning("getUpdates returned an update that cannot be parsed: %s", err)
                raw = await self._fetch_raw(offset)
                if raw is None:
                    failures += 1
                    await self.backoff.sleep(failures)
                    continue
                for data in raw:
                    if not await self._store_raw(data):
                        return
                    offset = int(data["update_id"]) + 1
                if raw:
                    self.on_stored()
                continue
            except Conflict as err:
                failures += 1
                log.warning("getUpdates conflict (is another instance polling?): %s", err)
                await self.backoff.sleep(failures)
                continue
            except RetryAfter as err:
                await asyncio.sleep(retry_after_s(err))
                continue
            except (NetworkError, TelegramError) as err:
                failures += 1
                log.warning(
                    "getUpdates failed (%s: %s); retry %d", type(err).__name__, err, failures
                )
                await self.backoff.sleep(failures)
                continue
            finally:
                self._fetch = None
            failures = 0
            for update in updates:
                if not await self._store(update):
                    return  # stopping while the database is down: Telegram keeps the rest
                offset = update.update_id + 1
            if updates:
                self.on_stored()

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
        return [d for d in result if isinstance(d, dict) and isinstance(d.get("update_id"), int)]

    async def _store_raw(self, data: dict[str, Any]) -> bool:
        """Store one raw update: parsed if possible, else kept closed as unreadable."""
        try:
            update = Update.de_json(data, self.bot)
        except (TypeError, ValueError, KeyError) as err:
            return await self._store_unreadable(data, err)
        return await self._store(update)

    async def _store_unreadable(self, data: dict[str, Any], err: Exception) -> bool:
        log.warning("update %s cannot be parsed (%s); stored as ignored", data["update_id"], err)
        attempt = 0
        while True:
            try:
                await store_unreadable(self.store, data)
                return True
            except Exception as db_err:  # noqa: BLE001 - not stored = not confirmed; retry
                attempt += 1
                log.warning("storing update %s failed (%s)", data["update_id"], db_err)
                if self._stopping:
                    return False
                await self.backoff.sleep(attempt)

    async def _store(self, update: Update) -> bool:
        """Store one update, retrying until the database takes it; False if stopping first."""
        payload = json.dumps(update.to_dict(), ensure_ascii=False)
        attempt = 0
        while True:
            try:
                await store_update(self.store, update, payload)
                return True
            except Exception as err:  # noqa: BLE001 - not stored = not confirmed; retry
                attempt += 1
                log.warning(
                    "storing update %s failed (%s); retry %d", update.update_id, err, attempt
                )
                if self._stopping:
                    return False
                await self.backoff.sleep(attempt)


class WebhookIngest:
    """An aiohttp server that answers Telegram's POST only after the update is committed."""

    def __init__(
        self,
        bot: Bot,
        store: SessionStore,
        on_stored: Callable[[], None],
        *,
        url: str,
        secret: str,
        listen: str,
        port: int,
        max_connections: int = 40,
        backoff: Backoff | None = None,
    ) -> None:
        if not secret:
            raise ValueError("webhook mode needs a secret")
        self.bot = bot
        self.store = store
        self.on_stored = on_stored
        self.url = url
        self.path = urlsplit(url).path or "/"
        self.secret = secret.encode()
        self.listen = listen
        self.port = port
        self.max_connections = max_connections
        self.backoff = backoff or Backoff(initial_s=0.5, cap_s=30.0)
        self._runner: web.AppRunner | None = None

    def make_app(self) -> web.Application:
        """The aiohttp application (one POST route at the webhook URL's path)."""
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post(self.path, self._handle)
        return app

    async def start(self) -> None:
        """Listen, then tell Telegram where to post (with the secret and the update kinds)."""
        self._runner = web.AppRunner(self.make_app(), shutdown_timeout=5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.listen, self.port).start()
        log.info("webhook server listening on %s:%s%s", self.listen, self.port, self.path)
        secret = self.secret.decode()
        await _call_with_retry(
            lambda: self.bot.set_webhook(
                url=self.url,
                secret_token=secret,
                allowed_updates=ALLOWED_UPDATES,
                max_connections=self.max_connections,
            ),
            "setWebhook",
            self.backoff,
        )

    async def stop(self) -> None:
        """Stop accepting; requests in progress finish (store, then 200). Telegram retries the
        rest later, so the webhook itself stays registered."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        given = request.headers.get(SECRET_HEADER, "").encode()
        if not hmac.compare_digest(given, self.secret):
            log.warning("webhook request from %s without the right secret: 403", request.remote)
            return web.Response(status=403, text="forbidden")
        try:
            data = await request.json()
            if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
                raise ValueError("not an update")
        except (ValueError, TypeError, KeyError) as err:
            # A malformed body does not get better by retrying; say so and move on.
            log.warning("webhook got something that is not an update: %s", err)
            return web.Response(status=400, text="not an update")
        try:
            update = Update.de_json(data, self.bot)
        except (ValueError, TypeError, KeyError) as err:
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
            return web.Response(status=200)
        try:
            await store_update(self.store, update, json.dumps(data, ensure_ascii=False))
        except Exception as err:  # noqa: BLE001 - any failure means "not stored"
            # Not stored, so not acknowledged: Telegram will post it again.
            log.warning("storing update %s failed (%s); answering 500", update.update_id, err)
            return web.Response(status=500, text="try again")
        self.on_stored()
        return web.Response(status=200)


async def _call_with_retry(call: Callable[[], Any], what: str, backoff: Backoff) -> None:
    """A start-up API call that must succeed: retry network faults and 429s; fail on others."""
    attempt = 0
    while True:
        try:
            await call()
            return
        except RetryAfter as err:
            await asyncio.sleep(retry_after_s(err))
        except BadRequest:
            raise
        except NetworkError as err:
            attempt += 1
            log.warning("%s failed (%s); retry %d", what, err, attempt)
            await backoff.sleep(attempt)
