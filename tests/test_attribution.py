"""Where a wrong episode lost its answer (`centralrl.attribution`): by hand, and on records of a real run."""

from __future__ import annotations

import json
import re

import pytest

from centralrl.attribution import ShownPassages, attribution_table, main, shown_passages, where_lost
from centralrl.errors import DataError
from centralrl.evaluation import episode_record
from centralrl.harness.episodes import run_central
from centralrl.io import write_jsonl
from centralrl.models.backbone import load_backbone

from test_harness import ScriptedPolicy, settings

SHOWN = ShownPassages(
    {"p1": "Ada Lovelace: Ada was born in London.", "p2": "London: London is a city in England."}, "corpus.jsonl"
)


def record(question: str, prediction: str, notes: list[str], retrieved: list[list[str]]) -> dict:
    return {
        "question": question,
        "golden_answers": ["London"],
        "prediction": prediction,
        "notes": notes,
        "retrieved": retrieved,
    }


@pytest.mark.parametrize(
    "episode, place",
    [
        (record("Where was Ada born?", "She was born in London", ["Ada was born in London."], [["p1"]]), None),
        (record("Is London in England?", "no", [], []), "in_question"),
        ({**record("Is Ada from London?", "no", ["nothing"], []), "golden_answers": ["Yes"]}, "yes_no"),
        (record("Where was Ada born?", "Paris", ["nothing relevant"], [["p2"]]), "in_passages"),
        (record("Where was Ada born?", "Paris", ["nothing relevant"], [["p1"], []]), "in_passages"),
        (record("Where was Ada born?", "Paris", ["Ada was born in London."], [["p1"]]), "in_notes"),
        (record("Where was Ada born?", "Paris", ["nothing"], [[]]), "not_retrieved"),
        (record("Where was Ada born?", "", [], []), "not_retrieved"),
    ],
)
def test_a_wrong_episode_is_placed_where_the_answer_was_last_seen(episode, place):
    assert where_lost(episode, SHOWN) == place


def test_what_a_role_was_not_shown_of_a_passage_does_not_count():
    shown = ShownPassages({"p1": "Ada Lovelace: Ada was a mathematician."}, "c.jsonl")  # birthplace past the cut
    assert where_lost(record("Where was Ada born?", "Paris", ["x"], [["p1"]]), shown) == "not_retrieved"


def test_the_table_counts_right_answers_and_each_place():
    rows = [
        ("r:1", record("Where was Ada born?", "London", [], [])),
        ("r:2", record("Where was Ada born?", "Paris", ["London, said the note"], [["p1"]])),
        ("r:3", record("Where was Ada born?", "Paris", ["x"], [["p1"]])),
    ]
    assert attribution_table(rows, SHOWN) == {
        "questions": 3,
        "right": 1,
        "yes_no": 0,
        "in_question": 0,
        "not_retrieved": 0,
        "in_passages": 1,
        "in_notes": 1,
    }


def test_a_passage_missing_from_the_corpus_or_a_row_that_is_no_record_is_named():
    with pytest.raises(DataError, match=r"r\.jsonl:4: retrieved passage 'p9' is not in the corpus corpus\.jsonl \("):
        where_lost(record("Where was Ada born?", "Paris", ["x"], [["p9"]]), SHOWN, "r.jsonl:4")
    with pytest.raises(DataError, match=r"r\.jsonl:2: not an evaluation record \(no notes, retrieved\)"):
        where_lost({"question": "q", "golden_answers": ["a"], "prediction": "b"}, SHOWN, "r.jsonl:2")


def test_the_command_reads_a_real_runs_records_and_corpus(tiny_backbone, smoke_world, smoke_params, tmp_path, capsys):
    """Episodes of the real harness and retriever over the smoke world (a scripted model asks each question as its
    sub-question, notes nothing and answers wrong): every wrong answer is in the passages or was not retrieved."""
    questions, passages, index = smoke_world
    tests = [q for q in questions if q.split == "test"][:6]
    script = {
        "central": lambda p: "ask</think><subquestion>" + re.search(r"Question: (.*)", p)[1] + "</subquestion>",
        "retrieval": lambda p: "nothing relevant</note>",
        "conclusion": lambda p: "Telmarra</answer>",
    }
    episodes = run_central(
        tests, ScriptedPolicy(load_backbone(tiny_backbone)[1], script), index, settings(max_turns=1)
    )
    write_jsonl(tmp_path / "records.jsonl", [episode_record(e) for e in episodes])
    write_jsonl(tmp_path / "corpus.jsonl", [p.to_json() for p in passages])
    args = [str(tmp_path / "records.jsonl"), "--corpus", str(tmp_path / "corpus.jsonl"), "--params", str(smoke_params)]
    assert main([*args, "--out", str(tmp_path / "table.json")]) == 0
    table = json.loads((tmp_path / "table.json").read_text())[str(tmp_path / "records.jsonl")]
    assert (
        table["questions"] == 6
        and table["right"] == 0
        and table["in_notes"] == table["in_question"] == table["yes_no"] == 0
    )
    assert table["in_passages"] > 0 and table["in_passages"] + table["not_retrieved"] == 6
    assert f"| 6 | 0 | 0 (0%) | 0 (0%) | {table['not_retrieved']} (" in capsys.readouterr().out

    assert main([str(tmp_path / "missing.jsonl"), *args[1:]]) == 1
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a file where a folder should be: refused before anything is read
        main([*args, "--out", str(tmp_path / "table.json" / "t.json")])
    assert f"{tmp_path / 'table.json' / 't.json'}: cannot be written: " in capsys.readouterr().err
    with pytest.raises(SystemExit):  # was: an error naming a temporary file in the folder's parent
        main([*args, "--out", str(tmp_path)])
    assert f"--out {tmp_path}: a folder" in capsys.readouterr().err
    for blank in ("", " "):  # '': was the tables printed, nothing written, exit 0
        with pytest.raises(SystemExit):
            main([*args, "--out", blank])
        assert "--out: blank path; name the .json file to write" in capsys.readouterr().err
    (tmp_path / "none.jsonl").write_text("")
    assert main([str(tmp_path / "none.jsonl"), *args[1:]]) == 1  # was: a table of 0 questions
    assert "none.jsonl: no records" in capsys.readouterr().err
    (tmp_path / "corpus.jsonl").write_text('{"id": "p1", "text": "no title"}\n')
    assert main(args) == 1
    assert "corpus.jsonl:1 (passage p1): missing field 'title'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "out, named",
    [  # each was overwritten with the tables, exit 0
        ("records.jsonl", "--out {tmp}/records.jsonl overlaps the input records {tmp}/records.jsonl"),
        ("corpus.jsonl", "--out {tmp}/corpus.jsonl overlaps the input --corpus {tmp}/corpus.jsonl"),
        ("params.yaml", "--out {tmp}/params.yaml overlaps the input --params {tmp}/params.yaml"),
        ("profiles/smoke.yaml", "--out {tmp}/profiles/smoke.yaml overlaps the input --params {tmp}/profiles"),
        ("new/t.json", "--out {tmp}/new/t.json: folder {tmp}/new does not exist; create it first"),  # was made
        ("notes.txt", "--out {tmp}/notes.txt: not a .json file name, which this output is"),
        ("new/", "--out {tmp}/new/: ends in /, as a folder does; name the .json file to write"),  # wrote a file new
    ],
)
def test_an_out_over_an_input_or_in_a_missing_folder_is_refused_before_anything_is_read(
    smoke_params, tmp_path, capsys, out, named
):
    (tmp_path / "records.jsonl").write_text("not read\n")
    (tmp_path / "corpus.jsonl").write_text("not read\n")
    (tmp_path / "notes.txt").write_text("mine\n")
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    args = [str(tmp_path / "records.jsonl"), "--corpus", str(tmp_path / "corpus.jsonl"), "--params", str(smoke_params)]
    with pytest.raises(SystemExit) as stop:
        main([*args, "--out", f"{tmp_path}/{out}"])
    assert stop.value.code == 2 and named.format(tmp=tmp_path) in capsys.readouterr().err
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
    assert not (tmp_path / "new").exists()


def test_a_passage_missing_from_an_empty_corpus_names_the_corpus_file(tmp_path):
    """An empty corpus read "base, record 1: retrieved passage 'p1' is not in the corpus", naming no file."""
    (tmp_path / "corpus.jsonl").write_text("")
    shown = shown_passages(tmp_path / "corpus.jsonl", 300)
    message = f"base, record 1: retrieved passage 'p1' is not in the corpus {tmp_path / 'corpus.jsonl'} (which holds"
    with pytest.raises(DataError, match=re.escape(message)):
        where_lost(record("Where was Ada born?", "Paris", ["x"], [["p1"]]), shown, "base, record 1")


@pytest.mark.parametrize("golden", [[], [""], ["---"]])
def test_golden_answers_that_decide_nothing_are_refused(golden):
    """No answer made every episode wrong (not_retrieved); one that normalizes to "" made every episode right."""
    episode = record("Where was Ada born?", "Paris", ["x"], [["p1"]]) | {"golden_answers": golden}
    with pytest.raises(DataError, match=r"r\.jsonl:7: golden_answers .* not empty once normalized"):
        where_lost(episode, SHOWN, "r.jsonl:7")


def test_a_record_field_of_the_wrong_shape_is_named_not_read_letter_by_letter():
    notes = record("Where was Ada born?", "Paris", ["x"], [["p1"]]) | {"notes": "Paris"}  # was: not_retrieved
    with pytest.raises(DataError, match=r"r\.jsonl:3: field 'notes' should be a list of strings, got 'Paris'"):
        where_lost(notes, SHOWN, "r.jsonl:3")
    empty = record("Where was Ada born?", "Paris", ["x"], [["p1"]]) | {"prediction": None}  # was: AttributeError
    with pytest.raises(DataError, match=r"r\.jsonl:5: field 'prediction' should be a string, got None"):
        where_lost(empty, SHOWN, "r.jsonl:5")
