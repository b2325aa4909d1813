"""What SQLite and PostgreSQL spell differently, in one place."""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.models import Base


async def insert_unless_present(
    db: AsyncSession, table: type[Base], values: dict[str, Any], key: list[str]
) -> bool:
    """INSERT ... ON CONFLICT (key) DO NOTHING; True if the row was new."""
    dialect = db.get_bind().dialect.name
    ins = pg_insert(table) if dialect == "postgresql" else sqlite_insert(table)
    result = await db.execute(ins.values(**values).on_conflict_do_nothing(index_elements=key))
    return bool(getattr(result, "rowcount", 0))
