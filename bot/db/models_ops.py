"""The tables an operator runs the service with: the experiments (which variant answers a chat,
the experiments and their variants, each variant's identities), the autopilot's decisions, the
audit log of admin changes, and access (rules beside ALLOWED_USERS/ALLOWED_CHATS, refusals,
per-user quotas and their counters).

Import them from bot.db.models, which re-exports them: importing bot.db.models registers every
table on Base.metadata (Alembic's migrations/env.py compares it with the migrated schema).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from bot.db.base import Base, Serial, Stamp, UtcDateTime


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
