"""Report figures are PNGs, byte-identical for the same inputs and different for different ones; the HTML copy."""

from __future__ import annotations

import copy
import warnings

import numpy as np
from matplotlib.image import imread

from centralrl.plots import (
    COLORS,
    LABEL_CHARS,
    arm_colors,
    health_figure,
    markdown_to_html,
    plot_differences,
    plot_health,
    plot_score_vs_compute,
    plot_text,
    plot_training_curves,
)


def _same_twice_and_changes(draw, data, changed, tmp_path):
    first = draw(data, tmp_path / "a" / "one.png").read_bytes()
    second = draw(data, tmp_path / "two.png").read_bytes()
    other = draw(changed, tmp_path / "three.png").read_bytes()
    assert first.startswith(b"\x89PNG") and len(first) > 1000
    assert first == second
    assert first != other


def test_training_curves(tmp_path):
    histories = {
        arm: {
            seed: [{"step": s, "reward_mean": 0.1 * s + seed, "f1": 0.2 * s, "loss": 1.0} for s in range(1, 4)]
            for seed in (0, 1)
        }
        for arm in ("joint", "central_only")
    }
    changed = copy.deepcopy(histories)
    changed["joint"][1][2]["f1"] = 0.9
    _same_twice_and_changes(plot_training_curves, histories, changed, tmp_path)
    per_benchmark = copy.deepcopy(histories)  # a panel per benchmark's reward: a second row of panels
    per_benchmark["joint"][0][0] |= {"reward_mean.synth-1hop": 0.5, "reward_mean.synth-2hop": 0.1}
    taller = plot_training_curves(per_benchmark, tmp_path / "b.png").read_bytes()
    assert _png_height(taller) == 2 * _png_height((tmp_path / "two.png").read_bytes())


def test_training_curves_leave_out_an_f1_that_is_the_reward(tmp_path):
    # an F1 reward without a format bonus logs f1 equal to reward_mean (that one in float32): one curve, one panel
    def run(f1) -> list[dict]:
        return [{"step": s, "reward_mean": float(np.float32(0.1 * s))} | f1(s) for s in range(1, 4)]

    with_f1 = {"joint": {0: run(lambda s: {"f1": 0.1 * s})}}
    without = {"joint": {0: run(lambda s: {})}}
    drawn = plot_training_curves(with_f1, tmp_path / "f1.png").read_bytes()
    assert drawn == plot_training_curves(without, tmp_path / "none.png").read_bytes()


def _png_height(png: bytes) -> int:
    return int.from_bytes(png[20:24], "big")  # the IHDR chunk: width, then height


def test_health_monitors_plot_the_keys_a_history_has(tmp_path):
    # an older run (seed 1) lacks the newer monitors: its lines are missing there, nothing is made up for it
    histories = {
        arm: {
            0: [
                {"step": s, "kl": 0.01 * s, "grad_norm": 1.0 / s, "response_tokens.central": 10.0 + s, "f1": 0.1}
                for s in range(1, 4)
            ],
            1: [{"step": s, "kl": 0.02 * s, "f1": 0.1} for s in range(1, 4)],
        }
        for arm in ("joint", "central_only")
    }
    changed = copy.deepcopy(histories)
    changed["joint"][0][1]["grad_norm"] = 5.0
    _same_twice_and_changes(plot_health, histories, changed, tmp_path)
    with_entropy = copy.deepcopy(histories)
    with_entropy["joint"][1][0]["entropy"] = 2.0  # one more panel
    assert plot_health(with_entropy, tmp_path / "e.png").read_bytes() != (tmp_path / "two.png").read_bytes()
    assert plot_health({"joint": {0: [{"step": 1, "reward_mean": 0.5}]}}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_health_figure_has_one_legend_marks_sparse_points_and_starts_axes_at_zero():
    # kl measured at steps 4 and 8 only (kl_every 4), invalid_rate 0 at every step, grad_norm at every step
    histories = {
        arm: {
            seed: [
                {"step": s, "invalid_rate": 0.0, "grad_norm": 1.0 + s} | ({"kl": 0.01 * s} if s % 4 == 0 else {})
                for s in range(1, 9)
            ]
            for seed in (0, 1)
        }
        for arm in ("joint", "central_only")
    }
    figure = health_figure(histories)
    panels = {ax.get_title(): ax for ax in figure.axes if ax.get_visible()}
    assert list(panels) == ["kl", "invalid_rate", "grad_norm"]
    assert all(ax.get_legend() is None for ax in panels.values())  # a legend per panel covered its lines
    assert [t.get_text() for t in figure.legends[0].get_texts()] == [
        f"{arm} seed {seed}" for arm in ("central_only", "joint") for seed in (0, 1)
    ]
    assert {line.get_marker() for line in panels["kl"].get_lines()} == {"o"}  # 2 points of 8 steps
    assert {line.get_marker() for line in panels["grad_norm"].get_lines()} == {"None"}
    low, high = panels["invalid_rate"].get_ylim()
    assert low == 0 < high  # not -0.04 to 0.04
    assert panels["grad_norm"].get_ylim()[0] == 0


def test_dev_curves_start_at_the_start_and_follow_the_scored_steps(tmp_path):
    from centralrl.plots import plot_dev_curves

    def run(gain: float) -> list[dict]:
        rows = [{"step": s, "spent.flops": 1e9 * s} for s in range(1, 5)]
        rows[0] |= {"dev.f1@start": 0.3, "dev.em@start": 0.1}
        rows[1] |= {"dev.f1": 0.3 + gain, "dev.em": 0.1}
        rows[3] |= {"dev.f1": 0.3 + 2 * gain, "dev.em": 0.2}
        return rows

    histories = {"joint": {0: run(0.05)}, "central_only": {0: run(0.1), 1: run(0.0)}}
    changed = copy.deepcopy(histories)
    changed["joint"][0][3]["dev.f1"] = 0.9
    _same_twice_and_changes(plot_dev_curves, histories, changed, tmp_path)
    assert plot_dev_curves({"joint": {0: [{"step": 1, "spent.flops": 1.0}]}}, tmp_path / "none.png") is None
    per_benchmark = copy.deepcopy(histories)  # dev F1 per benchmark: a second row of panels
    for rows in per_benchmark["joint"].values():
        rows[0] |= {"dev.f1.synth-1hop@start": 0.8, "dev.f1.synth-2hop@start": 0.1}
        rows[3] |= {"dev.f1.synth-1hop": 0.6, "dev.f1.synth-2hop": 0.3}
    taller = plot_dev_curves(per_benchmark, tmp_path / "b.png").read_bytes()
    assert _png_height(taller) == 2 * _png_height((tmp_path / "two.png").read_bytes())


def test_score_vs_compute_with_reference(tmp_path):
    points = [{"arm": "base", "seed": 0, "budget": "none", "flops": 0.0, "score": 20.0}]
    points += [
        {
            "arm": arm,
            "seed": seed,
            "budget": budget,
            "flops": flops * (2 if arm == "joint" else 1),
            "score": 25.0 + flops / 1e12 + seed,
        }
        for arm in ("central_only", "joint")
        for seed in (0, 1)
        for budget, flops in (("small", 1e12), ("large", 4e12))
    ]
    changed = [dict(p, score=p["score"] + 1) if p["arm"] == "joint" else p for p in points]

    def draw(data, path):
        return plot_score_vs_compute(data, path, metric="f1")

    _same_twice_and_changes(draw, points, changed, tmp_path)


def _longest_row(png, color: str) -> int:
    """The most pixels of exactly `color` in one row of the image (a horizontal line spans hundreds)."""
    pixels = np.rint(imread(png)[..., :3] * 255).astype(int)
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    return int((pixels == rgb).all(axis=-1).sum(axis=1).max())


def test_an_arm_has_its_color_in_every_figure_with_references_or_without(tmp_path):
    # the training, dev and health figures color the trained arms alone: central_only the first color, joint the
    # second; the compute figure keeps them and gives its reference, a full-width dashed line, the third
    points = [{"arm": "base", "seed": 0, "budget": "reference", "flops": 0.0, "score": 20.0}]
    points += [
        {"arm": arm, "seed": 0, "budget": budget, "flops": flops, "score": 25.0 + flops / 1e12 + (arm == "joint")}
        for arm in ("central_only", "joint")
        for budget, flops in (("small", 1e12), ("large", 4e12))
    ]
    assert arm_colors(["joint", "central_only"]) == {"central_only": COLORS[0], "joint": COLORS[1]}
    png = plot_score_vs_compute(points, tmp_path / "compute.png")
    assert _longest_row(png, COLORS[2]) > 300
    assert _longest_row(png, COLORS[0]) < 100 and _longest_row(png, COLORS[1]) < 100


def test_differences_forest(tmp_path):
    rows = [
        {"label": label, "group": group, "estimate": e, "low": e - 2.0, "high": e + 1.5}
        for group, shift in (("seed 0", 0.0), ("seed 1", 1.0))
        for label, e in (("hotpotqa", 1.0 + shift), ("nq", -0.5), ("macro", 0.3))
    ]
    changed = [dict(r, high=r["high"] + 3) if r["label"] == "nq" else r for r in rows]

    def draw(data, path, level=0.95):
        return plot_differences(data, path, title="central_only minus joint", level=level)

    _same_twice_and_changes(draw, rows, changed, tmp_path)
    # the axis names the CIs' level, which compare.level sets: 90% intervals are not labelled 95%
    assert draw(rows, tmp_path / "90.png", level=0.9).read_bytes() != (tmp_path / "two.png").read_bytes()


def test_benchmark_names_with_dollars_or_many_characters_are_drawn_as_written(tmp_path):
    """Two `$` in a benchmark name made mathtext of it, and one that was no valid TeX stopped the compare stage; a
    60-character name squeezed the forest plot's axes to a sliver: it is cut to LABEL_CHARS."""
    long = "org_name/some_benchmark_dataset_name-distractor-validation-v2"
    labels = ["$\\frac$ b", long, "macro"]
    rows = [{"label": label, "group": "seed 0", "estimate": 1.0, "low": 0.0, "high": 2.0} for label in labels]
    drawn = plot_differences(rows, tmp_path / "long.png", title="t", level=0.95).read_bytes()
    cut = [dict(row, label=plot_text(long, LABEL_CHARS)) if row["label"] == long else row for row in rows]
    assert plot_differences(cut, tmp_path / "cut.png", title="t", level=0.95).read_bytes() == drawn
    history = {"joint": {0: [{"step": 1, "reward_mean": 0.1, "reward_mean.$\\frac$": 0.2}]}}
    assert plot_training_curves(history, tmp_path / "training.png").read_bytes().startswith(b"\x89PNG")


def test_benchmark_names_the_font_cannot_draw_are_drawn_as_code_points(tmp_path):
    """A CJK benchmark name drew as boxes (matplotlib's "Glyph missing from font" warning), so two such names looked
    alike in a forest plot: each character the font lacks is drawn as its code point instead, without a warning."""
    rows = [
        {"label": label, "group": "seed 0", "estimate": 1.0, "low": 0.0, "high": 2.0} for label in ("中文", "日本")
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_differences(rows, tmp_path / "cjk.png", title="中文 minus 日本", level=0.95)
        plot_training_curves({"joint": {0: [{"step": 1, "reward_mean.中文": 0.2}]}}, tmp_path / "training.png")
    assert plot_text("中文") != plot_text("日本") and plot_text("qa é…") == "qa é…"


def test_markdown_to_html():
    page = markdown_to_html(
        "# Report\n\n| arm | f1 |\n|---|---:|\n| joint | 31.20 |\n\n![x](a.png)\n", title="Arms & seeds"
    )
    assert page.startswith("<!doctype html>")
    assert '<meta charset="utf-8">' in page
    assert "<title>Arms &amp; seeds</title>" in page
    assert "<table>" in page and "<td>joint</td>" in page
    assert '<img src="a.png" alt="x"' in page
    # raw HTML is text, never run: a benchmark named <script> is a name
    assert "<td>&lt;script&gt;x&lt;/script&gt;</td>" in markdown_to_html("| a |\n|---|\n| <script>x</script> |", "t")
