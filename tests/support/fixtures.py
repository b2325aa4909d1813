"""Fixtures for the tests that run the service against the loopback Bot API (tests/conftest.py
registers this module as a plugin).

    async def test_x(api: FakeBotAPI, start_service: StartService, ...) -> None:
        svc = await start_service(make_settings(db_url, api, tmp_path), EchoResponder())

`start_service` stops and closes every service it started at teardown, before `api` stops. A
test that stops or restarts the service itself uses `running_service` instead.
`serve_sqlite(responder, **overrides)` is `start_service` on make_settings(sqlite_url, api,
tmp_path, **overrides), `serve_db` the same on `db_url`; `sessionmaker` and `readonly_url`
are sessions and a read-only URL on `db_url`.

The service modules are imported only when a fixture runs, so that collecting the unit tests
does not pull in python-telegram-bot.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from bot.app import Service
    from bot.config import Settings
    from tests.support.fakebotapi import FakeBotAPI
    from tests.support.service_harness import EchoResponder


class StartService(Protocol):
    """`running_service`'s arguments; the started Service lives until the test's teardown."""

    def __call__(
        self,
        settings: Settings,
        responder: EchoResponder | None,
        *,
        timeout_s: float = ...,
        migrate_db: bool = ...,
    ) -> Awaitable[Service]: ...


@pytest.fixture
async def sessionmaker(db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions on `db_url` (each backend, migrated); the engine is disposed at teardown."""
    from bot.db.engine import make_engine, make_sessionmaker

    engine = make_engine(db_url)
    yield make_sessionmaker(engine)
    await engine.dispose()


@pytest.fixture
def readonly_url(db_url: str) -> Iterator[str]:
    """A read-only connection to `db_url`, as `admin sql` and the dashboard use: the SQLite
    file itself, or on PostgreSQL a role made as `db readonly-role` makes it (the tests' own
    connection is a superuser, which both refuse)."""
    from tests.support.dbutil import drop_pg_role, make_readonly_role

    if not db_url.startswith("postgresql"):
        yield db_url
        return
    url = make_readonly_role(db_url)
    yield url
    drop_pg_role(url)


class ServeSettings(Protocol):
    """start_service on make_settings(<the test's database>, api, tmp_path, **overrides)."""

    def __call__(self, responder: EchoResponder | None, **overrides: Any) -> Awaitable[Service]: ...


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    """The loopback Bot API, started, answering the harness's TOKEN."""
    from tests.support.fakebotapi import FakeBotAPI
    from tests.support.service_harness import TOKEN

    async with FakeBotAPI(TOKEN) as fake:
        yield fake


@pytest.fixture
async def start_service(api: FakeBotAPI) -> AsyncIterator[StartService]:
    """Start a Service (as `running_service` does); all are stopped and closed at teardown."""
    from tests.support.service_harness import running_service

    async with contextlib.AsyncExitStack() as stack:

        async def start(
            settings: Settings,
            responder: EchoResponder | None,
            *,
            timeout_s: float = 5.0,
            migrate_db: bool = True,
        ) -> Service:
            return await stack.enter_async_context(
                running_service(settings, responder, timeout_s=timeout_s, migrate_db=migrate_db)
            )

        yield start


def _serving(
    url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> ServeSettings:
    from tests.support.service_harness import make_settings

    def serve(responder: EchoResponder | None, **overrides: Any) -> Awaitable[Service]:
        return start_service(make_settings(url, api, tmp_path, **overrides), responder)

    return serve


@pytest.fixture
def serve_sqlite(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> ServeSettings:
    """Start a Service (see start_service) on make_settings(sqlite_url, api, tmp_path, ...)."""
    return _serving(sqlite_url, tmp_path, api, start_service)


@pytest.fixture
def serve_db(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> ServeSettings:
    """serve_sqlite on `db_url` (each backend)."""
    return _serving(db_url, tmp_path, api, start_service)
