"""Alembic environment: async engine, URL from the service settings (or the caller)."""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from bot.config import get_settings
from bot.db.engine import make_engine
from bot.db.models import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata
# pg_advisory_xact_lock key held while migrating (any fixed 64-bit number; this one spells "bot").
MIGRATION_LOCK = 0x626F74


def _url() -> str:
    # `python -m bot db` and the tests pass the URL in attributes; plain `alembic` uses settings.
    url = config.attributes.get("database_url")
    return str(url) if url else get_settings().db_url


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it."""
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Replicas started together all migrate at start: one at a time, so the others
            # find the schema at head instead of racing to create the same tables. (SQLite
            # serialises writers by itself.)
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        context.run_migrations()


async def run_migrations_online() -> None:
    """Run the migrations on an async engine."""
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    engine = make_engine(_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_migrations_online())
