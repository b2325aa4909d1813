"""Use cases: one function per user action, each owning exactly one transaction."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import conversations, inbox, outbox
from bot.db.conversations import MessageRow, SessionRow
from bot.db.models import InboxStatus, OutboxKind, Role, Session


@dataclass(frozen=True, slots=True)
class ConversationContext:
    """What the engine needs to rebuild a conversation: persona and the tail of its messages."""

    session_id: int
    chat_id: int
    persona: str
    messages: list[MessageRow]


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """The rows one turn wrote."""

    user_message_id: int
    bot_message_id: int
    outbox_id: int


async def _answer(
    db: AsyncSession,
    chat_id: int,
    notice: str | None,
    update_id: int | None,
    status: InboxStatus = InboxStatus.DONE,
) -> int | None:
    """Queue `notice` (if any) for the chat and close its update (if any), in `db`'s
    transaction; returns the outbox id."""
    outbox_id = None
    if notice is not None:
        outbox_id = await outbox.enqueue(
            db, chat_id=chat_id, kind=OutboxKind.NOTICE, text=notice, update_id=update_id
        )
    if update_id is not None:
        await inbox.finish(db, update_id, status=status)
    return outbox_id


async def _user_message(
    db: AsyncSession,
    session_id: int,
    chat_id: int,
    text: str,
    update_id: int | None,
    telegram_message_id: int | None,
) -> int:
    return await conversations.add_message(
        db,
        session_id=session_id,
        chat_id=chat_id,
        role=Role.USER,
        text=text,
        update_id=update_id,
        telegram_message_id=telegram_message_id,
    )


class ConversationStore:
    """The conversation store; the only code that opens transactions for user actions."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        self.sessionmaker = sessionmaker

    async def _active_or_new(
        self, db: AsyncSession, chat_id: int, user_id: int | None
    ) -> SessionRow:
        current = await conversations.get_active_session(db, chat_id)
        if current is not None:
            return current
        # A new conversation keeps the persona of the previous one.
        persona = await conversations.latest_persona(db, chat_id)
        return await conversations.create_session(db, chat_id, user_id, persona)

    async def ingest(
        self,
        *,
        update_id: int,
        chat_id: int | None,
        user_id: int | None,
        kind: str,
        payload: str,
        status: InboxStatus = InboxStatus.PENDING,
    ) -> bool:
        """Store an update in the inbox; False if this update_id was seen before."""
        async with self.sessionmaker.begin() as db:
            return await inbox.insert(
                db,
                update_id=update_id,
                chat_id=chat_id,
                user_id=user_id,
                kind=kind,
                payload=payload,
                status=status,
            )

    async def active_session(self, chat_id: int, user_id: int | None = None) -> SessionRow:
        """The chat's active conversation, started now if there is none."""
        async with self.sessionmaker.begin() as db:
            return await self._active_or_new(db, chat_id, user_id)

    async def active_session_id(self, chat_id: int) -> int | None:
        """The id of the chat's active conversation, without starting one."""
        async with self.sessionmaker() as db:
            active = await conversations.get_active_session(db, chat_id)
            return active.id if active else None

    async def current_persona(self, chat_id: int) -> str:
        """The persona the next reply of this chat will use."""
        async with self.sessionmaker() as db:
            active = await conversations.get_active_session(db, chat_id)
            return active.persona if active else await conversations.latest_persona(db, chat_id)

    async def load_context(self, session_id: int, tail: int | None) -> ConversationContext:
        """A conversation's persona and its last `tail` messages (all if None)."""
        async with self.sessionmaker() as db:
            s = await db.get(Session, session_id)
            if s is None:
                raise LookupError(f"session {session_id} does not exist")
            messages = await conversations.tail_messages(db, session_id, tail)
            return ConversationContext(session_id, s.chat_id, s.persona, messages)

    async def set_persona(
        self,
        chat_id: int,
        user_id: int | None,
        persona: str,
        *,
        notice: str,
        update_id: int | None = None,
    ) -> SessionRow:
        """Set (or clear, with '') the persona of the chat's conversation and confirm it."""
        async with self.sessionmaker.begin() as db:
            session = await self._active_or_new(db, chat_id, user_id)
            await conversations.set_session_persona(db, session.id, persona)
            await _answer(db, chat_id, notice, update_id)
            return session

    async def end_session(
        self, chat_id: int, *, notice: str, update_id: int | None = None
    ) -> SessionRow | None:
        """End the chat's conversation (history kept for admins) and confirm it."""
        async with self.sessionmaker.begin() as db:
            session = await conversations.get_active_session(db, chat_id)
            if session is not None:
                await conversations.end_session(db, session.id)
            await _answer(db, chat_id, notice, update_id)
            return session

    async def forget_chat(
        self, chat_id: int, *, notice: str | None = None, update_id: int | None = None
    ) -> int:
        """Delete everything stored for a chat; with a notice, queue only that confirmation.

        The /forget update's own inbox row is kept without chat id or payload, so that a
        redelivery of it is still recognised as a duplicate.
        """
        async with self.sessionmaker.begin() as db:
            deleted = await conversations.delete_chat(db, chat_id, keep_after_update_id=update_id)
            if update_id is not None:
                await inbox.insert(
                    db,
                    update_id=update_id,
                    chat_id=None,
                    user_id=None,
                    kind="forget",
                    payload="{}",
                    status=InboxStatus.DONE,
                )
            if notice is not None:
                # Not _answer: the update is closed already (the row inserted just above).
                await outbox.enqueue(
                    db, chat_id=chat_id, kind=OutboxKind.NOTICE, text=notice, update_id=update_id
                )
            return deleted

    async def notice(
        self,
        chat_id: int,
        text: str,
        *,
        update_id: int | None = None,
        inbox_status: InboxStatus = InboxStatus.DONE,
    ) -> int:
        """Queue a notice for a chat and close its update; returns the outbox id."""
        async with self.sessionmaker.begin() as db:
            outbox_id = await _answer(db, chat_id, text, update_id, inbox_status)
            assert outbox_id is not None
            return outbox_id

    async def pending_outbox(self, chat_id: int | None = None) -> list[outbox.OutboxRow]:
        """Texts waiting to be sent, oldest first."""
        async with self.sessionmaker() as db:
            return await outbox.pending(db, chat_id)

    async def mark_sent(self, outbox_id: int, telegram_message_id: int | None = None) -> None:
        """Record that a queued text went out (and its bot message was delivered)."""
        async with self.sessionmaker.begin() as db:
            await outbox.sent(db, outbox_id, telegram_message_id)

    async def finish_update(
        self, update_id: int, status: InboxStatus = InboxStatus.DONE, error: str | None = None
    ) -> None:
        """Close an update that needs no reply."""
        async with self.sessionmaker.begin() as db:
            await inbox.finish(db, update_id, status=status, error=error)

    async def record_user_message(
        self,
        session_id: int,
        chat_id: int,
        text: str,
        *,
        update_id: int | None = None,
        telegram_message_id: int | None = None,
        notice: str | None = None,
    ) -> int:
        """Store a user message that gets no model reply (flood-limited, or the model failed)."""
        async with self.sessionmaker.begin() as db:
            message_id = await _user_message(
                db, session_id, chat_id, text, update_id, telegram_message_id
            )
            await _answer(db, chat_id, notice, update_id)
            return message_id

    async def record_turn(
        self,
        session_id: int,
        chat_id: int,
        user_text: str,
        reply: str,
        *,
        latency_ms: float | None = None,
        update_id: int | None = None,
        telegram_message_id: int | None = None,
    ) -> StoredTurn:
        """Store a user message, the bot's reply (queued for sending) and close the update."""
        async with self.sessionmaker.begin() as db:
            user_id = await _user_message(
                db, session_id, chat_id, user_text, update_id, telegram_message_id
            )
            bot_id = await conversations.add_message(
                db,
                session_id=session_id,
                chat_id=chat_id,
                role=Role.BOT,
                text=reply,
                latency_ms=latency_ms,
            )
            await conversations.touch_session(db, session_id)
            outbox_id = await outbox.enqueue(
                db,
                chat_id=chat_id,
                kind=OutboxKind.REPLY,
                text=reply,
                message_id=bot_id,
                update_id=update_id,
                reply_to_message_id=telegram_message_id,
            )
            await _answer(db, chat_id, None, update_id)
            return StoredTurn(user_id, bot_id, outbox_id)
