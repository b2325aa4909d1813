"""Stage 2 of the shipped model's recipe: examples that teach it to use its persona.

Stage 1 (bot/training/data.py) puts `your persona:` lines in a quarter of the contexts, but
they are the replying speaker's sentences from elsewhere in the conversation and the label
never needs them, so the model learns to ignore them. Stage 2 fine-tunes on a mix of:

- the stage-1 examples as they are (chitchat, a quarter with unused persona lines): the model
  keeps chatting, and keeps answering what the persona does not cover;
- *grounded* chitchat examples: the persona line is a first-person sentence of the label itself
  ("i have two dogs."), beside 0-1 of the speaker's other sentences, so the label restates a
  persona line (`grounded_examples`);
- synthetic persona question-answer turns (`qa_example`): 1-4 persona lines of different kinds
  (name, job, hobby, pet, home, food; the others are distractors) in several phrasings, the
  user's question about one of them in several phrasings, sometimes after a short greeting
  exchange, and a label that states the fact in a sentence, sometimes with a question back;
- template persona lines in front of ordinary chitchat examples (`persona_chitchat`): the
  persona is there but the question is about something else, so the model does not blurt its
  facts into every reply.

The input has the shape the service gives the model (bot/persona.py persona_lines, joined with
the "\\n" delimiter, then the turns): `your persona: my name is ...\\nyour persona: ...\\nhi`.

The values the templates draw from (TRAIN_VALUES) are disjoint from the values of the probe set
bench.persona measures with (bench/data/persona_probes_v1.json); a unit test holds that, so the
probe set never reaches the training data.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bot.persona import PERSONA_PREFIX
from bot.training.data import Example, make_examples, persona_candidates, to_parlai_line
from bot.training.recipe import DEFAULT_RECIPE, Recipe

KINDS = ("name", "job", "hobby", "pet", "home", "food")

# The values the training templates use, per kind. Keep them apart from the probe set's values.
TRAIN_VALUES: dict[str, tuple[str, ...]] = {
    "name": (
        "james", "mary", "john", "patricia", "robert", "jennifer", "michael", "linda",
        "william", "elizabeth", "david", "barbara", "richard", "susan", "joseph", "jessica",
        "thomas", "karen", "charles", "nancy", "daniel", "lisa", "matthew", "betty",
        "anthony", "margaret", "mark", "sandra", "donald", "ashley", "steven", "kimberly",
        "paul", "emily", "andrew", "donna", "joshua", "michelle", "kenneth", "carol",
        "kevin", "amanda", "brian", "melissa", "george", "deborah", "timothy", "stephanie",
        "ronald", "rebecca", "jason", "laura", "jeffrey", "helen", "ryan", "sharon",
        "jacob", "cynthia", "gary", "kathleen", "nicholas", "amy", "eric", "angela",
        "jonathan", "anna", "larry", "ruth", "justin", "brenda", "scott", "pamela", "frank",
        "nicole", "benjamin", "katherine", "gregory", "raymond", "catherine", "samuel",
        "christine", "patrick", "samantha", "alexander", "debra", "jack", "janet", "dennis",
        "rachel", "jerry", "carolyn", "tyler", "emma", "aaron", "maria", "henry", "heather",
        "douglas", "diane", "peter", "julie", "adam", "joyce", "zachary", "walter", "kelly",
        "nathan", "christina", "harold", "joan", "kyle", "evelyn", "carl", "lauren",
        "arthur", "judith", "gerald", "olivia", "roger", "martha", "keith", "cheryl",
        "jeremy", "megan", "terry", "andrea", "lawrence", "hannah", "sean", "jacqueline",
        "albert", "jean", "alice", "ethan", "kathryn", "ahmed", "fatima", "yuki", "hiroshi",
        "priya", "raj", "wei", "mei", "carlos", "sofia", "lorenzo", "giulia", "pierre",
        "amelie", "hans", "ingrid", "olga", "ivan", "kofi", "amara", "diego", "lucia",
        "omar", "layla", "kenji", "sakura", "arjun", "ananya", "mateo", "valentina",
    ),
    "job": (
        "teacher", "nurse", "doctor", "lawyer", "engineer", "accountant", "chef", "waiter",
        "waitress", "cashier", "mechanic", "electrician", "plumber", "carpenter", "farmer",
        "pilot", "police officer", "firefighter", "dentist", "pharmacist", "programmer",
        "software developer", "graphic designer", "journalist", "writer", "photographer",
        "musician", "actor", "librarian", "scientist", "biologist", "chemist", "architect",
        "real estate agent", "bank teller", "truck driver", "bus driver", "taxi driver",
        "hairdresser", "barber", "tailor", "baker", "butcher", "janitor", "security guard",
        "receptionist", "secretary", "salesman", "manager", "veterinarian", "therapist",
        "social worker", "professor", "tutor", "translator", "dancer", "coach", "soldier",
        "sailor", "fisherman", "welder", "gardener", "florist", "surgeon", "paramedic",
        "lifeguard", "zookeeper", "data analyst", "economist", "cook", "student",
    ),
    "hobby": (
        "running", "swimming", "cycling", "reading", "painting", "drawing", "cooking", "baking",
        "gardening", "fishing", "camping", "dancing", "singing", "knitting", "sewing", "surfing",
        "skiing", "skateboarding", "yoga", "chess", "photography", "playing guitar",
        "playing piano", "playing video games", "watching movies", "bowling", "golf", "tennis",
        "soccer", "basketball", "volleyball", "rock climbing", "kayaking", "sailing", "boxing",
        "jogging", "woodworking", "bird watching", "traveling", "pottery", "meditation",
        "writing poetry", "collecting coins", "board games",
    ),
    "pet": (
        "dog", "cat", "hamster", "rabbit", "parrot", "turtle", "goldfish", "horse", "snake",
        "mouse", "rat", "puppy", "kitten", "bird", "fish", "bunny",
    ),
    "home": (
        "new york", "london", "paris", "chicago", "boston", "seattle", "texas", "california",
        "florida", "ohio", "toronto", "sydney", "berlin", "madrid", "rome", "tokyo", "dallas",
        "denver", "miami", "atlanta", "houston", "phoenix", "portland", "san francisco",
        "los angeles", "detroit", "vancouver", "montreal", "dublin", "manchester", "amsterdam",
        "vienna", "prague", "mexico city", "bangkok", "seoul", "mumbai", "delhi", "cairo",
        "lagos", "nairobi", "cape town", "lisbon", "athens", "oslo", "stockholm", "helsinki",
        "warsaw", "budapest", "moscow", "beijing", "shanghai", "singapore", "auckland",
        "melbourne", "brisbane", "kansas", "arizona", "michigan",
    ),
    "food": (
        "pizza", "pasta", "sushi", "tacos", "burgers", "steak", "salad", "soup", "ice cream",
        "chocolate", "pancakes", "ramen", "curry", "lasagna", "spaghetti", "fried chicken",
        "hot dogs", "burritos", "mac and cheese", "cheesecake", "apple pie", "cookies", "donuts",
        "bacon", "rice", "noodles", "fries", "sandwiches", "cheese", "barbecue", "dumplings",
        "waffles", "cupcakes", "popcorn", "shrimp", "lobster", "salmon", "meatballs",
    ),
}  # fmt: skip

# Made-up values, so that the model cannot learn the values by heart and has to copy them from
# the persona line. They are drawn from a large space on purpose: a word of the chitchat corpus
# (any of about 20,000, two of them for the kinds that often take two words) or a string of
# random letters, sometimes with a suffix of the kind. A first version joined two or three of 50
# syllables: the model then learnt to write syllables of that set instead of copying (recall
# 4.5%, docs/models.md), because a copy circuit trained on a hundred tokens does not carry over
# to the tokens of real names and places. Every token of the dictionary now turns up as a value.
MADE_UP_SUFFIXES: dict[str, tuple[str, ...]] = {
    "name": ("", "", "a", "o"),
    "job": (" maker", " keeper", "ist", "er", " technician", " inspector"),
    "hobby": ("ing", " dancing", " racing", "ball", " collecting"),
    "pet": ("", " bird", " lizard", " fish"),
    "home": ("", "ville", "ton", " city", "ia", " springs"),
    "food": ("", " stew", " pie", " soup", " cakes", "i"),
}
# Letters in roughly their English frequencies, for the random strings.
LETTERS = (
    "eeeeeeeeeeeettttttttaaaaaaaaoooooooiiiiiiinnnnnnnssssssrrrrrrhhhhhlllldddcccuuummmwwffggyy"
    "ppbbvkjxqz"
)
TWO_WORD_KINDS = ("home", "food", "job", "hobby")
# The probe set bench.persona measures with (bench/data/persona_probes_v1.json): its words are
# kept out of the made-up values, so the probe set never reaches the training data.
PROBE_FILE = Path(__file__).resolve().parents[2] / "bench" / "data" / "persona_probes_v1.json"


def probe_words(path: Path = PROBE_FILE) -> frozenset[str]:
    """Every word of the probe set's values (none when the file is not there)."""
    if not path.exists():
        return frozenset()
    values = json.loads(path.read_text(encoding="utf-8"))["values"]
    return frozenset(w for vs in values.values() for v in vs for w in v.lower().split())


def corpus_words(
    conversations: Iterable[tuple[str, Sequence[Sequence[str]]]], exclude: Iterable[str] = ()
) -> list[str]:
    """The made-up values' words: every word of 3-12 letters the conversations use at least
    twice (typos mostly once), without `exclude`, sorted."""
    counts: Counter[str] = Counter()
    for _, turns in conversations:
        for turn in turns:
            for message in turn:
                counts.update(re.findall(r"[a-z]+", message.lower()))
    banned = set(exclude)
    return sorted(w for w, c in counts.items() if c >= 2 and 3 <= len(w) <= 12 and w not in banned)


def made_up(
    kind: str, rng: random.Random, words: Sequence[str], exclude: frozenset[str] = frozenset()
) -> str:
    """A made-up value of `kind`: a corpus word (60%; two for some kinds a quarter of the time)
    or random letters (40%, and always when there are no words), with a suffix of the kind 30%
    of the time; drawn again while a word of it is in `exclude` ("art" + "ist" = "artist")."""
    while True:
        if words and rng.random() < 0.6:
            value = rng.choice(words)
            if kind in TWO_WORD_KINDS and rng.random() < 0.25:
                value += " " + rng.choice(words)
        else:
            value = "".join(rng.choice(LETTERS) for _ in range(rng.randint(4, 9)))
            if not re.search(r"[aeiouy]", value):
                continue
        if rng.random() < 0.3:
            value += rng.choice(MADE_UP_SUFFIXES[kind])
        if not exclude.intersection(value.split()):
            return value


# Persona line templates per kind ({v} the value, {a} its article "a"/"an").
PERSONA_TEMPLATES: dict[str, tuple[str, ...]] = {
    "name": ("my name is {v}.", "i am {v}.", "my name's {v}.", "everyone calls me {v}.",
             "i'm called {v}.", "they call me {v}.", "my first name is {v}.", "{v} is my name.",
             "i go by {v}."),
    "job": ("i work as {a} {v}.", "i am {a} {v}.", "my job is being {a} {v}.",
            "i'm {a} {v}.", "i have been {a} {v} for years.", "i'm employed as {a} {v}.",
            "by profession i am {a} {v}.", "i make a living as {a} {v}.", "my work: {v}."),
    "hobby": ("i love {v}.", "my hobby is {v}.", "i enjoy {v} in my free time.",
              "in my spare time i like {v}.", "i'm really into {v}.",
              "my favorite pastime is {v}.", "on weekends i love {v}.",
              "i spend my free time {v}."),
    "pet": ("i have {a} {v}.", "i own {a} {v}.", "i have a pet {v}.",
            "i have {a} {v} named {n}.", "my {v} is my best friend.", "i live with {a} {v}.",
            "i take care of {a} {v}.", "my pet {v} lives with me."),
    "home": ("i live in {v}.", "i am from {v}.", "my home is in {v}.", "i grew up in {v}.",
             "i'm from {v}.", "i was raised in {v}.", "my hometown is {v}.",
             "i currently live in {v}.", "home is {v}."),
    "food": ("my favorite food is {v}.", "i love eating {v}.", "i could eat {v} every day.",
             "{v} is my favorite food.", "my favourite food is {v}.", "i eat {v} all the time.",
             "nothing is better than {v}.", "{v} is my favourite dish.", "i often cook {v}."),
}  # fmt: skip

QUESTION_TEMPLATES: dict[str, tuple[str, ...]] = {
    "name": ("what is your name?", "what's your name?", "who are you?", "may i ask your name?",
             "what should i call you?", "tell me your name.", "hi! what's your name?",
             "what do people call you?", "and you are?", "can you tell me your name?",
             "what's ur name?", "what name do you go by?"),
    "job": ("what do you do for a living?", "what is your job?", "what do you do?",
            "what's your occupation?", "what kind of work do you do?", "do you work?",
            "what's your line of work?", "what do you work as?", "how do you make money?",
            "what's your career?", "what is your occupation?"),
    "hobby": ("what do you like to do for fun?", "what are your hobbies?",
              "what do you do in your free time?", "do you have any hobbies?",
              "what's your favorite thing to do?", "what do you enjoy doing?",
              "what do you do on weekends?", "how do you like to relax?", "any fun hobbies?"),
    "pet": ("do you have any pets?", "do you have a pet?", "what kind of pet do you have?",
            "any pets?", "do you like animals?", "do you own any animals?",
            "do you have a dog or a cat?", "what pets do you have?", "tell me about your pets."),
    "home": ("where do you live?", "where are you from?", "where is your home?",
             "where did you grow up?", "which city do you live in?", "where are you based?",
             "where do you live now?", "what's your hometown?", "where do you come from?"),
    "food": ("what is your favorite food?", "what do you like to eat?",
             "what's your favourite food?", "what food do you like?", "are you hungry?",
             "what's your favorite thing to eat?", "what is your favorite meal?",
             "what do you like for dinner?"),
}  # fmt: skip

ANSWER_TEMPLATES: dict[str, tuple[str, ...]] = {
    "name": ("my name is {v}.", "i'm {v}.", "i am {v}. nice to meet you!", "{v}. and you?",
             "my name is {v}. what is yours?", "hi, i'm {v}!"),
    "job": ("i work as {a} {v}.", "i'm {a} {v}.", "i am {a} {v}. what do you do?",
            "i'm {a} {v}. i love my job.", "i work as {a} {v}. how about you?"),
    "hobby": ("i love {v}.", "i really enjoy {v}.", "i like {v}. what about you?",
              "mostly {v}. do you have any hobbies?", "i love {v}! how about you?"),
    "pet": ("yes, i have {a} {v}.", "i have {a} {v}.", "yes! i have {a} {v}. do you have any?",
            "i have {a} {v}. i love animals.", "yes, {a} {v}."),
    "home": ("i live in {v}.", "i'm from {v}.", "i live in {v}. where are you from?",
             "{v}. how about you?", "i am from {v}."),
    "food": ("i love {v}.", "my favorite food is {v}.", "{v}! what about you?",
             "i could eat {v} every day.", "i really like {v}. what's yours?"),
}  # fmt: skip

GREETINGS = (
    ("hi!", "hi! how are you?"),
    ("hello", "hello! how are you doing today?"),
    ("hey, how are you?", "i'm good, thanks. how are you?"),
    ("good morning!", "good morning! how is your day going?"),
    ("hi there, how's it going?", "it's going well. how about you?"),
)
_PET_NAMES = ("max", "bella", "charlie", "lucy", "buddy", "daisy", "rocky", "molly")


def article(value: str) -> str:
    """'an' before a vowel sound (roughly: a vowel letter), else 'a'."""
    return "an" if value[:1] in "aeiou" else "a"


def fill(template: str, value: str, rng: random.Random) -> str:
    return template.format(v=value, a=article(value), n=rng.choice(_PET_NAMES))


@dataclass(frozen=True)
class PersonaRecipe:
    """The knobs of stage 2: data mix and optimisation of the persona fine-tune."""

    minutes: float = 45.0
    learning_rate: float = 3e-3
    warmup_updates: int = 100
    # Synthetic question-answer turns, and template personas before chitchat examples.
    qa_examples: int = 350_000
    # Share of chitchat examples that also come with template persona lines the label ignores.
    persona_chitchat_rate: float = 0.2
    # Share of chitchat labels with a first-person sentence that also get a grounded example.
    grounded_rate: float = 0.5
    greeting_rate: float = 0.3
    # Share of template values that are made up (made_up), so that copying is the only way.
    made_up_rate: float = 0.9
    # Decoding: ParlAI's context blocking (3) bans every 3 tokens of the context from the reply,
    # persona lines included, and a name is 2-6 tokens of the 8,000-symbol dictionary, so a
    # stated fact ("my name is sar@@ ah") is blocked by construction. Off for the persona model.
    beam_context_block_ngram: int = -1
    # Decoding: the first 5 tokens sampled from the top 10 (stage 1: 3), then beam search. The
    # fine-tuned model's beam settles on a few safe replies ("I'm not sure.", "I don't know.");
    # with 5 sampled tokens bench.persona found 85.5% distinct replies to 200 held-out chat
    # messages against 67.0% with 3 and stage 1's 80.0%, at 53.4% persona recall against 56.7%
    # (docs/models.md).
    beam_delay: int = 5
    seed: int = 7


DEFAULT_PERSONA_RECIPE = PersonaRecipe()


@dataclass(frozen=True)
class Values:
    """Where a template persona's values come from: a share `made_up_rate` made up (`made_up`,
    from `words` and random letters, never one of `exclude`), the others from TRAIN_VALUES."""

    words: Sequence[str] = ("window", "garden", "river", "candle", "pepper", "marble")
    made_up_rate: float = 0.9
    exclude: frozenset[str] = frozenset()

    def draw(self, kind: str, rng: random.Random) -> str:
        if rng.random() < self.made_up_rate:
            return made_up(kind, rng, self.words, self.exclude)
        return rng.choice(TRAIN_VALUES[kind])


def template_persona(
    rng: random.Random, kinds: Sequence[str], values: Values = Values()
) -> dict[str, tuple[str, str]]:
    """kind -> (value, persona line) for each of `kinds` (values from `values`)."""
    out: dict[str, tuple[str, str]] = {}
    for kind in kinds:
        value = values.draw(kind, rng)
        out[kind] = (value, fill(rng.choice(PERSONA_TEMPLATES[kind]), value, rng))
    return out


def qa_turn(
    rng: random.Random, values: Values = Values(), greeting_rate: float = 0.3
) -> tuple[Example, str, str]:
    """One synthetic turn: 1-4 persona lines, a question about one of them, its answer; with
    the asked kind and value."""
    kinds = rng.sample(KINDS, k=rng.choice((1, 2, 2, 3, 3, 4)))
    persona = template_persona(rng, kinds, values)
    asked = rng.choice(kinds)
    value = persona[asked][0]
    lines = [PERSONA_PREFIX + line for _, line in persona.values()]
    turns: list[str] = []
    if rng.random() < greeting_rate:
        turns += list(rng.choice(GREETINGS))
    turns.append(rng.choice(QUESTION_TEMPLATES[asked]))
    label = fill(rng.choice(ANSWER_TEMPLATES[asked]), value, rng)
    return Example("\n".join(lines + turns), label), asked, value


def qa_example(
    rng: random.Random, values: Values = Values(), greeting_rate: float = 0.3
) -> Example:
    """One synthetic question-answer turn (qa_turn)."""
    return qa_turn(rng, values, greeting_rate)[0]


# The dialogue of a persona example is cut to its last words: ParlAI's training truncation keeps
# the end of the text, so persona lines before a long dialogue would be cut off, where the
# service pins them (bot/inference/persona.py).
DIALOGUE_WORDS = 45


def tail_words(text: str, n: int = DIALOGUE_WORDS) -> str:
    """The last `n` words of `text` (its line breaks kept)."""
    words = text.replace("\n", " \n ").split(" ")
    kept: list[str] = []
    count = 0
    for word in reversed(words):
        if word and word != "\n":
            count += 1
            if count > n:
                break
        kept.append(word)
    return " ".join(reversed(kept)).replace(" \n ", "\n").strip()


def persona_chitchat(example: Example, rng: random.Random, values: Values = Values()) -> Example:
    """A chitchat example with 1-3 template persona lines in front (the label ignores them)."""
    kinds = rng.sample(KINDS, k=rng.choice((1, 2, 3)))
    persona = template_persona(rng, kinds, values)
    lines = [PERSONA_PREFIX + line for _, line in persona.values()]
    return Example("\n".join([*lines, tail_words(example.text)]), example.label)


def grounded_examples(
    turns: Sequence[Sequence[str]], rng: random.Random, rate: float, context_turns: int = 2
) -> list[Example]:
    """Chitchat examples whose persona line is a first-person sentence of the label itself,
    beside at most one other sentence of the same speaker: the label restates the persona."""
    from bot.training.data import _join

    texts = [_join(turn) for turn in turns]
    own = [persona_candidates(turns, 0), persona_candidates(turns, 1)]
    out: list[Example] = []
    for i in range(1, len(texts)):
        label = texts[i]
        if len(label.split()) > 30:
            continue
        in_label = [s for s in own[i % 2] if s in label]
        if not in_label or rng.random() >= rate:
            continue
        picked = [rng.choice(in_label)]
        others = [s for s in own[i % 2] if s not in label]
        if others and rng.random() < 0.5:
            picked.append(rng.choice(others))
        rng.shuffle(picked)
        context = tail_words("\n".join(texts[max(0, i - context_turns) : i]))
        out.append(Example("\n".join([PERSONA_PREFIX + s for s in picked] + [context]), label))
    return out


@dataclass
class PersonaDataStats:
    """What stage 2's conversion produced, by source."""

    chitchat: int = 0
    grounded: int = 0
    persona_chitchat: int = 0
    qa: int = 0
    valid: int = 0


def write_persona_dataset(
    directory: Path,
    conversations: Iterable[tuple[str, list[list[str]]]],
    persona: PersonaRecipe = DEFAULT_PERSONA_RECIPE,
    recipe: Recipe = DEFAULT_RECIPE,
    exclude: frozenset[str] | None = None,
) -> PersonaDataStats:
    """Stage 2's `chitchat_{train,valid,test}.txt`: stage 1's examples and held-out split
    (valid is exactly stage 1's), plus grounded, persona-chitchat and question-answer examples
    in the training split, shuffled. Made-up values never use a word of `exclude` (by default
    the probe set's, `probe_words`)."""
    from bot.training.data import write_dataset

    conversations = list(conversations)
    banned = probe_words() if exclude is None else exclude
    values = Values(corpus_words(conversations, banned), persona.made_up_rate, banned)
    rng = random.Random(persona.seed)
    plain = replace(recipe, persona_rate=0.0)
    stats = PersonaDataStats()

    def extra(turns: Sequence[Sequence[str]]) -> list[Example]:
        grounded = grounded_examples(turns, rng, persona.grounded_rate, recipe.context_turns)
        chit = [
            persona_chitchat(e, rng, values)
            for e in make_examples(turns, rng, plain)
            if rng.random() < persona.persona_chitchat_rate
        ]
        stats.grounded += len(grounded)
        stats.persona_chitchat += len(chit)
        return grounded + chit

    data = write_dataset(directory, conversations, recipe, extra=extra)
    train_file = directory / "chitchat_train.txt"
    lines = train_file.read_text(encoding="utf-8").splitlines()
    stats.chitchat = data.train_examples - stats.grounded - stats.persona_chitchat
    lines += [
        to_parlai_line(qa_example(rng, values, persona.greeting_rate))
        for _ in range(persona.qa_examples)
    ]
    stats.qa = persona.qa_examples
    stats.valid = data.valid_examples
    rng.shuffle(lines)
    train_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return stats
