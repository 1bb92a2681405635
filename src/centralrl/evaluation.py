"""Score finished episodes: one record per question, and EM / F1 / Acc per benchmark with the macro-average.

Every question of the evaluation set is scored (no drops); a question whose episode produced no answer
scores 0. Benchmark means are plain means over its questions; `macro` averages the benchmark means, the
way the published tables report their average. Besides the scores, a benchmark's row holds `mean_turns`,
`invalid_actions_per_question` and `cut_at_turn_limit_rate`: the share of its episodes that the turn limit, not
the policy, ended (`Episode.cut_at_turn_limit`: central, `harness.max_turns` turns and no conclusion, so with
`max_turns` 2 every episode that asked two sub-questions, as a 2-hop question needs; single agent, `max_turns`
steps and no answer, then its forced answer); it is not a failure rate. `write_evaluation` writes one
evaluation's records and transcripts, `write_cell` what it evaluated; `compute_spent` is its deterministic cost.
For a trained cell, `budget_cuts` and `check_trained_files` check its budgets.json and the start and adapters it
recorded, and `cuts_by_step` groups the budget cuts that fell on the same step (the same adapters, evaluated
once).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from centralrl.codedeps import folder_sha256
from centralrl.compute import ModelShape
from centralrl.config import EVALUATED_CELL_FILE, Config, trained_cell_problem
from centralrl.errors import DataError
from centralrl.harness.episodes import Episode
from centralrl.io import atomic_write, markdown_code, markdown_text, write_json, write_jsonl
from centralrl.metrics import METRICS
from centralrl.models.backbone import content_sha256

EVALUATION_FILES = ("records.jsonl", "transcripts.md")


def episode_record(episode: Episode) -> dict:
    q = episode.question
    scores = {name: metric(episode.prediction, q.golden_answers) for name, metric in METRICS.items()}
    return {
        "id": q.id,
        "benchmark": q.benchmark,
        "question": q.question,
        "golden_answers": list(q.golden_answers),
        "prediction": episode.prediction,
        **scores,
        "turns": episode.turns,
        "cut_at_turn_limit": episode.cut_at_turn_limit,
        "invalid_actions": episode.invalid_actions,
        "sub_questions": [sub for sub, _ in episode.notes],
        "notes": [note for _, note in episode.notes],
        "retrieved": episode.retrieved,
        "tokens": episode.tokens_by_role(),
    }


def benchmark_table(records: Sequence[dict]) -> dict:
    """{benchmark: {questions, em, f1, acc, ...}, "macro": {...}} with means rounded to 6 places."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        groups[record["benchmark"]].append(record)
    table = {name: _summary(rows) for name, rows in sorted(groups.items())}
    table["macro"] = {
        "benchmarks": len(groups),
        "questions": len(records),
        **{m: round(sum(table[b][m] for b in groups) / len(groups), 6) for m in METRICS},
    }
    return table


def _summary(rows: list[dict]) -> dict:
    n = len(rows)
    summary = {"questions": n, **{m: round(sum(r[m] for r in rows) / n, 6) for m in METRICS}}
    summary["mean_turns"] = round(sum(r["turns"] for r in rows) / n, 4)
    summary["cut_at_turn_limit_rate"] = round(sum(r["cut_at_turn_limit"] for r in rows) / n, 4)
    summary["invalid_actions_per_question"] = round(sum(r["invalid_actions"] for r in rows) / n, 4)
    return summary


def markdown_table(table: dict) -> str:
    """The per-benchmark table as markdown (rows: benchmarks then macro; columns: n, EM, F1, Acc in %, mean turns,
    the share of episodes cut at the turn limit, invalid actions per question)."""
    header = "| benchmark | n | EM | F1 | Acc | turns | cut at turn limit | invalid/q |"
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for name, row in table.items():
        if name == "macro":
            continue
        name = markdown_text(name)
        lines.append(
            f"| {name} | {row['questions']} | {100 * row['em']:.2f} | {100 * row['f1']:.2f} | {100 * row['acc']:.2f} "
            f"| {row['mean_turns']:.2f} | {row['cut_at_turn_limit_rate']:.2f} "
            f"| {row['invalid_actions_per_question']:.2f} |"
        )
    macro = table["macro"]
    lines.append(
        f"| **macro** | {macro['questions']} | {100 * macro['em']:.2f} | {100 * macro['f1']:.2f} "
        f"| {100 * macro['acc']:.2f} | | | |"
    )
    return "\n".join(lines) + "\n"


def transcript(episode: Episode) -> str:
    """A readable account of one episode: every role call's generated text, in order (the data as written, each on
    its line: `io.markdown_text`, `io.markdown_code`)."""
    q = episode.question
    lines = [
        f"### {markdown_text(q.id)} ({markdown_text(q.benchmark)})",
        f"**Question:** {markdown_text(q.question)}",
        f"**Golden:** {', '.join(map(markdown_code, q.golden_answers))}",  # a span each: `A|B`, `C` is two answers
        "",
    ]
    for call in episode.calls:
        flag = "" if call.valid else " (invalid)"
        lines.append(f"- turn {call.turn}, **{call.role}**{flag}: {markdown_code(call.text.strip())}")
    cut = episode.cut_at_turn_limit
    prediction = markdown_text(episode.prediction) or "(none)"
    lines.append(f"\n**Prediction:** {prediction}; cut at the turn limit: {cut}\n")
    return "\n".join(lines)


def write_evaluation(episodes: Sequence[Episode], out_dir: Path, transcripts: int) -> dict:
    """Write records.jsonl and transcripts.md (the table, then `transcripts` episodes) into `out_dir`; return
    the per-benchmark table."""
    records = [episode_record(e) for e in episodes]
    table = benchmark_table(records)
    write_jsonl(out_dir / "records.jsonl", records)
    with atomic_write(out_dir / "transcripts.md") as handle:
        handle.write(markdown_table(table) + "\n" + "\n".join(transcript(e) for e in _spread(episodes, transcripts)))
    return table


def write_cell(out_dir: Path, cell: dict) -> None:
    """Write what an evaluation in `out_dir` evaluated (cell.json): a trained cell's arm, seed, backbone, budget
    and the sha256 of its start and of that cut's adapters, or a reference's name, backbone and start. Records
    carry none of it, so records written into another cell's folder (an `evaluate --out` typo, a copied folder)
    were compared as that cell's; the compare stage checks this file against the cell it reads."""
    write_json(out_dir / EVALUATED_CELL_FILE, cell)


def _spread(episodes: Sequence[Episode], n: int) -> list[Episode]:
    """n episodes spread over the benchmarks (the first of each, then the second, ...), for readable samples."""
    seen: dict[str, int] = {}
    ranked = []
    for episode in episodes:
        rank = seen[episode.question.benchmark] = seen.get(episode.question.benchmark, -1) + 1
        ranked.append((rank, episode))
    return [episode for _, episode in sorted(ranked, key=lambda pair: pair[0])][:n]


def copy_evaluation(source: Path, target: Path) -> None:
    """The files `write_evaluation` wrote in `source`, written again in `target`."""
    for name in EVALUATION_FILES:
        with atomic_write(target / name) as handle:
            handle.write((source / name).read_text(encoding="utf-8"))


def compute_spent(episodes: Sequence[Episode], shape: ModelShape) -> dict[str, float]:
    """Deterministic cost of an evaluation: prompt and generated tokens per role, estimated FLOPs."""
    spent: dict[str, float] = {"flops": float(sum(e.flops(shape) for e in episodes))}
    for episode in episodes:
        for role, row in episode.tokens_by_role().items():
            for kind in ("prompt", "generated"):
                spent[f"{kind}_tokens.{role}"] = spent.get(f"{kind}_tokens.{role}", 0.0) + row[kind]
    return dict(sorted(spent.items()))


def budget_cuts(document: object, cfg: Config, path: str, arm: str, seed: int, backbone: str) -> dict:
    """The cuts of a train stage's budgets.json, checked against the cell (`trained_cell_problem`) and the params:
    one cut per budget of `budgets` (a missing budget would leave its comparison without this cell, silently),
    each as `Config.cut_problem` wants it."""
    problem = trained_cell_problem(document, arm, seed, backbone)
    if problem:
        raise DataError(f"{path}: {problem}")
    cuts = document["cuts"]
    if not isinstance(cuts, dict) or sorted(cuts) != sorted(cfg.budgets):
        found = sorted(cuts) if isinstance(cuts, dict) else type(cuts).__name__
        raise DataError(f"{path}: expected a cut for each budget of the params ({sorted(cfg.budgets)}), got {found}")
    for name, cut in cuts.items():
        problem = cfg.cut_problem(name, cut)
        if problem:
            raise DataError(f"{path}: {problem}")
    return cuts


def check_trained_files(document: dict, path: str, model_dir: str, adapters_dir: str) -> None:
    """The start and every cut's adapters are the files budgets.json (`path`) recorded: adapters trained from
    another start, or a cut's folder damaged or copied from another run, would be evaluated as this cell's. Cuts
    at one step must record the same adapters: the first one's records were written as the others' too (a step
    edited by hand gave one budget another budget's records)."""
    if content_sha256(Path(model_dir)) != document["cell"].get("start"):
        raise DataError(
            f"{model_dir}: not the start {path} was trained from (other weights): evaluate with that start, or "
            "rerun the train stage from this one"
        )
    for budget, cut in sorted(document["cuts"].items()):
        folder = Path(adapters_dir) / budget
        if folder_sha256(folder) != cut.get("adapters"):
            raise DataError(
                f"{folder}: not the adapters {path} recorded for budget {budget!r} (missing, damaged or from "
                "another run: rerun the train stage)"
            )
    for step, budgets in cuts_by_step(document["cuts"]).items():  # evaluated once, from the first one's folder
        if len({document["cuts"][budget]["adapters"] for budget in budgets}) > 1:
            raise DataError(
                f"{path}: budgets {budgets} are cut at step {step} but record different adapters, so one cut's "
                "step was edited: rerun the train stage"
            )


def cuts_by_step(cuts: dict) -> dict[int, list[str]]:
    """A trained cell's budgets grouped by the step their cut fell on (budgets.json -> {step: [budget, ...]})."""
    by_step: dict[int, list[str]] = {}
    for budget, cut in sorted(cuts.items()):
        by_step.setdefault(cut["step"], []).append(budget)
    return dict(sorted(by_step.items()))
