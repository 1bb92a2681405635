"""Figures and the HTML copy of the arm-comparison report.

Training histories are plotted per key over step, one line per (arm, seed); `plot_health` draws the training
health monitors (`HEALTH_KEYS`, each as logged for the whole step and per role as `<key>.<role>`) that the
histories hold, and only those: runs logged before a monitor existed simply lack its line. `plot_dev_curves`
draws the dev-split F1 (`centralrl.rl.dev`) against step and against training FLOPs, from the start.

Every figure is a `matplotlib.figure.Figure` drawn on an Agg canvas (no pyplot state, nothing at import),
saved as PNG at a fixed dpi without the "Software" metadata, so the same inputs give byte-identical files.
Arms get distinct colors in sorted-arm order (a fixed list up to ten, evenly spaced hues beyond), references the
colors after them, so a trained arm has the same color in every figure; every mapping is walked in sorted-key order.
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import hsv_to_rgb, to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

DPI = 100
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
FLOPS_LABEL = "training FLOPs (estimated)"
DIFFERENCE_LABEL = "difference (first arm minus second), {level:.0%} CI"
LABEL_CHARS = 32  # a forest plot's row label (a benchmark name) past this is cut: the report's tables have it whole

CSS = (
    "body { font-family: system-ui, sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em; "
    "line-height: 1.5; }\n"
    "table { border-collapse: collapse; margin: 1em 0; }\n"
    "th, td { border: 1px solid #999; padding: 0.3em 0.7em; }\n"
    "th { background: #eee; }\n"
    "td { font-variant-numeric: tabular-nums; }\n"
    "img { max-width: 100%; }\n"
    "code { background: #f4f4f4; padding: 0 0.2em; }"
)


def palette(n: int) -> list[str]:
    """n distinct colors: COLORS for up to ten, else n hues evenly spaced around the wheel (colors that repeat
    would make two arms one line).

    >>> palette(2), len(set(palette(12)))
    (['#1f77b4', '#d62728'], 12)
    """
    if n <= len(COLORS):
        return COLORS[:n]
    return [to_hex(hsv_to_rgb((i / n, 0.8, 0.8))) for i in range(n)]


def arm_colors(arms: Sequence[str], references: Sequence[str] = ()) -> dict[str, str]:
    """{name: color}, a distinct one per name: the arms in sorted order, then the references, so that an arm's
    color does not depend on which references share its figure.

    >>> arm_colors(["joint", "central_only"], ["base"]) == arm_colors(["joint", "central_only"]) | {"base": COLORS[2]}
    True
    """
    names = sorted(set(arms)) + sorted(set(references) - set(arms))
    return dict(zip(names, palette(len(names))))


HEALTH_KEYS = (  # the trainer's step metrics that watch for collapse, in panel order
    "kl",
    "entropy",
    "response_tokens",  # generated tokens per call (response length)
    "invalid_rate",
    "subquestions_per_episode",
    "informative_share",  # groups with reward variance; 1 - informative_share have zero variance
    "informative_groups",
    "clip_fraction",
    "logprob_drift",  # mean |update - rollout| log-prob per trained token: the precision gap the clip absorbs
    "grad_norm",
)


def _new_figure(width: float, height: float, columns: int = 1, rows: int = 1) -> tuple[Figure, list[Axes]]:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    return figure, list(axes)


def _panels(count: int, columns: int, width: float, row_height: float) -> tuple[Figure, list[Axes]]:
    """A figure of `count` panels, `columns` to a row; the unused places of the last row hidden."""
    rows = -(-count // columns)
    figure, axes = _new_figure(width, row_height * rows, columns=columns, rows=rows)
    for ax in axes[count:]:
        ax.set_visible(False)
    return figure, axes[:count]


def _save(figure: Figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    return path


@functools.cache
def _drawable() -> frozenset[int]:
    """The code points the figures' font has a glyph for (matplotlib's default sans-serif, DejaVu Sans unless a
    matplotlibrc names another)."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(font_manager.findfont(font_manager.FontProperties())).get_charmap())


def plot_text(text: str, chars: int | None = None) -> str:
    """`text` that holds names from the data (benchmarks) as matplotlib draws it as written: each character the font
    lacks as its code point `[U+4E2D]` (drawn, it was a box, and two CJK names looked alike), cut to `chars` with "…"
    where it is longer (a 60-character name squeezed the forest plot's axes), each `$` escaped (two made mathtext of
    what lay between them, and a name that was no valid TeX stopped the compare stage). The report's tables have
    names whole.

    >>> plot_text("reward_mean.synth-1hop"), plot_text("cost $5 or $6"), plot_text("a" * 40, 8), plot_text("中文 qa")
    ('reward_mean.synth-1hop', 'cost \\\\$5 or \\\\$6', 'aaaaaaa…', '[U+4E2D][U+6587] qa')
    """
    text = "".join(c if ord(c) in _drawable() or c == "\n" else f"[U+{ord(c):04X}]" for c in text)
    if chars is not None and len(text) > chars:
        text = text[: chars - 1] + "…"
    return text.replace("$", r"\$")


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str, handles: Sequence[Line2D] | None = None) -> None:
    ax.set_title(plot_text(title))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(plot_text(ylabel))
    ax.grid(True, alpha=0.3)
    if handles is None:
        handles = ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles=list(handles), fontsize="small")


Histories = Mapping[str, Mapping[int, Sequence[Mapping[str, float]]]]  # arm -> seed -> rows with "step"


def _history_keys(histories: Histories) -> set[str]:
    """Every key some row of `histories` holds."""
    return {key for runs in histories.values() for rows in runs.values() for row in rows for key in row}


def _run_styles(histories: Histories) -> dict[tuple[str, int], dict[str, str]]:
    """{(arm, seed): its line's color (per arm) and linestyle (per seed)}, in sorted order."""
    colors = arm_colors(list(histories))
    seeds = sorted({seed for runs in histories.values() for seed in runs})
    return {
        (arm, seed): {"color": colors[arm], "linestyle": LINESTYLES[seeds.index(seed) % len(LINESTYLES)]}
        for arm in sorted(histories)
        for seed in sorted(histories[arm])
    }


def _plot_key(ax: Axes, histories: Histories, key: str, title: str, legend: bool = True) -> None:
    """`key` over step, one line per (arm, seed) whose rows have it (`_run_styles`); a run with one point, or
    with the key at only some of its steps (the KL, measured every few), has a marker at each point."""
    for (arm, seed), style in _run_styles(histories).items():
        rows = [r for r in histories[arm][seed] if key in r and "step" in r]
        if rows:
            sparse = len(rows) == 1 or len(rows) < len(histories[arm][seed])
            ax.plot(
                [r["step"] for r in rows],
                [r[key] for r in rows],
                marker="o" if sparse else None,
                label=f"{arm} seed {seed}",
                **style,
            )
    _finish(ax, title, "step", key, None if legend else ())


def plot_training_curves(histories: Histories, path: Path) -> Path:
    """reward_mean and f1 over step, then reward_mean per benchmark where the histories hold it, one line per
    (arm, seed): color per arm, linestyle per seed. No f1 panel where every step's f1 is its reward_mean (an F1
    reward without a format bonus: the same curve twice)."""
    present = _history_keys(histories)
    f1 = ["f1"] if "f1" in present and not _same_as_reward(histories, "f1") else []
    keys = ["reward_mean", *f1, *sorted(k for k in present if k.startswith("reward_mean."))]
    figure, axes = _panels(len(keys), 2, 10, 4)
    for ax, key in zip(axes, keys):
        _plot_key(ax, histories, key, f"{key} during training")
    return _save(figure, path)


def _same_as_reward(histories: Histories, key: str) -> bool:
    """Whether every row holding `key` has it equal to its reward_mean (the reward is logged in float32)."""
    rows = [row for runs in histories.values() for rows in runs.values() for row in rows if key in row]
    return all(math.isclose(row[key], row["reward_mean"], abs_tol=1e-6) for row in rows)


def dev_points(rows: Sequence[Mapping[str, float]], metric: str = "f1") -> list[tuple[float, float, float]]:
    """(step, training FLOPs spent, dev score) of a run's history: its start (kept in the first row as
    `dev.<metric>@start`) and every step where the dev split was scored.

    >>> rows = [{"step": 1, "dev.f1@start": 0.2, "spent.flops": 5.0}, {"step": 2, "dev.f1": 0.3, "spent.flops": 9.0}]
    >>> dev_points(rows)
    [(0, 0.0, 0.2), (2, 9.0, 0.3)]
    """
    start = [(0, 0.0, rows[0][f"dev.{metric}@start"])] if rows and f"dev.{metric}@start" in rows[0] else []
    return start + [(r["step"], r["spent.flops"], r[f"dev.{metric}"]) for r in rows if f"dev.{metric}" in r]


def plot_dev_curves(histories: Histories, path: Path) -> Path | None:
    """Dev F1 against step and against training FLOPs, then dev F1 per benchmark against step where the
    histories hold it, one line per (arm, seed); None without dev scores."""
    colors = arm_colors(list(histories))
    seeds = sorted({seed for runs in histories.values() for seed in runs})
    curves = {(arm, seed): dev_points(rows) for arm, runs in histories.items() for seed, rows in runs.items()}
    if not any(curves.values()):
        return None
    keys = _history_keys(histories)
    benchmarks = sorted(k.removeprefix("dev.f1.") for k in keys if k.startswith("dev.f1.") and "@" not in k)
    figure, axes = _panels(2 + len(benchmarks), 2, 10, 4)
    for (arm, seed), points in sorted(curves.items()):
        style = {"color": colors[arm], "linestyle": LINESTYLES[seeds.index(seed) % len(LINESTYLES)], "marker": "o"}
        for ax, x in zip(axes, (0, 1)):
            ax.plot([p[x] for p in points], [p[2] for p in points], label=f"{arm} seed {seed}", **style)
        for ax, benchmark in zip(axes[2:], benchmarks):
            mine = dev_points(histories[arm][seed], f"f1.{benchmark}")
            ax.plot([p[0] for p in mine], [p[2] for p in mine], label=f"{arm} seed {seed}", **style)
    _finish(axes[0], "dev F1 (held-out training questions)", "step", "dev F1")
    _finish(axes[1], "dev F1 against training compute", "training FLOPs (rollout + update)", "dev F1")
    for ax, benchmark in zip(axes[2:], benchmarks):
        _finish(ax, f"dev F1 on {benchmark}", "step", "dev F1")
    return _save(figure, path)


def health_keys(histories: Histories) -> list[str]:
    """The health monitors some row of `histories` holds, as `<key>` or per role `<key>.<role>`, in HEALTH_KEYS
    order (a monitor's step-wide key first, then its roles sorted).

    >>> health_keys({"joint": {0: [{"step": 1, "response_tokens.central": 9.0, "loss": 1.0, "kl": 0.1}]}})
    ['kl', 'response_tokens.central']
    """
    present = _history_keys(histories)
    return [
        key
        for monitor in HEALTH_KEYS
        for key in sorted(present, key=lambda k: (k != monitor, k))
        if key == monitor or key.startswith(f"{monitor}.")
    ]


def health_figure(histories: Histories) -> Figure | None:
    """One panel per health monitor the histories hold (`health_keys`), three to a row, and one legend of the runs
    above them all (a legend per panel covered the lines); None when they hold none. A panel whose values are
    all at least 0 (sizes, shares and rates: every monitor) starts its axis at 0, an all-zero one too."""
    keys = health_keys(histories)
    if not keys:
        return None
    figure, axes = _panels(len(keys), 3, 13, 3.2)
    for ax, key in zip(axes, keys):
        _plot_key(ax, histories, key, key, legend=False)
        if ax.dataLim.ymin >= 0:
            ax.set_ylim(bottom=0)
    runs = [
        Line2D([], [], label=f"{arm} seed {seed}", **style) for (arm, seed), style in _run_styles(histories).items()
    ]
    figure.legend(handles=runs, loc="outside upper center", ncols=min(len(runs), 6), fontsize="small")
    return figure


def plot_health(histories: Histories, path: Path) -> Path | None:
    """`health_figure` as a PNG; None, and nothing written, when the histories hold no health monitor."""
    figure = health_figure(histories)
    return None if figure is None else _save(figure, path)


def _legend_handles(colors: Mapping[str, str], markers: Mapping[str, str], seeds: Sequence[int]) -> list[Line2D]:
    """Proxy entries: arms by color, budgets by marker, seeds by linestyle."""
    arms = [Line2D([], [], color=c, label=arm) for arm, c in sorted(colors.items())]
    budgets = [
        Line2D([], [], color="gray", marker=m, linestyle="none", label=f"budget {b}")
        for b, m in sorted(markers.items())
    ]
    lines = [
        Line2D([], [], color="gray", linestyle=LINESTYLES[i % len(LINESTYLES)], label=f"seed {s}")
        for i, s in enumerate(seeds)
    ]
    return arms + budgets + lines


def plot_score_vs_compute(points: Sequence[Mapping], path: Path, metric: str = "f1") -> Path:
    """Score (0-100) against FLOPs spent: color per arm, marker per budget, a line per (arm, seed) in FLOPs
    order; flops-0 references (e.g. "base") are horizontal dashed lines labeled with the arm name."""
    trained = [p for p in points if p["flops"] > 0]
    references = [p for p in points if p["flops"] <= 0]
    colors = arm_colors([p["arm"] for p in trained], [p["arm"] for p in references])
    markers = {b: MARKERS[i % len(MARKERS)] for i, b in enumerate(sorted({p["budget"] for p in trained}))}
    seeds = sorted({p["seed"] for p in trained})
    figure, (ax,) = _new_figure(7, 4.5)
    for arm, seed in sorted({(p["arm"], p["seed"]) for p in trained}):
        run = sorted(
            (p for p in trained if p["arm"] == arm and p["seed"] == seed), key=lambda p: (p["flops"], p["budget"])
        )
        ax.plot(
            [p["flops"] for p in run],
            [p["score"] for p in run],
            color=colors[arm],
            alpha=0.6,
            linestyle=LINESTYLES[seeds.index(seed) % len(LINESTYLES)],
        )
        for p in run:
            ax.scatter([p["flops"]], [p["score"]], color=colors[arm], marker=markers[p["budget"]], zorder=3)
    handles = _legend_handles({a: colors[a] for a in {p["arm"] for p in trained}}, markers, seeds)
    for arm in sorted({p["arm"] for p in references}):
        for p in sorted((p for p in references if p["arm"] == arm), key=lambda p: (p["seed"], p["budget"])):
            ax.axhline(p["score"], color=colors[arm], linestyle="--", linewidth=1)
        handles.append(Line2D([], [], color=colors[arm], linestyle="--", label=arm))
    if trained:
        ax.set_xscale("log")
    _finish(ax, f"{metric} vs training compute", FLOPS_LABEL, f"{metric} (macro-average, %)", handles)
    return _save(figure, path)


def _first_seen(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def plot_differences(rows: Sequence[Mapping], path: Path, title: str, level: float) -> Path:
    """Forest plot: one row per label (first-appearance order, top down), one estimate with its CI (at `level`,
    e.g. 0.95) per group."""
    labels = _first_seen([r["label"] for r in rows])
    groups = _first_seen([r["group"] for r in rows])
    step, colors = 0.6 / max(len(groups), 1), palette(len(groups))
    figure, (ax,) = _new_figure(7, 1.2 + 0.5 * max(len(labels), 1))
    for g, group in enumerate(groups):
        offset = (g - (len(groups) - 1) / 2) * step
        mine = [r for r in rows if r["group"] == group]
        ax.errorbar(
            [r["estimate"] for r in mine],
            [labels.index(r["label"]) + offset for r in mine],
            xerr=[[max(r["estimate"] - r["low"], 0) for r in mine], [max(r["high"] - r["estimate"], 0) for r in mine]],
            fmt=MARKERS[g % len(MARKERS)],
            color=colors[g],
            capsize=3,
            label=group,
        )
    ax.axvline(0, color="black", linewidth=1)
    ax.set_yticks(range(len(labels)), [plot_text(label, LABEL_CHARS) for label in labels])
    ax.set_ylim(max(len(labels), 1) - 0.5, -0.5)
    _finish(ax, title, DIFFERENCE_LABEL.format(level=level), "")
    return _save(figure, path)


def markdown_to_html(markdown: str, title: str) -> str:
    """A standalone HTML page of the markdown (CommonMark plus tables, raw HTML shown as text, never run: a benchmark
    named `<script>` is a name); relative image links are kept as written."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    return (
        f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
        f"<style>\n{CSS}\n</style>\n</head>\n<body>\n{body}</body>\n</html>\n"
    )
