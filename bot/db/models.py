"""Tables. Alembic (migrations/) is the only thing that creates or changes them."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# Names for every constraint, so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets BIGINT identities.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime; use bot.db.models.utcnow()")
        return value

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class SessionStatus(StrEnum):
    """`sessions.status`."""

    ACTIVE = "active"
    DONE = "done"  # ended by /done; kept for the admins


class Role(StrEnum):
    """`messages.role`: who said it."""

    USER = "user"
    BOT = "bot"


class OutboxKind(StrEnum):
    """`outbox.kind`."""

    REPLY = "reply"  # a model reply, tied to its `messages` row
    NOTICE = "notice"  # anything else the bot says (command answers, refusals, apologies)


class InboxStatus(StrEnum):
    """`inbox.status`."""

    PENDING = "pending"  # waiting for the inbox worker
    DONE = "done"
    FAILED = "failed"  # gave up after retries (the chat got an apology)
    IGNORED = "ignored"  # closed without an answer (not for us, unusable, over the flood limit)


# The columns many tables declare alike (each use gets its own copy of the mapped_column):
# a row id that is never handed out again, a Telegram chat or user id, a required UTC
# timestamp that defaults to the moment the row is inserted, and the conversation a row
# belongs to (deleted with it).
Serial = Annotated[int, mapped_column(BigId, primary_key=True, autoincrement=True)]
TelegramId = Annotated[int, mapped_column(BigInteger, nullable=False)]
Stamp = Annotated[datetime, mapped_column(UtcDateTime, nullable=False, default=utcnow)]
SessionRef = Annotated[
    int, mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False)
]


class Base(DeclarativeBase):
    """Declarative base with the naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Session(Base):
    """One conversation of one chat: a persona and the messages that belong to it."""

    __tablename__ = "sessions"
    __table_args__ = (
        CheckConstraint("status IN ('active', 'done')", name="status"),
        # At most one active conversation per chat.
        Index(
            "uq_sessions_active_chat_id",
            "chat_id",
            unique=True,
            sqlite_where=text("status = 'active'"),
            postgresql_where=text("status = 'active'"),
        ),
        Index("ix_sessions_chat_id_id", "chat_id", "id"),
        # The dashboard's conversation list: most recently active first, keyset pages.
        Index("ix_sessions_updated_at_id", "updated_at", "id"),
        # SQLite must never hand out a deleted row's id again: caches are keyed by id.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    chat_id: Mapped[TelegramId]
    user_id: Mapped[int | None] = mapped_column(BigInteger)
    # The persona the conversation's next reply reads ('' = none); what each stored reply read
    # is its own `messages.persona`.
    persona: Mapped[str] = mapped_column(Text, nullable=False, default="", server_default="")
    status: Mapped[str] = mapped_column(
        String(16), nullable=False, default="active", server_default="active"
    )
    created_at: Mapped[Stamp]
    updated_at: Mapped[datetime] = mapped_column(
        UtcDateTime, nullable=False, default=utcnow, onupdate=utcnow
    )
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # "flagged" when the safety gate found the persona offensive (SAFETY=flag); NULL otherwise.
    persona_safety: Mapped[str | None] = mapped_column(String(16))


class Message(Base):
    """One utterance, append-only, ordered by id within its session."""

    __tablename__ = "messages"
    __table_args__ = (
        CheckConstraint("role IN ('user', 'bot')", name="role"),
        Index("ix_messages_session_id_id", "session_id", "id"),
        Index("ix_messages_chat_id", "chat_id"),
        Index("ix_messages_created_at", "created_at"),
        # The dashboard's figures (migration 0006) from indexes instead of the whole table: the
        # replies' latency per day (covered), and the safety counts. No index leads with
        # `role`: SQLite (without ANALYZE) would then answer every `role = ?` query through it,
        # row by row, slower than the scan it replaces.
        Index("ix_messages_created_at_role_latency", "created_at", "role", "latency_ms"),
        Index(
            "ix_messages_safety",
            "safety",
            sqlite_where=text("safety IS NOT NULL"),
            postgresql_where=text("safety IS NOT NULL"),
        ),
        # SQLite must never hand out a deleted row's id again: caches are keyed by id.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    session_id: Mapped[SessionRef]
    chat_id: Mapped[TelegramId]
    role: Mapped[str] = mapped_column(String(8), nullable=False)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    # Telegram ids: the update that carried a user message, and the message id on either side.
    update_id: Mapped[int | None] = mapped_column(BigInteger)
    telegram_message_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[Stamp]
    # Bot replies only: when Telegram accepted it, and how long the model took.
    delivered_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    latency_ms: Mapped[float | None] = mapped_column()
    # Bot replies only: the model variant that produced it, and its time in the model.
    variant: Mapped[str | None] = mapped_column(String(64))
    model_ms: Mapped[float | None] = mapped_column()
    # Bot replies only: what the safety gate did (bot.safety.SafetyMark; NULL: it passed, or
    # SAFETY=off), and the offensive reply that was not sent in its place.
    safety: Mapped[str | None] = mapped_column(String(16))
    unsafe_text: Mapped[str | None] = mapped_column(Text)
    # Bot replies only: the persona the model read when it generated this reply ('' = none).
    # `sessions.persona` is the one the next reply will read; a change (/persona, /persona
    # clear) reaches the model from the next reply on, so the history of what the model read
    # is here, one value per reply. NULL on user messages (and on replies stored by a release
    # before migration 0010 after it ran: read as the session's persona, as 0010 did).
    persona: Mapped[str | None] = mapped_column(Text)
    # Bot replies only: the model's own text where `text` (what was shown) differs from it (a
    # lowercased dictionary's output, detokenised for display); NULL: the same, or not known
    # (a safety replacement, a reply from before migration 0011). A conversation rebuilt for
    # the model reads this, else `text`.
    model_text: Mapped[str | None] = mapped_column(Text)
    # Bot replies only: the identity of the variant that produced it (`variant_versions.id`:
    # its name, model and options at that moment), so that a name removed and added again,
    # or given another model, starts from nothing. NULL: not known (a reply stored by a
    # release older than migration 0012 while it ran): read as the name's current identity.
    variant_version: Mapped[int | None] = mapped_column(BigInteger)


class Outbox(Base):
    """Every text the bot must send, replies and notices alike, until Telegram accepts it."""

    __tablename__ = "outbox"
    __table_args__ = (
        CheckConstraint("kind IN ('reply', 'notice')", name="kind"),
        Index("ix_outbox_pending", "sent_at", "failed_at", "id"),
        Index("ix_outbox_chat_id", "chat_id"),
        # A reply's delivery state (the dashboard's transcripts), and the cascade when a
        # message is deleted (/forget, retention), without scanning the outbox (migration 0006).
        Index("ix_outbox_message_id", "message_id"),
        # SQLite must never hand out a deleted row's id again: caches are keyed by id.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    chat_id: Mapped[TelegramId]
    kind: Mapped[str] = mapped_column(String(8), nullable=False)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    message_id: Mapped[int | None] = mapped_column(ForeignKey("messages.id", ondelete="CASCADE"))
    update_id: Mapped[int | None] = mapped_column(BigInteger)
    reply_to_message_id: Mapped[int | None] = mapped_column(BigInteger)
    # An inline keyboard (Bot API InlineKeyboardMarkup as JSON) sent with the last part; reply
    # rows get their feedback buttons from `message_id` at delivery instead.
    markup: Mapped[str | None] = mapped_column(Text)
    # A regenerated reply (the user edited their last message): the Telegram message of the
    # old reply, edited in place (editMessageText) instead of sending a new one.
    edit_message_id: Mapped[int | None] = mapped_column(BigInteger)
    # A long text goes out as several Telegram messages; parts_sent survives a crash.
    parts_sent: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[Stamp]
    sent_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    failed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class Inbox(Base):
    """One row per Telegram update, committed before the update is acknowledged."""

    __tablename__ = "inbox"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'done', 'failed', 'ignored')", name="status"),
        Index("ix_inbox_status_update_id", "status", "update_id"),
        Index("ix_inbox_chat_id", "chat_id"),
        # SQLite must never hand out a deleted row's id again: caches are keyed by id.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    update_id: Mapped[int] = mapped_column(BigInteger, nullable=False, unique=True)
    chat_id: Mapped[int | None] = mapped_column(BigInteger)
    user_id: Mapped[int | None] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32), nullable=False, default="unknown")
    payload: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[str] = mapped_column(
        String(16), nullable=False, default="pending", server_default="pending"
    )
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)
    received_at: Mapped[Stamp]
    processed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class ChatLease(Base):
    """Which process works on a chat's updates (`inbox`) or sends its texts (`outbox`), and
    which replica polls getUpdates (`poller`, on chat_id 0).

    Several processes may share one database (docs/replicas.md): a chat's work belongs to
    the holder of its lease until `lease_until`, so no update is answered twice and no text is
    sent twice, and a chat's order holds across processes. A crashed holder's lease expires,
    or is taken over as soon as its replica's heartbeat (`replicas`) is stale.
    """

    __tablename__ = "chat_leases"
    __table_args__ = (
        CheckConstraint("kind IN ('inbox', 'outbox', 'poller')", name="kind"),
        UniqueConstraint("chat_id", "kind"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    chat_id: Mapped[TelegramId]
    kind: Mapped[str] = mapped_column(String(8), nullable=False)
    # "<host>:<pid namespace>:<pid>:<random>" (= replicas.owner), so a lease of a dead process
    # on this machine can be taken at once.
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    lease_until: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)


class Replica(Base):
    """One running service process (a replica): its heartbeat, and what it reports about itself.

    Written by the replica every second (bot/service/heartbeat.py) and deleted when it stops
    cleanly.
    Another replica treats a heartbeat older than a few seconds as a dead process and takes
    over its leases; the replica itself stops working on its chats before that moment
    (fencing). `info` is JSON for operators and the dashboard: mode, poller, readiness, model
    workers.
    """

    __tablename__ = "replicas"

    owner: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(255), nullable=False)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    started_at: Mapped[Stamp]
    heartbeat_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False, index=True)
    info: Mapped[str] = mapped_column(Text, nullable=False, default="{}", server_default="{}")


class AssignmentSource(StrEnum):
    """`assignments.source`: how a chat got its variant."""

    HASH = "hash"  # the weighted hash of (experiment, chat_id), at the chat's first turn
    ADMIN = "admin"  # `python -m bot admin assign`
    USER = "user"  # /model NAME, where the operator allows it
    # Its variant was removed, and the allocation put it elsewhere at its next turn.
    # `allocation` keeps the draw it came from, with the variant drawn ("drawn"), for the
    # sample-ratio check; `probability` is NULL (not a draw of `variant`).
    MOVED = "moved"
    # A new chat that went to the control (or the first served variant) because no variant
    # with a weight above 0 could serve here: no draw at all, so neither the sample-ratio
    # check nor the inverse-propensity weights count it (bot.engine.router).
    FALLBACK = "fallback"


class Assignment(Base):
    """Which model variant answers a chat: fixed at its first turn, kept until /forget."""

    __tablename__ = "assignments"
    __table_args__ = (
        CheckConstraint("source IN ('hash', 'admin', 'user', 'moved', 'fallback')", name="source"),
        CheckConstraint("probability > 0 AND probability <= 1", name="probability"),
        Index("ix_assignments_variant", "variant"),
    )

    chat_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    experiment: Mapped[str] = mapped_column(String(64), nullable=False)
    variant: Mapped[str] = mapped_column(String(64), nullable=False)
    source: Mapped[str] = mapped_column(String(8), nullable=False)
    assigned_at: Mapped[Stamp]
    # Sources hash and fallback only (NULL for admin, user and moved rows, and for rows older
    # than migration 0008): the probability this chat had of getting `variant` when it was
    # assigned, and the whole split it was drawn from (JSON: {"by", "split": variant ->
    # probability}; a moved row keeps its original draw's, with the variant "drawn"). The
    # report weights hash rows by the first (inverse-propensity estimates) and checks the
    # sample ratio of hash and moved rows against the second.
    probability: Mapped[float | None] = mapped_column(Double)
    allocation: Mapped[str | None] = mapped_column(Text)


class Allocation(StrEnum):
    """`experiments.allocation`: how new chats are split between the variants."""

    WEIGHTS = "weights"  # the weighted hash, fixed shares (an A/B test)
    THOMPSON = "thompson"  # Thompson sampling on the 👍 rates, with a floor per variant


class ExperimentRow(Base):
    """An experiment: its allocation, and a version every change of it or its variants bumps.

    Seeded from VARIANTS_FILE the first time a service (or an admin command) meets the
    experiment; from then on the database is what every replica serves: each one polls
    `version` and follows a change within seconds (bot.engine.live).
    """

    __tablename__ = "experiments"
    __table_args__ = (CheckConstraint("allocation IN ('weights', 'thompson')", name="allocation"),)

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    allocation: Mapped[str] = mapped_column(
        String(16), nullable=False, default="weights", server_default="weights"
    )
    version: Mapped[int] = mapped_column(Integer, nullable=False, default=1, server_default="1")
    created_at: Mapped[Stamp]
    updated_at: Mapped[Stamp]
    # `admin variants autopilot on`: its policy as JSON (bot.service.autopilot.Policy); NULL:
    # off. Every replica reads it before each check, so a change reaches all of them.
    autopilot: Mapped[str | None] = mapped_column(Text)


class VariantRow(Base):
    """One model variant of an experiment, as `admin variants add/weight/promote/remove` keep
    it (bot.engine.variants validates it as it does the file)."""

    __tablename__ = "variants"
    __table_args__ = (
        CheckConstraint("weight >= 0", name="weight"),
        # Exactly one control per experiment (at most one here; the commands keep one).
        Index(
            "uq_variants_control",
            "experiment",
            unique=True,
            sqlite_where=text("is_control"),
            postgresql_where=text("is_control"),
        ),
    )

    experiment: Mapped[str] = mapped_column(
        ForeignKey("experiments.name", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The order of the weighted hash's shares: the file's order, then the order of `add`.
    position: Mapped[int] = mapped_column(Integer, nullable=False)
    # A model file or a zoo: path; NULL: each replica's BOT_MODEL (a variants file entry
    # without `model`, and the single "default" variant without a file), so that changing
    # BOT_MODEL and restarting still changes the model.
    model: Mapped[str | None] = mapped_column(Text)
    weight: Mapped[float] = mapped_column(Double, nullable=False)
    is_control: Mapped[bool] = mapped_column(
        Boolean, nullable=False, default=False, server_default=text("false")
    )
    # The variant's other keys of the variants file as JSON (inference, beam_size, threads...).
    options: Mapped[str] = mapped_column(Text, nullable=False, default="{}", server_default="{}")
    created_at: Mapped[Stamp]
    updated_at: Mapped[Stamp]
    # Its current identity (`variant_versions.id`): new when the name is added (again), and
    # when its model or reply-changing options change; what its replies, votes and ratings
    # are recorded with, and all that the report, /stats and the bandit count.
    # NULL never after migration 0012 (nullable only so that 0012 adds it without rebuilding
    # the table on SQLite).
    version_id: Mapped[int | None] = mapped_column(BigInteger)


class VariantVersion(Base):
    """One identity of a variant: a name with one model and one set of options, from the
    moment it was added (or changed) until it was removed or changed (`retired_at`).

    Rows are never deleted: the history of every name stays queryable (docs/variants.md). The
    id is what `messages`, `votes`, `ratings` and `arena_matches` record (no foreign key, so
    that the history never blocks a delete or a retention run).
    """

    __tablename__ = "variant_versions"
    __table_args__ = (
        Index("ix_variant_versions_experiment_name", "experiment", "name"),
        # Never hand out an id again: the replies of a retired identity must not count for
        # a new one.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    experiment: Mapped[str] = mapped_column(String(64), nullable=False)
    name: Mapped[str] = mapped_column(String(64), nullable=False)
    model: Mapped[str | None] = mapped_column(Text)  # NULL: each replica's BOT_MODEL
    options: Mapped[str] = mapped_column(Text, nullable=False, default="{}", server_default="{}")
    created_at: Mapped[Stamp]
    retired_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class VoteSource(StrEnum):
    """`votes.source`."""

    BUTTON = "button"  # the 👍/👎 buttons under a reply (or /good, /bad in the terminal chat)
    REACTION = "reaction"  # a 👍/👎 reaction, where Telegram delivers them (groups, bot admin)


class Vote(Base):
    """A user's 👍 (+1) or 👎 (-1) on one bot reply; one per reply and user, changeable."""

    __tablename__ = "votes"
    __table_args__ = (
        CheckConstraint("value IN (-1, 1)", name="value"),
        CheckConstraint("source IN ('button', 'reaction')", name="source"),
        UniqueConstraint("message_id", "user_id"),
        Index("ix_votes_chat_id", "chat_id"),
        Index("ix_votes_variant", "variant"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    chat_id: Mapped[TelegramId]
    message_id: Mapped[int] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), nullable=False
    )
    user_id: Mapped[TelegramId]
    value: Mapped[int] = mapped_column(Integer, nullable=False)
    source: Mapped[str] = mapped_column(String(8), nullable=False)
    # The variant of the reply voted on, and its identity (copied, so the reports need no join).
    variant: Mapped[str | None] = mapped_column(String(64))
    variant_version: Mapped[int | None] = mapped_column(BigInteger)
    update_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[Stamp]
    updated_at: Mapped[Stamp]


class Rating(Base):
    """The 1-5 rating a user gave a conversation when it ended (/done); one per conversation."""

    __tablename__ = "ratings"
    __table_args__ = (
        CheckConstraint("value BETWEEN 1 AND 5", name="value"),
        UniqueConstraint("session_id"),
        Index("ix_ratings_chat_id", "chat_id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    chat_id: Mapped[TelegramId]
    session_id: Mapped[SessionRef]
    user_id: Mapped[int | None] = mapped_column(BigInteger)
    value: Mapped[int] = mapped_column(Integer, nullable=False)
    # The variant (and its identity) that answered most of the conversation's replies.
    variant: Mapped[str | None] = mapped_column(String(64))
    variant_version: Mapped[int | None] = mapped_column(BigInteger)
    update_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[Stamp]


class ArenaMatch(Base):
    """An arena duel (/arena): two variants' replies to one user message, and the user's pick.

    Requested (no user message yet) -> open (both replies shown) -> decided (`winner`: a, b,
    or tie for "both bad"). The chosen reply becomes the conversation's bot message.
    """

    __tablename__ = "arena_matches"
    __table_args__ = (
        CheckConstraint("winner IN ('a', 'b', 'tie')", name="winner"),
        Index("ix_arena_matches_chat_id", "chat_id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    chat_id: Mapped[TelegramId]
    session_id: Mapped[SessionRef]
    user_message_id: Mapped[int | None] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE")
    )
    variant_a: Mapped[str | None] = mapped_column(String(64))
    variant_b: Mapped[str | None] = mapped_column(String(64))
    # Their identities (`variant_versions.id`) when the duel was stored.
    version_a: Mapped[int | None] = mapped_column(BigInteger)
    version_b: Mapped[int | None] = mapped_column(BigInteger)
    text_a: Mapped[str | None] = mapped_column(Text)
    text_b: Mapped[str | None] = mapped_column(Text)
    winner: Mapped[str | None] = mapped_column(String(4))
    # The bot message the chosen reply became (None: not decided, or both were bad).
    bot_message_id: Mapped[int | None] = mapped_column(
        ForeignKey("messages.id", ondelete="SET NULL")
    )
    # The persona both replies were generated with; the chosen one's `messages.persona` when
    # the user picks (which may come after a /persona change).
    persona: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[Stamp]
    decided_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class Counter(Base):
    """Running totals the service keeps across restarts (e.g. rows deleted by retention)."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    updated_at: Mapped[Stamp]


class ChatSetting(Base):
    """What a chat chose for itself: for now its language (/lang); removed by /forget."""

    __tablename__ = "chat_settings"

    chat_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    # A shipped catalog's code (bot.texts.LANGUAGES); NULL: each sender's Telegram language.
    language: Mapped[str | None] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(
        UtcDateTime, nullable=False, default=utcnow, onupdate=utcnow
    )


class AutopilotDecision(Base):
    """One decision of the autopilot (bot/service/autopilot.py): a candidate promoted or rolled
    back, with the figures it was decided on and why.

    `based_on` is the experiment's version the check read; the decision's transaction moves
    the version on only if it is still that one, and the unique key lets one decision in per
    version: two replicas checking at the same moment make one decision.
    """

    __tablename__ = "autopilot_decisions"
    __table_args__ = (
        CheckConstraint("action IN ('promote', 'rollback')", name="action"),
        UniqueConstraint("experiment", "based_on"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    # Not a foreign key: the record outlives a removed variant (and names its experiment).
    experiment: Mapped[str] = mapped_column(String(64), nullable=False)
    based_on: Mapped[int] = mapped_column(Integer, nullable=False)
    variant: Mapped[str] = mapped_column(String(64), nullable=False)
    control: Mapped[str] = mapped_column(String(64), nullable=False)  # judged against this
    action: Mapped[str] = mapped_column(String(16), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    # JSON: the lift and its always-valid bound, each guard's figures for both, the policy.
    figures: Mapped[str] = mapped_column(Text, nullable=False)
    # The replica (replicas.owner) or "admin" that made it.
    decided_by: Mapped[str] = mapped_column(String(128), nullable=False)
    created_at: Mapped[Stamp]


class AuditSource(StrEnum):
    """Where an audited change was made."""

    CLI = "cli"  # `python -m bot admin ...`: the actor is the OS user
    TELEGRAM = "telegram"  # an admin's command in Telegram: the actor is their user id
    AUTOPILOT = "autopilot"  # bot/service/autopilot.py: the actor is autopilot@<replica>


class AuditEntry(Base):
    """One admin change (bot/db/audit.py): who made it, when, what, and how it ended.

    `result` is "pending" from the moment the change is about to be made until its outcome is
    written over it: "ok", "exit N" (it ended without changing anything, e.g. a declined
    prompt), or "error: ..." with the message the operator saw. A row left "pending" means the
    command died (or lost the database) between the two writes: look at what it changed.
    """

    __tablename__ = "audit_log"
    __table_args__ = (
        CheckConstraint("source IN ('cli', 'telegram', 'autopilot')", name="source"),
        Index("ix_audit_log_at", "at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[Serial]
    at: Mapped[Stamp]
    actor: Mapped[str] = mapped_column(String(128), nullable=False)
    source: Mapped[str] = mapped_column(String(16), nullable=False)
    action: Mapped[str] = mapped_column(String(64), nullable=False)  # "variants weight"
    # What it changed: a variant's name, a chat id, an experiment; NULL for none in particular.
    target: Mapped[str | None] = mapped_column(String(128))
    # JSON: the command's arguments (never a secret), or the autopilot's decision.
    details: Mapped[str] = mapped_column(Text, nullable=False)
    result: Mapped[str] = mapped_column(Text, nullable=False)


class AccessRule(Base):
    """An operator's `admin access allow|deny` (bot/db/access.py), beside ALLOWED_USERS and
    ALLOWED_CHATS: every replica reads these rows, so a change is followed without a restart.

    `subject` is "user:<id>", "chat:<id>" or "@username" (lower case)."""

    __tablename__ = "access_rules"
    __table_args__ = (CheckConstraint("rule IN ('allow', 'deny')", name="rule"),)

    subject: Mapped[str] = mapped_column(String(64), primary_key=True)
    rule: Mapped[str] = mapped_column(String(8), nullable=False)
    created_at: Mapped[Stamp]


class AccessRefusal(Base):
    """When a chat last got the refusal: one polite refusal, then silence for a while, agreed
    on by every replica."""

    __tablename__ = "access_refusals"

    chat_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    refused_at: Mapped[Stamp]


class UserQuota(Base):
    """A user's own limits (`admin access quota`), in place of QUOTA_PER_DAY/QUOTA_PER_MINUTE;
    NULL: no limit for that window."""

    __tablename__ = "user_quotas"

    user_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    per_day: Mapped[int | None] = mapped_column(Integer)
    per_minute: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[Stamp]


class QuotaCounter(Base):
    """Replies counted per user and fixed window (a UTC day, a minute), shared by the
    replicas (bot/db/access.py); `refused`: messages refused in the window (the first one is
    told when to write again, the rest are not)."""

    __tablename__ = "quota_counters"

    user_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    span: Mapped[str] = mapped_column(String(8), primary_key=True)  # "day" | "minute"
    start: Mapped[datetime] = mapped_column(UtcDateTime, primary_key=True)
    replies: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    refused: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
