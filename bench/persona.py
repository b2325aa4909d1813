"""Does a model follow its persona? Persona-fact recall, its base rate and contradictions.

    python -m bench.persona [--models NAME=PATH ...] [--quick]

The probe set (bench/data/persona_probes_v1.json, versioned: a changed set is a new file) holds
60 personas of 2-4 facts (name, job, hobby, pet, home, food, each kind in four phrasings) and a
question about each fact (178 in all, several phrasings per kind). Each question is asked in a
fresh conversation through the service's own engine (the micro-batcher, `Batcher`, on clones
the way the service's cache builds them: bot.inference.cache.AgentCache.rebuild, so the persona
reaches the model exactly as a `/persona` does), once with the persona and once without.
Decoding is the model's own (the shipped model: delayedbeam, top-10 sampling of the first 3
tokens, then beam 5), torch seeded with 0 before each model.

The matcher (`states`, `contradicts`), lower-cased, on word boundaries:

- a reply *states* a fact when it contains the fact's value or a variant of it: the last word
  with or without a plural "s"/"es" ("ies" for "y"), and for a one-word "-ing" hobby its verb
  ("hiking": "hike", "swimming": "swim");
- a reply *contradicts* the persona when, with the persona's own value (and variants) taken
  out, it states another value of the asked kind from the known values of that kind (the
  probe set's and the training templates', bot/training/persona_data.py TRAIN_VALUES), or a
  word the first persona recipe could have made up (`FIRST_RECIPE_SYLLABLES`, then a suffix of
  the kind), which is what a model that learnt the template values instead of copying says.
  Values the current recipe makes up (any corpus word, random letters) are in no list, so a
  reply also contradicts when it states a fact of the asked kind in one of the plain answer
  shapes (`SHAPES`: "my name is X", "i work as a X", "my hobby is X", "my pet is a X",
  "i live in X", "my favorite food is X", ...) and the words X after it (up to punctuation)
  hold neither the persona's value nor any word of it, unless X starts with a vague word
  ("the", "not", "a" before a home, ...: `VAGUE`). A garbled copy ("my name is lochi" for
  Chloe, "i live in kyoyoto" for Kyoto) counts as a contradiction: the reply names another.

Figures per model: recall (questions whose reply states the fact, with the persona), base rate
(the same without a persona: what guessing and coincidence give), their difference in points,
the contradiction rate (with the persona), and the share of distinct replies among the replies
with the persona and among those without (a model that answers everything alike scores low);
and, so that a persona fine-tune is seen not to cost ordinary chat its variety, the share of
distinct replies to ordinary chat: the last message of the first CHAT_PROMPTS held-out contexts
of the training recipe (conversations no model here trained on), no persona, each in a fresh
conversation through the same engine.
RESULT lines: for the first model `persona_recall`, `persona_base_rate`, `persona_lift_pp`,
`persona_contradiction_rate`, `persona_distinct_share`, `persona_distinct_share_no_persona`,
`persona_distinct_share_chat`;
for the others the same names with `_<NAME>` appended. The default is
the shipped model alone (models/chitchat/model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench import common
from bot.reports.guards import distinct_share

PROBES = Path(__file__).resolve().parent / "data" / "persona_probes_v1.json"
GROUP = 8  # conversations asked at once (one micro-batch)
QUICK_PERSONAS = 20
CHAT_PROMPTS = 200  # ordinary held-out messages for the distinct-replies figure (50 --quick)


def load_probes(path: Path = PROBES) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def known_values(probes: dict[str, Any]) -> dict[str, set[str]]:
    """Every value the matcher knows per kind: the probe set's and the training templates'."""
    from bot.training.persona_data import TRAIN_VALUES

    kinds = set(probes["values"]) | set(TRAIN_VALUES)
    return {
        k: set(probes["values"].get(k, ())) | set(TRAIN_VALUES.get(k, ())) for k in sorted(kinds)
    }


def variants(value: str) -> set[str]:
    """The forms of `value` that count as stating it (see the module's docstring)."""
    value = value.lower().strip()
    forms = {value}
    head, _, last = value.rpartition(" ")
    prefix = head + " " if head else ""
    if last.endswith("ies"):
        forms.add(prefix + last[:-3] + "y")
    elif last.endswith("es") and len(last) > 4:
        forms |= {prefix + last[:-2], prefix + last[:-1]}
    elif last.endswith("s") and not last.endswith("ss") and len(last) > 3:
        forms.add(prefix + last[:-1])
    else:
        forms.add(prefix + (last[:-1] + "ies" if last.endswith("y") else last + "s"))
        forms.add(prefix + last + "es")
    if not head and last.endswith("ing") and len(last) > 5:
        stem = last[:-3]
        forms |= {stem + "e", stem}
        if len(stem) > 2 and stem[-1] == stem[-2]:
            forms.add(stem[:-1])
    return forms


def _pattern(forms: Iterable[str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
    return re.compile(rf"(?<![a-z0-9])(?:{alternatives})(?![a-z0-9])")


def _normal(reply: str) -> str:
    return " ".join(reply.lower().replace("’", "'").split())


def states(reply: str, value: str) -> bool:
    """Whether `reply` states `value`."""
    return _pattern(variants(value)).search(_normal(reply)) is not None


# The syllables the first persona recipe joined into made-up values (two or three, then a suffix
# of the kind). A model trained on them says them instead of the persona's value ("i'm from
# vireborn"), so the matcher still knows them, although the recipe now draws its values from
# corpus words and random letters (bot/training/persona_data.py made_up).
FIRST_RECIPE_SYLLABLES = (
    "bra", "dor", "fen", "gul", "kri", "lom", "mav", "nes", "pol", "quin", "rad", "sel", "tav",
    "ulm", "vor", "wex", "yad", "zon", "tor", "bel", "kas", "mir", "dal", "ren", "sko", "fal",
    "gar", "hin", "jor", "lev", "ost", "pim", "rul", "sid", "tek", "vam", "zel", "brin", "clo",
    "dru", "esk", "fro", "gri", "hal", "ith", "jun", "kel", "lur", "mox", "nib",
)  # fmt: skip


def made_up_pattern(kind: str) -> re.Pattern[str]:
    """A word (with its suffix) the first persona recipe made up for `kind`."""
    from bot.training.persona_data import MADE_UP_SUFFIXES

    syllable = "|".join(FIRST_RECIPE_SYLLABLES)
    suffix = "|".join(re.escape(s) for s in sorted(MADE_UP_SUFFIXES[kind], key=len, reverse=True))
    return re.compile(rf"(?<![a-z0-9])(?:{syllable}){{2,3}}(?:{suffix})(?![a-z0-9])")


# The plain shapes that state a fact of one kind (the answers of bot/training/persona_data.py
# ANSWER_TEMPLATES and the persona lines' own phrasings); only unambiguous ones: "i'm X" and
# "i love X" say too many things to count.
SHAPES: dict[str, tuple[str, ...]] = {
    "name": (r"my name is", r"my name's", r"my first name is", r"call me", r"i go by",
             r"i'm called", r"i am called"),
    "job": (r"i work as(?: an?)?", r"i'm employed as(?: an?)?", r"my job is(?: being)?(?: an?)?",
            r"i make a living as(?: an?)?", r"by profession i am(?: an?)?"),
    "hobby": (r"my hobby is", r"my hobbies are", r"my favou?rite hobby is",
              r"my favou?rite pastime is"),
    "pet": (r"i have a pet", r"my pet is(?: an?)?", r"i own an?"),
    "home": (r"i live in", r"i'm from", r"i am from", r"i grew up in", r"my hometown is",
             r"i was raised in", r"my home is in"),
    "food": (r"my favou?rite food is", r"my favou?rite dish is"),
}  # fmt: skip
# A slot starting with one of these says nothing definite ("i live in the city", "my name is
# not important", "i'm from a small town"): not counted as another value.
VAGUE = frozenset({
    "a", "an", "the", "not", "no", "my", "your", "his", "her", "our", "their", "this", "that",
    "these", "those", "it", "its", "very", "so", "really", "just", "also", "still", "now", "here",
    "there", "what", "who", "which", "where", "when", "how", "why", "is", "are", "was", "be",
    "been", "being", "and", "or", "but", "to", "in", "on", "at", "of", "for", "with", "from",
    "by", "as", "like", "kind", "sort", "one", "some", "any", "many", "lots", "all", "pretty",
    "quite", "actually", "currently", "always", "never", "same", "going", "doing", "too", "i",
    "you", "we", "they", "me", "secret", "none", "nothing", "something", "someone", "anything",
    "everything"
})  # fmt: skip
_SLOT = re.compile(r"\s*([a-z][a-z'-]*(?: [a-z][a-z'-]*)*)")


def shape_slots(reply: str, kind: str) -> list[str]:
    """The words after each answer shape of `kind` in `reply`, up to punctuation."""
    shapes = "|".join(SHAPES.get(kind, ()))
    if not shapes:
        return []
    text = _normal(reply)
    out = []
    for m in re.finditer(rf"(?<![a-z0-9'])(?:{shapes})(?![a-z0-9'])", text):
        if slot := _SLOT.match(text, m.end()):
            out.append(slot.group(1))
    return out


def _names_other(slot: str, value: str) -> bool:
    """Whether the slot of an answer shape names something other than `value`."""
    words = slot.split()
    if not words or words[0] in VAGUE:
        return False
    if states(slot, value):
        return False
    own = {w for v in variants(value) for w in v.split() if len(w) > 2 and w not in VAGUE}
    return not own & set(words)


def contradicts(
    reply: str, value: str, others: Iterable[str], kind: str | None = None
) -> str | None:
    """Another value of the kind (from `others`, made up for `kind`, or in an answer shape of
    `kind`) that `reply` states, the persona's own `value` taken out first; None when there is
    none."""
    if kind is not None:
        for slot in shape_slots(reply, kind):
            if _names_other(slot, value):
                named = []
                for word in slot.split():
                    if word in VAGUE or len(named) == 3:
                        break
                    named.append(word)
                return " ".join(named)
    text = _pattern(variants(value)).sub(" ", _normal(reply))
    own = value.lower()
    if kind is not None and (found := made_up_pattern(kind).search(text)):
        return found.group(0)
    for other in sorted(others, key=len, reverse=True):
        o = other.lower()
        if o == own or o in own or own in o:
            continue  # "pig" and "guinea pig": a longer or shorter form of the fact itself
        if _pattern(variants(o)).search(text):
            return other
    return None


def questions(probes: dict[str, Any], n_personas: int | None = None) -> list[dict[str, Any]]:
    """One row per (persona, fact): id, persona, kind, value, question."""
    rows = []
    for probe in probes["probes"][:n_personas]:
        for fact in probe["facts"]:
            rows.append({"id": probe["id"], "persona": probe["persona"], **fact})
    return rows


def chat_prompts(n: int) -> list[str]:
    """The last message of each of the first `n` held-out contexts of the training recipe
    (bot/training/data.py's split, its persona lines left out), each message once."""
    from bot.training.data import load_conversations, write_dataset
    from bot.training.recipe import DEFAULT_RECIPE

    prompts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        write_dataset(Path(tmp), load_conversations(), DEFAULT_RECIPE)
        for line in (Path(tmp) / "chitchat_valid.txt").read_text(encoding="utf-8").splitlines():
            text = line.split("\t")[0].removeprefix("text:")
            last = text.split("\\n")[-1]
            if last and not last.startswith("your persona:") and last not in prompts:
                prompts.append(last)
            if len(prompts) == n:
                break
    return prompts


def score(
    rows: Sequence[dict[str, Any]],
    with_persona: Sequence[str],
    without: Sequence[str],
    known: dict[str, set[str]],
) -> dict[str, float]:
    """recall, base_rate, lift_pp, contradiction_rate and distinct_share (all in [0, 1] but
    the lift, in points)."""
    if not rows or not (len(rows) == len(with_persona) == len(without)):
        raise ValueError("score needs one reply with and one without a persona per question")
    n = len(rows)
    recall = sum(states(r, q["value"]) for q, r in zip(rows, with_persona, strict=True)) / n
    base = sum(states(r, q["value"]) for q, r in zip(rows, without, strict=True)) / n
    wrong = sum(
        contradicts(r, q["value"], known.get(q["kind"], set()), q["kind"]) is not None
        for q, r in zip(rows, with_persona, strict=True)
    )
    return {
        "recall": recall,
        "base_rate": base,
        "lift_pp": 100.0 * (recall - base),
        "contradiction_rate": wrong / n,
        "distinct_share": distinct_share(with_persona),
        "distinct_share_no_persona": distinct_share(without),
    }


# --- asking a model --------------------------------------------------------------------------


def load(model_file: str, data_dir: Path) -> Any:
    """The shared agent, loaded as the service loads it (1 torch thread, its own decoding)."""
    from bot.config import Settings
    from bot.inference import compat
    from bot.inference.model import load_shared_agent, set_torch_threads

    compat.apply()
    set_torch_threads(1)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, bot_model=model_file, data_dir=data_dir, model_device="cpu",
        torch_threads=1,
    )  # fmt: skip
    return load_shared_agent(settings)


async def ask(agent: Any, asked: Sequence[tuple[str, str]]) -> list[str]:
    """Each (persona, question)'s reply in a fresh conversation, through the service's engine
    (Batcher on AgentCache clones), GROUP at a time."""
    from bot.inference.batcher import Batcher
    from bot.inference.cache import AgentCache

    cache = AgentCache(agent, capacity=1_000_000)
    engine = Batcher(agent, max_size=GROUP, max_wait_ms=20)
    await engine.start()
    try:
        out: list[str] = []
        for start in range(0, len(asked), GROUP):
            group = list(enumerate(asked[start : start + GROUP], start))
            entries = [cache.rebuild(i, persona, []) for i, (persona, _) in group]
            generated = await asyncio.gather(
                *(
                    engine.generate(entry.clone, entry.user_turn(text))
                    for entry, (_, (_, text)) in zip(entries, group, strict=True)
                )
            )
            out += [str(g.text) for g in generated]
        return out
    finally:
        await engine.close()


def replies(
    model_file: str, rows: Sequence[dict[str, Any]], chat: Sequence[str] = ()
) -> tuple[list[str], list[str], list[str]]:
    """The model's replies to every question, with its persona and without, and to each
    ordinary `chat` message (no persona), each set from seed 0."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        agent = load(model_file, Path(tmp))
        torch.manual_seed(0)
        with_persona = asyncio.run(ask(agent, [(q["persona"], q["question"]) for q in rows]))
        torch.manual_seed(0)
        without = asyncio.run(ask(agent, [("", q["question"]) for q in rows]))
        torch.manual_seed(0)
        chatted = asyncio.run(ask(agent, [("", text) for text in chat])) if chat else []
    return with_persona, without, chatted


def parse_models(specs: Sequence[str]) -> list[tuple[str, str]]:
    """`NAME=PATH` pairs (a bare PATH is named after its folder); names unique."""
    out: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec).parent.name or "model", spec
        if not re.fullmatch(r"[A-Za-z0-9_]+", name):
            raise SystemExit(f"--models: {name!r} is not a name (letters, digits, _)")
        if name in {n for n, _ in out}:
            raise SystemExit(f"--models: {name} twice")
        out.append((name, path))
    return out


def result_names(index: int, name: str, figures: dict[str, float]) -> dict[str, float]:
    """RESULT names: plain for the first model, `_<name>` appended for the others."""
    suffix = "" if index == 0 else f"_{name}"
    return {f"persona_{k}{suffix}": v for k, v in figures.items()}


def main(argv: Sequence[str] | None = None) -> None:
    from bot.config import SHIPPED_MODEL_FILE

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=[f"shipped={SHIPPED_MODEL_FILE}"],
        metavar="NAME=PATH",
        help="models side by side; the first one's RESULT names have no suffix",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"the first {QUICK_PERSONAS} personas only"
    )
    parser.add_argument("--probes", default=str(PROBES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    models = parse_models(args.models)
    probes = load_probes(Path(args.probes))
    rows = questions(probes, QUICK_PERSONAS if args.quick else None)
    known = known_values(probes)
    n_personas = len({q["id"] for q in rows})
    chat = chat_prompts(50 if args.quick else CHAT_PROMPTS)
    print(
        f"probe set v{probes['version']}: {n_personas} personas, {len(rows)} questions; "
        f"{len(chat)} ordinary held-out messages"
    )

    results: dict[str, float] = {}
    table = []
    samples: dict[str, list[dict[str, str]]] = {}
    chat_samples: dict[str, list[dict[str, str]]] = {}
    for index, (name, path) in enumerate(models):
        print(f"{name}: asking {path} ...", flush=True)
        with_persona, without, chatted = replies(path, rows, chat)
        figures = {
            **score(rows, with_persona, without, known),
            "distinct_share_chat": distinct_share(chatted),
        }
        results.update(result_names(index, name, figures))
        table.append(
            [
                name,
                100 * figures["recall"],
                100 * figures["base_rate"],
                figures["lift_pp"],
                100 * figures["contradiction_rate"],
                100 * figures["distinct_share"],
                100 * figures["distinct_share_no_persona"],
                100 * figures["distinct_share_chat"],
            ]
        )
        samples[name] = [
            {"persona": q["persona"], "question": q["question"], "with": a, "without": b}
            for q, a, b in zip(rows, with_persona, without, strict=True)
        ]
        chat_samples[name] = [
            {"message": m, "reply": r} for m, r in zip(chat, chatted, strict=True)
        ]
    headers = [
        "model", "recall %", "base rate %", "lift pp", "contradicts %", "distinct %",
        "distinct % (no persona)", "distinct % (chat)",
    ]  # fmt: skip
    common.print_table(f"Persona-fact recall, {len(rows)} questions", headers, table)
    for name, rows_out in samples.items():
        for s in rows_out[:4]:
            print(f"{name}: {json.dumps(s, ensure_ascii=False)}")
    common.emit_results(results)
    common.write_json(
        "persona",
        {
            "probes": f"{Path(args.probes).name} (v{probes['version']})",
            "models": dict(models),
            "questions": len(rows),
            "results": results,
            "table": common.markdown_table(headers, table),
            "replies": samples,
            "chat_replies": chat_samples,
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
