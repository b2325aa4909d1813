"""When the batched search applies: per agent class (its generation hooks) and per batch."""

from __future__ import annotations

from typing import Any

import torch
from parlai.core.torch_generator_agent import TorchGeneratorAgent

from bot.inference.fastgen.steppers import bare_model

# Hooks of TorchGeneratorAgent that `_generate` relies on; a class that overrides any of them
# generates differently, and keeps ParlAI's search.
GENERATION_HOOKS = (
    "_generate",
    "_treesearch_factory",
    "_get_batch_context",
    "_get_initial_decoder_input",
    "_get_next_decoder_input",
    "_generation_activation",
    "_encoder_input",
)


def keeps_generation_hooks(cls: type) -> bool:
    """True when `cls` generates the way TorchGeneratorAgent does (overrides none of its hooks)."""
    return all(
        getattr(cls, name) is getattr(TorchGeneratorAgent, name) for name in GENERATION_HOOKS
    )


def search_reason(agent: Any) -> str | None:
    """Why the agent's own settings rule out the batched search, or None: the agent-level
    half that both the per-batch check (fallback_reason) and the continuous path's make."""
    opt = agent.opt
    if opt.get("inference", "greedy") not in ("beam", "greedy", "delayedbeam"):
        return f"inference={opt.get('inference')}"
    if getattr(agent, "show_token_details", False):
        return "token details"
    if hasattr(agent, "_rerank_beams"):
        return "reranking hook"
    if getattr(agent, "beam_block_list", None):
        return "beam block list"
    return None


def fallback_reason(agent: Any, batch: Any, prefix_tokens: Any) -> str | None:
    """Why this batch must use ParlAI's search, or None when the batched one applies."""
    if not getattr(agent, "fast_search", True):
        return "disabled"
    why = search_reason(agent)
    if why is not None:
        return why
    if prefix_tokens is not None:
        return "prefix tokens"
    if agent.opt.get("gpu_beam_blocking", False) and torch.cuda.is_available():
        return "gpu beam blocking"
    if batch.text_vec is None:
        return "no text_vec"
    if agent.beam_context_block_ngram > 0 and agent._get_batch_context(batch) is None:
        return "no context for context blocking"
    if bare_model(agent).training:
        return "model in training mode"
    return None
