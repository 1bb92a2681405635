"""The experiment report: the verdict, what each arm spent, per-benchmark tables with CIs, and plots, as
markdown (`report.md`) with an HTML copy and PNG figures beside it. Everything comes from `compare.comparison`
and the training histories, so the same records give the same bytes; wall-clock, CPU time and peak memory
live in MLflow (machine-dependent numbers would break that).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from centralrl.compare import PUBLISHED, VERDICT_METRICS
from centralrl.plots import markdown_to_html, plot_differences, plot_score_vs_compute, plot_training_curves

NAMES = {"f1": "F1", "acc": "Acc", "em": "EM"}


def _ci(d: Mapping) -> str:
    return f"{d['estimate']:.2f} [{d['low']:.2f}, {d['high']:.2f}]"


def _budget_text(spec: Mapping) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in spec.items())


def verdict_section(result: dict) -> list[str]:
    first, second = result["claim"]
    lines = [
        "## Verdict",
        "",
        f"Claim: **{first} > {second}**. Rule: {result['rule']} (level {result['level']:.0%}).",
        "",
        f"| backbone | budget | metric | {first} (mean over seeds) | {second} | difference per seed [CI], p | "
        "verdict |"
        " published difference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backbone, bb in result["backbones"].items():
        for budget, cut in bb["budgets"].items():
            for metric in VERDICT_METRICS:
                claim = cut["claim"][metric]
                seeds = "; ".join(
                    f"s{seed}: {_ci(d['macro'])}, p={d['p_value']:.3f}" for seed, d in claim["seeds"].items()
                )
                means = [cut["arms"][arm]["spread"][metric]["mean"] for arm in (first, second)]
                published = PUBLISHED[metric]
                lines.append(
                    f"| {backbone} | {budget} ({_budget_text(cut['budget'])}) | {NAMES[metric]} | {means[0]:.2f} "
                    f"| {means[1]:.2f} | {seeds} | **{claim['verdict']}** | {published[first]:.2f} - "
                    f"{published[second]:.2f} = {published[first] - published[second]:+.2f} |"
                )
    lines += ["", "Published: Qwen2.5-3B, seven benchmarks, one run per arm at equal steps, no interval.", ""]
    return lines


def spending_section(result: dict) -> list[str]:
    lines = [
        "## What each arm spent",
        "",
        "Training cut at the first step whose spending reached the budget "
        "(FLOPs: the estimate of `centralrl.compute`, rollout generation plus update).",
        "",
        "| backbone | budget | arm | seed | cut at step | budget reached | trained tokens | training FLOPs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backbone, bb in result["backbones"].items():
        for budget, cut in bb["budgets"].items():
            for arm, row in cut["arms"].items():
                for seed, cell in row["seeds"].items():
                    spent = cell["spent"]
                    lines.append(
                        f"| {backbone} | {budget} | {arm} | {seed} | {cell['step']} "
                        f"| {'yes' if cell['reached'] else 'no'} "
                        f"| {spent['trained_tokens']:,.0f} | {spent['flops']:.3g} |"
                    )
    return lines + [""]


def benchmark_section(result: dict, backbone: str, budget: str, metric: str) -> list[str]:
    bb = result["backbones"][backbone]
    cut = bb["budgets"][budget]
    first, second = result["claim"]
    seeds = list(cut["claim"][metric]["seeds"])
    columns = [
        *bb["references"],
        *[f"{arm} s{seed}" for arm in cut["arms"] for seed in seeds],
        *[f"{first} - {second} s{seed}" for seed in seeds],
    ]
    lines = [
        f"### {NAMES[metric]}, {backbone}, budget {budget}",
        "",
        "| benchmark | n | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    any_ref = next(iter(bb["references"].values()))[metric]
    for bench in [*any_ref["benchmarks"], "macro"]:
        pick = (lambda s: s["macro"]) if bench == "macro" else (lambda s: s["benchmarks"][bench])
        cells = [f"{pick(ref[metric])['estimate']:.2f}" for ref in bb["references"].values()]
        cells += [
            _ci(pick(cut["arms"][arm]["seeds"][seed]["scores"][metric])) for arm in cut["arms"] for seed in seeds
        ]
        cells += [_ci(pick(cut["claim"][metric]["seeds"][seed])) for seed in seeds]
        n = sum(any_ref["questions"].values()) if bench == "macro" else any_ref["questions"][bench]
        lines.append(f"| {'**macro-average**' if bench == 'macro' else bench} | {n} | " + " | ".join(cells) + " |")
    return lines + [""]


def figures(result: dict, histories: Mapping, folder: Path) -> list[str]:
    """Write the PNGs; return the markdown that shows them."""
    lines = ["## Plots", ""]
    for backbone, bb in result["backbones"].items():
        curves = plot_training_curves(histories[backbone], folder / f"training_{backbone}.png")
        points = [
            {"arm": ref, "seed": 0, "budget": "reference", "flops": 0.0, "score": s["f1"]["macro"]["estimate"]}
            for ref, s in bb["references"].items()
        ]
        points += [
            {
                "arm": arm,
                "seed": int(seed),
                "budget": budget,
                "flops": cell["spent"]["flops"],
                "score": cell["scores"]["f1"]["macro"]["estimate"],
            }
            for budget, cut in bb["budgets"].items()
            for arm, row in cut["arms"].items()
            for seed, cell in row["seeds"].items()
        ]
        compute = plot_score_vs_compute(points, folder / f"f1_vs_compute_{backbone}.png")
        lines += [
            f"![reward and F1 over steps, {backbone}]({curves.name})",
            "",
            f"![F1 against training compute, {backbone}]({compute.name})",
            "",
        ]
        for budget, cut in bb["budgets"].items():
            for metric in VERDICT_METRICS:
                claim = cut["claim"][metric]
                rows = [
                    {
                        "label": label,
                        "group": f"seed {seed}",
                        **(d["macro"] if label == "macro" else d["benchmarks"][label]),
                    }
                    for seed, d in claim["seeds"].items()
                    for label in [*d["benchmarks"], "macro"]
                ]
                path = plot_differences(
                    rows,
                    folder / f"differences_{backbone}_{budget}_{metric}.png",
                    f"{' - '.join(result['claim'])}, {NAMES[metric]}, {budget} ({backbone})",
                )
                lines += [f"![differences per benchmark, {metric}, {budget}]({path.name})", ""]
    return lines


def write_report(result: dict, histories: Mapping, profile: str, folder: Path) -> Path:
    """report.md, report.html and the figures in `folder` (replaced whole by the caller); return report.md."""
    lines = [f"# {' vs '.join(result['claim'])}: report (profile `{profile}`)", ""]
    lines += verdict_section(result) + spending_section(result) + ["## Per benchmark (mean [95% CI], in %)", ""]
    for backbone, bb in result["backbones"].items():
        for budget in bb["budgets"]:
            for metric in VERDICT_METRICS:
                lines += benchmark_section(result, backbone, budget, metric)
    lines += figures(result, histories, folder)
    lines += [
        "Wall-clock and CPU time per phase, peak memory and accelerator-hours are in the MLflow runs of each cell "
        "(tags arm, seed, backbone, budget); this report holds only numbers that reruns reproduce.",
        "",
    ]
    text = "\n".join(lines)
    (folder / "report.md").write_text(text, encoding="utf-8")
    (folder / "report.html").write_text(
        markdown_to_html(text, f"{' vs '.join(result['claim'])} ({profile})"), encoding="utf-8"
    )
    return folder / "report.md"
