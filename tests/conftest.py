"""Shared fixtures: databases on both backends, migrated and ready; the loopback Bot API and the
service (tests/support/fixtures.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.conversations.store import ConversationStore
from bot.db import migrate
from bot.db.engine import make_engine, make_sessionmaker
from bot.inference import compat
from tests.support.dbutil import create_pg_database, drop_pg_database

# The ParlAI shims, once for the test process (tests import bot.inference without bot/__main__.py,
# the service's composition root, which installs them there).
compat.apply()

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


@pytest.fixture(scope="session")
def cased_model_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny real ParlAI model built like BlenderBot 400M-distill: a cased byte-level BPE
    dictionary (tests/support/tinymodel.py, build_cased_bpe_model), built once per run."""
    from tests.support.tinymodel import build_cased_bpe_model

    return build_cased_bpe_model(tmp_path_factory.getbasetemp() / "casedmodel")


@pytest.fixture(scope="session")
def tiny_agent(tiny_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model loaded the way the service loads its shared agent (clone it; do not
    patch it: other tests share it)."""
    from bot.config import Settings
    from bot.inference.model import load_shared_agent

    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        bot_model=tiny_model_file,
        data_dir=tmp_path_factory.mktemp("tiny_agent"),
        model_device="cpu",
    )
    return load_shared_agent(settings)
