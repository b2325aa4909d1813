"""replicas: heartbeats of running service processes; the poller's lease (kind 'poller')

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 14:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import bot.db.models

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("info", sa.Text(), server_default="{}", nullable=False),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_replicas")),
    )
    op.create_index(op.f("ix_replicas_heartbeat_at"), "replicas", ["heartbeat_at"])
    with op.batch_alter_table("chat_leases") as batch:
        batch.drop_constraint(op.f("ck_chat_leases_kind"), type_="check")
        batch.create_check_constraint("kind", "kind IN ('inbox', 'outbox', 'poller')")


def downgrade() -> None:
    op.execute("DELETE FROM chat_leases WHERE kind = 'poller'")
    with op.batch_alter_table("chat_leases") as batch:
        batch.drop_constraint(op.f("ck_chat_leases_kind"), type_="check")
        batch.create_check_constraint("kind", "kind IN ('inbox', 'outbox')")
    op.drop_index(op.f("ix_replicas_heartbeat_at"), table_name="replicas")
    op.drop_table("replicas")
