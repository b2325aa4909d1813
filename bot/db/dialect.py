"""What SQLite and PostgreSQL spell differently, in one place."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Interval, String, bindparam, func, literal, type_coerce
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.models import Base, UtcDateTime


def dialect_insert(db: AsyncSession, table: type[Base]):  # type: ignore[no-untyped-def]
    """The dialect's own INSERT (its ON CONFLICT clauses): PostgreSQL's or SQLite's."""
    return insert_of(db.get_bind().dialect.name, table)


async def insert_unless_present(
    db: AsyncSession, table: type[Base], values: dict[str, Any], key: list[str]
) -> bool:
    """INSERT ... ON CONFLICT (key) DO NOTHING; True if the row was new."""
    ins = dialect_insert(db, table)
    result = await db.execute(ins.values(**values).on_conflict_do_nothing(index_elements=key))
    return bool(getattr(result, "rowcount", 0))


def db_now(db: AsyncSession, offset_s: float = 0.0) -> ColumnElement[datetime]:
    """The database server's clock (plus `offset_s`), for times that several machines compare:
    PostgreSQL's now() (the transaction's start), SQLite's 'now' in UTC, written the way
    SQLAlchemy writes SQLite timestamps (microseconds: six digits) so that they compare as text.
    """
    dialect = db.get_bind().dialect.name
    if dialect == "postgresql":
        now: ColumnElement[Any] = func.now()
        if offset_s:
            now = now + literal(db_offset(dialect, offset_s))
        return type_coerce(now, UtcDateTime)
    return _sqlite_now(db_offset(dialect, offset_s))


def db_now_plus(dialect: str, name: str) -> ColumnElement[datetime]:
    """db_now with its offset a bound parameter `name` (its value: db_offset), for a statement
    built once (bot.db.engine.Prepared)."""
    if dialect == "postgresql":
        return type_coerce(func.now() + bindparam(name, type_=Interval()), UtcDateTime)
    return _sqlite_now(bindparam(name, type_=String()))


def _sqlite_now(shift: Any) -> ColumnElement[datetime]:
    """SQLite's 'now' in UTC shifted by `shift` ("+60.000000 seconds"), as SQLAlchemy writes
    SQLite timestamps."""
    return type_coerce(func.strftime("%Y-%m-%d %H:%M:%f", "now", shift).concat("000"), UtcDateTime)


def db_offset(dialect: str, offset_s: float) -> timedelta | str:
    """The value of db_now_plus's parameter for `offset_s` seconds."""
    return timedelta(seconds=offset_s) if dialect == "postgresql" else f"{offset_s:+.6f} seconds"


def insert_of(dialect: str, table: Any):  # type: ignore[no-untyped-def]
    """dialect_insert by the dialect's name (of a table or a mapped class), for a statement
    built once."""
    return pg_insert(table) if dialect == "postgresql" else sqlite_insert(table)
