"""What every table shares: the declarative Base with its constraint naming convention, the
timezone-aware timestamp type, and the column types many tables declare alike.

The tables themselves are bot.db.models (and bot.db.models_ops), which re-exports these names.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, cast

from sqlalchemy import BigInteger, DateTime, ForeignKey, Integer, MetaData, Table
from sqlalchemy.orm import DeclarativeBase, mapped_column
from sqlalchemy.types import TypeDecorator

# Names for every constraint, so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets BIGINT identities.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime; use bot.db.models.utcnow()")
        return value

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


# The columns many tables declare alike (each use gets its own copy of the mapped_column):
# a row id that is never handed out again, a Telegram chat or user id, a required UTC
# timestamp that defaults to the moment the row is inserted, and the conversation a row
# belongs to (deleted with it).
Serial = Annotated[int, mapped_column(BigId, primary_key=True, autoincrement=True)]
TelegramId = Annotated[int, mapped_column(BigInteger, nullable=False)]
Stamp = Annotated[datetime, mapped_column(UtcDateTime, nullable=False, default=utcnow)]
SessionRef = Annotated[
    int, mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False)
]


class Base(DeclarativeBase):
    """Declarative base with the naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def table_of(model: type[Base]) -> Table:
    """A mapped class's table, for Core statements built once (bot.db.engine.Prepared)."""
    return cast(Table, model.__table__)
