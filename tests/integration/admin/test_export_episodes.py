"""`admin export --format parlai|parlai-jsonl`: conversations as ParlAI training episodes, read
back with ParlAI's own teachers, on SQLite and PostgreSQL alike; what was deleted never appears."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from bot.admin.cli import admin
from bot.conversations.store import ConversationStore
from bot.db.conversations import ReplyFacts
from bot.db.models import Session, utcnow
from bot.service.retention import purge
from tests.integration.admin.test_admin import parse_admin

ROOT = Path(__file__).resolve().parents[3]
PERSONA = "I love cats. I live by the sea."
HEAD = "your persona: I love cats.\nyour persona: I live by the sea."


@dataclass(frozen=True)
class Seeded:
    """Ids of what `seed` stored."""

    s1: int  # chat 1, persona, 3 turns: 👍, none, 👎; rated 5; the tab/newline/pipe reply
    s2: int  # chat 2, no persona: an arena duel won by b, then a 👍 turn; rated 2
    s3: int  # chat 3: one turn, variant "candidate", 👍; unrated
    replies: dict[str, int]


async def seed(store: ConversationStore) -> Seeded:
    replies: dict[str, int] = {}
    s1 = (await store.set_persona(1, 1, PERSONA, notice="ok")).id
    for user, bot, name in (
        ("hi there", "hello! do you like cats?", "liked"),
        ("yes\nvery much", "me too | they\tpurr", "odd"),
        ("bye", "whatever", "disliked"),
    ):
        turn = await store.record_turn(s1, 1, user, bot, facts=ReplyFacts(variant="control"))
        replies[name] = turn.bot_message_id
    await store.vote(1, 1, replies["liked"], 1)
    await store.vote(1, 1, replies["disliked"], -1)
    await store.end_session(1, notice="ended")
    await store.rate(1, 1, s1, 5)

    s2 = (await store.active_session(2, 2)).id
    match = await store.request_arena(2, 2, notice="duel")
    await store.record_duel(
        s2, 2, match, "tell me a joke", (("control", "no."), ("candidate", "why did the cat?")),
        text="pick", markup=None,
    )  # fmt: skip
    decided = await store.decide_duel(2, match, "b")
    assert decided.bot_message_id is not None
    replies["arena"] = decided.bot_message_id
    turn = await store.record_turn(
        s2, 2, "ha, another?", "what do cats eat?", facts=ReplyFacts(variant="control")
    )
    replies["after_arena"] = turn.bot_message_id
    await store.vote(2, 2, replies["after_arena"], 1)
    # An unanswered trailing message teaches nothing and is not exported.
    await store.record_user_message(s2, 2, "hello?")
    await store.end_session(2, notice="ended")
    await store.rate(2, 2, s2, 2)

    s3 = (await store.active_session(3, 3)).id
    turn = await store.record_turn(
        s3, 3, "what is up", "not much, you?", facts=ReplyFacts(variant="candidate")
    )
    replies["candidate"] = turn.bot_message_id
    await store.vote(3, 3, replies["candidate"], 1)
    return Seeded(s1, s2, s3, replies)


async def export(db_url: str, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    target = io.StringIO()
    args = parse_admin("export", *argv)
    if args.output is None:
        status = await admin(db_url, args, target)
        return status, target.getvalue()
    status = await admin(db_url, args, out)
    return status, await asyncio.to_thread(Path(args.output).read_text, encoding="utf-8")


async def parlai_msgs(db_url: str, *argv: str) -> list[dict[str, Any]]:
    """`admin export --format parlai ...`, each line parsed by ParlAI's str_to_msg."""
    from parlai.utils.misc import str_to_msg

    status, out = await export(db_url, "--format", "parlai", *argv)
    assert status == 0
    return [dict(str_to_msg(line)) for line in out.splitlines()]


def read_with_fromfile_teacher(path: Path) -> list[list[dict[str, Any]]]:
    """Episodes as ParlAI's own `fromfile:parlaiformat` teacher reads them."""
    from parlai.core.params import ParlaiParser
    from parlai.core.teachers import create_task_agent_from_taskname

    opt = ParlaiParser(True, False).parse_args(
        ["--task", "fromfile:parlaiformat", "--fromfile-datapath", str(path),
         "--datatype", "train:ordered"]
    )  # fmt: skip
    teacher = create_task_agent_from_taskname(opt)[0]
    episodes: list[list[dict[str, Any]]] = [[]]
    for _ in range(teacher.num_examples()):
        msg = dict(teacher.act())
        episodes[-1].append(msg)
        if msg["episode_done"]:
            episodes.append([])
    assert teacher.epoch_done()
    return [e for e in episodes if e]


async def test_export_round_trips_through_parlais_fromfile_teacher(
    store: ConversationStore, db_url: str, tmp_path: Path
) -> None:
    s = await seed(store)
    path = tmp_path / "feedback.txt"
    status, _ = await export(db_url, "--format", "parlai", "-o", str(path))
    assert status == 0
    episodes = read_with_fromfile_teacher(path)
    turns = [[(m["text"], m["labels"]) for m in episode] for episode in episodes]
    assert turns == [
        [
            (HEAD + "\nhi there", ["hello! do you like cats?"]),
            ("yes\nvery much", ["me too | they\tpurr"]),  # escaped and back, by ParlAI's code
            ("bye", ["whatever"]),
        ],
        [
            ("tell me a joke", ["why did the cat?"]),
            ("ha, another?", ["what do cats eat?"]),
        ],
        [("what is up", ["not much, you?"])],
    ]
    first, second, third = episodes
    assert [m["episode_done"] for m in first] == [False, False, True]
    assert [(m["votes_up"], m["votes_down"]) for m in first] == [("1", "0"), ("0", "0"), ("0", "1")]
    assert {m["rating"] for m in first} == {"5"} and {m["rating"] for m in second} == {"2"}
    assert "rating" not in third[0]  # unrated
    assert {m["session_id"] for m in first} == {str(s.s1)}
    assert first[0]["message_id"] == str(s.replies["liked"])
    assert first[0]["variant"] == "control"
    assert second[0]["arena"] == "won" and second[0]["variant"] == "candidate"
    assert (second[0]["arena_lost_text"], second[0]["arena_lost_variant"]) == ("no.", "control")
    assert "arena" not in second[1]
    # No chat or user ids: a training set does not need them.
    assert not any("chat_id" in m or "user_id" in m for e in episodes for m in e)


async def test_filters_keep_the_context_of_the_replies_they_drop(
    store: ConversationStore, db_url: str
) -> None:
    await seed(store)
    status, out = await export(db_url, "--format", "parlai", "--votes", "up")
    assert status == 0
    from parlai.utils.misc import str_to_msg

    msgs = [str_to_msg(line) for line in out.splitlines()]
    # The liked reply of chat 1 only; chat 2's 👍 reply carries the duel before it as context.
    assert [(m["text"], m["labels"][0]) for m in msgs] == [
        (HEAD + "\nhi there", "hello! do you like cats?"),
        ("tell me a joke\nwhy did the cat?\nha, another?", "what do cats eat?"),
        ("what is up", "not much, you?"),
    ]
    assert [m["episode_done"] for m in msgs] == [True, True, True]

    down = await parlai_msgs(db_url, "--votes", "down")
    assert [m["labels"][0] for m in down] == ["whatever"]
    assert down[0]["text"] == (
        HEAD + "\nhi there\nhello! do you like cats?\nyes\nvery much\nme too | they\tpurr\nbye"
    )
    any_vote = (await export(db_url, "--format", "parlai", "--votes", "any"))[1]
    assert len(any_vote.splitlines()) == 4

    rated = (await export(db_url, "--format", "parlai", "--min-rating", "4"))[1].splitlines()
    assert [str_to_msg(line)["rating"] for line in rated] == ["5", "5", "5"]

    cand = await parlai_msgs(db_url, "--variant", "candidate")
    assert [m["labels"][0] for m in cand] == ["why did the cat?", "not much, you?"]

    one_chat = (await export(db_url, "3", "--format", "parlai"))[1].splitlines()
    assert [str_to_msg(line)["labels"][0] for line in one_chat] == ["not much, you?"]


async def test_since_picks_conversations_by_their_last_activity(
    store: ConversationStore, db_url: str
) -> None:
    s = await seed(store)
    async with store.sessionmaker.begin() as db:
        old = utcnow() - timedelta(days=10)
        await db.execute(update(Session).where(Session.id == s.s1).values(updated_at=old))
    out = (await export(db_url, "--format", "parlai", "--since", "3d"))[1]
    from parlai.utils.misc import str_to_msg

    assert {str_to_msg(line)["session_id"] for line in out.splitlines()} == {str(s.s2), str(s.s3)}
    since = (utcnow() - timedelta(days=20)).date().isoformat()
    everything = (await export(db_url, "--format", "parlai", "--since", since))[1]
    assert len(everything.splitlines()) == 6


async def test_deleted_chats_never_appear(store: ConversationStore, db_url: str) -> None:
    """/forget and RETENTION_DAYS delete what an export could contain (invariant 16)."""
    s = await seed(store)
    await store.forget_chat(1)
    async with store.sessionmaker.begin() as db:
        old = utcnow() - timedelta(days=40)
        await db.execute(update(Session).where(Session.id == s.s2).values(updated_at=old))
    assert (await purge(store.sessionmaker, 30)).conversations == 1
    for fmt in ("parlai", "parlai-jsonl", "jsonl"):
        out = (await export(db_url, "--format", fmt))[1]
        for gone in ("hi there", "cats?", "whatever", "tell me a joke", "why did the cat"):
            assert gone not in out, (fmt, gone)
        assert "not much, you?" in out


async def test_conversations_jsonl_is_read_by_parlais_jsonfile_teacher(
    store: ConversationStore, db_url: str, tmp_path: Path
) -> None:
    await seed(store)
    path = tmp_path / "feedback.jsonl"
    assert (await export(db_url, "--format", "parlai-jsonl", "-o", str(path)))[0] == 0
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["persona"] for r in records] == [PERSONA, "", ""]
    bot_turns = records[0]["dialog"][0][1::2]
    assert [(t["id"], t["votes_up"], t["votes_down"]) for t in bot_turns] == [
        ("bot", 1, 0), ("bot", 0, 0), ("bot", 0, 1),
    ]  # fmt: skip

    from parlai.core.params import ParlaiParser
    from parlai.core.teachers import create_task_agent_from_taskname

    opt = ParlaiParser(True, False).parse_args(
        ["--task", "jsonfile", "--jsonfile-datapath", str(path), "--datatype", "train:ordered"]
    )
    teacher = create_task_agent_from_taskname(opt)[0]
    seen = [dict(teacher.act()) for _ in range(teacher.num_examples())]
    assert [(m["text"], m["labels"]) for m in seen][:2] == [
        (HEAD + "\nhi there", ["hello! do you like cats?"]),
        ("yes\nvery much", ["me too | they\tpurr"]),
    ]
    assert len(seen) == 6


async def test_a_persona_change_starts_an_episode_with_the_conversation_so_far(
    store: ConversationStore, db_url: str
) -> None:
    sid = (await store.active_session(9, 9)).id
    first = await store.record_turn(sid, 9, "hello", "hi", facts=ReplyFacts(variant="control"))
    await store.set_persona(9, 9, PERSONA, notice="ok")  # from the next reply on
    await store.record_turn(sid, 9, "how are you", "fine", facts=ReplyFacts(variant="control"))
    liked = await store.record_turn(sid, 9, "bye", "ciao", facts=ReplyFacts(variant="control"))
    await store.vote(9, 9, liked.bot_message_id, 1)
    await store.vote(9, 9, first.bot_message_id, 1)
    await store.set_persona(9, 9, "", notice="ok")  # after the last reply: read by none

    msgs = await parlai_msgs(db_url, "9")
    assert [(m["text"], m["labels"][0], m["episode_done"]) for m in msgs] == [
        ("hello", "hi", True),
        (HEAD + "\nhello\nhi\nhow are you", "fine", False),
        ("bye", "ciao", True),
    ]
    # A reply the filter drops folds into the next kept one, whichever episode that opens.
    msgs = await parlai_msgs(db_url, "9", "--votes", "up")
    assert [(m["text"], m["labels"][0]) for m in msgs] == [
        ("hello", "hi"),
        (HEAD + "\nhello\nhi\nhow are you\nfine\nbye", "ciao"),
    ]
    out = (await export(db_url, "9", "--format", "parlai-jsonl"))[1]
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["session_id"], r["persona"]) for r in records] == [(sid, ""), (sid, PERSONA)]


async def test_filters_need_an_episode_format(store: ConversationStore, db_url: str) -> None:
    from bot.admin.common import UsageError

    with pytest.raises(UsageError, match="--votes filter"):
        await export(db_url, "--votes", "up")


def test_bad_export_options_exit_with_status_2(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "DATA_DIR": str(tmp_path)}
    for argv, message in (
        (["--min-rating", "7"], "ratings go from 1 to 5"),
        (["--format", "parlai", "--since", "last tuesday"], "expected a date"),
        (["--variant", "control"], "use them with --format parlai"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "bot", "admin", "export", *argv],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert proc.returncode == 2, (argv, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr
