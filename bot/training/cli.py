"""`python -m bot train`, and the first-start training of `run` and `chat` (ensure_model)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

from bot.config import Settings
from bot.training.install import model_exists, train_lock
from bot.training.recipe import DEFAULT_RECIPE, MAX_MINUTES, Recipe
from bot.training.train import train_model

log = logging.getLogger(__name__)


def clamp_minutes(minutes: float | None, default: float) -> float:
    """The budget in minutes: --minutes, else TRAIN_MINUTES, never above 15 nor below 0.1."""
    value = default if minutes is None else minutes
    if not math.isfinite(value) or value > MAX_MINUTES:
        log.warning("training budget capped at %.0f minutes", MAX_MINUTES)
        value = MAX_MINUTES
    return max(value, 0.1)


class TrainingError(Exception):
    """Training or installing the model failed; the message says what and where."""


def train_cli(
    settings: Settings,
    *,
    minutes: float | None,
    if_missing: bool,
    out: str | None,
    recipe: Recipe = DEFAULT_RECIPE,
) -> int:
    """Train the default model; returns 0 (the exit status), raises TrainingError on failure.

    Call it from the main thread, with the process set up (bot/__main__.py: logging, ParlAI
    shims, torch threads): ParlAI's TrainLoop installs a SIGINT handler, which Python allows
    only there. `recipe` is internal: tests pass a tiny architecture through the very same code
    path.
    """
    model_file = Path(out) if out else settings.default_model_file
    budget = clamp_minutes(minutes, settings.train_minutes)
    if if_missing and model_exists(model_file):
        log.info("default model already at %s; not training", model_file)
        return 0
    try:
        with train_lock(model_file):
            if if_missing and model_exists(model_file):  # another process finished it meanwhile
                log.info("default model already at %s; not training", model_file)
                return 0
            log.info("training the default model into %s, budget %.1f minutes", model_file, budget)
            result = train_model(
                model_file,
                minutes=budget,
                recipe=recipe,
                cache_dir=settings.data_dir / "cache" / "training",
            )
    except Exception as err:  # whatever broke, the caller gets one clear error
        reason = str(err) or type(err).__name__
        raise TrainingError(f"training the model into {model_file} failed: {reason}") from err
    tps = f"{result.tokens_per_second:.0f}" if result.tokens_per_second else "?"
    log.info(
        "model saved to %s (%.1f MB) after %.0fs (%.0fs training, %d steps, %d examples, "
        "%s tokens/s); held-out ppl %.2f loss %.3f token accuracy %.3f",
        result.model_file,
        result.size_bytes / 1e6,
        result.seconds_total,
        result.seconds_training,
        result.train_steps,
        result.train_examples_seen,
        tps,
        result.valid.get("ppl", float("nan")),
        result.valid.get("loss", float("nan")),
        result.valid.get("token_acc", float("nan")),
    )
    return 0


def feedback_cli(settings: Settings, args: argparse.Namespace) -> int:
    """`python -m bot train --from-feedback EXPORT --base MODEL --out DIR --minutes N`.

    Bad input (no export, an export with nothing liked, a base that is not a generator, no
    --out) is one line on stderr and exit status 2; a failure while training, status 1; a
    candidate the collapse guard refused (not installed), status 3.
    """
    from dataclasses import replace

    from bot.training.feedback import (
        DEFAULT_FEEDBACK_RECIPE,
        CollapseError,
        FeedbackInputError,
        finetune_from_feedback,
    )

    if not args.out:
        print("error: --from-feedback needs --out DIR (the candidate's directory)", file=sys.stderr)
        return 2
    if args.if_missing or args.ship:
        print("error: --from-feedback goes with neither --if-missing nor --ship", file=sys.stderr)
        return 2
    base = args.base or settings.model_file
    minutes = clamp_minutes(args.minutes, settings.train_minutes)
    recipe = DEFAULT_FEEDBACK_RECIPE
    if getattr(args, "negatives", None) is not None:
        recipe = replace(recipe, negatives=args.negatives)
    if getattr(args, "min_distinct_ratio", None) is not None:
        recipe = replace(recipe, min_distinct_ratio=args.min_distinct_ratio)
    try:
        finetune_from_feedback(
            Path(args.from_feedback),
            base,
            Path(args.out),
            minutes=minutes,
            recipe=recipe,
            datapath=settings.data_dir / "parlai",
        )
    except FeedbackInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except CollapseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except Exception as err:  # whatever broke in ParlAI, one clear line (the log has more)
        log.debug("fine-tuning failed", exc_info=err)
        reason = str(err) or type(err).__name__
        print(f"error: fine-tuning {base} into {args.out} failed: {reason}", file=sys.stderr)
        return 1
    return 0
