"""The default model shipped in the repository (models/chitchat/): one long training run with
the default recipe, installed with its recipe beside it.

`python -m bot train --ship` (make train-shipped) reproduces it from scratch: the same data
package, seed and arguments for the recorded minutes (a wall-clock budget, so a faster or
busier machine gets through more or fewer steps and a slightly different model), then
measures it and rewrites models/chitchat/ with recipe.json and RECIPE.md.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bot.config import SHIPPED_MODEL_FILE, Settings
from bot.training.args import parlai_args
from bot.training.evaluate import SAMPLE_PROMPTS, held_out_perplexity, sample_replies
from bot.training.install import train_lock
from bot.training.recipe import DEFAULT_RECIPE
from bot.training.train import TrainResult, train_model

log = logging.getLogger(__name__)

SHIP_MINUTES = 100.0
FILES = ("", ".dict", ".dict.codecs", ".opt")


def ship(minutes: float = SHIP_MINUTES, dest: Path = SHIPPED_MODEL_FILE) -> dict[str, Any]:
    """Train the default recipe for `minutes` and install it at `dest` with its recipe."""
    with train_lock(dest), tempfile.TemporaryDirectory(prefix="ship-") as tmp:
        trained = Path(tmp) / "model"
        result = train_model(trained, minutes=minutes, cap_minutes=minutes, progress=False)
        machine = f"{os.cpu_count()} CPU cores, torch threads {_threads()}"
        return install_shipped(trained, dest, minutes=minutes, result=result, machine=machine)


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
        "heldout": {**heldout, "examples": DEFAULT_RECIPE.validation_max_exs},
        "size_bytes": sum(
            Path(str(dest) + s).stat().st_size for s in FILES if Path(str(dest) + s).exists()
        ),
        "samples": [
            {"prompt": p, "reply": r} for p, r in zip(SAMPLE_PROMPTS, samples, strict=True)
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


def render(recipe: dict[str, Any]) -> str:
    """RECIPE.md: everything needed to read and to reproduce the shipped model."""
    r = recipe["recipe"]
    t = recipe.get("training") or {}
    lines = [
        "# The shipped default model",
        "",
        "A small ParlAI `transformer/generator` trained on the chitchat-dataset package, the",
        "model `make run` and `make chat` serve when `BOT_MODEL` is unset. Reproduce it with",
        f"`make train-shipped` (`python -m bot train --ship`, {recipe['minutes']:g} minutes).",
        "",
        "| | |",
        "|---|---|",
        f"| data | `{recipe['data']}` |",
        f"| ParlAI, torch | {recipe['parlai']}, {recipe['torch']} |",
        f"| seed | {recipe['seed']} |",
        f"| architecture | {r['n_layers']} layers, {r['embedding_size']} dims, "
        f"{r['ffn_size']} FFN, {r['n_heads']} heads, {r['bpe_symbols']} BPE symbols |",
        f"| budget | {recipe['minutes']:g} minutes of wall clock |",
        f"| machine | {recipe.get('machine') or 'not recorded'} |",
    ]
    if t:
        lines += [
            f"| steps, examples seen | {t['steps']:,}, {t['examples_seen']:,} "
            f"(of {t['train_examples']:,} training examples) |",
        ]
    h = recipe["heldout"]
    lines += [
        f"| held-out perplexity | **{h['ppl']:.1f}** (first {h['examples']} held-out examples; "
        f"loss {h['loss']:.3f}, token accuracy {h['token_acc']:.3f}) |",
        f"| size | {recipe['size_bytes'] / 1e6:.1f} MB |",
        f"| decoding | {r['inference']}: top-{r['topk']} sampling for the first "
        f"{r['beam_delay']} tokens, then beam {r['beam_size']}; min length "
        f"{r['beam_min_length']}, {r['beam_block_ngram']}-gram blocking |",
        "",
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
        "```",
        " ".join(recipe["parlai_args"]),
        "```",
        "",
    ]
    return "\n".join(lines)
