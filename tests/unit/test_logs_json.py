"""LOG_FORMAT=json: one JSON object per line, with the log context, and no way around the
redaction (arguments, exceptions, `extra` fields, dict messages)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from bot.logs import log_context
from tests.support.logcapture import captured_root

TOKEN = "1234567890:FAKE-json-log-redaction-test-token0"  # not a real token
SECRET = "webhook-Secret-value_0123"
PASSWORD = 'db"pass\\word-77'  # characters JSON escapes: redaction must happen before encoding


@pytest.fixture
def json_root() -> Iterator[io.StringIO]:
    """The root logger set up as `python -m bot run` does with LOG_FORMAT=json, writing to the
    stream yielded; restored after."""
    with captured_root([TOKEN, SECRET, PASSWORD], "json") as out:
        yield out


def _lines(out: io.StringIO) -> list[dict[str, object]]:
    text = out.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


class Holder:
    """An object passed in `extra`, whose text holds a secret."""

    def __str__(self) -> str:
        return f"holder of {TOKEN}"


def test_each_line_is_one_json_object_with_the_log_context(
    json_root: io.StringIO,
) -> None:
    log = logging.getLogger("bot.tests.json")
    log.info("before %s", "any update")
    with log_context(chat_id=42, update_id=100007):
        log.warning("a line\nwith a break")
    log.debug("after")
    before, during, after = _lines(json_root)
    assert during["message"] == "a line\nwith a break"
    assert (during["level"], during["logger"]) == ("WARNING", "bot.tests.json")
    assert (during["chat_id"], during["update_id"]) == (42, 100007)
    assert "chat_id" not in before and "chat_id" not in after
    assert before["message"] == "before any update"
    when = datetime.fromisoformat(str(during["time"]))
    assert when.utcoffset() == timedelta(0)
    assert abs((datetime.now(when.tzinfo) - when).total_seconds()) < 60


def test_no_path_around_the_redaction(json_root: io.StringIO) -> None:
    log = logging.getLogger("bot.tests.json")
    log.info("GET https://api.telegram.org/bot%s/getMe", TOKEN)
    try:
        raise RuntimeError(f"connect failed: password={PASSWORD} secret={SECRET}")
    except RuntimeError:
        log.exception("database down")
    log.info("extras", extra={"url": f"postgresql://bot:{PASSWORD}@db", "obj": Holder()})
    log.info("nested", extra={"ctx": {"headers": [SECRET], TOKEN: 1}})
    log.info({"dict_message": TOKEN})  # type: ignore[arg-type]
    log.info("stack", stack_info=True, extra={"n": 1})
    raw = json_root.getvalue()
    lines = [json.loads(line) for line in raw.splitlines()]
    assert len(lines) == 6
    text = json.dumps(lines, ensure_ascii=False)  # the decoded values, escapes undone
    for secret in (TOKEN, TOKEN.split(":")[1], SECRET, PASSWORD):
        assert secret not in raw
        assert secret not in text
    exc = str(lines[1]["exception"])
    assert "RuntimeError: connect failed: password=[REDACTED]" in exc
    assert "Traceback" in exc
    assert lines[2]["url"] == "postgresql://bot:***@db"  # as safe_url() masks it
    assert lines[2]["obj"] == "holder of [REDACTED]"
    assert lines[3]["ctx"] == {"headers": ["[REDACTED]"], "[REDACTED]": 1}
