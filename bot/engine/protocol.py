"""The one typed seam between the conversation layer and the model, wherever it runs.

The use cases (bot/conversations) talk to a ResponderProtocol; the service's responder
(bot/engine/router.py) routes each chat's turn to its variant's backend (bot/engine/spec.py:
what a backend is, and what starts a model; bot/engine/backends/: a model process, this
process, or Ray Serve), whose model runs in bot/inference/. What crosses the seam is defined
here: a turn's Reply (and the model's Generated, inside a model process), the
view of what the model reads (ModelView), the context a conversation is rebuilt from
(ConversationContext), where a turn's drafts go (DraftSink), and what a responder can do
beyond answering (Abilities: drafts, /context, /arena, several variants). A caller asks
`responder.abilities`, never the responder's attributes: an ability a responder does not
declare is one it does not have.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db.assignments import Choice
from bot.db.conversations import MessageRow, SessionRow
from bot.db.models import AssignmentSource
from bot.engine.variants import Experiment

# Where a streamed turn's drafts go: the settled start of the reply (what every hypothesis that
# can still win shares), cleaned like the reply: each draft begins the reply's text.
DraftSink = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ConversationContext:
    """What the engine needs to rebuild a conversation: persona and the tail of its messages."""

    session_id: int
    chat_id: int
    persona: str
    messages: list[MessageRow]


class ContextSource(Protocol):
    """Where a conversation is rebuilt from on a cache miss: the ConversationStore in the
    service, the context sent along with the turn in a model worker (bot.inference.process)."""

    async def load_context(
        self, session_id: int, tail: int | None, upto: int | None = None
    ) -> ConversationContext:
        """A conversation's persona and its last `tail` messages (all if None), up to message
        `upto` (0: none; None: the newest)."""
        ...


@dataclass
class Generated:
    """One request's result."""

    text: str
    model_input: list[int]
    batch_size: int
    model_ms: float
    # The search's other finished hypotheses, cleaned like `text`, best first (beam search
    # only; the safety gate falls back on them).
    candidates: tuple[str, ...] = ()
    # Set by Responder.generate for the metrics: whether the conversation's clone was cached,
    # the rebuild's time on a miss, the clones its cache dropped since its previous reply.
    cache_hit: bool | None = None
    rebuild_ms: float | None = None
    cache_evictions: int = 0
    # The model server that generated it, where that is not the service's own model process
    # (a Ray Serve replica's id, set by bot.inference.ray_server); None: the local one.
    replica: str | None = None
    # The model's own text, where `text` (what users see) differs from it: a lowercased
    # dictionary's output is detokenised for display (bot.inference.batcher.reply_cleaner).
    # The clone heard this text, and a rebuilt one must read it again (messages.model_text).
    model_text: str | None = None


@dataclass(frozen=True, slots=True)
class ModelView:
    """What the model reads now for a conversation (the /context command)."""

    model_input: list[int]  # the token ids: persona lines, then the turns that fit
    text: str  # the same ids as text
    visible_turns: int  # how many of the newest turns reach the model


@dataclass(frozen=True, slots=True)
class Reply:
    """What the responder produced for one turn."""

    text: str
    latency_ms: float
    # The model variant that produced it (None: no variants, e.g. a test responder).
    variant: str | None = None
    # Time inside the model (the batch that produced it), for the service-overhead figures.
    model_ms: float | None = None
    # The search's other hypotheses, best first, for the safety gate (bot.safety).
    candidates: tuple[str, ...] = ()
    # For the metrics (bot.service.metrics): the batch it was generated in, whether its clone was
    # cached (None: not known), the rebuild's time on a miss, and the clones the worker's
    # cache dropped since its previous reply.
    batch_size: int | None = None
    cache_hit: bool | None = None
    rebuild_ms: float | None = None
    cache_evictions: int = 0
    # Which model server generated it (the metrics' model_replica label): a Ray Serve
    # replica's id, or LOCAL_REPLICA for the service's own model process (None: not known).
    model_replica: str | None = None
    # The model's own text where it differs from `text` (Generated.model_text), stored beside
    # it so that a conversation rebuilt from the database reads what the model said.
    model_text: str | None = None
    # The identity of the variant that produced it (variants.version_id; None: not known,
    # stored as the name's current identity).
    variant_version: int | None = None


# Reply.model_replica of a turn generated by the service's own model process (or in process).
LOCAL_REPLICA = "local"


class GenerationError(Exception):
    """Generation failed for this request; the message is safe to log."""


class DuelResponder(Protocol):
    """A responder with variants that can answer one message twice (/arena)."""

    @property
    def duelists(self) -> list[str]:
        """The variants a duel is drawn from (the drained ones are not)."""
        ...

    async def duel(self, session: SessionRow, user_text: str) -> tuple[Reply, Reply]:
        """Two variants' replies, in random order."""
        ...


class Inspects(Protocol):
    """A responder that can show what its model reads for a conversation (/context)."""

    async def inspect(self, session: SessionRow) -> ModelView:
        """The token ids the model reads now for `session`, and how many turns fit."""
        ...


class ServesVariants(Protocol):
    """A responder over an experiment's variants (bot.engine.router.VariantResponder): what
    /model shows, the inbox's per-variant lanes, /readyz's model check and the restart
    counter read from it."""

    @property
    def experiment(self) -> Experiment:
        """The variants served now (it follows the database's changes)."""
        ...

    @property
    def lanes(self) -> int:
        """How many variants share the concurrency slots now."""
        ...

    async def lane_of(self, chat_id: int) -> str:
        """The variant a chat's next turn goes to."""
        ...

    def lane_ready(self, name: str) -> bool:
        """Whether variant `name` takes turns on this replica now."""
        ...

    def model_states(self) -> dict[str, str]:
        """Every variant loaded here: "" while it takes turns, else why it does not."""
        ...

    def restart_reasons(self) -> dict[str, dict[str, int]]:
        """Per variant: why and how often its model process was restarted."""
        ...


@dataclass(frozen=True, slots=True)
class Abilities:
    """What a responder can do besides `respond()`: each ability is the object that has it,
    or None (False) where the responder has not."""

    drafts: bool = False  # it calls `on_draft` with the reply so far while it generates
    inspect: Inspects | None = None  # /context
    duel: DuelResponder | None = None  # /arena (it still needs two duelists to draw)
    variants: ServesVariants | None = None  # several variants, each in its lane


class ResponderProtocol(Protocol):
    """What the conversation layer needs from the model responder."""

    @property
    def abilities(self) -> Abilities:
        """What it can do besides answering (fixed for its lifetime)."""
        ...

    async def respond(
        self, session: SessionRow, user_text: str, *, on_draft: DraftSink | None = None
    ) -> Reply:
        """Generate the bot's reply to `user_text` in `session`'s context, with
        `session.persona` at the head of the model input whether the clone was cached or
        rebuilt (the conversation layer stores it as the persona the reply read); drafts of it
        to `on_draft` (where the front end streams and the responder can)."""
        ...

    def set_persona(self, session_id: int, persona: str) -> None:
        """Make a cached conversation use a new persona from its next turn."""
        ...

    def evict(self, session_id: int) -> None:
        """Drop a conversation's cached agent (it is rebuilt from the database on demand)."""
        ...

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """The turn just generated for a conversation is committed up to `last_message_id`."""
        ...


class VariantStore(ContextSource, Protocol):
    """What the variant router needs of the database: a chat's variant, stored once, and the
    live variants (read through `sessionmaker`)."""

    sessionmaker: async_sessionmaker[AsyncSession]

    async def variant_of(self, chat_id: int) -> str | None:
        """The chat's stored variant (None before its first turn)."""
        ...

    async def assign_variant(self, chat_id: int, choice: Choice) -> str:
        """The chat's variant: the stored one, else `choice`'s, stored now."""
        ...

    async def set_variant(self, chat_id: int, choice: Choice, source: AssignmentSource) -> None:
        """Move a chat to `choice`."""
        ...
