"""Wording a native speaker would correct, checked where a machine can: the example persona is
in the model's language whatever the chat reads."""

from __future__ import annotations

import pytest

from bot import texts
from bot.texts import catalogs

EXAMPLE = "My name is Sarah. I love hiking."


def msgstrs(language: str) -> list[str]:
    """Every translation of a catalog, each plural form on its own."""
    found = []
    for message in catalogs.read(catalogs.po_path(language), language):
        if message.id:
            strings = message.string if isinstance(message.string, tuple) else (message.string,)
            found += strings
    return found


def example_line(language: str) -> str:
    """The /help line that shows how to set a persona."""
    lines = texts.for_language(language).help("en").splitlines()
    # /persona - show..., /persona EXAMPLE - set..., /persona clear - remove...
    [line] = [line for line in lines if line.startswith("/persona ")][1:2]
    return line


@pytest.mark.parametrize("language", texts.LANGUAGES)
def test_the_help_example_persona_is_english_in_every_language_for_an_english_model(
    language: str,
) -> None:
    # Before: /help gave the example in the chat's language ("Ich heiße Sarah..."), which
    # invites personas the English-only model cannot use; nothing said the model reads English.
    chat = texts.for_language(language)
    english = chat.language_name("en")  # "English", "Englisch", "inglés", "английский"
    example, _, usage = example_line(language).partition(" - ")
    assert example == f"/persona {EXAMPLE}"
    assert english in usage
    assert chat.no_persona("en").endswith(f"/persona {EXAMPLE}")
    assert english in chat.no_persona("en")


def test_the_example_persona_follows_the_model_language() -> None:
    # A German model reads a German example, in a Russian chat too.
    german = texts.for_language("de").translate(EXAMPLE)
    assert german != EXAMPLE
    assert f"/persona {german} - " in texts.for_language("ru").help("de")
    assert texts.for_language("ru").no_persona("de").endswith(f"/persona {german}")
