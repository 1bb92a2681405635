"""Assemble every configured source into one dataset: questions by split, one deduplicated corpus.

Checks that make a dataset trustworthy, each refusing with a message that names the offenders:
question ids are unique; no evaluation question repeats another of its benchmark (the same normalized text and
answers under another id; with `data.repeated_questions: drop` the later copies are dropped instead, and
counted); no evaluation question is also a training question (same id or the same normalized text; with
`data.train_overlap: drop` the training copies are dropped instead, and counted: open-domain train and test
files can share questions, Lewis et al. 2021); every supporting passage id is in the corpus; one passage id
never carries two texts. Inputs are bounded (`check_bounds`, per source, naming the file): no question longer
than `data.max_question_chars` (it would fill the backbone's context), no passage longer than
`data.max_passage_chars`, and no golden answer that normalizes to the empty string (every prediction would
contain it, so Acc would be 1 whatever the answer); with `data.empty_answers: drop` such answers are dropped
instead (a question left with none goes too), and counted: NQ-open has a few ('---', ')', '*', 'A+').
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from centralrl.config import CorpusSource, DataConfig, QuestionSource
from centralrl.errors import ConfigError, DataError
from centralrl.metrics import normalize_answer
from centralrl.schema import (
    SPLITS,
    Passage,
    Question,
    by_id,
    check_supporting_ids,
    examples,
    passage_problems,
    refuse_rows,
)


@dataclass(frozen=True)
class Dataset:
    questions: list[Question]
    passages: list[Passage]
    dropped_overlap: int | None = None  # training questions dropped as copies of evaluation ones (None: refused)
    dropped_answers: int | None = None  # golden answers dropped as empty after normalization (None: refused)
    dropped_repeats: int | None = None  # evaluation questions dropped as repeats of another (None: refused)

    def split(self, name: str) -> list[Question]:
        return [q for q in self.questions if q.split == name]


def merge_passages(groups: Iterable[Iterable[Passage]]) -> list[Passage]:
    """Concatenate passage lists, keeping the first of identical duplicates; a reused id with other text fails."""
    merged: dict[str, Passage] = {}
    for passage in (p for group in groups for p in group):
        seen = merged.setdefault(passage.id, passage)
        if seen != passage:
            raise DataError(
                f"passage id {passage.id!r} names two different passages ({seen.title!r} and {passage.title!r})"
            )
    return list(merged.values())


def check_unique_ids(by_source: list[list[Question]]) -> None:
    """Refuse an id that two sources (the questions of each `data.questions` entry) both give: a source's own ids
    differ (`formats.load_questions`), so a clash is two sources of one benchmark whose rows share an id or a row
    number."""
    owner: dict[str, int] = {}
    for index, questions in enumerate(by_source):
        other = next((owner[q.id] for q in questions if q.id in owner), None)
        if other is not None:
            clashes = [q.id for q in questions if owner.get(q.id) == other]
            raise DataError(
                f"data.questions.{other} and data.questions.{index} give the same question ids: {examples(clashes)}; "
                "an id is <benchmark>/<the row's id, or its row number>, so give each source its own benchmark"
            )
        owner.update(dict.fromkeys((q.id for q in questions), index))


def overlapping_train(questions: list[Question]) -> dict[str, str]:
    """Training question id -> the evaluation question it repeats (same id or the same normalized text)."""
    evaluation = [q for q in questions if q.split != "train"]
    by_id = {q.id: q.id for q in evaluation}
    by_text = {normalize_answer(q.question): q.id for q in evaluation}
    return {
        q.id: by_id.get(q.id) or by_text[normalize_answer(q.question)]
        for q in questions
        if q.split == "train" and (q.id in by_id or normalize_answer(q.question) in by_text)
    }


def check_no_overlap(questions: list[Question]) -> None:
    """Refuse a dataset where an evaluation question is also a training question, by id or by normalized text."""
    clashes = [f"{test} = train {train}" for train, test in overlapping_train(questions).items()]
    if clashes:
        raise DataError(
            f"{len(clashes)} evaluation question(s) also appear in training: {examples(clashes)}; "
            "remove them from one split (never train on a dev or test file), or set data.train_overlap: drop"
        )


def repeated(questions: list[Question]) -> dict[str, str]:
    """Evaluation question id -> the earlier one of its benchmark and split it repeats: the same normalized text
    and the same normalized answers. The same text with other answers is another question (PopQA asks "What is
    Will Smith's occupation?" of two people)."""
    first: dict[tuple, str] = {}
    repeats = {}
    for q in (q for q in questions if q.split != "train"):
        key = (q.split, q.benchmark, normalize_answer(q.question), frozenset(map(normalize_answer, q.golden_answers)))
        if first.setdefault(key, q.id) != q.id:
            repeats[q.id] = first[key]
    return repeats


def check_no_repeats(questions: list[Question]) -> None:
    """Refuse an evaluation question that repeats another (`repeated`): it would count twice in every score."""
    repeats = [f"{later} = {earlier}" for later, earlier in repeated(questions).items()]
    if repeats:
        raise DataError(
            f"{len(repeats)} evaluation question(s) repeat another of their benchmark, with the same answers: "
            f"{examples(repeats)}; each would count twice in every score: remove one of each, or set "
            "data.repeated_questions: drop"
        )


def drop_overlap(questions: list[Question]) -> tuple[list[Question], int]:
    """The questions without the training copies of evaluation questions, and how many were dropped."""
    copies = overlapping_train(questions)
    return [q for q in questions if not (q.split == "train" and q.id in copies)], len(copies)


def check_bounds(questions: list[Question], passages: list[Passage], data: DataConfig, origin: str) -> None:
    """Refuse, naming each row and `origin` (its file), an over-long question or passage, a passage without
    text and a golden answer that normalizes to the empty string. A question source's passages are named by id
    (they come from its rows' contexts); a corpus file's by line (`formats.load_corpus`)."""
    problems = [
        f"question {q.id} ({q.benchmark}) has {len(q.question)} characters, above data.max_question_chars "
        f"{data.max_question_chars}"
        for q in questions
        if len(q.question) > data.max_question_chars
    ]
    problems += [
        f"question {q.id} ({q.benchmark}): golden answer {answer!r} normalizes to the empty string, so "
        "every prediction would match it (data.empty_answers: drop drops such answers)"
        for q in questions
        for answer in q.golden_answers
        if not normalize_answer(answer)
    ]
    refuse_rows(problems + passage_problems(by_id(passages), data.max_passage_chars), origin)


def drop_empty_answers(questions: list[Question]) -> tuple[list[Question], int]:
    """Drop every golden answer that normalizes to the empty string, and a question left with none; return the
    questions kept and the number of answers dropped."""
    kept, dropped = [], 0
    for q in questions:
        answers = tuple(a for a in q.golden_answers if normalize_answer(a))
        dropped += len(q.golden_answers) - len(answers)
        if answers:
            kept.append(replace(q, golden_answers=answers))
    return kept, dropped


def _origin(source: QuestionSource | CorpusSource) -> str:
    """Where a source's rows come from, for messages: its file, its hub dataset, or the generator."""
    return getattr(source, "path", None) or getattr(source, "dataset_id", None) or f"the {source.kind} source"


def _load_source(source: QuestionSource, data: DataConfig, root: Path) -> tuple[list[Question], list[Passage]]:
    if source.kind == "synthetic":
        from centralrl.data import synthetic

        return synthetic.generate(data.synthetic)
    from centralrl.data import formats

    return formats.load_questions(source, root)


def source_files(data: DataConfig, base: Path) -> dict[str, Path]:
    """The file each source reads, by its param (`data.questions.1.path`, `data.corpus.0.path`), relative paths
    taken from `data.root` (`DataConfig.root_path`); hub and synthetic sources read none."""
    from centralrl.data.formats import resolve

    paths = {f"data.questions.{i}.path": source.path for i, source in enumerate(data.questions) if source.path}
    paths |= {f"data.corpus.{i}.path": source.path for i, source in enumerate(data.corpus)}
    return {param: resolve(path, data.root_path(base)) for param, path in paths.items()}


def collect(data: DataConfig, base: Path) -> Dataset:
    """Load every question and corpus source named in `data`, merge, and check the result; a relative
    `data.root` starts from `base`, the params file's folder (`DataConfig.root_path`)."""
    root = data.root_path(base)
    if not root.is_dir():
        state = "is a file, not a folder" if root.exists() else "does not exist"
        raise ConfigError(f"data.root: folder {root} {state} (source paths are relative to it)")
    from centralrl.data import formats

    by_source: list[list[Question]] = []
    passage_groups: list[list[Passage]] = []
    dropped_answers = 0 if data.empty_answers == "drop" else None
    for source in data.questions:
        loaded, carried = _load_source(source, data, root)
        if dropped_answers is not None:
            loaded, dropped = drop_empty_answers(loaded)
            dropped_answers += dropped
        check_bounds(loaded, carried, data, _origin(source))
        by_source.append(loaded)
        passage_groups.append(carried)
    for source in data.corpus:
        passage_groups.append(formats.load_corpus(source, root, data.max_passage_chars))
    passages = merge_passages(passage_groups)
    check_unique_ids(by_source)
    questions = [q for loaded in by_source for q in loaded]
    dropped = None
    if data.train_overlap == "drop":
        questions, dropped = drop_overlap(questions)
    check_no_overlap(questions)
    dropped_repeats = None
    if data.repeated_questions == "drop":
        repeats = repeated(questions)
        questions, dropped_repeats = [q for q in questions if q.id not in repeats], len(repeats)
    check_no_repeats(questions)
    check_supporting_ids(questions, passages)
    if not any(q.split == "test" for q in questions):
        raise DataError("no evaluation questions: at least one source must have split 'test'")
    return Dataset(questions, passages, dropped, dropped_answers, dropped_repeats)


def counts(dataset: Dataset) -> dict:
    """DVC metrics: questions per split and benchmark (with how many carry evidence), and the corpus size."""
    table: dict = {
        split: defaultdict(lambda: {"questions": 0, "with_supporting_passages": 0, "with_decomposition": 0})
        for split in SPLITS
    }
    for q in dataset.questions:
        row = table[q.split][q.benchmark]
        row["questions"] += 1
        row["with_supporting_passages"] += bool(q.supporting_passage_ids)
        row["with_decomposition"] += bool(q.decomposition)
    dropped = {} if dataset.dropped_overlap is None else {"train_dropped_as_overlap": dataset.dropped_overlap}
    if dataset.dropped_answers is not None:
        dropped["golden_answers_dropped_as_empty"] = dataset.dropped_answers
    if dataset.dropped_repeats is not None:
        dropped["evaluation_dropped_as_repeats"] = dataset.dropped_repeats
    return {
        "corpus_passages": len(dataset.passages),
        **dropped,
        **{split: dict(sorted(rows.items())) for split, rows in table.items()},
    }
