"""Each ParlAI 1.7.2 compatibility shim, exercised through the ParlAI code that broke.

Every test here fails when its shim is removed from `compat.apply()`, on the pinned torch 2.13.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from bot.inference import compat


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
