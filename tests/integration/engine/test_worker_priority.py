"""A model worker process runs at a lower CPU priority than the service that started it, so a
busy model never starves the service's event loop (its heartbeats would miss and it would fence
itself: docs/benchmarks.md, "Scale-out")."""

from __future__ import annotations

import os
from pathlib import Path

from bot.inference.process import MODEL_PROCESS_NICE
from tests.integration.engine.test_worker_drafts import tiny_worker


async def test_a_model_worker_is_nicer_than_the_service(
    tiny_model_file: str, tmp_path: Path
) -> None:
    async with tiny_worker(tiny_model_file, tmp_path) as handle:
        assert handle.pid is not None
        worker = os.getpriority(os.PRIO_PROCESS, handle.pid)
    service = os.getpriority(os.PRIO_PROCESS, 0)
    assert worker == min(service + MODEL_PROCESS_NICE, 19)
