"""Settings read the environment the way operators expect."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.config import ConfigError, Settings


def test_defaults_use_sqlite_under_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    s = Settings(_env_file=None, data_dir="somewhere")  # type: ignore[call-arg]
    assert s.db_url == "sqlite+aiosqlite:///somewhere/bot.sqlite3"


def test_admin_ids_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADMIN_USER_IDS", "1, 22,333")
    assert Settings(_env_file=None).admin_user_ids == [1, 22, 333]  # type: ignore[call-arg]


def test_admin_ids_must_be_numeric(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADMIN_USER_IDS", "alice")
    with pytest.raises(ValueError, match="numeric"):
        Settings(_env_file=None)  # type: ignore[call-arg]


def test_secrets_do_not_show_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123456:ABCdefGHIjklMNOpqrSTUvwxYZ012345678")
    monkeypatch.setenv("DATABASE_URL", "postgresql+asyncpg://u:hunter2@db/x")
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert "ABCdef" not in repr(s)
    assert "hunter2" not in repr(s)


def test_missing_token_says_what_to_do() -> None:
    s = Settings(_env_file=None, telegram_bot_token=None)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="make chat"):
        s.require_token()


def test_webhook_requires_secret() -> None:
    s = Settings(  # type: ignore[call-arg]
        _env_file=None, telegram_bot_token="1:x", webhook_url="https://example.org/hook"
    )
    with pytest.raises(ConfigError, match="WEBHOOK_SECRET"):
        s.require_token()


def test_webhook_secret_is_16_to_256_of_telegrams_characters() -> None:
    for good in ("", "a" * 16, "Az09_-" * 40 + "abcdefghijklmnop"):
        s = Settings(_env_file=None, webhook_secret=good)  # type: ignore[call-arg]
        assert s.webhook_secret is not None and s.webhook_secret.get_secret_value() == good
    for bad in (
        "abc",
        "a" * 15,
        "bad secret+chars",
        "x" * 257,
        "sixteen-chars-ok\n",
        "dürfen-nicht",
    ):
        with pytest.raises(ConfigError, match="WEBHOOK_SECRET must be 16 to 256 characters") as err:
            Settings(_env_file=None, webhook_secret=bad)  # type: ignore[call-arg]
        assert bad not in str(err.value)


def test_every_setting_is_documented() -> None:
    """Every field is mirrored in .env.example (with a comment) and in docs/configuration.md."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    example = (root / ".env.example").read_text().splitlines()
    table = (root / "docs" / "configuration.md").read_text()
    for name in Settings.model_fields:
        env = name.upper()
        index = next((i for i, line in enumerate(example) if line.startswith(env + "=")), None)
        assert index is not None, f"{env} missing from .env.example"
        assert example[index - 1].startswith("#"), f"{env} has no comment in .env.example"
        assert f"| `{env}` |" in table, f"{env} missing from the table in docs/configuration.md"


def test_a_copy_of_env_example_is_valid_settings() -> None:
    """`cp .env.example .env` must start: empty `NAME=` lines mean unset."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / ".env.example"
    s = Settings(_env_file=example)  # type: ignore[call-arg]
    assert s.torch_threads is None and s.beam_size is None and s.variants_file is None


def test_a_copy_of_env_example_leaves_the_terminal_chat_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (issue 32.11): .env.example said LOG_LEVEL=INFO, and a LOG_LEVEL that is set
    wins over the chat's WARNING: a copy of it would have brought the INFO lines back."""
    from pathlib import Path

    monkeypatch.delenv("LOG_LEVEL", raising=False)
    example = Path(__file__).resolve().parents[2] / ".env.example"
    s = Settings(_env_file=example)  # type: ignore[call-arg]
    assert s.log_level == "INFO" and "log_level" not in s.model_fields_set


@pytest.mark.parametrize(
    "name", ["TORCH_THREADS", "WORKER_THREADS", "AGENT_CACHE_SIZE", "MAX_CONCURRENT_CHATS"]
)
def test_counts_that_could_exhaust_the_host_are_bounded(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """`WORKER_THREADS=100000` would start that many threads per worker (issue: it took the
    host down through the variants file): refused, naming the setting, never the value."""
    from pydantic import ValidationError

    from bot.config import describe_invalid_settings

    monkeypatch.setenv(name, "100000000")
    with pytest.raises(ValidationError) as err:
        Settings(_env_file=None)  # type: ignore[call-arg]
    assert f"{name}: Input should be less than or equal to" in describe_invalid_settings(err.value)


def test_worker_liveness_settings_have_sane_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert (s.worker_stall_s, s.generation_timeout_s) == (10.0, 120.0)
    monkeypatch.setenv("WORKER_STALL_S", "0.5")  # would kill healthy workers between pings
    with pytest.raises(ValueError, match="worker_stall_s"):
        Settings(_env_file=None)  # type: ignore[call-arg]


CREDENTIAL_TOKEN = "123456:CredentialTokenFromSystemd_abcdefghij"


def test_token_from_the_systemd_credential_when_the_environment_has_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """LoadCredential=telegram-bot-token:PATH: systemd puts the file in $CREDENTIALS_DIRECTORY."""
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)
    (tmp_path / "telegram-bot-token").write_text(CREDENTIAL_TOKEN + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert s.require_token() == CREDENTIAL_TOKEN
    assert CREDENTIAL_TOKEN not in repr(s)
    # It is masked in the logs like a token from the environment.
    from bot.logs import settings_secrets

    assert CREDENTIAL_TOKEN in settings_secrets(s)
    # An empty TELEGRAM_BOT_TOKEN= (as .env.example has it) is unset: the credential counts.
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "")
    assert Settings(_env_file=None).require_token() == CREDENTIAL_TOKEN  # type: ignore[call-arg]


def test_the_environment_token_wins_over_the_credential(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "telegram-bot-token").write_text(CREDENTIAL_TOKEN)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "1:from-the-environment")
    assert Settings(_env_file=None).require_token() == "1:from-the-environment"  # type: ignore[call-arg]


def test_a_missing_or_unreadable_credential_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="LoadCredential=telegram-bot-token:PATH") as err:
        s.require_token()
    assert str(tmp_path / "telegram-bot-token") in str(err.value)
    (tmp_path / "telegram-bot-token").mkdir()  # a directory: read_text fails (EISDIR)
    with pytest.raises(ConfigError, match="cannot read the token credential") as err:
        Settings(_env_file=None)  # type: ignore[call-arg]
    assert "Is a directory" in str(err.value)
    # Without CREDENTIALS_DIRECTORY the message does not mention credentials.
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError) as err:
        Settings(_env_file=None).require_token()  # type: ignore[call-arg]
    assert "credential" not in str(err.value)


def test_allowed_users_and_chats_are_ids_and_usernames() -> None:
    s = Settings(  # type: ignore[call-arg]
        _env_file=None, allowed_users=" 123, @Alice_B ;-5", allowed_chats="-1001234567890,"
    )
    assert s.allowed_users == ["123", "@alice_b", "-5"]
    assert s.allowed_chats == ["-1001234567890"]
    assert Settings(_env_file=None).allowed_users == []  # type: ignore[call-arg]
    for bad in ("alice", "@", "12ab", "@with space", "@" + "x" * 33):
        with pytest.raises(ValidationError, match="ALLOWED_USERS must be numeric"):
            Settings(_env_file=None, allowed_users=bad)  # type: ignore[call-arg]
