"""The invented multi-hop world: tiny real worlds, checked the way a retriever and a grader will use them."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from centralrl.config import SyntheticConfig
from centralrl.data import synthetic
from centralrl.data.synthetic import generate
from centralrl.errors import DataError

HOPS = {"1hop": 1, "2hop": 2, "3hop": 3, "4hop": 4}
TYPES = ["1hop", "2hop", "3hop", "4hop", "comparison", "bridge_comparison"]
TWIN = re.compile(r"is not to be confused with (?:the )?(.+?), an? ")


def small(**overrides) -> SyntheticConfig:
    params = dict(
        seed=3,
        n_people=40,
        n_cities=10,
        n_countries=4,
        n_universities=5,
        n_companies=9,
        n_films=12,
        lookalike_fraction=0.5,
        distractor_sentences=2,
        train_per_type=10,
        test_per_type=4,
        question_types=TYPES,  # every generator (the default world has only 1- and 2-hop)
    )
    return SyntheticConfig(**{**params, **overrides})


def kind_of(question) -> str:
    return question.benchmark.removeprefix("synth-")


@pytest.fixture(scope="module")
def world():
    return generate(small())


def test_same_config_gives_identical_lists_and_another_seed_differs():
    assert generate(small()) == generate(small())
    other_questions, other_passages = generate(small(seed=4))
    questions, passages = generate(small())
    assert [p.title for p in other_passages] != [p.title for p in passages]
    assert [q.question for q in other_questions] != [q.question for q in questions]


def test_benchmarks_splits_ids_and_counts(world):
    questions, _ = world
    counts = Counter((q.benchmark, q.split) for q in questions)
    assert counts == {(f"synth-{t}", split): n for t in TYPES for split, n in (("train", 10), ("test", 4))}
    for question in questions:
        kind = kind_of(question)
        assert re.fullmatch(rf"synth-{kind}-{question.split}-\d{{4}}", question.id)
    assert len({q.id for q in questions}) == len(questions)


def test_order_is_type_then_split_then_index_and_passages_by_id(world):
    questions, passages = world
    keys = [(TYPES.index(kind_of(q)), ("train", "test").index(q.split), q.id) for q in questions]
    assert keys == sorted(keys)
    assert [p.id for p in passages] == sorted(p.id for p in passages)


def test_passage_ids_and_titles_are_unique_and_one_per_entity(world):
    _, passages = world
    assert len({p.id for p in passages}) == len(passages) == 40 + 10 + 4 + 5 + 9 + 12
    assert len({p.title for p in passages}) == len(passages)
    expected = {"person": 40, "city": 10, "country": 4, "university": 5, "company": 9, "film": 12}
    assert Counter(p.id.split("-")[1] for p in passages) == expected


def test_every_supporting_and_hop_passage_exists(world):
    questions, passages = world
    ids = {p.id for p in passages}
    for question in questions:
        assert question.supporting_passage_ids and set(question.supporting_passage_ids) <= ids
        hop_ids = {pid for step in question.decomposition for pid in step.passage_ids}
        assert hop_ids == set(question.supporting_passage_ids)


def test_answer_is_verbatim_in_the_passage_of_the_last_hop(world):
    questions, passages = world
    text = {p.id: p.text for p in passages}
    title_to_id = {p.title: p.id for p in passages}
    for question in questions:
        answer = question.golden_answers[0]
        assert question.decomposition[-1].answer == answer
        if kind_of(question) in HOPS:
            assert answer in text[question.decomposition[-1].passage_ids[0]], question
        else:  # the winner's own passage, the one its side starts from
            winner = title_to_id[answer]
            assert winner in question.supporting_passage_ids and answer in text[winner], question


def test_every_alias_is_written_in_some_passage(world):
    questions, passages = world
    corpus = " ".join(p.text for p in passages)
    for question in questions:
        for alias in question.golden_answers:
            assert alias in corpus, (alias, question.id)


def test_chain_decompositions_have_one_step_per_hop_naming_the_previous_answer(world):
    questions, _ = world
    chains = [q for q in questions if kind_of(q) in HOPS]
    assert {q.benchmark for q in chains} == {f"synth-{t}" for t in HOPS}
    for question in chains:
        steps = question.decomposition
        assert len(steps) == HOPS[kind_of(question)]
        assert all(len(step.passage_ids) == 1 for step in steps)
        for previous, step in zip(steps, steps[1:]):
            assert previous.answer in step.question, (previous, step)


def test_multi_hop_paths_are_varied(world):
    questions, _ = world
    for kind in ("2hop", "3hop", "4hop"):
        of_kind = [q for q in questions if kind_of(q) == kind]
        paths = {tuple(pid.split("-")[1] for pid in q.supporting_passage_ids) for q in of_kind}
        assert len(paths) >= 3, (kind, paths)


def test_comparisons_name_both_sides_answer_one_and_never_tie(world):
    questions, _ = world
    for question in questions:
        kind = kind_of(question)
        if kind in HOPS:
            continue
        *sides, final = question.decomposition
        assert len(sides) == (2 if kind == "comparison" else 4)
        first, second = re.search(r", (.+) or (.+)\?$", question.question).groups()
        names = {first.removeprefix("the "), second.removeprefix("the ")}
        assert question.golden_answers[0] in names
        years = [step.answer for step in (sides[1::2] if kind == "bridge_comparison" else sides)]
        assert years[0] != years[1] and all(year.isdigit() for year in years)
        assert final.passage_ids == ()


def test_no_question_text_repeats_and_train_test_are_disjoint(world):
    questions, _ = world
    texts = [q.question for q in questions]
    assert len(set(texts)) == len(texts)
    train = {q.question for q in questions if q.split == "train"}
    test = {q.question for q in questions if q.split == "test"}
    assert train and test and not train & test


def twins(passages) -> dict[str, str]:
    by_title = {p.title: p for p in passages}
    found = {}
    for passage in passages:
        match = TWIN.search(passage.text)
        if match:
            assert match.group(1) in by_title, match.group(1)
            found[passage.title] = match.group(1)
    return found


def found(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    assert match, (pattern, text)
    return match.group(1)


def test_no_training_question_asks_a_fact_a_test_question_asks(world):
    """Before, 3 of the default's 12 one-hop test facts were hops of training questions and 6 of its 12 two-hop
    test questions shared a hop with one."""
    questions, _ = world
    asked = {step.question for q in questions if q.split == "test" for step in q.decomposition}
    trained = [q.id for q in questions if q.split == "train" if asked & {step.question for step in q.decomposition}]
    assert asked and trained == []


def test_no_training_question_asks_a_test_fact_the_other_way_round():
    """A marriage is stated in both spouses' passages and asked from either side: before, the
    default world asked "Who is Gelka Bari married to?" in training and her spouse's side of it in test."""
    questions, passages = generate(SyntheticConfig())
    passage_of = {passage.title: passage.id for passage in passages}

    def links(split: str) -> dict[frozenset, str]:
        return {
            frozenset((*step.passage_ids, passage_of[step.answer])): q.id
            for q in questions
            if q.split == split
            for step in q.decomposition
            if step.answer in passage_of and step.passage_ids
        }

    test, train = links("test"), links("train")
    assert len(test) > 10 and sorted(test.keys() & train.keys(), key=sorted) == []


def test_no_question_left_to_train_on_asks_a_fact_a_dev_question_asks():
    """The dev split is drawn from the training file; before, 15 of the default world's 224 other training
    questions shared a hop with its 16 dev questions, so dev F1 was partly scored on rewarded facts."""
    from centralrl.config import DevConfig
    from centralrl.data.split import split_dev

    questions = [q for q in generate(SyntheticConfig())[0] if q.split == "train"]
    training, dev = split_dev(questions, DevConfig())
    asked = {step.question for q in dev for step in q.decomposition}
    shared = [q.id for q in training if asked & {step.question for step in q.decomposition}]
    assert shared == [] and len(dev) == DevConfig().questions
    assert len(questions) - len(dev) - len(training) == 15  # those that shared a hop, and only those


def test_the_dev_split_holds_each_question_type_as_the_test_split_does():
    """Drawn at random the default's 16 dev questions were 6 one-hop and 10 two-hop (the test split: 12 and 12),
    so pooled dev F1 weighed 2-hop questions more than the test split's macro F1 does."""
    from collections import Counter

    from centralrl.config import DevConfig
    from centralrl.data.split import split_dev

    questions = [q for q in generate(SyntheticConfig())[0] if q.split == "train"]
    count = {
        sampling: Counter(q.benchmark for q in split_dev(questions, DevConfig(sampling=sampling))[1])
        for sampling in ("stratified", "uniform")
    }
    assert count["stratified"] == {"synth-1hop": 8, "synth-2hop": 8}
    assert count["uniform"] == {"synth-1hop": 6, "synth-2hop": 10}


def test_no_chain_passage_after_the_first_names_the_start(world):
    """The spouse's passage names the person: "Where was the spouse of X born?" was found by searching X."""
    questions, passages = world
    text, title = {p.id: p.text for p in passages}, {p.id: p.title for p in passages}
    chains = [q for q in questions if kind_of(q) in HOPS and HOPS[kind_of(q)] > 1]
    assert chains
    for q in chains:
        start = title[q.supporting_passage_ids[0]]
        assert not [pid for pid in q.supporting_passage_ids[1:] if start in text[pid]], q.id


def test_distractors_never_name_an_entity_two_facts_away():
    """A film's passage named its production company's founder in a distractor sentence, the answer of "who
    founded the production company of" that film."""
    cfg = small()
    world = synthetic._build_world(cfg)
    by_id = {p.id: p for p in synthetic._passages(world, synthetic._derived(cfg.seed, "passages"), 2)}
    checked = 0
    for entity in world.all():
        near = world.related[entity.ref]
        twice = set().union(*(world.related[ref] for ref in near)) - near - {entity.ref, (entity.kind, entity.twin)}
        named = [world.get(ref).name for ref in twice if world.get(ref).name in by_id[entity.passage_id].text]
        assert named == [], (entity.name, named)
        checked += len(twice)
    assert checked > 100


def test_lookalike_twins_exist_look_alike_and_differ_in_facts(world):
    _, passages = world
    pairs = twins(passages)
    by_title = {p.title: p for p in passages}
    assert all(pairs[twin] == title for title, twin in pairs.items())  # each names the other
    assert sum(1 for title in pairs if by_title[title].id.startswith("synth-person")) == 2 * 10  # 0.5 * 40 people
    for title, twin in pairs.items():
        assert len(title) == len(twin) and 1 <= sum(a != b for a, b in zip(title, twin)) <= 2, (title, twin)
        text, twin_text = by_title[title].text, by_title[twin].text
        if by_title[title].id.startswith("synth-person"):
            for fact in (r"\(born (\d{4})\)", r"[Bb]orn in ([A-Z]\w+)"):  # birth year, birthplace
                assert found(fact, text) != found(fact, twin_text), (fact, title, twin)
        if by_title[title].id.startswith("synth-film"):
            fact = r"directed by ([A-Z]\w+ [A-Z]\w+)"
            assert found(fact, text) != found(fact, twin_text), (title, twin)


def test_no_lookalikes_when_fraction_is_zero():
    _, passages = generate(small(lookalike_fraction=0.0, question_types=["1hop", "2hop"]))
    assert twins(passages) == {}


def test_distractor_sentences_follow_the_config():
    _, none = generate(small(distractor_sentences=0))
    _, many = generate(small(distractor_sentences=3))

    def sentences(passages):
        return sum(p.text.count(". ") + 1 for p in passages)

    assert sentences(many) - sentences(none) >= 3 * len(none) * 0.9


def test_only_the_requested_types_are_generated():
    questions, _ = generate(small(question_types=["comparison", "2hop"]))
    assert {q.benchmark for q in questions} == {"synth-2hop", "synth-comparison"}
    assert [q.benchmark for q in questions][0] == "synth-2hop"


def test_too_small_world_raises_naming_the_type_and_what_to_raise():
    cfg = small(n_films=2, n_companies=2, n_people=8, question_types=["bridge_comparison"], train_per_type=500)
    message = r"'bridge_comparison': \d+ distinct train questions possible.*500 requested \(train_per_type\).*n_films"
    with pytest.raises(DataError, match=message):
        generate(cfg)


def test_default_config_generates_the_requested_counts_fast():
    cfg = SyntheticConfig()
    start = time.perf_counter()
    questions, passages = generate(cfg)
    seconds = time.perf_counter() - start
    assert seconds < 2.0
    counts = Counter((q.benchmark, q.split) for q in questions)
    per_split = (("train", cfg.train_per_type), ("test", cfg.test_per_type))
    expected = {(f"synth-{t}", split): n for t in cfg.question_types for split, n in per_split}
    assert counts == expected
    sizes = (cfg.n_people, cfg.n_cities, cfg.n_countries, cfg.n_universities, cfg.n_companies, cfg.n_films)
    assert len(passages) == sum(sizes)
