"""The model input: ParlAI's own while it fits, else the persona pinned at the head, then as
many recent turns as fit.

ParlAI's persona models read the persona as lines at the head of the first message, and ParlAI
tokenizes that message as one string. While the whole conversation fits the model's context,
PersonaHistory gives exactly the input ParlAI's own agent builds from those turns: the persona
lines, the delimiter and the first message tokenized together, then the other turns joined by
the delimiter's tokens (History.get_history_vec). Tokenizing the persona apart would not do: a
byte-level BPE (the 400M/1B/3B BlenderBots, BART) tokenizes the persona's end and the first
message's start differently in one string ("." "Ġ" "Ġhi" for the two-space delimiter, against
"." "Ġ" "Ġ" "Ġhi" when the delimiter's tokens join two strings; found by
tests/integration/inference/test_shapes.py).

Once the conversation outgrows the context, ParlAI's own truncation keeps the *end* of the
flattened history, so the persona is the first thing to go (ParlAI issue #2820).
PersonaHistory pins the persona instead (tokenized alone, at most `PERSONA_SHARE` of the
context), then the delimiter's tokens, then the newest whole turns that fit (the newest one
cut to its end when even it alone is too long). It keeps only the turns that can still reach
the model under any persona, so neither observe() nor a rebuild grows with the length of the
conversation, and a persona changed in place gives what a rebuild would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from parlai.core.torch_agent import History

from bot.persona import persona_lines

# At most this share of the model's context goes to the pinned persona, the rest to the dialogue.
PERSONA_SHARE = 0.75


class PersonaHistory(History):  # type: ignore[misc]
    """ParlAI History with a pinned persona and a token budget of `maxlen` (text_truncate).

    `split_lines` and `history_reversed` (no BlenderBot uses them) are not supported.
    """

    def __init__(self, opt: Any, **kwargs: Any) -> None:
        super().__init__(opt, **kwargs)
        self.persona = ""
        self.persona_text = ""
        self.persona_vec: list[int] = []
        # Who spoke last, so a second user message in a row can join the first.
        self.last_role: str | None = None
        # Whether the first kept turn is the conversation's first (the one ParlAI's input
        # carries the persona in; before any turn: the next one will be), and its role.
        self.first_kept = True
        self.first_role: str | None = None
        # The first turn tokenized with the persona, keyed by the string tokenized.
        self._head: tuple[str, list[int]] | None = None

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

    def _turn_budget(self) -> int | None:
        """Tokens left for dialogue turns once the pinned persona is in."""
        if self.max_len is None:
            return None
        max_len = int(self.max_len)
        used = len(self.persona_vec) + (len(self.delimiter_tok) if self.persona_vec else 0)
        if self._global_end_token is not None:
            used += 1
        return max(max_len - used, 1)

    def _keep_budget(self) -> int | None:
        """Tokens the turns could take with no persona at all: turns beyond it never reach the
        model, whatever the persona becomes."""
        if self.max_len is None:
            return None
        return max(int(self.max_len) - (self._global_end_token is not None), 1)

    def _trim(self) -> None:
        """Forget turns that can no longer reach the model (the newest ones fill the budget)."""
        budget = self._keep_budget()
        if budget is None:
            return
        delim = len(self.delimiter_tok)
        total = sum(len(v) for v in self.history_vecs) + delim * max(len(self.history_vecs) - 1, 0)
        while len(self.history_vecs) > 1 and total - len(self.history_vecs[0]) - delim >= budget:
            total -= len(self.history_vecs[0]) + delim
            self.history_vecs.pop(0)
            self.history_strings.pop(0)
            self.history_raw_strings.pop(0)
            self.first_kept = False

    # --- ParlAI's own input ----------------------------------------------------------------

    def _head_string(self) -> str | None:
        """The first turn as ParlAI's agent reads it, the persona lines prepended to it, with
        person tokens where ParlAI adds them (to the message's whole text); None when there is
        no persona or the first turn is gone."""
        if not (self.persona_text and self.first_kept and self.history_raw_strings):
            return None
        text = f"{self.persona_text}{self.delimiter}{self.history_raw_strings[0]}"
        if self.add_person_tokens:
            if self.first_role == "user":
                text = self._add_person_tokens(text, self.p1_token, self.add_p1_after_newln)
            else:
                text = self._add_person_tokens(text, self.p2_token)
        return text

    def _head_vec(self) -> list[int] | None:
        text = self._head_string()
        if text is None:
            return None
        if self._head is None or self._head[0] != text:
            self._head = (text, list(self.parse(text)))
        return self._head[1]

    def parlai_vec(self) -> list[int] | None:
        """ParlAI's own model input for the persona and the turns, when the persona is in it
        and nothing has to be cut; else None (the pinned form applies)."""
        head = self._head_vec()
        if head is None:
            return None
        out = list(head)
        for vec in self.history_vecs[1:]:
            out.extend(self.delimiter_tok)
            out.extend(vec)
        if self.temp_history is not None:
            out.extend(self.parse(self.temp_history))
        if self._global_end_token is not None:
            out.append(self._global_end_token)
        if self.max_len is not None and len(out) > int(self.max_len):
            return None
        return out

    # --- History API -----------------------------------------------------------------------

    def reset(self) -> None:
        """Clear the dialogue turns (the persona stays)."""
        super().reset()
        self.last_role = None
        self.first_kept = True
        self.first_role = None

    def _update_vecs(self, text: str) -> None:
        if self.size > 0 and len(self.history_vecs) >= self.size:
            self.first_kept = False  # History drops the oldest turn beyond history_size
        super()._update_vecs(text)

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
        if not self.history_vecs:
            self.first_role = "bot"
        super().add_reply(text)
        self.last_role = "bot"
        self._trim()

    def update_history(self, obs: Any, temp_history: str | None = None) -> None:
        """Add the user's utterance."""
        added = obs.get(self.field) is not None
        if added and not self.history_vecs:
            self.first_role = "user"
        super().update_history(obs, temp_history=temp_history)
        if added:
            self.last_role = "user"
        self._trim()

    def fill(self, turns: Iterable[tuple[str, str]], *, complete: bool = True) -> None:
        """Rebuild from stored turns `(role, text)` without re-vectorizing the whole history.

        Only the newest turns that can reach the model are tokenized, newest first: the same
        turns observe() would have kept. `complete`: whether `turns` begin the conversation
        (False for a tail that may have been cut).
        """
        self.reset()
        budget = self._keep_budget()
        delim = len(self.delimiter_tok)
        picked: list[tuple[str, str, list[int]]] = []
        used = 0
        turns = list(turns)
        for role, text in reversed(turns):
            if budget is not None and used >= budget:
                break  # the newer turns fill the budget: the older ones never reach the model
            shown = text
            if self.add_person_tokens:
                token = self.p1_token if role == "user" else self.p2_token
                shown = self._add_person_tokens(text, token)
            vec = list(self.parse(shown))
            picked.append((text, shown, vec))
            used += len(vec) + (delim if len(picked) > 1 else 0)
        for raw, shown, vec in reversed(picked):
            self.history_raw_strings.append(raw)
            self.history_strings.append(shown)
            self.history_vecs.append(vec)
        self.first_kept = complete and len(picked) == len(turns)
        self.first_role = turns[0][0] if turns else None
        self.last_role = turns[-1][0] if turns else None

    def get_history_str(self) -> str | None:
        """The persona lines, then the kept turns (ParlAI's own string while the first turn is
        kept, the persona inside it)."""
        turns: str | None = super().get_history_str()
        if turns is None:
            return None
        head = self._head_string()
        if head is not None:
            joined: str = self.delimiter.join([head, *self.history_strings[1:]])
            return joined + (self.temp_history or "")
        if self.persona_text:
            return f"{self.persona_text}{self.delimiter}{turns}"
        return turns

    def _fitting(self) -> list[Sequence[int]]:
        """The turn vectors that reach the model beside the pinned persona, newest first (the
        newest one cut to its end when even it alone is too long)."""
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
        if not self.history_vecs:
            return 0
        if self.parlai_vec() is not None:
            return len(self.history_vecs)
        return len(self._fitting())

    def get_history_vec(self) -> list[int] | None:
        """ParlAI's own input while it fits; else the pinned persona's tokens, then the newest
        turns that fit, never longer than `maxlen`."""
        if not self.history_vecs:
            return None
        whole = self.parlai_vec()
        if whole is not None:
            return whole
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
