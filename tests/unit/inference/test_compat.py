"""Each ParlAI 1.7.2 compatibility shim, exercised through the ParlAI code that broke.

Every test here fails when its shim is removed from `compat.apply()`, on the pinned torch 2.13;
and importing bot.inference installs none of them (bot/__main__.py does, once).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bot.inference import compat

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _shims() -> None:
    compat.apply()


def _optimizer() -> torch.optim.Optimizer:
    param = torch.nn.Parameter(torch.zeros(3))
    return torch.optim.Adam([param], lr=1.0)


def test_reduce_on_plateau_scheduler_builds_on_a_real_optimizer() -> None:
    """ParlAI passes ReduceLROnPlateau(verbose=True), which torch removed in 2.7."""
    from parlai.nn.lr_scheduler import ReduceOnPlateauLRScheduler

    optimizer = _optimizer()
    scheduler = ReduceOnPlateauLRScheduler(
        optimizer, patience=0, decay=0.5, warmup_updates=-1, warmup_rate=1e-4
    )
    # The wrapped scheduler still works: two validations without improvement halve the LR.
    scheduler.valid_step({"loss": 1.0})
    scheduler.valid_step({"loss": 2.0})
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5)


def test_parlai_default_scheduler_factory_builds() -> None:
    """What TrainLoop does with ParlAI's default `--lr-scheduler reduceonplateau`."""
    from parlai.nn.lr_scheduler import ParlAILRScheduler

    opt = {
        "lr_scheduler": "reduceonplateau",
        "lr_scheduler_patience": 3,
        "lr_scheduler_decay": 0.5,
        "warmup_updates": -1,
        "max_train_steps": -1,
    }
    scheduler = ParlAILRScheduler.lr_scheduler_factory(opt, _optimizer(), {}, hard_reset=True)
    assert type(scheduler).__name__ == "ReduceOnPlateauLRScheduler"


def test_shim_keeps_every_other_argument() -> None:
    """The shim only drops `verbose`; mode, factor and patience still reach torch."""
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
        _optimizer(), "max", factor=0.25, patience=7, verbose=True
    )
    assert (sched.mode, sched.factor, sched.patience) == ("max", 0.25, 7)


def test_apply_is_idempotent() -> None:
    """A second apply() must not wrap the wrapper (each call would add a layer)."""
    before = torch.optim.lr_scheduler.ReduceLROnPlateau.__init__
    compat.apply()
    compat._reduce_lr_on_plateau_verbose()  # even forcing the shim again changes nothing
    assert torch.optim.lr_scheduler.ReduceLROnPlateau.__init__ is before
    assert "optimizer" in inspect.signature(before).parameters


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_importing_bot_inference_changes_nothing_process_wide() -> None:
    """Issue 12.5: no shim, no warning filter at import; bot/__main__.py installs them."""
    code = textwrap.dedent(
        """
        import importlib, pkgutil, warnings
        import torch

        def state():
            init = torch.optim.lr_scheduler.ReduceLROnPlateau.__init__
            return list(warnings.filters), init, getattr(init, "_bot_compat", False)

        before = state()
        import bot.inference
        assert state() == before, "import bot.inference changed process-wide state"

        def import_all(package):
            for mod in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(mod.name)

        # Every module of the package, after what they import (ParlAI, SQLAlchemy and others
        # install warning filters of their own).
        import parlai.agents.transformer.transformer, parlai.core.torch_generator_agent
        import bot.config, bot.conversations, bot.db
        import_all(bot.conversations)
        import_all(bot.db)
        before = state()
        import_all(bot.inference)
        after = state()
        assert after[1:] == before[1:], "importing bot.inference patched torch"
        assert after[0] == before[0], [f for f in after[0] if f not in before[0]]
        print("OK")
        """
    )
    proc = _python(code)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_shims_hold_when_parlai_was_imported_first() -> None:
    """The torch shim patches the class ParlAI looks up when it builds a scheduler, so apply()
    after ParlAI's import still fixes it (only the pkg_resources notice needs apply() first)."""
    code = textwrap.dedent(
        """
        import torch
        from parlai.nn.lr_scheduler import ReduceOnPlateauLRScheduler
        from bot.inference import compat

        compat.apply()
        param = torch.nn.Parameter(torch.zeros(3))
        optimizer = torch.optim.Adam([param], lr=1.0)
        ReduceOnPlateauLRScheduler(
            optimizer, patience=0, decay=0.5, warmup_updates=-1, warmup_rate=1e-4
        )
        print("OK")
        """
    )
    proc = _python(code)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
