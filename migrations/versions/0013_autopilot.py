"""autopilot: experiments.autopilot (its policy, NULL = off) and the autopilot_decisions table

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 08:00:00

`admin variants autopilot on` stores its policy on the experiment's row, which every replica
reads before each check (bot/service/autopilot.py); `off` sets it back to NULL. Each decision
(a candidate promoted, or rolled back to weight 0) is one row of `autopilot_decisions` with the
figures and the reason, unique per (experiment, the version the check read), so that two
replicas checking at once decide once.

Existing experiments keep NULL: the autopilot is off until an operator turns it on.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import bot.db.models

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (no table rebuild) on both backends.
    op.add_column("experiments", sa.Column("autopilot", sa.Text(), nullable=True))
    op.create_table(
        "autopilot_decisions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("experiment", sa.String(length=64), nullable=False),
        sa.Column("based_on", sa.Integer(), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("control", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("figures", sa.Text(), nullable=False),
        sa.Column("decided_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "action IN ('promote', 'rollback')", name=op.f("ck_autopilot_decisions_action")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autopilot_decisions")),
        sa.UniqueConstraint(
            "experiment", "based_on", name=op.f("uq_autopilot_decisions_experiment")
        ),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("autopilot_decisions")
    # Plain DROP COLUMN (SQLite 3.35+): `experiments` has no constraint that would need batch
    # mode, and a rebuilt table would cascade into `variants` with foreign keys on.
    op.drop_column("experiments", "autopilot")
