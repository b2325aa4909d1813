"""`python -m bot train --from-feedback EXPORT`: fine-tune a candidate on the replies users liked.

The export is `admin export --format parlai` (or `parlai-jsonl`). A reply is *liked* when it has
more 👍 than 👎, won an /arena duel, or belongs to a conversation rated 4-5 without having more 👎
than 👍; it is *disliked* when it has more 👎 than 👍. Training continues the base model's own
weights, dictionary and architecture (ParlAI's `--init-model`/`--init-opt`) on the liked replies
only, each with the context the model read for it (the persona lines, then the newest turns).

👎 replies are left out, counted, and measured: recipe.json has the perplexity of the held-out
disliked replies before and after, next to that of the held-out liked ones. Unlikelihood training
on them was not built: with a few hundred replies and minutes of CPU, the liked turns already move
the model (bench.loop), and pushing probability away from one reply spreads it over every other
one, which nothing here would measure as better.

Held out: about a tenth of the conversations (chosen by the seed), never trained on; and the
first examples of the chitchat-dataset held-out split, the base's own validation data for the
shipped model (a stand-in for any other base), to show what fine-tuning costs elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bot.training.evaluate import valid_figures
from bot.training.install import finalize_opt, install, model_exists, slim_weights, train_lock
from bot.training.loop import BudgetTrainLoop
from bot.training.progress import Progress

log = logging.getLogger(__name__)

PERSONA_PREFIX = "your persona:"
UNSAFE = ("flagged", "deflected")  # bot.safety.SafetyMark: not the model's clean reply


class FeedbackInputError(Exception):
    """The export or the base model cannot be used; the message says why (exit status 2)."""


@dataclass(frozen=True)
class FeedbackRecipe:
    """The knobs of a fine-tune."""

    learning_rate: float = 1e-3
    batch_size: int = 16
    warmup_updates: int = 20
    context_lines: int = 6  # newest lines of the conversation kept after the persona
    heldout_share: float = 0.1  # of the conversations
    validation_max_exs: int = 200
    base_valid_examples: int = 200  # of the chitchat-dataset held-out split
    seed: int = 42


DEFAULT_FEEDBACK_RECIPE = FeedbackRecipe()


@dataclass
class FeedbackExample:
    """One reply with its context, and why it is or is not trained on."""

    session: str
    text: str
    label: str
    liked_by: list[str]  # "vote_up", "arena_won", "rating_4_5"
    disliked: bool
    unsafe: bool


@dataclass
class FeedbackData:
    """The export, read and split."""

    episodes: int = 0
    conversations: int = 0  # a conversation whose persona changed is several episodes
    examples: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)
    train: list[FeedbackExample] = field(default_factory=list)
    heldout: list[FeedbackExample] = field(default_factory=list)
    heldout_disliked: list[FeedbackExample] = field(default_factory=list)


def _int(msg: dict[str, Any], key: str) -> int:
    try:
        return int(msg.get(key) or 0)
    except (TypeError, ValueError):
        return 0


def _episodes(path: Path) -> Iterator[list[dict[str, Any]]]:
    """The export's episodes as lists of ParlAI messages (both export formats)."""
    from parlai.utils.misc import str_to_msg

    with open(path, encoding="utf-8") as fh:
        episode: list[dict[str, Any]] = []
        for number, raw in enumerate(fh, 1):
            line = raw.rstrip("\n")
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                try:
                    record = json.loads(line)
                    dialog = record["dialog"][0]
                except (ValueError, KeyError, IndexError, TypeError) as err:
                    raise FeedbackInputError(
                        f"{path}:{number} is not an `admin export` episode: {err}"
                    ) from err
                msgs = []
                for user, bot in zip(dialog[0::2], dialog[1::2], strict=False):
                    fields = {k: v for k, v in bot.items() if k not in ("id", "text")}
                    msgs.append({**fields, "text": user["text"], "labels": [bot["text"]]})
                if msgs:
                    yield msgs
                continue
            msg = dict(str_to_msg(line))
            if "text" not in msg or not msg.get("labels"):
                raise FeedbackInputError(
                    f"{path}:{number} is not a ParlAI example (text:...<TAB>labels:...): "
                    "make it with `python -m bot admin export --format parlai`"
                )
            episode.append(msg)
            if msg["episode_done"]:
                yield episode
                episode = []
        if episode:
            yield episode


def _context(persona: list[str], lines: list[str], keep: int) -> str:
    return "\n".join([*persona, *lines[-keep:]])


def read_feedback(path: Path, recipe: FeedbackRecipe = DEFAULT_FEEDBACK_RECIPE) -> FeedbackData:
    """Read an export: liked replies to train on and to hold out, the rest counted."""
    if not path.is_file():
        raise FeedbackInputError(f"no export at {path}: make one with `python -m bot admin "
                                 "export --format parlai -o FILE`")  # fmt: skip
    data = FeedbackData()
    data.by_source = {"vote_up": 0, "arena_won": 0, "rating_4_5": 0}
    data.left_out = {"disliked": 0, "neutral": 0, "unsafe": 0}
    rng = random.Random(recipe.seed)
    # A conversation whose persona changed is several episodes (bot.admin.export): they are
    # held out together, or the later ones would hand the held-out turns to training.
    held: dict[str, bool] = {}
    for number, episode in enumerate(_episodes(path)):
        data.episodes += 1
        session = str(episode[0].get("session_id", number))
        if session not in held:
            held[session] = rng.random() < recipe.heldout_share
        heldout = held[session]
        data.conversations = len(held)
        persona: list[str] = []
        lines: list[str] = []
        for i, msg in enumerate(episode):
            text_lines = str(msg["text"]).split("\n")
            if i == 0:
                persona = [t for t in text_lines if t.startswith(PERSONA_PREFIX)]
                text_lines = [t for t in text_lines if not t.startswith(PERSONA_PREFIX)]
            lines.extend(text_lines)
            label = str(msg["labels"][0])
            up, down = _int(msg, "votes_up"), _int(msg, "votes_down")
            liked_by = [
                source
                for source, hit in (
                    ("vote_up", up > down),
                    ("arena_won", msg.get("arena") == "won"),
                    ("rating_4_5", _int(msg, "rating") >= 4 and down <= up),
                )
                if hit
            ]
            ex = FeedbackExample(
                session,
                _context(persona, lines, recipe.context_lines),
                label,
                liked_by,
                disliked=down > up,
                unsafe=msg.get("safety") in UNSAFE,
            )
            lines.extend(label.split("\n"))
            data.examples += 1
            if ex.unsafe:
                data.left_out["unsafe"] += 1
            elif ex.disliked:
                data.left_out["disliked"] += 1
                if heldout:
                    data.heldout_disliked.append(ex)
            elif not liked_by:
                data.left_out["neutral"] += 1
            else:
                for source in liked_by:
                    data.by_source[source] += 1
                (data.heldout if heldout else data.train).append(ex)
    if data.examples == 0:
        raise FeedbackInputError(f"{path} has no exported replies: nothing to learn from")
    if not data.train and not data.heldout:
        raise FeedbackInputError(
            f"{path} has {data.examples} replies but none that users liked (👍, an arena win, "
            "a conversation rated 4-5): nothing to learn from"
        )
    if not data.heldout:  # too few conversations for a tenth: hold out the last liked one
        data.heldout.append(data.train.pop())
    if not data.train:
        data.train.append(data.heldout[0])
        log.warning("only one liked reply: it is trained on and held out both")
    return data


def _line(ex: FeedbackExample) -> str:
    from parlai.utils.misc import msg_to_str

    msg = {"text": ex.text, "labels": [ex.label], "episode_done": True}
    return str(msg_to_str(msg)).rstrip("\t")


def _write(path: Path, examples: list[FeedbackExample]) -> None:
    path.write_text("".join(_line(ex) + "\n" for ex in examples), encoding="utf-8")


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
    return [
        "--init-opt", str(base) + ".opt",
        "--allow-missing-init-opts", "true",
        "--init-model", str(base),
        "--model", str(opt["model"]),
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


def _finalize(opt_path: Path, final: Path) -> None:
    """Options for serving: the final paths, and nothing that points back at the base."""
    finalize_opt(opt_path, final)
    opt = json.loads(opt_path.read_text(encoding="utf-8"))
    for key in ("init_opt", "allow_missing_init_opts", "datapath"):
        opt.pop(key, None)
    opt_path.write_text(json.dumps(opt, indent=4), encoding="utf-8")


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
    """Fine-tune `base` on the liked replies of `export` for `minutes`; the model goes to
    `out_dir/model` (servable: BOT_MODEL=out_dir/model), the record to `out_dir/recipe.json`.
    Returns the record."""
    started = time.monotonic()
    import torch
    from parlai.core.params import ParlaiParser
    from parlai.scripts.train_model import setup_args

    from bot.training.train import parlai_quiet

    datapath = datapath or Path(tempfile.gettempdir()) / "parlai-data"
    data = read_feedback(export, recipe)  # bad input fails before anything is written
    base_file, base_opt = check_base(base, datapath)
    out_dir = out_dir.resolve()
    final = out_dir / "model"
    if out_dir.exists() and not out_dir.is_dir():
        raise FeedbackInputError(f"--out {out_dir} is a file, not a directory")
    log.info(
        "feedback: %d conversations (%d episodes), %d replies; training on %d liked (%s), "
        "holding out %d; left out %s",
        data.conversations, data.episodes, data.examples, len(data.train),
        ", ".join(f"{k} {v}" for k, v in data.by_source.items()), len(data.heldout),
        ", ".join(f"{k} {v}" for k, v in data.left_out.items()),
    )  # fmt: skip
    with train_lock(final), tempfile.TemporaryDirectory(prefix=".finetune-", dir=out_dir) as tmp:
        work = Path(tmp)
        (work / "data").mkdir()
        _write(work / "data" / "feedback_train.txt", data.train)
        _write(work / "data" / "feedback_valid.txt", data.heldout)
        shutil.copyfile(work / "data" / "feedback_valid.txt", work / "data" / "feedback_test.txt")
        if data.heldout_disliked:
            (work / "disliked").mkdir()
            _write(work / "disliked" / "disliked_valid.txt", data.heldout_disliked)
        log.info("measuring the base on the held-out data")
        base_data = _base_validation(work / "chitchat", recipe.base_valid_examples)
        chitchat = work / "chitchat" / "chitchat"
        before = {
            "feedback": perplexity(
                base_file, work / "data" / "feedback", recipe.validation_max_exs
            ),
            "base_valid": perplexity(base_file, chitchat, recipe.base_valid_examples),
        }
        if data.heldout_disliked:
            n = recipe.validation_max_exs
            before["disliked"] = perplexity(base_file, work / "disliked" / "disliked", n)

        tmp_model = work / "model" / "model"
        tmp_model.parent.mkdir()
        for suffix in (".dict", ".dict.codecs"):
            if Path(str(base_file) + suffix).is_file():
                shutil.copyfile(str(base_file) + suffix, str(tmp_model) + suffix)
        torch.manual_seed(recipe.seed)
        random.seed(recipe.seed)
        budget_s = minutes * 60.0
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
            log.info("fine-tuning %s for %.0fs on %d replies", base, train_s, len(data.train))
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
        _finalize(Path(str(tmp_model) + ".opt"), final)
        slim_weights(tmp_model)
        install(tmp_model, final)
        after = {
            "feedback": perplexity(final, work / "data" / "feedback", recipe.validation_max_exs),
            "base_valid": perplexity(final, chitchat, recipe.base_valid_examples),
        }
        if data.heldout_disliked:
            n = recipe.validation_max_exs
            after["disliked"] = perplexity(final, work / "disliked" / "disliked", n)
    assert model_exists(final)
    record: dict[str, Any] = {
        "base": base,
        "base_model": base_opt.get("model"),
        "export": str(export),
        "export_sha256": hashlib.sha256(export.read_bytes()).hexdigest(),
        "seed": recipe.seed,
        "minutes": minutes,
        "data": {
            "conversations": data.conversations,
            "episodes": data.episodes,
            "replies": data.examples,
            "liked_by_source": data.by_source,
            "train_examples": len(data.train),
            "heldout_examples": len(data.heldout),
            "heldout_disliked_examples": len(data.heldout_disliked),
            "left_out": data.left_out,
        },
        "disliked": "left out of training (not unlikelihood); their held-out perplexity is "
        "measured under perplexity.heldout_disliked",
        "perplexity": {
            "heldout_feedback": {"before": before["feedback"], "after": after["feedback"]},
            "base_validation": {
                "data": base_data,
                "before": before["base_valid"],
                "after": after["base_valid"],
            },
            **(
                {"heldout_disliked": {"before": before["disliked"], "after": after["disliked"]}}
                if "disliked" in before
                else {}
            ),
        },
        "training": {
            "seconds_total": round(time.monotonic() - started),
            "seconds_training": round(train_seconds),
            "steps": steps,
            "examples_seen": seen,
        },
        "recipe": asdict(recipe),
        "parlai": version("parlai"),
        "torch": version("torch"),
        "serve": f"BOT_MODEL={final}",
    }
    (out_dir / "recipe.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    log.info(
        "candidate saved to %s: held-out liked replies ppl %.2f -> %.2f, base validation "
        "ppl %.2f -> %.2f",
        final,
        before["feedback"].get("ppl", float("nan")),
        after["feedback"].get("ppl", float("nan")),
        before["base_valid"].get("ppl", float("nan")),
        after["base_valid"].get("ppl", float("nan")),
    )
    return record
