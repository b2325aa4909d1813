"""The collapse guard of `train --from-feedback`: is the candidate still answering each prompt
its own way?

A fine-tune on a few hundred replies can learn to say one thing to everyone (the 👍-only
candidate of bench.loop answered 44-62% of its replies distinctly against the control's 97%).
Before the candidate is installed, the base and the candidate each answer the same prompts
(bot.training.evaluate's SAMPLE_PROMPTS, then the held-out contexts, then training contexts, up
to GUARD_PROMPTS), decoded as the service decodes; when the candidate's share of distinct
replies is below `min_distinct_ratio` of the base's, `collapse_verdict` says why it is refused
and bot.training.feedback installs nothing and raises CollapseError (recipe.json is still
written, with the figures of `run_guard` under `guard`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from bot.training.evaluate import SAMPLE_PROMPTS, sample_replies
from bot.training.feedback_data import FeedbackData

log = logging.getLogger(__name__)

GUARD_PROMPTS = 60  # the collapse guard's prompts: the sample prompts, then held-out contexts


class CollapseError(Exception):
    """The candidate repeats itself far more than the base: not installed (exit status 3)."""


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


def run_guard(
    base_file: Path, candidate: Path, data: FeedbackData, datapath: Path, min_ratio: float
) -> tuple[dict[str, Any], str | None]:
    """The base and the candidate answer the guard's prompts: the figures and replies (for
    recipe.json's `guard`), and why the candidate is refused (None: it passes)."""
    prompts = guard_prompts(data)
    log.info("collapse guard: the base and the candidate answer %d prompts", len(prompts))
    base_replies = distinct_replies(base_file, prompts, datapath)
    candidate_replies = distinct_replies(
        candidate, prompts, datapath, {"dict_file": str(candidate) + ".dict"}
    )
    guard: dict[str, Any] = {
        "prompts": len(prompts),
        "base_distinct_share": round(distinct_share(base_replies), 4),
        "candidate_distinct_share": round(distinct_share(candidate_replies), 4),
        "min_distinct_ratio": min_ratio,
        "replies": [
            {"prompt": p, "base": b, "candidate": c}
            for p, b, c in zip(prompts, base_replies, candidate_replies, strict=True)
        ],
    }
    base_share = distinct_share(base_replies)
    candidate_share = distinct_share(candidate_replies)
    guard["distinct_ratio"] = round(candidate_share / base_share, 4) if base_share else 0.0
    refusal = collapse_verdict(base_share, candidate_share, min_ratio)
    guard["verdict"] = "refused" if refusal else "passed"
    return guard, refusal
