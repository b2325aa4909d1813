"""Logging set-up with a filter that keeps secrets out of every log line."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

from pythonjsonlogger.json import JsonFormatter

# `bot<digits>:<secret>` in URLs (httpx logs every request URL) and bare tokens.
_TOKEN_RE = re.compile(r"(bot)?\d{5,}:[A-Za-z0-9_-]{20,}")
# The password in any URL (scheme://user:password@host), read as SQLAlchemy's make_url reads
# it: up to the `@`, in the form the URL carries it (percent-encoded or not). Masked as
# safe_url() masks it, however short, and only there.
_URL_PASSWORD_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://[^\s:/]*:)[^\s@]*@")


class RedactingFilter(logging.Filter):
    """Replace bot tokens and registered secret values in every record with `[REDACTED]`, and
    the password of every URL with `***`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Every registered secret, however short: a short one is still a secret (settings_secrets
        # registers none under SECRET_MIN_CHARS, so log lines are not shredded by it).
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """The text with every secret masked."""
        for secret in self.secrets:
            text = text.replace(secret, "[REDACTED]")
        return _URL_PASSWORD_RE.sub(r"\1***@", _TOKEN_RE.sub("[REDACTED]", text))

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


# The chat and update being worked on in this task (set by the inbox worker and delivery, and
# per turn in a model worker): every log line written meanwhile carries them.
_chat_id: ContextVar[int | None] = ContextVar("log_chat_id", default=None)
_update_id: ContextVar[int | None] = ContextVar("log_update_id", default=None)
CONTEXT_FIELDS = ("chat_id", "update_id")


@contextlib.contextmanager
def log_context(*, chat_id: int | None = None, update_id: int | None = None) -> Iterator[None]:
    """Tag every log record written inside the block (in this task and the tasks it starts)
    with `chat_id` and `update_id`."""
    tokens = (_chat_id.set(chat_id), _update_id.set(update_id))
    try:
        yield
    finally:
        _update_id.reset(tokens[1])
        _chat_id.reset(tokens[0])


class ContextFilter(logging.Filter):
    """Copy the log context (chat_id, update_id) onto each record, where one is set."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in (("chat_id", _chat_id), ("update_id", _update_id)):
            value = var.get()
            if value is not None and not hasattr(record, name):
                setattr(record, name, value)
        return True


class RedactingJsonFormatter(JsonFormatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, chat_id and
    update_id where known, the exception's text, and any `extra` fields.

    Every string in the object is redacted again, here: python-json-logger formats the
    exception from `exc_info` itself (not from the filter's redacted `exc_text`) and copies
    `extra` fields that the filter never looks at, so redacting only the message would let
    those through.
    """

    def __init__(self, redactor: RedactingFilter) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger", "exc_info": "exception"},
            json_ensure_ascii=False,
        )
        self.redactor = redactor

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        """The record's fields, its time first."""
        log_data["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(
            timespec="milliseconds"
        )
        super().add_fields(log_data, record, message_dict)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        """Every value as plain JSON data, every string in it redacted."""
        cleaned = self._clean(log_data)
        assert isinstance(cleaned, dict)
        return cleaned

    def _clean(self, value: object, depth: int = 0) -> object:
        if isinstance(value, str):
            return self.redactor.redact(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        if depth < 8 and isinstance(value, dict):
            return {
                self.redactor.redact(str(k)): self._clean(v, depth + 1) for k, v in value.items()
            }
        if depth < 8 and isinstance(value, list | tuple):
            return [self._clean(v, depth + 1) for v in value]
        # Anything else (an object passed in `extra`, a nested structure too deep) becomes
        # its text, which is redacted like the rest: nothing reaches json.dumps unchecked.
        return self.redactor.redact(str(value))


def setup_logging(
    level: str = "INFO",
    secrets: Iterable[str] = (),
    log_format: Literal["text", "json"] = "text",
) -> RedactingFilter:
    """Configure the root logger (once per process: bot/__main__.py, a model worker's main);
    every handler gets the redacting filter. `log_format` json: one JSON object per line."""
    redactor = RedactingFilter(secrets)
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(RedactingJsonFormatter(redactor))
        # Every line of output is JSON: a crash's traceback and Python's warnings too, which
        # would otherwise go to stderr as plain text (and unredacted).
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread
        logging.captureWarnings(True)
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(ContextFilter())
    handler.addFilter(redactor)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    set_level(level)
    return redactor


def _log_uncaught(kind: type[BaseException], err: BaseException, tb: Any) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, err, tb)
        return
    logging.getLogger("bot").critical(
        "uncaught exception: the process stops", exc_info=(kind, err, tb)
    )


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("bot").critical(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
    )


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
    """Secret values of the settings that must never appear in logs, masked wherever they
    appear: those of at least SECRET_MIN_CHARS characters. (A shorter one can only be a
    database password, as Settings refuses the others; it is masked in its URL, like every URL's
    password.)"""
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    from bot.config import SECRET_MIN_CHARS

    out: list[str] = []
    for name in ("telegram_bot_token", "webhook_secret", "dashboard_password"):
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
            # as a URL carries it (a password with @, / or %), for where it is logged alone
            out.append(quote(str(password), safe=""))
    return [s for s in dict.fromkeys(out) if len(s) >= SECRET_MIN_CHARS]
