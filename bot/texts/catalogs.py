"""The gettext catalogs: loaded from the .po files at start, extracted and updated with Babel.

The service reads the .po files themselves (Babel's read_po, compiled in memory) rather than
.mo files compiled at install: a clean clone, an editable install and a wheel all run the
catalogs that are committed, and no build step can be forgotten or go stale. Four small
catalogs take milliseconds to read.

    python -m bot.texts.catalogs extract      # the code -> locale/messages.pot (make i18n-extract)
    python -m bot.texts.catalogs update       # messages.pot -> every .po (make i18n-update)
    python -m bot.texts.catalogs init LANG    # a new language's .po, from messages.pot
"""

from __future__ import annotations

import gettext
import io
import sys
from collections.abc import Iterable
from pathlib import Path

from babel import Locale
from babel.messages.catalog import Catalog
from babel.messages.extract import extract_from_file
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po, write_po

LOCALE_DIR = Path(__file__).resolve().parent / "locale"
TEMPLATE = LOCALE_DIR / "messages.pot"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
# Every sentence a user sees is written in these two files (bot/texts, the command table).
SOURCES = (PACKAGE_DIR / "commands.py", PACKAGE_DIR / "texts" / "__init__.py")
# _: a message; _n: singular and plural; N_: marked in the command table, translated later.
KEYWORDS: dict[str, tuple[int, ...] | None] = {"_": None, "_n": (1, 2), "N_": None}
# The same options for every file written, so that extraction is reproducible (the catalog
# test compares it with the committed template). No locations: they would change with every
# edit of the code above a message.
HEADER = (
    "# The sentences of bot/texts and bot/commands.py (English, the source).\n"
    "# Made by `make i18n-extract`: edit the code, not this file."
)
_WRITE = {"width": 100, "no_location": True, "ignore_obsolete": True, "omit_header": False}


def po_path(language: str) -> Path:
    """Where a language's catalog lives."""
    return LOCALE_DIR / language / "LC_MESSAGES" / "messages.po"


def read(path: Path, language: str | None = None) -> Catalog:
    """A .po or .pot file as a Babel catalog."""
    with path.open("rb") as f:
        return read_po(f, locale=language)


def load(language: str) -> gettext.NullTranslations:
    """A shipped language's translations (fuzzy entries left out: they fall back to English)."""
    buffer = io.BytesIO()
    write_mo(buffer, read(po_path(language), language), use_fuzzy=False)
    buffer.seek(0)
    return gettext.GNUTranslations(buffer)


def extract(sources: Iterable[Path] = SOURCES) -> Catalog:
    """The template the code asks for: every marked message, in the order of the sources."""
    catalog = Catalog(project="bot", version="", charset="utf-8", fuzzy=False)
    catalog.msgid_bugs_address = ""
    catalog.header_comment = HEADER
    for path in sources:
        for _line, message, comments, context in extract_from_file(
            "python", str(path), keywords=KEYWORDS, strip_comment_tags=True
        ):
            catalog.add(message, None, auto_comments=comments, context=context)
    return catalog


def write(catalog: Catalog, path: Path) -> None:
    """Write a catalog in the one format every catalog file has."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    write_po(buffer, catalog, **_WRITE)  # type: ignore[arg-type]
    path.write_bytes(buffer.getvalue())


def render(catalog: Catalog) -> str:
    """A catalog as write() would put it in a file."""
    buffer = io.BytesIO()
    write_po(buffer, catalog, **_WRITE)  # type: ignore[arg-type]
    return buffer.getvalue().decode("utf-8")


def shipped() -> list[str]:
    """The languages that have a catalog in the tree."""
    return sorted(p.parent.parent.name for p in LOCALE_DIR.glob("*/LC_MESSAGES/messages.po"))


def update() -> list[str]:
    """Merge the template into every catalog (new messages empty, changed ones fuzzy)."""
    template = read(TEMPLATE)
    for language in shipped():
        catalog = read(po_path(language), language)
        catalog.update(template)
        write(catalog, po_path(language))
    return shipped()


def init(language: str) -> Path:
    """Start a new language's catalog from the template (its plural forms from CLDR)."""
    Locale.parse(language)  # an unknown language stops here
    template = read(TEMPLATE)
    catalog = Catalog(locale=language, project="bot", version="", charset="utf-8", fuzzy=False)
    catalog.header_comment = f"# The sentences of the bot in {Locale.parse(language).english_name}."
    catalog.update(template)
    path = po_path(language)
    if path.exists():
        raise SystemExit(f"{path} exists; run update instead")
    write(catalog, path)
    return path


def main(argv: list[str]) -> int:
    """The catalog commands (see the module's docstring)."""
    match argv:
        case ["extract"]:
            write(extract(), TEMPLATE)
            print(f"wrote {TEMPLATE}")
        case ["update"]:
            print("updated " + ", ".join(update()))
        case ["init", language]:
            print(f"wrote {init(language)}; translate it, then run the catalog test")
        case _:
            print(__doc__)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
