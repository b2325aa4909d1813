"""chat leases: one process at a time works on a chat's inbox or outbox

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 17:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import bot.db.models

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "chat_leases",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("chat_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("lease_until", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('inbox', 'outbox')", name=op.f("ck_chat_leases_kind")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chat_leases")),
        sa.UniqueConstraint("chat_id", "kind", name=op.f("uq_chat_leases_chat_id")),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("chat_leases")
