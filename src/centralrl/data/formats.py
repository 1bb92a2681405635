"""Read the official files of the QA benchmarks and corpora into the project's `Question` and `Passage` rows.

`load_questions(source, root)` returns a source's questions plus the context paragraphs the file carries
(HotpotQA, 2Wiki, MuSiQue, PopQA); `load_corpus(source, root, max_chars)` returns the passages of a corpus file. One
converter per kind, chosen through the `QUESTION_KINDS` / `CORPUS_KINDS` tables.

Shared rules: a question's id is `<benchmark>/<id in the file>` (the 0-based row index where the file has no
id); `limit` keeps the first N rows in file order before anything is converted; answers are stripped, numbers
become strings and duplicates go (order kept); a row without a usable answer, a missing field or a malformed
line raises DataError naming the file, the line or row and the field. Nothing is dropped silently. Passage ids
are content hashes (`passage_id`) of the stripped title and text, and each call returns a passage once.

Where this departs from the original formats:
- HotpotQA paragraphs are `"".join(sentences)` (its sentences carry their leading spaces), the same text as
  HippoRAG's {title: [sentences]} corpus files, so supporting ids resolve in those corpora. 2Wiki's official
  sentences carry no spaces, so they are joined with one space, the text of HippoRAG's 2Wiki corpus.
- Supporting passages are whole paragraphs: a paragraph supports a question when any of its sentences is a
  supporting fact; sentence indices are not kept.
- MuSiQue: a row with `answerable` false (MuSiQue-full) is an error, not skipped; a missing `answerable`
  counts as answerable. Golden answers are `answer` followed by `answer_aliases`.
- `source_filter` (qa_jsonl: the `source` field; searchr1_parquet: the `data_source` column) compares
  case-insensitively (DeepResearcher writes "Bamboogle") and is applied before `limit`; a filter that keeps no
  row is an error that lists the sources the file has. A file of several sources (Search-R1's merged parquet
  files, DeepResearcher's mixed JSON lines) needs one: without it the file is refused.
- JSON-family question files may be a JSON list or JSON lines (told apart by the first character), and PopQA
  may also be the official popQA.tsv. A file other than .jsonl that is one JSON object (`{"data": [...]}`) is
  refused as not a list (it was read as one row missing every field); one question in JSON lines is a .jsonl.
- kilt_pages: a KILT page is a list of raw paragraphs; see `kilt_chunks` for how they become ~100-word
  passages (DPR cuts fixed 100-word windows across paragraph ends instead).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from centralrl.data import hub
from centralrl.errors import DataError
from centralrl.io import read_json, read_jsonl, require_file, text_lines
from centralrl.schema import Located, Passage, Question, SubQuestion, passage_id, passage_problems, refuse_rows

if TYPE_CHECKING:  # config.py imports this module's kind tables
    from centralrl.config import CorpusSource, QuestionSource

KILT_PASSAGE_WORDS = 100
KILT_SKIPPED_SECTIONS = frozenset(
    {"See also", "External links", "References", "Further reading", "Notes", "Bibliography", "Sources", "Footnotes"}
)


@dataclass(frozen=True)
class Row:
    """One record of a source: its 0-based position, where it is (for messages), its fields, its original id."""

    index: int
    where: str
    data: dict
    id: str | None = None

    def with_id(self, original_id: Any) -> Row:
        if isinstance(original_id, bool) or not isinstance(original_id, (str, int)):
            raise DataError(f"{self.where}: an id must be a string or a whole number, got {original_id!r}")
        if not str(original_id).strip():
            raise DataError(f"{self.where}: empty id {original_id!r}")
        return replace(self, id=str(original_id), where=f"{self.where} (id {original_id})")

    def get(self, key: str, kind: type | tuple[type, ...] = object) -> Any:
        return field(self.data, key, kind, self.where)


def field(mapping: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """mapping[key], or DataError naming the field and `where` when it is missing or of the wrong type."""
    if not isinstance(mapping, dict):
        raise DataError(f"{where}: expected an object with field '{key}', got {type(mapping).__name__}")
    if key not in mapping:
        raise DataError(f"{where}: missing field '{key}'")
    value = mapping[key]
    if not isinstance(value, kind):
        names = "/".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
        raise DataError(f"{where}: field '{key}' should be {names}, got {type(value).__name__}")
    return value


def answers(value: Any, key: str, where: str) -> tuple[str, ...]:
    """Golden answers from a string, a number or a list of them: stripped, as strings, deduplicated in order.
    A blank answer beside usable ones is refused (it was dropped without a word): the row is malformed.

    >>> answers([" Paris", 1889, "Paris", 3.0], "answer", "f:1")
    ('Paris', '1889', '3')
    """
    kept: list[str] = []
    blank = False
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise DataError(f"{where}: field '{key}' holds a {type(item).__name__}; answers are strings or numbers")
        if isinstance(item, float) and not math.isfinite(item):
            raise DataError(f"{where}: field '{key}' holds {item!r}, which is not an answer")
        text = (str(int(item)) if isinstance(item, float) and item.is_integer() else str(item)).strip()
        blank |= not text
        if text and text not in kept:
            kept.append(text)
    if not kept:
        raise DataError(f"{where}: no usable answer in field '{key}' (got {value!r})")
    if blank:
        raise DataError(f"{where}: field '{key}' holds a blank answer beside usable ones (got {value!r})")
    return tuple(kept)


def make_passage(title: str, text: str) -> Passage:
    return Passage(passage_id(title, text), title.strip(), text.strip())


def resolve(path: str, root: Path) -> Path:
    """`path` itself when absolute, else `root / path`."""
    return Path(path) if Path(path).is_absolute() else Path(root) / path


# --- reading records --------------------------------------------------------------------------------------


def _numbered(records: Iterable[tuple[str, dict]]) -> Iterator[Row]:
    return (Row(index, where, data) for index, (where, data) in enumerate(records))


def _json_list(path: Path) -> Iterator[tuple[str, dict]]:
    loaded = read_json(path)
    if not isinstance(loaded, list):
        raise DataError(f"{path}: expected a JSON list of rows, got {type(loaded).__name__}")
    for index, row in enumerate(loaded):
        if not isinstance(row, dict):
            raise DataError(f"{path} row {index}: expected a JSON object, got {type(row).__name__}")
        yield f"{path} row {index}", row


def _tsv(path: Path) -> Iterator[tuple[str, dict]]:
    """(`file:line`, {column: cell}) per row under the header; a row with more cells than the header has
    columns is refused (DictReader would file the extra cells under the key None)."""
    reader = csv.DictReader(text_lines(path), delimiter="\t")
    for row in reader:
        where = f"{path}:{reader.line_num}"
        if None in row:
            raise DataError(
                f"{where}: {len(row[None])} more cell(s) than the header's {len(reader.fieldnames)} columns"
            )
        yield where, row


def _first_byte(path: Path) -> bytes:
    """The file's first byte that is not whitespace (bytes: a file that is not UTF-8 is named by its reader,
    with the line)."""
    with require_file(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(4096), b""):
            if chunk.strip():
                return chunk.strip()[:1]
    return b""


def _json_value(raw: bytes) -> Any:
    """`raw` parsed as JSON, or None when it is not JSON (its reader names the problem and the line)."""
    try:
        return json.loads(raw)
    except ValueError:  # malformed JSON or not UTF-8
        return None


def _one_json_object(path: Path) -> bool:
    """Whether the file holds a single JSON object and nothing more: a document, not JSON lines (a second row is
    more JSON after the first line's). Read as JSON lines, such a file was one row, and that row's first missing
    field was named ("file:1 missing field '_id'") instead of the file's shape. Only a file whose first line is
    no JSON of its own (an indented object) is read whole to tell."""
    with require_file(path).open("rb") as handle:
        lines = list(itertools.islice((line for line in handle if line.strip()), 2))
    first = _json_value(lines[0]) if lines else None
    if len(lines) == 1 or first is not None:
        return len(lines) == 1 and isinstance(first, dict)
    return isinstance(_json_value(path.read_bytes()), dict)


def records(path: Path, rows: str = "rows") -> Iterator[tuple[str, dict]]:
    """(where, row) pairs of a .tsv file, a JSON list (file starts with '[') or JSON lines; a .jsonl file is
    JSON lines whatever it starts with (a first line holding a JSON array is that line's error, not the file's
    rows). Any other file that is one JSON object is refused, saying it must be a JSON list of `rows`."""
    if path.suffix == ".tsv":
        return _tsv(path)
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    if _first_byte(path) == b"[":
        return _json_list(path)
    if _one_json_object(path):
        raise DataError(
            f"{path}: a JSON object, but this file must be a JSON list of {rows} ([{{...}}, ...]) or JSON lines "
            f"(one per line; a .jsonl file of one line is read as one)"
        )
    return read_jsonl(path)


def _open_parquet(path: Path):  # -> pyarrow.parquet.ParquetFile
    import pyarrow.parquet as pq  # deferred: only parquet sources need it

    require_file(path)
    try:
        return pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises ArrowInvalid or OSError for a bad file
        raise DataError(f"{path}: not a readable parquet file ({error})") from None


def _parquet(path: Path) -> Iterator[tuple[str, dict]]:
    parquet = _open_parquet(path)
    index = 0
    for batch in parquet.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield f"{path} row {index}", row
            index += 1


def _file_rows(source: QuestionSource, root: Path) -> Iterator[Row]:
    return _numbered(records(resolve(source.path, root), "questions"))


def _hub_rows(source: QuestionSource, root: Path) -> Iterator[Row]:
    return _numbered(hub.rows(source, root))


# kind -> the column its `source_filter` compares with; the other kinds take no source_filter (config.py)
SOURCE_FILTER_COLUMNS = {"qa_jsonl": "source", "searchr1_parquet": "data_source"}


def _present(counted: dict[str, int]) -> str:
    """'nq (2), tq (1)': each value with how many rows hold it, sorted by value."""
    return ", ".join(f"{value} ({n})" for value, n in sorted(counted.items()))


def _filtered_rows(rows: Iterable[Row], column: str, wanted: str, path: Path) -> Iterator[Row]:
    """The rows whose `column` equals `wanted`, compared case-insensitively (DeepResearcher writes "Bamboogle");
    a filter that keeps no row is an error listing the values the file has. Rows keep their index in the file."""
    counted: dict[str, int] = {}
    for row in rows:
        value = row.get(column, str)
        counted[value] = counted.get(value, 0) + 1
        if value.casefold() == wanted.casefold():
            yield row
    if not any(value.casefold() == wanted.casefold() for value in counted):
        raise DataError(f"{path}: no row has {column} {wanted!r}; present: {_present(counted)}")


def _refuse_several(counted: dict[str, int], column: str, path: Path) -> None:
    """A file whose rows name several datasets in `column` (compared as `source_filter` compares) is an error:
    read whole, every dataset would be filed under one benchmark (with a `limit`, silently its first ones)."""
    if len({value.casefold() for value in counted}) > 1:
        raise DataError(
            f"{path}: rows of several {column}s ({_present(counted)}): read each as its own data.questions entry, "
            f"with source_filter and its benchmark"
        )


def _qa_rows(source: QuestionSource, root: Path) -> Iterator[Row]:
    """qa_jsonl rows, only those whose `source` field is `source.source_filter` when it is set; without one, a
    file of several sources (DeepResearcher's mixed files) is refused."""
    path = resolve(source.path, root)
    if source.source_filter is not None:
        return _filtered_rows(_file_rows(source, root), "source", source.source_filter, path)
    rows = list(_file_rows(source, root))
    counted: dict[str, int] = {}
    for row in rows:
        if "source" in row.data:
            counted[str(row.data["source"])] = counted.get(str(row.data["source"]), 0) + 1
    _refuse_several(counted, "source", path)
    return iter(rows)


def _searchr1_rows(source: QuestionSource, root: Path) -> Iterator[Row]:
    """Search-R1 parquet rows, only those whose `data_source` is `source.source_filter` when it is set.

    Search-R1's merged files (qa_search_test_merge.py, qa_search_train_merge.py) concatenate FlashRAG datasets,
    naming each row's dataset in `data_source` and keeping FlashRAG's ids, which restart per dataset (nq test_0,
    triviaqa test_0, ...). Read whole, such a file would file every dataset under one benchmark (with a `limit`,
    silently) or clash on ids, so a file of several data_sources without a filter is refused."""
    path = resolve(source.path, root)
    if source.source_filter is not None:
        return _filtered_rows(_numbered(_parquet(path)), "data_source", source.source_filter, path)
    parquet = _open_parquet(path)
    if "data_source" in parquet.schema_arrow.names:
        counted: dict[str, int] = {}
        for value in parquet.read(columns=["data_source"]).column("data_source").to_pylist():
            counted[str(value)] = counted.get(str(value), 0) + 1
        _refuse_several(counted, "data_source", path)  # whose ids also restart per data_source
    return _numbered(_parquet(path))


# --- one converter per question kind ---------------------------------------------------------------------

Converted = tuple[Question, list[Passage]]


def _question(
    source: QuestionSource, row: Row, text: Any, golden: tuple[str, ...], supporting=(), steps=()
) -> Question:
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"{row.where}: empty or missing question text")
    return Question(
        id=f"{source.benchmark}/{row.id if row.id is not None else row.index}",
        question=text.strip(),
        golden_answers=golden,
        benchmark=source.benchmark,
        split=source.split,
        supporting_passage_ids=tuple(supporting),
        decomposition=tuple(steps),
    )


def _optional_id(row: Row, keys: tuple[str, ...]) -> Row:
    """The row named by the first of `keys` it has (not null), else by its 0-based index."""
    key = next((k for k in keys if row.data.get(k) is not None), None)
    return row.with_id(row.data[key] if key else row.index)


def flashrag_question(row: Row, source: QuestionSource) -> Converted:
    """FlashRAG row {id, question, golden_answers, metadata}; also the rows of FlashRAG_datasets on the hub."""
    row = row.with_id(row.get("id", (str, int)))
    golden = answers(row.get("golden_answers"), "golden_answers", row.where)
    return _question(source, row, row.get("question", str), golden), []


def _prompt_question(row: Row) -> str:
    """The question Search-R1 wrote into its prompt, after the last 'Question: '."""
    prompt = row.get("prompt", list)
    contents = [m.get("content") for m in prompt if isinstance(m, dict) and isinstance(m.get("content"), str)]
    hit = next((c for c in reversed(contents) if "Question: " in c), None)
    if hit is None:
        raise DataError(f"{row.where}: no 'question' column and no 'Question: ' in the prompt")
    return hit.rsplit("Question: ", 1)[1]


def searchr1_question(row: Row, source: QuestionSource) -> Converted:
    """Search-R1 parquet: `question` / `golden_answers` columns, else the prompt and reward_model target."""
    row = _optional_id(row, ("id",))
    text = row.data["question"] if row.data.get("question") is not None else _prompt_question(row)
    if row.data.get("golden_answers") is not None:
        golden = answers(row.data["golden_answers"], "golden_answers", row.where)
    else:
        truth = field(row.get("reward_model", dict), "ground_truth", dict, f"{row.where} reward_model")
        target = field(truth, "target", (list, str), f"{row.where} reward_model.ground_truth")
        golden = answers(target, "target", row.where)
    return _question(source, row, text, golden), []


def _is_title_sentences(item: Any) -> bool:
    return (
        isinstance(item, list)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], list)
        and all(isinstance(s, str) for s in item[1])
    )


def _context(row: Row, join: Callable[[list[str]], str]) -> list[Passage]:
    """Context paragraphs given as [title, [sentences]] (joined with `join`) or as {title, text}."""
    passages = []
    for i, item in enumerate(row.get("context", list)):
        if isinstance(item, dict):
            where = f"{row.where} context[{i}]"
            passages.append(make_passage(field(item, "title", str, where), field(item, "text", str, where)))
        elif _is_title_sentences(item):
            passages.append(make_passage(item[0], join(item[1])))
        else:
            raise DataError(f"{row.where}: context[{i}] is neither [title, [sentences]] nor {{title, text}}")
    return passages


def _supporting_by_title(row: Row, context: list[Passage]) -> list[str]:
    """Ids of the context paragraphs whose title appears in supporting_facts [[title, sentence index], ...]."""
    facts = row.get("supporting_facts", list)
    if not all(isinstance(f, list) and f and isinstance(f[0], str) for f in facts):
        raise DataError(f"{row.where}: field 'supporting_facts' should be a list of [title, sentence index]")
    titles = {f[0].strip() for f in facts}
    missing = titles - {p.title for p in context}
    if missing:
        raise DataError(f"{row.where}: supporting_facts name titles not in the context: {sorted(missing)}")
    return [p.id for p in context if p.title in titles]


def _multihop(row: Row, source: QuestionSource, join: Callable[[list[str]], str]) -> Converted:
    row = row.with_id(row.get("_id", str))
    context = _context(row, join)
    golden = answers(row.get("answer"), "answer", row.where)
    return _question(source, row, row.get("question", str), golden, _supporting_by_title(row, context)), context


def hotpotqa_question(row: Row, source: QuestionSource) -> Converted:
    """HotpotQA: sentences keep their leading spaces, so a paragraph is their plain concatenation."""
    return _multihop(row, source, "".join)


def twowiki_question(row: Row, source: QuestionSource) -> Converted:
    """2WikiMultihopQA, official ([title, [sentences]]) or with {title, text} paragraphs."""
    return _multihop(row, source, lambda sentences: " ".join(s.strip() for s in sentences))


def _musique_step(step: Any, where: str, by_idx: dict[Any, Passage]) -> SubQuestion:
    support = field(step, "paragraph_support_idx", (int, type(None)), where)
    if support is not None and support not in by_idx:
        raise DataError(f"{where}: paragraph_support_idx {support} is not the idx of any paragraph")
    ids = (by_idx[support].id,) if support is not None else ()
    return SubQuestion(field(step, "question", str, where), str(field(step, "answer", (str, int, float), where)), ids)


def musique_question(row: Row, source: QuestionSource) -> Converted:
    """MuSiQue-ans: 20 paragraphs with is_supporting, and a decomposition into single-hop sub-questions."""
    row = row.with_id(row.get("id", str))
    if row.data.get("answerable", True) is False:
        raise DataError(f"{row.where}: 'answerable' is false (a MuSiQue-full row?); only answerable questions score")
    passages, supporting, by_idx = [], [], {}
    for i, paragraph in enumerate(row.get("paragraphs", list)):
        where = f"{row.where} paragraphs[{i}]"
        passage = make_passage(field(paragraph, "title", str, where), field(paragraph, "paragraph_text", str, where))
        idx = field(paragraph, "idx", int, where) if "idx" in paragraph else i
        if idx in by_idx:
            raise DataError(f"{where}: idx {idx} used by two paragraphs")
        by_idx[idx] = passage
        passages.append(passage)
        if paragraph.get("is_supporting"):
            supporting.append(passage.id)
    decomposition = row.get("question_decomposition", list) if "question_decomposition" in row.data else []
    steps = [_musique_step(s, f"{row.where} question_decomposition[{i}]", by_idx) for i, s in enumerate(decomposition)]
    aliases = row.data.get("answer_aliases") or []
    aliases = aliases if isinstance(aliases, list) else [aliases]
    golden = answers([row.get("answer"), *aliases], "answer/answer_aliases", row.where)
    return _question(source, row, row.get("question", str), golden, supporting, steps), passages


def _popqa_answers(row: Row) -> tuple[str, ...]:
    raw = row.get("possible_answers", (str, list))
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as error:
            message = f"field 'possible_answers' is not a JSON-encoded list ({error.msg}): {raw[:80]!r}"
            raise DataError(f"{row.where}: {message}") from None
    return answers(raw, "possible_answers", row.where)


def popqa_question(row: Row, source: QuestionSource) -> Converted:
    """PopQA: possible_answers is a JSON list inside a string; HippoRAG's copy adds paragraphs."""
    row = _optional_id(row, ("id",))
    passages, supporting = [], []
    for i, paragraph in enumerate(row.data.get("paragraphs") or []):
        where = f"{row.where} paragraphs[{i}]"
        passage = make_passage(field(paragraph, "title", str, where), field(paragraph, "text", str, where))
        passages.append(passage)
        if paragraph.get("is_supporting"):
            supporting.append(passage.id)
    return _question(source, row, row.get("question", str), _popqa_answers(row), supporting), passages


def nq_open_question(row: Row, source: QuestionSource) -> Converted:
    """NQ-open: {question, answer [list]}, no ids (the row index is the id)."""
    row = row.with_id(row.index)
    golden = answers(row.get("answer", (list, str)), "answer", row.where)
    return _question(source, row, row.get("question", str), golden), []


ANSWER_FIELDS = ("golden_answers", "answers", "answer")


def qa_jsonl_question(row: Row, source: QuestionSource) -> Converted:
    """Generic QA rows (Bamboogle, R1-Searcher, DeepResearcher): question plus answer/answers/golden_answers."""
    row = _optional_id(row, ("id", "idx", "_id"))
    key = next((k for k in ANSWER_FIELDS if k in row.data), None)
    if key is None:
        raise DataError(f"{row.where}: missing field 'golden_answers', 'answers' or 'answer'")
    return _question(source, row, row.get("question", str), answers(row.data[key], key, row.where)), []


RowReader = Callable[["QuestionSource", Path], Iterator[Row]]
Converter = Callable[[Row, "QuestionSource"], Converted]

# kind -> (how its rows are read, how one row becomes a question and its passages)
QUESTION_KINDS: dict[str, tuple[RowReader, Converter]] = {
    "flashrag_jsonl": (_file_rows, flashrag_question),
    "searchr1_parquet": (_searchr1_rows, searchr1_question),
    "hotpotqa": (_file_rows, hotpotqa_question),
    "2wikimultihopqa": (_file_rows, twowiki_question),
    "musique": (_file_rows, musique_question),
    "popqa": (_file_rows, popqa_question),
    "nq_open": (_file_rows, nq_open_question),
    "qa_jsonl": (_qa_rows, qa_jsonl_question),
    "hf_dataset": (_hub_rows, flashrag_question),
}


def _describe(source: QuestionSource, root: Path) -> str:
    if source.path:
        return str(resolve(source.path, root))
    return f"{source.dataset_id}[{source.dataset_config}/{source.dataset_split}]"


def load_questions(source: QuestionSource, root: Path) -> tuple[list[Question], list[Passage]]:
    """The questions of `source` (first `source.limit` rows) and the context passages its file carries."""
    if source.kind not in QUESTION_KINDS:
        raise ValueError(f"load_questions reads files; a {source.kind!r} source is generated elsewhere")
    read, convert = QUESTION_KINDS[source.kind]
    questions: list[Question] = []
    passages: dict[str, Passage] = {}
    first_seen: dict[str, str] = {}
    for row in itertools.islice(read(source, Path(root)), source.limit):
        question, carried = convert(row, source)
        if question.id in first_seen:
            raise DataError(f"{row.where}: question id {question.id!r} already used by {first_seen[question.id]}")
        first_seen[question.id] = row.where
        questions.append(question)
        for passage in carried:
            passages.setdefault(passage.id, passage)
    if not questions:
        raise DataError(f"{_describe(source, Path(root))}: no questions in this {source.kind} source")
    return questions, list(passages.values())


# --- corpus kinds -----------------------------------------------------------------------------------------


def flashrag_passages(path: Path) -> Iterator[Located]:
    """FlashRAG / DPR rows {id, contents: '"Title"\\ntext'}: title before the first newline, quotes removed."""
    for where, row in read_jsonl(path):
        title, _, text = field(row, "contents", str, where).partition("\n")
        title = title.strip()
        if len(title) >= 2 and title[0] == title[-1] == '"':
            title = title[1:-1]
        yield where, make_passage(title, text)


def _kilt_section(heading: str) -> str:
    """Top-level section name of a KILT heading: 'Section::::History.:Typographic variants.' -> 'History'."""
    return heading.strip().removeprefix("Section::::").split(".:")[0].rstrip(".").strip()


def _kilt_text(paragraph: str) -> str:
    """A paragraph without its `BULLET::::- ` marker; a '-' that opens plain text stays ('-273.15 °C ...')."""
    text = paragraph.strip()
    if text.startswith("BULLET::::"):
        text = text.removeprefix("BULLET::::").removeprefix("-")
    return text.strip()


def kilt_chunks(title: str, paragraphs: list[str], words: int = KILT_PASSAGE_WORDS) -> Iterator[str]:
    """A KILT page's paragraphs as passages of about `words` words.

    The first paragraph repeats the page title and is skipped; `Section::::` headings are dropped and close
    the current passage (a passage never spans two sections); the link-list sections (`KILT_SKIPPED_SECTIONS`:
    See also, External links, References, ...) are left out whole; `BULLET::::- ` markers are removed
    (numbered ones, `BULLET::::2. `, keep their number).
    Consecutive paragraphs of a section are joined while they fit in `words`; a longer paragraph stays whole,
    so no sentence is cut (in the R1-Searcher sample the median paragraph has 29 words, the longest 354).

    >>> pages = ["A\\n", "One two.\\n", "Section::::History.\\n", "BULLET::::- three\\n", "four five six\\n",
    ...          "Section::::See also.\\n", "B\\n"]
    >>> list(kilt_chunks("A", pages, words=3))
    ['One two.', 'three', 'four five six']
    """
    chunk: list[str] = []
    count = 0
    skipping = False
    start = 1 if paragraphs and paragraphs[0].strip() == title.strip() else 0
    for paragraph in paragraphs[start:]:
        heading = paragraph.strip().startswith("Section::::")
        skipping = _kilt_section(paragraph) in KILT_SKIPPED_SECTIONS if heading else skipping
        text = "" if heading or skipping else _kilt_text(paragraph)
        n = len(text.split())
        if chunk and (heading or count + n > words):
            yield " ".join(chunk)
            chunk, count = [], 0
        if n:
            chunk.append(text)
            count += n
    if chunk:
        yield " ".join(chunk)


def kilt_pages(path: Path) -> Iterator[Located]:
    """KILT Wikipedia pages {wikipedia_title, text [paragraphs]}: ~100-word passages titled by the page."""
    for where, row in read_jsonl(path):
        title = field(row, "wikipedia_title", str, where)
        paragraphs = field(row, "text", list, f"{where} ({title})")
        if not all(isinstance(p, str) for p in paragraphs):
            raise DataError(f"{where} ({title}): field 'text' should be a list of paragraph strings")
        for text in kilt_chunks(title, paragraphs):
            yield where, make_passage(title, text)


def title_sentences(path: Path) -> Iterator[Located]:
    """HippoRAG's HotpotQA corpus {title: [sentences]}: sentences concatenated as in `hotpotqa_question`."""
    loaded = read_json(path)
    if not isinstance(loaded, dict):
        raise DataError(f"{path}: expected a JSON object {{title: [sentences]}}, got {type(loaded).__name__}")
    for title, sentences in loaded.items():
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise DataError(f"{path} ({title}): expected a list of sentences")
        yield f"{path} entry {title!r}", make_passage(title, "".join(sentences))


def title_text_list(path: Path) -> Iterator[Located]:
    """[{title, text}, ...] as a JSON list or JSON lines (HippoRAG's 2Wiki and MuSiQue corpora)."""
    for where, row in records(path, "passages"):
        yield where, make_passage(field(row, "title", str, where), field(row, "text", str, where))


# kind -> a reader of (where, passage) pairs: `where` names the file and row, for messages
CORPUS_KINDS: dict[str, Callable[[Path], Iterator[Located]]] = {
    "flashrag_passages": flashrag_passages,
    "kilt_pages": kilt_pages,
    "title_sentences": title_sentences,
    "title_text_list": title_text_list,
}


def load_corpus(source: CorpusSource, root: Path, max_chars: int) -> list[Passage]:
    """The distinct passages of a corpus file in file order, the first `source.limit` of them if set; refuses
    a passage without text or longer than `max_chars` (`data.max_passage_chars`), naming its line."""
    path = resolve(source.path, root)
    passages: dict[str, Passage] = {}
    problems: list[str] = []  # checked as read: keeping each row's place would double a 21M-passage corpus
    for where, passage in CORPUS_KINDS[source.kind](path):
        if passages.setdefault(passage.id, passage) is passage:
            problems += passage_problems([(_row_of(where, path), passage)], max_chars)
        if source.limit is not None and len(passages) >= source.limit:
            break
    if not passages:
        raise DataError(f"{path}: no passages in this {source.kind} file")
    refuse_rows(problems, str(path))
    return list(passages.values())


def _row_of(where: str, path: Path) -> str:
    """A reader's `where` without its file, which the message names once: 'line 17', 'row 3', "entry 'Title'"."""
    rest = where.removeprefix(str(path))
    return f"line {rest[1:]}" if rest.startswith(":") else rest.strip()
