"""`python -m bot` with generation slowed down: fault injection for the process tests.

Crash, restart and two-instance tests need a generation that lasts long enough to kill the
process in the middle of it. That knob is not a setting an operator could turn (issue 12):
this wrapper, used by BotProcess when FAULT_GENERATION_DELAY_MS is set, makes every batch
(every round of turns joining the continuous scheduler) sleep that long before generating,
then runs the real command line unchanged.

The patch is applied on import: model worker processes are started with `spawn`, which imports
this module (the parent's main module) in the worker as `__mp_main__`, so the worker's batches
are slowed down too. A test's own Ray instance names `ray_setup` as its workers' setup hook, so
that its Serve replicas are slowed down the same way; with FAULT_MARK_DIR set, a process marks
each batch it starts (a file named by its pid), so that a test knows which replica is generating.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from bot.inference.batcher import Batcher
from bot.inference.scheduler import Scheduler

ENV = "FAULT_GENERATION_DELAY_MS"
MARK_ENV = "FAULT_MARK_DIR"


def _mark() -> None:
    mark_dir = os.environ.get(MARK_ENV)
    if mark_dir:
        with open(os.path.join(mark_dir, str(os.getpid())), "a") as mark:
            mark.write("batch\n")


def slow_down(delay_s: float) -> None:
    """Make every batch of every Batcher, and every round of turns joining a continuous
    Scheduler, sleep `delay_s` on the inference thread first."""
    run_batch = Batcher._run_batch
    admit = Scheduler._admit

    def slow(self: Batcher, batch: Any) -> Any:
        _mark()
        time.sleep(delay_s)
        return run_batch(self, batch)

    def slow_admit(self: Scheduler, jobs: Any) -> None:
        _mark()
        time.sleep(delay_s)
        admit(self, jobs)

    Batcher._run_batch = slow  # type: ignore[method-assign]
    Scheduler._admit = slow_admit  # type: ignore[method-assign]


def ray_setup() -> None:
    """A Ray worker's setup hook: the patch is applied on this module's import."""


slow_down(float(os.environ.get(ENV, "0")) / 1000.0)

if __name__ == "__main__":
    from bot.__main__ import main

    sys.exit(main())
