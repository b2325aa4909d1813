"""`python -m bench.e2e --loop-trace`: when the bot starts with this folder on PYTHONPATH and
BENCH_LOOPTRACE_DIR set, every callback its event loop runs is timed (start, duration, the
thread's CPU time), its time is added up by what ran it (a task's name up to its first ":",
e.g. "draft" or "delivery", an unnamed task's coroutine, or else the callback's function), and
both are written to that folder as JSON when the process exits. Worker processes the bot starts
inherit the folder but write nothing, nor does a process that ran no event loop
(multiprocessing's resource tracker). Not part of the service: a probe for the benchmark.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import atexit
import json
import multiprocessing
import os
import time
from collections import defaultdict

_DIR = os.environ.get("BENCH_LOOPTRACE_DIR")
_busy: list[tuple[float, float, float]] = []
# calls, seconds, CPU seconds, the longest call's seconds
_by: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])


def _what(handle: asyncio.events.Handle) -> str:
    """What a callback belongs to: its task's name up to ":", else its function's name."""
    callback = handle._callback  # type: ignore[attr-defined]
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        name = owner.get_name()
        if name.startswith("Task-"):  # unnamed: its coroutine's function says more
            coro = owner.get_coro()
            return f"task {getattr(coro, '__qualname__', name)}"
        return name.split(":", 1)[0]
    return getattr(callback, "__qualname__", type(callback).__name__)


if _DIR:
    _run = asyncio.events.Handle._run

    def _timed_run(self: asyncio.events.Handle) -> None:
        started, wall, cpu = time.perf_counter(), time.time(), time.thread_time()
        try:
            _run(self)
        finally:
            took = time.perf_counter() - started
            if took > 2e-5:  # the loop's own bookkeeping between callbacks is not counted
                # The thread's own CPU time too: the rest of `took` it waited, for the GIL
                # (held by another thread) or for a core.
                used = time.thread_time() - cpu
                _busy.append((wall, took, used))
                entry = _by[_what(self)]
                entry[0] += 1
                entry[1] += took
                entry[2] += used
                entry[3] = max(entry[3], took)

    asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]

    def _dump() -> None:
        if multiprocessing.parent_process() is not None or not _busy:
            return  # a worker process of the bot's, or one that ran no event loop
        os.makedirs(_DIR, exist_ok=True)
        with open(os.path.join(_DIR, f"{os.getpid()}.json"), "w", encoding="utf-8") as f:
            json.dump({"callbacks": _busy, "by": _by}, f)

    atexit.register(_dump)
