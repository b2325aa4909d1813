"""`python -m bot train --from-feedback`: a candidate fine-tuned from an export of real stored
feedback, served by the service's own loader; bad input is one line and exit status 2."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bot.admin.cli import admin
from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.db import migrate
from bot.db.engine import make_engine, make_sessionmaker
from bot.training.feedback import (
    FeedbackInputError,
    FeedbackRecipe,
    finetune_from_feedback,
    read_feedback,
)
from tests.integration.admin.test_admin import parse_admin
from tests.integration.training.test_training import _reply

ROOT = Path(__file__).resolve().parents[3]
# The guard is off: a random tiny model's replies are not worth guarding (its own test is in
# test_feedback_negatives.py).
# Random weights need the old learning rate and every update the minutes allow.
TINY = FeedbackRecipe(
    batch_size=8, validation_max_exs=20, base_valid_examples=20, min_distinct_ratio=0.0,
    learning_rate=1e-3, max_steps=0,
)  # fmt: skip
LIKED = ("what do you like to do?", "do you have a dog?", "where do you work?")
DISLIKED = ("no.", "bad.", "i do not know.")


async def _seed_and_export(url: str, path: Path, chats: int = 12) -> None:
    engine = make_engine(url)
    store = ConversationStore(make_sessionmaker(engine))
    try:
        for chat in range(1, chats + 1):
            session = (await store.set_persona(chat, chat, "I love dogs.", notice="ok")).id
            for k in range(3):
                good = (chat + k) % 2 == 0
                reply = (LIKED if good else DISLIKED)[k]
                turn = await store.record_turn(session, chat, f"hi {k}, i like music", reply)
                await store.vote(chat, chat, turn.bot_message_id, 1 if good else -1)
        args = parse_admin("export", "--format", "parlai", "-o", str(path))
        assert await admin(url, args, io.StringIO()) == 0
    finally:
        await engine.dispose()


@pytest.fixture
def export_file(tmp_path: Path) -> Path:
    url = f"sqlite+aiosqlite:///{tmp_path / 'bot.sqlite3'}"
    migrate.upgrade(url)
    path = tmp_path / "feedback.txt"
    asyncio.run(_seed_and_export(url, path))
    return path


def test_liked_replies_are_positives_and_disliked_ones_negatives(export_file: Path) -> None:
    data = read_feedback(export_file, TINY)
    assert (data.episodes, data.examples) == (12, 36)
    assert data.by_source == {"vote_up": 18, "arena_won": 0, "rating_4_5": 0}
    # The held-out conversations' disliked replies are measured, not trained on.
    held = len(data.heldout_disliked)
    assert data.left_out == {"disliked": held, "neutral": 0, "unsafe": 0}
    assert len(data.negatives) + held == 18
    assert {ex.label for ex in data.negatives + data.heldout_disliked} <= set(DISLIKED)
    none = read_feedback(export_file, replace(TINY, negatives="none"))
    assert none.negatives == [] and none.left_out["disliked"] == 18
    trained = data.train + data.heldout
    assert len(trained) == 18 and {ex.label for ex in trained} <= set(LIKED)
    assert {ex.session for ex in data.train}.isdisjoint({ex.session for ex in data.heldout})
    # The context is what the model read: the persona first, then the turns before the reply.
    first = next(ex for ex in trained if ex.text.count("\n") >= 3)
    assert first.text.startswith("your persona: I love dogs.\nhi 0, i like music\n")


def test_finetune_writes_a_model_the_service_serves(
    export_file: Path, tiny_model_file: str, tmp_path: Path
) -> None:
    out = tmp_path / "candidate"
    record = finetune_from_feedback(
        export_file, tiny_model_file, out, minutes=0.3, recipe=TINY, progress=False,
        datapath=tmp_path / "parlai",
    )  # fmt: skip
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe == json.loads(json.dumps(record))
    assert recipe["base"] == tiny_model_file and recipe["seed"] == TINY.seed
    assert recipe["data"]["liked_by_source"]["vote_up"] == 18
    assert recipe["data"]["negative_examples"] + recipe["data"]["left_out"]["disliked"] == 18
    assert recipe["training"]["steps"] > 0
    feedback = recipe["perplexity"]["heldout_feedback"]
    # Random weights learn the liked replies at once: the held-out liked turns get likelier.
    assert feedback["after"]["ppl"] < feedback["before"]["ppl"]
    assert {"before", "after", "data"} <= set(recipe["perplexity"]["base_validation"])

    opt = json.loads((out / "model.opt").read_text())
    assert "init_opt" not in opt and "init_model" not in opt
    from bot.inference.model import load_shared_agent

    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, bot_model=str(out / "model"), data_dir=tmp_path / "d", model_device="cpu"
    )
    agent = load_shared_agent(settings)
    result = asyncio.run(_reply(agent, "I love dogs.", "hi, i like music"))
    assert result.text.strip()


def test_a_conversation_exported_as_several_episodes_is_held_out_whole(tmp_path: Path) -> None:
    # A persona change splits a conversation into episodes (bot.admin.export); the later ones
    # repeat the earlier turns, so they must land on the same side of the split.
    path = tmp_path / "split.txt"
    lines = []
    for session in range(1, 41):
        lines.append(f"text:hi\tlabels:hello\tvotes_up:1\tsession_id:{session}\tepisode_done:True")
        lines.append(
            f"text:your persona: I love dogs.\\nhi\\nhello\\nhow are you\tlabels:fine"
            f"\tvotes_up:1\tsession_id:{session}\tepisode_done:True"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = read_feedback(path, FeedbackRecipe(heldout_share=0.5))
    assert data.episodes == 80 and data.train and data.heldout
    assert {ex.session for ex in data.train}.isdisjoint({ex.session for ex in data.heldout})


def test_an_export_with_nothing_liked_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_text("text:hi\tlabels:no.\tvotes_up:0\tvotes_down:1\tepisode_done:True\n")
    with pytest.raises(FeedbackInputError, match="none that users liked"):
        read_feedback(path)


def _train(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DATA_DIR": str(tmp_path / "data")}
    return subprocess.run(
        [sys.executable, "-m", "bot", "train", *argv],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_bad_input_is_one_line_and_exit_status_2(tmp_path: Path, export_file: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    not_generator = tmp_path / "ranker"
    Path(str(not_generator) + ".opt").write_text(json.dumps({"model": "transformer/ranker"}))
    not_generator.write_bytes(b"")
    out = str(tmp_path / "cand")
    for argv, message in (
        (["--from-feedback", str(empty), "--out", out], "has no exported replies"),
        (["--from-feedback", str(tmp_path / "nope.txt"), "--out", out], "no export at"),
        (["--from-feedback", str(export_file), "--base", str(tmp_path / "none"), "--out", out],
         "no ParlAI model at"),
        (["--from-feedback", str(export_file), "--base", str(not_generator), "--out", out],
         "not a generator"),
        (["--from-feedback", str(export_file)], "needs --out DIR"),
        (["--base", str(not_generator)], "--base goes with --from-feedback"),
    ):  # fmt: skip
        proc = _train(tmp_path, *argv)
        assert proc.returncode == 2, (argv, proc.stderr[-2000:])
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and message in errors[0], (argv, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr
    assert not Path(out).exists()  # nothing written for bad input
