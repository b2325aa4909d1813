"""The root logger set up as `python -m bot` sets it up, writing to a StringIO for the test;
the previous handlers and level restored afterwards (tests/unit/test_logs*.py)."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterable, Iterator
from typing import Literal

from bot.logs import setup_logging


@contextlib.contextmanager
def captured_root(
    secrets: Iterable[str], log_format: Literal["text", "json"] = "text"
) -> Iterator[io.StringIO]:
    """setup_logging at DEBUG with `secrets`, its one handler writing to the stream yielded."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    setup_logging("DEBUG", list(secrets), log_format)
    out = io.StringIO()
    (handler,) = root.handlers
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(out)
    try:
        yield out
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved:
            root.addHandler(handler)
        root.setLevel(level)
