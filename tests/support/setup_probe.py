"""`python -m bot` with the process-wide set-up counted: what tests/integration/
test_composition_root.py checks.

Usage: python -m tests.support.setup_probe COMMAND [ARGS...]. Runs the real command line, then
prints `SETUP=<json>`: how often each set-up function ran, the root logger's handlers, whether
ParlAI was imported before its shims, and which bot.training modules were loaded.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

import bot.inference.compat
import bot.inference.model
import bot.logs

calls: Counter[str] = Counter()
parlai_before_shims: list[bool] = []


def count(module: Any, name: str, before: Callable[[], None] | None = None) -> None:
    """Count the calls of `module.name` (callers that import it at call time see the wrapper)."""
    real = getattr(module, name)

    @functools.wraps(real)
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        if before is not None:
            before()
        return real(*args, **kwargs)

    setattr(module, name, counted)


def main(argv: list[str]) -> int:
    """Run `python -m bot ARGV` with the set-up functions counted; print the report."""
    count(bot.logs, "setup_logging")
    count(bot.inference.model, "route_parlai_logging")
    count(bot.inference.model, "set_torch_threads")
    count(torch, "set_num_threads")
    count(
        bot.inference.compat,
        "apply",
        lambda: parlai_before_shims.append(any(m.startswith("parlai") for m in sys.modules)),
    )
    from bot.__main__ import main as bot_main

    status = bot_main(argv)
    report = {
        "status": status,
        "calls": dict(calls),
        "root_handlers": len(logging.getLogger().handlers),
        "parlai_before_shims": parlai_before_shims,
        "training_modules": sorted(m for m in sys.modules if m.startswith("bot.training")),
    }
    print("SETUP=" + json.dumps(report), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
