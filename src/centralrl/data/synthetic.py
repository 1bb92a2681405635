"""An invented multi-hop world: entities with typed facts, one passage per entity, and six question types.

`generate(cfg)` builds people, cities, countries, universities, companies and films whose names are made of
invented syllables ("Varnel Okosi", "Telmarra", "Oshvania", "Dravin Institute", "Kelto Pictures", "The Velmar
Gate"), so no language model can answer from memory and every answer has to be retrieved. Everything derives
from `cfg.seed`; the same config gives the same lists in the same order.

How it mimics the real benchmarks:
- MuSiQue: `2hop`/`3hop`/`4hop` questions are chains of single-hop facts, each hop held by a different passage,
  composed into one question ("In which country was the founder of the company that produced The Velmar Gate
  born?") and shipped with the single-hop decomposition, where each sub-question names the previous answer.
- HotpotQA: `comparison` asks which of two entities of one type came first or later ("Which film was released
  first, A or B?"); the answer is one of the two names.
- 2WikiMultiHopQA: questions come from templates over typed relations, and `bridge_comparison` compares two
  entities through a bridge entity ("Which film has the director who was born earlier, A or B?").

Where it departs from them:
- Passages are template prose, one Wikipedia-style passage per entity, each stating only its own facts
  (the symmetric marriage, and a country's capital, are stated on both sides); real paragraphs are written by
  people and state facts about many entities.
- Hard distractors are built in: a `lookalike_fraction` share of entities have a twin whose name differs by
  one or two letters and whose facts differ, and each passage carries `distractor_sentences` sentences that
  name other entities without stating any asked fact about them. The real benchmarks draw distractors from
  retrieval over Wikipedia instead.
- Every answer is a span (a name or a year); there are no yes/no questions ("Are X and Y from the same
  country?"), no unanswerable contrast questions (MuSiQue-Full) and no date arithmetic.
- Chains only follow functional relations, so every question has exactly one answer; no ties in comparisons.
  A chain whose later passages name its start is not asked (the spouse's passage names the person: "where was
  the spouse of X born" is found by searching X), and distractor sentences never name an entity within two
  facts (a film's passage naming its company's founder would answer "who founded its production company").
- Train and test share one world but no fact: no training question asks a fact (a sub-question of its
  decomposition) that a test question asks, so no test fact is a training target. A fact linking two entities
  is one fact whichever way it is asked: a marriage, stated in both spouses' passages, from either side (the
  only fact the world asks both ways; before, the default asked 2 marriages from one side in test and from the
  other in training). Answers may still recur (a city is many people's birthplace: 10 of the default's 23 distinct test
  answers answer other training facts).
- The decomposition of a comparison ends with a step that compares the two found values and needs no passage.

Details: the `n_*` sizes count twins (a `lookalike_fraction` f gives round(f * n / 2) twin pairs per type).
Golden answers are the name, plus a person's surname and a country's official name ("Republic of Oshvania")
where no other entity uses them; years are strings. The test questions of every type are drawn first (one
relation path after another, for variety), then the training questions; both are listed by type in the order
of QUESTION_TYPES.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import combinations, islice

from centralrl.config import SyntheticConfig
from centralrl.errors import DataError
from centralrl.schema import Passage, Question, SubQuestion

QUESTION_TYPES = ("1hop", "2hop", "3hop", "4hop", "comparison", "bridge_comparison")
CHAIN_HOPS = {"1hop": 1, "2hop": 2, "3hop": 3, "4hop": 4}
KINDS = ("country", "city", "university", "person", "company", "film")
SIZE_FIELDS = {  # the cfg sizes that add questions of each type, named in the "world too small" error
    "1hop": "n_people, n_cities, n_universities, n_companies, n_films",
    "2hop": "n_people, n_films, n_companies",
    "3hop": "n_people, n_films, n_companies",
    "4hop": "n_people, n_films, n_companies",
    "comparison": "n_people, n_films, n_companies, n_universities",
    "bridge_comparison": "n_films, n_companies, n_people",
}

Ref = tuple[str, int]  # (kind, index) of an entity
Value = Ref | int  # a fact's value: an entity or a year
Fact = frozenset[str] | str  # what a sub-question asks, as train/test disjointness compares it (`_fact`)

# --- names -------------------------------------------------------------------------------------------------

ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "gr",
    "kr",
    "tr",
    "th",
    "sh",
    "st",
)
SINGLE_ONSETS = tuple(onset for onset in ONSETS if len(onset) == 1)
VOWELS = ("a", "e", "i", "o", "u")
CODAS = ("", "", "", "", "n", "r", "l", "s", "m", "sh")
# Invented words containing these are rejected: real words that would read as offensive or as real names.
BLOCKED = (
    "penis",
    "anal",
    "anus",
    "cum",
    "sex",
    "nazi",
    "rape",
    "shit",
    "fuck",
    "cock",
    "dick",
    "tit",
    "porn",
    "slut",
    "whore",
    "hore",
    "kill",
    "koran",
    "bible",
    "jesu",
    "allah",
    "satan",
    "nig",
    "fag",
    "kike",
    "spic",
    "coon",
    "pis",
    "poo",
    "pee",
    "butt",
    "ass",
    "bum",
    "fart",
    "homo",
    "gay",
    "lesb",
    "dildo",
    "vagin",
    "boob",
    "nude",
    "hitler",
)
SIMILAR_CONSONANTS = {
    "n": "m",
    "m": "n",
    "r": "l",
    "l": "r",
    "k": "g",
    "g": "k",
    "t": "d",
    "d": "t",
    "s": "z",
    "z": "s",
    "v": "f",
    "f": "v",
    "b": "p",
    "p": "b",
}

CITY_SUFFIXES = ("", "", "", "a", "ra", "mar", "dor", "holm")
COUNTRY_SUFFIXES = ("ia", "ania", "onia", "avia", "aria")
OFFICIAL_FORMS = (
    "",
    "",
    "Republic of {n}",
    "Kingdom of {n}",
    "Federation of {n}",
    "Grand Duchy of {n}",
    "Commonwealth of {n}",
)
UNIVERSITY_PATTERNS = (
    "{w} Institute",
    "{w} University",
    "University of {w}",
    "{w} College",
    "{w} Academy",
    "{w} Polytechnic",
)
COMPANY_SUFFIXES = {  # name suffix -> industry
    "Pictures": "film production",
    "Studios": "film production",
    "Films": "film production",
    "Productions": "film production",
    "Media": "media",
    "Entertainment": "entertainment",
    "Group": "media",
    "Holdings": "holding",
}
FILM_NOUNS = (
    "Gate",
    "Tide",
    "Lantern",
    "Crown",
    "Harbour",
    "Orchard",
    "Winter",
    "Mirror",
    "Bridge",
    "Garden",
    "Road",
    "Falcon",
    "River",
    "Lighthouse",
    "Ember",
    "Silence",
)
FILM_PATTERNS = (
    "The {w} {noun}",
    "{w}'s {noun}",
    "The {noun} of {w}",
    "{noun} over {w}",
    "Return to {w}",
    "The Last {noun} of {w}",
)
GENRES = ("drama", "thriller", "comedy", "science fiction", "historical drama", "mystery", "war", "romance")
OCCUPATIONS = (
    "architect",
    "novelist",
    "physician",
    "historian",
    "engineer",
    "painter",
    "economist",
    "chemist",
    "journalist",
    "composer",
)
KIND_WORDS = {"city": "city", "country": "country", "university": "institution", "company": "company", "film": "film"}

# --- prose -------------------------------------------------------------------------------------------------

FLAVOR = {  # one sentence per passage that names no entity
    "country": (
        "Its landscape is dominated by high plateaus.",
        "It is known for its terraced vineyards.",
        "Most of its population lives along the coast.",
        "Its economy rests largely on farming and fishing.",
    ),
    "city": (
        "It is known for its covered markets.",
        "Its old town is built around a small harbour.",
        "It lies where two rivers meet.",
        "Its cathedral dates from the medieval period.",
    ),
    "university": (
        "It is known for its programmes in law and medicine.",
        "Its main library is one of the oldest in the region.",
        "It is organised into several residential colleges.",
    ),
    "company": (
        "It employs several hundred people.",
        "Its catalogue is distributed in many countries.",
        "It is privately owned.",
    ),
    "film": (
        "The film received mixed reviews on release.",
        "It was shot largely on location.",
        "It has since gained a cult following.",
        "Its score was recorded with a small string orchestra.",
    ),
    "person": (),
}
# (kind of the other entity, sentence): names another entity without stating any asked fact about it.
# {s} is this passage's entity, {o} the other one.
DISTRACTORS = {
    "person": (
        ("person", "{s} has cited {o} as an early influence."),
        ("person", "{s} once shared a panel with {o} at a public lecture."),
        ("film", "{s} has spoken admiringly of {o}."),
        ("city", "{s} has given several talks in {o}."),
    ),
    "city": (("city", "{s} is twinned with {o}."), ("city", "An old trade road links {s} with {o}.")),
    "country": (
        ("country", "{s} shares a border with {o}."),
        ("country", "{s} has long-standing trade ties with {o}."),
    ),
    "university": (
        ("university", "{s} runs a student exchange with {o}."),
        ("person", "Its library holds a collection of letters donated by {o}."),
    ),
    "company": (
        ("company", "{s} has competed with {o} for several contracts."),
        ("film", "{s} sponsored a festival screening of {o}."),
    ),
    "film": (
        ("film", "{s} is often compared with {o}."),
        ("person", "Critics have noted the influence of {o} on its visual style."),
    ),
}


@dataclass
class Entity:
    """One entity of the world. `mention` is how prose names it mid-sentence ("the Dravin Institute")."""

    kind: str
    index: int
    name: str
    mention: str
    surname: str = ""
    twin: int | None = None
    facts: dict[str, Value] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)  # occupation, official name, genre, industry
    aliases: tuple[str, ...] = ()

    @property
    def ref(self) -> Ref:
        return (self.kind, self.index)

    @property
    def passage_id(self) -> str:
        return f"synth-{self.kind}-{self.index:04d}"

    @property
    def subject(self) -> str:
        """How a sentence of its own passage starts when naming it again: surname for people."""
        return self.surname or _cap(self.mention)


@dataclass
class World:
    entities: dict[str, list[Entity]]
    related: dict[Ref, set[Ref]] = field(default_factory=dict)  # entities linked by a fact, either direction

    def get(self, ref: Ref) -> Entity:
        return self.entities[ref[0]][ref[1]]

    def all(self) -> Iterator[Entity]:
        for kind in KINDS:
            yield from self.entities[kind]


# --- relations and question templates ----------------------------------------------------------------------


@dataclass(frozen=True)
class Relation:
    """A functional fact `subject -> target` (target: an entity kind or "year"), with its question templates.

    `asks` ask for the target of a named subject ({s}); `describes` name the target as a noun phrase ({s} is
    the subject's phrase), used to nest hops inside one question.
    """

    subject: str
    name: str
    target: str
    asks: tuple[str, ...]
    describes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.subject}.{self.name}"


RELATIONS = (
    Relation(
        "person", "born_in", "city", ("Where was {s} born?", "In which city was {s} born?"), ("the birthplace of {s}",)
    ),
    Relation("person", "birth_year", "year", ("When was {s} born?", "In what year was {s} born?")),
    Relation(
        "person",
        "studied_at",
        "university",
        ("Which university did {s} attend?", "Where did {s} study?"),
        ("the alma mater of {s}", "the university attended by {s}"),
    ),
    Relation(
        "person",
        "married_to",
        "person",
        ("Who is {s} married to?", "Who is the spouse of {s}?"),
        ("the spouse of {s}",),
    ),
    Relation("city", "located_in", "country", ("In which country is {s}?", "Which country is {s} in?")),
    Relation(
        "university",
        "located_in",
        "city",
        ("In which city is {s} located?", "Where is {s} located?"),
        ("the city where {s} is located",),
    ),
    Relation("university", "year_founded", "year", ("When was {s} founded?", "In what year was {s} founded?")),
    Relation(
        "company",
        "founded_by",
        "person",
        ("Who founded {s}?", "Who is the founder of {s}?"),
        ("the founder of {s}", "the person who founded {s}"),
    ),
    Relation(
        "company",
        "headquartered_in",
        "city",
        ("In which city is {s} headquartered?", "Where is {s} based?"),
        ("the city where {s} is headquartered",),
    ),
    Relation("company", "year_founded", "year", ("When was {s} founded?", "In what year was {s} established?")),
    Relation(
        "film", "directed_by", "person", ("Who directed {s}?", "Who is the director of {s}?"), ("the director of {s}",)
    ),
    Relation(
        "film",
        "produced_by",
        "company",
        ("Which company produced {s}?", "What company produced {s}?"),
        ("the company that produced {s}", "the production company of {s}"),
    ),
    Relation("film", "release_year", "year", ("When was {s} released?", "In what year was {s} released?")),
)
REL = {relation.key: relation for relation in RELATIONS}
# Two last hops asked as one clause; {s} is the subject of the first of the two.
FUSED = {
    ("person.born_in", "city.located_in"): ("In which country was {s} born?",),
    ("university.located_in", "city.located_in"): ("In which country is {s} located?",),
    ("company.headquartered_in", "city.located_in"): (
        "In which country is {s} headquartered?",
        "In which country is {s} based?",
    ),
}


@dataclass(frozen=True)
class Comparison:
    """Compare two entities of `kind` by a year, reached directly or through a `bridge` relation."""

    kind: str
    year: str  # relation key of the compared year
    earlier: tuple[str, ...]  # templates with {a} and {b}
    later: tuple[str, ...]
    bridge: str | None = None  # relation key from each entity to the entity whose year is compared


COMPARISONS = (
    Comparison(
        "person",
        "person.birth_year",
        ("Who was born earlier, {a} or {b}?", "Who is older, {a} or {b}?"),
        ("Who was born later, {a} or {b}?", "Who is younger, {a} or {b}?"),
    ),
    Comparison(
        "film",
        "film.release_year",
        ("Which film was released first, {a} or {b}?", "Which film came out earlier, {a} or {b}?"),
        ("Which film was released more recently, {a} or {b}?", "Which film came out later, {a} or {b}?"),
    ),
    Comparison(
        "company",
        "company.year_founded",
        ("Which company was founded first, {a} or {b}?", "Which company is older, {a} or {b}?"),
        ("Which company was founded more recently, {a} or {b}?",),
    ),
    Comparison(
        "university",
        "university.year_founded",
        ("Which university was founded first, {a} or {b}?", "Which university is older, {a} or {b}?"),
        ("Which university was founded more recently, {a} or {b}?",),
    ),
)
BRIDGE_COMPARISONS = (
    Comparison(
        "film",
        "person.birth_year",
        (
            "Which film has the director who was born earlier, {a} or {b}?",
            "Which film's director is older, {a} or {b}?",
        ),
        (
            "Which film has the director who was born later, {a} or {b}?",
            "Which film's director is younger, {a} or {b}?",
        ),
        "film.directed_by",
    ),
    Comparison(
        "film",
        "company.year_founded",
        ("Which film was produced by the company that was founded earlier, {a} or {b}?",),
        ("Which film was produced by the company that was founded more recently, {a} or {b}?",),
        "film.produced_by",
    ),
    Comparison(
        "company",
        "person.birth_year",
        (
            "Which company was founded by the person who was born earlier, {a} or {b}?",
            "Which company's founder is older, {a} or {b}?",
        ),
        ("Which company's founder is younger, {a} or {b}?",),
        "company.founded_by",
    ),
    Comparison(
        "person",
        "university.year_founded",
        ("Who attended the university that was founded earlier, {a} or {b}?",),
        ("Who attended the university that was founded more recently, {a} or {b}?",),
        "person.studied_at",
    ),
    Comparison(
        "person",
        "person.birth_year",
        ("Whose spouse was born earlier, {a} or {b}?",),
        ("Whose spouse was born later, {a} or {b}?",),
        "person.married_to",
    ),
)


# --- public API --------------------------------------------------------------------------------------------


def generate(cfg: SyntheticConfig) -> tuple[list[Question], list[Passage]]:
    """Build the world of `cfg` and return (questions grouped by type, split, index; passages sorted by id).

    Raises DataError when the world is too small for the requested number of distinct questions of a type.
    """
    world = _build_world(cfg)
    passages = _passages(world, _derived(cfg.seed, "passages"), cfg.distractor_sentences)
    texts = {passage.id: passage.text for passage in passages}
    types = [qtype for qtype in QUESTION_TYPES if qtype in cfg.question_types]
    seen: set[str] = set()
    streams = {qtype: _drafts(world, qtype, cfg.seed, texts, seen) for qtype in types}
    test = {qtype: _take(streams[qtype], "test", qtype, cfg) for qtype in types}
    named = {alias: entity.passage_id for entity in world.all() for alias in entity.aliases}
    asked = {_fact(step, named) for drafts in test.values() for draft in drafts for step in draft.steps}
    train = {qtype: _take(_asking_none(streams[qtype], asked, named), "train", qtype, cfg) for qtype in types}
    questions = [
        _question(qtype, split, i, draft)
        for qtype in types
        for split, drafts in (("train", train[qtype]), ("test", test[qtype]))
        for i, draft in enumerate(drafts)
    ]
    return questions, passages


def _derived(seed: int, part: str) -> random.Random:
    """An independent Random for one part of the generation; string seeds hash deterministically (sha512)."""
    return random.Random(f"{seed}:{part}")


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _a(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


# --- building the world ------------------------------------------------------------------------------------


def _build_world(cfg: SyntheticConfig) -> World:
    rng = _derived(cfg.seed, "world")
    used: set[str] = set()
    counts = {
        "country": cfg.n_countries,
        "city": cfg.n_cities,
        "university": cfg.n_universities,
        "person": cfg.n_people,
        "company": cfg.n_companies,
        "film": cfg.n_films,
    }
    world = World({kind: _named_entities(rng, kind, counts[kind], cfg.lookalike_fraction, used) for kind in KINDS})
    for assign in (
        _assign_cities,
        _assign_countries,
        _assign_universities,
        _assign_people,
        _assign_spouses,
        _assign_companies,
        _assign_films,
        _assign_occupations,
    ):
        assign(rng, world)
    _assign_aliases(world)
    world.related = _related(world)
    return world


def _fresh(used: set[str], make: Callable[[], str]) -> str:
    """A string from `make` that is not in `used` yet (then added), so no name or word is ever reused."""
    while True:
        word = make()
        if 4 <= len(word) <= 12 and word not in used and not _blocked(word):
            used.add(word)
            return word


def _blocked(word: str) -> bool:
    return any(bad in word.lower() for bad in BLOCKED)


def _word(rng: random.Random, syllables: int) -> str:
    """A pronounceable invented word of `syllables` syllables ("Varnel", "Okosi"); may repeat, see `_fresh`."""
    letters = ""
    for position in range(syllables):
        after_consonant = bool(letters) and letters[-1] not in VOWELS
        if position == 0 and rng.random() < 0.25:
            onset = ""
        else:
            onset = rng.choice(SINGLE_ONSETS if after_consonant else ONSETS)
        coda = rng.choice(CODAS) if position == syllables - 1 or rng.random() < 0.4 else ""
        letters += onset + rng.choice(VOWELS) + coda
    return letters.capitalize()


def _lookalike(rng: random.Random, word: str, used: set[str]) -> str:
    """`word` with one vowel changed, sometimes also a consonant after a vowel, and not in `used` (then added)."""
    for _ in range(200):
        letters = list(word)
        vowel_at = rng.choice([i for i, c in enumerate(letters) if i > 0 and c in VOWELS])
        letters[vowel_at] = rng.choice([v for v in VOWELS if v != letters[vowel_at]])
        similar = [i for i, c in enumerate(letters) if i > 0 and c in SIMILAR_CONSONANTS and letters[i - 1] in VOWELS]
        if similar and rng.random() < 0.3:
            at = rng.choice(similar)
            letters[at] = SIMILAR_CONSONANTS[letters[at]]
        twin = "".join(letters)
        if twin not in used and not _blocked(twin):
            used.add(twin)
            return twin
    raise DataError(f"synthetic world: no unused look-alike of {word!r} found; change the seed")


def _named_entities(rng: random.Random, kind: str, count: int, fraction: float, used: set[str]) -> list[Entity]:
    """`count` entities; the last `pairs` are look-alike twins of the first `pairs`."""
    pairs = min(count // 2, int(fraction * count / 2 + 0.5))
    bases = [_name_parts(rng, kind, used) for _ in range(count - pairs)]
    twins = [(pattern, _lookalike(rng, word, used), extra) for pattern, word, extra in bases[:pairs]]
    entities = [_entity(kind, i, *parts) for i, parts in enumerate(bases + twins)]
    for i in range(pairs):
        entities[i].twin, entities[count - pairs + i].twin = count - pairs + i, i
    return entities


def _name_parts(rng: random.Random, kind: str, used: set[str]) -> tuple[str, str, str]:
    """(pattern with {w}, the unused invented word a twin changes, extra) for a new entity of `kind`."""
    if kind == "person":
        first = _fresh(used, lambda: _word(rng, 2))
        return f"{first} {{w}}", _fresh(used, lambda: _word(rng, rng.choice((2, 3)))), ""
    if kind == "city":
        return "{w}", _fresh(used, lambda: _word(rng, rng.choice((2, 3))) + rng.choice(CITY_SUFFIXES)), ""
    if kind == "country":
        return "{w}", _fresh(used, lambda: _word(rng, 2).rstrip("aeiou") + rng.choice(COUNTRY_SUFFIXES)), ""
    if kind == "university":
        return rng.choice(UNIVERSITY_PATTERNS), _fresh(used, lambda: _word(rng, 2)), ""
    if kind == "company":
        return f"{{w}} {rng.choice(sorted(COMPANY_SUFFIXES))}", _fresh(used, lambda: _word(rng, 2)), ""
    pattern = rng.choice(FILM_PATTERNS).replace("{noun}", rng.choice(FILM_NOUNS))
    return pattern, _fresh(used, lambda: _word(rng, rng.choice((2, 3)))), rng.choice(GENRES)


def _entity(kind: str, index: int, pattern: str, word: str, extra: str) -> Entity:
    """Names are unique because every invented word is: each name holds exactly one word no other name has."""
    name = pattern.format(w=word)
    needs_the = kind == "university" and (
        name.endswith(("Institute", "Academy", "Polytechnic")) or name.startswith("University of")
    )
    entity = Entity(kind, index, name, f"the {name}" if needs_the else name, word if kind == "person" else "")
    if kind == "film":
        entity.info["genre"] = extra
    if kind == "company":
        entity.info["industry"] = COMPANY_SUFFIXES[name.rsplit(" ", 1)[1]]
    return entity


def _avoid(world: World, entity: Entity, relation: str) -> Value | None:
    """The value an earlier-built twin has for `relation`, which this entity must not share."""
    if entity.twin is None or entity.twin > entity.index:
        return None
    return world.entities[entity.kind][entity.twin].facts.get(relation)


def _pick(rng: random.Random, options: list[Entity], avoid: Value | None) -> Ref:
    refs = [option.ref for option in options]
    return rng.choice([ref for ref in refs if ref != avoid] or refs)


def _year(rng: random.Random, low: int, high: int, avoid: Value | None) -> int:
    return rng.choice([year for year in range(low, high + 1) if year != avoid] or [low])


def _assign_cities(rng: random.Random, world: World) -> None:
    countries = world.entities["country"]
    for city in world.entities["city"]:
        avoid = _avoid(world, city, "located_in")
        cover = city.index < len(countries) and countries[city.index].ref != avoid  # every country gets a city
        city.facts["located_in"] = countries[city.index].ref if cover else _pick(rng, countries, avoid)


def _assign_countries(rng: random.Random, world: World) -> None:
    """A capital among its cities (if it has any) and an official name, unlike its twin's."""
    for country in world.entities["country"]:
        cities = [city for city in world.entities["city"] if city.facts["located_in"] == country.ref]
        if cities:
            country.facts["capital"] = rng.choice(cities).ref
        twin_form = world.entities["country"][country.twin].info.get("form") if country.twin is not None else None
        country.info["form"] = rng.choice([form for form in OFFICIAL_FORMS if form != twin_form])
        if country.info["form"]:
            country.info["official"] = country.info["form"].format(n=country.name)


def _assign_universities(rng: random.Random, world: World) -> None:
    for university in world.entities["university"]:
        university.facts["located_in"] = _pick(rng, world.entities["city"], _avoid(world, university, "located_in"))
        university.facts["year_founded"] = _year(rng, 1450, 1940, _avoid(world, university, "year_founded"))


def _assign_people(rng: random.Random, world: World) -> None:
    for person in world.entities["person"]:
        person.facts["birth_year"] = _year(rng, 1930, 1995, _avoid(world, person, "birth_year"))
        person.facts["born_in"] = _pick(rng, world.entities["city"], _avoid(world, person, "born_in"))
        person.facts["studied_at"] = _pick(rng, world.entities["university"], None)


def _assign_spouses(rng: random.Random, world: World) -> None:
    """Marry about 40% of people in pairs of close birth years (never a person to their own twin)."""
    people = world.entities["person"]
    chosen = sorted(rng.sample(people, 2 * (len(people) // 5)), key=lambda p: (p.facts["birth_year"], p.index))
    for one, other in zip(chosen[::2], chosen[1::2]):
        if one.twin != other.index:
            one.facts["married_to"], other.facts["married_to"] = other.ref, one.ref


def _assign_companies(rng: random.Random, world: World) -> None:
    people = world.entities["person"]
    for company in world.entities["company"]:
        founder = world.get(_pick(rng, people, _avoid(world, company, "founded_by")))
        born = founder.facts["birth_year"]
        company.facts["founded_by"] = founder.ref
        avoid_year, avoid_city = _avoid(world, company, "year_founded"), _avoid(world, company, "headquartered_in")
        company.facts["year_founded"] = _year(rng, born + 22, min(born + 50, 2022), avoid_year)
        company.facts["headquartered_in"] = _pick(rng, world.entities["city"], avoid_city)


def _assign_films(rng: random.Random, world: World) -> None:
    """Director and producer first; the release year follows both (director aged 25+, company founded)."""
    for film in world.entities["film"]:
        director = world.get(_pick(rng, world.entities["person"], _avoid(world, film, "directed_by")))
        producer = world.get(_pick(rng, world.entities["company"], None))
        low = max(director.facts["birth_year"] + 25, producer.facts["year_founded"] + 1)
        film.facts["directed_by"], film.facts["produced_by"] = director.ref, producer.ref
        film.facts["release_year"] = _year(rng, low, min(low + 30, 2024), _avoid(world, film, "release_year"))


def _assign_occupations(rng: random.Random, world: World) -> None:
    directors = {film.facts["directed_by"] for film in world.entities["film"]}
    founders = {company.facts["founded_by"] for company in world.entities["company"]}
    for person in world.entities["person"]:
        roles = [
            role for role, group in (("film director", directors), ("entrepreneur", founders)) if person.ref in group
        ]
        person.info["occupation"] = " and ".join(roles) if roles else rng.choice(OCCUPATIONS)


def _assign_aliases(world: World) -> None:
    """Name first; a person's surname and a country's official name only where no other entity uses them."""
    names = {entity.name for entity in world.all()}
    surnames = [person.surname for person in world.entities["person"]]
    for entity in world.all():
        extra = [entity.info.get("official", "")]
        if entity.kind == "person" and surnames.count(entity.surname) == 1 and entity.surname not in names:
            extra.append(entity.surname)
        entity.aliases = (entity.name, *(alias for alias in extra if alias))


def _related(world: World) -> dict[Ref, set[Ref]]:
    related: dict[Ref, set[Ref]] = {entity.ref: set() for entity in world.all()}
    for entity in world.all():
        for value in entity.facts.values():
            if isinstance(value, tuple):
                related[entity.ref].add(value)
                related[value].add(entity.ref)
    return related


# --- passages ----------------------------------------------------------------------------------------------


def _passages(world: World, rng: random.Random, n_distractors: int) -> list[Passage]:
    passages = [_passage(world, entity, rng, n_distractors) for entity in world.all()]
    return sorted(passages, key=lambda passage: passage.id)


def _passage(world: World, entity: Entity, rng: random.Random, n_distractors: int) -> Passage:
    sentences = FACT_SENTENCES[entity.kind](world, entity, rng)
    if FLAVOR[entity.kind]:
        sentences.append(rng.choice(FLAVOR[entity.kind]))
    sentences += _distractor_sentences(world, entity, rng, n_distractors)
    return Passage(entity.passage_id, entity.name, " ".join(sentences))


def _person_sentences(world: World, person: Entity, rng: random.Random) -> list[str]:
    facts, sur = person.facts, person.surname
    city, university = world.get(facts["born_in"]).name, world.get(facts["studied_at"]).mention
    sentences = [
        f"{person.name} (born {facts['birth_year']}) is {_a(person.info['occupation'])}.",
        rng.choice(
            (
                f"{sur} was born in {city} and studied at {university}.",
                f"Born in {city}, {sur} studied at {university}.",
                f"{sur} was born in {city} and later attended {university}.",
            )
        ),
    ]
    if "married_to" in facts:
        spouse = world.get(facts["married_to"]).name
        sentences.append(rng.choice((f"{sur} is married to {spouse}.", f"{sur} married {spouse}.")))
    return sentences


def _city_sentences(world: World, city: Entity, rng: random.Random) -> list[str]:
    country = world.get(city.facts["located_in"])
    if country.facts.get("capital") == city.ref:
        return [f"{city.name} is the capital and largest city of {country.name}."]
    return [f"{city.name} is {rng.choice(('a city', 'a port city', 'a market town'))} in {country.name}."]


def _country_sentences(world: World, country: Entity, rng: random.Random) -> list[str]:
    official = country.info.get("official")
    named = f"{country.name}, officially the {official}," if official else country.name
    sentences = [f"{named} is a country."]
    if "capital" in country.facts:
        sentences.append(f"Its capital is {world.get(country.facts['capital']).name}.")
    return sentences


def _university_sentences(world: World, university: Entity, rng: random.Random) -> list[str]:
    city, year = world.get(university.facts["located_in"]).name, university.facts["year_founded"]
    mention = university.mention
    return [
        rng.choice(
            (
                f"{_cap(mention)} is a university in {city}, founded in {year}.",
                f"{_cap(mention)} is a public university located in {city}. It was founded in {year}.",
                f"Founded in {year}, {mention} is a university based in {city}.",
            )
        )
    ]


def _company_sentences(world: World, company: Entity, rng: random.Random) -> list[str]:
    facts, kind = company.facts, _a(company.info["industry"])
    founder, city = world.get(facts["founded_by"]).name, world.get(facts["headquartered_in"]).name
    year = facts["year_founded"]
    return rng.choice(
        (
            [f"{company.name} is {kind} company headquartered in {city}.", f"It was founded in {year} by {founder}."],
            [f"Founded by {founder} in {year}, {company.name} is {kind} company based in {city}."],
        )
    )


def _film_sentences(world: World, film: Entity, rng: random.Random) -> list[str]:
    facts, genre = film.facts, film.info["genre"]
    director, company = world.get(facts["directed_by"]).name, world.get(facts["produced_by"]).name
    year = facts["release_year"]
    return rng.choice(
        (
            [
                f"{film.name} is {_a(genre)} film directed by {director} and produced by {company}.",
                f"It was released in {year}.",
            ],
            [f"{film.name} is a {year} {genre} film directed by {director}.", f"It was produced by {company}."],
        )
    )


FACT_SENTENCES: dict[str, Callable[[World, Entity, random.Random], list[str]]] = {
    "person": _person_sentences,
    "city": _city_sentences,
    "country": _country_sentences,
    "university": _university_sentences,
    "company": _company_sentences,
    "film": _film_sentences,
}


def _distractor_sentences(world: World, entity: Entity, rng: random.Random, count: int) -> list[str]:
    """`count` sentences naming other entities: the look-alike twin first, then entities more than two facts
    away."""
    sentences = [_twin_sentence(world, entity)] if entity.twin is not None and count else []
    templates = rng.sample(DISTRACTORS[entity.kind], len(DISTRACTORS[entity.kind]))
    near = world.related[entity.ref]
    taken = near.union(*(world.related[ref] for ref in near)) | {entity.ref, (entity.kind, entity.twin)}
    for slot in range(count - len(sentences)):
        other_kind, template = templates[slot % len(templates)]
        others = [other for other in world.entities[other_kind] if other.ref not in taken]
        if others:
            other = rng.choice(others)
            taken.add(other.ref)
            sentences.append(template.format(s=entity.subject, o=other.mention))
    return sentences


def _twin_sentence(world: World, entity: Entity) -> str:
    twin = world.entities[entity.kind][entity.twin]
    what = _a(twin.info["occupation"]) if entity.kind == "person" else f"a different {KIND_WORDS[entity.kind]}"
    return f"{entity.subject} is not to be confused with {twin.mention}, {what}."


# --- questions ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draft:
    """A question before it gets its id and split."""

    text: str
    answers: tuple[str, ...]
    support: tuple[str, ...]
    steps: tuple[SubQuestion, ...]


# Candidate questions grouped by relation path or comparison template; each renders a Draft given a Random.
Candidates = dict[str, list[Callable[[random.Random], Draft]]]


def _drafts(world: World, qtype: str, seed: int, texts: dict[str, str], seen: set[str]) -> Iterator[Draft]:
    """The type's drafts in drawing order (relation paths in turn, for variety), each text once across types."""
    rng = _derived(seed, f"questions:{qtype}")
    for make in _interleave(rng, _candidates(world, qtype, texts)):
        draft = make(rng)
        if draft.text not in seen:
            seen.add(draft.text)
            yield draft


def _asking_none(drafts: Iterator[Draft], asked: set[Fact], named: dict[str, str]) -> Iterator[Draft]:
    """The drafts none of whose sub-questions asks a fact in `asked`."""
    return (draft for draft in drafts if asked.isdisjoint(_fact(step, named) for step in draft.steps))


def _fact(step: SubQuestion, named: dict[str, str]) -> Fact:
    """The fact a sub-question asks: the two passages it links when its answer names an entity (`named`: name ->
    passage), whichever way it is asked ("Who is X married to?" and "Who is Y married to?"), else its text (a
    year, a comparison)."""
    target = named.get(step.answer)
    return frozenset((*step.passage_ids, target)) if target and step.passage_ids else step.question


def _take(drafts: Iterator[Draft], split: str, qtype: str, cfg: SyntheticConfig) -> list[Draft]:
    need = cfg.test_per_type if split == "test" else cfg.train_per_type
    taken = list(islice(drafts, need))
    if len(taken) < need:
        why = " (a training question asks no fact a test question asks)" if split == "train" else ""
        raise DataError(
            f"synthetic world too small for question type {qtype!r}: {len(taken)} distinct {split} questions "
            f"possible{why}, {need} requested ({split}_per_type); raise {SIZE_FIELDS[qtype]} or lower {split}_per_type"
        )
    return taken


def _question(qtype: str, split: str, index: int, draft: Draft) -> Question:
    qid = f"synth-{qtype}-{split}-{index:04d}"
    return Question(qid, draft.text, draft.answers, f"synth-{qtype}", split, draft.support, draft.steps)


def _interleave(rng: random.Random, groups: dict[str, list]) -> Iterator:
    lists = [rng.sample(items, len(items)) for _, items in sorted(groups.items())]
    rng.shuffle(lists)
    for position in range(max(map(len, lists), default=0)):
        yield from (items[position] for items in lists if position < len(items))


def _candidates(world: World, qtype: str, texts: dict[str, str]) -> Candidates:
    if qtype in CHAIN_HOPS:
        return _chain_candidates(world, CHAIN_HOPS[qtype], texts)
    return _comparison_candidates(world, COMPARISONS if qtype == "comparison" else BRIDGE_COMPARISONS)


def _paths(hops: int) -> list[tuple[Relation, ...]]:
    """Every chain of `hops` relations whose types connect; never spouse of spouse."""
    paths = [(relation,) for relation in RELATIONS]
    for _ in range(hops - 1):
        paths = [
            path + (nxt,)
            for path in paths
            for nxt in RELATIONS
            if nxt.subject == path[-1].target and not (nxt.name == path[-1].name == "married_to")
        ]
    return paths


def _walk(world: World, start: Entity, path: tuple[Relation, ...]) -> list[Value] | None:
    """The values reached hop by hop from `start`, or None if a fact is missing or an entity repeats."""
    values: list[Value] = [start.ref]
    for relation in path:
        value = world.get(values[-1]).facts.get(relation.name)
        if value is None or value in values:
            return None
        values.append(value)
    return values[1:]


def _names_start(world: World, start: Entity, values: list[Value], texts: dict[str, str]) -> bool:
    """Whether a later hop's passage names the chain's start: then searching the question finds it."""
    return any(start.name in texts[world.get(value).passage_id] for value in values[:-1])


def _chain_candidates(world: World, hops: int, texts: dict[str, str]) -> Candidates:
    groups = {}
    for path in _paths(hops):
        starts = [
            start
            for start in world.entities[path[0].subject]
            if (values := _walk(world, start, path)) and not _names_start(world, start, values, texts)
        ]
        if starts:
            name = " > ".join(relation.key for relation in path)
            groups[name] = [partial(_chain_draft, world, start, path) for start in starts]
    return groups


def _chain_draft(world: World, start: Entity, path: tuple[Relation, ...], rng: random.Random) -> Draft:
    """One sub-question per hop, each naming the previous hop's answer; the last hop's passage holds the answer."""
    values = _walk(world, start, path)
    subjects = [start] + [world.get(value) for value in values[:-1]]
    steps = tuple(
        SubQuestion(relation.asks[0].format(s=subject.mention), _answers(world, value)[0], (subject.passage_id,))
        for relation, subject, value in zip(path, subjects, values)
    )
    support = tuple(subject.passage_id for subject in subjects)
    return Draft(_chain_text(rng, start, path), _answers(world, values[-1]), support, steps)


def _chain_text(rng: random.Random, start: Entity, path: tuple[Relation, ...]) -> str:
    fused = FUSED.get((path[-2].key, path[-1].key)) if len(path) >= 2 else None
    templates, nested = (fused, path[:-2]) if fused else (path[-1].asks, path[:-1])
    phrase = start.mention
    for relation in nested:
        phrase = rng.choice(relation.describes).format(s=phrase)
    return rng.choice(templates).format(s=phrase)


def _answers(world: World, value: Value) -> tuple[str, ...]:
    return world.get(value).aliases if isinstance(value, tuple) else (str(value),)


def _compared(world: World, spec: Comparison, entity: Entity) -> Entity | None:
    """The entity whose year is compared: `entity` itself, or the one its bridge relation leads to."""
    if spec.bridge is None:
        return entity
    ref = entity.facts.get(REL[spec.bridge].name)
    return world.get(ref) if ref else None


def _comparison_candidates(world: World, specs: tuple[Comparison, ...]) -> Candidates:
    """Every pair with distinct compared entities and different years (so no ties), grouped by template."""
    groups = {}
    for spec in specs:
        year = REL[spec.year].name
        reached = {
            entity.index: compared
            for entity in world.entities[spec.kind]
            if (compared := _compared(world, spec, entity)) and year in compared.facts
        }
        pairs = [
            partial(_comparison_draft, world, spec, world.entities[spec.kind][a], world.entities[spec.kind][b])
            for a, b in combinations(sorted(reached), 2)
            if reached[a].facts[year] != reached[b].facts[year] and not _crossed(spec, a, b, reached)
        ]
        if pairs:
            groups[f"{spec.kind}: {spec.bridge or '-'} > {spec.year}"] = pairs
    return groups


def _crossed(spec: Comparison, a: int, b: int, reached: dict[int, Entity]) -> bool:
    """Whether a bridge leads from one side to the other (two spouses compared by each other's spouse)."""
    if spec.bridge is None or REL[spec.bridge].target != spec.kind:
        return False
    return bool({a, b} & {reached[a].index, reached[b].index})


def _comparison_draft(world: World, spec: Comparison, a: Entity, b: Entity, rng: random.Random) -> Draft:
    """Random side order and direction (earlier or later); the sides' hops, then one step comparing years."""
    if rng.random() < 0.5:
        a, b = b, a
    year = REL[spec.year].name
    earlier = rng.random() < 0.5
    ya, yb = _compared(world, spec, a).facts[year], _compared(world, spec, b).facts[year]
    winner = a if (ya < yb) == earlier else b
    steps = _side_steps(world, spec, a) + _side_steps(world, spec, b)
    word = "earlier" if earlier else "later"
    final = SubQuestion(f"Which is {word}, {ya} ({_label(spec, a)}) or {yb} ({_label(spec, b)})?", winner.name)
    text = rng.choice(spec.earlier if earlier else spec.later).format(a=a.mention, b=b.mention)
    support = tuple(dict.fromkeys(pid for step in steps for pid in step.passage_ids))
    return Draft(text, winner.aliases, support, (*steps, final))


def _label(spec: Comparison, entity: Entity) -> str:
    """What a compared year belongs to: the entity, or its bridge entity ("the director of The Velmar Gate")."""
    return REL[spec.bridge].describes[0].format(s=entity.mention) if spec.bridge else entity.name


def _side_steps(world: World, spec: Comparison, entity: Entity) -> list[SubQuestion]:
    """The hops for one side: the bridge (if any), then the compared year."""
    steps, subject = [], entity
    if spec.bridge:
        subject = _compared(world, spec, entity)
        question = REL[spec.bridge].asks[0].format(s=entity.mention)
        steps.append(SubQuestion(question, subject.name, (entity.passage_id,)))
    year = REL[spec.year]
    question = year.asks[0].format(s=subject.mention)
    steps.append(SubQuestion(question, str(subject.facts[year.name]), (subject.passage_id,)))
    return steps
