"""messages.persona: the persona the model read for each reply; arena_matches.persona

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 10:00:00

Until now the persona was one mutable column, `sessions.persona`, so a change in the middle of
a conversation rewrote what every earlier reply appeared to have been generated with (the
ParlAI export put today's persona at the head of the first turn). From here on each bot reply
keeps the persona the model read for it (a change reaches the model from the next reply on),
and an /arena duel keeps the persona its two replies were generated with until the user picks.
`sessions.persona` stays what it was: the persona the next reply will read.

Existing rows: what the model read before this migration was never stored, and the best
knowledge left is the session's persona as it is now. Every existing bot reply therefore gets
its session's current persona, as if that persona had been in effect from the conversation's
first turn (an /arena duel likewise). That is exact for the conversations whose persona never
changed after their first reply, and for the others it is what every reader assumed so far.
User messages keep NULL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (no table rebuild) on both backends.
    op.add_column("messages", sa.Column("persona", sa.Text(), nullable=True))
    op.add_column("arena_matches", sa.Column("persona", sa.Text(), nullable=True))
    op.execute(
        "UPDATE messages SET persona = "
        "(SELECT sessions.persona FROM sessions WHERE sessions.id = messages.session_id) "
        "WHERE role = 'bot'"
    )
    op.execute(
        "UPDATE arena_matches SET persona = "
        "(SELECT sessions.persona FROM sessions WHERE sessions.id = arena_matches.session_id)"
    )


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35+), not batch mode: a rebuilt `messages` table would be
    # dropped first, and with foreign keys on, SQLite deletes the votes and duels that point
    # at its rows with it.
    op.drop_column("arena_matches", "persona")
    op.drop_column("messages", "persona")
