"""The model input: persona lines pinned at the head, then as many recent turns as fit.

ParlAI's own truncation keeps the *end* of the flattened history, so on a long conversation the
persona is the first thing to go (ParlAI issue #2820). PersonaHistory keeps the persona and drops
the oldest turns instead, and only ever keeps the turns that can still reach the model, so
neither observe() nor a rebuild grows with the length of the conversation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from parlai.core.torch_agent import History

from bot.persona import persona_lines

# At most this share of the model's context goes to the persona, the rest to the dialogue.
PERSONA_SHARE = 0.75


class PersonaHistory(History):  # type: ignore[misc]
    """ParlAI History with a pinned persona and a token budget of `maxlen` (text_truncate)."""

    def __init__(self, opt: Any, **kwargs: Any) -> None:
        super().__init__(opt, **kwargs)
        self.persona = ""
        self.persona_text = ""
        self.persona_vec: list[int] = []
        # Who spoke last, so a second user message in a row can join the first.
        self.last_role: str | None = None

    # --- persona ---------------------------------------------------------------------------

    def set_persona(self, persona: str) -> None:
        """Use `persona` from the next model input on."""
        self.persona = persona
        lines = persona_lines(persona)
        self.persona_text = self.delimiter.join(lines)
        vec: list[int] = list(self.parse(self.persona_text)) if lines else []
        if self.max_len is not None and vec:
            vec = vec[: int(self.max_len * PERSONA_SHARE)]
        self.persona_vec = vec
        self._trim()

    def _turn_budget(self) -> int | None:
        """Tokens left for dialogue turns once the persona is in."""
        if self.max_len is None:
            return None
        max_len = int(self.max_len)
        used = len(self.persona_vec) + (len(self.delimiter_tok) if self.persona_vec else 0)
        if self._global_end_token is not None:
            used += 1
        return max(max_len - used, 1)

    def _trim(self) -> None:
        """Forget turns that can no longer reach the model (the newest ones fill the budget)."""
        budget = self._turn_budget()
        if budget is None:
            return
        delim = len(self.delimiter_tok)
        total = sum(len(v) for v in self.history_vecs) + delim * max(len(self.history_vecs) - 1, 0)
        while len(self.history_vecs) > 1 and total - len(self.history_vecs[0]) - delim >= budget:
            total -= len(self.history_vecs[0]) + delim
            self.history_vecs.pop(0)
            self.history_strings.pop(0)
            self.history_raw_strings.pop(0)

    # --- History API -----------------------------------------------------------------------

    def reset(self) -> None:
        """Clear the dialogue turns (the persona stays)."""
        super().reset()
        self.last_role = None

    def pop_user_turn(self) -> str | None:
        """Remove and return a trailing user turn that never got a reply."""
        if self.last_role != "user" or not self.history_raw_strings:
            return None
        self.history_vecs.pop()
        self.history_strings.pop()
        text: str = self.history_raw_strings.pop()
        self.last_role = "bot" if self.history_raw_strings else None
        return text

    def add_reply(self, text: str) -> None:
        """Add the bot's own utterance."""
        super().add_reply(text)
        self.last_role = "bot"
        self._trim()

    def update_history(self, obs: Any, temp_history: str | None = None) -> None:
        """Add the user's utterance."""
        super().update_history(obs, temp_history=temp_history)
        if obs.get(self.field) is not None:
            self.last_role = "user"
        self._trim()

    def fill(self, turns: Iterable[tuple[str, str]]) -> None:
        """Rebuild from stored turns `(role, text)` without re-vectorizing the whole history.

        Only the newest turns that fit the budget are tokenized, newest first.
        """
        self.reset()
        budget = self._turn_budget()
        delim = len(self.delimiter_tok)
        picked: list[tuple[str, str, list[int]]] = []
        used = 0
        turns = list(turns)
        roles = [role for role, _ in turns]
        for role, text in reversed(turns):
            shown = text
            if self.add_person_tokens:
                token = self.p1_token if role == "user" else self.p2_token
                shown = self._add_person_tokens(text, token)
            vec = list(self.parse(shown))
            picked.append((text, shown, vec))
            used += len(vec) + (delim if len(picked) > 1 else 0)
            if budget is not None and used >= budget:
                break
        for raw, shown, vec in reversed(picked):
            self.history_raw_strings.append(raw)
            self.history_strings.append(shown)
            self.history_vecs.append(vec)
        self.last_role = roles[-1] if roles else None

    def get_history_str(self) -> str | None:
        """Persona lines, then the turns."""
        turns: str | None = super().get_history_str()
        if turns is None:
            return None
        if self.persona_text:
            return f"{self.persona_text}{self.delimiter}{turns}"
        return turns

    def _fitting(self) -> list[Sequence[int]]:
        """The turn vectors that reach the model, newest first (the newest one cut to its end
        when even it alone is too long)."""
        budget = self._turn_budget()
        delim = len(self.delimiter_tok)
        chosen: list[Sequence[int]] = []
        used = 0
        for vec in reversed(self.history_vecs):
            extra = len(vec) + (delim if chosen else 0)
            if budget is not None and used + extra > budget:
                if not chosen:  # even the newest turn is too long: keep its end
                    chosen.append(vec[-budget:])
                break
            chosen.append(vec)
            used += extra
        return chosen

    def visible_turns(self) -> int:
        """How many of the newest turns reach the model now (the /context command)."""
        return len(self._fitting()) if self.history_vecs else 0

    def get_history_vec(self) -> list[int] | None:
        """Persona tokens, then the newest turns that fit, never longer than `maxlen`."""
        if not self.history_vecs:
            return None
        delim: list[int] = list(self.delimiter_tok)
        chosen = self._fitting()
        out: list[int] = []
        if self.persona_vec:
            out.extend(self.persona_vec)
            out.extend(delim)
        for i, vec in enumerate(reversed(chosen)):
            if i:
                out.extend(delim)
            out.extend(vec)
        if self.temp_history is not None:
            out.extend(self.parse(self.temp_history))
        if self._global_end_token is not None:
            out.append(self._global_end_token)
        return out
