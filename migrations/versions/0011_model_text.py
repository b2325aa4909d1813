"""messages.model_text: a bot reply's text as the model produced it, where the text shown differs

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 12:00:00

A lowercased, punctuation-splitting dictionary's output (BlenderBot 90M's, `what ' s up ?`) is
detokenised and capitalised for users (`What's up?`), and that display text was all that was
stored, so a conversation rebuilt from the database fed the model text it never produced. From
here on a bot reply whose shown text differs from the model's keeps the model's own text here,
and a rebuild reads it (else `text`). A cased byte-level BPE model's text is shown as it is, so
its replies keep NULL.

Existing rows keep NULL: what the model produced before this migration was never stored, and
their rebuild reads `text`, as it always did.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (no table rebuild) on both backends.
    op.add_column("messages", sa.Column("model_text", sa.Text(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35+), not batch mode: a rebuilt `messages` table would be
    # dropped first, and with foreign keys on, SQLite deletes the votes and duels that point
    # at its rows with it.
    op.drop_column("messages", "model_text")
