"""Shared fixtures: databases on both backends, migrated and ready; the loopback Bot API and the
service (tests/support/fixtures.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bot.conversations.store import ConversationStore
from bot.db import migrate
from bot.db.engine import make_engine, make_sessionmaker
from tests.support.dbutil import create_pg_database, drop_pg_database

# `api` (the loopback Bot API) and `start_service` (a running service, stopped at teardown)
pytest_plugins = ("tests.support.fixtures",)

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _fresh_url(backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'test.sqlite3'}"
    return create_pg_database()


@pytest.fixture(params=BACKENDS)
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no tables) on each backend."""
    url = _fresh_url(request.param, tmp_path)
    yield url
    if request.param == "postgres":
        drop_pg_database(url)


@pytest.fixture
def db_url(empty_db_url: str) -> str:
    """A database on each backend, migrated to head."""
    migrate.upgrade(empty_db_url)
    return empty_db_url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A migrated SQLite database only (for tests that are about SQLite itself)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'test.sqlite3'}"
    migrate.upgrade(url)
    return url


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[ConversationStore]:
    """A ConversationStore over a migrated database."""
    engine = make_engine(db_url)
    yield ConversationStore(make_sessionmaker(engine))
    await engine.dispose()


@pytest.fixture(scope="session")
def tiny_model_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny real ParlAI model, built once per test run."""
    from tests.support.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.getbasetemp() / "tinymodel")
