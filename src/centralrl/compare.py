"""Compare arms: one table of EM / F1 / Acc per benchmark and the macro-average for every arm, from the
per-question records each `evaluate@<arm>` wrote, plus what each arm's training did (steps, reward).

The table is a DVC metrics file (`dvc metrics show`/`diff` line the arms up) and a markdown report.
Significance tests and compute matching are the next layer (issue: statistics and verdict); this one only
lines the arms up on the same questions, and refuses arms that were not evaluated on the same questions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from centralrl.errors import DataError
from centralrl.evaluation import benchmark_table
from centralrl.metrics import METRICS


def comparison(records_by_arm: Mapping[str, Sequence[dict]]) -> dict:
    """{arm: benchmark_table(records)}; every arm must answer exactly the same question ids."""
    ids = {arm: sorted(r["id"] for r in records) for arm, records in records_by_arm.items()}
    reference_arm, reference = next(iter(ids.items()))
    for arm, arm_ids in ids.items():
        if arm_ids != reference:
            raise DataError(f"evaluate@{arm} answered other questions than evaluate@{reference_arm}; rerun its evaluation")
    return {arm: benchmark_table(records) for arm, records in records_by_arm.items()}


def report(table: dict, training: Mapping[str, dict], profile: str) -> str:
    """Markdown: per metric, benchmarks as rows and arms as columns (in %), then what each arm's training did."""
    arms = list(table)
    benchmarks = [b for b in next(iter(table.values())) if b != "macro"]
    lines = [f"# Arms compared (profile `{profile}`)", ""]
    for metric in METRICS:
        lines += [f"## {metric.upper()}", "", "| benchmark | n | " + " | ".join(arms) + " |", "|---|---|" + "---|" * len(arms)]
        for bench in [*benchmarks, "macro"]:
            n = table[arms[0]][bench]["questions"]
            cells = " | ".join(f"{100 * table[arm][bench][metric]:.2f}" for arm in arms)
            name = "**macro-average**" if bench == "macro" else bench
            lines.append(f"| {name} | {n} | {cells} |")
        lines.append("")
    lines += ["## Training", "", "| arm | steps | first reward | final reward |", "|---|---|---|---|"]
    for arm in arms:
        t = training.get(arm, {})
        first, final = t.get("first_reward_mean"), t.get("final_reward_mean")
        lines.append(f"| {arm} | {t.get('steps', 0)} | {'-' if first is None else f'{first:.3f}'} | {'-' if final is None else f'{final:.3f}'} |")
    return "\n".join(lines) + "\n"
