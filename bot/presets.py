"""Persona presets (PERSONAS_FILE, TOML): named personas users pick with `/persona use NAME`,
or that a link starts a chat with: t.me/<bot>?start=persona_NAME.

    [presets]
    sarah = "My name is Sarah. I love hiking and my two dogs."
    chef = "I am a chef in Lyon. I think about food all day."
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from bot.config import ConfigError

# Deep-link payloads are at most 64 characters of A-Z a-z 0-9 _ - ("persona_" takes 8).
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,56}")
DEEP_LINK_PREFIX = "persona_"


@dataclass(frozen=True)
class Presets:
    """The operator's presets, in file order (none without a file)."""

    personas: dict[str, str]

    def get(self, name: str) -> str | None:
        """A preset by name, ignoring case."""
        wanted = name.strip().lower()
        return next((text for key, text in self.personas.items() if key.lower() == wanted), None)

    @property
    def names(self) -> list[str]:
        """The presets' names."""
        return list(self.personas)


NO_PRESETS = Presets({})


def load_presets(path: Path | None, max_chars: int) -> Presets:
    """PERSONAS_FILE validated; ConfigError listing every problem."""
    if path is None:
        return NO_PRESETS
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"PERSONAS_FILE {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"PERSONAS_FILE {path} cannot be read: {err}") from None
    problems = [f"unknown top-level key {k!r} (expected presets)" for k in data if k != "presets"]
    table = data.get("presets")
    if not isinstance(table, dict) or not table:
        problems.append('no presets: add a [presets] table of name = "persona text"')
        table = {}
    personas: dict[str, str] = {}
    for name, text in table.items():
        if not NAME_RE.fullmatch(name):
            problems.append(f"preset {name!r}: names are 1-56 of A-Z a-z 0-9 _ - (deep links)")
        elif not isinstance(text, str) or not text.strip():
            problems.append(f"preset {name!r}: the persona must be a non-empty string")
        elif len(text.strip()) > max_chars:
            problems.append(f"preset {name!r}: longer than PERSONA_MAX_CHARS ({max_chars})")
        else:
            personas[name] = text.strip()
    if problems:
        raise ConfigError(f"PERSONAS_FILE {path}:\n  " + "\n  ".join(problems))
    return Presets(personas)


def deep_link_preset(payload: str) -> str | None:
    """The preset name a /start payload asks for (`persona_NAME`), if it is one."""
    if payload.startswith(DEEP_LINK_PREFIX):
        name = payload[len(DEEP_LINK_PREFIX) :]
        return name if NAME_RE.fullmatch(name) else None
    return None
