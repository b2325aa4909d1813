"""Every compatibility shim ParlAI 1.7.2 needs on today's torch/numpy/setuptools, in one place.

ParlAI is no longer developed; its last release predates torch 2.2. Each shim below names what
broke and is covered by tests/unit/inference/test_compat.py. Nothing here runs at import:
`apply()` is called once per process by its composition root (bot/__main__.py;
tests/conftest.py and the benchmarks for theirs), and a second call changes nothing.

Order: call it before anything imports ParlAI, so that the warning filter is in place when ParlAI
imports pkg_resources. The torch shim patches ReduceLROnPlateau itself, which ParlAI looks up
only when it builds a scheduler, so it also holds when ParlAI was imported first.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any


def _reduce_lr_on_plateau_verbose() -> None:
    """torch 2.7 removed ReduceLROnPlateau(verbose=...); ParlAI passes verbose=True.

    Without this, `parlai train_model` with its default scheduler, and loading a model outside
    interactive mode, fail with "unexpected keyword argument 'verbose'".
    """
    from torch.optim import lr_scheduler

    cls = lr_scheduler.ReduceLROnPlateau
    if "verbose" in inspect.signature(cls.__init__).parameters:
        return
    if getattr(cls.__init__, "_bot_compat", False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, verbose: Any = None, **kwargs: Any) -> None:
        original(self, *args, **kwargs)

    __init__._bot_compat = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[method-assign]


def _quiet_pkg_resources_warning() -> None:
    """ParlAI imports pkg_resources (setuptools<81 keeps it); silence its deprecation notice."""
    message = "pkg_resources is deprecated"
    installed = (f for f in warnings.filters if f[0] == "ignore" and f[1] is not None)
    if any(f[1].pattern == message for f in installed):  # type: ignore[union-attr]
        return
    warnings.filterwarnings("ignore", message=message, category=UserWarning)


def apply() -> None:
    """Install every shim; each one is idempotent, so is this."""
    _quiet_pkg_resources_warning()
    _reduce_lr_on_plateau_verbose()
