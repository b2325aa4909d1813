"""A turn's outcomes, as the use cases decide them: what bot_turns_total counts.

A use case (bot/conversations/usecases.py) records its decision on the Turn
(bot/conversations/turn.py); the inbox worker's runner (bot/tg/runner.UpdateRunner) counts it
once per update, after the update is closed, so a retried attempt never counts twice and an
update counts exactly once.
"""

from __future__ import annotations

# bot_turns_total's outcomes (docs/metrics.md).
REPLIED = "replied"  # a model reply stored and queued (a text, or an edit's new reply)
ARENA = "arena"  # two variants' replies to one message (/arena)
NO_REPLY = "no_reply"  # generation failed; the message is kept, the chat told so
FLOODED = "flooded"  # over the chat's flood limit: not answered by the model
COMMAND = "command"  # a command answered
FEEDBACK = "feedback"  # a 👍/👎 press or reaction, a rating, an arena pick
NOTICE = "notice"  # any other update answered with a notice (a sticker, an old edit, ...)
IGNORED = "ignored"  # closed without an answer (not for the bot, a service message)
FAILED = "failed"  # its handler failed every attempt; the chat got the apology
OUTCOMES = (REPLIED, ARENA, NO_REPLY, FLOODED, COMMAND, FEEDBACK, NOTICE, IGNORED, FAILED)
