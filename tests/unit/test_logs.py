"""Secrets never reach a log line."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from bot.config import Settings
from bot.db.engine import safe_url
from bot.logs import RedactingFilter, settings_secrets
from tests.support.logcapture import captured_root

TOKEN = "1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1"


def test_token_in_url_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.redact")
    logger.addFilter(RedactingFilter([TOKEN, "webhook-secret-value"]))
    with caplog.at_level(logging.DEBUG, logger="test.redact"):
        logger.info("POST https://api.telegram.org/bot%s/getMe", TOKEN)
        logger.info("secret=%s", "webhook-secret-value")
        try:
            raise RuntimeError(f"boom {TOKEN}")
        except RuntimeError:
            logger.exception("failed")
    text = caplog.text + "".join(r.exc_text or "" for r in caplog.records)
    assert TOKEN not in text
    assert "webhook-secret-value" not in text
    assert "[REDACTED]" in text


def test_unregistered_token_shape_is_redacted() -> None:
    other = "987654321:ZZZdqTcvCH1vGWJxfSeofSAs0K5PALDsaw9"
    assert other not in RedactingFilter().redact(f"url=/bot{other}/sendMessage")


def test_short_secrets_are_redacted_too(caplog: pytest.LogCaptureFixture) -> None:
    """Regression: registered secrets under 4 characters were logged in clear."""
    logger = logging.getLogger("test.redact.short")
    logger.addFilter(RedactingFilter(["pw", "k3y", ""]))
    with caplog.at_level(logging.DEBUG, logger="test.redact.short"):
        logger.debug("setWebhook secret_token=%s password=%s", "k3y", "pw")
    assert caplog.records[0].getMessage() == (
        "setWebhook secret_token=[REDACTED] password=[REDACTED]"
    )


def test_admin_database_url_password_never_reaches_logs() -> None:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=SecretStr("postgresql+asyncpg://bot:svc-pass@db/bot"),
        admin_database_url=SecretStr("postgresql+asyncpg://bot_ro:ro-secret-pw@db/bot"),
    )
    assert "ro-secret-pw" in settings_secrets(settings)
    assert "ro-secret-pw" not in repr(settings)


def test_a_percent_encoded_database_password_is_redacted_in_both_forms(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Found in review: make_url() decodes the password, while a logged URL shows it encoded.
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=SecretStr("postgresql+asyncpg://bot:p%40ss%2Fw0rd-2024%21@db/bot"),
    )
    logger = logging.getLogger("test.redact.encoded")
    logger.addFilter(RedactingFilter(settings_secrets(settings)))
    with caplog.at_level(logging.DEBUG, logger="test.redact.encoded"):
        logger.debug("encoded %s, decoded %s", "p%40ss%2Fw0rd-2024%21", "p@ss/w0rd-2024!")
    line = caplog.records[0].getMessage()
    assert "p%40ss%2Fw0rd-2024%21" not in line and "p@ss/w0rd-2024!" not in line


@pytest.fixture
def text_root() -> Iterator[io.StringIO]:
    """The root logger set up as `python -m bot` does (text lines), writing to the stream
    yielded; restored after."""
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        telegram_bot_token=SecretStr(TOKEN),
        database_url=SecretStr("postgresql+asyncpg://bot:a@db/bot"),
        admin_database_url=SecretStr("postgresql+asyncpg://bot_ro:ro@db/bot"),
        dashboard_password=SecretStr("a long dashboard passphrase"),
    )
    with captured_root(settings_secrets(settings)) as out:
        yield out


def test_a_short_database_password_is_masked_in_its_url_only(text_root: io.StringIO) -> None:
    """Regression: a password of one letter was masked wherever the letter was, which shredded
    every line and told the password: `d[REDACTED]shbo[REDACTED]rd [REDACTED]t ...`."""
    log = logging.getLogger("bot.dashboard.server")
    url = "postgresql+asyncpg://bot_ro:ro@db/bot"
    log.info("dashboard at %s (database %s, read-only)", "http://127.0.0.1:8090/", safe_url(url))
    log.warning("cannot reach %s: %s", url, "connection refused")
    # any URL's password, in the form the URL carries it, whatever the scheme
    log.warning("retrying postgresql://bot:a@db:5432/bot and redis://:p%40ss@cache/0")
    log.info("login with %s", "a long dashboard passphrase")
    lines = [line.split(": ", 1)[1] for line in text_root.getvalue().splitlines()]
    assert lines == [
        "dashboard at http://127.0.0.1:8090/ (database postgresql+asyncpg://bot_ro:***@db/bot, "
        "read-only)",
        "cannot reach postgresql+asyncpg://bot_ro:***@db/bot: connection refused",
        "retrying postgresql://bot:***@db:5432/bot and redis://:***@cache/0",
        "login with [REDACTED]",  # a long secret is masked wherever it is
    ]
