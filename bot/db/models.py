"""Tables. Alembic (migrations/) is the only thing that creates or changes them.

The Base and the shared column types are bot.db.base; the operators' tables (experiments,
variants, autopilot, audit, access) are bot.db.models_ops. This module re-exports both, so
`from bot.db.models import X` holds for every table, and importing it registers every table on
Base.metadata.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from bot.db.base import (
    NAMING_CONVENTION,
    Base,
    BigId,
    Serial,
    SessionRef,
    Stamp,
    TelegramId,
    UtcDateTime,
    utcnow,
)
from bot.db.models_ops import (
    AccessRefusal,
    AccessRule,
    Allocation,
    Assignment,
    AssignmentSource,
    AuditEntry,
    AuditSource,
    AutopilotDecision,
    ExperimentRow,
    QuotaCounter,
    UserQuota,
    VariantRow,
    VariantVersion,
)

# Every table, and what bot.db.base shares: import them all from here.
__all__ = [
    "NAMING_CONVENTION",
    "AccessRefusal",
    "AccessRule",
    "Allocation",
    "ArenaMatch",
    "Assignment",
    "AssignmentSource",
    "AuditEntry",
    "AuditSource",
    "AutopilotDecision",
    "Base",
    "BigId",
    "ChatLease",
    "ChatSetting",
    "Counter",
    "ExperimentRow",
    "Inbox",
    "InboxStatus",
    "Message",
    "Outbox",
    "OutboxKind",
    "QuotaCounter",
    "Rating",
    "Replica",
    "Role",
    "Serial",
    "Session",
    "SessionRef",
    "SessionStatus",
    "Stamp",
    "TelegramId",
    "UserQuota",
    "UtcDateTime",
    "VariantRow",
    "VariantVersion",
    "Vote",
    "VoteSource",
    "utcnow",
]


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
