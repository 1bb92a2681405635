"""The report's tables say what their numbers are: the trained steps each cut held, the verdict's MDE in the
order its header names, its units and n, and how the movement table folds the seeds; names and texts from the data
(benchmarks, questions, generations) render as written in the report and the transcripts."""

from __future__ import annotations

import re

import pytest

from centralrl.compare import comparison
from centralrl.config import load_config
from centralrl.evaluation import transcript
from centralrl.harness.episodes import Episode, RoleCall
from centralrl.plots import markdown_to_html
from centralrl.report import benchmark_section, movement_section, spending_section, verdict_section
from centralrl.schema import Question
from conftest import write_params


def test_the_spending_table_shows_the_optimizer_steps_a_cut_held():
    # 8 rollout steps, the 6th with no informative group (skipped): cut at step 8 after 7 updates
    from centralrl.rl.run import spending

    history = [
        {"skipped": float(step == 6), "trained_tokens.central": 10.0, "flops.generation": 1e9, "flops.update": 2e9}
        for step in range(1, 9)
    ]
    spent = {k: v for k, v in spending(history, 0.0).items() if k != "wall_seconds"}
    cell = {"step": 8, "reached": False, "spent": spent}
    result = {"backbones": {"main": {"budgets": {"equal_steps": {"arms": {"joint": {"seeds": {"0": cell}}}}}}}}
    table = "\n".join(spending_section(result))
    assert "| cut at step | trained steps | budget reached |" in table
    assert "| main | equal_steps | joint | 0 | 8 | 7 | no | 80 | 2.4e+10 |" in table


def _comparison(params, right: dict | None = None, questions: int = 40, benchmarks: str | list = "xy") -> dict:
    """The compare stage's statistics on the seeds of `params`, each over `questions` questions in `benchmarks`
    (alternating): by default central_only right on every other question, joint on every fourth (`right`: arm ->
    whether it answers question i); central in seed 0 made 10 calls and changed 1, in seed 1 30 and 15."""
    cfg = load_config(params)

    def records(right) -> list[dict]:
        scores = [float(right(i)) for i in range(questions)]
        return [
            {"id": f"q{i:02d}", "benchmark": benchmarks[i % len(benchmarks)], "question": "Who?"}
            | {"golden_answers": ["Ann"], "f1": s, "acc": s, "em": s}
            for i, s in enumerate(scores)
        ]

    def moved(arm: str, calls: int, changed: int) -> dict:
        share = {"calls": calls, "changed": changed, "changed_share": changed / calls, "kl": 0.01}
        return {role: share | {"adapter": adapter} for role, adapter in cfg.arm_adapters(arm).items()}

    right = right or {"central_only": lambda i: i % 4 < 2, "joint": lambda i: i % 4 == 0}
    scores = {arm: records(right[arm]) for arm in ("central_only", "joint")}
    arms = {arm: {seed: dict.fromkeys(cfg.budgets, scores[arm]) for seed in cfg.seeds} for arm in cfg.arms}
    cut = {"step": 2, "reached": True, "spent": {"steps": 2.0, "trained_tokens": 10.0, "flops": 1e9}}
    cuts = {arm: {seed: {b: cut | {"budget": {}} for b in cfg.budgets} for seed in cfg.seeds} for arm in cfg.arms}
    movement = {
        arm: {seed: dict.fromkeys(cfg.budgets, moved(arm, *[(10, 1), (30, 15)][seed])) for seed in cfg.seeds}
        for arm in cfg.arms
    }
    references = {ref: scores["joint"] for ref in cfg.references}
    return comparison(cfg, {"main": arms}, {"main": references}, {"main": cuts}, {"main": movement})


def test_the_verdict_table_says_its_units_its_n_and_which_mde_comes_first(tmp_path):
    result = _comparison(write_params(tmp_path, {"seeds": [0, 1]}))
    power = result["backbones"]["main"]["budgets"]["equal_steps"]["claim"]["f1"]["power"]
    per_seed = sorted(d["rule_mde"] for d in power["seeds"].values())
    assert power["mde"] < per_seed[0]  # the seed-averaged difference is the one to see first
    table = "\n".join(verdict_section(result))
    assert "in points of the metric on 0-100" in table
    assert "| metric | n | central_only (mean over seeds) |" in table
    assert "MDE at 80% power, seed-averaged (each seed alone, all seeds at 80% together)" in table
    mde = f"{power['mde']:.2f} ({per_seed[0]:.2f}-{per_seed[1]:.2f})"
    assert "| main | equal_steps (steps 2) | F1 | 40 x 2 | 50.00 | 25.00 | s0: 25.00 [" in table
    assert f"| **supported** | {mde} |" in table


def test_the_verdict_reads_the_configured_level(tmp_path):
    """One seed, central_only right on 2 more of the 12 questions of each benchmark, never on fewer: the percentile
    CI is above 0 but the sign-flip p is about 2/2**4 = 0.125 (seeded Monte Carlo over 24 questions), so at level
    0.95 the claim is not told from chance, and at level 0.8 (alpha 0.2) it is supported."""
    right = {"central_only": lambda i: i < 4, "joint": lambda i: False}
    for level, expected in ((0.95, "inconclusive"), (0.8, "supported")):
        params = write_params(tmp_path / str(level), {"seeds": [0], "compare": {"level": level}})
        claim = _comparison(params, right, questions=24)["backbones"]["main"]["budgets"]["equal_steps"]["claim"]
        difference = claim["f1"]["seeds"][0]
        assert difference["macro"]["low"] > 0 and difference["p_value"] == pytest.approx(0.125, abs=0.01)
        assert claim["f1"]["verdict"] == claim["acc"]["verdict"] == expected, level


def test_the_movement_table_says_calls_are_summed_and_shares_averaged_unweighted(tmp_path):
    table = "\n".join(movement_section(_comparison(write_params(tmp_path, {"seeds": [0, 1]}))))
    assert "| calls, summed over seeds |" in table
    assert "| main | equal_steps | central_only | retrieval | 40 | frozen | frozen | | |" in table
    assert "| changed, mean over seeds (unweighted) | KL, mean over seeds (unweighted) |" in table
    # 1 of 10 and 15 of 30 changed: 30% a seed on average (16 of 40 calls would be 40%)
    assert (
        "| main | equal_steps | joint | central | 40 | s0: 10%; s1: 50% | s0: 0.01; s1: 0.01 | 30% | 0.01 |" in table
    )


def test_a_claim_whose_arms_were_not_published_prints_no_published_difference(tmp_path):
    # a claim may name arms the paper did not publish (compare.published_difference: None): the table's published
    # column says "-" for it rather than looking the arms up in PUBLISHED
    result = _comparison(write_params(tmp_path, {"seeds": [0, 1]}))
    result["claim"] = ["central_only", "joint_lr2"]
    for cut in result["backbones"]["main"]["budgets"].values():
        cut["arms"]["joint_lr2"] = cut["arms"].pop("joint")
        for claim in cut["claim"].values():
            claim["power"] |= {"published": None, "detectable": None}
    table = "\n".join(verdict_section(result))
    assert "| main | equal_steps (steps 2) | F1 | 40 x 2 | 50.00 | 25.00 | s0: 25.00 [" in table
    assert all(line.endswith("| - |") for line in table.splitlines() if line.startswith("| main |"))


def test_a_cell_that_ended_short_of_its_budget_is_named_beside_the_verdict():
    """Stop 59's joint seed 1 trained 5 of its 8 equal steps (5 of 10 rollout batches had no informative group):
    the spending table said "no", but the verdict compared it as if at equal steps."""
    from centralrl.report import shortfall_notes

    def cell(reached: bool, steps: float) -> dict:
        spent = {"steps": steps, "trained_tokens": 4160.0, "flops": 4.7e13}
        return {"budget": {"steps": 8}, "reached": reached, "spent": spent, "step": 10}

    arms = {
        "central_only": {"seeds": {0: cell(True, 8.0)}},
        "joint": {"seeds": {0: cell(True, 8.0), 1: cell(False, 5.0)}},
    }
    result = {"backbones": {"main": {"budgets": {"equal_steps": {"arms": arms}}}}}
    assert shortfall_notes(result) == [
        "- **main, equal_steps: joint seed 1 ended short of the budget** (steps 5 of 8), at rollout batch 10, the "
        "run's last: its batches whose groups all had equal rewards trained nothing, so this seed compares at less "
        "than the budget.",
        "",
    ]
    arms["joint"]["seeds"][1] = cell(True, 8.0)
    assert shortfall_notes(result) == []
    # other units run out of rollout batches; a wall-clock budget's spending is not in `spent` (machine-dependent)
    arms["joint"]["seeds"][1] = cell(False, 5.0) | {"budget": {"flops": 1e14}}
    arms["central_only"]["seeds"][0] = cell(False, 8.0) | {"budget": {"wall_seconds": 600.0}}
    assert shortfall_notes(result)[:2] == [
        "- **main, equal_steps: central_only seed 0 ended short of the budget**, at rollout batch 10, the run's last: "
        "it reached train.grpo.steps, its last rollout batch, first, so this seed compares at less than the budget.",
        "- **main, equal_steps: joint seed 1 ended short of the budget** (flops 4.7e+13 of 1e+14), at rollout batch "
        "10, the run's last: it reached train.grpo.steps, its last rollout batch, first, so this seed compares at "
        "less than the budget.",
    ]


def test_a_benchmark_name_with_a_pipe_html_or_a_newline_stays_in_its_cell_and_reads_as_written(tmp_path):
    """A name with `|` split its row (the last column fell off), `<script>` ran in report.html and a newline ended
    the row; ordinary names are written as before."""
    names = ["a|b", "<script>alert(1)</script>", "x &amp; `y`", "two\nlines", "hotpotqa"]
    result = _comparison(write_params(tmp_path, {"seeds": [0]}), questions=10, benchmarks=names)
    table = benchmark_section(result, "main", "equal_steps", "f1")[2:-1]
    cells = [len(re.findall(r"(?<!\\)\|", row)) for row in table]
    assert len(table) == 2 + len(names) + 1 and set(cells) == {cells[0]}  # header, rule, benchmarks, macro
    assert any(row.startswith("| hotpotqa | 2 | ") for row in table)
    page = markdown_to_html("\n".join(table), "t")
    for name in ["a|b", "&lt;script&gt;alert(1)&lt;/script&gt;", "x &amp;amp; `y`", "two\u23celines"]:
        assert f"<td>{name}</td>" in page
    assert "<script>" not in page


def test_a_transcript_keeps_its_structure_whatever_the_question_answers_and_generations_hold():
    """A newline in a question made a heading of its next line, a backtick in a generation ended its code span and a
    fence swallowed the rest of the transcript, and golden answers joined by " | " read ambiguously once one held a
    `|`; a plain episode reads as before."""
    question = Question("q1", "Who? | <b>x</b>\n# no heading", ("A|B", "C"), "synth-1hop", "test")
    episode = Episode(question, prediction="`A`\n\n## no heading")
    for turn, text in enumerate(["```py\nx = `y`\n```", "<search>Who?</search>"]):
        episode.calls.append(RoleCall("central", None, turn, (1,), (2,), (0.0,), text, True))
    lines = transcript(episode).splitlines()
    assert lines == [
        "### q1 (synth-1hop)",
        "**Question:** Who? \\| \\<b>x\\</b>\u23ce# no heading",
        "**Golden:** `A|B`, `C`",
        "",
        "- turn 0, **central**: ```` ```py\u23cex = `y`\u23ce``` ````",
        "- turn 1, **central**: `<search>Who?</search>`",
        "",
        "**Prediction:** \\`A\\`\u23ce\u23ce## no heading; cut at the turn limit: False",
    ]
    page = markdown_to_html("\n".join(lines), "t")
    assert page.count("<h3>") == 1 and "<h1>" not in page and "<h2>" not in page and "<pre>" not in page
    assert "<code>```py\u23cex = `y`\u23ce```</code>" in page and "&lt;b&gt;x&lt;/b&gt;" in page
    # two golden answers, one holding " | ": rendered, they were "A|B | C", which reads as three
    assert "<strong>Golden:</strong> <code>A|B</code>, <code>C</code>" in page
