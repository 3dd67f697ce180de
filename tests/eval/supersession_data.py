"""The labelled knowledge-update set (issue 26 §1), generated from templates, deterministically,
and checked in as ``tests/eval/data/supersession.jsonl`` (``python -m tests.eval.supersession_data``
rewrites it; a unit test holds the file equal to what this module generates).

Each line is one pair of texts of one owner, the older first:

- ``label: "update"`` — the newer text updates or contradicts the older (a place, an employer, a
  role, a favourite, a preference, a tool, a diet, a relationship, a plan, a time zone, a procedure
  that needs another step, a negated fact), with a ``question`` about the current state and the
  ``past`` question that asks for history;
- ``label: "lookalike"`` — it does not, though it looks alike: another subject (a relative, another
  person), another attribute, the same value said again, an addition to a multi-valued attribute,
  an event rather than a state, a change word about something else, another procedure, a negation
  of another thing, a plan not yet made.

Phrasings vary on purpose, some beyond what the offline rules read ("packed up and left Boston for
Seattle"), so recall measures the rules and not the templates they were tuned on.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["DATA", "Pair", "generate", "load"]

DATA = Path(__file__).parent / "data" / "supersession.jsonl"
SEED = 26
PER_CATEGORY = 20

NAMES = (
    "Alice", "Bob", "Priya", "Diego", "Mei", "Omar", "Hana", "Lukas", "Sofia", "Kwame", "Ines", "Raj",
    "Yuki", "Carlos", "Amara", "Tomas", "Leila", "Noah", "Zara", "Emil", "Fatima", "Jonas",
)  # fmt: skip
CITIES = (
    "Boston", "Seattle", "Denver", "Lisbon", "Berlin", "Osaka", "Nairobi", "Toronto", "Austin",
    "Madrid", "Oslo", "Dublin", "Chicago", "Portland", "Melbourne", "Prague", "Montreal", "Accra",
)  # fmt: skip
COMPANIES = (
    "Acme", "Globex", "Initech", "Umbrella Labs", "Stark Industries", "Wayne Logistics", "Hooli",
    "Vandelay Imports", "Cyberdyne", "Soylent Foods", "Tyrell Systems", "Massive Dynamic",
)  # fmt: skip
ROLES = (
    "junior developer", "senior engineer", "team lead", "engineering manager", "product designer",
    "data analyst", "staff engineer", "support specialist", "director of operations",
)  # fmt: skip
FAVORITES = {
    "color": ("blue", "green", "orange", "purple", "red", "teal"),
    "food": ("pizza", "ramen", "tacos", "sushi", "curry", "paella"),
    "band": ("Radiohead", "ABBA", "Queen", "Daft Punk", "Metallica", "Bjork"),
    "sport": ("tennis", "soccer", "climbing", "rowing", "cricket", "judo"),
    "book": ("Dune", "Emma", "Beloved", "Ulysses", "Middlemarch", "Neuromancer"),
}
PREFERENCES = (
    ("dark", "light", "mode"),
    ("window", "aisle", "seats"),
    ("morning", "afternoon", "meetings"),
    ("email", "phone", "updates"),
    ("light", "dark", "roast coffee"),
    ("short", "detailed", "answers"),
    ("weekly", "daily", "reports"),
)
TOOLS = (
    ("VS Code", "Vim", "editor"),
    ("Firefox", "Chrome", "browser"),
    ("a ThinkPad", "a MacBook", "laptop"),
    ("an iPhone", "a Pixel", "phone"),
    ("Emacs", "Neovim", "editor"),
)
FOODS = ("meat", "dairy", "gluten", "sugar", "coffee", "alcohol", "fish")
PLANS = ("Free", "Starter", "Pro", "Team", "Enterprise")
ZONES = ("UTC", "CET", "PST", "EST", "JST", "IST")
HOBBIES = ("hiking", "chess", "painting", "cycling", "baking", "jazz", "gardening", "yoga")
LANGUAGES = ("Spanish", "French", "Japanese", "German", "Swahili", "Portuguese")
RELATIVES = ("sister", "brother", "manager", "roommate", "father", "cousin")
SERVICES = ("billing", "search", "auth", "checkout", "reporting", "inbox")
ALLERGENS = ("peanuts", "penicillin", "shellfish", "cats", "pollen", "latex")


@dataclass(frozen=True)
class Pair:
    id: str
    label: str  # "update" | "lookalike"
    category: str
    old: str
    new: str
    #: a question about the current state (updates): the new entry should rank first
    question: str | None = None
    #: a question about the past (updates): the old entry should still be reachable
    past: str | None = None


def _v(s: str, verb: str) -> str:
    """``verb`` agreeing with ``s`` ("I live", "Alice lives")."""
    if s == "I":
        return verb
    return verb[:-1] + "ies" if verb.endswith("y") else verb + "s"


def _person(rng: random.Random) -> tuple[str, str, str, str]:
    """(subject, possessive, pronoun possessive, question subject): a name, or the owner as "I"."""
    if rng.random() < 0.2:
        return "I", "My", "my", "I"
    name = rng.choice(NAMES)
    return name, f"{name}'s", rng.choice(("her", "his", "their")), name


def _does(q: str) -> str:
    return "do" if q == "I" else "does"


def _two(rng: random.Random, pool: tuple[str, ...]) -> tuple[str, str]:
    a, b = rng.sample(pool, 2)
    return a, b


Maker = Callable[[random.Random], tuple[str, str, str | None, str | None]]


def _residence(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    s, poss, _, q = _person(rng)
    a, b = _two(rng, CITIES)
    be = "am" if s == "I" else "is"
    old = rng.choice((f"{s} {_v(s, 'live')} in {a}.", f"{s} {be} based in {a}.", f"{poss} home is in {a}."))
    new = rng.choice(
        (
            f"{s} moved to {b}.",
            f"{s} now {_v(s, 'live')} in {b}.",
            f"{s} relocated to {b} last month.",
            f"{s} {be} now based in {b}.",
            f"{poss} new address is in {b}.",
            f"{s} packed up and left {a} for {b}.",
        )
    )
    return old, new, f"Where {_does(q)} {q} live?", f"Where did {q} live before {b}?"


def _employer(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    s, poss, _, q = _person(rng)
    a, b = _two(rng, COMPANIES)
    be = "am" if s == "I" else "is"
    old = rng.choice(
        (f"{s} {_v(s, 'work')} at {a}.", f"{s} {be} employed by {a}.", f"{poss} employer is {a}.")
    )
    new = rng.choice(
        (
            f"{s} now {_v(s, 'work')} at {b}.",
            f"{s} joined {b}.",
            f"{s} left {a} and {_v(s, 'work')} for {b} now.",
            f"{poss} new employer is {b}.",
            f"{s} accepted an offer from {b} and starts there on Monday.",
        )
    )
    return old, new, f"Where {_does(q)} {q} work?", f"Where did {q} work before {b}?"


def _role(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    s, poss, _, q = _person(rng)
    a, b = _two(rng, ROLES)
    old = rng.choice(
        (f"{poss} job title is {a}.", f"{poss} role is {a}.", f"{s} {_v(s, 'hold')} the title {a}.")
    )
    new = rng.choice(
        (f"{s} was promoted to {b}.", f"{poss} role is now {b}.", f"{poss} title changed to {b}.")
    )
    qp = "my" if q == "I" else f"{q}'s"
    return old, new, f"What is {qp} job title?", f"What was {qp} role before the change?"


def _favorite(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    s, poss, _, q = _person(rng)
    pp = "my" if s == "I" else "their"
    kind = rng.choice(sorted(FAVORITES))
    a, b = _two(rng, FAVORITES[kind])
    old = rng.choice((f"{poss} favorite {kind} is {a}.", f"{poss} favourite {kind} is {a}."))
    new = rng.choice(
        (
            f"{poss} favorite {kind} is now {b}.",
            f"These days {poss.lower() if s == 'I' else poss} favorite {kind} is {b}.",
            f"{s} {'say' if s == 'I' else 'says'} {b} has become {pp} favorite {kind}.",
        )
    )
    qp = "my" if q == "I" else f"{q}'s"
    return old, new, f"What is {qp} favorite {kind}?", f"What was {qp} favorite {kind} before?"


def _preference(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    s, _, _, q = _person(rng)
    a, b, head = rng.choice(PREFERENCES)
    verb = "prefer" if s == "I" else "prefers"
    old = f"{s} {verb} {a} {head}."
    new = rng.choice(
        (
            f"{s} now {verb} {b} {head}.",
            f"{s} switched from {a} {head} to {b} {head}.",
            f"{s} no longer {'prefers' if s != 'I' else 'prefer'} {a} {head} and wants {b} {head} instead.",
            f"{s} would rather have {b} {head} from now on.",
        )
    )
    return old, new, f"What {head} {_does(q)} {q} prefer?", f"What {head} did {q} prefer before?"


def _usage(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    s, _, pp, q = _person(rng)
    a, b, head = rng.choice(TOOLS)
    pp = "my" if s == "I" else pp
    verb = "use" if s == "I" else "uses"
    old = f"{s} {verb} {a} as {pp} {head}."
    new = rng.choice(
        (
            f"{s} switched to {b} as {pp} {head}.",
            f"{s} now {verb} {b} as {pp} {head}.",
            f"{s} replaced {a} with {b}.",
        )
    )
    return old, new, f"Which {head} {_does(q)} {q} use?", f"Which {head} did {q} use before?"


def _diet(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    s, _, _, q = _person(rng)
    food = rng.choice(FOODS)
    verb = {"coffee": "drink", "alcohol": "drink"}.get(food, "eat")
    third = verb + "s" if s != "I" else verb
    old = f"{s} {third} {food}."
    new = rng.choice(
        (
            f"{s} no longer {third} {food}.",
            f"{s} {'doesn' if s != 'I' else 'don'}'t {verb} {food} anymore.",
            f"{s} stopped {verb}ing {food}.",
            f"{s} gave up {food} this year.",
        )
    )
    return old, new, f"{_does(q).capitalize()} {q} {verb} {food}?", f"Did {q} {verb} {food} in the past?"


def _relationship(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    s, _, _, q = _person(rng)
    partner = rng.choice([n for n in NAMES if n != s])
    be = "am" if s == "I" else "is"
    old, new = rng.choice(
        (
            (f"{s} {be} single.", f"{s} {be} now engaged to {partner}."),
            (f"{s} {be} dating {partner}.", f"{s} {be} now married to {partner}."),
            (f"{s} {be} married.", f"{s} {be} divorced now."),
        )
    )
    return old, new, f"What is {'my' if q == 'I' else q + chr(39) + 's'} relationship status?", None


def _plan(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    s, poss, _, q = _person(rng)
    a, b = _two(rng, PLANS)
    be = "am" if s == "I" else "is"
    old = rng.choice((f"{s} {be} on the {a} plan.", f"{poss} subscription is the {a} plan."))
    new = rng.choice(
        (f"{s} upgraded to the {b} plan.", f"{poss} plan is now {b}.", f"{s} moved to the {b} tier.")
    )
    return old, new, f"Which plan is {q} on?", f"Which plan was {q} on before?"


def _timezone(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    _, poss, _, q = _person(rng)
    a, b = _two(rng, ZONES)
    old = f"{poss} time zone is {a}."
    new = rng.choice((f"{poss} time zone is now {b}.", f"{poss} timezone changed to {b}."))
    qp = "my" if q == "I" else f"{q}'s"
    return old, new, f"What is {qp} time zone?", f"What was {qp} time zone before?"


def _procedure(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    svc = rng.choice(SERVICES)
    old, new = rng.choice(
        (
            (
                f"To deploy the {svc} service, run make build and then make push.",
                f"To deploy the {svc} service, now also run make test before make push.",
            ),
            (
                f"To rotate the {svc} API key, open the admin console and click rotate.",
                f"To rotate the {svc} API key, you must now also confirm with a second admin.",
            ),
            (
                f"When the {svc} job fails, restart it from the dashboard.",
                f"When the {svc} job fails, first clear the queue, then restart it from the dashboard.",
            ),
            (
                f"To release the {svc} client, tag the commit and push the tag.",
                f"To release the {svc} client, tag the commit and push the tag; publishing to npm is "
                "now an extra required step.",
            ),
        )
    )
    goal = old.split(",")[0][0].lower() + old.split(",")[0][1:]
    return old, new, f"What are the steps {goal}?", f"How did we {goal.split(' ', 1)[1]} before?"


def _allergy(rng: random.Random) -> tuple[str, str, str | None, str | None]:
    s, _, _, q = _person(rng)
    thing = rng.choice(ALLERGENS)
    be, neg = ("am", "am not") if s == "I" else ("is", "is not")
    old = f"{s} {be} allergic to {thing}."
    new = rng.choice(
        (f"{s} {neg} allergic to {thing} after all.", f"{s} {be} no longer allergic to {thing}.")
    )
    return old, new, f"{be.capitalize() if s != 'I' else 'Am'} {q} allergic to {thing}?", None


UPDATES: dict[str, Maker] = {
    "residence": _residence,
    "employer": _employer,
    "role": _role,
    "favorite": _favorite,
    "preference": _preference,
    "usage": _usage,
    "diet": _diet,
    "relationship": _relationship,
    "plan": _plan,
    "timezone": _timezone,
    "procedure": _procedure,
    "allergy": _allergy,
}


def _other_person(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(NAMES, 2)
    return a, b


def _l_other_subject(rng: random.Random) -> tuple[str, str]:
    a, b = _other_person(rng)
    x, y = _two(rng, CITIES)
    c, d = _two(rng, COMPANIES)
    return rng.choice(
        (
            (f"{a} lives in {x}.", f"{b} moved to {y}."),
            (f"{a} works at {c}.", f"{b} now works at {d}."),
            (f"{a}'s favorite color is blue.", f"{b}'s favorite color is now green."),
            (f"{a} is on the Pro plan.", f"{b} upgraded to the Team plan."),
        )
    )


def _l_relative(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(NAMES)
    rel = rng.choice(RELATIVES)
    x, y = _two(rng, CITIES)
    c, d = _two(rng, COMPANIES)
    return rng.choice(
        (
            (f"{s} lives in {x}.", f"{s}'s {rel} moved to {y}."),
            (f"{s} works at {c}.", f"{s}'s {rel} now works at {d}."),
            (f"I live in {x}.", f"My {rel} lives in {y}."),
            (f"{s}'s favorite food is ramen.", f"{s}'s {rel} says tacos are now their favorite food."),
        )
    )


def _l_other_attribute(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(NAMES)
    x = rng.choice(CITIES)
    c = rng.choice(COMPANIES)
    k1, k2 = _two(rng, tuple(sorted(FAVORITES)))
    return rng.choice(
        (
            (f"{s} lives in {x}.", f"{s} works at {c}."),
            (f"{s}'s favorite {k1} is {FAVORITES[k1][0]}.", f"{s}'s favorite {k2} is {FAVORITES[k2][1]}."),
            (f"{s} works at {c}.", f"{s}'s time zone is now CET."),
            (f"{s} is on the Pro plan.", f"{s} moved to {x}."),
        )
    )


def _l_restated(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(NAMES)
    x = rng.choice(CITIES)
    c = rng.choice(COMPANIES)
    return rng.choice(
        (
            (f"{s} lives in {x}.", f"{s}'s home is in {x}."),
            (f"{s} works at {c}.", f"{s} is employed by {c}."),
            (f"{s} is based in {x}.", f"{s} lives in {x}."),
            (f"{s} is on the Pro plan.", f"{s}'s subscription is the Pro plan."),
        )
    )


def _l_additive(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(NAMES)
    h1, h2 = _two(rng, HOBBIES)
    l1, l2 = _two(rng, LANGUAGES)
    return rng.choice(
        (
            (f"{s} likes {h1}.", f"{s} also likes {h2}."),
            (f"{s} speaks {l1}.", f"{s} also speaks {l2}."),
            (f"{s} enjoys {h1}.", f"{s} enjoys {h2} too."),
            (f"{s} uses Slack for chat.", f"{s} also uses Zoom for calls."),
        )
    )


def _l_detail(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(NAMES)
    x = rng.choice(CITIES)
    c = rng.choice(COMPANIES)
    return rng.choice(
        (
            (f"{s} lives in {x}.", f"{s} lives in {x} with a dog named Rex."),
            (f"{s} works at {c}.", f"{s} works at {c} on the payments team."),
            (f"{s} lives in {x}.", f"{s} has lived in {x} for six years."),
        )
    )


def _l_event(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(NAMES)
    x, y = _two(rng, CITIES)
    c, d = _two(rng, COMPANIES)
    return rng.choice(
        (
            (f"{s} lives in {x}.", f"{s} visited {y} last week."),
            (f"{s} lives in {x}.", f"{s} flew to {y} for a conference."),
            (f"{s} works at {c}.", f"{s} had a meeting with {d} yesterday."),
            (f"{s} works at {c}.", f"{s} might interview at {d} next year."),
        )
    )


def _l_unrelated_change(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(NAMES)
    (a, _, h1), (_, b, h2) = rng.sample(PREFERENCES, 2)
    (t1, _, k1), (_, t2, k2) = rng.sample([t for t in TOOLS if t[2] != "editor"] + [TOOLS[0]], 2)
    return rng.choice(
        (
            (f"{s} prefers {a} {h1}.", f"{s} now prefers {b} {h2}."),
            (f"{s} uses {t1} as their {k1}.", f"{s} now uses {t2} as their {k2}."),
            (f"{s} likes {rng.choice(HOBBIES)}.", f"{s} recently started {rng.choice(HOBBIES)} lessons."),
        )
    )


def _l_other_procedure(rng: random.Random) -> tuple[str, str]:
    a, b = _two(rng, SERVICES)
    return rng.choice(
        (
            (
                f"To deploy the {a} service, run make build and then make push.",
                f"To deploy the {b} service, now also run make test before make push.",
            ),
            (
                f"To deploy the {a} service, run make build and then make push.",
                f"To roll back the {a} service, now run make rollback first.",
            ),
            (
                f"When the {a} job fails, restart it from the dashboard.",
                f"When the {a} job succeeds, now also post a note in the channel.",
            ),
        )
    )


def _l_other_negation(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(NAMES)
    f1, f2 = _two(rng, ("meat", "dairy", "gluten", "sugar", "fish"))
    al1, al2 = _two(rng, ALLERGENS)
    return rng.choice(
        (
            (f"{s} eats {f1}.", f"{s} doesn't eat {f2}."),
            (f"{s} is allergic to {al1}.", f"{s} is not allergic to {al2}."),
            (f"{s} likes {rng.choice(HOBBIES)}.", f"{s} does not like crowded places."),
        )
    )


def _l_question(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(NAMES)
    x, y = _two(rng, CITIES)
    c, d = _two(rng, COMPANIES)
    return rng.choice(
        (
            (f"{s} lives in {x}.", f"{s} is thinking about a trip to {y}."),
            (f"{s} works at {c}.", f"{s} asked whether {d} is hiring."),
            (f"{s} lives in {x}.", f"{s} wonders what living in {y} would cost."),
        )
    )


def _l_same_value_other_words(rng: random.Random) -> tuple[str, str]:
    s = rng.choice(NAMES)
    a, _, head = rng.choice(PREFERENCES)
    t, _, k = rng.choice(TOOLS)
    return rng.choice(
        (
            (f"{s} prefers {a} {head}.", f"{s} really prefers {a} {head}."),
            (f"{s} uses {t} as their {k}.", f"{s} still uses {t} as their {k}."),
            (f"{s} eats fish.", f"{s} eats fish on Fridays."),
        )
    )


LOOKALIKES: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "other_subject": _l_other_subject,
    "relative": _l_relative,
    "other_attribute": _l_other_attribute,
    "restated": _l_restated,
    "additive": _l_additive,
    "added_detail": _l_detail,
    "event": _l_event,
    "unrelated_change": _l_unrelated_change,
    "other_procedure": _l_other_procedure,
    "other_negation": _l_other_negation,
    "question": _l_question,
    "same_value": _l_same_value_other_words,
}


def generate() -> Iterator[Pair]:
    """Every pair, in a fixed order: updates then look-alikes, ``PER_CATEGORY`` of each category
    (distinct pairs; the random source is seeded)."""
    rng = random.Random(SEED)
    for category, make in UPDATES.items():
        seen: set[tuple[str, str]] = set()
        while len(seen) < PER_CATEGORY:
            old, new, question, past = make(rng)
            if (old, new) in seen:
                continue
            seen.add((old, new))
            yield Pair(f"u-{category}-{len(seen):02d}", "update", category, old, new, question, past)
    for category, make_l in LOOKALIKES.items():
        seen = set()
        while len(seen) < PER_CATEGORY:
            old, new = make_l(rng)
            if (old, new) in seen:
                continue
            seen.add((old, new))
            yield Pair(f"l-{category}-{len(seen):02d}", "lookalike", category, old, new)


def render() -> str:
    return "".join(json.dumps(asdict(p), sort_keys=True) + "\n" for p in generate())


def load(path: Path = DATA) -> list[Pair]:
    """The checked-in pairs."""
    return [Pair(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    DATA.parent.mkdir(parents=True, exist_ok=True)
    DATA.write_text(render())
    pairs = load()
    print(
        f"{DATA}: {sum(p.label == 'update' for p in pairs)} updates, "
        f"{sum(p.label == 'lookalike' for p in pairs)} look-alikes"
    )
