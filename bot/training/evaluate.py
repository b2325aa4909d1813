"""Held-out perplexity of a model on the chitchat-dataset split a recipe makes, and sample
replies: the figures models/chitchat/RECIPE.md records, and the test that keeps them true."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bot.training.data import load_conversations, write_dataset
from bot.training.recipe import DEFAULT_RECIPE, Recipe

# The prompts of the sample exchanges in RECIPE.md and the README.
SAMPLE_PROMPTS = (
    "hi! how are you today?",
    "what do you do for a living?",
    "i just got back from a trip to italy.",
    "do you have any pets?",
    "what kind of music do you like?",
    "i'm so tired, i worked all day.",
    "what's your favorite food?",
    "do you like to read?",
    "i'm thinking about learning to play the guitar.",
    "what are you doing this weekend?",
)


def valid_figures(model_file: str, datapath: Path, max_examples: int) -> dict[str, float]:
    """ppl, loss, token accuracy and examples of a model on the first `max_examples` examples
    of a fromfile data set (`datapath` + _valid), in their file order, batch by batch."""
    from parlai.scripts.eval_model import EvalModel

    from bot.training.loop import metric_value
    from bot.training.train import parlai_quiet

    with parlai_quiet():
        report = EvalModel.main(
            task="fromfile:parlaiformat",
            fromfile_datapath=str(datapath),
            fromfile_datatype_extension=True,
            model_file=model_file,
            datatype="valid",
            num_examples=max_examples,
            batchsize=16,
            skip_generation=True,
            no_cuda=True,
            log_every_n_secs=-1,
            display_examples=False,
            interactive_mode=False,
        )
    values = {k: metric_value(report, k) for k in ("ppl", "loss", "token_acc", "exs")}
    return {k: v for k, v in values.items() if v is not None}


def held_out_perplexity(
    model_file: str, recipe: Recipe = DEFAULT_RECIPE, max_examples: int | None = None
) -> dict[str, float]:
    """ppl, loss and token accuracy on the first `max_examples` held-out examples (the
    recipe's validation_max_exs by default), in their file order, batch by batch."""
    n = max_examples or recipe.validation_max_exs
    with tempfile.TemporaryDirectory(prefix="heldout-") as tmp:
        write_dataset(Path(tmp), load_conversations(), recipe)
        return valid_figures(model_file, Path(tmp) / "chitchat", n)


def sample_replies(
    agent: Any, prompts: tuple[str, ...] = SAMPLE_PROMPTS, seed: int = 0
) -> list[str]:
    """One reply per prompt, each in a fresh conversation, with the agent's own decoding."""
    return _first_replies(agent, [(agent.clone(), prompt) for prompt in prompts], seed)


def _first_replies(agent: Any, conversations: list[tuple[Any, str]], seed: int) -> list[str]:
    """The reply to each (fresh clone, first message), one at a time, torch seeded once with
    `seed`, cleaned as the service cleans replies."""
    import torch
    from parlai.core.message import Message

    from bot.inference.batcher import reply_cleaner

    torch.manual_seed(seed)
    clean = reply_cleaner(agent.opt)
    replies = []
    for clone, prompt in conversations:
        obs = clone.observe(Message({"text": prompt, "episode_done": False}))
        replies.append(clean(str(agent.batch_act([obs])[0]["text"])))
    return replies


# The persona sample exchanges in RECIPE.md: (persona, message). Their values are not in the
# training templates' lists (bot/training/persona_data.py TRAIN_VALUES).
PERSONA_SAMPLES = (
    ("My name is Sarah. I love hiking.", "what is your name?"),
    ("My name is Sarah. I love hiking.", "what do you like to do for fun?"),
    ("I work as a midwife. I have two kids.", "what do you do for a living?"),
    ("I have a ferret. I live in a small flat.", "do you have any pets?"),
    ("I live in Edinburgh. I am a student.", "where do you live?"),
    ("My favorite food is paella. I cook every day.", "what's your favorite food?"),
    ("My name is Oliver. I work as a locksmith. I love origami.", "hi! who are you?"),
    ("My name is Oliver. I work as a locksmith. I love origami.", "what is your job?"),
    ("I'm from Kyoto. I enjoy archery.", "how was your weekend?"),
    ("My name is Chloe. My favorite food is falafel.", "i just got back from a trip to italy."),
)


def persona_replies(
    agent: Any, samples: tuple[tuple[str, str], ...] = PERSONA_SAMPLES, seed: int = 0
) -> list[str]:
    """One reply per (persona, message), each in a fresh conversation whose clone pins the
    persona the way the service's does (bot.inference.cache.new_clone)."""
    from bot.inference.cache import new_clone

    return _first_replies(agent, [(new_clone(agent, persona), p) for persona, p in samples], seed)
