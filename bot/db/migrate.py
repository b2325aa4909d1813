"""Run Alembic from code: `python -m bot db ...` and the tests."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

ROOT = Path(__file__).resolve().parents[2]


def alembic_config(database_url: str) -> Config:
    """An Alembic config for this repo's migrations and the given URL."""
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.attributes["database_url"] = database_url
    cfg.attributes["configure_logging"] = False
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the schema up to `revision`."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    """Take the schema down to `revision` (`base` removes every table)."""
    command.downgrade(alembic_config(database_url), revision)


def current(database_url: str) -> None:
    """Print the current revision."""
    command.current(alembic_config(database_url), verbose=True)
