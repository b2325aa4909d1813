"""The messages between the service and a model process, over a multiprocessing pipe.

Every message is a frozen dataclass with an enum tag (`kind`) and the protocol version it was
made under; both sides match on the class, never on positional tuples. A model process answers
the service's first look at it with `Ready` (or `Failed`) carrying its version, and the service
refuses a process that speaks another one (a stale interpreter, a half-upgraded install).
Adding a field or a message bumps PROTOCOL_VERSION; tests/unit/engine/test_pipe.py round-trips every
message through a real pipe.

service -> model process          model process -> service
    TurnRequest (a chat's turn)       Ready / Failed (once, after loading the model)
    Inspect (what the model reads)    ReplyMessage (a Generated, or a ModelView for Inspect)
    Evict, Stored (cache upkeep)      NeedContext (a cache miss: send it again with context)
    StatsRequest, Ping, Stop          Draft, Error, Stats, Pong
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from bot.db.conversations import SessionRow
    from bot.engine.protocol import ConversationContext, Generated, ModelView

# 1: positional tuples (before the typed messages); 3: Generated.replica; 4: Stored's replica;
# 5: Generated.model_text and MessageRow.model_text (the model's own text); 6: StatsRequest.memory
PROTOCOL_VERSION = 6


class Kind(StrEnum):
    """Every message's tag."""

    TURN = "turn"
    INSPECT = "inspect"
    EVICT = "evict"
    STORED = "stored"
    STATS_REQUEST = "stats_request"
    PING = "ping"
    STOP = "stop"
    READY = "ready"
    FAILED = "failed"
    REPLY = "reply"
    NEED_CONTEXT = "need_context"
    DRAFT = "draft"
    ERROR = "error"
    STATS = "stats"
    PONG = "pong"


@dataclass(frozen=True, slots=True)
class Message:
    """What every message carries: its tag (per class) and the version it was made under."""

    kind: ClassVar[Kind]
    version: int = field(default=PROTOCOL_VERSION, kw_only=True)


@dataclass(frozen=True, slots=True)
class Request(Message):
    """A message the other side answers, under its `req_id`."""

    req_id: int


# --- service -> model process ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnRequest(Request):
    """One turn of a conversation; `context` when the model process asked for it."""

    kind: ClassVar[Kind] = Kind.TURN
    session: SessionRow
    text: str
    stream: bool  # whether to send Drafts
    context: ConversationContext | None = None


@dataclass(frozen=True, slots=True)
class Inspect(Request):
    """What the model reads now for a conversation (the /context command)."""

    kind: ClassVar[Kind] = Kind.INSPECT
    session: SessionRow
    context: ConversationContext | None = None


@dataclass(frozen=True, slots=True)
class StatsRequest(Request):
    """Cache and batch figures, and with `memory` the process's memory too.

    Memory is asked for only where it is read (bench/sharing.py): measuring it collects
    garbage and walks the process's pages, about 0.3 s with a model loaded during which the
    inference thread cannot run (the collection holds the GIL). The heartbeat's status every few
    seconds asked for it and dropped it: a stall of every chat's reply each time."""

    kind: ClassVar[Kind] = Kind.STATS_REQUEST
    memory: bool = False


@dataclass(frozen=True, slots=True)
class Evict(Message):
    """Drop a cached clone."""

    kind: ClassVar[Kind] = Kind.EVICT
    session_id: int


@dataclass(frozen=True, slots=True)
class Stored(Message):
    """The session's turn is committed up to this message."""

    kind: ClassVar[Kind] = Kind.STORED
    session_id: int
    last_message_id: int
    # The model server whose clone made the turn (a Ray replica's id): another one's clone of
    # the session missed the turn and must stay stale. None: the only model server.
    replica: str | None = None


@dataclass(frozen=True, slots=True)
class Ping(Message):
    """Once a second: are you there, and does your inference thread progress?"""

    kind: ClassVar[Kind] = Kind.PING


@dataclass(frozen=True, slots=True)
class Stop(Message):
    """Finish what runs and exit."""

    kind: ClassVar[Kind] = Kind.STOP


# --- model process -> service ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready(Message):
    """The model is loaded (sent once)."""

    kind: ClassVar[Kind] = Kind.READY
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Failed(Message):
    """The model could not be loaded (sent once, instead of Ready); `reason` is safe to log."""

    kind: ClassVar[Kind] = Kind.FAILED
    reason: str


@dataclass(frozen=True, slots=True)
class ReplyMessage(Request):
    """A TurnRequest's Generated, or an Inspect's ModelView."""

    kind: ClassVar[Kind] = Kind.REPLY
    result: Generated | ModelView


@dataclass(frozen=True, slots=True)
class NeedContext(Request):
    """A cache miss: send the request again with the conversation's last `tail` messages."""

    kind: ClassVar[Kind] = Kind.NEED_CONTEXT
    tail: int | None


@dataclass(frozen=True, slots=True)
class Draft(Request):
    """A streamed turn's reply as far as it is settled, cleaned like the reply, whole words."""

    kind: ClassVar[Kind] = Kind.DRAFT
    text: str


@dataclass(frozen=True, slots=True)
class Error(Request):
    """The request failed; `message` is safe to log."""

    kind: ClassVar[Kind] = Kind.ERROR
    message: str


@dataclass(frozen=True, slots=True)
class Stats(Request):
    """The answer to a StatsRequest."""

    kind: ClassVar[Kind] = Kind.STATS
    figures: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Pong(Message):
    """The answer to a Ping: seconds the inference thread has had work without a decoding step."""

    kind: ClassVar[Kind] = Kind.PONG
    stuck_s: float


MESSAGES: tuple[type[Message], ...] = (
    TurnRequest,
    Inspect,
    StatsRequest,
    Evict,
    Stored,
    Ping,
    Stop,
    Ready,
    Failed,
    ReplyMessage,
    NeedContext,
    Draft,
    Error,
    Stats,
    Pong,
)
