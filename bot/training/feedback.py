"""`python -m bot train --from-feedback EXPORT`: fine-tune a candidate on what users liked, and
away from what they disliked.

The export is `admin export --format parlai` (or `parlai-jsonl`). A reply is *liked* when it has
more 👍 than 👎, won an /arena duel, or belongs to a conversation rated 4-5 without having more 👎
than 👍; it is *disliked* when it has more 👎 than 👍. Training continues the base model's own
weights, dictionary and architecture (ParlAI's `--init-model`/`--init-opt`), each reply with the
context the model read for it (the persona lines, then the newest turns).

Negatives (`--negatives`, recipe.negatives):
- `unlikelihood` (the default): maximum likelihood on the liked replies and token-level
  unlikelihood on the disliked ones, weight alpha (bot.training.unlikelihood says which loss and
  why not the Cringe loss). Likelihood on the liked replies stays in every batch: that is what
  keeps the model a language model while the disliked replies push it away.
- `none`: the liked replies only (what this command did before); disliked replies are left out.
Either way the training data also holds `base_mix` examples of the base's own training data per
liked example (likelihood), and the recipe moves the model a short way (learning rate 3e-5, at
most 30 updates): FeedbackRecipe says what the earlier recipe (1e-3 for the whole budget) did.
Either way the disliked replies of the held-out conversations are measured before and after
(recipe.json, perplexity.heldout_disliked).

Which replies count as liked or disliked, the held-out conversations and the per-chat cap on one
user's influence (at most MAX_PER_CHAT liked and MAX_PER_CHAT disliked examples per chat):
bot.training.feedback_data, which reads the export. The collapse guard (a candidate whose share
of distinct replies falls below `min_distinct_ratio`, 0.9, of the base's is not installed;
CollapseError says so and what to try): bot.training.feedback_guard. Besides the held-out
conversations, the first examples of the chitchat-dataset held-out split, the base's own
validation data for the shipped model (a stand-in for any other base), show what fine-tuning
costs elsewhere.

This module runs the fine-tune and writes `out_dir/recipe.json`; its names are the command's
public ones (bot.training.cli imports them from here).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bot.training.evaluate import valid_figures
from bot.training.feedback_data import (
    DEFAULT_FEEDBACK_RECIPE,
    MAX_PER_CHAT,
    NEGATIVES,
    FeedbackData,
    FeedbackExample,
    FeedbackInputError,
    FeedbackRecipe,
    read_feedback,
    sample_base_data,
    write_examples,
)
from bot.training.feedback_guard import (
    GUARD_PROMPTS,
    CollapseError,
    collapse_verdict,
    distinct_replies,
    distinct_share,
    guard_prompts,
    run_guard,
)
from bot.training.install import finalize_opt, install, model_exists, slim_weights, train_lock
from bot.training.loop import BudgetTrainLoop
from bot.training.progress import Progress

__all__ = [
    "DEFAULT_FEEDBACK_RECIPE",
    "GUARD_PROMPTS",
    "MAX_PER_CHAT",
    "NEGATIVES",
    "UNLIKELIHOOD_AGENT",
    "CollapseError",
    "FeedbackData",
    "FeedbackExample",
    "FeedbackInputError",
    "FeedbackRecipe",
    "check_base",
    "collapse_verdict",
    "distinct_replies",
    "distinct_share",
    "finetune_from_feedback",
    "guard_prompts",
    "perplexity",
    "read_feedback",
]

log = logging.getLogger(__name__)

UNLIKELIHOOD_AGENT = "bot.training.unlikelihood:UnlikelihoodAgent"


def check_base(base: str, datapath: Path) -> tuple[Path, dict[str, Any]]:
    """The base model file and its options; FeedbackInputError unless a ParlAI generator."""
    from parlai.core.agents import load_agent_module
    from parlai.core.build_data import modelzoo_path
    from parlai.core.opt import Opt
    from parlai.core.torch_generator_agent import TorchGeneratorAgent

    model_file = Path(modelzoo_path(str(datapath), base))
    opt_file = Path(str(model_file) + ".opt")
    if not opt_file.is_file() or not model_file.is_file():
        raise FeedbackInputError(
            f"no ParlAI model at {base} (it needs {model_file} and {opt_file.name})"
        )
    try:
        opt = dict(Opt.load(str(opt_file)))
        agent_class = load_agent_module(opt["model"]) if opt.get("model") else None
    except Exception as err:  # a broken .opt or an unknown agent
        raise FeedbackInputError(f"cannot read the model options {opt_file}: {err}") from err
    if agent_class is None or not issubclass(agent_class, TorchGeneratorAgent):
        raise FeedbackInputError(
            f"{base} is a {opt.get('model')!r} model, not a generator: only a ParlAI "
            "generator (TorchGeneratorAgent, e.g. transformer/generator) can be fine-tuned "
            "and served"
        )
    return model_file, opt


def _args(
    base: Path, opt: dict[str, Any], data: Path, model_file: Path, seconds: float,
    recipe: FeedbackRecipe,
) -> list[str]:  # fmt: skip
    unlikelihood = recipe.negatives == "unlikelihood"
    return [
        "--init-opt", str(base) + ".opt",
        "--allow-missing-init-opts", "true",
        "--init-model", str(base),
        "--model", UNLIKELIHOOD_AGENT if unlikelihood else str(opt["model"]),
        *(["--unlikelihood-alpha", str(recipe.unlikelihood_alpha)] if unlikelihood else []),
        "--model-file", str(model_file),
        "--dict-file", str(model_file) + ".dict",
        "--task", "fromfile:parlaiformat",
        "--fromfile-datapath", str(data / "feedback"),
        "--fromfile-datatype-extension", "true",
        "--datatype", "train",
        "--batchsize", str(recipe.batch_size),
        "--optimizer", "adam",
        "--learningrate", str(recipe.learning_rate),
        "--lr-scheduler", "invsqrt",
        "--warmup-updates", str(recipe.warmup_updates),
        "--invsqrt-lr-decay-gamma", str(recipe.warmup_updates),
        "--gradient-clip", "1.0",
        "--max-train-time", f"{seconds:.0f}",
        "--num-epochs", "-1",
        "--max-train-steps", str(recipe.max_steps if recipe.max_steps > 0 else -1),
        "--validation-every-n-secs", f"{max(30.0, seconds / 3):.0f}",
        "--validation-max-exs", str(recipe.validation_max_exs),
        "--validation-metric", "ppl",
        "--short-final-eval", "true",
        "--skip-generation", "true",
        "--log-every-n-secs", "5",
        "--save-after-valid", "false",
        "--load-from-checkpoint", "false",
        "--no-cuda",
        "--seed", str(recipe.seed),
    ]  # fmt: skip


def perplexity(model_file: Path, datapath: Path, max_examples: int) -> dict[str, float]:
    """ppl, loss and token accuracy of a model on a fromfile data set (`datapath` + _valid)."""
    figures = valid_figures(str(model_file), datapath, max_examples)
    return {k: round(v, 4) for k, v in figures.items()}


def _base_validation(directory: Path, n: int) -> str:
    """The first `n` held-out chitchat-dataset examples (the shipped model's validation data)."""
    from bot.training.data import load_conversations, write_dataset
    from bot.training.recipe import DEFAULT_RECIPE

    write_dataset(directory, load_conversations(), DEFAULT_RECIPE)
    lines = (directory / "chitchat_valid.txt").read_text(encoding="utf-8").splitlines()[:n]
    (directory / "chitchat_valid.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f"chitchat-dataset=={version('chitchat-dataset')} held-out split, first {len(lines)}"


def _finalize(opt_path: Path, final: Path, model: str) -> None:
    """Options for serving: the final paths, the base's own agent (`model`: the training agent
    of --negatives unlikelihood is only a loss), and nothing that points back at the base."""
    finalize_opt(opt_path, final)
    opt = json.loads(opt_path.read_text(encoding="utf-8"))
    opt["model"] = model
    for key in ("init_opt", "allow_missing_init_opts", "datapath", "unlikelihood_alpha"):
        opt.pop(key, None)
    opt_path.write_text(json.dumps(opt, indent=4), encoding="utf-8")


def _check_inputs(
    base: str, datapath: Path, out_dir: Path, recipe: FeedbackRecipe
) -> tuple[Path, dict[str, Any], Path]:
    """The base's model file and options, and the resolved --out; FeedbackInputError where the
    base cannot be trained with recipe.negatives or --out is a file."""
    base_file, base_opt = check_base(base, datapath)
    if recipe.negatives == "unlikelihood" and base_opt.get("model") != "transformer/generator":
        raise FeedbackInputError(
            f"{base} is a {base_opt.get('model')!r} model: --negatives unlikelihood trains "
            "transformer/generator models only (BlenderBot 90M, the shipped model); use "
            "--negatives none for this base"
        )
    out_dir = out_dir.resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise FeedbackInputError(f"--out {out_dir} is a file, not a directory")
    return base_file, base_opt, out_dir


def _log_data(data: FeedbackData, recipe: FeedbackRecipe) -> None:
    log.info(
        "feedback: %d conversations (%d episodes, %d chats), %d replies; training on %d liked "
        "(%s) and %d disliked (%s), holding out %d; left out %s; dropped by the cap of %d "
        "per chat %s",
        data.conversations, data.episodes, data.chats, data.examples, len(data.train),
        ", ".join(f"{k} {v}" for k, v in data.by_source.items()), len(data.negatives),
        recipe.negatives, len(data.heldout),
        ", ".join(f"{k} {v}" for k, v in data.left_out.items()), recipe.max_per_chat,
        data.capped,
    )  # fmt: skip


def _write_data(work: Path, data: FeedbackData, recipe: FeedbackRecipe) -> tuple[str, list[str]]:
    """The data files under `work`: data/feedback_{valid,test,train}.txt, disliked/ (the
    held-out disliked replies) and chitchat/ (the base's own data). Returns what the base's
    validation data is and the base's training lines mixed in."""
    (work / "data").mkdir()
    write_examples(work / "data" / "feedback_valid.txt", data.heldout)
    shutil.copyfile(work / "data" / "feedback_valid.txt", work / "data" / "feedback_test.txt")
    if data.heldout_disliked:
        (work / "disliked").mkdir()
        write_examples(work / "disliked" / "disliked_valid.txt", data.heldout_disliked)
    log.info("measuring the base on the held-out data")
    base_data = _base_validation(work / "chitchat", recipe.base_valid_examples)
    mixed = sample_base_data(work / "chitchat" / "chitchat_train.txt", data, recipe)
    write_examples(work / "data" / "feedback_train.txt", [*data.train, *data.negatives], mixed)
    return base_data, mixed


def _measure(
    model_file: Path, work: Path, data: FeedbackData, recipe: FeedbackRecipe
) -> dict[str, dict[str, float]]:
    """A model's perplexity on the held-out liked replies, the base's validation data and,
    where there are any, the held-out disliked replies."""
    figures = {
        "feedback": perplexity(model_file, work / "data" / "feedback", recipe.validation_max_exs),
        "base_valid": perplexity(
            model_file, work / "chitchat" / "chitchat", recipe.base_valid_examples
        ),
    }
    if data.heldout_disliked:
        n = recipe.validation_max_exs
        figures["disliked"] = perplexity(model_file, work / "disliked" / "disliked", n)
    return figures


@dataclass(frozen=True)
class _Run:
    """What the training loop did."""

    seconds: float
    steps: int
    seen: int


def _train(
    base: str, base_file: Path, base_opt: dict[str, Any], work: Path, tmp_model: Path, *,
    budget_s: float, started: float, recipe: FeedbackRecipe, progress: bool, replies: int,
) -> _Run:  # fmt: skip
    """Continue the base's weights into `tmp_model` for what is left of `budget_s` (counted
    from `started`, less a reserve for the measurements after)."""
    import torch
    from parlai.core.params import ParlaiParser
    from parlai.scripts.train_model import setup_args

    from bot.training.train import parlai_quiet

    tmp_model.parent.mkdir()
    for suffix in (".dict", ".dict.codecs"):
        if Path(str(base_file) + suffix).is_file():
            shutil.copyfile(str(base_file) + suffix, str(tmp_model) + suffix)
    torch.manual_seed(recipe.seed)
    random.seed(recipe.seed)
    with parlai_quiet():
        opt = setup_args(ParlaiParser(True, True)).parse_args(
            _args(base_file, base_opt, work / "data", tmp_model, 60.0, recipe)
        )
        set_up = time.monotonic()
        loop = BudgetTrainLoop(opt)
        reserve = 10.0 + recipe.validation_max_exs / 50.0
        train_s = max(budget_s - reserve - (set_up - started), 5.0)
        loop.max_train_time = train_s
        loop.val_every_n_secs = max(30.0, train_s / 3)
        loop.opt["max_train_time"] = train_s
        log.info("fine-tuning %s for %.0fs on %d replies", base, train_s, replies)
        bar = Progress(train_s, progress)
        loop.progress = bar
        train_started = time.monotonic()
        try:
            loop.train_final()
        finally:
            bar.close()
        train_seconds = time.monotonic() - train_started
        steps, seen = int(loop._train_steps), int(loop._total_exs)
        del loop
    return _Run(train_seconds, steps, seen)


def finetune_from_feedback(
    export: Path,
    base: str,
    out_dir: Path,
    *,
    minutes: float,
    recipe: FeedbackRecipe = DEFAULT_FEEDBACK_RECIPE,
    progress: bool = True,
    datapath: Path | None = None,
) -> dict[str, Any]:
    """Fine-tune `base` on the liked (and, with recipe.negatives, away from the disliked)
    replies of `export` for `minutes`; the model goes to `out_dir/model` (servable:
    BOT_MODEL=out_dir/model) unless the collapse guard refuses it (CollapseError), the record
    to `out_dir/recipe.json` either way. Returns the record."""
    started = time.monotonic()
    datapath = datapath or Path(tempfile.gettempdir()) / "parlai-data"
    data = read_feedback(export, recipe)  # bad input fails before anything is written
    base_file, base_opt, out_dir = _check_inputs(base, datapath, out_dir, recipe)
    final = out_dir / "model"
    _log_data(data, recipe)
    with train_lock(final), tempfile.TemporaryDirectory(prefix=".finetune-", dir=out_dir) as tmp:
        work = Path(tmp)
        base_data, mixed = _write_data(work, data, recipe)
        before = _measure(base_file, work, data, recipe)
        tmp_model = work / "model" / "model"
        run = _train(
            base, base_file, base_opt, work, tmp_model, budget_s=minutes * 60.0,
            started=started, recipe=recipe, progress=progress, replies=len(data.train),
        )  # fmt: skip
        _finalize(Path(str(tmp_model) + ".opt"), final, str(base_opt["model"]))
        slim_weights(tmp_model)
        guard, refusal = run_guard(base_file, tmp_model, data, datapath, recipe.min_distinct_ratio)
        after: dict[str, dict[str, float]] = {"feedback": {}, "base_valid": {}}
        if refusal is None:  # a refused candidate is not measured further
            install(tmp_model, final)
            after = _measure(final, work, data, recipe)
    assert refusal is not None or model_exists(final)
    record: dict[str, Any] = {
        "base": base,
        "base_model": base_opt.get("model"),
        "export": str(export),
        "export_sha256": hashlib.sha256(export.read_bytes()).hexdigest(),
        "seed": recipe.seed,
        "minutes": minutes,
        "data": _data_record(data, recipe, mixed),
        "negatives": recipe.negatives,
        "disliked": (
            "left out of training (--negatives none)"
            if recipe.negatives == "none"
            else f"token-level unlikelihood, alpha {recipe.unlikelihood_alpha:g}"
        )
        + "; their held-out perplexity is under perplexity.heldout_disliked",
        "guard": guard,
        "installed": refusal is None,
        "perplexity": _perplexity_record(before, after, base_data),
        "training": {
            "seconds_total": round(time.monotonic() - started),
            "seconds_training": round(run.seconds),
            "steps": run.steps,
            "examples_seen": run.seen,
        },
        "recipe": asdict(recipe),
        "parlai": version("parlai"),
        "torch": version("torch"),
        "serve": f"BOT_MODEL={final}",
    }
    (out_dir / "recipe.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if refusal is not None:
        raise CollapseError(refusal)
    _log_saved(final, before, after)
    return record


def _data_record(data: FeedbackData, recipe: FeedbackRecipe, mixed: list[str]) -> dict[str, Any]:
    """recipe.json's `data`: what the export held and what was trained on."""
    return {
        "conversations": data.conversations,
        "episodes": data.episodes,
        "replies": data.examples,
        "liked_by_source": data.by_source,
        "train_examples": len(data.train),
        "heldout_examples": len(data.heldout),
        "negative_examples": len(data.negatives),
        "base_data_examples": len(mixed),
        "heldout_disliked_examples": len(data.heldout_disliked),
        "left_out": data.left_out,
        "chats": data.chats,
        "max_per_chat": recipe.max_per_chat,
        "dropped_by_per_chat_cap": data.capped,
    }


def _perplexity_record(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], base_data: str
) -> dict[str, Any]:
    """recipe.json's `perplexity`: each held-out set before and after."""
    return {
        "heldout_feedback": {"before": before["feedback"], "after": after["feedback"]},
        "base_validation": {
            "data": base_data,
            "before": before["base_valid"],
            "after": after["base_valid"],
        },
        **(
            {
                "heldout_disliked": {
                    "before": before["disliked"],
                    "after": after.get("disliked", {}),
                }
            }
            if "disliked" in before
            else {}
        ),
    }


def _log_saved(
    final: Path, before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> None:
    log.info(
        "candidate saved to %s: held-out liked replies ppl %.2f -> %.2f, base validation "
        "ppl %.2f -> %.2f",
        final,
        before["feedback"].get("ppl", float("nan")),
        after["feedback"].get("ppl", float("nan")),
        before["base_valid"].get("ppl", float("nan")),
        after["base_valid"].get("ppl", float("nan")),
    )
