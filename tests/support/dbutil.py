"""Throw-away databases for tests: SQLite files, and fresh databases on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
from typing import Any

import pytest
from sqlalchemy.engine import make_url

PG_URL = os.environ.get("TEST_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")


def _asyncpg_dsn(url: str, database: str | None = None) -> str:
    u = make_url(url).set(drivername="postgresql")
    if database is not None:
        u = u.set(database=database)
    return u.render_as_string(hide_password=False)


async def _probe() -> str | None:
    import asyncpg

    try:
        conn = await asyncio.wait_for(asyncpg.connect(_asyncpg_dsn(PG_URL)), timeout=3)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    await conn.close()
    return None


@functools.lru_cache(maxsize=1)
def postgres_unavailable() -> str | None:
    """None if PostgreSQL answers at TEST_DATABASE_URL, else why not."""
    return asyncio.run(_probe())


def require_postgres() -> None:
    """Skip (or, under CI=true, fail) when no PostgreSQL server answers."""
    why = postgres_unavailable()
    if why is None:
        return
    message = (
        f"PostgreSQL not reachable at {make_url(PG_URL).render_as_string(hide_password=True)} "
        f"({why}); set TEST_DATABASE_URL to run these tests"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " -- required under CI=true")
    pytest.skip(message)


async def _admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_asyncpg_dsn(PG_URL))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def create_pg_database() -> str:
    """Create an empty database next to TEST_DATABASE_URL's; returns its URL."""
    require_postgres()
    name = f"bot_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    return make_url(PG_URL).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str) -> None:
    """Drop a database made by create_pg_database."""
    name = make_url(url).database
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


# Every table of the schema: a stray one left by a down-and-up is as wrong as a missing one.
TABLES = {
    "sessions",
    "messages",
    "outbox",
    "inbox",
    "chat_leases",
    "assignments",
    "votes",
    "ratings",
    "arena_matches",
    "counters",
    "replicas",
    "experiments",
    "variants",
    "variant_versions",
    "chat_settings",
    "autopilot_decisions",
    "audit_log",
    "access_rules",
    "access_refusals",
    "user_quotas",
    "quota_counters",
    "alembic_version",
}


async def table_names(url: str) -> set[str]:
    """The tables that exist in a database."""
    from sqlalchemy import inspect

    from bot.db.engine import make_engine

    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
    finally:
        await engine.dispose()


def make_readonly_role(url: str) -> str:
    """A fresh role made by `db readonly-role` for the database at `url`; returns its URL.

    Roles belong to the whole server: drop it with drop_pg_role (before or after the database).
    """
    from bot.admin.pgrole import ensure_readonly_role

    name = f"bot_test_ro_{uuid.uuid4().hex[:12]}"
    asyncio.run(ensure_readonly_role(url, name))
    return make_url(url).set(username=name, password=None).render_as_string(hide_password=False)


def drop_pg_role(url: str) -> None:
    """Drop the role of `url` (made by a test), and what it owns or was granted in its database."""
    import asyncpg

    role, database = make_url(url).username, make_url(url).database
    quoted = '"' + str(role).replace('"', '""') + '"'

    async def drop() -> None:
        try:
            conn = await asyncpg.connect(_asyncpg_dsn(PG_URL, database))
        except asyncpg.InvalidCatalogNameError:  # the database is gone, and its grants with it
            pass
        else:
            try:
                if await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role):
                    await conn.execute(f"DROP OWNED BY {quoted}")
            finally:
                await conn.close()
        await _admin(f"DROP ROLE IF EXISTS {quoted}")

    asyncio.run(drop())


def add_assignment(
    db: Any,
    chat: int,
    experiment: str,
    variant: str,
    at: Any,
    *,
    source: str = "hash",
    probability: float | None = None,
    allocation: str | None = None,
) -> None:
    """`chat`'s assignment to `variant` in `experiment`, in the open session `db` (the report
    tests' staged chats)."""
    from bot.db.models import Assignment

    db.add(
        Assignment(
            chat_id=chat, experiment=experiment, variant=variant, source=source, assigned_at=at,
            probability=probability, allocation=allocation,
        )
    )  # fmt: skip


async def add_voted_replies(
    db: Any, session_id: int, chat: int, variant: str, votes: Any, at: Any
) -> None:
    """One bot reply of `variant` per (user, value) in `votes`, each with that user's vote on
    it, in the open session `db` (the report tests' staged chats)."""
    from bot.db.models import Message, Vote

    for user, value in votes:
        m = Message(session_id=session_id, chat_id=chat, role="bot", text="x", variant=variant)
        db.add(m)
        await db.flush()
        db.add(
            Vote(
                chat_id=chat, message_id=m.id, user_id=user, value=value, source="button",
                variant=variant, created_at=at, updated_at=at,
            )
        )  # fmt: skip
