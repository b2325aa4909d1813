"""The feedback use cases: 👍/👎 votes on a reply, the 1-5 rating of a conversation, and the
arena (/arena, the duel of two variants' replies to the next message, and the pick)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from bot.conversations.core import Core, FeatureCommand
from bot.conversations.outcome import ARENA, NO_REPLY
from bot.conversations.turn import Turn
from bot.db.conversations import SessionRow
from bot.db.feedback import Outcome
from bot.db.models import VoteSource
from bot.engine.protocol import DuelResponder, GenerationError
from bot.texts import Texts

log = logging.getLogger(__name__)


class Votes:
    """Votes, ratings and the arena of one chat."""

    def __init__(self, core: Core) -> None:
        self.core = core

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
        return await self.core.store.vote(
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
        store = self.core.store
        outcome = await store.rate(
            turn.chat_id, turn.user_id, session_id, value, update=turn.update
        )
        if answer_in_chat:
            answer = rating_answer(outcome, value, turn.texts, terminal=True)
            await store.notice(turn.chat_id, answer)  # the update is closed already
        return outcome

    # --- arena ---------------------------------------------------------------------------

    def duel_responder(self) -> DuelResponder | None:
        """The responder's /arena, where it is on and has two variants to draw."""
        duel = self.core.responder.abilities.duel
        if not self.core.settings.arena or duel is None or len(duel.duelists) < 2:
            return None
        return duel

    async def arena(self, turn: Turn) -> None:
        """/arena: the next message gets two variants' replies to choose from."""
        if self.duel_responder() is None:
            await self.core.notice(turn, turn.texts.not_enabled("arena"))
            return
        await self.core.store.request_arena(
            turn.chat_id, turn.user_id, notice=turn.texts.ARENA_READY, update=turn.update
        )

    async def duel(
        self,
        turn: Turn,
        duel: DuelResponder,
        session: SessionRow,
        text: str,
        markup: Callable[[int], str] | None,
        *,
        telegram_message_id: int | None,
    ) -> None:
        """The message after /arena: two variants' replies, shown with `markup` (a front end's
        pick buttons for a match id), stored in one transaction."""
        assert session.arena_match_id is not None
        core = self.core
        try:
            a, b = await duel.duel(session, text)
        except GenerationError as err:
            log.warning("arena generation failed for chat %s: %s", session.chat_id, err)
            await core.unanswered(
                turn, text, notice=turn.texts.NO_REPLY, telegram_message_id=telegram_message_id
            )
            turn.decided(NO_REPLY, session.variant)
            return
        shown_a = (await core.safety.reply(a.text, a.candidates)).text
        shown_b = (await core.safety.reply(b.text, b.candidates)).text
        await turn.end_drafts()
        await core.store.record_duel(
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
        store = self.core.store
        decided = await store.decide_duel(turn.chat_id, match_id, winner, update=turn.update)
        if decided.session_id is not None and decided.outcome is Outcome.STORED:
            self.core.responder.evict(decided.session_id)  # the history changed in the database
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


# The commands of the table (bot/commands.py) this feature runs.
COMMANDS: dict[str, FeatureCommand[Votes]] = {
    "arena": lambda votes, turn, call: votes.arena(turn),
}
