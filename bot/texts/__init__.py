"""Every sentence a user sees (Telegram and the terminal alike), in the chat's language.

English is the source: the msgids below are the English texts. Russian, Spanish and German
come from gettext catalogs (bot/texts/locale/<lang>/LC_MESSAGES/messages.po), read with Babel
when first needed (bot/texts/catalogs.py). A message missing from a catalog falls back to
English. The model's replies are not here and are never translated (docs/guarantees.md,
invariant 17).

Placeholders are named (`{persona}`) and filled with str.format, so a translation may put them
anywhere; the catalog test checks that every translation keeps exactly the English ones.
Plain text only: replies are sent without parse_mode, so nothing here needs escaping.
"""

from __future__ import annotations

import gettext
import re
from functools import cache

from babel import Locale

from bot.commands import COMMANDS, EXAMPLE_PERSONA, HELP_LAST, MENU

__all__ = [
    "EMPTY_REPLY",
    "ENGLISH",
    "LANGUAGES",
    "SOURCE_LANGUAGE",
    "VOTE_DOWN",
    "VOTE_UP",
    "Texts",
    "choose",
    "excerpt",
    "for_language",
    "native_name",
    "normalize",
]

SOURCE_LANGUAGE = "en"
# The languages with a shipped catalog (English first: the source and the fallback).
LANGUAGES = ("en", "ru", "es", "de")

# Symbols, the same in every language: not sentences, so not in the catalogs.
VOTE_UP = "👍"
VOTE_DOWN = "👎"
# Telegram refuses empty texts; a blank reply still deserves an answer.
EMPTY_REPLY = "…"

# The most of a user's argument a notice echoes ("There is no model called ..."): enough to
# recognise a typo, never enough to make the notice longer than one message.
EXCERPT_CHARS = 32


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """What a notice may echo of a user's argument: printable characters only (no control,
    zero-width or direction marks), each run of whitespace one space, at most `limit`
    characters, then "…"."""
    kept = " ".join("".join(c for c in text if c.isprintable() or c.isspace()).split())
    return kept if len(kept) <= limit else kept[:limit] + "…"


_TAG = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8})*")


def primary(code: str | None) -> str | None:
    """The primary language subtag of an IETF tag, lower case ("de-AT" -> "de"); None for
    anything that is not a language tag."""
    if not code or not _TAG.fullmatch(code.strip()):
        return None
    return re.split(r"[-_]", code.strip())[0].lower()


def normalize(code: str | None) -> str | None:
    """The shipped language an IETF tag means ("de-AT" -> "de", "pt-BR" -> None)."""
    language = primary(code)
    return language if language in LANGUAGES else None


def choose(stored: str | None, sender: str | None) -> str:
    """The language of an update: the chat's own setting (/lang), else the sender's Telegram
    language, else English."""
    return normalize(stored) or normalize(sender) or SOURCE_LANGUAGE


@cache
def native_name(code: str) -> str:
    """A language's name in itself ("Deutsch", "Русский"), as the /lang choices show it."""
    name = Locale.parse(code).get_display_name(code) or code
    return name[:1].upper() + name[1:]


def for_language(code: str) -> Texts:
    """The texts of a shipped language (English for any other code)."""
    return _texts(normalize(code) or SOURCE_LANGUAGE)


@cache
def _texts(language: str) -> Texts:
    # Each catalog is read once per process, when a chat first needs it.
    if language == SOURCE_LANGUAGE:
        return Texts(language, gettext.NullTranslations())
    from bot.texts.catalogs import load

    return Texts(language, load(language))


class Texts:
    """Every sentence a user sees, in one language."""

    def __init__(self, language: str, translations: gettext.NullTranslations) -> None:
        self.language = language
        self._translations = translations
        self._conversation_texts()
        self._feedback_texts()

    def _conversation_texts(self) -> None:
        """The sentences of the conversation, its commands and Telegram's other updates."""
        _ = self._
        self.GREETING = _("Hi!") + " "

        # --- the persona -----------------------------------------------------------------
        self.PERSONA_EMPTY = _(
            "That persona has no text I can use. Your current persona is unchanged; "
            "send /persona followed by a few words about me."
        )
        self.PERSONA_CLEARED = _("Persona cleared. I'm just me now.")
        self.PERSONA_REFUSED = _(
            "I can't take on that persona: it reads as offensive. Your current persona is "
            "unchanged; try describing me in other words."
        )
        self.NO_PRESETS = _(
            "There are no ready-made personas here; describe one with /persona <text>."
        )

        # --- the conversation ------------------------------------------------------------
        self.ENDED = _("Conversation ended. Say something to start a new one; my persona stays.")
        self.FORGOTTEN = _("Done: I deleted everything I had stored about this chat.")
        self.SAY_SOMETHING = _("Say something and I'll answer.")
        self.NO_REPLY = _("Sorry, I couldn't come up with a reply just now. Please try again.")
        # What the safety gate sends when every candidate reply was offensive. It stands in
        # for a model reply (the model reads it back), so it is taken in the model's language.
        self.DEFLECTION = _("Let's talk about something else. What's on your mind?")
        self.APOLOGY = _(
            "Sorry, something went wrong on my side with that message. Please send it again."
        )

        # --- Telegram's other updates ----------------------------------------------------
        self.NOT_TEXT = _("I only understand text messages. Write to me in words and I'll answer.")
        self.EDITED = _(
            "I saw that you edited a message. Only an edit of your latest message gets a new "
            "answer (in place of my reply); edits of older ones don't change our conversation. "
            "Send it again as a new message if you want me to answer it."
        )
        self.UNKNOWN_COMMAND = _("I don't know that command. /help lists what I can do.")

        # --- access (ALLOWED_USERS / ALLOWED_CHATS, `admin access`) ------------------------
        self.NOT_ALLOWED = _(
            "Sorry, this bot only talks to the people its operator has allowed, and you are "
            "not on the list. If you think you should be, ask the bot's operator. I won't "
            "reply to further messages for now."
        )

        # --- /context --------------------------------------------------------------------
        self.CONTEXT_EMPTY = _(
            "We haven't talked yet: I read only my persona, if I have one (/persona)."
        )
        self.CONTEXT_UNAVAILABLE = _(
            "I can't show what I read right now. Please try again in a moment."
        )

    def _feedback_texts(self) -> None:
        """The sentences of votes, ratings and the arena, and the bot's profile."""
        _ = self._
        # --- feedback and variants -------------------------------------------------------
        self.VOTED_UP = _("Thanks! Glad that one worked.")
        self.VOTED_DOWN = _("Thanks, noted. I'll try to do better.")
        self.VOTE_STALE = _(
            "That button no longer works (the message or the conversation is gone)."
        )
        self.RATE_PROMPT = _("How was this conversation? Tap 1 (bad) to 5 (great).")
        self.RATING_STALE = _("That rating button no longer works.")
        self.RATING_TWICE = _("You already rated this conversation; thank you!")
        self.NOTHING_TO_VOTE_ON = _("There is no reply of mine to rate yet.")
        self.NOTHING_TO_RATE = _(
            "End a conversation with /done first, then rate it with /rate 1-5."
        )
        self.RATE_USAGE = _("Usage: /rate N, with N from 1 (bad) to 5 (great).")
        self.TERMINAL_RATE_HINT = _(
            "How was it? /rate 1 (bad) to 5 (great). /good or /bad rate my last reply."
        )
        self.ARENA_READY = _(
            "Arena: your next message gets two replies from two different models, A and B. "
            "Tap the better one (or Both bad); the one you choose stays in our conversation."
        )
        self.ARENA_BETTER_A = _("A is better")
        self.ARENA_BETTER_B = _("B is better")
        self.ARENA_BOTH_BAD = _("Both bad")
        self.ARENA_TWICE = _("You already chose for these two replies.")
        self.ARENA_STALE = _("Those two replies are gone (the conversation was deleted).")
        self.ARENA_TIE = _("Thanks! Neither reply stays; say it again in other words if you like.")

        # --- Telegram's profile of the bot (setMyDescription, setMyShortDescription) -----
        self.DESCRIPTION = _(
            "A chat bot with a persona of your choosing: give me one with /persona, then just "
            "write to me. /privacy says what I store; /forget deletes it."
        )
        self.SHORT_DESCRIPTION = _("A chat bot with a persona of your choosing.")

    def __repr__(self) -> str:
        return f"Texts({self.language!r})"

    def _(self, message: str) -> str:
        return self._translations.gettext(message)

    def _n(self, singular: str, plural: str, n: int) -> str:
        return self._translations.ngettext(singular, plural, n)

    def translate(self, message: str) -> str:
        """A message marked for the catalogs elsewhere (the command table's N_)."""
        return self._(message)

    # --- commands --------------------------------------------------------------------------

    def command_menu(self) -> list[tuple[str, str]]:
        """The command menu (setMyCommands): (name, description) in the table's order."""
        return [(c.name, self.translate(c.menu)) for c in MENU if c.menu is not None]

    def help(self, model_language: str) -> str:
        """/help: what the commands do, and that the replies are the model's, in
        `model_language` (an IETF tag: BOT_MODEL_LANGUAGE)."""
        ordered = sorted(COMMANDS, key=lambda c: c.name == HELP_LAST)  # stable: /help last
        # An example persona is for the model to read: in its language, not the chat's.
        model_texts = for_language(model_language)
        model_name = self.language_name(model_language)
        lines = [
            f"/{c.name} {model_texts.translate(u.args) if u.example else u.args}".rstrip()
            + " - "
            + self.translate(u.text).format(model_language=model_name)
            for c in ordered
            for u in c.usage
        ]
        intro = self._("I'm a chat bot with a persona of your choosing.") + "\n\n"
        intro += self._("Just write to me to chat.")
        model = self._(
            "My replies come from a language model and are in {model_language}; "
            "they are not translated."
        ).format(model_language=model_name)
        return intro + "\n" + "\n".join(lines) + "\n\n" + model

    def language_name(self, code: str) -> str:
        """A language's name in this language ("English" in German is "Englisch")."""
        language = primary(code)
        names = Locale.parse(self.language).languages
        return names.get(language, code) if language else code

    # --- /lang -----------------------------------------------------------------------------

    def language_choices(self) -> str:
        """The shipped languages, each in its own name: "en English, ru Русский, ..."."""
        return ", ".join(f"{code} {native_name(code)}" for code in LANGUAGES)

    def language_shown(self, chosen: bool) -> str:
        """/lang without an argument: the language in use, why, and the choices."""
        name = self.language_name(self.language)
        if chosen:
            current = self._("I speak {language} in this chat, as chosen with /lang.")
        else:
            current = self._("I speak {language} here, following your Telegram settings.")
        choices = self._(
            "Languages: {choices}.\n/lang CODE chooses one for this chat; /lang auto follows "
            "each sender's Telegram language."
        )
        return (
            current.format(language=name) + "\n\n" + choices.format(choices=self.language_choices())
        )

    def language_set(self) -> str:
        """The confirmation of /lang CODE (in the language just chosen)."""
        return self._("From now on I speak {language} in this chat.").format(
            language=self.language_name(self.language)
        )

    def language_auto(self) -> str:
        """The confirmation of /lang auto (in the language now in effect)."""
        return self._(
            "I follow each sender's Telegram language again; for you that is {language}."
        ).format(language=self.language_name(self.language))

    def language_unknown(self, code: str) -> str:
        """/lang with a language there is no catalog for (echoed as an excerpt)."""
        return self._(
            "I don't speak {code!r}. Choose one of: {choices}; or /lang auto to follow your "
            "Telegram settings."
        ).format(code=excerpt(code), choices=self.language_choices())

    # --- the persona -------------------------------------------------------------------------

    def no_persona(self, model_language: str) -> str:
        """/persona when there is none: how to give one, with the example in the model's
        language (`model_language`: BOT_MODEL_LANGUAGE), since the model reads it."""
        return self._(
            "I have no persona yet. Give me one in {model_language}, e.g. /persona {example}"
        ).format(
            model_language=self.language_name(model_language),
            example=for_language(model_language).translate(EXAMPLE_PERSONA),
        )

    def persona_shown(self, persona: str) -> str:
        """/persona when there is one."""
        return self._(
            "My persona: {persona}\n\nChange it with /persona <text>, remove it with "
            "/persona clear."
        ).format(persona=persona)

    def persona_set(self, persona: str) -> str:
        """The confirmation of /persona <text>."""
        return self._("Got it. From now on: {persona}").format(persona=persona)

    def presets_list(self, personas: dict[str, str]) -> str:
        """/persona list."""
        lines = "\n".join(f"{name}: {text}" for name, text in personas.items())
        return self._(
            "Ready-made personas:\n\n{personas}\n\nTake one with /persona use NAME."
        ).format(personas=lines)

    def preset_unknown(self, name: str, names: list[str]) -> str:
        """/persona use NAME (or a deep link) with a name that is not a preset (echoed as an
        excerpt)."""
        if not names:
            return self.NO_PRESETS
        return self._("There is no persona called {name!r}. Choose one of: {names}.").format(
            name=excerpt(name), names=", ".join(names)
        )

    def persona_too_long(self, length: int, limit: int) -> str:
        """A persona over PERSONA_MAX_CHARS."""
        return self._n(
            "That persona is {length} character long; the limit is {limit}. "
            "Please send a shorter one. Your current persona is unchanged.",
            "That persona is {length} characters long; the limit is {limit}. "
            "Please send a shorter one. Your current persona is unchanged.",
            length,
        ).format(length=length, limit=limit)

    # --- the conversation --------------------------------------------------------------------

    def message_too_long(self, length: int, limit: int) -> str:
        """A message over MESSAGE_MAX_CHARS."""
        return self._n(
            "Your message is {length} character long; I read at most {limit}. "
            "Please send a shorter one.",
            "Your message is {length} characters long; I read at most {limit}. "
            "Please send a shorter one.",
            length,
        ).format(length=length, limit=limit)

    def flooding(self, max_messages: int, window_s: float) -> str:
        """The one notice a flooding chat gets per window."""
        return self._n(
            "You're writing faster than I can answer: I reply to at most {max_messages} "
            "message every {window_s:g} seconds. I've kept what you wrote, but commands "
            "sent meanwhile were skipped; give me a moment, then carry on (and send those "
            "commands again). /forget always works.",
            "You're writing faster than I can answer: I reply to at most {max_messages} "
            "messages every {window_s:g} seconds. I've kept what you wrote, but commands "
            "sent meanwhile were skipped; give me a moment, then carry on (and send those "
            "commands again). /forget always works.",
            max_messages,
        ).format(max_messages=max_messages, window_s=window_s)

    def quota_reached(self, span: str, limit: int, when: str) -> str:
        """The one notice a user over a quota gets per window: `span` "day" or "minute",
        `when` the UTC time they can write again. Their message is kept for the next reply."""
        if span == "day":
            text = self._n(
                "You've reached today's limit of {limit} reply. I've kept your message; you "
                "can write again after {when} (UTC).",
                "You've reached today's limit of {limit} replies. I've kept your message; you "
                "can write again after {when} (UTC).",
                limit,
            )
        else:
            text = self._n(
                "You've reached the limit of {limit} reply per minute. I've kept your message; "
                "you can write again after {when} (UTC).",
                "You've reached the limit of {limit} replies per minute. I've kept your "
                "message; you can write again after {when} (UTC).",
                limit,
            )
        return text.format(limit=limit, when=when)

    def pressing_too_fast(self, max_presses: int, window_s: float) -> str:
        """The answer (a toast, at most 200 characters) to the first button press over the
        limit."""
        return self._n(
            "Too many presses: I take at most {max_presses} every {window_s:g} seconds. "
            "That one didn't count; press it again in a moment.",
            "Too many presses: I take at most {max_presses} every {window_s:g} seconds. "
            "That one didn't count; press it again in a moment.",
            max_presses,
        ).format(max_presses=max_presses, window_s=window_s)

    # --- /context ------------------------------------------------------------------------

    def context_view(self, persona: list[str], turns: list[tuple[str, str]], dropped: int) -> str:
        """/context: the persona lines and the turns the model reads now."""
        you, me = self._("you"), self._("me")
        lines = [self._("What I read before my next reply:"), ""]
        lines += persona or [self._("(no persona)")]
        lines.append("")
        lines += [f"{you if role == 'user' else me}: {text}" for role, text in turns]
        if dropped:
            older = self._n(
                "({count} older message no longer fits; I don't see it.)",
                "({count} older messages no longer fit; I don't see them.)",
                dropped,
            )
            lines += ["", older.format(count=dropped)]
        return "\n".join(lines)

    # --- privacy -------------------------------------------------------------------------

    def privacy(self, retention_days: int | None) -> str:
        """/privacy (an operator's PRIVACY_FILE replaces it)."""
        if retention_days:
            kept = self._n(
                "Conversations are deleted automatically {days} day after their last message.",
                "Conversations are deleted automatically {days} days after their last message.",
                retention_days,
            ).format(days=retention_days)
        else:
            kept = self._("They are kept until you delete them.")
        return self._(
            "What I store: the messages of this chat and my replies, the persona you gave me, "
            "your Telegram user and chat ids, your 👍/👎 votes and ratings, the language you "
            "chose with /lang, and which model version answers you. {kept}\n\n"
            "Who can read it: the people who run this bot (its administrators), to keep it "
            "working and to improve the replies: your conversations and votes may be used to "
            "train new versions of the model. It is not sold or shared.\n\n"
            "To delete everything I have stored about this chat, send /forget. It takes effect "
            "at once and cannot be undone, and nothing deleted is used for training afterwards."
        ).format(kept=kept)

    # --- feedback and variants -----------------------------------------------------------

    def arena_duel(self, text_a: str, text_b: str) -> str:
        """The two replies of a duel, in one message."""
        return self._("Which reply is better?\n\nA: {text_a}\n\nB: {text_b}").format(
            text_a=text_a, text_b=text_b
        )

    def arena_chosen(self, label: str) -> str:
        """The answer to a pick of A or B."""
        return self._("Thanks! Reply {label} is now part of our conversation.").format(label=label)

    def rated(self, value: int) -> str:
        """The answer to a rating."""
        return self._("Thanks for rating this conversation {value}/5!").format(value=value)

    def variants_list(self, names: list[str], current: str | None) -> str:
        """/model without a name, where the operator allows choosing."""
        lines = "\n".join(f"{'• ' if n == current else '  '}{n}" for n in names)
        return self._("Models you can talk to:\n{models}\n\nChoose one with /model NAME.").format(
            models=lines
        )

    def variant_chosen(self, name: str) -> str:
        """The confirmation of /model NAME."""
        return self._("From your next message on, you are talking to {name}.").format(name=name)

    def variant_unknown(self, name: str, names: list[str]) -> str:
        """/model with a name that is not served (echoed as an excerpt)."""
        return self._("There is no model called {name!r}. Choose one of: {names}.").format(
            name=excerpt(name), names=", ".join(names)
        )

    def not_enabled(self, command: str) -> str:
        """A command that the operator has not turned on here (/model, /arena): the same
        refusal for each, not the unknown-command answer."""
        return self._("/{command} is not enabled here. /help lists what I can do.").format(
            command=command
        )

    def unknown_terminal_command(self, command: str) -> str:
        """An unknown /command typed in `python -m bot chat`."""
        return self._("Unknown command /{command}. Try /help.").format(command=excerpt(command))


ENGLISH = for_language(SOURCE_LANGUAGE)
