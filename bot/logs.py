"""Logging set-up with a filter that keeps secrets out of every log line."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

# `bot<digits>:<secret>` in URLs (httpx logs every request URL) and bare tokens.
_TOKEN_RE = re.compile(r"(bot)?\d{5,}:[A-Za-z0-9_-]{20,}")


class RedactingFilter(logging.Filter):
    """Replace bot tokens and registered secret values in every record with `[REDACTED]`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Every registered secret, however short: a short one is still a secret (Settings
        # refuses a WEBHOOK_SECRET under 16 characters, so log lines are not shredded by it).
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """The text with every secret masked."""
        for secret in self.secrets:
            text = text.replace(secret, "[REDACTED]")
        return _TOKEN_RE.sub("[REDACTED]", text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self.redact(message)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def setup_logging(level: str = "INFO", secrets: Iterable[str] = ()) -> RedactingFilter:
    """Configure the root logger (once per process: bot/__main__.py); every handler gets the
    redacting filter."""
    redactor = RedactingFilter(secrets)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(redactor)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    set_level(level)
    return redactor


def set_level(level: str) -> None:
    """The root logger's level, and the noisy libraries' levels that follow it."""
    root = logging.getLogger()
    root.setLevel(level)
    # httpx logs each request URL (which holds the token) at INFO; keep it quiet anyway.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
    logging.getLogger("httpcore").setLevel(max(logging.WARNING, root.level))
    # aiosqlite logs every statement with its parameters (message texts) at DEBUG.
    logging.getLogger("aiosqlite").setLevel(max(logging.INFO, root.level))


def settings_secrets(settings: object) -> list[str]:
    """Secret values of the settings that must never appear in logs."""
    from sqlalchemy.engine import make_url

    out: list[str] = []
    for name in ("telegram_bot_token", "webhook_secret"):
        value = getattr(settings, name, None)
        if value is not None:
            out.append(value.get_secret_value())
    urls = [getattr(settings, "db_url", None)]
    admin_url = getattr(settings, "admin_database_url", None)
    if admin_url is not None:
        urls.append(admin_url.get_secret_value())
    for url in urls:
        if not url:
            continue
        try:
            password = make_url(url).password
        except Exception:  # noqa: BLE001 - a malformed URL has no password to hide
            password = None
        if password:
            out.append(str(password))
    return out
