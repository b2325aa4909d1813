"""`train --from-feedback` learns from 👎 too: the training data (liked replies as positives,
disliked ones as negatives, at most `max_per_chat` of each per chat) from an export of a real
database; a real fine-tune of the tiny model with unlikelihood makes the disliked reply less
likely and the liked one likelier (per-token log-likelihood by ParlAI's own agent); the collapse
guard refuses a candidate that says one thing to everyone."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bot.admin.cli import admin
from bot.conversations.store import ConversationStore
from bot.db import migrate
from bot.db.engine import make_engine, make_sessionmaker
from bot.training.feedback import (
    FeedbackRecipe,
    collapse_verdict,
    finetune_from_feedback,
    read_feedback,
)
from tests.integration.admin.test_admin import parse_admin

ROOT = Path(__file__).resolve().parents[3]
LIKED = "what do you like to do?"
DISLIKED = "no."
HEAVY_CHAT = 777  # one account that votes on every reply it gets
HEAVY_REPLIES = 30


async def _seed(url: str, path: Path, chats: int, heavy: int) -> None:
    """`chats` chats of 2 replies (one liked, one disliked), and a heavy chat with `heavy`
    replies, every other one liked; then the real `admin export --format parlai`."""
    engine = make_engine(url)
    store = ConversationStore(make_sessionmaker(engine))
    try:
        plan = [(chat, 2) for chat in range(1, chats + 1)] + [(HEAVY_CHAT, heavy)]
        for chat, replies in plan:
            session = (await store.set_persona(chat, chat, "I love dogs.", notice="ok")).id
            for k in range(replies):
                good = k % 2 == 0
                turn = await store.record_turn(
                    session, chat, f"hi {k}, i like music", LIKED if good else DISLIKED
                )
                await store.vote(chat, chat, turn.bot_message_id, 1 if good else -1)
        args = parse_admin("export", "--format", "parlai", "-o", str(path))
        assert await admin(url, args, io.StringIO()) == 0
    finally:
        await engine.dispose()


def _export(tmp_path: Path, chats: int = 12, heavy: int = HEAVY_REPLIES) -> Path:
    url = f"sqlite+aiosqlite:///{tmp_path / 'bot.sqlite3'}"
    migrate.upgrade(url)
    path = tmp_path / "feedback.txt"
    asyncio.run(_seed(url, path, chats, heavy))
    return path


def test_positives_negatives_and_the_per_chat_cap(tmp_path: Path) -> None:
    export = _export(tmp_path)
    # The export numbers the chats (no chat ids in a dataset): 12 small chats, then the heavy.
    from parlai.utils.misc import str_to_msg

    chats = [str_to_msg(line)["chat"] for line in export.read_text().splitlines()]
    assert sorted(set(chats), key=int) == [str(n) for n in range(1, 14)]
    assert chats.count("13") == HEAVY_REPLIES

    recipe = FeedbackRecipe(heldout_share=0.0, max_per_chat=4)
    data = read_feedback(export, recipe)
    assert data.examples == 12 * 2 + HEAVY_REPLIES and data.chats == 13
    positives, negatives = data.train + data.heldout, data.negatives + data.heldout_disliked
    assert {ex.label for ex in positives} == {LIKED}
    assert {ex.label for ex in negatives} == {DISLIKED}
    assert all(ex.disliked for ex in negatives) and not any(ex.disliked for ex in positives)
    # The heavy chat's 15 liked and 15 disliked replies count like 4 each; the others are
    # under the cap and all kept.
    heavy = [ex for ex in positives if ex.chat == "13"]
    assert len(heavy) == 4 and len([ex for ex in negatives if ex.chat == "13"]) == 4
    assert len(positives) == 12 + 4 and len(negatives) == 12 + 4
    assert data.capped == {"liked": 15 - 4, "disliked": 15 - 4}
    assert data.by_source["vote_up"] == 16  # counted after the cap
    # Kept examples are the heavy chat's own (distinct contexts), a seeded sample.
    assert len({ex.text for ex in heavy}) == 4
    again = read_feedback(export, recipe)
    assert [ex.text for ex in again.train] == [ex.text for ex in data.train]

    # --negatives none leaves the disliked replies out, as before; no cap keeps them all.
    none = read_feedback(export, replace(recipe, negatives="none", max_per_chat=0))
    assert none.negatives == [] and none.left_out["disliked"] == 12 + 15
    assert len(none.train + none.heldout) == 12 + 15


def _mean_logprob(model_file: str, examples: list[tuple[str, str]]) -> float:
    """Mean per-token log-probability of each label after its context, teacher-forced, by
    ParlAI's own agent and model."""
    import torch
    from parlai.core.agents import create_agent_from_model_file
    from parlai.core.message import Message

    agent: Any = create_agent_from_model_file(model_file, {"no_cuda": True})
    agent.model.eval()
    total, tokens = 0.0, 0
    for text, label in examples:
        agent.reset()
        obs = agent.observe(Message({"text": text, "labels": [label], "episode_done": True}))
        batch = agent.batchify([obs])
        with torch.no_grad():
            scores, *_ = agent.model(*agent._model_input(batch), ys=batch.label_vec)
        logprobs = torch.log_softmax(scores.float(), dim=-1)
        target = logprobs.gather(-1, batch.label_vec.unsqueeze(-1)).squeeze(-1)
        mask = batch.label_vec.ne(agent.NULL_IDX)
        total += float(target[mask].sum())
        tokens += int(mask.sum())
    return total / tokens


def test_unlikelihood_makes_the_disliked_reply_less_likely(
    tmp_path: Path, tiny_model_file: str
) -> None:
    """The same fine-tune (seed, data, a fixed number of updates) with and without the
    negatives: both make the liked replies likelier; only the one with unlikelihood makes the
    disliked ones less likely, and they end less likely than without it. (Likelihood on the
    liked replies alone also lifts the disliked ones, which share their words: a bound on
    time instead of on updates let that win on a fast machine.)"""
    export = _export(tmp_path, chats=12, heavy=0)
    # Random weights need a higher learning rate than the default, and a random model gives
    # every token a small probability, where unlikelihood's push (about p per token) is weak:
    # alpha 1 instead of the default 0.3 makes the difference clear (0.03 nats per token here,
    # where 0.3 gave 0.02). The minutes are generous: the updates are what is fixed.
    recipe = FeedbackRecipe(
        batch_size=8, validation_max_exs=20, base_valid_examples=20, min_distinct_ratio=0.0,
        learning_rate=1e-3, max_steps=60, unlikelihood_alpha=1.0,
    )  # fmt: skip
    data = read_feedback(export, recipe)
    assert data.negatives, "the export must have disliked replies to train away from"
    liked = [(ex.text, ex.label) for ex in data.train]
    disliked = [(ex.text, ex.label) for ex in data.negatives]
    before = _mean_logprob(tiny_model_file, liked), _mean_logprob(tiny_model_file, disliked)

    after, steps = {}, {}
    for negatives in ("unlikelihood", "none"):
        out = tmp_path / negatives
        record = finetune_from_feedback(
            export, tiny_model_file, out, minutes=5.0, progress=False,
            recipe=replace(recipe, negatives=negatives), datapath=tmp_path / "parlai",
        )  # fmt: skip
        assert record["negatives"] == negatives and record["installed"]
        steps[negatives] = record["training"]["steps"]
        model = str(out / "model")
        after[negatives] = _mean_logprob(model, liked), _mean_logprob(model, disliked)
    assert steps["unlikelihood"] == steps["none"] > 0, steps  # the same updates on each side
    record_ul = json.loads((tmp_path / "unlikelihood" / "recipe.json").read_text())
    assert record_ul["data"]["negative_examples"] == len(data.negatives)
    figures = (before, after)
    assert after["unlikelihood"][0] > before[0], figures  # the liked replies: likelier
    assert after["none"][0] > before[0], figures
    assert after["unlikelihood"][1] < before[1], figures  # the disliked ones: less likely
    assert after["unlikelihood"][1] < after["none"][1], figures  # ... than without negatives
    # The candidate is served by the stock agent: the training agent is only a loss.
    opt = json.loads((tmp_path / "unlikelihood" / "model.opt").read_text())
    assert opt["model"] == "transformer/generator" and "unlikelihood_alpha" not in opt


def test_a_refused_candidate_is_not_installed(tmp_path: Path, tiny_model_file: str) -> None:
    # Staged: a random tiny model's replies are degenerate either way, so the refusal is staged
    # with a guard no candidate can pass (100 times the base's distinct share); the real
    # threshold is test_the_guard_verdict's. Through the command an operator runs.
    export = _export(tmp_path, chats=12, heavy=0)
    out = tmp_path / "candidate"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DATA_DIR": str(tmp_path / "data")}
    argv = ["--from-feedback", str(export), "--base", tiny_model_file, "--out", str(out),
            "--minutes", "0.2", "--min-distinct-ratio", "100"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "bot", "train", *argv],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "the candidate collapsed" in errors[0], proc.stderr[-3000:]
    assert "not installed" in errors[0] and "Traceback" not in proc.stderr
    assert not (out / "model").exists() and not (out / "model.opt").exists()
    record = json.loads((out / "recipe.json").read_text())
    guard = record["guard"]
    assert guard["verdict"] == "refused" and record["installed"] is False
    # The guard's prompts: the sample prompts, then the export's contexts, each once.
    assert guard["prompts"] == len({r["prompt"] for r in guard["replies"]}) > 10
    for side in ("base", "candidate"):
        replies = [r[side] for r in guard["replies"]]
        assert guard[f"{side}_distinct_share"] == round(len(set(replies)) / len(replies), 4)


def test_the_guard_verdict() -> None:
    assert collapse_verdict(0.95, 0.95 * 0.9, 0.9) is None  # exactly 90% of the base's passes
    refusal = collapse_verdict(0.95, 0.5, 0.9)
    assert refusal is not None and "50%" in refusal and "95%" in refusal
    assert "--minutes" in refusal  # it says what to try
    assert collapse_verdict(0.95, 0.1, 0.0) is None  # 0 turns the guard off
