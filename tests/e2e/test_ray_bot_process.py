"""The real `python -m bot run` with MODEL_BACKEND=ray against the loopback Bot API (issue 25).

One service start for the module's main test (a local Ray instance of 2 CPUs, which the service
starts and owns, with the tiny model in one Serve replica): persona, history across turns (seen
in /context: the model reads the earlier turns), /done, a second chat isolated from the first,
drafts streamed over Serve's handle, the model-side metrics labelled with the Serve replica
that answered, a front-end that never loads the model (no torch in its address space, while
the replica has it), and SIGTERM stopping the service and every Ray process it started.
A cluster that cannot be reached at start is an exit status 2 naming RAY_ADDRESS.
"""

from __future__ import annotations

import re
import signal
import socket
from pathlib import Path

import pytest

from bot.texts import ENGLISH
from tests.support.botprocess import (
    TOKEN,
    BotProcess,
    bot_env,
    bot_process,
    db_rows,
    free_port,
)
from tests.support.fakebotapi import FakeBotAPI
from tests.support.ops import scrape, value
from tests.support.waits import until

pytest.importorskip("ray", reason="Ray is not installed (pip install '.[ray]')")
psutil = pytest.importorskip("psutil")

PERSONA_A = "My name is Sarah. I love hiking."
PERSONA_B = "My name is Tom. I like pizza."


def _maps_torch(proc: psutil.Process) -> bool:
    """Whether torch's native library is mapped into the process (it is, once torch is
    imported: no model can be loaded without it)."""
    try:
        return "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


class Chat:
    """One private chat's messages and the bot's answers, in order."""

    def __init__(self, api: FakeBotAPI, chat_id: int) -> None:
        self.api, self.id, self.seen = api, chat_id, 0

    async def say(self, text: str, answers: int = 1) -> str:
        self.api.user_message(self.id, text)
        self.seen += answers
        texts = await self.api.wait_for_texts(self.id, self.seen, timeout_s=60)
        return texts[self.seen - answers]


async def test_the_telegram_path_over_ray_serve(tmp_path: Path, tiny_model_file: str) -> None:
    metrics_port = free_port()
    async with FakeBotAPI(TOKEN) as api:
        env = bot_env(
            tmp_path, api, tiny_model_file,
            MODEL_BACKEND="ray", RAY_NUM_CPUS="2", METRICS_PORT=str(metrics_port),
        )  # fmt: skip
        async with bot_process(env, tmp_path, api) as bot:
            service = psutil.Process(bot.proc.pid)
            a, b = Chat(api, 71), Chat(api, 72)

            assert (await a.say("/persona " + PERSONA_A)).startswith("Got it.")
            first = await a.say("hello how are you")
            second = await a.say("what do you like to do")
            for reply in (first, second):
                assert reply.strip() and not reply.startswith("Sorry")
            # History across turns: the model reads the persona and both turns.
            context = await a.say("/context")
            assert PERSONA_A.split(".")[0] in context
            assert f"you: hello how are you\nme: {first}" in context
            assert f"you: what do you like to do\nme: {second}" in context

            # A second chat is isolated: its own persona, none of the first chat's turns.
            assert (await b.say("/persona " + PERSONA_B)).startswith("Got it.")
            assert (await b.say("hello how are you")).strip()
            context_b = await b.say("/context")
            assert "Tom" in context_b and "Sarah" not in context_b
            assert "what do you like to do" not in context_b  # (the tiny model's replies
            assert context_b.count("\nyou: ") == 1  # are alike: its turns tell them apart)

            # Drafts came over the handle: "Thinking…" first in both chats, then text.
            for chat in (a, b):
                drafts = api.drafts_to(chat.id)
                assert drafts and drafts[0] == "", drafts
            assert any(d.text.strip() for d in api.drafts), [d.text for d in api.drafts]

            # /done ends the conversation: a new one starts without the old turns.
            assert (await a.say("/done", answers=2)).startswith("Conversation ended")
            assert api.texts(a.id)[-1] == ENGLISH.RATE_PROMPT
            third = await a.say("hello how are you")
            context = await a.say("/context")
            assert f"you: hello how are you\nme: {third}" in context
            assert "what do you like to do" not in context and context.count("\nyou: ") == 1
            sessions = db_rows(
                tmp_path, f"SELECT status FROM sessions WHERE chat_id = {a.id} ORDER BY id"
            )
            assert sessions == [("done",), ("active",)]

            # Model-side metrics name the Serve replica that answered (one replica here), the
            # one whose start the replica logged (Ray forwards its log to the service's).
            samples = await scrape(metrics_port)
            replicas = {
                dict(labels)["model_replica"]
                for name, labels in samples
                if name == "bot_model_time_seconds_count" and ("variant", "default") in labels
            }
            assert len(replicas) == 1, samples
            [replica] = replicas
            assert re.fullmatch(r"[a-z0-9]{8}", replica), replica  # Serve's unique_id
            assert f"variant default: replica {replica} (pid" in bot.output()
            turns = value(samples, "bot_turns_total", outcome="replied", variant="default")
            misses = value(
                samples, "bot_agent_cache_misses_total", variant="default", model_replica=replica
            )
            assert turns == 4 and misses is not None and misses >= 1

            # The front-end loaded no model: torch is mapped in the replica, not in it.
            ray_procs = service.children(recursive=True)
            assert any(p.name() == "raylet" for p in ray_procs), ray_procs
            assert not _maps_torch(service)
            assert any(_maps_torch(p) for p in ray_procs), "no replica with torch found"

            bot.proc.send_signal(signal.SIGTERM)
            assert await bot.wait(60) == 0

            def all_gone() -> bool:
                return not any(p.is_running() for p in ray_procs)

            await until(all_gone, within_s=30, every_s=0.2, what="Ray's processes stopping")
        output = bot.output()
    assert "ray: the local instance stopped" in output
    assert TOKEN.split(":")[1] not in output


async def test_an_unreachable_cluster_at_start_is_exit_status_2_naming_ray_address(
    tmp_path: Path, tiny_model_file: str
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = int(s.getsockname()[1])
    async with FakeBotAPI(TOKEN) as api:
        env = bot_env(
            tmp_path, api, tiny_model_file,
            MODEL_BACKEND="ray", RAY_ADDRESS=f"127.0.0.1:{closed}",
        )  # fmt: skip
        bot = BotProcess(env, tmp_path, tmp_path / "bot.log")
        try:
            assert await bot.wait(60) == 2
        finally:
            bot.kill()
    output = bot.output()
    assert f"RAY_ADDRESS=127.0.0.1:{closed}" in output
    assert "ray start --head" in output  # what to do about it
    assert "Traceback" not in output
