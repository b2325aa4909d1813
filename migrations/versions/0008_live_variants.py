"""live variants: experiments and variants tables; each assignment's allocation probability

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import bot.db.models

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The variants move from the file into the database, so that `admin variants add/weight/
    # promote/remove` reach every replica without a restart (the file seeds them once).
    op.create_table(
        "experiments",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("allocation", sa.String(length=16), server_default="weights", nullable=False),
        sa.Column("version", sa.Integer(), server_default="1", nullable=False),
        sa.Column("created_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "allocation IN ('weights', 'thompson')", name=op.f("ck_experiments_allocation")
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_experiments")),
    )
    op.create_table(
        "variants",
        sa.Column("experiment", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("weight", sa.Double(), nullable=False),
        sa.Column("is_control", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("options", sa.Text(), server_default="{}", nullable=False),
        sa.Column("created_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("weight >= 0", name=op.f("ck_variants_weight")),
        sa.ForeignKeyConstraint(
            ["experiment"],
            ["experiments.name"],
            name=op.f("fk_variants_experiment_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment", "name", name=op.f("pk_variants")),
    )
    op.create_index(
        "uq_variants_control",
        "variants",
        ["experiment"],
        unique=True,
        sqlite_where=sa.text("is_control"),
        postgresql_where=sa.text("is_control"),
    )
    # NULL for the rows before this migration: the report leaves them out of the weighted
    # estimates, as it does admin and user moves.
    with op.batch_alter_table("assignments") as batch:
        batch.add_column(sa.Column("probability", sa.Double(), nullable=True))
        batch.add_column(sa.Column("allocation", sa.Text(), nullable=True))
        batch.create_check_constraint("probability", "probability > 0 AND probability <= 1")


def downgrade() -> None:
    with op.batch_alter_table("assignments") as batch:
        batch.drop_constraint(op.f("ck_assignments_probability"), type_="check")
        batch.drop_column("allocation")
        batch.drop_column("probability")
    op.drop_index("uq_variants_control", table_name="variants")
    op.drop_table("variants")
    op.drop_table("experiments")
