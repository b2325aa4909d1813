"""safety gate: what it did to each reply, the unsent offensive text, flagged personas

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 12:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

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


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("persona_safety")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("unsafe_text")
        batch.drop_column("safety")
