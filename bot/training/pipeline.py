"""`python -m bot train`: the embedded default model, a small ParlAI transformer/generator.

It learns from the `chitchat-dataset` package (7,168 human chit-chat conversations, MIT) inside a
wall-clock budget of at most 15 minutes on a laptop CPU, with ParlAI's own dictionary builder and
TrainLoop. Steps:

1. Every conversation becomes examples in ParlAI's dialog text format ("fromfile"): the last few
   turns as context, the next turn as the label, both speakers' sides. A share of examples gets
   `your persona: ...` lines made of sentences the replying speaker says elsewhere in the same
   conversation, so persona lines at the head of the context (how bot/inference/persona.py pins a
   chat's persona) are familiar input rather than noise.
2. A lower-cased BPE dictionary (subword-nmt, learnt offline from the training split) is built.
3. TrainLoop trains until the time budget is spent, validating on held-out conversations, and
   the last weights are kept (within minutes the loss still falls, so the last is the best).
4. Generation settings (delayed beam search, n-gram blocking) are written into the saved
   `.opt`, the optimizer state is dropped from the weights, and the files are moved into place
   with the `.opt` last: a model whose `.opt` exists is complete.

Expect little: on 2 shared cores the run sees about 10,000 examples, a small fraction of one
epoch, and the model answers in short, generic, often ungrammatical phrases. It mostly ignores
the persona (chitchat-dataset has none; the persona lines only teach it not to be thrown by
them). It exists so that the service runs offline out of the box; BlenderBot
(BOT_MODEL=zoo:blender/blender_90M/model) is the model for real conversations.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import logging
import math
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.config import Settings
from bot.inference import compat

log = logging.getLogger(__name__)

MAX_MINUTES = 15.0
# The files a finished model consists of; `.opt` is moved last and marks completeness.
MODEL_SUFFIXES = ("", ".dict", ".dict.codecs", ".trainstats")

_SPACES = re.compile(r"\s+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# Sentences that read like self-disclosure ("i love hiking", "my dog is ...") make good personas.
_FIRST_PERSON = re.compile(r"^(i|i'm|im|i've|ive|my|i am)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Recipe:
    """Architecture, data and optimisation knobs of one training run.

    The defaults are sized for ~12 minutes on 2 CPU cores, where compute, not data, is the
    limit: a 2-layer, 128-dim model sees about 3x more examples in the budget than a 3-layer,
    256-dim one (measured 2,650 vs 660 tokens/s on a loaded 2-core machine), and in a run this
    short the extra examples matter more than the capacity it could never use.
    """

    n_layers: int = 2
    embedding_size: int = 128
    ffn_size: int = 512
    n_heads: int = 4
    dropout: float = 0.0  # far less than one epoch: nothing to overfit yet
    text_truncate: int = 96
    label_truncate: int = 32
    batch_size: int = 16
    # "full" packs batches by length (no padding waste); None keeps ParlAI's plain batches.
    dynamic_batching: str | None = "full"
    learning_rate: float = 3e-3
    warmup_updates: int = 50
    bpe_symbols: int = 8000
    # Data: previous turns shown as context, share of examples with persona lines.
    context_turns: int = 2
    persona_rate: float = 0.25
    max_label_words: int = 30
    valid_share: float = 0.03
    validation_max_exs: int = 500
    max_conversations: int | None = None
    # Generation settings written into the saved model. Plain beam search answers nearly every
    # message of a minutes-old model with its single most likely reply ("That's cool!");
    # delayed beam samples the first `beam_delay` tokens from the top `topk` and lets the beam
    # finish them, which varies the openings and keeps the rest fluent.
    inference: str = "delayedbeam"
    topk: int = 10
    beam_delay: int = 3
    beam_size: int = 5
    beam_min_length: int = 3
    beam_block_ngram: int = 3
    beam_context_block_ngram: int = 3
    seed: int = 42


DEFAULT_RECIPE = Recipe()


@dataclass(frozen=True)
class Example:
    """One training example: the model sees `text` and should answer `label`."""

    text: str
    label: str


@dataclass
class DataStats:
    """What the conversion produced."""

    conversations: int = 0
    train_examples: int = 0
    valid_examples: int = 0
    with_persona: int = 0


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


# --- data ---------------------------------------------------------------------------------


def clean(text: str) -> str:
    """One line of text: whitespace collapsed, tabs and newlines gone."""
    return _SPACES.sub(" ", text).strip()


def _join(messages: Iterable[str]) -> str:
    """One turn from a speaker's consecutive messages, a full stop where a message had none."""
    parts: list[str] = []
    for message in messages:
        if parts and not parts[-1].endswith((".", "!", "?", ",", ":", ";")):
            parts[-1] += "."
        parts.append(message)
    return " ".join(parts)


def conversation_turns(conversation: Mapping[str, Any]) -> list[list[str]]:
    """The turns of one chitchat-dataset conversation, each a list of cleaned messages."""
    turns: list[list[str]] = []
    for turn in conversation.get("messages", []):
        messages = [clean(str(m.get("text", ""))) for m in turn]
        messages = [m for m in messages if m]
        if messages:
            turns.append(messages)
    return turns


def persona_candidates(turns: Sequence[Sequence[str]], speaker: int) -> list[str]:
    """First-person sentences one speaker (0 or 1) says in a conversation."""
    out: list[str] = []
    for turn in turns[speaker::2]:
        for message in turn:
            for sentence in _SENTENCE_END.split(message):
                words = sentence.split()
                if 3 <= len(words) <= 15 and _FIRST_PERSON.match(sentence):
                    out.append(sentence)
    return out


def make_examples(
    turns: Sequence[Sequence[str]], rng: random.Random, recipe: Recipe = DEFAULT_RECIPE
) -> list[Example]:
    """Examples from one conversation: each turn after the first is a label, for both speakers.

    With probability `recipe.persona_rate` the context starts with one or two `your persona:`
    lines taken from the replying speaker's own first-person sentences elsewhere in the
    conversation (never from the label itself), the shape bot/inference/persona.py gives the input.
    """
    from bot.inference.persona import PERSONA_PREFIX

    texts = [_join(turn) for turn in turns]
    personas = [persona_candidates(turns, 0), persona_candidates(turns, 1)]
    out: list[Example] = []
    for i in range(1, len(texts)):
        label = texts[i]
        if len(label.split()) > recipe.max_label_words:
            continue  # long monologues teach rambling and get truncated anyway
        context = texts[max(0, i - recipe.context_turns) : i]
        if recipe.persona_rate and rng.random() < recipe.persona_rate:
            pool = [s for s in personas[i % 2] if s not in label]
            if pool:
                picked = rng.sample(pool, k=min(len(pool), rng.choice((1, 2))))
                context = [PERSONA_PREFIX + s for s in picked] + context
        out.append(Example("\n".join(context), label))
    return out


def to_parlai_line(example: Example) -> str:
    """One line of ParlAI's dialog text format (read by the `fromfile` teacher)."""

    def escape(value: str) -> str:
        # str_to_msg splits on tabs and on `|` in labels; newlines are written as `\n`.
        return value.replace("\t", " ").replace("\n", "\\n").replace("|", "__PIPE__")

    return f"text:{escape(example.text)}\tlabels:{escape(example.label)}\tepisode_done:True"


def load_conversations() -> Iterator[tuple[str, list[list[str]]]]:
    """(id, turns) of every chitchat-dataset conversation, in the package's stable order."""
    import chitchat_dataset

    for key, conversation in chitchat_dataset.Dataset().items():
        turns = conversation_turns(conversation)
        if len(turns) >= 2:
            yield str(key), turns


def write_dataset(
    directory: Path,
    conversations: Iterable[tuple[str, list[list[str]]]],
    recipe: Recipe = DEFAULT_RECIPE,
) -> DataStats:
    """Write `chitchat_{train,valid,test}.txt`; held-out conversations form valid (= test)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(recipe.seed)
    stats = DataStats()
    train: list[str] = []
    valid: list[str] = []
    for _key, turns in conversations:
        if recipe.max_conversations is not None and stats.conversations >= recipe.max_conversations:
            break
        stats.conversations += 1
        examples = make_examples(turns, rng, recipe)
        stats.with_persona += sum(e.text.startswith("your persona:") for e in examples)
        # Split by conversation, so validation never sees a conversation it trained on.
        target = valid if rng.random() < recipe.valid_share else train
        target.extend(to_parlai_line(e) for e in examples)
    if not valid:  # tiny slices (tests): hold out at least something
        valid, train = train[-max(1, len(train) // 20) :], train[: -max(1, len(train) // 20)]
    stats.train_examples, stats.valid_examples = len(train), len(valid)
    base = directory / "chitchat"
    (directory / "chitchat_train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    (directory / "chitchat_valid.txt").write_text("\n".join(valid) + "\n", encoding="utf-8")
    # TrainLoop's final report also evaluates "test"; it is the same held-out slice.
    shutil.copyfile(directory / "chitchat_valid.txt", str(base) + "_test.txt")
    return stats


# --- training -----------------------------------------------------------------------------


def parlai_args(recipe: Recipe, data_dir: Path, model_file: Path, max_train_s: float) -> list[str]:
    """The `parlai train_model` arguments of a run."""
    r = recipe
    return [
        "--task", "fromfile:parlaiformat",
        "--fromfile-datapath", str(data_dir / "chitchat"),
        "--fromfile-datatype-extension", "true",
        "--model", "transformer/generator",
        "--model-file", str(model_file),
        "--dict-file", str(model_file) + ".dict",
        # Lower-cased BPE learnt offline by subword-nmt: no unknown words (the data is full of
        # typos and slang that a word vocabulary would turn into __unk__), a small vocabulary
        # (cheap softmax on CPU), the same scheme as BlenderBot 90M.
        "--dict-tokenizer", "bpe",
        "--dict-lower", "true",
        "--dict-maxtokens", str(r.bpe_symbols),
        "--dict-minfreq", "2",
        "--n-encoder-layers", str(r.n_layers),
        "--n-decoder-layers", str(r.n_layers),
        "--embedding-size", str(r.embedding_size),
        "--ffn-size", str(r.ffn_size),
        "--n-heads", str(r.n_heads),
        "--n-positions", str(max(r.text_truncate, r.label_truncate) + 8),
        # Pre-layer-norm trains stably at a high learning rate, which a short run needs.
        "--variant", "prelayernorm",
        "--activation", "gelu",
        "--dropout", str(r.dropout),
        "--attention-dropout", "0.0",
        "--text-truncate", str(r.text_truncate),
        "--truncate", str(r.text_truncate),
        "--label-truncate", str(r.label_truncate),
        "--batchsize", str(r.batch_size),
        *(["--dynamic-batching", r.dynamic_batching] if r.dynamic_batching else []),
        "--optimizer", "adam",
        "--learningrate", str(r.learning_rate),
        "--gradient-clip", "1.0",
        # invsqrt: warm up, then decay slowly; needs no step count known in advance.
        "--lr-scheduler", "invsqrt",
        "--warmup-updates", str(r.warmup_updates),
        "--invsqrt-lr-decay-gamma", str(r.warmup_updates),
        "--max-train-time", f"{max_train_s:.0f}",
        "--num-epochs", "-1",
        "--validation-every-n-secs", f"{max(30.0, max_train_s / 3):.0f}",
        "--validation-max-exs", str(r.validation_max_exs),
        "--validation-metric", "ppl",
        "--short-final-eval", "true",
        "--skip-generation", "true",
        "--log-every-n-secs", "5",
        "--inference", r.inference,
        "--topk", str(r.topk),
        "--beam-delay", str(r.beam_delay),
        "--beam-size", str(r.beam_size),
        "--beam-min-length", str(r.beam_min_length),
        "--beam-block-ngram", str(r.beam_block_ngram),
        "--beam-context-block-ngram", str(r.beam_context_block_ngram),
        "--no-cuda",
        "--seed", str(r.seed),
        "--save-after-valid", "false",
    ]  # fmt: skip


class _Progress:
    """A time-based progress bar (the budget is time) with the latest training figures.

    tqdm on a terminal; otherwise a log line every 30 s, so `make run` logs stay readable.
    """

    def __init__(self, total_s: float, enabled: bool) -> None:
        self.total = max(total_s, 1.0)
        self.start = time.monotonic()
        self.postfix = ""
        self._stop = threading.Event()
        self._bar: Any = None
        self._last_line = 0.0
        self.tty = enabled and sys.stderr.isatty()
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=round(self.total),
                unit="s",
                desc="training",
                bar_format="{desc} {percentage:3.0f}%|{bar}| {n}/{total}s "
                "[{elapsed}<{remaining}] {postfix}",
                dynamic_ncols=True,
            )
        self._thread = threading.Thread(target=self._tick, name="train-progress", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._draw()

    def _draw(self) -> None:
        elapsed = time.monotonic() - self.start
        done = min(elapsed, self.total)
        if self._bar is not None:
            self._bar.n = round(done)
            self._bar.set_postfix_str(self.postfix, refresh=False)
            self._bar.refresh()
        elif elapsed - self._last_line >= 30.0:
            self._last_line = elapsed
            log.info(
                "training %3.0f%%, %.0fs left %s",
                100.0 * done / self.total,
                max(self.total - elapsed, 0.0),
                self.postfix,
            )

    def write(self, text: str) -> None:
        """A line that does not tear the bar."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            log.info("%s", text)

    def close(self) -> None:
        """Stop ticking and fill the bar (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        if self._bar is not None:
            self._bar.n = self._bar.total
            self._bar.refresh()
            self._bar.close()


def _value(report: Mapping[str, Any], key: str) -> float | None:
    metric = report.get(key)
    if metric is None:
        return None
    value = metric.value() if hasattr(metric, "value") else metric
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _make_loop_class() -> type:
    """TrainLoop that reports to our progress bar and always keeps the last weights."""
    from parlai.scripts.train_model import TrainLoop

    class BudgetTrainLoop(TrainLoop):  # type: ignore[misc]
        progress: _Progress | None = None
        tps_samples: list[float]

        def __init__(self, opt: Any) -> None:
            super().__init__(opt)
            self.tps_samples = []

        def log(self) -> Any:
            report = super().log()
            tps = _value(report, "tps")
            if tps:
                # tokens (context + label) per second over this log interval
                self.tps_samples.append(tps)
            bits = [
                f"{name}={value:.3g}"
                for name, value in (
                    ("loss", _value(report, "loss")),
                    ("ppl", _value(report, "ppl")),
                    ("tok/s", tps),
                    ("steps", float(self._train_steps)),
                )
                if value is not None
            ]
            if self.progress is not None:
                self.progress.postfix = " ".join(bits)
            return report

        def validate(self) -> Any:
            stop = super().validate()
            if self.progress is not None and self.valid_reports:
                last = self.valid_reports[-1]
                self.progress.write(
                    f"validation after {last.get('train_time', 0):.0f}s: "
                    f"ppl {last.get('ppl', float('nan')):.2f}, "
                    f"loss {last.get('loss', float('nan')):.3f}"
                )
            # A minutes-long run is far from converged: later weights beat earlier ones even
            # when one validation is noisy, so make TrainLoop save the final weights instead
            # of reloading the best validated ones at the end.
            self.saved = False
            return stop

        def train_final(self) -> dict[str, Any]:
            """Train, then one evaluation of the final weights on the held-out slice."""
            from parlai.scripts.train_model import load_eval_worlds

            for _ in self.train_steps():
                pass
            if self.progress is not None:
                self.progress.close()
            log.info("evaluating the final weights on the held-out conversations")
            worlds = load_eval_worlds(self.agent, self.opt, "valid")
            report = self._run_eval(worlds, self.opt, "valid", self.opt["validation_max_exs"])
            for world in worlds:
                world.shutdown()
            self.final_valid_report = report
            self._save_train_stats()
            return dict(report)

    return BudgetTrainLoop


def model_exists(model_file: Path) -> bool:
    """A complete model: its `.opt` (moved last) and its weights are there."""
    return Path(str(model_file) + ".opt").is_file() and model_file.is_file()


def _finalize_opt(opt_path: Path, final_model: Path) -> None:
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


def _slim_weights(model_path: Path) -> None:
    """Drop the optimizer state (2/3 of the file with Adam): serving never needs it."""
    import parlai.utils.pickle
    import torch

    # Read the way ParlAI's TorchAgent.load reads it, so whatever it accepts we accept.
    with open(model_path, "rb") as fh:
        states = torch.load(fh, map_location="cpu", pickle_module=parlai.utils.pickle)
    states.pop("optimizer", None)
    with open(model_path, "wb") as fh:
        torch.save(states, fh)


def _install(tmp_model: Path, final_model: Path) -> None:
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
def _parlai_quiet(level: str = "WARNING") -> Iterator[None]:
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
) -> TrainResult:
    """Train within `minutes` of wall-clock time (all steps) and install the model at `out`."""
    started = time.monotonic()
    deadline = started + min(minutes, MAX_MINUTES) * 60.0
    out = out.resolve()
    compat.apply()
    import torch
    from parlai.core.params import ParlaiParser
    from parlai.scripts.build_dict import build_dict
    from parlai.scripts.train_model import setup_args

    out.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{out.name}.train-"
    # Callers hold the training lock: a leftover directory is from a run that was killed.
    for stale in out.parent.glob(prefix + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=out.parent) as tmp_name:
        tmp = Path(tmp_name)
        data = write_dataset(
            tmp / "data",
            conversations if conversations is not None else load_conversations(),
            recipe,
        )
        log.info(
            "data: %d conversations -> %d training / %d held-out examples (%d with persona lines)",
            data.conversations,
            data.train_examples,
            data.valid_examples,
            data.with_persona,
        )
        tmp_model = tmp / "model" / "model"
        tmp_model.parent.mkdir()
        torch.manual_seed(recipe.seed)
        random.seed(recipe.seed)

        with _parlai_quiet():
            opt = setup_args(ParlaiParser(True, True)).parse_args(
                parlai_args(recipe, tmp / "data", tmp_model, 60.0)
            )
            log.info("building the BPE dictionary (%d symbols)", recipe.bpe_symbols)
            dict_opt = copy.deepcopy(opt)
            if not (progress and sys.stderr.isatty()):
                # build_dict draws a tqdm bar when this is set: only useful on a terminal.
                dict_opt["log_every_n_secs"] = None
            build_dict(dict_opt, skip_if_built=True)
            # Whatever is left after data, dictionary and model set-up, less time for the
            # final evaluation and the save, goes to training.
            reserve = 15.0 + recipe.validation_max_exs / 50.0
            loop_cls = _make_loop_class()
            set_up = time.monotonic()
            loop = loop_cls(opt)
            set_up_s = time.monotonic() - set_up
            train_s = max(deadline - time.monotonic() - reserve, 5.0)
            loop.max_train_time = train_s
            loop.val_every_n_secs = max(30.0, train_s / 3)
            loop.opt["max_train_time"] = train_s
            log.info(
                "training %s for %.0fs (set-up took %.0fs): %d layers, %d dims, batch %d",
                opt["model"],
                train_s,
                set_up_s,
                recipe.n_layers,
                recipe.embedding_size,
                recipe.batch_size,
            )
            bar = _Progress(train_s, progress)
            loop.progress = bar
            train_started = time.monotonic()
            try:
                report = loop.train_final()
            finally:
                bar.close()
            train_seconds = time.monotonic() - train_started
            steps, seen = loop._train_steps, loop._total_exs
            samples = loop.tps_samples
            tokens_per_s = sum(samples) / len(samples) if samples else None
            del loop

        _finalize_opt(Path(str(tmp_model) + ".opt"), out)
        _slim_weights(tmp_model)
        _install(tmp_model, out)

    valid = {k: v for k in ("ppl", "loss", "token_acc") if (v := _value(report, k)) is not None}
    size = sum(
        Path(str(out) + s).stat().st_size
        for s in (*MODEL_SUFFIXES, ".opt")
        if Path(str(out) + s).exists()
    )
    result = TrainResult(
        model_file=out,
        data=data,
        seconds_total=time.monotonic() - started,
        seconds_training=train_seconds,
        train_steps=int(steps),
        train_examples_seen=int(seen),
        tokens_per_second=tokens_per_s,
        valid=valid,
        size_bytes=size,
    )
    return result


# --- command line -------------------------------------------------------------------------


def clamp_minutes(minutes: float | None, default: float) -> float:
    """The budget in minutes: --minutes, else TRAIN_MINUTES, never above 15 nor below 0.1."""
    value = default if minutes is None else minutes
    if not math.isfinite(value) or value > MAX_MINUTES:
        log.warning("training budget capped at %.0f minutes", MAX_MINUTES)
        value = MAX_MINUTES
    return max(value, 0.1)


@contextlib.contextmanager
def _train_lock(model_file: Path) -> Iterator[None]:
    """One training per model file at a time (two `make run`s starting together)."""
    model_file.parent.mkdir(parents=True, exist_ok=True)
    with open(model_file.parent / f".{model_file.name}.train.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def train_cli(
    settings: Settings,
    *,
    minutes: float | None,
    if_missing: bool,
    out: str | None,
    recipe: Recipe = DEFAULT_RECIPE,
) -> int:
    """Train the default model; returns the exit status.

    Call it from the main thread: ParlAI's TrainLoop installs a SIGINT handler, which Python
    allows only there. `recipe` is internal: tests pass a tiny architecture through the very
    same code path.
    """
    if not logging.getLogger().handlers:
        from bot.logs import settings_secrets, setup_logging

        setup_logging(settings.log_level, settings_secrets(settings))
    model_file = Path(out) if out else settings.default_model_file
    budget = clamp_minutes(minutes, settings.train_minutes)
    if if_missing and model_exists(model_file):
        log.info("default model already at %s; not training", model_file)
        return 0
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
    with _train_lock(model_file):
        if if_missing and model_exists(model_file):  # another process finished it meanwhile
            log.info("default model already at %s; not training", model_file)
            return 0
        log.info("training the default model into %s, budget %.1f minutes", model_file, budget)
        result = train_model(model_file, minutes=budget, recipe=recipe)
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


__all__ = [
    "DEFAULT_RECIPE",
    "Example",
    "Recipe",
    "TrainResult",
    "clamp_minutes",
    "conversation_turns",
    "make_examples",
    "model_exists",
    "to_parlai_line",
    "train_cli",
    "train_model",
    "write_dataset",
]
