"""index for the dashboard's conversation list (sessions by updated_at, then id)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 16:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Without it every page of the list, keyset pages too, sorts the whole sessions table.
    op.create_index("ix_sessions_updated_at_id", "sessions", ["updated_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_sessions_updated_at_id", table_name="sessions")
