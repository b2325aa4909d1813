"""`admin export --format parlai|parlai-jsonl`: stored conversations as ParlAI training episodes.

Each example is one bot reply with what the model read for it: `text` is what reached the model
since the previous example, `labels` the reply. The persona is `your persona: ...` lines at the
head of an episode's first `text`, then come the turns, consecutive messages of one speaker
joined by a newline as the clone cache joins them. ParlAI's history is then, example by example,
the model input the reply was generated from.

The persona is the one each reply read (`messages.persona`), not the conversation's persona now:
a change reaches the model from the next reply on, with the whole conversation so far after it.
A ParlAI episode cannot swap the lines at its head, so a conversation is one episode per stretch
of replies that read the same persona: where the persona changed (set, changed or cleared) a new
episode starts, whose first `text` is the new persona's lines and every turn of the conversation
so far. A conversation whose persona never changed between its replies stays one episode.

Each example carries its reply's feedback as fields: `votes_up`, `votes_down`, the
conversation's `rating`, `arena` (`won` when the reply was the pick of an /arena duel, with the
other reply as `arena_lost_text` and its variant), `variant`, `safety`, and
`session_id`/`message_id` to find it again, and `chat`: the chat's number within this export (1
for the first chat the export meets, 2 for the next, ...), so that `train --from-feedback` can cap
what one user contributes (bot.training.feedback_data) without the dataset carrying chat or user
ids.

Only what is stored can be learnt from: the export is one query over the database as it is when
it runs, so what `/forget` or RETENTION_DAYS deleted is not there. It is streamed (`yield_per`, a
server-side cursor on PostgreSQL) and holds one conversation in memory at a time.

When filters leave a reply out, its turns still reach the model as context: they are folded into
the `text` of the next example that is kept, which gives ParlAI's history the same string.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Integer, and_, case, exists, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import aliased

from bot.db.models import ArenaMatch, Message, Rating, Role, Session, Vote
from bot.persona import join_turns, persona_lines
from bot.reports.rows import REPLY_PERSONA

# ParlAI's own line format (parlai.utils.misc.msg_to_str) is used to write lines; imported
# lazily, since importing ParlAI costs a second and `admin` commands are otherwise light.
PERSONA_PREFIX = "your persona: "  # = bot.inference.model_input.PERSONA_PREFIX (no ParlAI import)
YIELD_PER = 500


class VoteFilter(StrEnum):
    """`--votes`: which replies to keep by their 👍/👎 votes."""

    UP = "up"  # more 👍 than 👎
    DOWN = "down"  # more 👎 than 👍
    ANY = "any"  # at least one vote


@dataclass(frozen=True, slots=True)
class EpisodeFilter:
    """Which conversations and replies an export keeps (None: no condition)."""

    chat_id: int | None = None
    since: datetime | None = None  # conversations active at or after this moment
    variant: str | None = None  # replies of this variant
    min_rating: int | None = None  # conversations rated at least this (unrated ones dropped)
    votes: VoteFilter | None = None

    def keeps(self, reply: Reply) -> bool:
        """Whether this reply becomes an example (its conversation passed the SQL filters)."""
        if self.variant is not None and reply.variant != self.variant:
            return False
        if self.votes is VoteFilter.UP:
            return reply.votes_up > reply.votes_down
        if self.votes is VoteFilter.DOWN:
            return reply.votes_down > reply.votes_up
        if self.votes is VoteFilter.ANY:
            return reply.votes_up + reply.votes_down > 0
        return True


@dataclass(slots=True)
class Reply:
    """One bot reply and its feedback."""

    message_id: int
    text: str
    variant: str | None
    safety: str | None
    votes_up: int
    votes_down: int
    arena_lost_text: str | None = None  # set when the reply won an arena duel
    arena_lost_variant: str | None = None
    arena_won: bool = False


@dataclass(slots=True)
class Example:
    """One training example: what reached the model since the previous example, and a reply."""

    text: str
    reply: Reply


@dataclass(slots=True)
class Episode:
    """One conversation, or the stretch of it whose replies read one persona, as examples."""

    session_id: int
    persona: str
    rating: int | None
    created_at: datetime
    examples: list[Example] = field(default_factory=list)
    chat: int = 0  # the chat's number within the export (no chat id: see the module docstring)

    def messages(self) -> list[dict[str, Any]]:
        """The examples as ParlAI messages, the last one with episode_done."""
        out: list[dict[str, Any]] = []
        for i, ex in enumerate(self.examples):
            r = ex.reply
            msg: dict[str, Any] = {
                "text": ex.text,
                "labels": [r.text],
                "episode_done": i == len(self.examples) - 1,
                "session_id": self.session_id,
                "chat": self.chat,
                "message_id": r.message_id,
                "votes_up": r.votes_up,
                "votes_down": r.votes_down,
            }
            optional = {
                "rating": self.rating,
                "variant": r.variant,
                "safety": r.safety,
                "arena": "won" if r.arena_won else None,
                "arena_lost_text": r.arena_lost_text,
                "arena_lost_variant": r.arena_lost_variant,
            }
            msg.update({k: v for k, v in optional.items() if v is not None})
            out.append(msg)
        return out


def persona_text(persona: str) -> str:
    """The persona as the model reads it: one `your persona:` line per sentence."""
    return "\n".join(persona_lines(persona))


def _statement(flt: EpisodeFilter) -> Any:
    up = func.sum(case((Vote.value > 0, 1), else_=0)).label("up")
    down = func.sum(case((Vote.value < 0, 1), else_=0)).label("down")
    votes = select(Vote.message_id, up, down).group_by(Vote.message_id).subquery("vote_counts")
    match = aliased(ArenaMatch)
    stmt = (
        select(
            Session.id,
            Session.chat_id,
            Session.created_at,
            Rating.value,
            Message.id,
            Message.role,
            Message.text,
            Message.variant,
            Message.safety,
            REPLY_PERSONA,
            func.coalesce(votes.c.up, 0).cast(Integer),
            func.coalesce(votes.c.down, 0).cast(Integer),
            match.winner,
            match.variant_a,
            match.text_a,
            match.variant_b,
            match.text_b,
        )
        .join(Message, Message.session_id == Session.id)
        .outerjoin(Rating, Rating.session_id == Session.id)
        .outerjoin(votes, votes.c.message_id == Message.id)
        .outerjoin(match, and_(match.bot_message_id == Message.id, Message.role == Role.BOT))
    )
    if flt.chat_id is not None:
        stmt = stmt.where(Session.chat_id == flt.chat_id)
    if flt.since is not None:
        stmt = stmt.where(Session.updated_at >= flt.since)
    if flt.min_rating is not None:
        stmt = stmt.where(Rating.value >= flt.min_rating)
    if flt.variant is not None:
        other = aliased(Message)
        stmt = stmt.where(
            exists().where(other.session_id == Session.id, other.variant == flt.variant)
        )
    return stmt.order_by(Session.id, Message.id)


class _Builder:
    """Turns one conversation's rows, in order, into episodes: a new one wherever the persona a
    kept reply read differs from the one its episode started with."""

    def __init__(self, flt: EpisodeFilter, session_id: int, rating: int | None,
                 created_at: datetime, chat: int = 0) -> None:  # fmt: skip
        self.flt = flt
        self.session_id = session_id
        self.chat = chat
        self.rating = rating
        self.created_at = created_at
        self.done: list[Episode] = []
        self.episode: Episode | None = None
        self.history: list[tuple[str, str]] = []  # turns in earlier examples: (role, text)
        self.pending: list[tuple[str, str]] = []  # turns not yet in any example

    def add(self, role: str, text: str, reply: Reply | None, persona: str) -> None:
        if reply is None or not self.flt.keeps(reply):
            self.pending.append((role, text))
            return
        head = persona_text(persona)
        if self.episode is None or persona_text(self.episode.persona) != head:
            # The model read this persona, then the whole conversation so far.
            if self.episode is not None:
                self.done.append(self.episode)
            self.episode = Episode(
                self.session_id, persona, self.rating, self.created_at, chat=self.chat
            )
            parts = [head] if head else []
            parts += [t for _, t in join_turns(self.history + self.pending)]
        else:
            parts = [t for _, t in join_turns(self.pending)]
        self.episode.examples.append(Example("\n".join(parts), reply))
        self.history += self.pending
        self.history.append((role, text))
        self.pending = []

    def episodes(self) -> list[Episode]:
        """Every episode with an example, in order (call once the conversation's rows are in)."""
        return self.done + ([self.episode] if self.episode is not None else [])


async def episodes(engine: AsyncEngine, flt: EpisodeFilter) -> AsyncIterator[Episode]:
    """The stored conversations as episodes (one per persona the replies read, see the module
    docstring), oldest first, streamed; conversations with no example left after the filters
    are skipped."""
    builder: _Builder | None = None
    numbers: dict[int, int] = {}  # chat id -> its number in this export
    async with engine.connect() as conn:
        result = await conn.stream(_statement(flt).execution_options(yield_per=YIELD_PER))
        async for row in result:
            (sid, chat_id, created, rating, mid, role, text, variant, safety, persona, up, down,
             winner, var_a, text_a, var_b, text_b) = row  # fmt: skip
            if builder is None or builder.session_id != sid:
                if builder is not None:
                    for episode in builder.episodes():
                        yield episode
                chat = numbers.setdefault(int(chat_id), len(numbers) + 1)
                builder = _Builder(flt, sid, rating, created, chat)
            reply = None
            if role == Role.BOT:
                reply = Reply(mid, text, variant, safety, int(up), int(down))
                if winner in ("a", "b"):
                    reply.arena_won = True
                    lost_a = winner == "b"
                    reply.arena_lost_text = text_a if lost_a else text_b
                    reply.arena_lost_variant = var_a if lost_a else var_b
            builder.add(role, text, reply, persona or "")
    if builder is not None:
        for episode in builder.episodes():
            yield episode


def parlai_lines(episode: Episode) -> Iterator[str]:
    """The episode in ParlAI's dialog text format (the `fromfile` teacher), one line per example."""
    from parlai.utils.misc import msg_to_str

    for msg in episode.messages():
        # msg_to_str escapes tabs, newlines and `|`; it ends each line with a tab.
        yield msg_to_str(msg).rstrip("\t")


def conversation_json(episode: Episode) -> str:
    """The episode as one line of ParlAI's Conversations JSONL (the `jsonfile` teacher): the
    dialog as alternating user/bot turns, each bot turn with its feedback fields."""
    dialog: list[dict[str, Any]] = []
    for msg in episode.messages():
        fields = {k: v for k, v in msg.items() if k not in ("text", "labels", "episode_done")}
        dialog.append({"id": "user", "text": msg["text"]})
        dialog.append({"id": "bot", "text": msg["labels"][0], **fields})
    record = {
        "dialog": [dialog],
        "session_id": episode.session_id,
        "chat": episode.chat,
        "persona": episode.persona,
        "rating": episode.rating,
        "created_at": episode.created_at.isoformat(),
    }
    return json.dumps(record, ensure_ascii=False)
