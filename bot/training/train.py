"""One training run, start to finish: data, dictionary, TrainLoop within the budget, install."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.training.args import parlai_args
from bot.training.data import DataStats, load_conversations, write_dataset
from bot.training.install import MODEL_SUFFIXES, finalize_opt, install, slim_weights
from bot.training.loop import BudgetTrainLoop, metric_value
from bot.training.progress import Progress
from bot.training.recipe import DEFAULT_RECIPE, MAX_MINUTES, Recipe

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """Figures of a finished run, for the log and the report."""

    model_file: Path
    data: DataStats
    seconds_total: float
    seconds_training: float
    train_steps: int = 0
    train_examples_seen: int = 0
    tokens_per_second: float | None = None
    valid: dict[str, float] = field(default_factory=dict)
    size_bytes: int = 0


def _cache_entry(cache_dir: Path | None, recipe: Recipe) -> Path | None:
    """The cache directory of this recipe and data version (created), or None."""
    if cache_dir is None:
        return None
    from dataclasses import asdict
    from importlib.metadata import version

    key = json.dumps({"data": version("chitchat-dataset"), **asdict(recipe)}, sort_keys=True)
    entry = cache_dir / hashlib.sha256(key.encode()).hexdigest()[:16]
    entry.mkdir(parents=True, exist_ok=True)
    return entry


def _dataset(
    directory: Path,
    recipe: Recipe,
    conversations: Iterable[tuple[str, list[list[str]]]] | None,
    cache: Path | None,
) -> DataStats:
    """The ParlAI data files in `directory`: from the cache, or converted (and cached)."""
    cached = cache / "data" if cache is not None else None
    if cached is not None and (cached / "stats.json").is_file():
        shutil.copytree(cached, directory)
        stats = DataStats(**json.loads((cached / "stats.json").read_text()))
        log.info("data from the cache (%s)", cache)
    else:
        source = conversations if conversations is not None else load_conversations()
        stats = write_dataset(directory, source, recipe)
        if cached is not None:
            shutil.rmtree(cached, ignore_errors=True)
            shutil.copytree(directory, cached)
            (cached / "stats.json").write_text(json.dumps(stats.__dict__))
    log.info(
        "data: %d conversations -> %d training / %d held-out examples (%d with persona lines)",
        stats.conversations,
        stats.train_examples,
        stats.valid_examples,
        stats.with_persona,
    )
    return stats


@contextlib.contextmanager
def _quiet_bars(progress: bool) -> Iterator[None]:
    """No progress bar from subword-nmt's BPE learner unless a terminal shows it: in a log it
    is a stream of carriage returns. (tqdm reads TQDM_DISABLE when it is imported, too early
    to set here, so the learner's own `tqdm` name is swapped for a plain iterator.)"""
    if progress and sys.stderr.isatty():
        yield
        return
    from subword_nmt import learn_bpe

    bar = learn_bpe.tqdm

    def plain(iterable: Any, *_: Any, **__: Any) -> Any:
        return iterable

    learn_bpe.tqdm = plain
    try:
        yield
    finally:
        learn_bpe.tqdm = bar


@contextlib.contextmanager
def parlai_quiet(level: str = "WARNING") -> Iterator[None]:
    """ParlAI's own logger at `level` for a block (its INFO lines would drown the progress)."""
    from parlai.utils import logging as plog

    old = plog.logger.level
    plog.set_log_level(level)
    try:
        yield
    finally:
        plog.set_log_level(old)


def train_model(
    out: Path,
    *,
    minutes: float,
    recipe: Recipe = DEFAULT_RECIPE,
    progress: bool = True,
    conversations: Iterable[tuple[str, list[list[str]]]] | None = None,
    cap_minutes: float = MAX_MINUTES,
    cache_dir: Path | None = None,
) -> TrainResult:
    """Train for `minutes` of wall-clock time (at most `cap_minutes`) and install the model at
    `out`.

    The budget is for training: the set-up before it (the dataset conversion and the BPE
    dictionary, about a minute on 2 cores) comes on top, and with `cache_dir` it is done once
    per recipe and data version and reused after that.
    """
    started = time.monotonic()
    budget_s = min(minutes, cap_minutes) * 60.0
    out = out.resolve()
    import torch
    from parlai.core.params import ParlaiParser
    from parlai.scripts.train_model import setup_args

    out.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{out.name}.train-"
    # Callers hold the training lock: a leftover directory is from a run that was killed.
    for stale in out.parent.glob(prefix + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=out.parent) as tmp_name:
        tmp = Path(tmp_name)
        cache = _cache_entry(cache_dir, recipe) if conversations is None else None
        data = _dataset(tmp / "data", recipe, conversations, cache)
        tmp_model = tmp / "model" / "model"
        tmp_model.parent.mkdir()
        torch.manual_seed(recipe.seed)
        random.seed(recipe.seed)

        with parlai_quiet():
            opt = setup_args(ParlaiParser(True, True)).parse_args(
                parlai_args(recipe, tmp / "data", tmp_model, 60.0)
            )
            _dictionary(opt, recipe, tmp_model, cache, progress)
            run = _run_loop(opt, recipe, budget_s, progress)

        finalize_opt(Path(str(tmp_model) + ".opt"), out)
        slim_weights(tmp_model)
        install(tmp_model, out)

    valid = {
        k: v for k in ("ppl", "loss", "token_acc") if (v := metric_value(run.report, k)) is not None
    }
    size = sum(
        Path(str(out) + s).stat().st_size
        for s in (*MODEL_SUFFIXES, ".opt")
        if Path(str(out) + s).exists()
    )
    return TrainResult(
        model_file=out,
        data=data,
        seconds_total=time.monotonic() - started,
        seconds_training=run.seconds,
        train_steps=run.steps,
        train_examples_seen=run.seen,
        tokens_per_second=run.tokens_per_s,
        valid=valid,
        size_bytes=size,
    )


def _dictionary(
    opt: Any, recipe: Recipe, tmp_model: Path, cache: Path | None, progress: bool
) -> None:
    """The BPE dictionary beside `tmp_model`: from the cache, or built (and cached)."""
    from parlai.scripts.build_dict import build_dict

    log.info("building the BPE dictionary (%d symbols)", recipe.bpe_symbols)
    dict_opt = copy.deepcopy(opt)
    if not (progress and sys.stderr.isatty()):
        # build_dict draws a tqdm bar when this is set: only useful on a terminal.
        dict_opt["log_every_n_secs"] = None
    dict_file = Path(str(tmp_model) + ".dict")
    if cache is not None and (cache / "model.dict").is_file():
        log.info("BPE dictionary from the cache (%s)", cache)
        for suffix in (".dict", ".dict.codecs"):
            shutil.copyfile(cache / f"model{suffix}", str(tmp_model) + suffix)
    else:
        with _quiet_bars(progress):
            build_dict(dict_opt, skip_if_built=True)
        if cache is not None:
            for suffix in (".dict", ".dict.codecs"):
                shutil.copyfile(str(tmp_model) + suffix, cache / f"model{suffix}")
    assert dict_file.is_file()


@dataclass
class _LoopRun:
    """What one TrainLoop run reports."""

    report: Any
    seconds: float
    steps: int
    seen: int
    tokens_per_s: float | None


def train_for(loop: BudgetTrainLoop, train_s: float, progress: bool) -> tuple[Any, float]:
    """Run `loop` for `train_s` seconds of training (validating three times), with its
    progress bar; its final report and the seconds it trained."""
    loop.max_train_time = train_s
    loop.val_every_n_secs = max(30.0, train_s / 3)
    loop.opt["max_train_time"] = train_s
    bar = Progress(train_s, progress)
    loop.progress = bar
    started = time.monotonic()
    try:
        report = loop.train_final()
    finally:
        bar.close()
    return report, time.monotonic() - started


def _run_loop(opt: Any, recipe: Recipe, budget_s: float, progress: bool) -> _LoopRun:
    """ParlAI's TrainLoop for what is left of the budget, with its progress bar."""
    # Whatever is left after data, dictionary and model set-up, less time for the
    # final evaluation and the save, goes to training.
    reserve = 15.0 + recipe.validation_max_exs / 50.0
    set_up = time.monotonic()
    loop = BudgetTrainLoop(opt)
    set_up_s = time.monotonic() - set_up
    train_s = max(budget_s - reserve, 5.0)
    log.info(
        "training %s for %.0fs (set-up took %.0fs): %d layers, %d dims, batch %d",
        opt["model"],
        train_s,
        set_up_s,
        recipe.n_layers,
        recipe.embedding_size,
        recipe.batch_size,
    )
    report, seconds = train_for(loop, train_s, progress)
    samples = loop.tps_samples
    return _LoopRun(
        report=report,
        seconds=seconds,
        steps=int(loop._train_steps),
        seen=int(loop._total_exs),
        tokens_per_s=sum(samples) / len(samples) if samples else None,
    )
