"""The service in-process against the loopback Bot API, for tests/integration/tg/test_service_*.

The model responder is replaced by `EchoResponder`, a deterministic ResponderProtocol whose
reply names
the chat and the text it answers, so that tests can tell exactly which reply went where. The
real responder (tiny model) runs in tests/e2e against the real `python -m bot run` process.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bot.app import Service, open_service
from bot.config import Settings
from bot.db import migrate
from bot.db.conversations import SessionRow
from bot.engine.protocol import Abilities, DraftSink, Reply
from bot.service.retry import Backoff
from tests.support.fakebotapi import FakeBotAPI
from tests.support.waits import until

# The shape of a real token: bot id, colon, 35 characters.
TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw4"
assert len(TOKEN.split(":")[1]) == 35
FAST = Backoff(initial_s=0.05, factor=2.0, cap_s=0.5, jitter=0.0)


class EchoResponder:
    """Replies "echo <chat>: <text>"; can be slowed down or made to fail per text."""

    def __init__(self, delay_s: float | Callable[[int, str], float] = 0.0) -> None:
        self.delay_s = delay_s
        self.calls: list[tuple[int, str]] = []
        self.evicted: list[int] = []
        self.personas: dict[int, str] = {}
        self.fail_on: set[str] = set()
        self.reply_override: Callable[[int, str], str] | None = None
        # The "other beams" each reply comes with (the safety gate's fallbacks).
        self.candidates: tuple[str, ...] = ()
        self.in_progress = 0
        self.closed = False
        self.drafted: list[int] = []  # chats whose turn had a draft sink

    @property
    def abilities(self) -> Abilities:
        """It streams (one draft a turn); no /context, no variants."""
        return Abilities(drafts=True)

    async def respond(
        self, session: SessionRow, user_text: str, *, on_draft: DraftSink | None = None
    ) -> Reply:
        """Echo, after the configured delay; where the turn streams, the reply's first word
        as a draft halfway through it."""
        self.calls.append((session.chat_id, user_text))
        self.in_progress += 1
        try:
            delay = (
                self.delay_s(session.chat_id, user_text) if callable(self.delay_s) else self.delay_s
            )
            sink = on_draft
            if delay:
                await asyncio.sleep(delay / 2)
            if sink is not None:
                sink("echo")
                self.drafted.append(session.chat_id)
            if delay:
                await asyncio.sleep(delay / 2)
            if user_text in self.fail_on:
                raise RuntimeError(f"responder exploded on {user_text!r}")
            if self.reply_override is not None:
                text = self.reply_override(session.chat_id, user_text)
                return Reply(text, 1.0, candidates=self.candidates)
            return Reply(f"echo {session.chat_id}: {user_text}", 1.0, candidates=self.candidates)
        finally:
            self.in_progress -= 1

    def set_persona(self, session_id: int, persona: str) -> None:
        """Remember the persona."""
        self.personas[session_id] = persona

    def evict(self, session_id: int) -> None:
        """Record the eviction."""
        self.evicted.append(session_id)

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """Nothing is cached."""

    async def close(self) -> None:
        """Nothing to release."""
        self.closed = True


def make_settings(db_url: str, api: FakeBotAPI, tmp_path: Path, **overrides: Any) -> Settings:
    """Settings for an in-process service talking to `api`."""
    values: dict[str, Any] = {
        "telegram_bot_token": TOKEN,
        "telegram_base_url": api.base_url,
        "database_url": db_url,
        "data_dir": tmp_path,
        "shutdown_grace_s": 5.0,
        "log_level": "DEBUG",
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@asynccontextmanager
async def running_service(
    settings: Settings,
    responder: EchoResponder | None,
    *,
    timeout_s: float = 5.0,
    migrate_db: bool = True,
) -> AsyncIterator[Service]:
    """A started Service; stopped (gracefully) and closed on exit."""
    if migrate_db:
        await asyncio.to_thread(migrate.upgrade, settings.db_url)

    async def factory(_settings: Settings, _store: object) -> EchoResponder:
        assert responder is not None
        return responder

    # None: the service's own responder (the variants of `settings`, real model workers).
    service = await open_service(
        settings,
        responder_factory=factory if responder is not None else None,
        backoff=FAST,
        timeout_s=timeout_s,
    )
    try:
        await service.start()
        yield service
    finally:
        try:
            await service.stop()
        finally:
            await service.close()


async def rows(service: Service, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Run a read query on the service's database."""
    async with service.sessionmaker() as db:
        return [tuple(r) for r in (await db.execute(text(sql), params)).all()]


async def settled(service: Service, api: FakeBotAPI, *, within_s: float = 10.0) -> None:
    """Wait until the service has nothing left to do: every update the fake API holds was
    confirmed (polling confirms only committed updates) or posted (webhook), no inbox row is
    pending, no outbox text waits to be sent, and no Bot API call but the long poll is in flight.

    Every text goes out through an outbox row written in the same transaction that closes its
    update, so once settled nothing more is sent until something new comes in: a test can then
    assert that nothing more went out (no duplicate, no stale reply) without first sleeping
    "long enough" for it. Any database the replicas share will do: `service` only reads it.
    """

    async def quiet() -> bool:
        if api.unconfirmed:
            return False
        if any(c.status is None for c in api.calls if c.method != "getUpdates"):
            return False
        [(inbox_left,)] = await rows(service, "SELECT count(*) FROM inbox WHERE status = 'pending'")
        [(outbox_left,)] = await rows(
            service, "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL"
        )
        return inbox_left == 0 and outbox_left == 0

    await until(quiet, within_s=within_s, every_s=0.02, what="the service settling")


def sqlite_file(url: str) -> str:
    """The file of an SQLite URL."""
    return url.split("///", 1)[1]


def sqlite_rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """A synchronous read (for callbacks that run inside the fake server)."""
    with sqlite3.connect(sqlite_file(url)) as conn:
        return list(conn.execute(sql))
