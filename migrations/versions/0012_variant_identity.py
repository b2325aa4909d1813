"""variant identities: variant_versions; the identity on replies, votes, ratings and duels;
assignment sources `moved` and `fallback`

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 14:00:00

Votes and ratings were keyed by the variant's name only, so a name removed and added again with
another model inherited the old model's votes (in the report and in the Thompson bandit's
posterior). From here on each variant has an identity (`variant_versions`: its name, model and
options from the moment it was added or changed), `variants.version_id` names the current one,
and every bot reply, vote, rating and /arena duel records the identity it belongs to.

Existing rows belong to the current identity of their name: every stored variant gets one
identity, and every reply, vote, rating and duel of that name gets it. A name that is no longer
in `variants` (removed before this migration) gets one retired identity of its own, so that its
rows never count for the name if it is added again.

Assignments: a chat moved off a removed variant was stored as a fresh `hash` draw with the new
split, which made the sample-ratio check cry mismatch and its inverse-propensity weight wrong.
It is now `moved`, and a chat sent to the control only because nothing weighted could serve is
`fallback`; existing rows keep their source (which of them were moves is not known).
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import bot.db.models

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
OLD_SOURCES = "source IN ('hash', 'admin', 'user')"
NEW_SOURCES = "source IN ('hash', 'admin', 'user', 'moved', 'fallback')"
# (table, name column, identity column) of every row that records a variant.
RECORDS = (
    ("messages", "variant", "variant_version"),
    ("votes", "variant", "variant_version"),
    ("ratings", "variant", "variant_version"),
    ("arena_matches", "variant_a", "version_a"),
    ("arena_matches", "variant_b", "version_b"),
)


def upgrade() -> None:
    op.create_table(
        "variant_versions",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("experiment", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("options", sa.Text(), server_default="{}", nullable=False),
        sa.Column("created_at", bot.db.models.UtcDateTime(timezone=True), nullable=False),
        sa.Column("retired_at", bot.db.models.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_variant_versions")),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_variant_versions_experiment_name", "variant_versions", ["experiment", "name"]
    )
    # Plain ADD COLUMN (no table rebuild) on both backends: a rebuilt `messages` table would be
    # dropped first, and with foreign keys on, SQLite deletes the votes and duels pointing at it.
    op.add_column("variants", sa.Column("version_id", sa.BigInteger(), nullable=True))
    for table, _, column in RECORDS:
        op.add_column(table, sa.Column(column, sa.BigInteger(), nullable=True))

    bind = op.get_bind()
    now = bot.db.models.utcnow()
    # The variant_versions table as this revision has it (not the ORM's, which may move on).
    versions = sa.table(
        "variant_versions",
        sa.column("experiment", sa.String()),
        sa.column("name", sa.String()),
        sa.column("model", sa.Text()),
        sa.column("options", sa.Text()),
        sa.column("created_at", bot.db.models.UtcDateTime(timezone=True)),
        sa.column("retired_at", bot.db.models.UtcDateTime(timezone=True)),
    )
    # One identity per stored variant, from when it was stored.
    op.execute(
        "INSERT INTO variant_versions (experiment, name, model, options, created_at) "
        "SELECT experiment, name, model, options, created_at FROM variants "
        "ORDER BY experiment, position, name"
    )
    op.execute(
        "UPDATE variants SET version_id = (SELECT v.id FROM variant_versions v "
        "WHERE v.experiment = variants.experiment AND v.name = variants.name)"
    )
    # Names only the history knows (removed before this migration): one retired identity
    # each, in the experiment their chats were assigned in (else the newest experiment).
    known = {str(name) for (name,) in bind.execute(sa.text("SELECT name FROM variants"))}
    seen: set[str] = set()
    for table, name_column, _ in RECORDS:
        for (name,) in bind.execute(
            sa.text(f"SELECT DISTINCT {name_column} FROM {table} WHERE {name_column} IS NOT NULL")
        ):
            seen.add(str(name))
    for (name,) in bind.execute(sa.text("SELECT DISTINCT variant FROM assignments")):
        seen.add(str(name))
    newest = bind.execute(
        sa.text("SELECT name FROM experiments ORDER BY updated_at DESC, name LIMIT 1")
    ).scalar()
    for name in sorted(seen - known):
        experiment = bind.execute(
            sa.text("SELECT MIN(experiment) FROM assignments WHERE variant = :name"),
            {"name": name},
        ).scalar()
        bind.execute(
            versions.insert().values(
                experiment=experiment or newest or "default",
                name=name,
                model=None,
                options=json.dumps({}),
                created_at=now,
                retired_at=now,
            )
        )
    # Every existing row belongs to the current identity of its name (one per name here,
    # unless a name is in two experiments: then the newest identity).
    for table, name_column, column in RECORDS:
        op.execute(
            f"UPDATE {table} SET {column} = (SELECT MAX(v.id) FROM variant_versions v "
            f"WHERE v.name = {table}.{name_column}) WHERE {name_column} IS NOT NULL"
        )
    # `assignments` has no foreign key pointing at it: batch mode may rebuild it on SQLite.
    with op.batch_alter_table("assignments") as batch:
        batch.drop_constraint(op.f("ck_assignments_source"), type_="check")
        batch.create_check_constraint("source", NEW_SOURCES)


def downgrade() -> None:
    # What the release before would have stored: a fallback chat as a hash draw with
    # probability 1; a moved chat as an admin move (a move that is not a draw, which its
    # report leaves out of the sample-ratio check and the weights, as it should).
    op.execute("UPDATE assignments SET source = 'hash' WHERE source = 'fallback'")
    op.execute("UPDATE assignments SET source = 'admin' WHERE source = 'moved'")
    with op.batch_alter_table("assignments") as batch:
        batch.drop_constraint(op.f("ck_assignments_source"), type_="check")
        batch.create_check_constraint("source", OLD_SOURCES)
    # Plain DROP COLUMN (SQLite 3.35+), not batch mode (see upgrade).
    for table, _, column in reversed(RECORDS):
        op.drop_column(table, column)
    op.drop_column("variants", "version_id")
    op.drop_index("ix_variant_versions_experiment_name", table_name="variant_versions")
    op.drop_table("variant_versions")
