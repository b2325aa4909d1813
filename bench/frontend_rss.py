"""A front-end's memory: `python -m bot run` with MODEL_BACKEND=local against MODEL_BACKEND=ray.

    python -m bench.frontend_rss [--model PATH] [--join HOST:PORT]

Each backend in turn: the real service against the loopback Bot API (SQLite), three chats get
one reply each, then the resident set sizes are read (psutil) and the service is stopped with
SIGTERM. `service_rss_mb` is the `python -m bot run` process alone; `model_rss_mb` the
processes that hold the model (the ones with torch's native library mapped: the local model
process, or the Ray replica); `ray_rss_mb` every process the service started (Ray's own with
a local instance: GCS, raylet, agents, the Serve controller and the replica). With `--join`
the ray run joins that cluster instead (`ray start --head` first; RAY_AUTH_MODE=token is set,
the token is read from ~/.ray/auth_token as Ray does), and only the front-end is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import psutil

from tests.support.botprocess import ROOT, TOKEN, bot_env, bot_process
from tests.support.fakebotapi import FakeBotAPI

MB = 1024 * 1024


def _maps_torch(proc: psutil.Process) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text()
    except OSError:
        return False


async def measure(backend: str, model: str, join: str | None) -> None:
    """One backend's figures, as RESULT lines."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        async with FakeBotAPI(TOKEN) as api:
            extra = {"MODEL_BACKEND": backend}
            if backend == "ray" and join:
                extra |= {"RAY_ADDRESS": join, "RAY_AUTH_MODE": "token"}
            elif backend == "ray":
                extra["RAY_NUM_CPUS"] = "2"
            env = bot_env(tmp, api, model, **extra)
            async with bot_process(env, tmp, api) as bot:
                chats = (101, 102, 103)
                for chat in chats:
                    api.user_message(chat, "hello how are you")
                for chat in chats:
                    await api.wait_for_texts(chat, 1, timeout_s=120)
                service = psutil.Process(bot.proc.pid)
                started = service.children(recursive=True)
                holders = [p for p in started if _maps_torch(p)]
                name = f"{backend}{'_joined' if join and backend == 'ray' else ''}"
                figures = {
                    "service_rss_mb": service.memory_info().rss / MB,
                    "model_rss_mb": sum(p.memory_info().rss for p in holders) / MB,
                }
                if backend == "ray":
                    figures["ray_rss_mb"] = sum(p.memory_info().rss for p in started) / MB
                for key, value in figures.items():
                    print(f"RESULT {name}_{key}={value:.0f}", flush=True)
                print(f"RESULT {name}_service_maps_torch={int(_maps_torch(service))}", flush=True)
                bot.proc.terminate()
                await bot.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=str(ROOT / "models" / "chitchat" / "model"), help="BOT_MODEL"
    )
    parser.add_argument("--join", default=None, help="RAY_ADDRESS of a running cluster")
    args = parser.parse_args()
    for backend in ("local", "ray"):
        asyncio.run(measure(backend, args.model, args.join))


if __name__ == "__main__":
    main()
