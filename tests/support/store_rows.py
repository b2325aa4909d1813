"""One-line inbox and outbox steps for tests, each in its own transaction of the store (the
service takes them inside a use case's or ingest's transaction: bot/tg/ingest.py,
bot/terminal.py, bot/service/delivery.py)."""

from __future__ import annotations

from bot.conversations.store import ConversationStore
from bot.db import inbox, outbox
from bot.db.inbox import UpdateRef
from bot.db.models import InboxStatus


async def ingest(
    store: ConversationStore,
    *,
    update_id: int,
    chat_id: int | None,
    user_id: int | None,
    kind: str,
    payload: str,
    status: InboxStatus = InboxStatus.PENDING,
) -> bool:
    """Store an update in the inbox; False if this update_id was seen before."""
    async with store.write() as db:
        return await inbox.insert(
            db,
            update_id=update_id,
            chat_id=chat_id,
            user_id=user_id,
            kind=kind,
            payload=payload,
            status=status,
        )


async def finish_update(
    store: ConversationStore,
    update: UpdateRef,
    status: InboxStatus = InboxStatus.DONE,
    error: str | None = None,
) -> None:
    """Close an update."""
    async with store.write() as db:
        await inbox.finish(db, update, status=status, error=error)


async def pending_outbox(
    store: ConversationStore, chat_id: int | None = None
) -> list[outbox.OutboxRow]:
    """Texts waiting to be sent, oldest first."""
    async with store.read() as db:
        return await outbox.pending(db, chat_id)


async def mark_sent(
    store: ConversationStore, outbox_id: int, telegram_message_id: int | None = None
) -> None:
    """Record that a queued text went out."""
    async with store.write() as db:
        await outbox.sent(db, outbox_id, telegram_message_id)
