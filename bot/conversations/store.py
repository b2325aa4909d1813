"""The conversation store: the transactions of the use cases (bot/conversations/usecases.py),
each one of them, and the engine's view of the conversations (load_context, the chat's variant).

A use case's own one-repository transaction needs no method here: it calls the repositories
(bot/db) inside `store.write()` (or reads inside `store.read()`), closing its update with
`answer` in the same transaction."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import arena, assignments, conversations, feedback, inbox, outbox
from bot.db.arena import Decided
from bot.db.assignments import Choice
from bot.db.conversations import NO_FACTS, ReplyFacts, SessionRow
from bot.db.feedback import Outcome
from bot.db.inbox import UpdateRef
from bot.db.models import AssignmentSource, InboxStatus, OutboxKind, Role, Session, VoteSource
from bot.engine.protocol import ConversationContext


@dataclass(frozen=True, slots=True)
class EditTarget:
    """The last turn of a chat, when the user edits its message: what to regenerate."""

    session: SessionRow
    user_message_id: int
    # The edited message's Telegram id (the regenerated reply answers it).
    user_telegram_message_id: int
    bot_message_id: int
    # The conversation's newest message before this turn (None: the turn was the first).
    previous_message_id: int | None


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """The rows one turn wrote."""

    user_message_id: int
    bot_message_id: int
    outbox_id: int


def _id(update: UpdateRef | None) -> int | None:
    return update.update_id if update is not None else None


async def answer(
    db: AsyncSession,
    chat_id: int,
    notice: str | None,
    update: UpdateRef | None,
    status: InboxStatus = InboxStatus.DONE,
    markup: str | None = None,
) -> int | None:
    """Queue `notice` (if any, with an inline keyboard as JSON) for the chat and close its
    update (if any), in `db`'s transaction; returns the outbox id."""
    outbox_id = None
    if notice is not None:
        outbox_id = await outbox.enqueue(
            db,
            chat_id=chat_id,
            kind=OutboxKind.NOTICE,
            text=notice,
            update_id=_id(update),
            markup=markup,
        )
    if update is not None:
        await inbox.finish(db, update, status=status)
    return outbox_id


async def _user_message(
    db: AsyncSession,
    session_id: int,
    chat_id: int,
    text: str,
    update: UpdateRef | None,
    telegram_message_id: int | None,
) -> int:
    return await conversations.add_message(
        db,
        session_id=session_id,
        chat_id=chat_id,
        role=Role.USER,
        text=text,
        update_id=_id(update),
        telegram_message_id=telegram_message_id,
    )


async def _bot_reply(
    db: AsyncSession,
    session_id: int,
    chat_id: int,
    reply: str,
    update: UpdateRef | None,
    *,
    reply_to_message_id: int | None = None,
    edit_message_id: int | None = None,
    facts: ReplyFacts = NO_FACTS,
) -> tuple[int, int]:
    """The bot's reply as a message (with its `facts`: latency, variant, safety marks),
    queued for sending, and the update closed; returns (message id, outbox id)."""
    bot_id = await conversations.add_message(
        db, session_id=session_id, chat_id=chat_id, role=Role.BOT, text=reply, facts=facts
    )
    await conversations.touch_session(db, session_id)
    outbox_id = await outbox.enqueue(
        db,
        chat_id=chat_id,
        kind=OutboxKind.REPLY,
        text=reply,
        message_id=bot_id,
        update_id=_id(update),
        reply_to_message_id=reply_to_message_id,
        edit_message_id=edit_message_id,
    )
    await answer(db, chat_id, None, update)
    return bot_id, outbox_id


class ConversationStore:
    """The conversation store; the only code that opens transactions for user actions."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        self.sessionmaker = sessionmaker

    def read(self) -> AsyncSession:
        """A session that reads (`async with store.read() as db:`), committing nothing."""
        return self.sessionmaker()

    def write(self) -> AbstractAsyncContextManager[AsyncSession]:
        """One transaction (`async with store.write() as db:`), committed when the block ends;
        a use case's repository calls (bot/db) inside it, with `answer` closing the update."""
        return self.sessionmaker.begin()

    async def _active_or_new(
        self, db: AsyncSession, chat_id: int, user_id: int | None
    ) -> SessionRow:
        current = await conversations.get_active_session(db, chat_id)
        if current is not None:
            return current
        # A new conversation keeps the persona of the previous one.
        persona = await conversations.latest_persona(db, chat_id)
        return await conversations.create_session(db, chat_id, user_id, persona)

    async def active_session(self, chat_id: int, user_id: int | None = None) -> SessionRow:
        """The chat's active conversation, started now if there is none."""
        async with self.sessionmaker.begin() as db:
            return await self._active_or_new(db, chat_id, user_id)

    async def load_context(
        self, session_id: int, tail: int | None, upto: int | None = None
    ) -> ConversationContext:
        """A conversation's persona and its last `tail` messages (all if None) up to message id
        `upto` (0: none; None: up to the newest)."""
        async with self.sessionmaker() as db:
            s = await db.get(Session, session_id)
            if s is None:
                raise LookupError(f"session {session_id} does not exist")
            messages = await conversations.tail_messages(db, session_id, tail, upto)
            return ConversationContext(session_id, s.chat_id, s.persona, messages)

    async def set_persona(
        self,
        chat_id: int,
        user_id: int | None,
        persona: str,
        *,
        notice: str,
        update: UpdateRef | None = None,
        safety: str | None = None,
    ) -> SessionRow:
        """Set (or clear, with '') the persona of the chat's conversation and confirm it;
        `safety` marks it (SAFETY=flag)."""
        async with self.sessionmaker.begin() as db:
            session = await self._active_or_new(db, chat_id, user_id)
            await conversations.set_session_persona(db, session.id, persona, safety)
            await answer(db, chat_id, notice, update)
            return session

    async def end_session(
        self,
        chat_id: int,
        *,
        notice: str,
        update: UpdateRef | None = None,
        rating_prompt: str | None = None,
        rating_markup: Callable[[int], str] | None = None,
    ) -> SessionRow | None:
        """End the chat's conversation (history kept for admins) and confirm it; with
        `rating_markup` (session id -> keyboard JSON), an ended conversation that had replies
        gets `rating_prompt` with that keyboard as well."""
        async with self.sessionmaker.begin() as db:
            session = await conversations.get_active_session(db, chat_id)
            if session is not None:
                await conversations.end_session(db, session.id)
            await answer(db, chat_id, notice, update)
            if (
                session is not None
                and session.last_message_id is not None
                and rating_prompt is not None
                and rating_markup is not None
            ):
                await answer(db, chat_id, rating_prompt, None, markup=rating_markup(session.id))
            return session

    async def forget_chat(
        self, chat_id: int, *, notice: str | None = None, update: UpdateRef | None = None
    ) -> int:
        """Delete everything stored for a chat; with a notice, queue only that confirmation.

        The /forget update's own inbox row is kept without chat id or payload, so that a
        redelivery of it is still recognised as a duplicate.
        """
        async with self.sessionmaker.begin() as db:
            deleted = await conversations.delete_chat(db, chat_id, keep_after_update_id=_id(update))
            if update is not None:
                await inbox.insert(
                    db,
                    update_id=update.update_id,
                    chat_id=None,
                    user_id=None,
                    kind="forget",
                    payload="{}",
                    status=InboxStatus.DONE,
                )
            if notice is not None:
                # Not answer: the update is closed already (the row inserted just above).
                await outbox.enqueue(
                    db, chat_id=chat_id, kind=OutboxKind.NOTICE, text=notice, update_id=_id(update)
                )
            return deleted

    async def notice(
        self,
        chat_id: int,
        text: str,
        *,
        update: UpdateRef | None = None,
        inbox_status: InboxStatus = InboxStatus.DONE,
    ) -> int:
        """Queue a notice for a chat and close its update; returns the outbox id."""
        async with self.sessionmaker.begin() as db:
            outbox_id = await answer(db, chat_id, text, update, inbox_status)
            assert outbox_id is not None
            return outbox_id

    async def record_user_message(
        self,
        session_id: int,
        chat_id: int,
        text: str,
        *,
        update: UpdateRef | None = None,
        telegram_message_id: int | None = None,
        notice: str | None = None,
    ) -> int:
        """Store a user message that gets no model reply (flood-limited, or the model failed)."""
        async with self.sessionmaker.begin() as db:
            message_id = await _user_message(
                db, session_id, chat_id, text, update, telegram_message_id
            )
            await answer(db, chat_id, notice, update)
            return message_id

    async def record_turn(
        self,
        session_id: int,
        chat_id: int,
        user_text: str,
        reply: str,
        *,
        update: UpdateRef | None = None,
        telegram_message_id: int | None = None,
        facts: ReplyFacts = NO_FACTS,
    ) -> StoredTurn:
        """Store a user message, the bot's reply (queued for sending) and close the update."""
        async with self.sessionmaker.begin() as db:
            user_id = await _user_message(
                db, session_id, chat_id, user_text, update, telegram_message_id
            )
            bot_id, outbox_id = await _bot_reply(
                db,
                session_id,
                chat_id,
                reply,
                update,
                reply_to_message_id=telegram_message_id,
                facts=facts,
            )
            return StoredTurn(user_id, bot_id, outbox_id)

    # --- edits ------------------------------------------------------------------------------

    async def edit_target(self, chat_id: int, telegram_message_id: int) -> EditTarget | None:
        """The chat's last turn if the user's message `telegram_message_id` started it: that
        message, then the bot's reply, the two newest messages of the active conversation,
        whether the reply was delivered yet or not (replace_turn sees to either)."""
        async with self.sessionmaker() as db:
            session = await conversations.get_active_session(db, chat_id)
            if session is None:
                return None
            rows = await conversations.newest_messages(db, session.id, 3)
            if len(rows) < 2:
                return None
            bot, user = rows[0], rows[1]
            if bot.role != Role.BOT or user.role != Role.USER:
                return None
            if user.telegram_message_id != telegram_message_id:
                return None
            previous = rows[2].id if len(rows) > 2 else None
            return EditTarget(session, user.id, telegram_message_id, bot.id, previous)

    async def replace_turn(
        self,
        target: EditTarget,
        user_text: str,
        reply: str,
        *,
        update: UpdateRef | None = None,
        facts: ReplyFacts = NO_FACTS,
    ) -> StoredTurn:
        """The edited message and its regenerated reply in place of the old turn: the user's
        message keeps its id with the new text, the old reply (and its votes) goes, the new
        one is queued as an edit of the old reply's Telegram message, or sent if the old one
        has not gone out (then it never will; one on its way is edited once it is out, see
        outbox.withdrawn_reply_went_out). One transaction, closing the edit's update."""
        session = target.session
        async with self.sessionmaker.begin() as db:
            # Withdrawn first, so that a delivery just committing it as sent is read below.
            to_edit = await outbox.withdraw(db, target.bot_message_id)
            shown = await conversations.telegram_message_id(db, target.bot_message_id)
            await conversations.set_message_text(db, target.user_message_id, user_text)
            await conversations.delete_message(db, target.bot_message_id)
            bot_id, outbox_id = await _bot_reply(
                db,
                session.id,
                session.chat_id,
                reply,
                update,
                reply_to_message_id=target.user_telegram_message_id,
                edit_message_id=shown if shown is not None else to_edit,
                facts=facts,
            )
            return StoredTurn(target.user_message_id, bot_id, outbox_id)

    # --- variants --------------------------------------------------------------------------

    async def variant_of(self, chat_id: int) -> str | None:
        """The chat's stored variant (None before its first turn)."""
        async with self.sessionmaker() as db:
            return await assignments.variant_of(db, chat_id)

    async def assign_variant(self, chat_id: int, choice: Choice) -> str:
        """The chat's variant: the stored one, else `choice`'s, stored now (its first turn)."""
        async with self.sessionmaker.begin() as db:
            return await assignments.assign_unless_present(db, chat_id, choice)

    async def set_variant(
        self,
        chat_id: int,
        choice: Choice,
        source: AssignmentSource,
        *,
        notice: str | None = None,
        update: UpdateRef | None = None,
    ) -> None:
        """Move a chat to `choice` (by an admin, the user's /model, or the allocation when
        its variant was removed), confirming it with `notice`."""
        async with self.sessionmaker.begin() as db:
            await assignments.set_variant(db, chat_id, choice, source)
            await answer(db, chat_id, notice, update)

    # --- feedback --------------------------------------------------------------------------

    async def vote(
        self,
        chat_id: int,
        user_id: int,
        message_id: int | None,
        value: int,
        *,
        source: VoteSource = VoteSource.BUTTON,
        telegram_message_id: int | None = None,
        update: UpdateRef | None = None,
        notice: str | None = None,
        stale_notice: str | None = None,
    ) -> Outcome:
        """A vote on one of the chat's bot replies, by database id (buttons, /good) or by
        Telegram message id (reactions); closes the update in the same transaction, with
        `notice` queued, or `stale_notice` where there is no such reply to vote on.

        A button's data names the reply; the message it was pressed under must be that reply.
        None for `message_id` means the chat's newest reply (the terminal chat).
        """
        async with self.sessionmaker.begin() as db:
            if message_id is not None:
                reply = await feedback.bot_reply(db, chat_id, message_id)
                if (
                    reply is not None
                    and telegram_message_id is not None
                    and reply.telegram_message_id != telegram_message_id
                ):
                    # The data names another message than the one pressed (or one that never
                    # carried buttons, like an arena pick): forged or stale.
                    reply = None
            elif telegram_message_id is not None:
                reply = await feedback.bot_reply_by_telegram_id(db, chat_id, telegram_message_id)
            else:
                reply = await feedback.latest_bot_reply(db, chat_id)
            if reply is None:
                outcome = Outcome.STALE
            elif value == 0:
                outcome = await feedback.unvote(db, reply, user_id, source)
            else:
                outcome = await feedback.vote(db, reply, user_id, value, source, _id(update))
            stale = outcome is Outcome.STALE
            status = InboxStatus.IGNORED if stale else InboxStatus.DONE
            await answer(db, chat_id, stale_notice if stale else notice, update, status)
            return outcome

    async def rate(
        self,
        chat_id: int,
        user_id: int | None,
        session_id: int | None,
        value: int,
        *,
        update: UpdateRef | None = None,
    ) -> Outcome:
        """The 1-5 rating of a conversation of this chat (None: its latest ended one)."""
        async with self.sessionmaker.begin() as db:
            if session_id is None:
                session_id = await feedback.latest_ended_session(db, chat_id)
            outcome = Outcome.STALE
            if session_id is not None:
                outcome = await feedback.rate(db, chat_id, session_id, user_id, value, _id(update))
            status = InboxStatus.IGNORED if outcome is Outcome.STALE else InboxStatus.DONE
            await answer(db, chat_id, None, update, status)
            return outcome

    # --- arena -----------------------------------------------------------------------------

    async def request_arena(
        self, chat_id: int, user_id: int | None, *, notice: str, update: UpdateRef | None = None
    ) -> int:
        """Mark the chat's next message for a duel of two variants, and say so."""
        async with self.sessionmaker.begin() as db:
            session = await self._active_or_new(db, chat_id, user_id)
            match_id = await arena.request(db, chat_id, session.id)
            await answer(db, chat_id, notice, update)
            return match_id

    async def record_duel(
        self,
        session_id: int,
        chat_id: int,
        match_id: int,
        user_text: str,
        pair: tuple[tuple[str | None, str], tuple[str | None, str]],
        *,
        text: str,
        markup: str | None,
        update: UpdateRef | None = None,
        telegram_message_id: int | None = None,
        persona: str | None = None,
        versions: tuple[int | None, int | None] = (None, None),
    ) -> int:
        """Store the duel's user message (its answer comes when the user picks) and the two
        replies with the persona they were generated with (None: the conversation's now) and
        their variants' identities (None: the current one of the name), queue them as one
        message with the pick buttons, close the update."""
        async with self.sessionmaker.begin() as db:
            user_message_id = await _user_message(
                db, session_id, chat_id, user_text, update, telegram_message_id
            )
            await arena.fill(db, match_id, user_message_id, pair, persona, versions)
            await conversations.touch_session(db, session_id)
            await answer(db, chat_id, text, update, markup=markup)
            return user_message_id

    async def decide_duel(
        self, chat_id: int, match_id: int, winner: str, *, update: UpdateRef | None = None
    ) -> Decided:
        """The user's pick of a duel; closes the update."""
        async with self.sessionmaker.begin() as db:
            decided = await arena.decide(db, chat_id, match_id, winner)
            status = InboxStatus.IGNORED if decided.outcome is Outcome.STALE else InboxStatus.DONE
            await answer(db, chat_id, None, update, status)
            return decided
