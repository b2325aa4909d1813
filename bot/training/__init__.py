"""The embedded default model, a small ParlAI transformer/generator, and its offline pipeline.

It learns from the `chitchat-dataset` package (7,168 human chit-chat conversations, MIT) inside a
wall-clock budget of at most 15 minutes on a laptop CPU, with ParlAI's own dictionary builder and
TrainLoop. Steps:

1. Every conversation becomes examples in ParlAI's dialog text format ("fromfile"): the last few
   turns as context, the next turn as the label, both speakers' sides. A share of examples gets
   `your persona: ...` lines made of sentences the replying speaker says elsewhere in the same
   conversation, so persona lines at the head of the context (how
   bot/inference/model_input.py pins a chat's persona) are familiar input rather than noise.
2. A lower-cased BPE dictionary (subword-nmt, learnt offline from the training split) is built.
3. TrainLoop trains until the time budget is spent, validating on held-out conversations, and
   the last weights are kept (within minutes the loss still falls, so the last is the best).
4. Generation settings (delayed beam search, n-gram blocking) are written into the saved
   `.opt`, the optimizer state is dropped from the weights, and the files are moved into place
   with the `.opt` last: a model whose `.opt` exists is complete.

Expect little: on 2 shared cores the run sees about 10,000 examples, a small fraction of one
epoch, and the model answers in short, generic, often ungrammatical phrases. It ignores the
persona (chitchat-dataset has none; the persona lines only teach it not to be thrown by them;
`persona_data` is an opt-in second stage that tries to teach it, docs/models.md). It exists so
that the service runs offline out of the box; BlenderBot
(BOT_MODEL=zoo:blender/blender_90M/model) is the model for real conversations.

The pipeline is offline: `python -m bot run` never imports it, except on a first start without
any model (bot.inference.model.ensure_model). Modules: `recipe` (the run's knobs), `data` (step 1),
`args` (ParlAI's arguments), `loop` and `progress` (step 3), `install` (step 4 and the lock),
`train` (one run, end to end), `cli` (`python -m bot train`), `ship` and `persona_data` (the
shipped model and its opt-in persona stage).
"""

from bot.training.cli import TrainingError, clamp_minutes, train_cli
from bot.training.data import (
    DataStats,
    Example,
    conversation_turns,
    load_conversations,
    make_examples,
    persona_candidates,
    to_parlai_line,
    write_dataset,
)
from bot.training.install import model_exists
from bot.training.recipe import DEFAULT_RECIPE, MAX_MINUTES, Recipe
from bot.training.train import TrainResult, train_model

__all__ = [
    "DEFAULT_RECIPE",
    "MAX_MINUTES",
    "DataStats",
    "Example",
    "Recipe",
    "TrainResult",
    "TrainingError",
    "clamp_minutes",
    "conversation_turns",
    "load_conversations",
    "make_examples",
    "model_exists",
    "persona_candidates",
    "to_parlai_line",
    "train_cli",
    "train_model",
    "write_dataset",
]
