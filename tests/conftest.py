"""Shared fixtures: databases on both backends, migrated and ready; the loopback Bot API and the
service (tests/support/fixtures.py)."""

from __future__ import annotations

import logging
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


def _pytests_own(handler: logging.Handler) -> bool:
    return type(handler).__module__.startswith("_pytest")


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """The root logger's handlers and level as they were before the test.

    A test that runs `bot.__main__.main` in-process gets its `setup_logging`: a handler bound to
    that test's captured stderr, which pytest closes afterwards. Left on the root logger, it
    made every later test in the process print "--- Logging error ---" to its own stderr (seen
    when pytest-xdist put another file after tests/unit/training/test_persona_data.py)."""
    root = logging.getLogger()
    saved, level = [h for h in root.handlers if not _pytests_own(h)], root.level
    yield
    for handler in list(root.handlers):
        if not _pytests_own(handler) and handler not in saved:
            root.removeHandler(handler)
    for handler in saved:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


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
