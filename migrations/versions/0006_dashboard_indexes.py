"""indexes for the admin dashboard: latency per day, replies per variant, safety counts, a
reply's outbox rows

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 14:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_messages_role_created_at", "messages", ["role", "created_at", "latency_ms"])
    op.create_index(
        "ix_messages_role_variant", "messages", ["role", "variant", "latency_ms", "model_ms"]
    )
    op.create_index(
        "ix_messages_safety",
        "messages",
        ["safety"],
        sqlite_where=sa.text("safety IS NOT NULL"),
        postgresql_where=sa.text("safety IS NOT NULL"),
    )
    op.create_index("ix_outbox_message_id", "outbox", ["message_id"])


def downgrade() -> None:
    op.drop_index("ix_outbox_message_id", table_name="outbox")
    op.drop_index("ix_messages_safety", table_name="messages")
    op.drop_index("ix_messages_role_variant", table_name="messages")
    op.drop_index("ix_messages_role_created_at", table_name="messages")
