"""The compare stage refuses inputs that would compare the wrong things, before it writes anything: a path
pattern that gives two cells one file, a records file answering a question twice, and prepare_data's counts
without the fields the report reads. Tiny real runs of the stage on the command line of dvc.yaml."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from centralrl.config import load_config
from centralrl.errors import DataError
from centralrl.io import write_json, write_jsonl
from conftest import REPO, write_params
from stages import compare

QUESTIONS = [
    {"id": f"q{i}", "benchmark": bench, "em": i % 2, "f1": i % 2, "acc": i % 2, "question": "Who wrote it?"}
    | {"golden_answers": ["Ann"], "prediction": "Ann" if i % 2 else "Bo", "notes": [], "retrieved": [[]]}
    for i, bench in enumerate(["nq", "nq", "popqa", "popqa"])
]
COUNTS = {"questions": 2, "with_supporting_passages": 2, "with_decomposition": 0}
CUT = {"step": 2, "reached": True, "spent": {"steps": 2, "trained_tokens": 10, "flops": 1e9}}
STILL = {"calls": 0, "changed": 0, "changed_share": None, "kl": None}
OLD_METRICS = '{"old": true}\n'
START = "5" * 64  # the sha256 of the start, as budgets.json and cell.json record it


def dvc_command() -> list[str]:
    """The compare stage's arguments as dvc.yaml gives them (after `python -m stages.compare`)."""
    cmd = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["compare"]["cmd"]
    return shlex.split(cmd)[3:]


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    argv = list(argv)
    argv[argv.index(option) + 1] = value
    return argv


@pytest.fixture
def world(tmp_path, monkeypatch) -> list[str]:
    """Every input of dvc.yaml's compare command for the smoke params at one seed (all but the corpus, which is
    read after the statistics), and an earlier metrics file; returns the command's arguments."""
    monkeypatch.chdir(tmp_path)
    cfg = load_config(write_params(tmp_path, {"seeds": [0]}))
    argv = dvc_command()
    args = compare.arguments(argv)
    for b in cfg.backbones:
        for ref in cfg.references:
            records = Path(args.reference_records.format(backbone=b, reference=ref))
            write_jsonl(records, QUESTIONS)
            write_json(records.with_name("cell.json"), {"reference": ref, "backbone": b, "start": START})
        for arm in cfg.arms:
            cell = {"backbone": b, "arm": arm, "seed": 0}
            cuts = {
                name: CUT | {"budget": budget.model_dump(exclude_none=True), "adapters": f"{arm}-{name}"}
                for name, budget in cfg.budgets.items()
            }
            for budget in cfg.budgets:
                records = Path(args.records.format(**cell, budget=budget))
                write_jsonl(records, QUESTIONS)
                evaluated = cell | {"budget": budget, "start": START, "adapters": cuts[budget]["adapters"]}
                write_json(records.with_name("cell.json"), evaluated)
            write_json(args.budgets.format(**cell), {"cell": cell | {"start": START}, "cuts": cuts})
            write_jsonl(args.history.format(**cell), [{"step": s, "reward_mean": 0.5} for s in (1, 2)])
            roles = {role: STILL | {"adapter": adapter} for role, adapter in cfg.arm_adapters(arm).items()}
            write_json(args.movement.format(**cell), dict.fromkeys(cfg.budgets, roles))
    write_json(args.data, {"corpus_passages": 8, "test": {"nq": COUNTS, "popqa": COUNTS}, "train": {}})
    Path(args.metrics).write_text(OLD_METRICS)
    return argv


def refused(argv: list[str], message: str) -> None:
    """The stage fails naming `message`, and the metrics and report are as they were."""
    with pytest.raises(DataError, match=re.escape(message)):
        compare.main(argv)
    assert Path("metrics/compare.json").read_text() == OLD_METRICS and not Path("report").exists()


def test_good_inputs_pass_every_check_up_to_the_corpus(world):
    # the baseline of the tests below: the statistics ran, and the next input is the corpus, not given here
    refused(world, "data/corpus.jsonl: no such file")


@pytest.mark.parametrize(
    "option, value, missing",
    [
        ("--records", "eval/main/joint/seed0/equal_steps/records.jsonl", "{backbone}, {arm}, {seed}, {budget}"),
        ("--records", "eval/{backbone}/{arm}/seed{seed}/records.jsonl", "{budget}"),
        ("--reference-records", "eval/{backbone}/base/records.jsonl", "{reference}"),
        ("--budgets", "train/{backbone}/{arm}/budgets.json", "{seed}"),
        ("--history", "train/main/{arm}/seed{seed}/history.jsonl", "{backbone}"),
        ("--movement", "metrics/movement/{backbone}/seed{seed}.json", "{arm}"),
    ],
)
def test_a_pattern_that_gives_two_cells_one_file_is_a_usage_error(capsys, option, value, missing):
    # with --records naming one file, joint was compared with itself: "inconclusive"
    assert compare.arguments(dvc_command()).records  # dvc.yaml's own patterns are whole
    with pytest.raises(SystemExit) as stop:
        compare.arguments(with_option(dvc_command(), option, value))
    assert stop.value.code == 2
    assert f"argument {option}: '{value}': missing placeholder {missing}; cells would share a file" in (
        capsys.readouterr().err
    )


def test_a_question_answered_twice_in_a_records_file_is_named_with_both_lines(world):
    # a repeated line ended in "answered other questions than ... (19 vs 18; (id, benchmark) in one only: )"
    path = Path("eval/main/joint/seed0/equal_steps/records.jsonl")
    path.write_text(path.read_text() + json.dumps(QUESTIONS[1]) + "\n")
    refused(world, f"{path}:5: (id, benchmark) ('q1', 'nq') is already answered at {path}:2")


def test_cells_answering_a_question_twice_are_named():
    from centralrl.compare import check_same_questions

    once, twice = QUESTIONS, [*QUESTIONS, QUESTIONS[1]]
    with pytest.raises(DataError, match=re.escape("joint-seed0: answered q1 more than once")):
        check_same_questions({"base": once, "joint-seed0": twice})


def with_nq(**counts) -> dict:
    return {"test": {"nq": {**COUNTS, **counts}, "popqa": COUNTS}}


@pytest.mark.parametrize(
    "counts, named",
    [
        ({}, "field 'test' must map benchmarks to their counts, got None"),
        ([], "field 'test' must map benchmarks to their counts, got None"),
        ({"test": {"nq": COUNTS}}, "field 'test' lacks benchmarks ['popqa'] that the records answer"),
        ({"test": {"nq": COUNTS, "popqa": 2}}, "test 'popqa': expected its counts, got 2"),
        (with_nq(with_supporting_passages=None), "test 'nq': field 'with_supporting_passages' must be a count"),
        (with_nq(questions="2"), "test 'nq': field 'questions' must be a count (0 or more), got '2'"),
        (with_nq(questions=-1), "test 'nq': field 'questions' must be a count (0 or more), got -1"),
        (with_nq(questions=1), "test 'nq': field 'with_supporting_passages' exceeds 'questions' (1)"),
    ],
)
def test_data_counts_the_report_cannot_read_are_named(world, counts, named):
    # {} gave the same report as the real counts: no benchmark labelled closed-book
    write_json("metrics/data.json", counts)
    refused(world, f"metrics/data.json: {named}")


def edit_json(path: str, change) -> None:
    data = json.loads(Path(path).read_text())
    change(data)
    write_json(path, data)


@pytest.mark.parametrize(
    "path, change, named",
    [
        (  # a step was deleted: the report read the run as shorter than its cuts
            "train/main/joint/seed0/history.jsonl",
            lambda path: write_jsonl(path, [{"step": 2, "reward_mean": 0.5}]),
            "history.jsonl: steps must be 1, 2, ... one row each, got [2]",
        ),
        (
            "train/main/joint/seed0/budgets.json",
            lambda path: edit_json(path, lambda budgets: budgets["cuts"]["equal_steps"].update(step=3)),
            "budgets.json: budget 'equal_steps' has no cut step (a whole number from 1 to train.grpo.steps, 2), got 3",
        ),
        (  # reported under the params' budget heading
            "train/main/joint/seed0/budgets.json",
            lambda path: edit_json(path, lambda budgets: budgets["cuts"]["equal_steps"].update(budget={"steps": 1})),
            "budgets.json: budget 'equal_steps' was cut for {'steps': 1}, but params define it as {'steps': 2}",
        ),
        (
            "train/main/joint/seed0/history.jsonl",
            lambda path: write_jsonl(path, [{"step": 1, "reward_mean": 0.5}]),
            "budgets.json: budget 'equal_steps': cut at step 2, but its history holds 1 steps",
        ),
        (  # joint's cuts reported as central_only's
            "train/main/central_only/seed0/budgets.json",
            lambda path: Path(path).write_text(Path("train/main/joint/seed0/budgets.json").read_text()),
            "central_only/seed0/budgets.json: written by the training of {'arm': 'joint', 'seed': 0, 'backbone': "
            "'main'}, not of {'arm': 'central_only', 'seed': 0, 'backbone': 'main'}",
        ),
        (  # joint's file as central_only's: its frozen roles read as trained
            "metrics/movement/main/central_only-seed0.json",
            lambda path: Path(path).write_text(Path("metrics/movement/main/joint-seed0.json").read_text()),
            "central_only-seed0.json: budget 'equal_steps', role 'retrieval': adapter 'retrieval', but this arm "
            "gives it None",
        ),
        (
            "metrics/movement/main/joint-seed0.json",
            lambda path: edit_json(path, lambda m: m["equal_steps"]["central"].update(changed=3)),
            "role 'central': 3 changed of 0 calls with changed_share None: not a count of its calls and their share",
        ),
        (  # every cell answering one question of each benchmark: a subset paired and reported
            "data",
            lambda path: [
                write_jsonl(records, QUESTIONS[1:3]) for records in map(str, Path("eval").rglob("records.jsonl"))
            ],
            "metrics/data.json: test 'nq' holds 2 questions, but the records answer 1",
        ),
        (  # named by file, not by cell
            "eval/main/joint/seed0/equal_steps/records.jsonl",
            lambda path: write_jsonl(path, [QUESTIONS[0] | {"golden_answers": ["Cy"]}, *QUESTIONS[1:]]),
            "eval/main/joint/seed0/equal_steps/records.jsonl: answered other questions than eval/main/central_only/"
            "seed0/equal_steps/records.jsonl (4 vs 4; ids, benchmarks, texts or golden answers differ for q0)",
        ),
        (  # a score edited by hand: the verdict was decided by it
            "eval/main/joint/seed0/equal_steps/records.jsonl",
            lambda path: write_jsonl(path, [QUESTIONS[0] | {"f1": 1}, *QUESTIONS[1:]]),
            "equal_steps/records.jsonl:1: field 'f1' is 1, but its prediction 'Bo' scores 0.0 against its golden "
            "answers: rerun the evaluation",
        ),
        (  # every record of a benchmark gone: the report and its macro-average left it out
            "data",
            lambda path: [
                write_jsonl(records, QUESTIONS[:2]) for records in map(str, Path("eval").rglob("records.jsonl"))
            ],
            "metrics/data.json: the test split holds benchmarks ['popqa'] that no record answers",
        ),
        (  # joint's evaluation written into central_only's folder (an `evaluate --out` typo): compared as its own
            "eval/main/central_only/seed0/equal_steps",
            lambda path: shutil.copytree("eval/main/joint/seed0/equal_steps", path, dirs_exist_ok=True),
            "central_only/seed0/equal_steps/cell.json: adapters 'joint-equal_steps' where 'central_only-equal_steps' "
            "was expected; arm 'joint' where 'central_only' was expected: the records beside it are another "
            "evaluation's; rerun `dvc repro evaluate@central_only-0-main`",
        ),
        (  # base evaluated from another start than the arms trained from
            "eval/main/base/cell.json",
            lambda path: edit_json(path, lambda cell: cell.update(start="6" * 64)),
            f"eval/main/base/cell.json: start '{'6' * 64}' where '{START}' was expected: the records beside it are "
            "another evaluation's; the trained cells recorded another start: `dvc repro` reruns whichever is older",
        ),
        (  # an evaluation by an older version, which wrote no cell.json
            "eval/main/joint/seed0/equal_tokens/cell.json",
            lambda path: Path(path).unlink(),
            "eval/main/joint/seed0/equal_tokens/cell.json not found: run `dvc repro evaluate@joint-0-main` first",
        ),
    ],
)
def test_inputs_of_other_cells_or_edited_ones_are_refused(world, path, change, named):
    """Each was accepted, and a report written from it."""
    change(path)
    refused(world, named)
