"""The one normalized schema every data source is converted to: `Question` rows and `Passage` rows.

A question row (one JSON line in `train.jsonl` / `test.jsonl`):
    id, question, golden_answers [str, ...], benchmark, split (train | test),
    supporting_passage_ids [passage id, ...] (empty when the source has no evidence),
    decomposition [{question, answer, passage_ids}, ...] (empty when unknown).
A passage row (one JSON line in `corpus.jsonl`): id, title, text.

Passage ids of real data are content hashes (`passage_id`), so the same paragraph reached from two sources
(a HotpotQA context and a HippoRAG corpus file, say) is one passage, and supporting ids stay valid.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from centralrl.errors import DataError
from centralrl.io import read_jsonl

T = TypeVar("T")

SPLITS = ("train", "test")  # test = what evaluation reads (HotpotQA/2Wiki/MuSiQue dev files go here)


def passage_id(title: str, text: str) -> str:
    """Stable id of a passage from its content.

    >>> passage_id("Paris", "Paris is the capital of France.")
    'p-11651935d56413fd'
    """
    digest = hashlib.sha1(f"{title.strip()}\n{text.strip()}".encode("utf-8")).hexdigest()
    return f"p-{digest[:16]}"


def passage_problems(passages: Iterable[Located], max_chars: int) -> list[str]:
    """What makes each unusable passage so: no text (a retriever would hand a role its title alone), or more than
    `max_chars` characters (`data.max_passage_chars`)."""
    problems = []
    for where, p in passages:
        if not p.text.strip():
            problems.append(f"{where} ({p.title!r}) has no text: a retriever would hand a role its title alone")
        elif len(p.text) > max_chars:
            problems.append(
                f"{where} ({p.title!r}) has {len(p.text)} characters, above data.max_passage_chars {max_chars}"
            )
    return problems


def refuse_rows(problems: list[str], origin: str, limit: int = 5) -> None:
    """Raise one DataError naming `origin` (a file), how many rows it refuses and the first `limit` reasons."""
    if problems:
        more = f"; and {len(problems) - limit} more" if len(problems) > limit else ""
        raise DataError(f"{origin}: {len(problems)} row(s) refused: {'; '.join(problems[:limit])}{more}")


def _refuse_unknown_fields(row: dict, kind: type, where: str) -> None:
    """Refuse a field `kind` (a dataclass of this module) does not have: a misspelt optional field
    ("supporting_pasage_ids") would otherwise read as empty."""
    known = {f.name for f in fields(kind)}
    if unknown := sorted(set(row) - known):
        listed = ", ".join(map(repr, unknown))
        raise DataError(f"{where}: unknown field(s) {listed}; known: {', '.join(sorted(known))}")


def _require(row: dict, key: str, kind: type, where: str) -> Any:
    """Return row[key] if present and of `kind`, else raise DataError naming the field and the row."""
    if key not in row:
        raise DataError(f"{where}: missing field '{key}'")
    value = row[key]
    if not isinstance(value, kind):
        raise DataError(f"{where}: field '{key}' should be {kind.__name__}, got {type(value).__name__}")
    return value


def _strings(value: object, key: str, where: str) -> tuple[str, ...]:
    """A list of strings as a tuple; anything else (null, a string, which would split into characters, a list
    holding a non-string) raises DataError naming the field and the row."""
    if not isinstance(value, list):
        raise DataError(f"{where}: field '{key}' should be a list of strings, got {type(value).__name__}")
    if not all(isinstance(item, str) for item in value):
        raise DataError(f"{where}: field '{key}' should be a list of strings")
    return tuple(value)


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    def to_json(self) -> dict:
        return {"id": self.id, "title": self.title, "text": self.text}

    @classmethod
    def from_json(cls, row: dict, where: str) -> Passage:
        pid = _require(row, "id", str, where)
        where = f"{where} (passage {pid})"
        _refuse_unknown_fields(row, cls, where)
        return cls(pid, _require(row, "title", str, where), _require(row, "text", str, where))


# A passage and where it came from, for messages: its id, or a corpus file's row ("line 17")
Located = tuple[str, Passage]


def by_id(passages: Iterable[Passage]) -> Iterator[Located]:
    """Passages named by their ids: those of a file that has them (corpus.jsonl) or of questions' contexts."""
    return ((f"passage {p.id}", p) for p in passages)


@dataclass(frozen=True)
class SubQuestion:
    """One hop of a decomposition: the sub-question, its answer, and the passages that hold it."""

    question: str
    answer: str
    passage_ids: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"question": self.question, "answer": self.answer, "passage_ids": list(self.passage_ids)}

    @classmethod
    def from_json(cls, row: object, where: str) -> SubQuestion:
        if not isinstance(row, dict):
            raise DataError(
                f"{where}: should be an object {{question, answer, passage_ids}}, got {type(row).__name__}"
            )
        _refuse_unknown_fields(row, cls, where)
        ids = _strings(row.get("passage_ids", []), "passage_ids", where)
        return cls(_require(row, "question", str, where), _require(row, "answer", str, where), ids)


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    golden_answers: tuple[str, ...]
    benchmark: str
    split: str
    supporting_passage_ids: tuple[str, ...] = ()
    decomposition: tuple[SubQuestion, ...] = field(default=())

    def __post_init__(self) -> None:
        problem = _question_problem(self.id, self.question, self.golden_answers, self.benchmark, self.split)
        if problem is not None:
            raise DataError(f"question {self.id!r} ({self.benchmark}): {problem}")

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "benchmark": self.benchmark,
            "split": self.split,
            "supporting_passage_ids": list(self.supporting_passage_ids),
            "decomposition": [step.to_json() for step in self.decomposition],
        }

    @classmethod
    def from_json(cls, row: dict, where: str) -> Question:
        qid = _require(row, "id", str, where)
        where = f"{where} (question {qid})"
        _refuse_unknown_fields(row, cls, where)
        steps = row.get("decomposition", [])
        if not isinstance(steps, list):
            raise DataError(f"{where}: field 'decomposition' should be a list")
        question = _require(row, "question", str, where)
        answers = _strings(_require(row, "golden_answers", list, where), "golden_answers", where)
        split = _require(row, "split", str, where)
        benchmark = _require(row, "benchmark", str, where)
        problem = _question_problem(qid, question, answers, benchmark, split)
        if problem is not None:  # said of the file and line, before the row becomes a Question
            raise DataError(f"{where}: {problem}")
        return cls(
            id=qid,
            question=question,
            golden_answers=answers,
            benchmark=benchmark,
            split=split,
            supporting_passage_ids=_strings(row.get("supporting_passage_ids", []), "supporting_passage_ids", where),
            decomposition=tuple(
                SubQuestion.from_json(step, f"{where} decomposition[{i}]") for i, step in enumerate(steps)
            ),
        )


RESERVED_BENCHMARKS = ("macro",)  # keys of an evaluation's score table beside the benchmarks' own


def benchmark_problem(name: str) -> str | None:
    """What makes `name` no benchmark name, or None: benchmarks key score tables, dev metrics and records.

    >>> benchmark_problem("hotpotqa"), benchmark_problem(" "), benchmark_problem("macro")
    (None, "empty benchmark name ' '", "benchmark name 'macro' is reserved: the score table's average over benchmarks")
    """
    if not name.strip() or name != name.strip():
        return f"{'empty' if not name.strip() else 'blank-padded'} benchmark name {name!r}"
    if name in RESERVED_BENCHMARKS:
        return f"benchmark name {name!r} is reserved: the score table's average over benchmarks"
    return None


def _question_problem(
    qid: str, question: str, golden_answers: Sequence[str], benchmark: str, split: str
) -> str | None:
    """What makes these fields no question, or None."""
    if not qid.strip():
        return "empty id"
    if (problem := benchmark_problem(benchmark)) is not None:
        return problem
    if not question.strip():
        return "empty question text"
    if not golden_answers or not all(answer.strip() for answer in golden_answers):
        return "golden_answers must be a non-empty list of non-empty strings"
    if split not in SPLITS:
        return f"split {split!r} is not one of {', '.join(SPLITS)}"
    return None


def read_questions(path: str | Path, split: str | None = None) -> list[Question]:
    """The question rows of a JSONL file (prepare_data's train.jsonl or test.jsonl), in file order; an id seen
    before is refused with both lines (records, pairs and dev splits are keyed by id). With `split`, a row of
    another split is refused (a stage given the test file to train on, or the reverse)."""

    def parse(row: dict, where: str) -> Question:
        question = Question.from_json(row, where)
        if split is not None and question.split != split:
            raise DataError(
                f"{where} (question {question.id}): a {question.split} question where {split} questions are read; "
                f"give prepare_data's --{split} file"
            )
        return question

    return _once_each(path, parse)


def read_passages(path: str | Path) -> list[Passage]:
    """The passages of a JSONL corpus (prepare_data's corpus.jsonl, an index's passages), in file order; an id
    seen before is refused with both lines (a retriever answers with ids)."""
    return _once_each(path, Passage.from_json)


def _once_each(path: str | Path, parse) -> list:
    """The rows of `path` parsed (each with an `id`), refusing an id that came before. Only the ids are held
    while reading (a 21M-passage corpus would double in bookkeeping otherwise); the earlier line is looked up
    again on a repeat."""
    kept, seen = [], set()
    for where, row in read_jsonl(path):
        item = parse(row, where)
        if item.id in seen:
            first = next(w for w, earlier in read_jsonl(path) if earlier.get("id") == item.id)
            raise DataError(f"{where}: id {item.id!r} is already used at {first}")
        seen.add(item.id)
        kept.append(item)
    return kept


def examples(items: Iterable[str], limit: int = 5) -> str:
    """The first `limit` of the sorted items, quoted, and how many more.

    >>> examples(["c", "a", "b"], limit=2)
    "'a', 'b' and 1 more"
    """
    items = sorted(items)
    shown = ", ".join(repr(item) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def check_supporting_ids(questions: Iterable[Question], passages: Iterable[Passage], source: str = "") -> None:
    """Refuse questions whose supporting passage ids name no passage (their recall@k would count a miss that no
    retriever could avoid); `source` starts the message (the question file)."""
    known = {p.id for p in passages}
    missing = {f"{q.id} -> {pid}" for q in questions for pid in q.supporting_passage_ids if pid not in known}
    if missing:
        where = f"{source}: " if source else ""
        raise DataError(f"{where}supporting passages missing from the corpus: {examples(missing)}")


def interleave(questions: Iterable[T], benchmark: Callable[[T], str] = lambda q: q.benchmark) -> list[T]:
    """Round-robin over benchmarks (in order of first appearance), file order within each benchmark.
    `benchmark` names an item's benchmark: the question's own by default (items may be positions, say)."""
    groups: dict[str, list[T]] = {}
    for question in questions:
        groups.setdefault(benchmark(question), []).append(question)
    lists = list(groups.values())
    return [group[i] for i in range(max(map(len, lists), default=0)) for group in lists if i < len(group)]
