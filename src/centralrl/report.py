"""The experiment report: the verdict with the minimum detectable difference beside the published one, what
each arm spent, how far each role moved from the start, per-benchmark tables with CIs, and plots (training
curves and health monitors among them), as markdown (`report.md`) with an HTML copy and PNG figures beside it.
Everything comes from `compare.comparison` and the training histories, so the same records give the same bytes;
wall-clock, CPU time and peak memory live in MLflow (machine-dependent numbers would break that).

Each run's training reward (first and last quarter of its steps) and dev F1 sit beside the trained-minus-start
table, so whether anything was learned is read off the report, not the plots alone. The rise comes with the noise
it would have without learning (from the spread of the run's step rewards) and the rise the run could detect, as
the verdict comes with its minimum detectable difference.

The verdict says in words when it cannot be read as evidence: an inconclusive verdict says whether the
experiment could have detected the published difference at all, and an arm whose trained sub-agents changed no
greedy output is named as comparing the central agent against itself.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from pathlib import Path

from centralrl.attribution import markdown
from centralrl.compare import PUBLISHED, VERDICT_METRICS
from centralrl.io import markdown_text
from centralrl.plots import (
    dev_points,
    markdown_to_html,
    plot_differences,
    plot_dev_curves,
    plot_health,
    plot_score_vs_compute,
    plot_training_curves,
)
from centralrl.stats import minimum_detectable_difference

NAMES = {"f1": "F1", "acc": "Acc", "em": "EM"}


def _ci(d: Mapping) -> str:
    """An estimate and its interval to two decimals; a difference that is 0 up to rounding prints as 0.00.

    >>> _ci({"estimate": -1e-15, "low": -16.666, "high": 16.666})
    '0.00 [-16.67, 16.67]'
    """
    return "{:.2f} [{:.2f}, {:.2f}]".format(*(round(d[key], 2) + 0.0 for key in ("estimate", "low", "high")))


def _budget_text(spec: Mapping) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in spec.items())


def verdict_section(result: dict) -> list[str]:
    first, second = result["claim"]
    lines = [
        "## Verdict",
        "",
        f"Claim: **{first} > {second}**. Rule: {result['rule']} (level {result['level']:.0%}).",
        "",
        "Scores, differences and MDEs in points of the metric on 0-100 (macro-average over the benchmarks); n: test "
        "questions x seeds.",
        "",
        f"| backbone | budget | metric | n | {first} (mean over seeds) | {second} | difference per seed [CI], p | "
        f"verdict | MDE at {result['power']:.0%} power, seed-averaged (each seed alone, all seeds at "
        f"{result['power']:.0%} together) | published difference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for backbone, bb in result["backbones"].items():
        for budget, cut in bb["budgets"].items():
            for metric in VERDICT_METRICS:
                claim = cut["claim"][metric]
                seeds = "; ".join(
                    f"s{seed}: {_ci(d['macro'])}, p={d['p_value']:.3f}" for seed, d in claim["seeds"].items()
                )
                means = [cut["arms"][arm]["spread"][metric]["mean"] for arm in (first, second)]
                lines.append(
                    f"| {backbone} | {budget} ({_budget_text(cut['budget'])}) | {NAMES[metric]} "
                    f"| {claim['power']['questions']} x {len(claim['seeds'])} | {means[0]:.2f} "
                    f"| {means[1]:.2f} | {seeds} | **{claim['verdict']}** | {_mde(claim['power'])} "
                    f"| {_published(metric, first, second, claim['power']['published'])} |"
                )
    lines += [
        "",
        "Published: Qwen2.5-3B, seven benchmarks, one run per arm at equal steps, no interval. MDE: the smallest "
        f"true difference that the verdict's two-sided sign-flip test at alpha = {1 - result['level']:.2f} (its "
        f"interval then above 0 too) finds with probability {result['power']:.0%}: t + z_power x SE, t the "
        "smallest difference the test rejects, t - w = z_(1-alpha/2) x sqrt(SE^2 + t^2 / m) (the test's null "
        "spread holds the difference itself; m: the test questions, w: half the step of one sign flip, a "
        "continuity correction), so more than (z_(1-alpha/2) + z_power) x SE at few questions, that at many. SE: "
        "of the difference averaged over the seeds, "
        "sqrt(SE_questions^2 + s_seeds^2 / S): the paired bootstrap's over the questions, plus how the seeds' own "
        "differences spread, since the claim is about training, which varies by seed. In parentheses: what each "
        "seed alone needs, as the verdict rule asks every seed's interval to exclude 0, at power "
        f"{result['power']:.0%}^(1/S), so that all S seeds succeed together with probability {result['power']:.0%}: "
        "t at its own SE over the questions (what its test sees) + z_(power^(1/S)) x sqrt(SE^2 + "
        "s_seeds^2), as its own difference also varies with training by the seeds' SD s_seeds (with one seed, "
        "unmeasured: the seed's trained model held fixed).",
        "",
        *power_notes(result),
        *movement_notes(result),
        *shortfall_notes(result),
    ]
    return lines


def shortfall_notes(result: dict) -> list[str]:
    """A sentence per cell that ended before its budget: it enters the comparison at that budget with less."""
    lines = []
    for backbone, bb in result["backbones"].items():
        for budget, cut in bb["budgets"].items():
            for arm, row in cut["arms"].items():
                for seed, cell in row["seeds"].items():
                    if not cell["reached"]:
                        lines.append(f"- **{backbone}, {budget}: {arm} seed {seed} {_shortfall(cell)}")
    return lines + [""] if lines else []


def _shortfall(cell: Mapping) -> str:
    """Why the cell's run ended short of its (one-unit) budget, and by how much where the run counted it."""
    ((unit, limit),) = cell["budget"].items()
    spent = cell["spent"].get(unit)  # wall seconds are not kept with the cuts: they would differ by machine
    figure = "{:.3g}" if unit == "flops" else "{:,.0f}"
    how = f" ({unit} {figure.format(spent)} of {figure.format(limit)})" if spent is not None else ""
    why = (
        "its batches whose groups all had equal rewards trained nothing"
        if unit == "steps"
        else "it reached train.grpo.steps, its last rollout batch, first"
    )
    return (
        f"ended short of the budget**{how}, at rollout batch {cell['step']}, the run's last: {why}, so this seed "
        "compares at less than the budget."
    )


def _published(metric: str, first: str, second: str, difference: float | None) -> str:
    """The published scores of the claim's arms and their difference; "-" when these arms were not published
    (`compare.published_difference` is None: a claim may name arms the paper did not run)."""
    if difference is None:
        return "-"
    published = PUBLISHED[metric]
    return f"{published[first]:.2f} - {published[second]:.2f} = {difference:+.2f}"


def _mde(power: Mapping) -> str:
    per_seed = [d["rule_mde"] for d in power["seeds"].values() if d["rule_mde"] is not None]
    seeds = f" ({min(per_seed):.2f}-{max(per_seed):.2f})" if per_seed else ""
    if power["mde"] is None:
        if not power["testable"]:
            return "none: too few questions"
        if not power["se"]:
            return "none: no spread"
        return f"none: {power['effective_questions']:.2f} effective questions, too few for its approximation"
    return f"{power['mde']:.2f}{seeds}"


def power_notes(result: dict) -> list[str]:
    """A sentence per inconclusive verdict: could this experiment have detected the published difference?"""
    lines = []
    for backbone, bb in result["backbones"].items():
        for budget, cut in bb["budgets"].items():
            for metric in VERDICT_METRICS:
                claim = cut["claim"][metric]
                if claim["verdict"] == "inconclusive":
                    lines.append(
                        f"- {backbone}, {budget}, {NAMES[metric]}: inconclusive; {_detection(claim['power'])}"
                        + _observed(claim["power"])
                    )
    return lines + [""] if lines else []


def _detection(power: Mapping) -> str:
    """Whether the published difference was detectable (`compare.power`), and if not, why, in one sentence."""
    kept = {str(seed) for seed in power["pooled_seeds"]}  # seed keys are strings once read back from JSON
    seeds = {str(seed): d for seed, d in power["seeds"].items()}
    left_out = [seed for seed in seeds if seed not in kept]
    mde, published = power["mde"], power["published"]
    size = f"{power['questions']} questions x {len(kept)} seed{'' if len(kept) == 1 else 's'}" + (
        f" (seed {', '.join(left_out)} left out: its differences had no spread, the arms answering every question "
        "alike or apart by the same amount)"
        if left_out
        else " (one seed: how training varies over seeds is not in it)"
        if len(kept) == 1
        else ""
    )
    if not power["testable"]:
        return (
            f"at {power['questions']} questions the verdict rule's sign-flip test cannot reject no difference at "
            f"alpha = {power['alpha']:.2f} whatever the difference (its smallest p-value is 2 / 2^questions): no "
            "difference was detectable." + _planning(power)
        )
    if mde is None and power["se"]:
        z2 = statistics.NormalDist().inv_cdf(1 - power["alpha"] / 2) ** 2
        return (
            f"the benchmarks' unequal sizes leave {power['effective_questions']:.2f} effective questions (K^2 / sum "
            f"1/n_k), at most z^2 = {z2:.2f}, where the normal approximation that sizes the sign-flip test has no "
            f"threshold, so no minimum detectable difference is computed (the exact test over the "
            f"{power['questions']} questions can reject: its smallest p-value is 2 / 2^{power['questions']}); "
            "whether this experiment could have detected the published difference is unknown." + _planning(power)
        )
    if mde is None and power["blocked_seeds"]:
        return (
            "the arms' differences have no spread over the questions in any seed (they answered every question alike "
            "or apart by the same amount), so each seed's interval is its difference alone, and in seed(s) "
            f"{', '.join(map(str, power['blocked_seeds']))} that is 0 or against the claim: the published "
            "difference could not have come out, and no difference was detectable."
        )
    if mde is None:
        return (
            "the seed-averaged differences have no spread over the questions, so the bootstrap gives no standard "
            "error to size a test with: whether this experiment could have detected the published difference is "
            "unknown."
        )
    if published is None:
        return f"the minimum detectable difference at {size} is {mde:.2f} (no published difference for these arms)."
    worst = max((d["rule_mde"] for d in seeds.values() if d["rule_mde"] is not None), default=0.0)
    against = [str(seed) for seed in power["blocked_seeds"]]
    verb = "could" if power["detectable"] else "could not"
    opening = f"this experiment {verb} have detected the published {published:+.2f}: "
    if mde > abs(published) or power["detectable"]:
        alone = len(seeds) > 1 and worst
        rule = f"; each seed alone, as the verdict rule asks, needs {_seed_alone(power, worst)}" if alone else ""
        return opening + f"its minimum detectable difference at {size} is {mde:.2f}{rule}." + _planning(power)
    if against:
        return opening + (
            f"seed {', '.join(against)} has no spread and a difference of "
            f"{seeds[against[0]]['difference']:+.2f}, so the verdict rule (every seed's interval above 0) cannot "
            "support the claim."
        )
    return opening + (
        f"the seed-averaged difference's minimum detectable difference at {size} is {mde:.2f}, but the verdict rule "
        f"asks every seed's interval to exclude 0, and a seed alone needs {_seed_alone(power, worst)}."
        + _planning(power)
    )


def _observed(power: Mapping) -> str:
    """A sentence when some seed's sign-flip test could not reject on its observed scores (`compare.power`'s
    per-seed `testable`: a question both arms tie on flips to itself), though the design's could; else ""."""
    seeds = {str(seed): d for seed, d in power["seeds"].items()}
    untestable = [(s, d) for s, d in seeds.items() if not d.get("testable", True)]  # older files: not recorded
    if not power["testable"] or not untestable:
        return ""
    counts = " and ".join(
        f"seed {s} ({d['differing']} of {power['questions']} questions differ)" for s, d in untestable
    )
    return (
        " On these scores only an inconclusive verdict could come out: the verdict rule asks every seed's "
        f"sign-flip test to reject no difference at alpha = {power['alpha']:.2f}, and the test of {counts} cannot, "
        "whatever the difference (a question both arms tie on flips to itself, so its smallest p-value is 2 / "
        "2^(questions that differ))."
    )


def _seed_alone(power: Mapping, rule_mde: float) -> str:
    """A seed's rule MDE and what it holds: the seeds' spread of their own differences, or, with one seed kept,
    the trained model fixed (no spread over seeds to measure)."""
    if power["sd_seeds"] is None:
        return f"{rule_mde:.2f} (its trained model held fixed: one seed measures no spread over seeds)"
    return f"{rule_mde:.2f} (its own difference varying with training by the seeds' SD of {power['sd_seeds']:.2f})"


def _planning(power: Mapping) -> str:
    """What would have detected the published difference that this experiment could not: how many test questions,
    or that no number would: for the seed-averaged difference while the seeds' SE is too large (more seeds
    would), for the verdict rule while each seed's own difference spreads too much over training (more seeds would
    not: each must pass) (`compare.power`)."""
    if power["detectable"] or power["needed_se"] is None:
        return ""
    seeds = len(power["pooled_seeds"])
    if power["questions_needed"] is None:
        pooled = power["se_seeds"] is not None and power["se_seeds"] >= power["needed_se"]
        rule = power["needed_sd"] is not None and power["sd_seeds"] >= power["needed_sd"]
        text = (
            f" At {seeds} seeds more test questions alone would not, while the seeds' differences spread as here: "
            f"their spread leaves a standard error of {power['se_seeds']:.2f} (part of it question noise, which "
            f"more questions would shrink), and the published difference needs {power['needed_se']:.2f} at most."
            if pooled
            else ""
        )
        if rule:
            text += (
                " For the verdict rule more test questions would not help at any number of seeds: it asks every "
                "seed's interval to exclude 0, and each seed's own difference varies with training by the seeds' SD "
                f"of {power['sd_seeds']:.2f} (part of it question noise), while a seed at power "
                f"{power['rule_power']:.3f} clears the published difference only with an SD of "
                f"{power['needed_sd']:.2f} at most; more seeds would not help, as each must pass."
            )
        return text
    return (
        f" About {power['questions_needed']:,} test questions in the same mix (here {power['questions']}) would, "
        f"at {'this one seed' if seeds == 1 else f'these {seeds} seeds'}."
    )


def movement_notes(result: dict) -> list[str]:
    """A sentence per arm and budget that did not move at all in some seed, per arm and budget whose trained
    sub-agents changed no greedy output in some seed, per trained role whose KL to the start passed
    `train.health.max_kl` (the policy the last update made, which the training guard never measures), and per role
    a seed never called on the test questions (a central agent that stopped delegating: its table cell is "-")."""
    lines = []
    for backbone, bb in result["backbones"].items():
        for budget, cut in bb["budgets"].items():
            for arm, moved in cut["movement"].items():
                lines += [
                    f"- **{backbone}, {budget}, {arm}: seed {past['seed']}'s {past['role']} agent ended "
                    f"{past['kl']:.3g} nats per token from the start on the test calls (exact KL), past "
                    "train.health.max_kl**: the training guard estimates the KL (k3) on training samples of the "
                    "policy each measured step starts from, and never measures the one the last update made."
                    for past in moved["past_max_kl"]
                ]
                lines += [
                    f"- {backbone}, {budget}, {arm}: in seed {seed} the {role} agent was never called on the test "
                    "questions: that seed's harness ran without it, and its movement is not measured."
                    for seed, roles in sorted(moved["seeds"].items(), key=lambda item: int(item[0]))
                    for role, row in sorted(roles.items())
                    if row["calls"] == 0
                ]
                if moved["still_seeds"]:
                    lines.append(
                        f"- {backbone}, {budget}, {arm}: in seed(s) {', '.join(map(str, moved['still_seeds']))} no "
                        f"trained role ({', '.join(moved['trained'])}) changed a greedy output: there the arm is its "
                        "untrained start."
                    )
                still, seeds = moved["unmoved_seeds"], moved["seeds"]
                if not still:
                    continue
                subs = ", ".join(moved["sub_agents"])
                if len(still) == len(seeds):
                    calls = ", ".join(
                        f"{role} {sum(seeds[s][role]['calls'] for s in seeds)}" for role in moved["sub_agents"]
                    )
                    lines.append(
                        f"- **{backbone}, {budget}, {arm}: the sub-agents did not move; this compares central against "
                        f"central.** {arm} trains {subs}, but none of their greedy outputs on the test questions "
                        f"differs from the start's, in any seed (calls: {calls}); its verdict is no evidence about "
                        "training the sub-agents."
                    )
                elif central_moved := [s for s in still if s not in moved["still_seeds"]]:
                    lines.append(
                        f"- {backbone}, {budget}, {arm}: in seed(s) {', '.join(map(str, central_moved))} the "
                        f"sub-agents ({subs}) did not move; those seeds compare central against central."
                    )
    return lines + [""] if lines else []


def spending_section(result: dict) -> list[str]:
    lines = [
        "## What each arm spent",
        "",
        "Training cut at the first step whose spending reached the budget "
        "(FLOPs: the estimate of `centralrl.compute`, rollout generation plus update). Trained steps: the steps up "
        "to the cut that updated the policy (what a `steps` budget counts); a step whose groups all had equal rewards "
        "gives GRPO nothing to learn and is skipped, so a cut at step 9 may hold 8 updates.",
        "",
        "| backbone | budget | arm | seed | cut at step | trained steps | budget reached | trained tokens "
        "| training FLOPs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for backbone, bb in result["backbones"].items():
        for budget, cut in bb["budgets"].items():
            for arm, row in cut["arms"].items():
                for seed, cell in row["seeds"].items():
                    spent = cell["spent"]
                    lines.append(
                        f"| {backbone} | {budget} | {arm} | {seed} | {cell['step']} | {spent['steps']:.0f} "
                        f"| {'yes' if cell['reached'] else 'no'} "
                        f"| {spent['trained_tokens']:,.0f} | {spent['flops']:.3g} |"
                    )
    return lines + [""]


def gains_section(result: dict) -> list[str]:
    lines = [
        "## Did training help? Each arm minus its untrained start",
        "",
        "Paired over the test questions: the trained harness minus the same harness from the starting checkpoint "
        f"(macro F1 difference [{result['level']:.0%} CI], permutation p). **above** when the whole CI is above 0 "
        f"and p is at most {1 - result['level']:.2f}, the verdict's rule for one seed; *CI only* when the CI is "
        "above 0 but the test does not tell the difference from chance (a percentile interval over a few "
        "questions that differ is too narrow).",
        "",
        "| backbone | budget | arm | start | seed | F1 difference [CI], p | above the start? |",
        "|---|---|---|---|---|---|---|",
    ]
    for backbone, bb in result["backbones"].items():
        for budget, cut in bb["budgets"].items():
            for arm, gain in cut.get("gains", {}).items():
                for seed, d in gain["seeds"].items():
                    lines.append(
                        f"| {backbone} | {budget} | {arm} | {gain['start']} | {seed} | {_ci(d['f1']['macro'])}, "
                        f"p={d['f1']['p_value']:.3f} | {_above_word(d)} |"
                    )
    return lines + [""]


def _above_word(gain: dict) -> str:
    return "**above**" if gain["above"] else "*CI only*" if gain["ci_above"] else "no"


def reward_rise(rows: list[Mapping[str, float]]) -> tuple[float, float]:
    """Mean training reward over the first and over the last quarter of a run's steps (at least one step each).

    >>> reward_rise([{"reward_mean": r} for r in (0.1, 0.3, 0.0, 0.2, 0.4, 0.6, 0.5, 0.7)])
    (0.2, 0.6)
    """
    rewards, quarter = _rewards_and_quarter(rows)
    return sum(rewards[:quarter]) / quarter, sum(rewards[-quarter:]) / quarter


def _rewards_and_quarter(rows: list[Mapping[str, float]]) -> tuple[list[float], int]:
    """The run's step rewards, and the steps in a quarter of them (at least one)."""
    rewards = [row["reward_mean"] for row in rows]
    return rewards, max(1, len(rewards) // 4)


def rise_noise(rows: list[Mapping[str, float]]) -> float | None:
    """The standard error the reward rise would have if the policy never changed: s * sqrt(2 / quarter), s the
    spread (sample SD) of the run's step rewards, each step an independent draw of questions and samples. A real
    trend widens s, so this errs towards calling a rise noise. None below 2 steps, or when every step's reward is
    the same (no spread to measure the noise by: the smoke run's steps had no informative group).

    >>> round(rise_noise([{"reward_mean": r} for r in (0.1, 0.3, 0.0, 0.2, 0.4, 0.6, 0.5, 0.7)]), 4)
    0.2449
    >>> rise_noise([{"reward_mean": 0.5}] * 4) is None
    True
    """
    rewards, quarter = _rewards_and_quarter(rows)
    spread = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return spread * math.sqrt(2 / quarter) if spread > 0 else None


def steps_to_detect(rows: list[Mapping[str, float]], rise: float, level: float, power: float) -> int | None:
    """Steps a run would need for `rise` to be its detectable rise, at its own step-to-step spread s: quarters of
    q steps with (z_(1-alpha/2) + z_power) x s x sqrt(2 / q) <= rise. None where `rise_noise` is (a spread of 0
    said 4 steps would do, beside a noise that could not be measured).

    >>> steps_to_detect([{"reward_mean": r} for r in (0.1, 0.3, 0.0, 0.2, 0.4, 0.6, 0.5, 0.7)], 0.1, 0.95, 0.8)
    380
    """
    if rise_noise(rows) is None:
        return None
    rewards, _ = _rewards_and_quarter(rows)
    spread = minimum_detectable_difference(statistics.stdev(rewards), level=level, power=power)
    return 4 * max(1, math.ceil(2 * (spread / rise) ** 2))


REPLAYED = " (replayed)"  # a run's steps whose last quarter replayed its first


def rise_section(
    histories: Mapping, level: float, power: float, rise: float, revisit: int = 0, replayed: Mapping | None = None
) -> list[str]:
    """Per run: its reward in the first and last quarter of steps, the rise's noise, the rise it could detect and
    the steps it would need to detect `rise`, the steps with no informative group (every group's rewards equal:
    nothing to learn from), and dev F1 at the start and at its last score. A run whose last quarter replayed its
    first (`train.grpo.revisit` a quarter of its steps) has no draw noise: the same questions, the same random
    numbers; its noise, detectable rise and p are those of the rise paired by question (`replayed`:
    `compare.replayed_rises`, [backbone][arm][seed])."""
    lines = [
        "## Did the training reward rise?",
        "",
        "Mean reward of the sampled training episodes (0-1) over the first and the last quarter of each run's steps. "
        "A step's reward depends on which questions it drew: *noise* is the standard error the rise would have if "
        "the policy never changed (the spread of the run's step rewards times sqrt(2 / steps per quarter)), and "
        f"*detectable* the rise this run finds with {power:.0%} power at a two-sided {1 - level:.0%} level "
        f"(a rise below it may be learning or the draw); *steps for +{rise:.2f}*: how many steps, in quarters as "
        f"here, the run would need at the same spread for a rise of {rise:.2f} to be detectable (`compare.rise`). "
        "Steps with no informative group had equal rewards in every "
        "group: GRPO learns nothing from them. Dev F1: the held-out training questions, greedy, at the start and "
        "at the last dev score.",
        *(
            [
                "",
                f"Runs marked *replayed* drew their first quarter's questions and random numbers again in their last "
                f"quarter (`train.grpo.revisit` {revisit}): their rise is the policy's change on those questions (a "
                "policy that did not change scores the same), so no draw noise applies to it. It is paired by "
                "question: *noise* is the standard error of the replayed questions' rises (a policy that changed "
                "samples other episodes, whose rewards differ by chance too), *detectable* the rise it finds with "
                f"{power:.0%} power, and *p* the sign-flip test of no rise over those questions (n). They were "
                "trained on once, so what was learned of those very questions counts too.",
            ]
            if revisit
            else []
        ),
        "",
        "| backbone | arm | seed | steps | reward, first quarter | reward, last quarter | rise | noise | detectable "
        f"{'| p (n) ' if revisit else ''}| steps for +{rise:.2f} | steps with no informative group "
        "| dev F1 start -> end |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if revisit else ""),
    ]
    replayed = replayed or {}
    for backbone, runs in histories.items():
        for arm, seeds in runs.items():
            for seed, rows in seeds.items():
                first, last = reward_rise(rows)
                paired = replayed.get(backbone, {}).get(arm, {}).get(seed)
                was_replayed = bool(revisit) and revisit == _rewards_and_quarter(rows)[1]
                noise = (paired or {}).get("se") if was_replayed else rise_noise(rows)
                detectable = None if noise is None else minimum_detectable_difference(noise, level=level, power=power)
                needed = None if was_replayed else steps_to_detect(rows, rise, level, power)
                p_text = f"| {paired['p']:.3f} ({paired['questions']}) " if paired else "| - " if revisit else ""
                needed_text = "-" if needed is None else f"{needed:,}"
                idle = sum(1 for row in rows if not row.get("informative_groups"))
                dev = dev_points(rows)
                dev_text = f"{dev[0][2]:.2f} -> {dev[-1][2]:.2f}" if dev else "-"
                steps = f"{len(rows)}{REPLAYED if was_replayed else ''}"
                lines.append(
                    f"| {backbone} | {arm} | {seed} | {steps} | {first:.3f} | {last:.3f} | {last - first:+.3f} "
                    f"| {_number(noise)} | {_number(detectable)} {p_text}| {needed_text} | {idle} | {dev_text} |"
                )
    return lines + [""]


def pooled_rise_section(pooled: Mapping | None, level: float, power: float) -> list[str]:
    """Per arm, the replayed rise over all its seeds' replayed questions together (`compare.pooled_replayed_rises`):
    [] when no arm has two replaying runs."""
    if not pooled:
        return []
    lines = [
        f"Pooled over seeds: each arm's replayed questions of every seed together, paired as above ({level:.0%} "
        f"bootstrap CI; *detectable* with {power:.0%} power). It asks whether these runs together raised the reward "
        "of what they replayed, at less noise than one run; the spread between seeds is not in it.",
        "",
        "| backbone | arm | seeds | rise [CI] | noise | detectable | p (n) |",
        "|---|---|---|---|---|---|---|",
    ]
    for backbone, arms in pooled.items():
        for arm, rise in arms.items():
            lines.append(
                f"| {backbone} | {arm} | {rise['seeds']} | {rise['estimate']:+.3f} [{rise['low']:+.3f}, "
                f"{rise['high']:+.3f}] | {_number(rise['se'])} | {_number(rise['detectable'])} "
                f"| {rise['p']:.3f} ({rise['questions']}) |"
            )
    return lines + [""]


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def _kl(kl: float | None) -> str:
    return "-" if kl is None else f"{kl:.3g}"


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def lost_section(result: dict) -> list[str]:
    """Per backbone, the references' and every trained cell's wrong test answers by where they were last seen."""
    lines = [
        "## Where the wrong answers were lost",
        "",
        "Each wrong test episode (Acc 0) at the last point of the harness's data flow that still held a golden "
        "answer: `not_retrieved` (no passage the sub-questions retrieved), `in_passages` (retrieved, left out of "
        "the notes), `in_notes` (noted, not answered); `yes_no` and `in_question` cannot be placed (the answer is "
        "yes/no, or named in the question). Per cell, with the share of its wrong answers "
        "(`python -m centralrl.attribution` does the same for any records).",
        "",
    ]
    for backbone, lost in result["lost"].items():
        tables = {f"{backbone} {ref}": table for ref, table in lost["references"].items()}
        for budget, arms in lost["budgets"].items():
            for arm, seeds in arms.items():
                tables |= {f"{backbone} {budget} {arm} seed {seed}": table for seed, table in seeds.items()}
        lines += [markdown(tables), ""]
    return lines


def movement_section(result: dict) -> list[str]:
    """Per backbone, budget, arm and role: calls (summed over seeds), the share changed from the start and the mean
    KL to it, per seed and averaged over seeds unweighted (a frozen role is the start: marked, not measured)."""
    lines = [
        "## How far each role moved from the start",
        "",
        "On the test questions, per role: the share of the trained arm's greedy calls whose output differs from "
        "what the starting checkpoint generates greedily from the same prompt, and the mean per-token "
        "KL(policy || start) over those calls' tokens. A frozen role runs the start itself. Calls are summed over "
        "the seeds; the means are of the seeds' figures, each seed counting once whatever its calls.",
        "",
        "| backbone | budget | arm | role | calls, summed over seeds | changed, per seed | KL, per seed "
        "| changed, mean over seeds (unweighted) | KL, mean over seeds (unweighted) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for backbone, bb in result["backbones"].items():
        for budget, cut in bb["budgets"].items():
            for arm, moved in cut["movement"].items():
                seeds = moved["seeds"]
                for role in next(iter(seeds.values())):
                    rows = [seeds[s][role] for s in seeds]
                    calls = sum(r["calls"] for r in rows)
                    if rows[0]["adapter"] is None:
                        lines.append(f"| {backbone} | {budget} | {arm} | {role} | {calls} | frozen | frozen | | |")
                        continue
                    shares, kls = [r["changed_share"] for r in rows], [r["kl"] for r in rows]
                    lines.append(
                        f"| {backbone} | {budget} | {arm} | {role} | {calls} "
                        f"| {'; '.join(f's{s}: {_percent(v)}' for s, v in zip(seeds, shares))} "
                        f"| {'; '.join(f's{s}: {_kl(v)}' for s, v in zip(seeds, kls))} "
                        f"| {_percent(_mean(shares))} | {_kl(_mean(kls))} |"
                    )
    return lines + [""]


def closed_book(data_counts: Mapping) -> list[str]:
    """Evaluation benchmarks none of whose questions has a supporting passage (prepare_data's counts): their
    scores measure what the model knows, not what the harness finds.

    >>> closed_book({"test": {"nq": {"questions": 2, "with_supporting_passages": 0},
    ...                       "hotpotqa": {"questions": 2, "with_supporting_passages": 2}}})
    ['nq']
    """
    tests = data_counts.get("test", {})
    return sorted(b for b, c in tests.items() if c["questions"] and not c["with_supporting_passages"])


def _bench_label(result: dict, bench: str) -> str:
    if bench == "macro":
        return "**macro-average**"
    closed = bench in result.get("closed_book", ())
    return f"{markdown_text(bench)} (closed-book)" if closed else markdown_text(bench)


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
        lines.append(f"| {_bench_label(result, bench)} | {n} | " + " | ".join(cells) + " |")
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
        health = plot_health(histories[backbone], folder / f"health_{backbone}.png")
        dev = plot_dev_curves(histories[backbone], folder / f"dev_{backbone}.png")
        lines += [
            f"![reward and F1 over steps, {backbone}]({curves.name})",
            "",
            *([f"![dev F1 against step and training FLOPs, {backbone}]({dev.name})", ""] if dev else []),
            *([f"![training health monitors, {backbone}]({health.name})", ""] if health else []),
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
                    result["level"],
                )
                lines += [f"![differences per benchmark, {metric}, {budget}]({path.name})", ""]
    return lines


def write_report(result: dict, histories: Mapping, profile: str, folder: Path) -> Path:
    """report.md, report.html and the figures in `folder` (replaced whole by the caller); return report.md."""
    lines = [f"# {' vs '.join(result['claim'])}: report (profile `{profile}`)", ""]
    lines += verdict_section(result) + gains_section(result)
    lines += rise_section(
        histories,
        result["level"],
        result["power"],
        result["rise"],
        result.get("revisit", 0),
        result.get("replayed_rises"),
    )
    lines += pooled_rise_section(result.get("pooled_replayed_rises"), result["level"], result["power"])
    lines += spending_section(result)
    lines += movement_section(result) + lost_section(result)
    lines += [f"## Per benchmark (mean [{result['level']:.0%} CI], in %)", ""]
    if result.get("closed_book"):
        closed = ", ".join(map(markdown_text, result["closed_book"]))
        lines += [
            f"Closed-book rows ({closed}): no question of theirs has a supporting passage "
            "in the corpus, so they measure what the model knows, not what the harness finds.",
            "",
        ]
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
