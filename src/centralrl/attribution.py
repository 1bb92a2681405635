"""Where a harness lost the answer: every wrong episode of an evaluation placed at the last point of the
central harness's data flow where a golden answer was still present, read from the evaluate stage's
`records.jsonl` and the corpus its passages came from.

    python -m centralrl.attribution eval/main/base/records.jsonl eval/main/joint/seed0/equal_steps/records.jsonl

An episode is wrong when its prediction contains no golden answer (Acc 0, the cover-EM of `metrics.acc`). Its
answer was last seen:

- `yes_no`: the answer is yes or no (or noanswer), which any text may contain ("no" is in "nothing"), so
  containment cannot say who lost it;
- `in_question`: the question itself contains a golden answer (a comparison question names both candidates),
  so again containment cannot say;
- `not_retrieved`: in no passage retrieved for any sub-question (as much of it as a role is shown,
  `harness.passage_chars`): the central agent's sub-questions, or the retriever, never reached the evidence;
- `in_passages`: in a retrieved passage, in no note: the retrieval sub-agent left it out (the single-agent
  reference writes no notes: it read the answer and did not give it);
- `in_notes`: in a note, not in the prediction: the conclusion sub-agent did not pick it, or the central
  agent asked past it and the forced conclusion took a later note's entity.

This tells which role a trained arm would have to change: a central-only arm can fix `not_retrieved` (better
sub-questions), but `in_passages` and `in_notes` only through the sub-questions it asks. Containment is a
lower bound on what a role had: a note may paraphrase the answer. Not from the paper; the evaluation records are
unchanged.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from centralrl.errors import CentralRLError, DataError
from centralrl.io import markdown_text, out_file_problem, read_jsonl, write_json
from centralrl.metrics import SPECIAL_ANSWERS, acc, normalize_answer
from centralrl.processes import exit_with
from centralrl.schema import read_passages

PLACES = ("yes_no", "in_question", "not_retrieved", "in_passages", "in_notes")
# what an evaluation record must hold, and its shape: "strings" a list of strings, "hits" a list of such lists
FIELDS = {
    "question": "string",
    "golden_answers": "strings",
    "prediction": "string",
    "notes": "strings",
    "retrieved": "hits",
}


def _shaped(value: object, shape: str) -> bool:
    """Whether `value` has the shape FIELDS names (a string inside a list of strings would be read letter by
    letter).

    >>> _shaped("Paris", "strings"), _shaped(["Paris"], "strings"), _shaped([["p1"], []], "hits")
    (False, True, True)
    """
    if shape == "string":
        return isinstance(value, str)
    inner = "strings" if shape == "hits" else "string"
    return isinstance(value, list) and all(_shaped(item, inner) for item in value)


def check_record(record: Mapping, where: str = "record") -> None:
    """Raise a DataError naming `where` unless `record` holds every field of `FIELDS` in its shape, with golden
    answers that are not empty once normalized."""
    absent = [field for field in FIELDS if field not in record]
    if absent:
        raise DataError(f"{where}: not an evaluation record (no {', '.join(absent)})")
    for field, shape in FIELDS.items():
        if not _shaped(record[field], shape):
            wanted = {"string": "a string", "strings": "a list of strings", "hits": "a list of lists of ids"}[shape]
            raise DataError(f"{where}: field {field!r} should be {wanted}, got {record[field]!r}")
    golden = record["golden_answers"]
    if not golden or not all(normalize_answer(answer) for answer in golden):
        raise DataError(  # no answer: every episode wrong; an empty one: every prediction contains it
            f"{where}: golden_answers {golden!r} must hold answers that are not empty once normalized"
        )


class ShownPassages(dict[str, str]):
    """Passage id -> its title and the text a role is shown of it, with `corpus`, the file they were read from:
    a record's passage missing from them was reported without the file, which may be empty or another run's."""

    def __init__(self, shown: Mapping[str, str], corpus: str | Path) -> None:
        super().__init__(shown)
        self.corpus = str(corpus)


def where_lost(record: Mapping, shown: ShownPassages, where: str = "record") -> str | None:
    """The last place a golden answer was seen in this wrong episode (one of `PLACES`); None when it is right.
    `shown` maps a passage id to the text a role saw of it."""
    check_record(record, where)
    golden = record["golden_answers"]
    if acc(record["prediction"], golden):
        return None
    if any(normalize_answer(answer) in SPECIAL_ANSWERS for answer in golden):
        return "yes_no"
    if acc(record["question"], golden):
        return "in_question"
    if any(acc(note, golden) for note in record["notes"]):
        return "in_notes"
    missing = [pid for hits in record["retrieved"] for pid in hits if pid not in shown]
    if missing:
        why = "which holds no passages" if not shown else "another run's corpus?"
        raise DataError(f"{where}: retrieved passage {missing[0]!r} is not in the corpus {shown.corpus} ({why})")
    if any(acc(shown[pid], golden) for hits in record["retrieved"] for pid in hits):
        return "in_passages"
    return "not_retrieved"


def attribution_table(rows: Sequence[tuple[str, Mapping]], shown: ShownPassages) -> dict:
    """{questions, right, <place>: count for each of `PLACES`} over (where, record) rows."""
    places = Counter(where_lost(record, shown, where) for where, record in rows)
    return {"questions": len(rows), "right": places[None], **{place: places[place] for place in PLACES}}


def shown_passages(corpus: str | Path, passage_chars: int) -> ShownPassages:
    """Passage id -> its title and the first `passage_chars` characters of its text (what a role is shown)."""
    passages = read_passages(corpus)
    return ShownPassages({p.id: f"{p.title}: {p.text[:passage_chars]}" for p in passages}, corpus)


def markdown(tables: Mapping[str, Mapping[str, int]]) -> str:
    """One row per records file: right answers, then each place as a count and a share of the wrong ones."""
    lines = ["| records | questions | right | " + " | ".join(PLACES) + " |", "|---" * (3 + len(PLACES)) + "|"]
    for name, table in tables.items():
        wrong = table["questions"] - table["right"]
        cells = [f"{table[p]} ({table[p] / wrong:.0%})" if wrong else "0" for p in PLACES]
        name = markdown_text(name)
        lines.append(f"| {name} | {table['questions']} | {table['right']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _records(path: str) -> list[tuple[str, dict]]:
    rows = list(read_jsonl(path))
    if not rows:
        raise DataError(f"{path}: no records (an evaluation writes one per question)")
    return rows


def out_problem(args: argparse.Namespace) -> str | None:
    """Why --out could not be written, or None, checked before anything is read (`io.out_file_problem`): its
    inputs are the records files, the corpus, the params file and the profile overlays beside it."""
    from centralrl.config import profiles_folder

    inputs = [("records", path) for path in args.records] + [("--corpus", args.corpus), ("--params", args.params)]
    return out_file_problem(args.out, [*inputs, ("--params", profiles_folder(args.params))])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m centralrl.attribution",
        description=__doc__.partition("\n\n")[0].replace("\n", " "),
        epilog="Places (where a wrong episode last had a golden answer): " + ", ".join(PLACES),
    )
    parser.add_argument("records", nargs="+", help="records.jsonl files written by the evaluate stage")
    parser.add_argument(
        "--corpus", default="data/corpus.jsonl", help="the corpus the index was built from (default: %(default)s)"
    )
    parser.add_argument(
        "--params",
        default="params.yaml",
        help="its harness.passage_chars: what a role is shown (default: %(default)s)",
    )
    parser.add_argument("--out", help="also write the tables here (JSON)")
    args = parser.parse_args(argv)
    if args.out is not None and (problem := out_problem(args)) is not None:  # '': was the tables, exit 0
        parser.error(problem)
    from centralrl.config import load_config

    try:
        shown = shown_passages(args.corpus, load_config(args.params).harness.passage_chars)
        tables = {path: attribution_table(_records(path), shown) for path in args.records}
        if args.out:
            write_json(args.out, tables)
    except CentralRLError as error:
        print(f"attribution: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # the --out folder: read-only, or a file where a folder should be
        print(f"attribution: error: --out {args.out}: {error.strerror}", file=sys.stderr)
        return 1
    print(markdown(tables))
    return 0


if __name__ == "__main__":
    exit_with(main)
