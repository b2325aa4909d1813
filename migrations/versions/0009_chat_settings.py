"""chat_settings: a chat's own choices, for now its language (/lang)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 22:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import bot.db.models

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "chat_settings",
        sa.Column("chat_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("language", sa.String(length=16), nullable=True),
        sa.Column("updated_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("chat_id", name=op.f("pk_chat_settings")),
    )


def downgrade() -> None:
    op.drop_table("chat_settings")
