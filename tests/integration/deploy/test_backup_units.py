"""deploy/systemd/telegram-bot-backup.{service,timer}: `deploy/systemd/verify` checks both (and
fails on a misspelt timer setting), the timer starts the backup service, and the service's
command, run as systemd would run it (its Environment= lines, %S a scratch state directory),
writes a backup that names the database's revision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bot.db import migrate
from tests.support.deployfiles import (
    ROOT,
    assert_misspelling_refused,
    assert_units_verified,
    unit_values,
)

SYSTEMD = ROOT / "deploy" / "systemd"
SERVICE = SYSTEMD / "telegram-bot-backup.service"
TIMER = SYSTEMD / "telegram-bot-backup.timer"


def test_verify_checks_the_backup_units_and_a_misspelt_timer_setting_fails(
    tmp_path: Path,
) -> None:
    assert_units_verified(SERVICE.name, TIMER.name)
    assert_misspelling_refused(tmp_path, TIMER, "Persistent", "Persistant", SERVICE)


def test_the_timer_starts_the_service_whose_command_writes_a_backup(tmp_path: Path) -> None:
    assert unit_values(TIMER, "Unit") == [SERVICE.name]
    state = tmp_path / "state"  # %S
    for directory in unit_values(SERVICE, "StateDirectory")[0].split():  # systemd makes them
        (state / directory).mkdir(parents=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)}
    for line in unit_values(SERVICE, "Environment"):
        key, _, value = line.replace("%S", str(state)).partition("=")
        env[key] = value
    migrate.upgrade(f"sqlite+aiosqlite:///{Path(env['DATA_DIR']) / 'bot.sqlite3'}")
    [command] = unit_values(SERVICE, "ExecStart")
    argv = command.replace("%S", str(state)).split()
    assert argv[0] == "/opt/telegram-bot/.venv/bin/python"
    argv[0] = sys.executable
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [manifest] = (state / "telegram-bot-backups").glob("bot-*.sqlite3.json")
    assert json.loads(manifest.read_text())["revision"] == migrate_head()
    assert Path(str(manifest).removesuffix(".json")).is_file()


def migrate_head() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(migrate.alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head
