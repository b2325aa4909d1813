"""`python -m bot chat` driven by a script on stdin, against a real SQLite file."""

from __future__ import annotations

import os
import pty
import re
import select
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.support.cli import run_cli
from tests.support.waits import until

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """\
/persona My name is Sarah. I love hiking.
hello how are you
what do you like
/good
/bad
/persona
/rate 4
/done
/rate 9
/rate 5
/rate 3
hello again
/lang
/arena
/bogus
"""


def chat_env(tmp_path: Path, model: str, **extra: str) -> dict[str, str]:
    """The environment of `python -m bot chat` on `model` with its own SQLite file: this
    process's, less its Telegram, database and log-level settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TELEGRAM_", "DATABASE_")) and k != "LOG_LEVEL"
    }
    env.update(
        PYTHONPATH=str(ROOT),
        BOT_MODEL=model,
        DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'chat.sqlite3'}",
        DATA_DIR=str(tmp_path / "data"),
        **extra,
    )
    return env


def test_terminal_chat_persists_everything(tmp_path: Path, tiny_model_file: str) -> None:
    db_file = tmp_path / "chat.sqlite3"
    env = chat_env(tmp_path, tiny_model_file)
    proc = run_cli("chat", "--chat-id", "42", input=SCRIPT, env=env, cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("bot> ") == 3, out
    # Not a terminal: no growing reply, no escape sequences (STREAM_REPLIES=on regardless).
    assert "\033" not in out and "bot… " not in out, repr(out)
    assert "From now on: My name is Sarah. I love hiking." in out
    assert "My persona: My name is Sarah. I love hiking." in out
    assert "Conversation ended" in out
    assert "Unknown command /bogus" in out
    # Every use case of the command table runs here (bot.terminal.TERMINAL_COMMANDS), but not
    # /arena, whose pick needs Telegram's buttons.
    assert "following your Telegram settings" in out
    assert "Unknown command /arena" in out
    # feedback: /good then /bad (the vote changes), a rating before /done has nothing to rate
    assert out.index("Glad that one worked") < out.index("I'll try to do better")
    assert out.count("End a conversation with /done first") == 1
    assert "Usage: /rate N" in out
    assert out.count("Thanks for rating this conversation 5/5!") == 1
    assert "You already rated this conversation" in out
    assert "Traceback" not in proc.stderr

    with sqlite3.connect(db_file) as conn:
        sessions = conn.execute(
            "SELECT id, status, persona FROM sessions WHERE chat_id = 42 ORDER BY id"
        ).fetchall()
        assert [(s[1], s[2]) for s in sessions] == [
            ("done", "My name is Sarah. I love hiking."),
            ("active", "My name is Sarah. I love hiking."),
        ]
        first = conn.execute(
            "SELECT role, text FROM messages WHERE session_id = ? ORDER BY id", (sessions[0][0],)
        ).fetchall()
        assert [r[0] for r in first] == ["user", "bot", "user", "bot"]
        assert first[0][1] == "hello how are you"
        votes = conn.execute("SELECT user_id, value, source FROM votes").fetchall()
        assert votes == [(42, -1, "button")]
        ratings = conn.execute("SELECT session_id, value FROM ratings").fetchall()
        assert ratings == [(sessions[0][0], 5)]
        variants = conn.execute("SELECT DISTINCT variant FROM messages WHERE role = 'bot'")
        assert variants.fetchall() == [("default",)]
        undelivered = conn.execute(
            "SELECT count(*) FROM messages WHERE role = 'bot' AND delivered_at IS NULL"
        ).fetchone()[0]
        assert undelivered == 0
        assert conn.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()[0] == 0


def test_on_a_terminal_the_reply_grows_on_its_line(tmp_path: Path, tiny_model_file: str) -> None:
    """STREAM_REPLIES=on with a terminal for output: the reply grows on one line while it
    generates, then the stored one replaces it."""
    env = chat_env(tmp_path, tiny_model_file)
    controller, terminal = pty.openpty()
    proc = _start_chat(env, tmp_path, 43, subprocess.PIPE, terminal, tmp_path / "stderr.log")
    os.close(terminal)
    assert proc.stdin is not None
    proc.stdin.write(b"hello how are you\n")
    proc.stdin.close()
    out = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal's other end closed: the chat exited
            break
        if not chunk:
            break
        out += chunk
    os.close(controller)
    assert proc.wait(timeout=180) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
    text = out.decode()
    assert text.count("\033[Kbot… ") >= 1 and text.count("\033[Kbot> ") == 1, repr(text)


def _start_chat(
    env: dict[str, str], cwd: Path, chat_id: int, stdin: int, stdout: int, stderr_file: Path
) -> subprocess.Popen[bytes]:
    """`python -m bot chat --chat-id <chat_id>` on those stdin and stdout, stderr into the file."""
    argv = [sys.executable, "-m", "bot", "chat", "--chat-id", str(chat_id)]
    with stderr_file.open("wb") as stderr:
        return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd)


async def _output_until_the_prompt(
    tmp_path: Path, tiny_model_file: str, **extra: str
) -> tuple[str, str]:
    """`python -m bot chat` on a terminal (stdin and stdout), stderr in a file: what both had
    when the first `you> ` prompt appeared. Then /quit, and it exits 0."""
    env = chat_env(tmp_path, tiny_model_file, **extra)
    controller, terminal = pty.openpty()
    stderr_file = tmp_path / "stderr.log"
    proc = _start_chat(env, tmp_path, 44, terminal, terminal, stderr_file)
    os.close(terminal)
    out = bytearray()

    def read() -> bool:
        """Whatever the terminal has now; False at its end (the chat exited)."""
        while select.select([controller], [], [], 0)[0]:
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                return False
            if not chunk:
                return False
            out.extend(chunk)
        return proc.poll() is None

    try:
        await until(
            lambda: not read() or b"you> " in out, within_s=180, what="the chat's first prompt"
        )
        assert b"you> " in out, stderr_file.read_text()[-3000:]
        before = (out.decode(errors="replace"), stderr_file.read_text(errors="replace"))
        os.write(controller, b"/quit\n")
        await until(lambda: not read(), within_s=60, what="the chat exiting after /quit")
        assert proc.wait(timeout=60) == 0, stderr_file.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(controller)
    return before


INFO_LINE = re.compile(r"^\S+ \S+ INFO ", re.MULTILINE)  # `date time INFO    logger: ...`


async def test_terminal_chat_prints_no_info_lines_before_its_prompt(
    tmp_path: Path, tiny_model_file: str
) -> None:
    """Regression (issue 32.11): `make chat` printed 17 INFO lines before the prompt (Alembic's
    plugins, the model loading in its worker). The chat logs warnings and errors only."""
    out, err = await _output_until_the_prompt(tmp_path, tiny_model_file)
    assert out.startswith("Chat 44. Commands: "), repr(out)
    assert not INFO_LINE.search(out) and not INFO_LINE.search(err), err


async def test_an_explicit_log_level_brings_the_chat_s_info_lines_back(
    tmp_path: Path, tiny_model_file: str
) -> None:
    """LOG_LEVEL set (even to INFO, the service's default) wins over the chat's quiet default,
    in the model workers too."""
    _, err = await _output_until_the_prompt(tmp_path, tiny_model_file, LOG_LEVEL="INFO")
    assert INFO_LINE.search(err), err
    assert "model ready" in err  # the model worker's own line
