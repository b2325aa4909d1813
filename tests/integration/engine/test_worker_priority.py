"""A model worker process runs at a lower CPU priority than the service that started it, so a
busy model never starves the service's event loop (its heartbeats would miss and it would fence
itself: docs/benchmarks.md, "Scale-out")."""

from __future__ import annotations

import os
from pathlib import Path

from bot.config import Settings
from bot.engine.backends.local import ModelProcess, process_spec
from bot.inference.process import MODEL_PROCESS_NICE
from tests.integration.engine.test_worker_drafts import NoHistory


async def test_a_model_worker_is_nicer_than_the_service(
    tiny_model_file: str, tmp_path: Path
) -> None:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, bot_model=tiny_model_file, data_dir=tmp_path / "data"
    )
    handle = ModelProcess(process_spec("tiny", settings, {}, 1, ()), NoHistory())
    await handle.start()
    try:
        assert handle.pid is not None
        worker = os.getpriority(os.PRIO_PROCESS, handle.pid)
    finally:
        await handle.close()
    service = os.getpriority(os.PRIO_PROCESS, 0)
    assert worker == min(service + MODEL_PROCESS_NICE, 19)
