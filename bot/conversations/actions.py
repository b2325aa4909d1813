"""The conversation use cases every front end shares (Telegram handlers, terminal chat).

Every outcome is written to the outbox in the same transaction that changes the conversation;
front ends only deliver what the outbox holds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from bot import texts
from bot.config import Settings
from bot.conversations.outcome import ARENA, FLOODED, NO_REPLY, REPLIED
from bot.conversations.store import ConversationStore, StoredTurn
from bot.conversations.turn import CommandCall, Turn
from bot.db.assignments import Choice
from bot.db.conversations import ReplyFacts, SessionRow
from bot.db.feedback import Outcome
from bot.db.models import AssignmentSource, VoteSource
from bot.engine.protocol import DuelResponder, GenerationError, Reply, ResponderProtocol
from bot.persona import join_turns, persona_lines
from bot.presets import deep_link_preset, load_presets
from bot.safety import SafetyGate, SafetyMark, Verdict
from bot.texts import Texts

if TYPE_CHECKING:
    from bot.engine.variants import Experiment

log = logging.getLogger(__name__)

PERSONA_CLEAR_WORDS = {"-", "clear", "none", "off", "reset"}


def storable(text: str) -> str:
    """The text without U+0000, which PostgreSQL cannot store in a text column.

    No Telegram client sends it on purpose; it is dropped on both backends alike, so a
    conversation reads the same wherever it is stored. Every other character is kept.
    """
    return text.replace("\x00", "")


def clean_text(text: str) -> str:
    """Drop U+0000 and strip surrounding whitespace; inner text is kept verbatim."""
    return storable(text).strip()


class ChatActions:
    """User actions of one chat, each ending in exactly one transaction."""

    def __init__(
        self,
        store: ConversationStore,
        responder: ResponderProtocol,
        settings: Settings,
    ) -> None:
        self.store = store
        self.responder = responder
        self.settings = settings
        self.safety = SafetyGate(
            settings.safety,
            settings.safety_threshold,
            # It stands in for a model reply and the model reads it back: the model's language.
            deflection=texts.for_language(settings.bot_model_language).DEFLECTION,
        )
        self.presets = load_presets(settings.personas_file, settings.persona_max_chars)
        # An operator's notice, in whatever language(s) the operator wrote it.
        self.privacy_file_text = (
            settings.privacy_file.read_text(encoding="utf-8").strip()
            if settings.privacy_file is not None
            else None
        )

    @property
    def experiment(self) -> Experiment | None:
        """The variants served now (for /model): the responder's own, which follow the
        database's changes; None when the responder has no variants."""
        variants = self.responder.abilities.variants
        return variants.experiment if variants is not None else None

    async def notice(self, turn: Turn, text: str) -> None:
        """Send a short message that is not part of the conversation, and close the update."""
        await turn.end_drafts()
        await self.store.notice(turn.chat_id, text, update=turn.update)

    async def help(self, turn: Turn, *, start: bool = False, payload: str = "") -> None:
        """/start and /help; `/start persona_NAME` (a deep link) also takes that preset."""
        greeting = turn.texts.GREETING if start else ""
        help_text = turn.texts.help(self.settings.bot_model_language)
        name = deep_link_preset(payload.strip()) if start else None
        if name is None:
            await self.notice(turn, greeting + help_text)
            return
        preset = self.presets.get(name)
        if preset is None:
            await self.notice(
                turn,
                greeting + help_text + "\n\n" + turn.texts.preset_unknown(name, self.presets.names),
            )
            return
        session = await self.store.set_persona(
            turn.chat_id,
            turn.user_id,
            preset,
            notice=greeting + turn.texts.persona_set(preset) + "\n\n" + help_text,
            update=turn.update,
        )
        self.responder.set_persona(session.id, preset)

    async def context(self, turn: Turn) -> None:
        """/context: the persona lines and the turns the model reads now, and how many older
        ones were dropped to fit its input."""
        inspector = self.responder.abilities.inspect
        session = await self.store.active_session_row(turn.chat_id)
        if session is None or session.last_message_id is None:
            await self.notice(turn, turn.texts.CONTEXT_EMPTY)
            return
        if inspector is None:
            await self.notice(turn, turn.texts.CONTEXT_UNAVAILABLE)
            return
        try:
            view = await inspector.inspect(session)
        except GenerationError as err:
            log.warning("/context for chat %s failed: %s", turn.chat_id, err)
            await self.notice(turn, turn.texts.CONTEXT_UNAVAILABLE)
            return
        ctx = await self.store.load_context(session.id, None)
        turns = join_turns([(m.role, m.text) for m in ctx.messages])
        shown = turns[len(turns) - view.visible_turns :] if view.visible_turns else []
        text = turn.texts.context_view(
            persona_lines(session.persona), shown, len(turns) - view.visible_turns
        )
        await self.notice(turn, text)

    async def privacy(self, turn: Turn) -> None:
        """/privacy: what is stored, for how long, who reads it, how to delete it."""
        text = self.privacy_file_text or turn.texts.privacy(self.settings.retention_days)
        await self.notice(turn, text)

    async def command(self, turn: Turn, call: CommandCall) -> None:
        """Run a command of the table (bot/commands.py) by its use case (USE_CASES)."""
        await USE_CASES[call.name](self, turn, call)

    async def persona(self, turn: Turn, argument: str) -> None:
        """/persona shows, /persona <text> sets, /persona clear clears."""
        if argument.strip():
            await self.set_persona(turn, argument)
        else:
            await self.show_persona(turn)

    async def show_persona(self, turn: Turn) -> None:
        """/persona without text."""
        persona = await self.store.current_persona(turn.chat_id)
        text = (
            turn.texts.persona_shown(persona)
            if persona
            else turn.texts.no_persona(self.settings.bot_model_language)
        )
        await self.notice(turn, text)

    async def set_persona(self, turn: Turn, text: str) -> None:
        """/persona <text>: set it (or clear it with a clear word); `/persona list` shows the
        presets, `/persona use NAME` takes one."""
        word, _, rest = text.strip().partition(" ")
        if word.lower() == "list" and not rest.strip():
            listing = (
                turn.texts.presets_list(self.presets.personas) if self.presets.personas else None
            )
            await self.notice(turn, listing or turn.texts.NO_PRESETS)
            return
        if word.lower() == "use" and rest.strip():
            preset = self.presets.get(rest)
            if preset is None:
                unknown = turn.texts.preset_unknown(rest.strip(), self.presets.names)
                await self.notice(turn, unknown)
                return
            text = preset
        persona = clean_text(text)
        if not persona and text.strip():
            await self.notice(turn, turn.texts.PERSONA_EMPTY)
            return
        if persona.lower() in PERSONA_CLEAR_WORDS:
            persona = ""
        limit = self.settings.persona_max_chars
        if len(persona) > limit:
            await self.notice(turn, turn.texts.persona_too_long(len(persona), limit))
            return
        offensive = await self.safety.persona(persona)
        if offensive and self.safety.mode == "block":
            log.info("chat %s: refused an offensive persona", turn.chat_id)
            await self.notice(turn, turn.texts.PERSONA_REFUSED)
            return
        notice = turn.texts.persona_set(persona) if persona else turn.texts.PERSONA_CLEARED
        session = await self.store.set_persona(
            turn.chat_id,
            turn.user_id,
            persona,
            notice=notice,
            update=turn.update,
            safety=SafetyMark.FLAGGED if offensive else None,
        )
        self.responder.set_persona(session.id, persona)

    async def done(self, turn: Turn, *, rating_markup: Callable[[int], str] | None = None) -> None:
        """/done: end the conversation; history stays for admins, the persona carries over.

        With `rating_markup` (a front end's 1-5 keyboard for a session id), a conversation
        that had messages also gets the rating prompt with that keyboard."""
        session = await self.store.end_session(
            turn.chat_id,
            notice=turn.texts.ENDED,
            update=turn.update,
            rating_prompt=turn.texts.RATE_PROMPT,
            rating_markup=rating_markup,
        )
        if session is not None:
            self.responder.evict(session.id)

    async def forget(self, turn: Turn) -> None:
        """/forget: delete everything stored for this chat."""
        active = await self.store.active_session_id(turn.chat_id)
        await self.store.forget_chat(
            turn.chat_id,
            notice=turn.texts.FORGOTTEN,
            update=turn.update,
        )
        if active is not None:
            self.responder.evict(active)

    async def unanswered(
        self,
        turn: Turn,
        text: str,
        *,
        notice: str | None,
        telegram_message_id: int | None = None,
    ) -> None:
        """Keep a user message without a model reply (flood limit); it joins the next turn."""
        await turn.end_drafts()
        text = storable(text)
        session = await self.store.active_session(turn.chat_id, turn.user_id)
        await self.store.record_user_message(
            session.id,
            turn.chat_id,
            text,
            update=turn.update,
            telegram_message_id=telegram_message_id,
            notice=notice,
        )
        # The cached clone has not seen this message; rebuilding it from the database will.
        self.responder.evict(session.id)
        turn.decided(FLOODED)

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
        text = clean_text(text)
        if not text:
            await self.notice(turn, turn.texts.SAY_SOMETHING)
            return
        if not await self._fits(turn, text):
            return
        session = await self.store.active_session(turn.chat_id, turn.user_id)
        duel = self._duel_responder()
        if session.arena_match_id is not None and duel is not None:
            await self._duel(
                turn, duel, session, text, arena_markup, telegram_message_id=telegram_message_id
            )
            return
        reply = await self._reply_to(turn, session, text, "generation")
        await self._keep(
            turn,
            session,
            reply,
            store=lambda verdict, facts: self.store.record_turn(
                session.id,
                turn.chat_id,
                text,
                verdict.text,
                update=turn.update,
                telegram_message_id=telegram_message_id,
                facts=facts,
            ),
            # The message is kept without a reply; it joins the next turn.
            failed=lambda: self.unanswered(
                turn, text, notice=turn.texts.NO_REPLY, telegram_message_id=telegram_message_id
            ),
        )

    async def _reply_to(
        self, turn: Turn, session: SessionRow, text: str, what: str
    ) -> Reply | None:
        """The responder's reply (drafts to the turn's front end), or None when generation
        failed: logged as `what`, the clone dropped; the caller tells the chat."""
        try:
            return await self.responder.respond(session, text, on_draft=turn.draft_sink)
        except GenerationError as err:
            log.warning("%s failed for chat %s: %s", what, turn.chat_id, err)
            self.responder.evict(session.id)
            return None

    async def _fits(self, turn: Turn, text: str) -> bool:
        """Whether a message is within MESSAGE_MAX_CHARS; one that is not gets the notice."""
        limit = self.settings.message_max_chars
        if len(text) <= limit:
            return True
        await self.notice(turn, turn.texts.message_too_long(len(text), limit))
        return False

    async def _keep(
        self,
        turn: Turn,
        session: SessionRow,
        reply: Reply | None,
        *,
        store: Callable[[Verdict, ReplyFacts], Awaitable[StoredTurn]],
        failed: Callable[[], Awaitable[None]],
    ) -> None:
        """Pass a reply through the safety gate and `store` what is to be sent (with its
        latency, variant and safety facts), keeping the cached clone in step: it is dropped
        when it heard something other than what the database now holds. No reply (generation
        failed, see _reply_to): `failed` tells the chat, and the turn is NO_REPLY."""
        if reply is None:
            await failed()
            turn.decided(NO_REPLY, session.variant)
            return
        try:
            verdict = await self.safety.reply(reply.text, reply.candidates)
            if verdict.text != reply.text:
                # The clone heard the reply that is not sent: it is rebuilt from the database.
                self.responder.evict(session.id)
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
            stored = await store(verdict, facts)
        except BaseException:
            # The clone already heard this turn but the database did not keep it.
            self.responder.evict(session.id)
            raise
        self.responder.turn_stored(session.id, stored.bot_message_id)
        turn.decided(REPLIED, reply.variant, [reply])

    # --- edits -----------------------------------------------------------------------------

    async def edit(self, turn: Turn, telegram_message_id: int, text: str) -> None:
        """The user edited a message: if it is the one the bot answered last, answer the new
        text instead, whether the old reply is out yet or not (ConversationStore.replace_turn:
        the history keeps only the edited turn); any other edit gets a short notice."""
        target = await self.store.edit_target(turn.chat_id, telegram_message_id)
        text = clean_text(text)
        if target is None or not text:
            await self.notice(turn, turn.texts.EDITED)
            return
        if not await self._fits(turn, text):
            return
        session = target.session
        # The conversation as it was before the old turn: the clone is rebuilt from there.
        before = replace(session, last_message_id=target.previous_message_id)
        self.responder.evict(session.id)
        reply = await self._reply_to(turn, before, text, "regenerating after an edit")
        await self._keep(
            turn,
            session,
            reply,
            store=lambda verdict, facts: self.store.replace_turn(
                target, text, verdict.text, update=turn.update, facts=facts
            ),
            # The old turn stays as it was.
            failed=lambda: self.notice(turn, turn.texts.NO_REPLY),
        )

    # --- the chat's language ----------------------------------------------------------------

    async def texts_for(self, chat_id: int, sender_language: str | None) -> Texts:
        """The texts an update of this chat is answered in: the chat's /lang setting, else
        the sender's Telegram language (`language_code`), else English."""
        stored = await self.store.chat_language(chat_id)
        return texts.for_language(texts.choose(stored, sender_language))

    async def language(self, turn: Turn, argument: str, *, sender_language: str | None) -> None:
        """/lang shows the chat's language and the choices, /lang CODE sets it for the chat,
        /lang auto goes back to each sender's Telegram language."""
        word = argument.strip()
        if not word:
            chosen = await self.store.chat_language(turn.chat_id) is not None
            await self.notice(turn, turn.texts.language_shown(chosen))
            return
        if word.lower() == "auto":
            now = texts.for_language(texts.choose(None, sender_language))
            await self.store.set_language(
                turn.chat_id, None, notice=now.language_auto(), update=turn.update
            )
            return
        language = texts.normalize(word)
        if language is None:
            await self.notice(turn, turn.texts.language_unknown(word))
            return
        # The confirmation is the first sentence in the language just chosen.
        chosen_texts = texts.for_language(language)
        await self.store.set_language(
            turn.chat_id, language, notice=chosen_texts.language_set(), update=turn.update
        )

    # --- feedback and variants -------------------------------------------------------------

    async def vote(
        self,
        turn: Turn,
        user_id: int,
        message_id: int | None,
        value: int,
        *,
        source: VoteSource = VoteSource.BUTTON,
        telegram_message_id: int | None = None,
        answer_in_chat: bool = False,
    ) -> Outcome:
        """👍 (+1) or 👎 (-1) on a bot reply; 0 takes a reaction back. `answer_in_chat` (the
        terminal) queues the answer as a notice, thanks or that there is nothing to rate, but
        not both; Telegram answers the button press instead."""
        notice = stale_notice = None
        if answer_in_chat:
            notice = turn.texts.VOTED_UP if value > 0 else turn.texts.VOTED_DOWN
            stale_notice = turn.texts.NOTHING_TO_VOTE_ON
        return await self.store.vote(
            turn.chat_id,
            user_id,
            message_id,
            value,
            source=source,
            telegram_message_id=telegram_message_id,
            update=turn.update,
            notice=notice,
            stale_notice=stale_notice,
        )

    async def rate(
        self, turn: Turn, session_id: int | None, value: int, *, answer_in_chat: bool = False
    ) -> Outcome:
        """The 1-5 rating of a conversation (None: the chat's latest ended one)."""
        outcome = await self.store.rate(
            turn.chat_id, turn.user_id, session_id, value, update=turn.update
        )
        if answer_in_chat:
            answer = rating_answer(outcome, value, turn.texts, terminal=True)
            await self.store.notice(turn.chat_id, answer)  # the update is closed already
        return outcome

    async def choose_variant(self, turn: Turn, name: str) -> None:
        """/model: list the variants, or move this chat to one (where the operator allows)."""
        experiment = self.experiment
        if experiment is None or not self.settings.allow_model_choice:
            await self.notice(turn, turn.texts.not_enabled("model"))
            return
        names = experiment.names
        name = name.strip()
        if not name:
            session = await self.store.active_session_row(turn.chat_id)
            current = session.variant if session is not None else None
            await self.notice(turn, turn.texts.variants_list(names, current))
            return
        if name not in names:
            await self.notice(turn, turn.texts.variant_unknown(name, names))
            return
        await self.store.set_variant(
            turn.chat_id,
            Choice(experiment.name, name),
            AssignmentSource.USER,
            notice=turn.texts.variant_chosen(name),
            update=turn.update,
        )

    # --- arena ---------------------------------------------------------------------------

    def _duel_responder(self) -> DuelResponder | None:
        """The responder's /arena, where it is on and has two variants to draw."""
        duel = self.responder.abilities.duel
        if not self.settings.arena or duel is None or len(duel.duelists) < 2:
            return None
        return duel

    async def arena(self, turn: Turn) -> None:
        """/arena: the next message gets two variants' replies to choose from."""
        if self._duel_responder() is None:
            await self.notice(turn, turn.texts.not_enabled("arena"))
            return
        await self.store.request_arena(
            turn.chat_id, turn.user_id, notice=turn.texts.ARENA_READY, update=turn.update
        )

    async def _duel(
        self,
        turn: Turn,
        duel: DuelResponder,
        session: SessionRow,
        text: str,
        markup: Callable[[int], str] | None,
        *,
        telegram_message_id: int | None,
    ) -> None:
        assert session.arena_match_id is not None
        try:
            a, b = await duel.duel(session, text)
        except GenerationError as err:
            log.warning("arena generation failed for chat %s: %s", session.chat_id, err)
            await self.unanswered(
                turn, text, notice=turn.texts.NO_REPLY, telegram_message_id=telegram_message_id
            )
            turn.decided(NO_REPLY, session.variant)
            return
        shown_a = (await self.safety.reply(a.text, a.candidates)).text
        shown_b = (await self.safety.reply(b.text, b.candidates)).text
        await turn.end_drafts()
        await self.store.record_duel(
            session.id,
            session.chat_id,
            session.arena_match_id,
            text,
            ((a.variant, shown_a), (b.variant, shown_b)),
            text=turn.texts.arena_duel(shown_a, shown_b),
            markup=markup(session.arena_match_id) if markup else None,
            update=turn.update,
            telegram_message_id=telegram_message_id,
            persona=session.persona,
            versions=(a.variant_version, b.variant_version),
        )
        turn.decided(ARENA, None, [a, b])

    async def arena_pick(self, turn: Turn, match_id: int, winner: str) -> Outcome:
        """The pick of a duel: the chosen reply joins the conversation."""
        decided = await self.store.decide_duel(turn.chat_id, match_id, winner, update=turn.update)
        if decided.session_id is not None and decided.outcome is Outcome.STORED:
            self.responder.evict(decided.session_id)  # the history changed in the database
        return decided.outcome


def arena_answer(outcome: Outcome, winner: str, texts: Texts) -> str:
    """What a pick gets as its answer."""
    if outcome is Outcome.STALE:
        return texts.ARENA_STALE
    if outcome is Outcome.TWICE:
        return texts.ARENA_TWICE
    return texts.ARENA_TIE if winner == "tie" else texts.arena_chosen(winner.upper())


def rating_answer(outcome: Outcome, value: int, texts: Texts, *, terminal: bool = False) -> str:
    """What a rating gets as its answer."""
    if outcome is Outcome.STORED:
        return texts.rated(value)
    if outcome is Outcome.TWICE:
        return texts.RATING_TWICE
    return texts.NOTHING_TO_RATE if terminal else texts.RATING_STALE


UseCase = Callable[[ChatActions, Turn, CommandCall], Awaitable[None]]

# The use case of each command in the table that every front end runs alike, through
# ChatActions.command; a command of the table that is not here is one front end's own
# (Telegram's /stats, which reads the admin reports).
USE_CASES: dict[str, UseCase] = {
    "start": lambda chat, turn, call: chat.help(turn, start=True, payload=call.argument),
    "help": lambda chat, turn, call: chat.help(turn),
    "persona": lambda chat, turn, call: chat.persona(turn, call.argument),
    "done": lambda chat, turn, call: chat.done(turn, rating_markup=call.rating_markup),
    "forget": lambda chat, turn, call: chat.forget(turn),
    "context": lambda chat, turn, call: chat.context(turn),
    "privacy": lambda chat, turn, call: chat.privacy(turn),
    "lang": lambda chat, turn, call: chat.language(
        turn, call.argument, sender_language=call.sender_language
    ),
    "model": lambda chat, turn, call: chat.choose_variant(turn, call.argument),
    "arena": lambda chat, turn, call: chat.arena(turn),
}
