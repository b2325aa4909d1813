"""Putting a trained model in place: options for serving, slim weights, an atomic move, a lock."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from bot.model_files import missing_model_files

# The files a finished model consists of; `.opt` is moved last and marks completeness.
MODEL_SUFFIXES = ("", ".dict", ".dict.codecs", ".trainstats")


def model_exists(model_file: Path) -> bool:
    """A complete model: its `.opt` (moved last), its weights and its dictionary are there
    (bot.model_files, the same check serving makes)."""
    return not missing_model_files(model_file)


def finalize_opt(opt_path: Path, final_model: Path) -> None:
    """Make the saved options point at the final location and generate sensibly."""
    with open(opt_path, encoding="utf-8") as fh:
        opt = json.load(fh)
    opt["model_file"] = str(final_model)
    opt["dict_file"] = str(final_model) + ".dict"
    opt["skip_generation"] = False
    # Training-only paths and switches would only confuse someone reading the .opt later.
    for key in ("fromfile_datapath", "init_model", "starttime"):
        opt.pop(key, None)
    with open(opt_path, "w", encoding="utf-8") as fh:
        json.dump(opt, fh, indent=4)


def slim_weights(model_path: Path) -> None:
    """Drop the optimizer state (2/3 of the file with Adam): serving never needs it."""
    import parlai.utils.pickle
    import torch

    # Read the way ParlAI's TorchAgent.load reads it, so whatever it accepts we accept.
    with open(model_path, "rb") as fh:
        states = torch.load(fh, map_location="cpu", pickle_module=parlai.utils.pickle)
    states.pop("optimizer", None)
    with open(model_path, "wb") as fh:
        torch.save(states, fh)


def install(tmp_model: Path, final_model: Path) -> None:
    """Move a finished model into place; `.opt` last, so a crash never looks complete."""
    final_model.parent.mkdir(parents=True, exist_ok=True)
    opt_final = Path(str(final_model) + ".opt")
    opt_final.unlink(missing_ok=True)  # an old model stops looking complete first
    for suffix in MODEL_SUFFIXES:
        src = Path(str(tmp_model) + suffix)
        if src.exists():
            os.replace(src, str(final_model) + suffix)
    os.replace(str(tmp_model) + ".opt", opt_final)


@contextlib.contextmanager
def train_lock(model_file: Path) -> Iterator[None]:
    """One training per model file at a time (two `make run`s starting together)."""
    model_file.parent.mkdir(parents=True, exist_ok=True)
    with open(model_file.parent / f".{model_file.name}.train.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
