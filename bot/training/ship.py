"""The default model shipped in the repository (models/chitchat/): one long training run with
the default recipe, installed with its recipe beside it; and stage 2, the persona fine-tune.

`python -m bot train --ship` (make train-shipped) reproduces it from scratch: the same data
package, seed and arguments for the recorded minutes (a wall-clock budget, so a faster or
busier machine gets through more or fewer steps and a slightly different model), then
measures it and rewrites models/chitchat/ (or `--out`) with recipe.json and RECIPE.md.

Stage 2 (`--from-stage1 MODEL` runs it alone on an existing stage-1 model; `--stage1-only`
skips it) fine-tunes stage 1 on the persona mix of bot/training/persona_data.py, so that the
model states its persona's facts when asked (bench.persona, docs/models.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bot.config import SHIPPED_MODEL_FILE, Settings
from bot.training.args import parlai_args
from bot.training.evaluate import (
    PERSONA_SAMPLES,
    SAMPLE_PROMPTS,
    held_out_perplexity,
    persona_replies,
    sample_replies,
)
from bot.training.install import train_lock
from bot.training.persona_data import DEFAULT_PERSONA_RECIPE, PersonaDataStats, PersonaRecipe
from bot.training.recipe import DEFAULT_RECIPE
from bot.training.train import TrainResult, train_for, train_model

log = logging.getLogger(__name__)

SHIP_MINUTES = 100.0  # stage 1: the default recipe from scratch
FILES = ("", ".dict", ".dict.codecs", ".opt")


@dataclass
class PersonaResult:
    """Figures of a finished stage-2 run."""

    data: PersonaDataStats
    seconds_training: float
    steps: int
    examples_seen: int
    valid: dict[str, float]


def persona_args(
    stage1: Path, data_dir: Path, model_file: Path, seconds: float,
    persona: PersonaRecipe = DEFAULT_PERSONA_RECIPE,
) -> list[str]:  # fmt: skip
    """Stage 2's `parlai train_model` arguments: stage 1's (architecture, dictionary, decoding)
    with its weights as the start (`--init-model`), stage 2's data, seed and a fresh learning
    rate schedule (the optimizer starts anew: the shipped weights carry no optimizer state)."""
    args = parlai_args(DEFAULT_RECIPE, data_dir, model_file, seconds)
    overrides = {
        "--learningrate": str(persona.learning_rate),
        "--warmup-updates": str(persona.warmup_updates),
        "--invsqrt-lr-decay-gamma": str(persona.warmup_updates),
        "--seed": str(persona.seed),
        "--beam-context-block-ngram": str(persona.beam_context_block_ngram),
        "--beam-delay": str(persona.beam_delay),
    }
    for i in range(0, len(args) - 1):
        if args[i] in overrides:
            args[i + 1] = overrides[args[i]]
    return [*args, "--init-model", str(stage1), "--load-from-checkpoint", "false"]


def train_persona_stage(
    stage1: Path,
    out: Path,
    *,
    minutes: float,
    persona: PersonaRecipe = DEFAULT_PERSONA_RECIPE,
    progress: bool = False,
    conversations: Any = None,
) -> PersonaResult:
    """Stage 2: fine-tune the stage-1 model `stage1` on the persona mix
    (bot/training/persona_data.py) for `minutes`, keeping its dictionary; the model goes to
    `out` (slim weights, generation options as stage 1's)."""
    import random
    import time

    import torch
    from parlai.core.params import ParlaiParser
    from parlai.scripts.train_model import setup_args

    from bot.training.data import load_conversations
    from bot.training.install import finalize_opt, install, slim_weights
    from bot.training.loop import BudgetTrainLoop, metric_value
    from bot.training.persona_data import write_persona_dataset
    from bot.training.train import parlai_quiet

    started = time.monotonic()
    out = out.resolve()
    stage1 = stage1.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.persona-", dir=out.parent) as tmp_name:
        tmp = Path(tmp_name)
        source = conversations if conversations is not None else load_conversations()
        data = write_persona_dataset(tmp / "data", source, persona)
        log.info("stage 2 data: %s", data)
        tmp_model = tmp / "model" / "model"
        tmp_model.parent.mkdir()
        for suffix in (".dict", ".dict.codecs"):  # stage 1's dictionary, unchanged
            shutil.copyfile(str(stage1) + suffix, str(tmp_model) + suffix)
        torch.manual_seed(persona.seed)
        random.seed(persona.seed)
        budget_s = minutes * 60.0
        with parlai_quiet():
            opt = setup_args(ParlaiParser(True, True)).parse_args(
                persona_args(stage1, tmp / "data", tmp_model, 60.0, persona)
            )
            loop = BudgetTrainLoop(opt)
            reserve = 15.0 + DEFAULT_RECIPE.validation_max_exs / 50.0
            train_s = max(budget_s - reserve - (time.monotonic() - started), 5.0)
            log.info("stage 2: fine-tuning %s for %.0fs", stage1, train_s)
            report, train_seconds = train_for(loop, train_s, progress)
            steps, seen = int(loop._train_steps), int(loop._total_exs)
            del loop
        finalize_opt(Path(str(tmp_model) + ".opt"), out)
        slim_weights(tmp_model)
        install(tmp_model, out)
    valid = {
        k: v for k in ("ppl", "loss", "token_acc") if (v := metric_value(report, k)) is not None
    }
    return PersonaResult(data, train_seconds, steps, seen, valid)


def ship(
    minutes: float = SHIP_MINUTES,
    dest: Path = SHIPPED_MODEL_FILE,
    *,
    from_stage1: Path | None = None,
    persona_stage: bool = True,
    persona: PersonaRecipe = DEFAULT_PERSONA_RECIPE,
) -> dict[str, Any]:
    """The shipped model, installed at `dest` with its recipe: stage 1 trains the default
    recipe from scratch for `minutes`; then, with `persona_stage` (the default), stage 2
    fine-tunes it on the persona mix for `persona.minutes`. With `from_stage1` (a stage-1
    model, e.g. a copy of the shipped one with its recipe.json) only stage 2 runs."""
    with train_lock(dest), tempfile.TemporaryDirectory(prefix="ship-") as tmp:
        machine = f"{os.cpu_count()} CPU cores, torch threads {_threads()}"
        stage1_record: dict[str, Any] = {}
        if from_stage1 is None:
            stage1 = Path(tmp) / "stage1" / "model"
            result = train_model(stage1, minutes=minutes, cap_minutes=minutes, progress=False)
            if not persona_stage:
                return install_shipped(
                    stage1, dest, minutes=minutes, result=result, machine=machine
                )
            stage1_record = {"minutes": minutes, "training": _training(result)}
        else:
            stage1 = from_stage1
            stage1_record = recorded_stage1(from_stage1)
        trained = Path(tmp) / "stage2" / "model"
        stage2 = train_persona_stage(stage1, trained, minutes=persona.minutes, persona=persona)
        return install_shipped(
            trained,
            dest,
            minutes=float(stage1_record.get("minutes", minutes)),
            machine=machine,
            stage1=stage1_record,
            stage2=stage2,
            persona=persona,
        )


def recorded_stage1(model_file: Path) -> dict[str, Any]:
    """What the recipe.json beside an existing stage-1 model says of it (--from-stage1)."""
    record: dict[str, Any] = {"from": "an existing stage-1 model (--from-stage1)"}
    recorded = model_file.parent / "recipe.json"
    if recorded.is_file():
        old = json.loads(recorded.read_text(encoding="utf-8"))
        record.update({k: old[k] for k in ("minutes", "training", "heldout") if k in old})
    return record


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


def install_shipped(
    trained: Path,
    dest: Path,
    *,
    minutes: float,
    result: TrainResult | None = None,
    machine: str = "",
    stage1: dict[str, Any] | None = None,
    stage2: PersonaResult | None = None,
    persona: PersonaRecipe = DEFAULT_PERSONA_RECIPE,
) -> dict[str, Any]:
    """Copy a trained model to `dest` (paths dropped from its .opt), measure it, and write
    recipe.json and RECIPE.md beside it; returns the recipe."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    for suffix in FILES:
        source = Path(str(trained) + suffix)
        if source.exists():
            # A new file moved over the old one, never the old one rewritten: running workers
            # map the weights from it (bot.inference.model.map_weights).
            part = Path(str(dest) + suffix + ".part")
            shutil.copyfile(source, part)
            os.replace(part, str(dest) + suffix)
    opt_path = Path(str(dest) + ".opt")
    opt = json.loads(opt_path.read_text(encoding="utf-8"))
    # Absolute paths of the machine it was trained on: ParlAI uses the model file's own .dict.
    for key in ("model_file", "dict_file", "init_model", "datapath", "fromfile_datapath"):
        opt.pop(key, None)
    opt_path.write_text(json.dumps(opt, indent=4, sort_keys=True) + "\n", encoding="utf-8")

    heldout = held_out_perplexity(str(dest))
    from bot.inference.model import load_shared_agent

    agent = load_shared_agent(
        Settings(_env_file=None, bot_model=str(dest), model_device="cpu")  # type: ignore[call-arg]
    )
    samples = sample_replies(agent)
    with_persona = persona_replies(agent)
    recipe: dict[str, Any] = {
        "data": f"chitchat-dataset=={version('chitchat-dataset')}",
        "parlai": version("parlai"),
        "torch": version("torch"),
        "seed": DEFAULT_RECIPE.seed,
        "recipe": asdict(DEFAULT_RECIPE),
        "parlai_args": parlai_args(DEFAULT_RECIPE, Path("<data>"), Path("<model>"), minutes * 60.0),
        "minutes": minutes,
        "machine": machine,
        "training": {} if result is None else _training(result),
        "stage1": stage1 or {},
        "stage2": {} if stage2 is None else _stage2(stage2, persona),
        "heldout": {**heldout, "examples": DEFAULT_RECIPE.validation_max_exs},
        "size_bytes": sum(
            Path(str(dest) + s).stat().st_size for s in FILES if Path(str(dest) + s).exists()
        ),
        "samples": [
            {"prompt": p, "reply": r} for p, r in zip(SAMPLE_PROMPTS, samples, strict=True)
        ],
        "persona_samples": [
            {"persona": p, "prompt": m, "reply": r}
            for (p, m), r in zip(PERSONA_SAMPLES, with_persona, strict=True)
        ],
    }
    (dest.parent / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n", "utf-8")
    (dest.parent / "RECIPE.md").write_text(render(recipe), encoding="utf-8")
    log.info("shipped %s: held-out ppl %.1f", dest, heldout["ppl"])
    return recipe


def _training(result: TrainResult) -> dict[str, Any]:
    return {
        "seconds_total": round(result.seconds_total),
        "seconds_training": round(result.seconds_training),
        "steps": result.train_steps,
        "examples_seen": result.train_examples_seen,
        "train_examples": result.data.train_examples,
        "heldout_examples": result.data.valid_examples,
        "validation_at_end": result.valid,
    }


def _stage2(result: PersonaResult, persona: PersonaRecipe) -> dict[str, Any]:
    return {
        "recipe": asdict(persona),
        "data": asdict(result.data),
        "seconds_training": round(result.seconds_training),
        "steps": result.steps,
        "examples_seen": result.examples_seen,
        "validation_at_end": result.valid,
        "parlai_args": persona_args(
            Path("<stage1>"), Path("<data>"), Path("<model>"), persona.minutes * 60.0, persona
        ),
    }


def render(recipe: dict[str, Any]) -> str:
    """RECIPE.md: everything needed to read and to reproduce the shipped model."""
    _s1, _s2, p = _stages(recipe)
    total = recipe["minutes"] + (p.get("minutes") or 0)
    lines = [
        "# The shipped default model",
        "",
        "A small ParlAI `transformer/generator` trained on the chitchat-dataset package, the",
        "model `make run` and `make chat` serve when `BOT_MODEL` is unset. Reproduce it with",
        (
            f"`make train-shipped` (`python -m bot train --ship`, {total:g} minutes of training: "
            f"stage 1, the default recipe from scratch, {recipe['minutes']:g} minutes; "
            f"stage 2, the persona fine-tune, {p['minutes']:g} minutes)."
            if p
            else f"`python -m bot train --ship --stage1-only` ({total:g} minutes)."
        ),
    ]
    if p:
        lines += [
            "`python -m bot train --ship --from-stage1 MODEL` runs stage 2 alone on a stage-1",
            "model.",
        ]
    lines += _table(recipe)
    lines += _stage2_section(recipe)
    lines += _samples_and_arguments(recipe)
    return "\n".join(lines)


def _stages(recipe: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Stage 1's record, stage 2's record and stage 2's recipe ({} where there is none)."""
    s1 = recipe.get("stage1") or {}
    s2 = recipe.get("stage2") or {}
    return s1, s2, s2.get("recipe") or {}


def _table(recipe: dict[str, Any]) -> list[str]:
    """RECIPE.md's table: data, versions, architecture, budget, figures, decoding."""
    r = recipe["recipe"]
    s1, s2, p = _stages(recipe)
    t = s1.get("training") or recipe.get("training") or {}
    lines: list[str] = []
    lines += [
        "",
        "| | |",
        "|---|---|",
        f"| data | `{recipe['data']}` |",
        f"| ParlAI, torch | {recipe['parlai']}, {recipe['torch']} |",
        f"| seed | {recipe['seed']}" + (f" (stage 2: {p['seed']})" if p else "") + " |",
        f"| architecture | {r['n_layers']} layers, {r['embedding_size']} dims, "
        f"{r['ffn_size']} FFN, {r['n_heads']} heads, {r['bpe_symbols']} BPE symbols |",
        f"| budget | {recipe['minutes']:g} minutes of wall clock"
        + (f" + {p['minutes']:g} minutes (stage 2)" if p else "")
        + " |",
        f"| machine | {recipe.get('machine') or 'not recorded'} |",
    ]
    if t:
        lines += [
            f"| stage 1: steps, examples seen | {t['steps']:,}, {t['examples_seen']:,} "
            f"(of {t['train_examples']:,} training examples) |",
        ]
    if s2:
        d = s2["data"]
        lines += [
            f"| stage 2: steps, examples seen | {s2['steps']:,}, {s2['examples_seen']:,} (of "
            f"{sum(d[k] for k in ('chitchat', 'grounded', 'persona_chitchat', 'qa')):,}: "
            f"{d['chitchat']:,} chitchat as in stage 1, {d['grounded']:,} grounded in a persona "
            f"line, {d['persona_chitchat']:,} chitchat under template personas, {d['qa']:,} "
            "persona questions) |",
            f"| stage 2: optimisation | Adam from stage 1's weights, learning rate "
            f"{p['learning_rate']:g}, invsqrt after {p['warmup_updates']} warm-up updates |",
        ]
    h = recipe["heldout"]
    lines += [
        f"| held-out perplexity | **{h['ppl']:.1f}** (first {h['examples']} held-out examples; "
        f"loss {h['loss']:.3f}, token accuracy {h['token_acc']:.3f})"
        + (f"; stage 1: {s1['heldout']['ppl']:.1f}" if "heldout" in s1 else "")
        + " |",
    ]
    bench = recipe.get("persona_bench")
    if bench:
        lines += [
            f"| persona (`{bench['command']}`) | recall **{100 * bench['recall']:.0f}%**, "
            f"base rate {100 * bench['base_rate']:.0f}%, contradictions "
            f"{100 * bench['contradiction_rate']:.0f}% ({bench['questions']} questions; "
            f"stage 1: {100 * bench['stage1_recall']:.0f}%, "
            f"{100 * bench['stage1_base_rate']:.0f}%, "
            f"{100 * bench['stage1_contradiction_rate']:.0f}%) |",
        ]
    # Stage 2 decodes its own way (PersonaRecipe: sampled tokens, context blocking).
    delay = p.get("beam_delay", r["beam_delay"])
    context = p.get("beam_context_block_ngram", r["beam_context_block_ngram"])
    lines += [
        f"| size | {recipe['size_bytes'] / 1e6:.1f} MB |",
        f"| decoding | {r['inference']}: top-{r['topk']} sampling for the first "
        f"{delay} tokens, then beam {r['beam_size']}; min length "
        f"{r['beam_min_length']}, {r['beam_block_ngram']}-gram blocking, "
        + (f"context {context}-gram blocking |" if context > 0 else "no context blocking |"),
        "",
    ]
    return lines


def _stage2_section(recipe: dict[str, Any]) -> list[str]:
    """RECIPE.md's stage-2 section and its persona exchanges (none without a stage 2)."""
    _s1, _s2, p = _stages(recipe)
    lines: list[str] = []
    if p:
        lines += [
            "## Stage 2: the persona fine-tune",
            "",
            "Stage 1's `your persona:` lines come from elsewhere in the conversation and its",
            "labels never need them, so it learns to ignore them. Stage 2",
            "(bot/training/persona_data.py) continues from stage 1's weights and dictionary on",
            "stage 1's examples plus: chitchat examples whose persona line is a first-person",
            "sentence of the label itself (the label restates it); synthetic turns with 1-4",
            "persona lines (name, job, hobby, pet, home, food in eight or nine phrasings each,",
            "the others distractors), a question about one of them and an answer that states it;",
            "and template persona lines before ordinary chitchat examples, whose labels ignore",
            "them. The held-out split is stage 1's. Most template values are made up (a word",
            "of the corpus or random letters), so that copying them is what lowers the loss;",
            "no word of bench.persona's probe set is one (a unit test holds that). Replies",
            "are decoded without context blocking, which would ban restating a persona line,",
            "and with the first 5 tokens sampled (stage 1: 3), which keeps the fine-tuned",
            "model's replies to ordinary chat as varied as stage 1's.",
            "",
            "## Sample exchanges with a persona",
            "",
            "Each in a fresh conversation whose persona is pinned as `/persona` pins it, seed 0:",
            "",
        ]
        lines += [
            f"- **persona:** {x['persona']}  \n  **you:** {x['prompt']}  \n  **bot:** {x['reply']}"
            for x in recipe.get("persona_samples", [])
        ]
        lines += [""]
    return lines


def _samples_and_arguments(recipe: dict[str, Any]) -> list[str]:
    """RECIPE.md's exchanges without a persona and every training argument."""
    _s1, s2, p = _stages(recipe)
    lines: list[str] = []
    lines += [
        "## Sample exchanges",
        "",
        "Each in a fresh conversation, no persona, seed 0:",
        "",
    ]
    lines += [f"- **you:** {s['prompt']}  \n  **bot:** {s['reply']}" for s in recipe["samples"]]
    lines += [
        "",
        "## Every training argument",
        "",
        "Stage 1:" if p else "",
        "",
        "```",
        " ".join(recipe["parlai_args"]),
        "```",
        "",
    ]
    if s2:
        lines += ["Stage 2:", "", "```", " ".join(s2["parlai_args"]), "```", ""]
    return lines


def record_persona_bench(bench_json: Path, recipe_dir: Path = SHIPPED_MODEL_FILE.parent) -> None:
    """Put bench.persona's figures (bench/results/persona.json of a run whose first model is
    the shipped one and whose second is its stage 1) into recipe.json and RECIPE.md."""
    bench = json.loads(bench_json.read_text(encoding="utf-8"))
    results = bench["results"]
    names = list(bench["models"])
    suffix = f"_{names[1]}" if len(names) > 1 else ""
    figures = {
        "command": "python -m bench.persona --models " + " ".join(f"{n}=..." for n in names),
        "probes": bench["probes"],
        "questions": bench["questions"],
        **{k: results[f"persona_{k}"] for k in ("recall", "base_rate", "contradiction_rate")},
        **{
            f"stage1_{k}": results.get(f"persona_{k}{suffix}", float("nan"))
            for k in ("recall", "base_rate", "contradiction_rate")
        },
    }
    path = recipe_dir / "recipe.json"
    recipe = json.loads(path.read_text(encoding="utf-8"))
    recipe["persona_bench"] = figures
    path.write_text(json.dumps(recipe, indent=2) + "\n", "utf-8")
    (recipe_dir / "RECIPE.md").write_text(render(recipe), encoding="utf-8")
