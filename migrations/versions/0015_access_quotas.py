"""access and quotas: access_rules, access_refusals, user_quotas, quota_counters

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 08:10:00

Who may talk to the bot (`admin access allow|deny`, beside ALLOWED_USERS / ALLOWED_CHATS),
when a chat was last refused, per-user quotas (`admin access quota`) and the reply counters
that every replica shares (bot/db/access.py). New tables only.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import bot.db.models

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    stamp = bot.db.models.UtcDateTime(timezone=True)
    op.create_table(
        "access_rules",
        sa.Column("subject", sa.String(length=64), nullable=False),
        sa.Column("rule", sa.String(length=8), nullable=False),
        sa.Column("created_at", stamp, nullable=False),
        sa.CheckConstraint("rule IN ('allow', 'deny')", name=op.f("ck_access_rules_rule")),
        sa.PrimaryKeyConstraint("subject", name=op.f("pk_access_rules")),
    )
    op.create_table(
        "access_refusals",
        sa.Column("chat_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("refused_at", stamp, nullable=False),
        sa.PrimaryKeyConstraint("chat_id", name=op.f("pk_access_refusals")),
    )
    op.create_table(
        "user_quotas",
        sa.Column("user_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("per_day", sa.Integer(), nullable=True),
        sa.Column("per_minute", sa.Integer(), nullable=True),
        sa.Column("updated_at", stamp, nullable=False),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_user_quotas")),
    )
    op.create_table(
        "quota_counters",
        sa.Column("user_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("span", sa.String(length=8), nullable=False),
        sa.Column("start", stamp, nullable=False),
        sa.Column("replies", sa.Integer(), server_default="0", nullable=False),
        sa.Column("refused", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("user_id", "span", "start", name=op.f("pk_quota_counters")),
    )


def downgrade() -> None:
    op.drop_table("quota_counters")
    op.drop_table("user_quotas")
    op.drop_table("access_refusals")
    op.drop_table("access_rules")
