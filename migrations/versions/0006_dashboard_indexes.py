"""indexes for the admin dashboard: latency per day, safety counts, a reply's outbox rows

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
    # Leads with created_at, not role: an index that leads with role would take over every
    # `role = ?` query on SQLite (no ANALYZE statistics) and make it slower than a scan.
    op.create_index(
        "ix_messages_created_at_role_latency", "messages", ["created_at", "role", "latency_ms"]
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
    op.drop_index("ix_messages_created_at_role_latency", table_name="messages")
