"""What a backend is to the router, what it needs to start a model, and how the service side
names code that runs in a model process.

The seam's other half (bot/engine/protocol.py: what crosses it; bot/engine/pipe.py: the
messages of a model process). A backend (bot/engine/backends/) is one variant's model wherever
it runs; the router (bot/engine/router.py) asks nothing else of it than `Backend`. A model
process, a Ray Serve replica or an in-process responder starts from a `ProcessSpec`.

The service side never imports bot.inference (the model's side: torch, ParlAI): where it must
start code that runs there (a model process's entry point, Ray's deployment class, the
in-process responder) it names it by its qualified name, resolved here when it is started
(as vLLM names its worker class).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from bot.config import Settings
from bot.db.conversations import SessionRow
from bot.engine.protocol import DraftSink, Generated, ModelView

# The code a backend starts on the model's side, by qualified name (resolve()).
PROCESS_MAIN = "bot.inference.process.main"  # a model process's entry point (spawn target)
RAY_SERVER = "bot.inference.ray_server.ModelServer"  # a Ray Serve replica's deployment class
INLINE_RESPONDER = "bot.inference.responder.Responder"  # a model in this process


def resolve(qualname: str) -> Any:
    """The object `qualname` names ("package.module.Name"), its module imported now."""
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class ProcessSpec:
    """Everything a model process needs to start (pickled to the new process; a Ray replica
    gets it as its deployment's argument, with no secrets)."""

    variant: str
    settings: Settings
    parlai_overrides: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"
    secrets: tuple[str, ...] = ()
    # Map the weights from the model file, shared with other processes serving it.
    share_weights: bool = True


class Backend(Protocol):
    """One variant's model, wherever it runs (what bot.engine.router needs of it)."""

    async def generate(
        self, session: SessionRow, user_text: str, *, on_draft: DraftSink | None = None
    ) -> Generated:
        """One turn in the session's context; drafts of the reply to `on_draft` if it streams."""
        ...

    def evict(self, session_id: int) -> None:
        """Drop a cached clone."""
        ...

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """The cached clone is in step with the database up to `last_message_id`."""
        ...

    def set_persona(self, session_id: int, persona: str) -> None:
        """Use a new persona from the next turn."""
        ...

    async def inspect(self, session: SessionRow) -> ModelView:
        """What the model reads now for the conversation."""
        ...

    @property
    def alive(self) -> bool:
        """Whether it takes turns now (a model process that stalled or died does not)."""
        ...

    @property
    def state(self) -> str:
        """Why it takes no turns now ("" while it does), for /readyz."""
        ...

    @property
    def restart_reasons(self) -> Mapping[str, int]:
        """Why and how often it was restarted (never, in-process)."""
        ...

    async def close(self) -> None:
        """Stop."""
        ...
