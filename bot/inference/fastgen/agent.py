"""Switching an agent to the batched search: the agent class, and `accelerate` for loaded agents."""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from parlai.agents.transformer.transformer import TransformerGeneratorAgent
from parlai.core.torch_generator_agent import TorchGeneratorAgent

from bot.inference.fastgen.beam import batched_generate
from bot.inference.fastgen.policy import fallback_reason, keeps_generation_hooks

log = logging.getLogger(__name__)


def _fast_generate(
    self: Any,
    batch: Any,
    beam_size: int,
    max_ts: int,
    prefix_tokens: Any = None,
) -> tuple[list[tuple[Any, Any, Any]], list[Any]]:
    """ParlAI's `_generate` contract: (top hypothesis per chat, one search result per chat).

    The batched search where it applies, ParlAI's own otherwise (see `fallback_reason`).
    """
    why = fallback_reason(self, batch, prefix_tokens)
    if why is not None:
        if why != "disabled":
            log.debug("ParlAI's own search for this batch: %s", why)
        result: tuple[list[tuple[Any, Any, Any]], list[Any]] = TorchGeneratorAgent._generate(
            self, batch, beam_size, max_ts, prefix_tokens=prefix_tokens
        )
        return result
    with torch.no_grad():
        return batched_generate(self, batch, beam_size, max_ts)


class FastTransformerGeneratorAgent(TransformerGeneratorAgent):  # type: ignore[misc]
    """ParlAI's transformer generator with the batched beam search.

    `fast_search = False` on an instance turns it off (ParlAI's search), e.g. to compare the two.
    """

    fast_search = True
    _generate = _fast_generate


@functools.cache
def _fast_class(cls: type) -> type:
    """The batched-search subclass of a generator class, built once per class."""
    if cls is TransformerGeneratorAgent:
        return FastTransformerGeneratorAgent
    # a subclass of the agent's own class (a mixin would change the instance layout, and
    # __class__ assignment requires the same layout)
    return type(
        f"Fast{cls.__name__}",
        (cls,),
        {"__module__": __name__, "fast_search": True, "_generate": _fast_generate},
    )


def is_accelerated(agent: Any) -> bool:
    """True when the agent runs the batched search (unless switched off per instance)."""
    return getattr(type(agent), "_generate", None) is _fast_generate


def accelerate(agent: Any) -> Any:
    """Switch a loaded transformer generator (and its future clones) to the batched search.

    Anything else is returned unchanged: other model types, and generator subclasses that change
    how generation works. The agent keeps its state; only its class changes (to a subclass of
    its own), and `clone()` builds `type(self)`, so clones use the new search too.
    """
    cls: type = type(agent)
    if is_accelerated(agent) or not isinstance(agent, TransformerGeneratorAgent):
        return agent
    if not keeps_generation_hooks(cls):
        log.info("%s customises generation; keeping ParlAI's search", cls.__name__)
        return agent
    agent.__class__ = _fast_class(cls)
    log.info("batched beam search on for %s", cls.__name__)
    return agent
