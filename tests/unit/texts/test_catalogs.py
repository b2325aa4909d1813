"""The shipped catalogs are complete, checked and in step with the code; plurals are right.

Every .po file is read with Babel: no message of the template (the English source) may be
missing or empty, none may be fuzzy, and each translation (each plural form) must carry
exactly the English placeholders, `{name}` vs `{nome}` and `{window_s:g}` vs `{window_s}`
alike. The template itself must be what extraction from the code gives now.
"""

from __future__ import annotations

import io
import re
import string

import pytest
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po

from bot import texts
from bot.commands import COMMANDS, MENU
from bot.texts import catalogs

TRANSLATED = [code for code in texts.LANGUAGES if code != texts.SOURCE_LANGUAGE]


def placeholders(message: str) -> list[str]:
    """The replacement fields of a str.format text, as written ("{name!r}", "{window_s:g}")."""
    fields = []
    for _literal, name, spec, conversion in string.Formatter().parse(message):
        if name is not None:
            fields.append(
                "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                + "}"
            )  # fmt: skip
    return sorted(fields)


def problems(catalog: Catalog, template: Catalog) -> list[str]:
    """What keeps a catalog from shipping, one line each."""
    found = []
    if catalog.fuzzy:
        found.append("the header is fuzzy")
    for source in template:
        if not source.id:
            continue
        message = catalog.get(source.id, source.context)
        key = source.id[0] if isinstance(source.id, tuple) else source.id
        if message is None:
            found.append(f"missing: {key!r}")
            continue
        if message.fuzzy:
            found.append(f"fuzzy: {key!r}")
        strings = message.string if isinstance(message.string, tuple) else (message.string,)
        if isinstance(source.id, tuple) and len(strings) != catalog.num_plurals:
            found.append(f"{len(strings)} plural forms, not {catalog.num_plurals}: {key!r}")
        ids = source.id if isinstance(source.id, tuple) else (source.id,)
        english = placeholders(ids[-1])  # singular and plural name the same fields
        for form in strings:
            if not form:
                found.append(f"untranslated: {key!r}")
            elif placeholders(form) != english:
                found.append(f"placeholders {placeholders(form)} != {english}: {key!r}")
    return found


@pytest.fixture(scope="module")
def template() -> Catalog:
    return catalogs.read(catalogs.TEMPLATE)


@pytest.mark.parametrize("language", TRANSLATED)
def test_every_shipped_catalog_is_complete_unfuzzy_and_keeps_the_placeholders(
    language: str, template: Catalog
) -> None:
    catalog = catalogs.read(catalogs.po_path(language), language)
    assert problems(catalog, template) == []
    # Nothing translated that the code no longer asks for (stale entries).
    assert {m.id for m in catalog if m.id} == {m.id for m in template if m.id}


def test_the_checker_finds_what_a_bad_catalog_gets_wrong(template: Catalog) -> None:
    bad = read_po(io.BytesIO(catalogs.po_path("de").read_bytes()), locale="de")
    bad["Got it. From now on: {persona}"].string = "Verstanden. Ab jetzt: {nome}"
    bad["Hi!"].flags.add("fuzzy")
    del bad["A is better"]
    plural = next(m for m in bad if isinstance(m.id, tuple) and "{window_s:g}" in m.id[0])
    plural.string = (plural.string[0], plural.string[1].replace("{window_s:g}", "{window_s}"))
    found = problems(bad, template)
    assert "placeholders ['{nome}'] != ['{persona}']: 'Got it. From now on: {persona}'" in found
    assert "fuzzy: 'Hi!'" in found
    assert "missing: 'A is better'" in found
    assert any(p.startswith("placeholders ['{max_messages}', '{window_s}']") for p in found)


def test_every_language_has_a_catalog_and_every_catalog_a_language() -> None:
    assert catalogs.shipped() == sorted(TRANSLATED)


def _without_volatile_header(text: str) -> str:
    # The extraction date changes on every run, Babel's version with an upgrade.
    return re.sub(r'^"(POT-Creation-Date|Generated-By): .*\\n"\n', "", text, flags=re.M)


def test_the_template_is_what_the_code_asks_for_now() -> None:
    """Run `make i18n-extract` (then `make i18n-update`) when this fails."""
    committed = catalogs.TEMPLATE.read_text(encoding="utf-8")
    assert _without_volatile_header(catalogs.render(catalogs.extract())) == (
        _without_volatile_header(committed)
    )


def test_every_command_description_and_help_line_is_in_the_template(template: Catalog) -> None:
    ids = {m.id for m in template}
    for command in MENU:
        assert command.menu in ids
    for command in COMMANDS:
        for usage in command.usage:
            assert usage.text in ids
            assert not usage.example or usage.args in ids


# --- plurals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "expected"),
    [
        ("en", {1: "1 older message no longer fits", 2: "2 older messages", 5: "5 older messages"}),
        (
            "de",
            {1: "1 ältere Nachricht passt", 2: "2 ältere Nachrichten", 5: "5 ältere Nachrichten"},
        ),
        ("es", {1: "1 mensaje anterior ya no cabe", 2: "2 mensajes anteriores", 5: "5 mensajes"}),
        (
            "ru",
            {
                1: "1 более старое сообщение уже не помещается",
                2: "2 более старых сообщения",
                5: "5 более старых сообщений",
                11: "11 более старых сообщений",
                12: "12 более старых сообщений",
                21: "21 более старое сообщение",
                22: "22 более старых сообщения",
                25: "25 более старых сообщений",
                111: "111 более старых сообщений",
                104: "104 более старых сообщения",
            },
        ),
    ],
)
def test_plural_forms_in_every_language(language: str, expected: dict[int, str]) -> None:
    t = texts.for_language(language)
    for count, start in expected.items():
        assert t.context_view([], [], count).splitlines()[-1].startswith("(" + start), count


def test_russian_has_three_plural_forms_and_the_standard_rule() -> None:
    catalog = catalogs.read(catalogs.po_path("ru"), "ru")
    assert catalog.num_plurals == 3
    ru = texts.for_language("ru")
    forms = {n: ru.message_too_long(n, 1).split()[4] for n in (1, 2, 5, 21, 22, 25, 11, 14)}
    assert forms == {
        1: "символ,",
        2: "символа,",
        5: "символов,",
        21: "символ,",
        22: "символа,",
        25: "символов,",
        11: "символов,",
        14: "символов,",
    }


# --- which language ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "sender", "expected"),
    [
        (None, "de", "de"),
        (None, "de-AT", "de"),
        (None, "ru", "ru"),
        (None, "pt-BR", "en"),
        (None, "pt-br", "en"),
        (None, None, "en"),
        (None, "", "en"),
        (None, "not a tag!", "en"),
        ("es", "de", "es"),  # the chat's /lang wins
        ("xx", "de", "de"),  # a stored code without a catalog (removed since) is ignored
    ],
)
def test_the_language_of_an_update(stored: str | None, sender: str | None, expected: str) -> None:
    assert texts.choose(stored, sender) == expected


def test_an_unknown_code_gets_english_and_english_is_the_source() -> None:
    assert texts.for_language("pt") is texts.ENGLISH
    assert texts.ENGLISH.persona_set("x") == "Got it. From now on: x"
    assert texts.for_language("de").language_name("en") == "Englisch"
