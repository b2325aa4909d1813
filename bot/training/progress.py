"""The training progress bar: a thread that redraws it every second."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)


class Progress:
    """A time-based progress bar (the budget is time) with the latest training figures.

    tqdm on a terminal; otherwise a log line every 30 s, so `make run` logs stay readable.
    """

    def __init__(self, total_s: float, enabled: bool) -> None:
        self.total = max(total_s, 1.0)
        self.start = time.monotonic()
        self.postfix = ""
        self._stop = threading.Event()
        self._bar: Any = None
        self._last_line = 0.0
        self.tty = enabled and sys.stderr.isatty()
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=round(self.total),
                unit="s",
                desc="training",
                bar_format="{desc} {percentage:3.0f}%|{bar}| {n}/{total}s "
                "[{elapsed}<{remaining}] {postfix}",
                dynamic_ncols=True,
            )
        self._thread = threading.Thread(target=self._tick, name="train-progress", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._draw()

    def _draw(self) -> None:
        elapsed = time.monotonic() - self.start
        done = min(elapsed, self.total)
        if self._bar is not None:
            self._bar.n = round(done)
            self._bar.set_postfix_str(self.postfix, refresh=False)
            self._bar.refresh()
        elif elapsed - self._last_line >= 30.0:
            self._last_line = elapsed
            log.info(
                "training %3.0f%%, %.0fs left %s",
                100.0 * done / self.total,
                max(self.total - elapsed, 0.0),
                self.postfix,
            )

    def write(self, text: str) -> None:
        """A line that does not tear the bar."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            log.info("%s", text)

    def close(self) -> None:
        """Stop ticking and fill the bar (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        if self._bar is not None:
            self._bar.n = self._bar.total
            self._bar.refresh()
            self._bar.close()
