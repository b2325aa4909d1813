"""safety gate marks, edited replies (outbox.edit_message_id), counters (retention totals)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 12:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import bot.db.models

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("safety", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("unsafe_text", sa.Text(), nullable=True))
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("persona_safety", sa.String(length=16), nullable=True))
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("edit_message_id", sa.BigInteger(), nullable=True))
    op.create_table(
        "counters",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("updated_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_counters")),
    )


def downgrade() -> None:
    op.drop_table("counters")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("edit_message_id")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("persona_safety")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("unsafe_text")
        batch.drop_column("safety")
