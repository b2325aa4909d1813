"""Chat lease queries: which process works on a chat's inbox or outbox rows, until when.
Functions take an AsyncSession and never commit; bot/service/leases.py decides when to call them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, Executable, bindparam, delete, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.dialect import db_now, db_now_plus, db_offset, insert_of
from bot.db.engine import Prepared, core, run_now
from bot.db.models import ChatLease


class LeaseLost(Exception):
    """The chat's lease was taken over while this process worked on it: its work is void."""


def _of(chat_id: int, kind: str) -> ColumnElement[bool]:
    return (ChatLease.chat_id == chat_id) & (ChatLease.kind == kind)


async def take(
    db: AsyncSession, chat_id: int, kind: str, owner: str, ttl_s: float
) -> datetime | None:
    """Take the lease for `ttl_s` if it is free, ours, or expired; the `lease_until` written if
    `owner` holds it now, else None. Expiry is the database's clock, like the heartbeats.

    One statement: an INSERT whose conflict with the chat's row becomes a conditional UPDATE
    (ON CONFLICT DO UPDATE ... WHERE), returning the row only where it was written. SQLite
    serialises writers and PostgreSQL locks the conflicting row and re-checks the WHERE on its
    newest version, so both decide atomically. (It was an UPDATE, then an INSERT, then a
    SELECT: three statements for a chat whose lease had been given back, the usual case.)
    Two costs of the one statement, both small: on PostgreSQL a take that loses still locks
    the holder's row until its transaction ends (a few round trips: the holder's renewal or
    release of that chat waits that long), and every take draws an id from the table's
    sequence (64 bits).
    """
    conn = await core(db)
    taken = await run_now(
        conn,
        _TAKE(conn),
        {
            "p_chat_id": chat_id,
            "p_kind": kind,
            "p_owner": owner,
            "p_ttl": db_offset(conn.dialect.name, ttl_s),
            "p_zero": db_offset(conn.dialect.name, 0.0),
        },
    )
    return taken.scalar_one_or_none()


def _take(dialect: str) -> Executable:
    ins = insert_of(dialect, ChatLease)
    statement: Executable = (
        ins.values(
            chat_id=bindparam("p_chat_id"),
            kind=bindparam("p_kind"),
            owner=bindparam("p_owner"),
            lease_until=db_now_plus(dialect, "p_ttl"),
        )
        .on_conflict_do_update(
            index_elements=["chat_id", "kind"],
            set_={"owner": ins.excluded.owner, "lease_until": ins.excluded.lease_until},
            where=(ChatLease.owner == bindparam("p_owner"))
            | (ChatLease.lease_until < db_now_plus(dialect, "p_zero")),
        )
        .returning(ChatLease.lease_until)
    )
    return statement


# Every turn takes two leases (the inbox's, the outbox's): built once (bot.db.engine.Prepared).
_TAKE = Prepared(_take)


async def holder(db: AsyncSession, chat_id: int, kind: str) -> str | None:
    """Who holds the lease (expired or not), if anyone."""
    return await (await core(db)).scalar(select(ChatLease.owner).where(_of(chat_id, kind)))


async def take_from(
    db: AsyncSession, chat_id: int, kind: str, owner: str, previous: str, ttl_s: float
) -> datetime | None:
    """Take the lease from `previous` (known to have exited) unless someone else came first;
    the `lease_until` written, or None."""
    taken = await (await core(db)).execute(
        update(ChatLease)
        .where(_of(chat_id, kind), ChatLease.owner == previous)
        .values(owner=owner, lease_until=db_now(db, ttl_s))
        .returning(ChatLease.lease_until)
        .execution_options(synchronize_session=False)
    )
    return taken.scalar_one_or_none()


async def give_back_many(
    db: AsyncSession, written: dict[int, datetime], kind: str, owner: str
) -> None:
    """Delete each chat's lease row `owner` wrote with the given `lease_until`, unless it was
    renewed or taken again since; one statement for all of them."""
    if not written:
        return
    await (await core(db)).execute(
        delete(ChatLease).where(
            ChatLease.kind == kind,
            ChatLease.owner == owner,
            tuple_(ChatLease.chat_id, ChatLease.lease_until).in_(list(written.items())),
        )
    )


async def renew(
    db: AsyncSession, chat_ids: list[int], kind: str, owner: str, ttl_s: float
) -> dict[int, datetime]:
    """Push back the expiry of every lease `owner` still holds among `chat_ids` to `ttl_s`
    from now; returns the chats it still held, with their new `lease_until` (a lease taken
    over by another process is not renewed)."""
    mine = (ChatLease.kind == kind, ChatLease.owner == owner, ChatLease.chat_id.in_(chat_ids))
    renewed = await (await core(db)).execute(
        update(ChatLease)
        .where(*mine)
        .values(lease_until=db_now(db, ttl_s))
        .returning(ChatLease.chat_id, ChatLease.lease_until)
        .execution_options(synchronize_session=False)
    )
    return {chat_id: until for chat_id, until in renewed.all()}
