"""Every compatibility shim ParlAI 1.7.2 needs on today's torch/numpy/setuptools, in one place.

ParlAI is no longer developed; its last release predates torch 2.2. Each shim below names what
broke and is covered by tests/unit/test_compat.py. `apply()` is idempotent and is called before
any ParlAI model is built or trained.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

_applied = False


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
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)


def apply() -> None:
    """Install every shim (idempotent)."""
    global _applied
    if _applied:
        return
    _quiet_pkg_resources_warning()
    _reduce_lr_on_plateau_verbose()
    _applied = True
