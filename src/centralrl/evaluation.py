"""Score finished episodes: one record per question, and EM / F1 / Acc per benchmark with the macro-average.

Every question of the evaluation set is scored (no drops); a question whose episode produced no answer
scores 0. Benchmark means are plain means over its questions; `macro` averages the benchmark means, the
way the published tables report their average.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from centralrl.harness.episodes import Episode
from centralrl.metrics import METRICS


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
        "forced_conclusion": episode.forced,
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
    summary["forced_rate"] = round(sum(r["forced_conclusion"] for r in rows) / n, 4)
    summary["invalid_actions_per_question"] = round(sum(r["invalid_actions"] for r in rows) / n, 4)
    return summary


def markdown_table(table: dict) -> str:
    """The per-benchmark table as markdown (rows: benchmarks then macro; columns: n, EM, F1, Acc in %)."""
    lines = ["| benchmark | n | EM | F1 | Acc | turns | forced | invalid/q |", "|---|---|---|---|---|---|---|---|"]
    for name, row in table.items():
        if name == "macro":
            continue
        lines.append(f"| {name} | {row['questions']} | {100 * row['em']:.2f} | {100 * row['f1']:.2f} | {100 * row['acc']:.2f} "
                     f"| {row['mean_turns']:.2f} | {row['forced_rate']:.2f} | {row['invalid_actions_per_question']:.2f} |")
    macro = table["macro"]
    lines.append(f"| **macro** | {macro['questions']} | {100 * macro['em']:.2f} | {100 * macro['f1']:.2f} | {100 * macro['acc']:.2f} | | | |")
    return "\n".join(lines) + "\n"


def transcript(episode: Episode) -> str:
    """A readable account of one episode: every role call's generated text, in order."""
    q = episode.question
    lines = [f"### {q.id} ({q.benchmark})", f"**Question:** {q.question}", f"**Golden:** {' | '.join(q.golden_answers)}", ""]
    for call in episode.calls:
        flag = "" if call.valid else " (invalid)"
        lines.append(f"- turn {call.turn}, **{call.role}**{flag}: `{call.text.strip()}`")
    lines.append(f"\n**Prediction:** {episode.prediction or '(none)'}; forced: {episode.forced}\n")
    return "\n".join(lines)
