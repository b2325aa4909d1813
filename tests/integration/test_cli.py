"""The command line, as an operator runs it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.support.cli import cli_env, run_cli, run_cli_async


def test_run_without_token_exits_fast_with_advice(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = run_cli("run", cwd=tmp_path, env=cli_env(tmp_path), timeout=60)  # no .env there
    assert proc.returncode != 0
    assert time.monotonic() - started < 20
    assert "TELEGRAM_BOT_TOKEN" in proc.stderr
    assert "make chat" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_help_lists_subcommands() -> None:
    proc = run_cli("--help", env=None, timeout=60)
    assert proc.returncode == 0
    for word in ("run", "chat", "train", "db", "admin"):
        assert word in proc.stdout


def test_db_upgrade_and_downgrade_on_sqlite_file(tmp_path: Path) -> None:
    db_file = tmp_path / "fresh.sqlite3"
    env = cli_env(tmp_path, DATABASE_URL=f"sqlite+aiosqlite:///{db_file}")
    up = run_cli("db", "upgrade", env=env)
    assert up.returncode == 0, up.stderr
    import sqlite3

    with sqlite3.connect(db_file) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"sessions", "messages", "inbox", "outbox"} <= names
    down = run_cli("db", "downgrade", "base", env=env)
    assert down.returncode == 0, down.stderr
    with sqlite3.connect(db_file) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert names <= {"alembic_version", "sqlite_sequence"}


async def test_run_refuses_a_bad_webhook_secret_before_loading_anything(tmp_path: Path) -> None:
    """Regression: `bad secret+chars` passed Settings and failed with a raw BadRequest traceback
    from setWebhook after the model had loaded; a valid 3-character one was logged in clear."""
    from tests.support.botprocess import TOKEN
    from tests.support.fakebotapi import FakeBotAPI

    expected = "error: WEBHOOK_SECRET must be 16 to 256 characters of A-Z, a-z, 0-9, _ and -"
    async with FakeBotAPI(TOKEN) as api:
        for secret in ("bad secret+chars", "abc", "x" * 257):
            env = cli_env(
                tmp_path, TELEGRAM_BOT_TOKEN=TOKEN,
                TELEGRAM_BASE_URL=api.base_url, WEBHOOK_URL="http://127.0.0.1:9/hook",
                WEBHOOK_SECRET=secret, BOT_MODEL=str(tmp_path / "no-such-model"),
                DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'bot.sqlite3'}",
            )  # fmt: skip
            proc = await run_cli_async("run", cwd=tmp_path, env=env, limit_s=60)
            assert proc.returncode == 2, proc.stderr[-2000:]
            assert expected in proc.stderr
            assert "Traceback" not in proc.stderr + proc.stdout
            assert secret not in proc.stderr + proc.stdout
        assert api.calls == []  # refused before it even asked Telegram who it is


async def test_run_refuses_a_variants_file_beyond_the_machine_with_status_2(
    tmp_path: Path,
) -> None:
    """Regression: `threads = 100000` started a worker that exhausted the host's threads and
    crashed the service with a traceback."""
    from tests.support.botprocess import TOKEN
    from tests.support.fakebotapi import FakeBotAPI

    variants = tmp_path / "variants.toml"
    variants.write_text('[[variants]]\nname = "big"\nmodel = "zoo:x/model"\nthreads = 100000\n')
    async with FakeBotAPI(TOKEN) as api:
        env = cli_env(
            tmp_path, TELEGRAM_BOT_TOKEN=TOKEN,
            TELEGRAM_BASE_URL=api.base_url, VARIANTS_FILE=str(variants),
            DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'bot.sqlite3'}",
        )  # fmt: skip
        proc = await run_cli_async("run", cwd=tmp_path, env=env, limit_s=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "variant 'big': threads must be a whole number from 1 to 256" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_invalid_settings_are_one_clean_line_each_without_their_values(tmp_path: Path) -> None:
    """Regression: WEBHOOK_PORT=abc printed pydantic's traceback (noticed with issue 11.8)."""
    env = cli_env(
        tmp_path, WEBHOOK_PORT="abc", BATCH_MAX_SIZE="0",
        GROUP_POLICY="s3cr3t-typo", DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'b.sqlite3'}",
    )  # fmt: skip
    proc = run_cli("db", "current", cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "error: invalid settings" in proc.stderr
    for name in ("WEBHOOK_PORT", "BATCH_MAX_SIZE", "GROUP_POLICY"):
        assert f"\n  {name}: " in proc.stderr
    assert "s3cr3t-typo" not in proc.stderr


# A bad file of each kind `run` reads: (environment variable, file text, what the error names).
BAD_FILES = {
    "variants": (
        "VARIANTS_FILE",
        '[[variants]]\nname = "big"\nmodel = "zoo:x/model"\nthreads = 100000\n',
        "variant 'big': threads must be a whole number from 1 to",
    ),
    "personas": ("PERSONAS_FILE", '[presets]\n"bad name!" = "a persona"\n', "preset 'bad name!'"),
    "privacy": ("PRIVACY_FILE", None, "PRIVACY_FILE"),  # None: the file does not exist
}
CONFIG_ERROR_WITHIN_S = 20.0  # a start that checks first exits in about a second


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_config_errors_do_not_wait_for_the_network(tmp_path: Path, kind: str) -> None:
    """Regression (issue 32.5): with an unreachable Bot API, `run` retried getMe (forever)
    before it read the variants file; reachable, it exited 2 only after getMe and a database
    migration. A bad file now exits 2 at once, naming the problem, before any connection."""
    from tests.support.botprocess import TOKEN, free_port

    variable, text, expected = BAD_FILES[kind]
    bad = tmp_path / f"{kind}.toml"
    if text is not None:
        bad.write_text(text)
    db_file = tmp_path / "bot.sqlite3"
    env = cli_env(
        tmp_path, TELEGRAM_BOT_TOKEN=TOKEN,
        TELEGRAM_BASE_URL=f"http://127.0.0.1:{free_port()}/bot",  # nothing listens there
        DATABASE_URL=f"sqlite+aiosqlite:///{db_file}", **{variable: str(bad)},
    )  # fmt: skip
    started = time.monotonic()
    try:
        proc = run_cli("run", cwd=tmp_path, env=env, timeout=CONFIG_ERROR_WITHIN_S)
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode() + (err.stderr or b"").decode()
        pytest.fail(f"still running after {CONFIG_ERROR_WITHIN_S:g} s:\n{output[-3000:]}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert time.monotonic() - started < CONFIG_ERROR_WITHIN_S
    assert f"error: {variable} {bad}" in proc.stderr
    assert expected in proc.stderr
    assert "getMe" not in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not db_file.exists()  # nor did it connect to the database


async def test_the_getme_retry_warning_names_the_bot_api_url_but_not_the_token(
    tmp_path: Path,
) -> None:
    """Regression (issue 32.5): the retries said "cannot reach the Bot API" without saying
    where. They name TELEGRAM_BASE_URL now, never a request URL (`.../bot<token>/getMe`)."""
    from tests.support.botprocess import TOKEN, BotProcess, free_port
    from tests.support.waits import until

    base_url = f"http://127.0.0.1:{free_port()}/bot"  # nothing listens there
    env = cli_env(
        tmp_path, TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_BASE_URL=base_url,
        DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'bot.sqlite3'}",
    )  # fmt: skip
    bot = BotProcess(env, tmp_path, tmp_path / "bot.log")
    try:
        await until(
            lambda: "retry 1" in bot.output() or bot.proc.poll() is not None,
            within_s=90,
            what="the first getMe retry",
        )
    finally:
        bot.kill()
    output = bot.output()
    [warning] = [line for line in output.splitlines() if "retry 1" in line]
    assert f"getMe (cannot reach the Bot API at {base_url}) failed" in warning
    assert TOKEN.split(":")[1] not in output
    assert "[REDACTED]" not in warning  # not even masked: the token is never in it


def test_bot_model_without_weights_exits_2_before_the_network(
    tmp_path: Path, tiny_model_file: str
) -> None:
    """Regression (issue 32.1 and 32.5): BOT_MODEL with its options and dictionary but no
    weights was served with random weights; now `run` refuses it, naming the missing file,
    before it connects to the database or the Bot API."""
    from tests.integration.engine.test_incomplete_models import copy_without
    from tests.support.botprocess import TOKEN, free_port

    weightless = copy_without(tiny_model_file, tmp_path / "m", "")
    env = cli_env(
        tmp_path, TELEGRAM_BOT_TOKEN=TOKEN, BOT_MODEL=weightless,
        TELEGRAM_BASE_URL=f"http://127.0.0.1:{free_port()}/bot",  # nothing listens there
        DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'bot.sqlite3'}",
    )  # fmt: skip
    proc = run_cli("run", cwd=tmp_path, env=env, timeout=CONFIG_ERROR_WITHIN_S)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        f"BOT_MODEL: the model at {weightless} is incomplete: missing {weightless} (the weights)"
        in proc.stderr
    )
    assert "getMe" not in proc.stderr + proc.stdout
    assert not (tmp_path / "bot.sqlite3").exists()


async def test_bad_access_and_quota_settings_exit_2_before_the_network(tmp_path: Path) -> None:
    """ALLOWED_USERS / ALLOWED_CHATS entries that are neither ids nor @usernames, and a quota
    below 1, stop `run` with one line each and status 2, before getMe; the entry is not echoed
    (a mistyped variable may hold a secret)."""
    from tests.support.botprocess import TOKEN
    from tests.support.fakebotapi import FakeBotAPI

    async with FakeBotAPI(TOKEN) as api:
        env = cli_env(
            tmp_path, TELEGRAM_BOT_TOKEN=TOKEN,
            TELEGRAM_BASE_URL=api.base_url, ALLOWED_USERS="123, alice smith",
            ALLOWED_CHATS="https://t.me/x", QUOTA_PER_DAY="0",
            DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'bot.sqlite3'}",
        )  # fmt: skip
        proc = await run_cli_async("run", cwd=tmp_path, env=env, limit_s=60)
        assert api.calls == []
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "ALLOWED_USERS must be numeric Telegram ids or @usernames" in proc.stderr
    assert "entry 2 is neither" in proc.stderr
    assert "ALLOWED_CHATS must be numeric Telegram ids or @usernames" in proc.stderr
    assert "QUOTA_PER_DAY" in proc.stderr
    assert "alice smith" not in proc.stderr and "t.me" not in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
