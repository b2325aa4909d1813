"""Every sentence a user sees, in one place (Telegram and the terminal alike).

Plain text only: replies are sent without parse_mode, so nothing here needs escaping.
"""

from __future__ import annotations

HELP = (
    "I'm a chat bot with a persona of your choosing.\n\n"
    "Just write to me to chat.\n"
    "/persona - show my current persona\n"
    "/persona My name is Sarah. I love hiking. - set who I am (one or more sentences)\n"
    "/persona clear - remove the persona\n"
    "/done - end this conversation and start afresh (the persona stays)\n"
    "/forget - delete everything stored about this chat\n"
    "/context - what I read before my next reply\n"
    "/privacy - what I store and how to delete it\n"
    "/help - this message"
)
GREETING = "Hi! "

# The command menu Telegram shows (setMyCommands): name -> description.
COMMAND_MENU = {
    "start": "Say hello and learn how to use me",
    "help": "How to use me",
    "persona": "Show my persona; /persona <text> sets it, /persona clear clears it",
    "done": "End this conversation (my persona stays)",
    "forget": "Delete everything stored about this chat",
    "context": "What I read before my next reply",
    "privacy": "What I store, for how long, and how to delete it",
}

# --- the persona -----------------------------------------------------------------------------


def persona_shown(persona: str) -> str:
    """/persona when there is one."""
    return (
        f"My persona: {persona}\n\nChange it with /persona <text>, remove it with /persona clear."
    )


NO_PERSONA = "I have no persona yet. Give me one, e.g. /persona My name is Sarah. I love hiking."
PERSONA_EMPTY = (
    "That persona has no text I can use. Your current persona is unchanged; "
    "send /persona followed by a few words about me."
)
PERSONA_CLEARED = "Persona cleared. I'm just me now."


PERSONA_REFUSED = (
    "I can't take on that persona: it reads as offensive. Your current persona is unchanged; "
    "try describing me in other words."
)


def persona_set(persona: str) -> str:
    """The confirmation of /persona <text>."""
    return f"Got it. From now on: {persona}"


NO_PRESETS = "There are no ready-made personas here; describe one with /persona <text>."


def presets_list(personas: dict[str, str]) -> str:
    """/persona list."""
    lines = [f"{name}: {text}" for name, text in personas.items()]
    return "Ready-made personas:\n\n" + "\n".join(lines) + "\n\nTake one with /persona use NAME."


def preset_unknown(name: str, names: list[str]) -> str:
    """/persona use NAME (or a deep link) with a name that is not a preset."""
    if not names:
        return NO_PRESETS
    return f"There is no persona called {name!r}. Choose one of: {', '.join(names)}."


def persona_too_long(length: int, limit: int) -> str:
    """A persona over PERSONA_MAX_CHARS."""
    return (
        f"That persona is {length} characters long; the limit is {limit}. "
        "Please send a shorter one. Your current persona is unchanged."
    )


# --- the conversation ------------------------------------------------------------------------

ENDED = "Conversation ended. Say something to start a new one; my persona stays."
FORGOTTEN = "Done: I deleted everything I had stored about this chat."
SAY_SOMETHING = "Say something and I'll answer."
NO_REPLY = "Sorry, I couldn't come up with a reply just now. Please try again."
# What the safety gate sends when every candidate reply was offensive.
DEFLECTION = "Let's talk about something else. What's on your mind?"
APOLOGY = "Sorry, something went wrong on my side with that message. Please send it again."


def message_too_long(length: int, limit: int) -> str:
    """A message over MESSAGE_MAX_CHARS."""
    return (
        f"Your message is {length} characters long; I read at most {limit}. "
        "Please send a shorter one."
    )


def flooding(max_messages: int, window_s: float) -> str:
    """The one notice a flooding chat gets per window."""
    return (
        f"You're writing faster than I can answer: I reply to at most {max_messages} "
        f"messages every {window_s:g} seconds. I've kept what you wrote, but commands "
        "sent meanwhile were skipped; give me a moment, then carry on (and send those "
        "commands again). /forget always works."
    )


def pressing_too_fast(max_presses: int, window_s: float) -> str:
    """The answer (a toast, at most 200 characters) to the first button press over the limit."""
    return (
        f"Too many presses: I take at most {max_presses} every {window_s:g} seconds. "
        "That one didn't count; press it again in a moment."
    )


# --- Telegram's other updates ----------------------------------------------------------------

NOT_TEXT = "I only understand text messages. Write to me in words and I'll answer."
EDITED = (
    "I saw that you edited a message. Only an edit of your latest message gets a new answer "
    "(in place of my reply); edits of older ones don't change our conversation. Send it again "
    "as a new message if you want me to answer it."
)
UNKNOWN_COMMAND = "I don't know that command. /help lists what I can do."
# Telegram refuses empty texts; a blank reply still deserves an answer.
EMPTY_REPLY = "…"


# --- /context --------------------------------------------------------------------------------

CONTEXT_EMPTY = "We haven't talked yet: I read only my persona, if I have one (/persona)."
CONTEXT_UNAVAILABLE = "I can't show what I read right now. Please try again in a moment."


def context_view(persona: list[str], turns: list[tuple[str, str]], dropped: int) -> str:
    """/context: the persona lines and the turns the model reads now."""
    lines = ["What I read before my next reply:", ""]
    lines += persona or ["(no persona)"]
    lines.append("")
    lines += [f"{'you' if role == 'user' else 'me'}: {text}" for role, text in turns]
    if dropped:
        lines += ["", f"({dropped} older messages no longer fit; I don't see them.)"]
    return "\n".join(lines)


# --- privacy ---------------------------------------------------------------------------------


def privacy(retention_days: int | None) -> str:
    """/privacy (an operator's PRIVACY_FILE replaces it)."""
    kept = (
        f"Conversations are deleted automatically {retention_days} days after their last message."
        if retention_days
        else "They are kept until you delete them."
    )
    return (
        "What I store: the messages of this chat and my replies, the persona you gave me, "
        "your Telegram user and chat ids, your 👍/👎 votes and ratings, and which model "
        f"version answers you. {kept}\n\n"
        "Who can read it: the people who run this bot (its administrators), to keep it working "
        "and to improve the replies: your conversations and votes may be used to train new "
        "versions of the model. It is not sold or shared.\n\n"
        "To delete everything I have stored about this chat, send /forget. It takes effect at "
        "once and cannot be undone, and nothing deleted is used for training afterwards."
    )


# --- feedback and variants -------------------------------------------------------------------

VOTE_UP = "👍"
VOTE_DOWN = "👎"
VOTED_UP = "Thanks! Glad that one worked."
VOTED_DOWN = "Thanks, noted. I'll try to do better."
VOTE_STALE = "That button no longer works (the message or the conversation is gone)."
RATE_PROMPT = "How was this conversation? Tap 1 (bad) to 5 (great)."
RATING_STALE = "That rating button no longer works."
RATING_TWICE = "You already rated this conversation; thank you!"
NOTHING_TO_VOTE_ON = "There is no reply of mine to rate yet."
NOTHING_TO_RATE = "End a conversation with /done first, then rate it with /rate 1-5."
RATE_USAGE = "Usage: /rate N, with N from 1 (bad) to 5 (great)."
TERMINAL_RATE_HINT = "How was it? /rate 1 (bad) to 5 (great). /good or /bad rate my last reply."


ARENA_READY = (
    "Arena: your next message gets two replies from two different models, A and B. "
    "Tap the better one (or Both bad); the one you choose stays in our conversation."
)
ARENA_OFF = "Arena mode is not available here."
ARENA_BETTER_A = "A is better"
ARENA_BETTER_B = "B is better"
ARENA_BOTH_BAD = "Both bad"
ARENA_TWICE = "You already chose for these two replies."
ARENA_STALE = "Those two replies are gone (the conversation was deleted)."
ARENA_TIE = "Thanks! Neither reply stays; say it again in other words if you like."


def arena_duel(text_a: str, text_b: str) -> str:
    """The two replies of a duel, in one message."""
    return f"Which reply is better?\n\nA: {text_a}\n\nB: {text_b}"


def arena_chosen(label: str) -> str:
    """The answer to a pick of A or B."""
    return f"Thanks! Reply {label} is now part of our conversation."


def rated(value: int) -> str:
    """The answer to a rating."""
    return f"Thanks for rating this conversation {value}/5!"


def variants_list(names: list[str], current: str | None) -> str:
    """/model without a name, where the operator allows choosing."""
    lines = [f"{'• ' if n == current else '  '}{n}" for n in names]
    return "Models you can talk to:\n" + "\n".join(lines) + "\n\nChoose one with /model NAME."


def variant_chosen(name: str) -> str:
    """The confirmation of /model NAME."""
    return f"From your next message on, you are talking to {name}."


def variant_unknown(name: str, names: list[str]) -> str:
    """/model with a name that is not served."""
    return f"There is no model called {name!r}. Choose one of: {', '.join(names)}."


def unknown_terminal_command(command: str) -> str:
    """An unknown /command typed in `python -m bot chat`."""
    return f"Unknown command /{command}. Try /help."
