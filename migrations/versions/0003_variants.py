"""model variants: assignments, votes, ratings, arena matches; each reply's variant and model time

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import bot.db.models

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("variant", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("model_ms", sa.Double(), nullable=True))
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("markup", sa.Text(), nullable=True))
    op.create_table(
        "assignments",
        sa.Column("chat_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("experiment", sa.String(length=64), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=8), nullable=False),
        sa.Column("assigned_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "source IN ('hash', 'admin', 'user')", name=op.f("ck_assignments_source")
        ),
        sa.PrimaryKeyConstraint("chat_id", name=op.f("pk_assignments")),
    )
    op.create_index("ix_assignments_variant", "assignments", ["variant"])
    op.create_table(
        "votes",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("chat_id", sa.BigInteger(), nullable=False),
        sa.Column("message_id", BIG_ID, nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=8), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=True),
        sa.Column("update_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("value IN (-1, 1)", name=op.f("ck_votes_value")),
        sa.CheckConstraint("source IN ('button', 'reaction')", name=op.f("ck_votes_source")),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["messages.id"],
            name=op.f("fk_votes_message_id_messages"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_votes")),
        sa.UniqueConstraint("message_id", "user_id", name=op.f("uq_votes_message_id")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_votes_chat_id", "votes", ["chat_id"])
    op.create_index("ix_votes_variant", "votes", ["variant"])
    op.create_table(
        "ratings",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("chat_id", sa.BigInteger(), nullable=False),
        sa.Column("session_id", BIG_ID, nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=True),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=True),
        sa.Column("update_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("value BETWEEN 1 AND 5", name=op.f("ck_ratings_value")),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_ratings_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ratings")),
        sa.UniqueConstraint("session_id", name=op.f("uq_ratings_session_id")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_ratings_chat_id", "ratings", ["chat_id"])
    op.create_table(
        "arena_matches",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("chat_id", sa.BigInteger(), nullable=False),
        sa.Column("session_id", BIG_ID, nullable=False),
        sa.Column("user_message_id", BIG_ID, nullable=True),
        sa.Column("variant_a", sa.String(length=64), nullable=True),
        sa.Column("variant_b", sa.String(length=64), nullable=True),
        sa.Column("text_a", sa.Text(), nullable=True),
        sa.Column("text_b", sa.Text(), nullable=True),
        sa.Column("winner", sa.String(length=4), nullable=True),
        sa.Column("bot_message_id", BIG_ID, nullable=True),
        sa.Column("created_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("decided_at", bot.db.models.UtcDateTime(timezone=True), nullable=True),
        sa.CheckConstraint("winner IN ('a', 'b', 'tie')", name=op.f("ck_arena_matches_winner")),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_arena_matches_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_message_id"],
            ["messages.id"],
            name=op.f("fk_arena_matches_user_message_id_messages"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["bot_message_id"],
            ["messages.id"],
            name=op.f("fk_arena_matches_bot_message_id_messages"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_arena_matches")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_arena_matches_chat_id", "arena_matches", ["chat_id"])


def downgrade() -> None:
    op.drop_table("arena_matches")
    op.drop_table("ratings")
    op.drop_table("votes")
    op.drop_table("assignments")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("markup")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("model_ms")
        batch.drop_column("variant")
