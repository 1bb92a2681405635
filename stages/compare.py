"""Stage `compare`: every cell's evaluation records and training cuts -> statistics, the verdict on the claim
(DVC metrics), and the report (markdown, HTML, plots), also logged to MLflow under the experiment's parent run.

Where each cell's files are comes from patterns in dvc.yaml ({backbone}, {arm}, {seed}, {budget}, {reference}),
filled in for every cell the params name; a missing file is an error that names the stage to run.
"""

from __future__ import annotations

import argparse
import math
import string
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from centralrl.attribution import shown_passages
from centralrl.compare import (
    check_same_questions,
    comparison,
    lost_answers,
    pooled_replayed_rises,
    record_checker,
    replayed_rises,
)
from centralrl.config import EVALUATED_CELL_FILE, Config, load_config, trained_cell_problem
from centralrl.errors import DataError
from centralrl.io import atomic_directory, read_json, read_jsonl, write_json
from centralrl.rl.rewards import QUESTION_REWARDS
from stages.cli import InputPath, run_stage, stage_parser

RERUN_DATA = "is it prepare_data's for these records? rerun `dvc repro prepare_data`"


def pattern(*placeholders: str) -> Callable[[str], str]:
    """An argparse type: a path pattern using exactly these {placeholders}, the cells it is filled for. A typo
    would fail only after every file before it was read; a placeholder left out would give two cells one file
    (every axis of params can name more than one value), e.g. joint compared with itself.

    >>> pattern("arm", "seed")("train/{arm}/seed{seed}/history.jsonl")
    'train/{arm}/seed{seed}/history.jsonl'
    >>> pattern("arm", "seed")("train/{arms}/history.jsonl")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 'train/{arms}/history.jsonl': unknown placeholder {arms}; it may use {arm}, {seed}
    >>> pattern("arm", "seed")("train/joint/h.jsonl")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 'train/joint/h.jsonl': missing placeholder {arm}, {seed}; cells would share a file
    """

    def parse(value: str) -> str:
        try:
            used = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{value!r}: {error}") from None
        unknown = sorted(used - set(placeholders))
        if unknown:
            raise argparse.ArgumentTypeError(
                f"{value!r}: unknown placeholder {_braced(unknown)}; it may use {_braced(placeholders)}"
            )
        missing = [p for p in placeholders if p not in used]
        if missing:
            raise argparse.ArgumentTypeError(
                f"{value!r}: missing placeholder {_braced(missing)}; cells would share a file"
            )
        return value

    return parse


def _braced(names: Sequence[str]) -> str:
    return ", ".join("{" + name + "}" for name in names)


def _number(value: object, where: str, field: str, nullable: bool = False) -> None:
    """A finite number (NaN would reach the report as 'nan' and metrics/compare.json as invalid JSON)."""
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataError(f"{where}: field {field!r} must be a finite number, got {value!r}")


def checked_history_row(row: dict, where: str) -> dict:
    """A training history row holding what the report reads: a numeric `step` and `reward_mean` (never below 0:
    a metric plus `train.reward.format_weight` >= 0), and `spent.flops` (the dev curve's x) and finite dev scores
    in a row where the dev split was scored; its per-question rewards, where it has them, numbers."""
    dev = [key for key in row if key.startswith("dev.")]
    for key in ["step", "reward_mean", *dev] + (["spent.flops"] if dev else []):
        _number(row.get(key), where, key)
    if row["reward_mean"] < 0:
        raise DataError(f"{where}: field 'reward_mean' must be a reward, never below 0, got {row['reward_mean']!r}")
    rewards = row.get(QUESTION_REWARDS, {})
    if not isinstance(rewards, dict):
        raise DataError(f"{where}: field {QUESTION_REWARDS!r} must map question ids to rewards, got {rewards!r}"[:300])
    for question, reward in rewards.items():
        _number(reward, where, f"{QUESTION_REWARDS}.{question}")
    return row


def checked_history(rows: list[dict], path: Path) -> list[dict]:
    """A history of steps 1, 2, ... one row each (the report's first and last quarters are by step, and a missing
    step made a run read as shorter than it was)."""
    steps = [row["step"] for row in rows]
    if steps != list(range(1, len(rows) + 1)):
        raise DataError(f"{path}: steps must be 1, 2, ... one row each, got {steps}")
    return rows


def checked_cuts(document: object, path: Path, cfg: Config, cell: tuple[str, int, str], steps_run: int) -> dict:
    """The cuts of budgets.json, written by the training of `cell` (arm, seed, backbone;
    `trained_cell_problem`): for every budget of params, the step its cut fell at (within the `steps_run` of its
    history: `Config.cut_problem` says the rest), whether the budget was reached, and what the run had spent
    (optimizer steps, trained tokens, FLOPs)."""
    problem = trained_cell_problem(document, *cell)
    if problem:
        raise DataError(f"{path}: {problem}")
    cuts = document["cuts"]
    if not isinstance(cuts, dict):
        raise DataError(f"{path}: expected a mapping of budgets, got {type(cuts).__name__}")
    for budget in cfg.budgets:
        cut, where = cuts.get(budget), f"{path}: budget {budget!r}"
        if not isinstance(cut, dict) or not isinstance(cut.get("spent"), dict):
            raise DataError(f"{where}: no cut with its `spent` (params has this budget: rerun the train stage)")
        if not isinstance(cut.get("reached"), bool):
            raise DataError(f"{where}: field 'reached' must be true or false, got {cut.get('reached')!r}")
        problem = cfg.cut_problem(budget, cut)
        if problem:
            raise DataError(f"{path}: {problem}")
        if cut["step"] > steps_run:
            raise DataError(f"{where}: cut at step {cut['step']}, but its history holds {steps_run} steps")
        for field in ("steps", "trained_tokens", "flops"):
            _number(cut["spent"].get(field), where, f"spent.{field}")
    return cuts


def checked_movement(movement: object, path: Path, budgets: Sequence[str], adapters: dict[str, str | None]) -> dict:
    """An evaluate stage's movement file: for every budget, each of the arm's roles with the adapter the arm gives
    it (a file of another arm showed a frozen role as trained), its calls, changed outputs (at most the calls),
    their share and its KL to the start (the last two None when it made no call)."""
    if not isinstance(movement, dict):
        raise DataError(f"{path}: expected a mapping of budgets, got {type(movement).__name__}")
    for budget in budgets:
        roles = movement.get(budget) or {}
        if not isinstance(roles, dict):  # was an AttributeError traceback
            raise DataError(f"{path}: budget {budget!r}: expected a mapping of roles, got {roles!r}")
        for role, adapter in adapters.items():
            entry, where = roles.get(role), f"{path}: budget {budget!r}, role {role!r}"
            if not isinstance(entry, dict) or "adapter" not in entry:
                raise DataError(f"{where}: missing (rerun the evaluate stage)")
            if entry["adapter"] != adapter:
                raise DataError(f"{where}: adapter {entry['adapter']!r}, but this arm gives it {adapter!r}")
            for field in ("calls", "changed"):
                _number(entry.get(field), where, field)
            for field in ("changed_share", "kl"):
                _number(entry.get(field), where, field, nullable=True)
            calls, changed = entry["calls"], entry["changed"]
            share = changed / calls if calls else None
            if not 0 <= changed <= calls or entry["changed_share"] != share:
                raise DataError(
                    f"{where}: {changed} changed of {calls} calls with changed_share {entry['changed_share']!r}: "
                    f"not a count of its calls and their share"
                )
    return movement


def checked_data_counts(counts: object, path: Path, benchmarks: Iterable[str]) -> dict:
    """prepare_data's counts (metrics/data.json) as the report reads them: under `test`, every benchmark the
    records answer, each with its `questions` and how many have a supporting passage (none: closed-book)."""
    tests = counts.get("test") if isinstance(counts, dict) else None
    if not isinstance(tests, dict):
        raise DataError(f"{path}: field 'test' must map benchmarks to their counts, got {tests!r}; {RERUN_DATA}")
    missing = sorted(set(benchmarks) - set(tests))
    if missing:
        raise DataError(f"{path}: field 'test' lacks benchmarks {missing} that the records answer; {RERUN_DATA}")
    for bench, row in tests.items():
        _checked_test_counts(row, f"{path}: test {bench!r}")
    return counts


def _checked_test_counts(row: object, where: str) -> None:
    """One benchmark's counts: `questions` and `with_supporting_passages`, counts, the second at most the first."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected its counts, got {row!r}")
    for field in ("questions", "with_supporting_passages"):
        value = row.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DataError(f"{where}: field {field!r} must be a count (0 or more), got {value!r}")
    if row["with_supporting_passages"] > row["questions"]:
        raise DataError(f"{where}: field 'with_supporting_passages' exceeds 'questions' ({row['questions']})")


def _data_counts(data: str | None, records: dict) -> dict | None:
    """--data's counts checked against records[backbone][arm][seed][budget] (None without it): the benchmarks
    they answer, every benchmark of the test split answered, and as many questions of each as the split holds (a
    subset was paired and reported)."""
    if data is None:
        return None
    counts = checked_data_counts(_json(Path(data), "prepare_data"), Path(data), _benchmarks(records))
    answered = Counter(row["benchmark"] for row in next(_cells(records)))  # every cell answers the same (load_cells)
    unanswered = sorted(bench for bench, row in counts["test"].items() if row["questions"] and bench not in answered)
    if unanswered:  # the report left them out, and its macro-average too
        raise DataError(
            f"{data}: the test split holds benchmarks {unanswered} that no record answers; {RERUN_DATA}, or the "
            "evaluations"
        )
    for bench, n in sorted(answered.items()):
        if n != counts["test"][bench]["questions"]:
            raise DataError(
                f"{data}: test {bench!r} holds {counts['test'][bench]['questions']} questions, but the records answer "
                f"{n}; {RERUN_DATA}, or the evaluations"
            )
    return counts


def _benchmarks(records: dict) -> set[str]:
    """The benchmarks answered in records[backbone][arm][seed][budget]."""
    return {row["benchmark"] for rows in _cells(records) for row in rows}


def _cells(records: dict) -> Iterator[list[dict]]:
    """The records of each cell of records[backbone][arm][seed][budget]."""
    return (
        rows
        for arms in records.values()
        for seeds in arms.values()
        for budgets in seeds.values()
        for rows in budgets.values()
    )


def _rows(path: Path, stage: str, check: Callable[[dict, str], dict] = lambda row, where: row) -> list[dict]:
    """The rows of a JSONL output of `stage`, each passed through `check` (with its file and line)."""
    if not path.is_file():
        raise DataError(f"{path} not found: run `dvc repro {stage}` first")
    rows = [check(row, where) for where, row in read_jsonl(path)]
    if not rows:
        raise DataError(f"{path}: no rows; rerun `dvc repro {stage}`")
    return rows


def _json(path: Path, stage: str):
    if not path.is_file():
        raise DataError(f"{path} not found: run `dvc repro {stage}` first")
    return read_json(path)


def load_cells(cfg: Config, args: argparse.Namespace) -> tuple[dict, dict, dict, dict, dict]:
    """records, reference records, budget cuts, histories and role movement, keyed backbone -> arm/reference ->
    seed -> budget; every records file of a backbone answering the same questions (named by file if not)."""
    records, references, cuts, histories, movement = {}, {}, {}, {}, {}
    for b in cfg.backbones:
        files: dict[str, list[dict]] = {}

        def read(path: str, stage: str) -> list[dict]:
            files[path] = _rows(Path(path), stage, record_checker())
            return files[path]

        records[b] = {
            arm: {
                s: {
                    budget: read(
                        args.records.format(backbone=b, arm=arm, seed=s, budget=budget), f"evaluate@{arm}-{s}-{b}"
                    )
                    for budget in cfg.budgets
                }
                for s in cfg.seeds
            }
            for arm in cfg.arms
        }
        references[b] = {
            ref: read(args.reference_records.format(backbone=b, reference=ref), f"evaluate_reference@{ref}-{b}")
            for ref in cfg.references
        }
        check_same_questions(files)
        histories[b] = {arm: {s: _history(args, b, arm, s) for s in cfg.seeds} for arm in cfg.arms}
        trained = {
            arm: {s: _cuts(cfg, args, b, arm, s, len(histories[b][arm][s])) for s in cfg.seeds} for arm in cfg.arms
        }
        cuts[b] = {arm: {s: cut for s, (cut, _) in seeds.items()} for arm, seeds in trained.items()}
        starts = {arm: {s: start for s, (_, start) in seeds.items()} for arm, seeds in trained.items()}
        check_evaluated_cells(cfg, args, b, cuts[b], starts)
        movement[b] = {arm: {s: _movement(cfg, args, b, arm, s) for s in cfg.seeds} for arm in cfg.arms}
    return records, references, cuts, histories, movement


def _cuts(
    cfg: Config, args: argparse.Namespace, backbone: str, arm: str, seed: int, steps_run: int
) -> tuple[dict, object]:
    """A trained cell's checked cuts (`checked_cuts`) and the start it recorded."""
    path = Path(args.budgets.format(backbone=backbone, arm=arm, seed=seed))
    document = _json(path, f"train@{arm}-{seed}-{backbone}")
    return checked_cuts(document, path, cfg, (arm, seed, backbone), steps_run), document["cell"].get("start")


def checked_evaluated_cell(records_path: str, wanted: dict, stage: str) -> None:
    """The cell.json beside a records file (`evaluation.write_cell`) names `wanted`: records written into another
    cell's folder, or evaluated from other adapters or another start than its training recorded, are refused."""
    path = Path(records_path).with_name(EVALUATED_CELL_FILE)
    written = _json(path, stage)
    if not isinstance(written, dict):
        raise DataError(f"{path}: expected what the evaluation evaluated (an object), got {written!r}")
    if written != wanted:
        differ = sorted(key for key in {*written, *wanted} if written.get(key) != wanted.get(key))
        said = "; ".join(f"{key} {written.get(key)!r} where {wanted.get(key)!r} was expected" for key in differ)
        advice = f"rerun `dvc repro {stage}`"
        if differ == ["start"] and "reference" in wanted:  # this evaluation or the trained cells may be the stale one
            advice = "the trained cells recorded another start: `dvc repro` reruns whichever is older"
        raise DataError(f"{path}: {said}: the records beside it are another evaluation's; {advice}")


def check_evaluated_cells(cfg: Config, args: argparse.Namespace, backbone: str, cuts: dict, starts: dict) -> None:
    """Every records file of `backbone` was written by the evaluation of its own cell (`checked_evaluated_cell`):
    a trained cell's by its arm, seed, budget and the start and adapters its budgets.json recorded (`starts`: arm
    -> seed -> start), a reference's from the start every trained cell of the backbone trained from."""
    for arm, seeds in cuts.items():
        for seed, budgets in seeds.items():
            cell = {"arm": arm, "seed": seed, "backbone": backbone, "start": starts[arm][seed]}
            for budget in cfg.budgets:  # budgets.json may hold more (checked_cuts): those were not evaluated
                path = args.records.format(backbone=backbone, arm=arm, seed=seed, budget=budget)
                wanted = cell | {"budget": budget, "adapters": budgets[budget].get("adapters")}
                checked_evaluated_cell(path, wanted, f"evaluate@{arm}-{seed}-{backbone}")
    trained_from = sorted({start for seeds in starts.values() for start in seeds.values()}, key=str)
    if len(trained_from) != 1:
        raise DataError(f"{backbone}: its cells were trained from {len(trained_from)} starts: rerun their training")
    for ref in cfg.references:
        path = args.reference_records.format(backbone=backbone, reference=ref)
        wanted = {"reference": ref, "backbone": backbone, "start": trained_from[0]}
        checked_evaluated_cell(path, wanted, f"evaluate_reference@{ref}-{backbone}")


def _history(args: argparse.Namespace, backbone: str, arm: str, seed: int) -> list[dict]:
    path = Path(args.history.format(backbone=backbone, arm=arm, seed=seed))
    return checked_history(_rows(path, f"train@{arm}-{seed}-{backbone}", checked_history_row), path)


def _movement(cfg: Config, args: argparse.Namespace, backbone: str, arm: str, seed: int) -> dict:
    path = Path(args.movement.format(backbone=backbone, arm=arm, seed=seed))
    adapters = cfg.arm_adapters(arm)
    return checked_movement(_json(path, f"evaluate@{arm}-{seed}-{backbone}"), path, list(cfg.budgets), adapters)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = stage_parser(__doc__)
    cell = ("backbone", "arm", "seed")
    patterns = {  # input patterns, filled in per cell: option -> (its placeholders, what each file holds)
        "--records": ((*cell, "budget"), "a trained cell's records per budget"),
        "--reference-records": (("backbone", "reference"), "a reference's records"),
        "--budgets": (cell, "a trained cell's budget cuts (budgets.json)"),
        "--history": (cell, "a trained cell's per-step history"),
        "--movement": (cell, "a trained cell's role movement per budget (evaluate)"),
    }
    for option, (placeholders, holds) in patterns.items():
        parser.add_argument(option, required=True, type=pattern(*placeholders), help=f"input pattern: {holds}")
    parser.add_argument(
        "--data",
        type=InputPath,
        help="input: prepare_data's counts (metrics/data.json); a benchmark with no supporting passage is labelled "
        "closed-book in the report",
    )
    parser.add_argument(
        "--corpus",
        type=InputPath,
        required=True,
        help="input: the corpus the index holds (where each wrong answer was last seen)",
    )
    parser.add_output(
        "--report",
        "folder with report.md, report.html and the plots",
        marks=("report.md",),
        writes=("report.md", "report.html", "*.png"),
    )
    parser.add_output("--metrics", "every statistic and the verdicts (JSON)", suffix=".json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    from centralrl.report import closed_book, write_report  # matplotlib and MLflow: seconds, after the usage check
    from centralrl.tracking import cell_tags, open_tracker

    cfg = load_config(args.params)
    records, references, cuts, histories, movement = load_cells(cfg, args)
    counts = _data_counts(args.data, records)  # before the statistics: a bad file fails in seconds
    result = comparison(cfg, records, references, cuts, movement)
    result["lost"] = lost_answers(cfg, records, references, shown_passages(args.corpus, cfg.harness.passage_chars))
    rises = replayed_rises(cfg, histories)
    if rises:
        result["replayed_rises"] = rises
        result["pooled_replayed_rises"] = pooled_replayed_rises(cfg, histories)
    if counts is not None:
        result["closed_book"] = closed_book(counts)
    with atomic_directory(args.report) as tmp:  # the metrics only once the report is whole: they never disagree
        write_report(result, histories, cfg.profile, tmp)
        write_json(args.metrics, result)
    tracker = open_tracker(cfg.tracking)
    with tracker.run("compare", cell_tags(cfg, stage="compare"), parent=cfg):
        for path in sorted(Path(args.report).iterdir()):
            tracker.log_artifact(path)
    verdicts = {
        f"{b}/{budget}/{m}": c["claim"][m]["verdict"]
        for b, bb in result["backbones"].items()
        for budget, c in bb["budgets"].items()
        for m in ("f1", "acc")
    }
    print(f"compare: {Path(args.report) / 'report.md'}; verdicts {verdicts}")


if __name__ == "__main__":
    run_stage(main, arguments, tracked=True)
