"""Secrets never reach a log line."""

from __future__ import annotations

import logging

import pytest
from pydantic import SecretStr

from bot.config import Settings
from bot.logs import RedactingFilter, settings_secrets

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
        _env_file=None, database_url=SecretStr("postgresql+asyncpg://bot:p%40ss%2Fw0rd@db/bot")
    )
    logger = logging.getLogger("test.redact.encoded")
    logger.addFilter(RedactingFilter(settings_secrets(settings)))
    with caplog.at_level(logging.DEBUG, logger="test.redact.encoded"):
        logger.debug("url %s, password %s", "postgresql://bot:p%40ss%2Fw0rd@db/bot", "p@ss/w0rd")
    line = caplog.records[0].getMessage()
    assert "p%40ss%2Fw0rd" not in line and "p@ss/w0rd" not in line
