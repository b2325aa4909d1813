"""audit log: the audit_log table, one row per admin change

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 08:30:00

Every change made through `python -m bot admin` (variants, forget, assign, ...) and every
decision of the autopilot is one row: who (the OS user, a Telegram admin's id, or
autopilot@<replica>), when, what (the command and its arguments as JSON) and the result
(bot/db/audit.py). Nothing existing is touched: a new table only.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import bot.db.models

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=128), nullable=True),
        sa.Column("details", sa.Text(), nullable=False),
        sa.Column("result", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "source IN ('cli', 'telegram', 'autopilot')", name=op.f("ck_audit_log_source")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
