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

One user's influence is capped: at most MAX_PER_CHAT liked and MAX_PER_CHAT disliked examples
per chat (the export's `chat`, a number per chat; a conversation stands in for its chat in
exports made before it had one), drawn by the seed, so a thousand votes from one account count
like MAX_PER_CHAT. The chat is the unit because the export has no voter ids, and a chat is what
the experiments randomise (bot.reports.variants); in a private chat it is the one user.

Guard against collapse: a fine-tune on a few hundred replies can learn to say one thing to
everyone (the 👍-only candidate of bench.loop answered 44-62% of its replies distinctly against
the control's 97%). Before the candidate is installed, the base and the candidate each answer
the same prompts (bot.training.evaluate's SAMPLE_PROMPTS, then the held-out contexts, then
training contexts, up to GUARD_PROMPTS), decoded as the service decodes; when the candidate's
share of distinct replies is below `min_distinct_ratio` (0.9) of the base's, nothing is
installed and CollapseError says so and what to try (recipe.json is still written, with the
figures under `guard`).

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

from bot.training.evaluate import SAMPLE_PROMPTS, sample_replies, valid_figures
from bot.training.install import finalize_opt, install, model_exists, slim_weights, train_lock
from bot.training.loop import BudgetTrainLoop
from bot.training.progress import Progress

log = logging.getLogger(__name__)

PERSONA_PREFIX = "your persona:"
UNSAFE = ("flagged", "deflected")  # bot.safety.SafetyMark: not the model's clean reply
NEGATIVES = ("unlikelihood", "none")  # --negatives
# At most this many liked, and this many disliked, examples per chat (the per-user cap).
MAX_PER_CHAT = 20
GUARD_PROMPTS = 60  # the collapse guard's prompts: the sample prompts, then held-out contexts
UNLIKELIHOOD_AGENT = "bot.training.unlikelihood:UnlikelihoodAgent"


class FeedbackInputError(Exception):
    """The export or the base model cannot be used; the message says why (exit status 2)."""


class CollapseError(Exception):
    """The candidate repeats itself far more than the base: not installed (exit status 3)."""


@dataclass(frozen=True)
class FeedbackRecipe:
    """The knobs of a fine-tune."""

    # lr x updates sets how far the candidate moves from the base: on bench.loop's quick
    # export, 1e-3 for a minute (about 100 updates) left 42% of its replies distinct against the
    # base's 95%; 3e-5 for 33 updates kept 88% with 72% asking a question back (the base: 43%).
    learning_rate: float = 3e-5
    batch_size: int = 16
    warmup_updates: int = 20
    context_lines: int = 6  # newest lines of the conversation kept after the persona
    heldout_share: float = 0.1  # of the conversations
    validation_max_exs: int = 200
    base_valid_examples: int = 200  # of the chitchat-dataset held-out split
    seed: int = 42
    negatives: str = "unlikelihood"  # or "none": see the module docstring
    unlikelihood_alpha: float = 0.3  # weight of the disliked replies' unlikelihood term
    max_per_chat: int = MAX_PER_CHAT  # liked, and disliked, examples kept per chat
    min_distinct_ratio: float = 0.9  # the collapse guard (0 turns it off)
    # Examples of the base's own training data (chitchat-dataset's train split) mixed in per
    # liked example, with likelihood: they keep the model answering each context its own way.
    base_mix: float = 1.0
    max_steps: int = 30  # updates at most (<= 0: as many as the minutes allow)


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
    chat: str = ""  # the export's chat number ("session:ID" where the export has none)


@dataclass
class FeedbackData:
    """The export, read and split."""

    episodes: int = 0
    conversations: int = 0  # a conversation whose persona changed is several episodes
    examples: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)
    chats: int = 0
    capped: dict[str, int] = field(default_factory=dict)  # examples dropped by the per-chat cap
    train: list[FeedbackExample] = field(default_factory=list)
    heldout: list[FeedbackExample] = field(default_factory=list)
    negatives: list[FeedbackExample] = field(default_factory=list)  # disliked, trained away from
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
    if recipe.negatives not in NEGATIVES:
        raise FeedbackInputError(
            f"--negatives {recipe.negatives!r}: choose one of {', '.join(NEGATIVES)}"
        )
    data = FeedbackData()
    data.by_source = {"vote_up": 0, "arena_won": 0, "rating_4_5": 0}
    data.left_out = {"disliked": 0, "neutral": 0, "unsafe": 0}
    rng = random.Random(recipe.seed)
    # (example, held out?) per chat, liked and disliked, before the cap
    liked: dict[str, list[tuple[FeedbackExample, bool]]] = {}
    disliked: dict[str, list[tuple[FeedbackExample, bool]]] = {}
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
        chat = str(episode[0].get("chat") or f"session:{session}")
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
                chat=chat,
            )
            lines.extend(label.split("\n"))
            data.examples += 1
            if ex.unsafe:
                data.left_out["unsafe"] += 1
            elif ex.disliked:
                disliked.setdefault(chat, []).append((ex, heldout))
            elif not liked_by:
                data.left_out["neutral"] += 1
            else:
                liked.setdefault(chat, []).append((ex, heldout))
    data.chats = len(set(liked) | set(disliked))
    cap_rng = random.Random(recipe.seed + 1)
    data.capped = {"liked": 0, "disliked": 0}
    for ex, heldout in _capped(liked, recipe.max_per_chat, cap_rng, data.capped, "liked"):
        for source in ex.liked_by:
            data.by_source[source] += 1
        (data.heldout if heldout else data.train).append(ex)
    for ex, heldout in _capped(disliked, recipe.max_per_chat, cap_rng, data.capped, "disliked"):
        if heldout:
            data.heldout_disliked.append(ex)
        if heldout or recipe.negatives == "none":
            data.left_out["disliked"] += 1  # not trained on
        else:
            data.negatives.append(ex)
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


def _capped(
    by_chat: dict[str, list[tuple[FeedbackExample, bool]]],
    cap: int,
    rng: random.Random,
    dropped: dict[str, int],
    kind: str,
) -> list[tuple[FeedbackExample, bool]]:
    """At most `cap` examples of each chat (a seeded sample where it has more), in the order
    they came; how many were dropped is added to dropped[kind]."""
    kept: list[tuple[FeedbackExample, bool]] = []
    for examples in by_chat.values():
        if cap > 0 and len(examples) > cap:
            chosen = set(rng.sample(range(len(examples)), cap))
            dropped[kind] += len(examples) - cap
            examples = [e for i, e in enumerate(examples) if i in chosen]
        kept += examples
    return kept


def _line(ex: FeedbackExample) -> str:
    from parlai.utils.misc import msg_to_str

    from bot.training.unlikelihood import NEGATIVE_REWARD

    msg: dict[str, Any] = {"text": ex.text, "labels": [ex.label], "episode_done": True}
    if ex.disliked:
        msg["reward"] = NEGATIVE_REWARD
    return str(msg_to_str(msg)).rstrip("\t")


def _write(path: Path, examples: list[FeedbackExample], extra: list[str] | None = None) -> None:
    lines = [_line(ex) for ex in examples] + (extra or [])
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _base_mix(train_file: Path, data: FeedbackData, recipe: FeedbackRecipe) -> list[str]:
    """recipe.base_mix examples of the base's own training data per liked example, a seeded
    sample of the chitchat-dataset train split (ParlAI lines, each its own episode). Per liked
    example, not per example: with or without negatives the liked replies then weigh the same
    against the base's data, and the negatives are all the two runs differ by."""
    want = round(recipe.base_mix * len(data.train))
    if want <= 0:
        return []
    lines = [line for line in train_file.read_text(encoding="utf-8").splitlines() if line]
    return random.Random(recipe.seed + 2).sample(lines, min(want, len(lines)))


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


def guard_prompts(data: FeedbackData, n: int = GUARD_PROMPTS) -> list[str]:
    """The collapse guard's prompts: the sample prompts, then the held-out contexts (liked and
    disliked, in order, each once), then, in a small export, the training contexts; `n` at
    most."""
    prompts = list(SAMPLE_PROMPTS)
    for ex in [*data.heldout, *data.heldout_disliked, *data.train, *data.negatives]:
        if len(prompts) >= n:
            break
        if ex.text not in prompts:
            prompts.append(ex.text)
    return prompts[:n]


def distinct_replies(
    model_file: Path, prompts: list[str], datapath: Path, overrides: dict[str, Any] | None = None
) -> list[str]:
    """One reply per prompt, each in a fresh conversation, decoded as the service decodes
    (bot.inference.model.load_shared_agent with the process's settings, on the CPU)."""
    from bot.config import Settings
    from bot.inference.model import load_shared_agent
    from bot.training.train import parlai_quiet

    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, bot_model=str(model_file), data_dir=datapath.parent, model_device="cpu"
    )
    with parlai_quiet():
        agent = load_shared_agent(settings, overrides)
        return sample_replies(agent, tuple(prompts))


def distinct_share(replies: list[str]) -> float:
    """Distinct replies / replies (0 for none)."""
    return len(set(replies)) / len(replies) if replies else 0.0


def collapse_verdict(base_share: float, candidate_share: float, min_ratio: float) -> str | None:
    """Why the candidate is refused (its distinct-reply share is below `min_ratio` of the
    base's), or None when it passes."""
    if min_ratio <= 0 or candidate_share >= min_ratio * base_share:
        return None
    return (
        f"the candidate collapsed: {100 * candidate_share:.0f}% of its replies to the guard's "
        f"prompts are distinct against the base's {100 * base_share:.0f}% (it must keep at "
        f"least {100 * min_ratio:.0f}% of the base's share), so it was not installed; train "
        "on an export with more conversations, for fewer --minutes, or with --negatives "
        "unlikelihood if it was none; to install it anyway, read its replies under `guard` "
        "in recipe.json and pass --min-distinct-ratio 0"
    )


def _finalize(opt_path: Path, final: Path, model: str) -> None:
    """Options for serving: the final paths, the base's own agent (`model`: the training agent
    of --negatives unlikelihood is only a loss), and nothing that points back at the base."""
    finalize_opt(opt_path, final)
    opt = json.loads(opt_path.read_text(encoding="utf-8"))
    opt["model"] = model
    for key in ("init_opt", "allow_missing_init_opts", "datapath", "unlikelihood_alpha"):
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
    """Fine-tune `base` on the liked (and, with recipe.negatives, away from the disliked)
    replies of `export` for `minutes`; the model goes to `out_dir/model` (servable:
    BOT_MODEL=out_dir/model) unless the collapse guard refuses it (CollapseError), the record
    to `out_dir/recipe.json` either way. Returns the record."""
    started = time.monotonic()
    import torch
    from parlai.core.params import ParlaiParser
    from parlai.scripts.train_model import setup_args

    from bot.training.train import parlai_quiet

    datapath = datapath or Path(tempfile.gettempdir()) / "parlai-data"
    data = read_feedback(export, recipe)  # bad input fails before anything is written
    base_file, base_opt = check_base(base, datapath)
    if recipe.negatives == "unlikelihood" and base_opt.get("model") != "transformer/generator":
        raise FeedbackInputError(
            f"{base} is a {base_opt.get('model')!r} model: --negatives unlikelihood trains "
            "transformer/generator models only (BlenderBot 90M, the shipped model); use "
            "--negatives none for this base"
        )
    out_dir = out_dir.resolve()
    final = out_dir / "model"
    if out_dir.exists() and not out_dir.is_dir():
        raise FeedbackInputError(f"--out {out_dir} is a file, not a directory")
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
    with train_lock(final), tempfile.TemporaryDirectory(prefix=".finetune-", dir=out_dir) as tmp:
        work = Path(tmp)
        (work / "data").mkdir()
        _write(work / "data" / "feedback_valid.txt", data.heldout)
        shutil.copyfile(work / "data" / "feedback_valid.txt", work / "data" / "feedback_test.txt")
        if data.heldout_disliked:
            (work / "disliked").mkdir()
            _write(work / "disliked" / "disliked_valid.txt", data.heldout_disliked)
        log.info("measuring the base on the held-out data")
        base_data = _base_validation(work / "chitchat", recipe.base_valid_examples)
        mixed = _base_mix(work / "chitchat" / "chitchat_train.txt", data, recipe)
        _write(work / "data" / "feedback_train.txt", [*data.train, *data.negatives], mixed)
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
        _finalize(Path(str(tmp_model) + ".opt"), final, str(base_opt["model"]))
        slim_weights(tmp_model)
        prompts = guard_prompts(data)
        log.info("collapse guard: the base and the candidate answer %d prompts", len(prompts))
        base_replies = distinct_replies(base_file, prompts, datapath)
        candidate_replies = distinct_replies(
            tmp_model, prompts, datapath, {"dict_file": str(tmp_model) + ".dict"}
        )
        guard = {
            "prompts": len(prompts),
            "base_distinct_share": round(distinct_share(base_replies), 4),
            "candidate_distinct_share": round(distinct_share(candidate_replies), 4),
            "min_distinct_ratio": recipe.min_distinct_ratio,
            "replies": [
                {"prompt": p, "base": b, "candidate": c}
                for p, b, c in zip(prompts, base_replies, candidate_replies, strict=True)
            ],
        }
        base_share = distinct_share(base_replies)
        candidate_share = distinct_share(candidate_replies)
        guard["distinct_ratio"] = round(candidate_share / base_share, 4) if base_share else 0.0
        refusal = collapse_verdict(base_share, candidate_share, recipe.min_distinct_ratio)
        guard["verdict"] = "refused" if refusal else "passed"
        if refusal is None:
            install(tmp_model, final)
        after: dict[str, dict[str, float]] = {"feedback": {}, "base_valid": {}}
        if refusal is None:  # a refused candidate is not measured further
            after = {
                "feedback": perplexity(
                    final, work / "data" / "feedback", recipe.validation_max_exs
                ),
                "base_valid": perplexity(final, chitchat, recipe.base_valid_examples),
            }
            if data.heldout_disliked:
                n = recipe.validation_max_exs
                after["disliked"] = perplexity(final, work / "disliked" / "disliked", n)
    assert refusal is not None or model_exists(final)
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
            "negative_examples": len(data.negatives),
            "base_data_examples": len(mixed),
            "heldout_disliked_examples": len(data.heldout_disliked),
            "left_out": data.left_out,
            "chats": data.chats,
            "max_per_chat": recipe.max_per_chat,
            "dropped_by_per_chat_cap": data.capped,
        },
        "negatives": recipe.negatives,
        "disliked": (
            "left out of training (--negatives none)"
            if recipe.negatives == "none"
            else f"token-level unlikelihood, alpha {recipe.unlikelihood_alpha:g}"
        )
        + "; their held-out perplexity is under perplexity.heldout_disliked",
        "guard": guard,
        "installed": refusal is None,
        "perplexity": {
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
    if refusal is not None:
        raise CollapseError(refusal)
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
