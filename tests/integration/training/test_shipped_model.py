"""The default model shipped in models/chitchat/: what a fresh clone serves with BOT_MODEL
unset, and the figures its recipe records still hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.config import SHIPPED_MODEL_FILE, Settings
from bot.training.recipe import DEFAULT_RECIPE, Recipe

RECIPE_FILE = SHIPPED_MODEL_FILE.parent / "recipe.json"


@pytest.fixture(scope="module")
def recipe() -> dict[str, object]:
    assert RECIPE_FILE.is_file(), f"{RECIPE_FILE} is missing: the shipped model has no recipe"
    data: dict[str, object] = json.loads(RECIPE_FILE.read_text())
    return data


def test_an_unset_bot_model_serves_the_shipped_model(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path)  # type: ignore[call-arg]
    assert settings.model_file == str(SHIPPED_MODEL_FILE)
    # A model trained here (make train) wins over the shipped one.
    trained = settings.default_model_file
    trained.parent.mkdir(parents=True)
    Path(str(trained) + ".opt").write_text("{}")
    assert settings.model_file == str(trained)


def test_the_shipped_model_is_small_and_its_recipe_is_the_default_recipe(
    recipe: dict[str, object],
) -> None:
    size = sum(
        Path(str(SHIPPED_MODEL_FILE) + s).stat().st_size for s in ("", ".dict", ".dict.codecs")
    )
    assert size < 30e6
    assert Recipe(**recipe["recipe"]) == DEFAULT_RECIPE  # type: ignore[arg-type]
    opt = json.loads(Path(str(SHIPPED_MODEL_FILE) + ".opt").read_text())
    assert "model_file" not in opt and "dict_file" not in opt  # nothing of the training machine


def test_the_recorded_heldout_perplexity_holds(recipe: dict[str, object]) -> None:
    from bot.inference import compat
    from bot.training.evaluate import held_out_perplexity

    compat.apply()
    recorded = recipe["heldout"]
    assert isinstance(recorded, dict)
    measured = held_out_perplexity(str(SHIPPED_MODEL_FILE))
    assert measured["ppl"] == pytest.approx(recorded["ppl"], rel=0.02)
    assert measured["ppl"] <= 90  # the goal: at most half of the 12-minute model's 170-190


def test_it_decodes_on_the_batched_search(tmp_path: Path) -> None:
    from parlai.core.message import Message

    from bot.inference import compat, fastgen
    from bot.inference.model import load_shared_agent

    compat.apply()
    agent = load_shared_agent(
        Settings(_env_file=None, data_dir=tmp_path, model_device="cpu")  # type: ignore[call-arg]
    )
    assert agent.opt["inference"] == "delayedbeam"
    batch = agent.batchify([agent.clone().observe(Message({"text": "hi, how are you?"}))])
    assert fastgen.fallback_reason(agent, batch, None) is None


def test_it_follows_its_persona(tmp_path: Path, recipe: dict[str, object]) -> None:
    """Stage 2 is shipped with its own recipe and decoding, and the model states its persona's
    facts: of the eight RECIPE.md exchanges that ask about one, stage 1 stated 1, the shipped
    model 6 (bench.persona measures 178 questions; this is the quick check)."""
    from bench.persona import states
    from bot.inference import compat
    from bot.inference.model import load_shared_agent
    from bot.training.evaluate import PERSONA_SAMPLES, persona_replies
    from bot.training.persona_data import DEFAULT_PERSONA_RECIPE, PersonaRecipe

    stage2 = recipe["stage2"]
    assert isinstance(stage2, dict)
    assert PersonaRecipe(**stage2["recipe"]) == DEFAULT_PERSONA_RECIPE
    opt = json.loads(Path(str(SHIPPED_MODEL_FILE) + ".opt").read_text())
    assert opt["beam_delay"] == DEFAULT_PERSONA_RECIPE.beam_delay
    assert opt["beam_context_block_ngram"] == DEFAULT_PERSONA_RECIPE.beam_context_block_ngram

    compat.apply()
    agent = load_shared_agent(
        Settings(_env_file=None, data_dir=tmp_path, model_device="cpu")  # type: ignore[call-arg]
    )
    facts = ("sarah", "hiking", "midwife", "ferret", "edinburgh", "paella", "oliver", "locksmith")
    replies = persona_replies(agent, PERSONA_SAMPLES[: len(facts)])
    stated = [r for r, fact in zip(replies, facts, strict=True) if states(r, fact)]
    assert len(stated) >= 5, replies
