"""Alembic is the schema authority: every revision goes up, down and up again, and the
models agree with the migrations, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from bot.db import migrate
from bot.db.engine import make_engine
from bot.db.models import Base
from tests.support.dbutil import TABLES, create_pg_database, drop_pg_database, table_names


async def _diff(url: str) -> list[object]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:

            def compare(sync_conn: object) -> list[object]:
                ctx = MigrationContext.configure(sync_conn, opts={"compare_type": True})
                return list(compare_metadata(ctx, Base.metadata))

            return await conn.run_sync(compare)
    finally:
        await engine.dispose()


def test_stairway_every_revision_up_down_up(empty_db_url: str) -> None:
    cfg = migrate.alembic_config(empty_db_url)
    revisions = list(ScriptDirectory.from_config(cfg).walk_revisions("base", "heads"))
    revisions.reverse()
    assert revisions, "no migrations found"
    for rev in revisions:
        migrate.upgrade(empty_db_url, rev.revision)
        migrate.downgrade(empty_db_url, rev.down_revision or "base")
        migrate.upgrade(empty_db_url, rev.revision)
    assert asyncio.run(table_names(empty_db_url)) == TABLES


def test_downgrade_base_removes_every_table(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    migrate.downgrade(empty_db_url, "base")
    assert asyncio.run(table_names(empty_db_url)) <= {"alembic_version"}


def test_models_and_migrations_agree(db_url: str) -> None:
    assert asyncio.run(_diff(db_url)) == []


def test_replicas_that_start_together_migrate_one_at_a_time() -> None:
    # Three replicas of a fresh deployment run `upgrade` at the same moment (processes:
    # Alembic's context is global): without the advisory lock, all but one fail with
    # "relation already exists".
    import subprocess
    import sys

    url = create_pg_database()  # replicas share PostgreSQL (SQLite is one process's)
    try:
        code = "import sys; from bot.db import migrate; migrate.upgrade(sys.argv[1])"
        runs = [
            subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE)
            for _ in range(3)
        ]
        for run in runs:
            _, err = run.communicate(timeout=120)
            assert run.returncode == 0, err.decode()[-2000:]
        assert asyncio.run(table_names(url)) == TABLES
    finally:
        drop_pg_database(url)
