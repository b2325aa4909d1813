"""When the batched search applies: per agent class (its generation hooks) and per batch."""

from __future__ import annotations

from typing import Any

import torch
from parlai.core.torch_generator_agent import TorchGeneratorAgent

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


def fallback_reason(agent: Any, batch: Any, prefix_tokens: Any) -> str | None:
    """Why this batch must use ParlAI's search, or None when the batched one applies."""
    if not getattr(agent, "fast_search", True):
        return "disabled"
    opt = agent.opt
    if opt.get("inference", "greedy") not in ("beam", "greedy", "delayedbeam"):
        return f"inference={opt.get('inference')}"
    if prefix_tokens is not None:
        return "prefix tokens"
    if getattr(agent, "show_token_details", False):
        return "token details"
    if hasattr(agent, "_rerank_beams"):
        return "reranking hook"
    if getattr(agent, "beam_block_list", None):
        return "beam block list"
    if opt.get("gpu_beam_blocking", False) and torch.cuda.is_available():
        return "gpu beam blocking"
    if batch.text_vec is None:
        return "no text_vec"
    if agent.beam_context_block_ngram > 0 and agent._get_batch_context(batch) is None:
        return "no context for context blocking"
    model = agent.model
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    if model.training:
        return "model in training mode"
    return None
