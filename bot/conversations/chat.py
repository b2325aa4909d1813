"""The chat use cases: a text turn and its edit, /start and /help, /context, /privacy, /done
and /forget."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from bot.conversations.core import Core, FeatureCommand, clean_text
from bot.conversations.outcome import NO_REPLY, REPLIED
from bot.conversations.personas import Personas
from bot.conversations.store import StoredTurn
from bot.conversations.turn import Turn
from bot.conversations.votes import Votes
from bot.db import conversations
from bot.db.conversations import ReplyFacts, SessionRow
from bot.engine.protocol import GenerationError, Reply
from bot.persona import join_turns, persona_lines
from bot.presets import deep_link_preset

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Kept:
    """A reply past the safety gate: the text to send and its facts (latency, variant,
    safety marks), for the turn's one transaction."""

    text: str
    facts: ReplyFacts


class Chat:
    """The conversation of one chat: its turns, and the commands about the conversation."""

    def __init__(self, core: Core, personas: Personas, votes: Votes) -> None:
        self.core = core
        self.personas = personas  # /start's deep link takes a preset
        self.votes = votes  # the message after /arena is a duel
        settings = core.settings
        # An operator's notice, in whatever language(s) the operator wrote it.
        self.privacy_file_text = (
            settings.privacy_file.read_text(encoding="utf-8").strip()
            if settings.privacy_file is not None
            else None
        )

    async def help(self, turn: Turn, *, start: bool = False, payload: str = "") -> None:
        """/start and /help; `/start persona_NAME` (a deep link) also takes that preset."""
        greeting = turn.texts.GREETING if start else ""
        help_text = turn.texts.help(self.core.settings.bot_model_language)
        name = deep_link_preset(payload.strip()) if start else None
        if name is None:
            await self.core.notice(turn, greeting + help_text)
            return
        presets = self.personas.presets
        preset = presets.get(name)
        if preset is None:
            unknown = turn.texts.preset_unknown(name, presets.names)
            await self.core.notice(turn, greeting + help_text + "\n\n" + unknown)
            return
        notice = greeting + turn.texts.persona_set(preset) + "\n\n" + help_text
        await self.personas.take(turn, preset, notice)

    async def context(self, turn: Turn) -> None:
        """/context: the persona lines and the turns the model reads now, and how many older
        ones were dropped to fit its input."""
        core = self.core
        inspector = core.responder.abilities.inspect
        async with core.store.read() as db:
            session = await conversations.get_active_session(db, turn.chat_id)
        if session is None or session.last_message_id is None:
            await core.notice(turn, turn.texts.CONTEXT_EMPTY)
            return
        if inspector is None:
            await core.notice(turn, turn.texts.CONTEXT_UNAVAILABLE)
            return
        try:
            view = await inspector.inspect(session)
        except GenerationError as err:
            log.warning("/context for chat %s failed: %s", turn.chat_id, err)
            await core.notice(turn, turn.texts.CONTEXT_UNAVAILABLE)
            return
        ctx = await core.store.load_context(session.id, None)
        turns = join_turns([(m.role, m.text) for m in ctx.messages])
        shown = turns[len(turns) - view.visible_turns :] if view.visible_turns else []
        text = turn.texts.context_view(
            persona_lines(session.persona), shown, len(turns) - view.visible_turns
        )
        await core.notice(turn, text)

    async def privacy(self, turn: Turn) -> None:
        """/privacy: what is stored, for how long, who reads it, how to delete it."""
        text = self.privacy_file_text or turn.texts.privacy(self.core.settings.retention_days)
        await self.core.notice(turn, text)

    async def done(self, turn: Turn, *, rating_markup: Callable[[int], str] | None = None) -> None:
        """/done: end the conversation; history stays for admins, the persona carries over.

        With `rating_markup` (a front end's 1-5 keyboard for a session id), a conversation
        that had messages also gets the rating prompt with that keyboard."""
        session = await self.core.store.end_session(
            turn.chat_id,
            notice=turn.texts.ENDED,
            update=turn.update,
            rating_prompt=turn.texts.RATE_PROMPT,
            rating_markup=rating_markup,
        )
        if session is not None:
            self.core.responder.evict(session.id)

    async def forget(self, turn: Turn) -> None:
        """/forget: delete everything stored for this chat."""
        store = self.core.store
        async with store.read() as db:
            active = await conversations.get_active_session(db, turn.chat_id)
        await store.forget_chat(turn.chat_id, notice=turn.texts.FORGOTTEN, update=turn.update)
        if active is not None:
            self.core.responder.evict(active.id)

    # --- turns -----------------------------------------------------------------------------

    async def text(
        self,
        turn: Turn,
        text: str,
        *,
        telegram_message_id: int | None = None,
        arena_markup: Callable[[int], str] | None = None,
    ) -> None:
        """A plain message: one model turn, stored with its reply in one transaction (after
        /arena: two variants' replies, shown with `arena_markup`, a front end's pick buttons
        for a match id)."""
        core = self.core
        text = clean_text(text)
        if not text:
            await core.notice(turn, turn.texts.SAY_SOMETHING)
            return
        if not await core.fits(turn, text):
            return
        session = await core.store.active_session(turn.chat_id, turn.user_id)
        duel = self.votes.duel_responder()
        if session.arena_match_id is not None and duel is not None:
            await self.votes.duel(
                turn, duel, session, text, arena_markup, telegram_message_id=telegram_message_id
            )
            return
        reply = await self._reply_to(turn, session, text, "generation")
        if reply is None:
            # The message is kept without a reply; it joins the next turn.
            await core.unanswered(
                turn, text, notice=turn.texts.NO_REPLY, telegram_message_id=telegram_message_id
            )
            turn.decided(NO_REPLY, session.variant)
            return
        with self._evicting_on_failure(session):
            kept = await self._keep(turn, session, reply)
            stored = await core.store.record_turn(
                session.id,
                turn.chat_id,
                text,
                kept.text,
                update=turn.update,
                telegram_message_id=telegram_message_id,
                facts=kept.facts,
            )
        self._stored(turn, session, reply, stored)

    async def edit(self, turn: Turn, telegram_message_id: int, text: str) -> None:
        """The user edited a message: if it is the one the bot answered last, answer the new
        text instead, whether the old reply is out yet or not (ConversationStore.replace_turn:
        the history keeps only the edited turn); any other edit gets a short notice."""
        core = self.core
        target = await core.store.edit_target(turn.chat_id, telegram_message_id)
        text = clean_text(text)
        if target is None or not text:
            await core.notice(turn, turn.texts.EDITED)
            return
        if not await core.fits(turn, text):
            return
        session = target.session
        # The conversation as it was before the old turn: the clone is rebuilt from there.
        before = replace(session, last_message_id=target.previous_message_id)
        core.responder.evict(session.id)
        reply = await self._reply_to(turn, before, text, "regenerating after an edit")
        if reply is None:
            await core.notice(turn, turn.texts.NO_REPLY)  # the old turn stays as it was
            turn.decided(NO_REPLY, session.variant)
            return
        with self._evicting_on_failure(session):
            kept = await self._keep(turn, session, reply)
            stored = await core.store.replace_turn(
                target, text, kept.text, update=turn.update, facts=kept.facts
            )
        self._stored(turn, session, reply, stored)

    async def _reply_to(
        self, turn: Turn, session: SessionRow, text: str, what: str
    ) -> Reply | None:
        """The responder's reply (drafts to the turn's front end), or None when generation
        failed: logged as `what`, the clone dropped; the caller tells the chat."""
        try:
            return await self.core.responder.respond(session, text, on_draft=turn.draft_sink)
        except GenerationError as err:
            log.warning("%s failed for chat %s: %s", what, turn.chat_id, err)
            self.core.responder.evict(session.id)
            return None

    async def _keep(self, turn: Turn, session: SessionRow, reply: Reply) -> Kept:
        """Pass a reply through the safety gate: what is to be sent, with its latency, variant
        and safety facts; the cached clone is dropped when it heard something other than what
        the database will hold. The drafts are over when it returns: the turn's transaction is
        next (the caller's, inside _evicting_on_failure)."""
        verdict = await self.core.safety.reply(reply.text, reply.candidates)
        if verdict.text != reply.text:
            # The clone heard the reply that is not sent: it is rebuilt from the database.
            self.core.responder.evict(session.id)
        facts = ReplyFacts(
            latency_ms=reply.latency_ms,
            variant=reply.variant,
            variant_version=reply.variant_version,
            model_ms=reply.model_ms,
            safety=verdict.mark,
            unsafe_text=verdict.unsafe_text,
            # The responder answered `session` with its persona (ResponderProtocol).
            persona=session.persona,
            # What the model said, when that is what is sent (else nothing heard it).
            model_text=reply.model_text if verdict.text == reply.text else None,
        )
        await turn.end_drafts()
        return Kept(verdict.text, facts)

    @contextlib.contextmanager
    def _evicting_on_failure(self, session: SessionRow) -> Iterator[None]:
        """While the reply is checked and stored: the clone already heard this turn, so if
        the database does not keep it (anything raised, cancellation included), it goes."""
        try:
            yield
        except BaseException:
            self.core.responder.evict(session.id)
            raise

    def _stored(self, turn: Turn, session: SessionRow, reply: Reply, stored: StoredTurn) -> None:
        """The turn is committed: the clone's history now ends with the stored reply."""
        self.core.responder.turn_stored(session.id, stored.bot_message_id)
        turn.decided(REPLIED, reply.variant, [reply])


# The commands of the table (bot/commands.py) this feature runs.
COMMANDS: dict[str, FeatureCommand[Chat]] = {
    "start": lambda chat, turn, call: chat.help(turn, start=True, payload=call.argument),
    "help": lambda chat, turn, call: chat.help(turn),
    "done": lambda chat, turn, call: chat.done(turn, rating_markup=call.rating_markup),
    "forget": lambda chat, turn, call: chat.forget(turn),
    "context": lambda chat, turn, call: chat.context(turn),
    "privacy": lambda chat, turn, call: chat.privacy(turn),
}
