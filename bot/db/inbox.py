"""Inbox queries: one row per Telegram update. Functions take an AsyncSession, never commit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Update, bindparam, exists, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.base import table_of
from bot.db.dialect import insert_of
from bot.db.engine import Prepared, core, on_commit
from bot.db.leases import LeaseLost
from bot.db.models import ChatLease, Inbox, InboxStatus, utcnow


@dataclass(frozen=True, slots=True)
class UpdateRef:
    """The inbox row a write closes, and who closes it: `owner` is the replica that holds the
    chat's inbox lease (the inbox worker's), checked again in the closing commit; None where no
    lease is held (a process without leases, an admin's tool)."""

    update_id: int
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class InboxRow:
    """A stored Telegram update."""

    update_id: int
    chat_id: int | None
    kind: str
    payload: str
    status: str
    attempts: int
    # When the update was stored (for the reply latency metric).
    received_at: datetime | None = None
    # time.monotonic() when the inbox worker read it as pending (bot/service/inbox.py FRESH_S)
    read_at: float | None = None


class StaleUpdate(Exception):
    """The update was closed (or deleted) by someone else while this turn was being made."""


def _row(r: Inbox | Row[Any]) -> InboxRow:
    """A stored update (an Inbox object, or a row of the inbox table's columns) as an InboxRow."""
    return InboxRow(r.update_id, r.chat_id, r.kind, r.payload, r.status, r.attempts, r.received_at)


async def insert(
    db: AsyncSession,
    *,
    update_id: int,
    chat_id: int | None,
    user_id: int | None,
    kind: str,
    payload: str,
    status: InboxStatus = InboxStatus.PENDING,
) -> bool:
    """Store an update unless its update_id is already there; True if it was new."""
    now = utcnow()
    values = {
        "update_id": update_id,
        "chat_id": chat_id,
        "user_id": user_id,
        "kind": kind,
        "payload": payload,
        "status": status,
        "received_at": now,
        "processed_at": now if status != InboxStatus.PENDING else None,
    }
    return bool((await _INSERT.execute(db, values)).rowcount)


# Built once (bot.db.engine.Prepared): one for every update that comes.
_INSERT = Prepared(
    lambda dialect: insert_of(dialect, table_of(Inbox)).on_conflict_do_nothing(
        index_elements=["update_id"]
    )
)


async def pending_chats(db: AsyncSession, limit: int = 1000) -> list[int]:
    """Chats with updates waiting (rows without a chat are stored closed, never pending)."""
    # Oldest waiting update first, so that a backlog of more than `limit` chats is FIFO.
    rows = await (await core(db)).scalars(
        select(Inbox.chat_id)
        .where(Inbox.status == InboxStatus.PENDING, Inbox.chat_id.is_not(None))
        .group_by(Inbox.chat_id)
        .order_by(func.min(Inbox.update_id))
        .limit(limit)
    )
    return [int(chat_id) for chat_id in rows if chat_id is not None]


async def pending_of_chat(db: AsyncSession, chat_id: int) -> list[InboxRow]:
    """One chat's waiting updates, in update_id order."""
    return [_row(r) for r in await _PENDING_OF_CHAT.execute(db, {"p_chat_id": chat_id})]


_PENDING_OF_CHAT = Prepared(
    lambda dialect: (
        select(Inbox.__table__)
        .where(Inbox.status == InboxStatus.PENDING, Inbox.chat_id == bindparam("p_chat_id"))
        .order_by(Inbox.update_id)
    )
)


async def status_of(db: AsyncSession, update_id: int) -> str | None:
    """The status of one update, or None if it was never stored."""
    return await (await core(db)).scalar(select(Inbox.status).where(Inbox.update_id == update_id))


async def finish(
    db: AsyncSession,
    ref: UpdateRef,
    status: InboxStatus = InboxStatus.DONE,
    error: str | None = None,
) -> None:
    """Close a pending update (done, failed or ignored).

    This is the fence of every turn: if the update is no longer pending (another process took
    it over after our lease ran out, or an admin deleted it), or the chat's inbox lease is no
    longer `ref.owner`'s (taken over by another replica), raising rolls back the whole turn.
    """
    update_id, owner = ref.update_id, ref.owner
    values: dict[str, Any] = {
        "p_update_id": update_id,
        "status": status,
        "error": error,
        "processed_at": utcnow(),
    }
    if owner is not None:
        values["p_owner"] = owner
    result = await (_FINISH if owner is None else _FINISH_FENCED).execute(db, values)
    if not result.rowcount:
        if owner is not None and await status_of(db, update_id) == InboxStatus.PENDING:
            raise LeaseLost(f"the lease of update {update_id}'s chat was taken over")
        raise StaleUpdate(f"update {update_id} is no longer pending")
    watch = _WATCH.get()
    if watch is not None and watch.update_id == update_id:
        on_commit(db, watch.close)  # closed once (and only if) this transaction commits


def _finish(fenced: bool) -> Update:
    """finish's UPDATE (the values are the columns named in its parameters)."""
    fence = [Inbox.update_id == bindparam("p_update_id"), Inbox.status == InboxStatus.PENDING]
    if fenced:
        ours = exists().where(
            ChatLease.chat_id == Inbox.chat_id,
            ChatLease.kind == "inbox",
            ChatLease.owner == bindparam("p_owner"),
        )
        fence.append(Inbox.chat_id.is_(None) | ours)
    return update(table_of(Inbox)).where(*fence)


# Built once (bot.db.engine.Prepared): every turn closes its update.
_FINISH = Prepared(lambda dialect: _finish(False))
_FINISH_FENCED = Prepared(lambda dialect: _finish(True))


@dataclass(slots=True)
class CloseWatch:
    """Whether the update being handled was closed by a committed transaction of its handler
    (see watching_close)."""

    update_id: int
    closed: bool = False

    def close(self) -> None:
        self.closed = True


_WATCH: ContextVar[CloseWatch | None] = ContextVar("inbox_close_watch", default=None)


@contextmanager
def watching_close(update_id: int) -> Iterator[CloseWatch]:
    """While the block runs (and in the tasks it starts), a `finish` of `update_id` whose
    transaction commits sets the watch's `closed`: the inbox worker then need not read the
    update's status back after its handler ran."""
    watch = CloseWatch(update_id)
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


async def count_failure(db: AsyncSession, update_id: int, error: str) -> int:
    """Count a failed try at an update; returns the new count."""
    await db.execute(
        update(Inbox)
        .where(Inbox.update_id == update_id)
        .values(attempts=Inbox.attempts + 1, error=error)
    )
    return int(await db.scalar(select(Inbox.attempts).where(Inbox.update_id == update_id)) or 0)


async def backlog(db: AsyncSession) -> tuple[int, datetime | None]:
    """How many updates are waiting, and when the oldest of them was stored (None: none)."""
    count, oldest = (
        await db.execute(
            select(func.count(), func.min(Inbox.received_at)).where(
                Inbox.status == InboxStatus.PENDING
            )
        )
    ).one()
    return int(count), oldest
