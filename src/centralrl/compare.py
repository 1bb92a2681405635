"""Settle the claim: statistics over every cell of the matrix (arm x seed x budget x backbone), a verdict per
metric and budget, and the numbers the report shows.

Scores are on a 0-100 scale. Per cell and benchmark: the mean with a seeded bootstrap CI; the headline is the
macro-average over benchmarks (as the published tables average), with a stratified bootstrap CI. Between the
claim's two arms, per seed: the paired difference over the same questions (paired bootstrap CI, sign-flip
permutation p-value) and the spread of the per-seed differences. The verdict rule is `stats.VERDICT_RULE`,
applied at every budget (equal steps, equal trained tokens, ...), beside the published numbers, with the
minimum detectable difference (MDE) of the seed-averaged paired difference at `compare.power` and alpha =
1 - `compare.level` (`stats.detectable_difference`; its SE adds the seeds' spread to the questions'
bootstrap), per seed at the power the verdict rule needs (every seed's own interval must exclude 0, and each
seed's own difference varies with training), and whether the published difference is at least both (`power`).

Per arm and budget, how far each role moved from the start (the evaluate stage's movement files) and the seeds
in which the arm's trained sub-agents changed no greedy output at all: there the arm's sub-agents are still the
start's, so comparing it with central_only compares the central agent against itself.

Departure from the published comparison: it reported one run per arm at equal steps; here every budget cut is
a separate comparison, and each states what each arm spent when it was cut.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from statistics import NormalDist

import numpy as np

from centralrl.attribution import ShownPassages, attribution_table, check_record
from centralrl.config import TOPOLOGY_ROLES, ArmConfig, CompareConfig, Config
from centralrl.errors import DataError
from centralrl.metrics import METRICS as SCORERS
from centralrl.rl.rewards import QUESTION_REWARDS
from centralrl.stats import (
    VERDICT_RULE,
    Interval,
    detectable_difference,
    differing_questions,
    macro_bootstrap_ci,
    macro_mean,
    minimum_detectable_difference,
    paired_difference_ci,
    paired_difference_se,
    paired_permutation_pvalue,
    questions_to_detect,
    seed_spread,
    sign_flip_rejects,
    sign_flip_terms,
    verdict,
)

METRICS = ("f1", "acc", "em")
VERDICT_METRICS = ("f1", "acc")
# Qwen2.5-3B, seven benchmarks, average over benchmarks (the claim's source; one seed, equal steps).
PUBLISHED = {"f1": {"central_only": 47.79, "joint": 45.36}, "acc": {"central_only": 42.88, "joint": 40.49}}


def checked_record(row: dict, where: str) -> dict:
    """An evaluation record holding what the statistics read: a string id and benchmark, and each metric a
    score from 0 to 1 that its prediction earns against its golden answers (`metrics.METRICS`); and what the
    lost-answers table reads (`attribution.check_record`); anything else is a DataError naming the file, line and
    field."""
    for key in ("id", "benchmark"):
        if not isinstance(row.get(key), str):
            raise DataError(f"{where}: field {key!r} must be a string, got {row.get(key)!r}")
    for metric in METRICS:
        value = row.get(metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise DataError(f"{where}: field {metric!r} must be a score from 0 to 1, got {value!r}")
    check_record(row, where)
    for metric in METRICS:  # a score edited by hand, or by other scoring code, decided the verdict
        scored = SCORERS[metric](row["prediction"], row["golden_answers"])
        if abs(row[metric] - scored) > 1e-9:
            raise DataError(
                f"{where}: field {metric!r} is {row[metric]!r}, but its prediction {row['prediction']!r} scores "
                f"{scored!r} against its golden answers: rerun the evaluation"
            )
    return row


def record_checker() -> Callable[[dict, str], dict]:
    """`checked_record` for the rows of one file, in order, that also refuses a question (id, benchmark) answered
    twice, naming it and both lines (a pair needs each question once).

    >>> check = record_checker()
    >>> row = {"id": "q1", "benchmark": "nq", "em": 0, "f1": 0, "acc": 0, "question": "Who?", "prediction": "Bo"}
    >>> row |= {"golden_answers": ["Ann"], "notes": [], "retrieved": []}
    >>> check(row, "r.jsonl:1") == row
    True
    >>> check(row, "r.jsonl:3")
    Traceback (most recent call last):
    centralrl.errors.DataError: r.jsonl:3: (id, benchmark) ('q1', 'nq') is already answered at r.jsonl:1
    """
    first: dict[tuple[str, str], str] = {}

    def check(row: dict, where: str) -> dict:
        key = (checked_record(row, where)["id"], row["benchmark"])
        seen = first.setdefault(key, where)
        if seen != where:
            raise DataError(f"{where}: (id, benchmark) {key} is already answered at {seen}")
        return row

    return check


def score_groups(records: Sequence[dict], metric: str) -> dict[str, list[float]]:
    """{benchmark: [score x 100 per question, ordered by question id]} (the order pairs arms question by question)."""
    groups: dict[str, list[tuple[str, float]]] = {}
    for record in records:
        groups.setdefault(record["benchmark"], []).append((record["id"], 100.0 * record[metric]))
    return {bench: [score for _, score in sorted(rows)] for bench, rows in sorted(groups.items())}


def check_same_questions(records: Mapping[str, Sequence[dict]]) -> None:
    """Every evaluated cell (named by its records file, or its cell) must answer exactly the same questions, each
    once, under the same benchmark, with the same text and golden answers, or nothing can be paired (nor
    macro-averaged over the same benchmarks)."""
    asked = {
        name: sorted((r["id"], r["benchmark"], r["question"], tuple(r["golden_answers"])) for r in rows)
        for name, rows in records.items()
    }
    for name, got in asked.items():
        twice = ", ".join(q[0] for q, n in sorted(Counter(got).items()) if n > 1)
        if twice:
            raise DataError(f"{name}: answered {twice} more than once; rerun its evaluation")
    first, expected = next(iter(asked.items()))
    for name, got in asked.items():
        if got != expected:
            odd = ", ".join(sorted({q[0] for q in set(got) ^ set(expected)})[:4])
            raise DataError(
                f"{name}: answered other questions than {first} ({len(got)} vs {len(expected)}; ids, benchmarks, "
                f"texts or golden answers differ for {odd}); rerun its evaluation"
            )


def cell_scores(records: Sequence[dict], cfg: Config) -> dict:
    """Per metric: macro-average and per-benchmark means, each with its bootstrap CI."""
    c = cfg.compare
    out = {}
    for metric in METRICS:
        groups = score_groups(records, metric)
        out[metric] = {
            "macro": macro_bootstrap_ci(groups, seed=c.seed, resamples=c.resamples, level=c.level).as_dict(),
            "benchmarks": {
                b: macro_bootstrap_ci({b: v}, seed=c.seed, resamples=c.resamples, level=c.level).as_dict()
                for b, v in groups.items()
            },
            "questions": {b: len(v) for b, v in groups.items()},
        }
    return out


def paired(a: Sequence[dict], b: Sequence[dict], cfg: Config) -> dict:
    """Per metric: the paired difference a - b (macro and per benchmark) with CIs, and the permutation p-value."""
    c = cfg.compare
    out = {}
    for metric in METRICS:
        ga, gb = score_groups(a, metric), score_groups(b, metric)
        out[metric] = {
            "macro": paired_difference_ci(ga, gb, seed=c.seed, resamples=c.resamples, level=c.level).as_dict(),
            "p_value": paired_permutation_pvalue(ga, gb, seed=c.seed, permutations=c.permutations),
            "benchmarks": {
                bench: paired_difference_ci(
                    {bench: ga[bench]}, {bench: gb[bench]}, seed=c.seed, resamples=c.resamples, level=c.level
                ).as_dict()
                for bench in ga
            },
        }
    return out


def published_difference(claim: Sequence[str], metric: str) -> float | None:
    """The published difference first arm - second arm (None unless the metric and both arms were published).

    >>> round(published_difference(["central_only", "joint"], "f1"), 2), published_difference(["a", "joint"], "f1")
    (2.43, None)
    """
    published, (first, second) = PUBLISHED.get(metric, {}), claim
    return published[first] - published[second] if first in published and second in published else None


def power(cfg: Config, a: Mapping[int, Sequence[dict]], b: Mapping[int, Sequence[dict]], metric: str) -> dict:
    """The minimum detectable difference (MDE) of the paired macro difference a - b, at `compare.power` and
    alpha = 1 - `compare.level`, and whether the published difference is detectable. a[seed], b[seed]: records.

    - `mde`: of the difference averaged over the seeds, from `se` = sqrt(`se_questions`^2 + `se_seeds`^2).
      `se_questions` is the paired bootstrap's, which resamples questions only and so holds each seed's trained
      model fixed; `se_seeds` = sqrt(var(seed differences) / S) (ddof 1) adds how much training itself varies
      over seeds, which the claim is about. Conservative: that variance also holds part of the question noise.
      With one seed it is unmeasured (None) and the MDE holds the model fixed. Every MDE here is the verdict's
      sign-flip test's (`stats.detectable_difference`, the module docstring of `stats`): its threshold grows
      with the difference itself at few `effective_questions`, and `step` (pooled and per seed) is its
      continuity correction (`stats.sign_flip_terms`). `testable` is False when the test cannot reject at any
      difference, decided on the real number of `questions` (its smallest p-value is 2 / 2^questions,
      `stats.sign_flip_rejects`): then no MDE, and nothing is detectable. Benchmarks of unequal sizes can leave
      `effective_questions` at or below z_{1-alpha/2}^2 (3.84 at alpha 0.05) while the real count is testable
      (1 + 20 questions: 3.81), where the threshold's normal approximation has none (`stats.sign_flip_approximable`):
      then no MDE is computed and `detectable` is None (unknown), though the test can reject.
      `testable` and every MDE are the design's, for a true difference under which any question may differ;
      the observed ties are already in them: a zero difference lowers the SE (sum_i v_i^2 = SE^2 + T^2 / m
      holds with the zeros in it) and `step` is over the nonzero ones. On the observed scores a question both
      arms tie on flips to itself, so a seed's test has a smallest p-value of 2 / 2^k, k its `differing`
      questions (`stats.differing_questions`): the seed's `testable` is whether that is at most alpha, and
      `testable_observed` whether every seed's is (the verdict rule asks every seed's test to reject; if one
      cannot, only "inconclusive" could come out on these scores). It leaves `detectable` as it is: few
      differing questions at a small SE say the difference is small, which a true published one would not be.
    - `seeds[s]`: each seed's `difference`, `se` and `mde` (its trained model fixed), and `rule_mde` at power
      `rule_power` = power^(1/S): the verdict rule asks all S seeds' intervals to exclude 0, which independent
      seeds with that power each do together with probability `compare.power` (seeds answering the same
      questions do so more often). A seed's test sees only its SE over the questions, but its own difference also
      varies with training by `sd_seeds`, the SD (ddof 1) of the kept seeds' differences (not divided by S):
      `rule_mde` = t + z_rule_power * sqrt(se^2 + sd_seeds^2), t the sign-flip test's threshold at the seed's
      `se`, the `effective_questions` and the seed's `step` (`stats.sign_flip_threshold`, which is z_{1-alpha/2}
      * se only at many questions; `stats.detectable_difference`).
      With one kept seed `sd_seeds` is None and `rule_mde` holds the trained model fixed.
    - `detectable`: the published difference is at least the pooled MDE and every seed's `rule_mde`, and no
      seed is decided against it without spread (below).
    - `questions_needed`: for planning, the test questions (in the same mix, at the same seeds) at which both the
      pooled MDE and every kept seed's `rule_mde` reach the published difference (`stats.questions_to_detect`:
      the question SEs shrink as 1/sqrt(questions), the seeds' terms stay). None when no number of questions
      would: when the seeds' SE alone exceeds `needed_se`, the SE at which the pooled MDE equals the published
      difference (then more seeds would), or when `sd_seeds` alone is at least `needed_sd`, |published| /
      z_rule_power (a seed's own difference then misses the published one too often, however many questions;
      more seeds would not help, as each must pass). More questions shrink only the part of the seeds' spread
      that is question noise, so both are planning figures, not bounds.

    A standard error of 0 (every question's difference the same, e.g. two arms that answer alike) sizes no test:
    its MDE is None rather than 0. Such a seed is left out of the pooled MDE (`pooled_seeds` lists the seeds
    kept): its zero differences would halve the standard error of the seed mean and the effect with it (seen in
    the realqa run: a seed in which no group's rewards differed, so neither arm trained). Its interval is its
    difference alone, so when that is 0 or of the other sign (`blocked_seeds`), the published claim cannot come
    out: not detectable."""
    c, count = cfg.compare, len(a)
    rule_power = c.power ** (1 / count)
    groups = {seed: (score_groups(a[seed], metric), score_groups(b[seed], metric)) for seed in a}

    def pairs(seeds: Sequence[int]) -> tuple[list[dict], list[dict]]:
        return [groups[seed][0] for seed in seeds], [groups[seed][1] for seed in seeds]

    def question_se(seeds: Sequence[int]) -> float:
        return paired_difference_se(*pairs(seeds), seed=c.seed, resamples=c.resamples)

    questions = len(next(iter(a.values())))
    effective = sign_flip_terms(*pairs(list(a)))[0]  # the same for every seed: the same benchmarks and sizes
    testable = sign_flip_rejects(questions, level=c.level)  # the design's: any of the questions may differ

    def mde(se: float, step: float, **seeds: float) -> float | None:
        terms = {"questions": effective, "count": questions, "step": step, "level": c.level, "power": c.power}
        return detectable_difference(se, **terms | seeds) if se or seeds.get("se_seeds") else None

    seeds = {}
    for seed, (x, y) in groups.items():
        se, step = question_se([seed]), sign_flip_terms([x], [y])[1]
        seeds[seed] = {"difference": macro_mean(x) - macro_mean(y), "se": se, "step": step, "mde": mde(se, step)}
        seeds[seed]["differing"] = differing_questions(x, y)  # a tie flips to itself: the test's p >= 2 / 2^this
        seeds[seed]["testable"] = sign_flip_rejects(seeds[seed]["differing"], level=c.level)
    kept = [seed for seed in a if seeds[seed]["se"]]
    se_questions, step = (question_se(kept), sign_flip_terms(*pairs(kept))[1]) if kept else (0.0, 0.0)
    differences = [seeds[seed]["difference"] for seed in kept]
    sd_seeds = float(np.std(differences, ddof=1)) if len(kept) > 1 else None
    se_seeds = float(sd_seeds / np.sqrt(len(kept))) if sd_seeds is not None else None
    for d in seeds.values():
        d["rule_mde"] = mde(d["se"], d["step"], spread=sd_seeds or 0.0, power=rule_power)
    se = float(np.hypot(se_questions, se_seeds or 0.0))
    published = published_difference(cfg.claim, metric)
    blocked = [
        s for s, d in seeds.items() if published is not None and not d["se"] and not d["difference"] * published > 0
    ]
    pooled = {"se_questions": se_questions, "se_seeds": se_seeds, "step": step}
    pooled_mde = mde(se_questions, step, se_seeds=se_seeds or 0.0)
    return {
        "power": c.power,
        "alpha": 1 - c.level,
        "questions": questions,
        "effective_questions": effective,
        "testable": testable,
        "testable_observed": all(d["testable"] for d in seeds.values()),
        "se": se,
        "se_questions": se_questions,
        "se_seeds": se_seeds,
        "sd_seeds": sd_seeds,
        "step": step,
        "mde": pooled_mde,
        "rule_power": rule_power,
        "seeds": seeds,
        "pooled_seeds": kept,
        "blocked_seeds": blocked,
        "published": published,
        "detectable": _detectable(published, pooled_mde, seeds, blocked, testable),
        **_questions_needed(
            c, published, (questions, effective), pooled, [seeds[s] for s in kept], sd_seeds, rule_power
        ),
    }


def _questions_needed(
    c: CompareConfig,
    published: float | None,
    questions: tuple[int, float],
    pooled: Mapping[str, float | None],
    kept: Sequence[Mapping[str, float]],
    sd_seeds: float | None,
    rule_power: float,
) -> dict:
    """`needed_se`, `needed_sd` and `questions_needed` of `power` (all None without a published difference or a
    spread). `questions`: the test questions and the effective ones (`stats.sign_flip_terms`); `pooled`: the
    pooled `se_questions`, `se_seeds` and `step`; `kept`: each kept seed's `se` over questions and `step`;
    `sd_seeds`: the kept seeds' differences' SD (None for one seed: its model held fixed)."""
    if published is None or not pooled["se_questions"]:
        return {"needed_se": None, "needed_sd": None, "questions_needed": None}
    count, effective = questions
    at = {"effective": effective, "level": c.level}
    pooled_count = questions_to_detect(
        published, pooled["se_questions"], count, se_seeds=pooled["se_seeds"], step=pooled["step"], power=c.power, **at
    )
    each = [
        questions_to_detect(published, d["se"], count, spread=sd_seeds, step=d["step"], power=rule_power, **at)
        for d in kept
    ]
    z_rule = NormalDist().inv_cdf(rule_power)
    return {
        "needed_se": abs(published) / minimum_detectable_difference(1.0, level=c.level, power=c.power),
        "needed_sd": abs(published) / z_rule if sd_seeds is not None and z_rule > 0 else None,
        "questions_needed": None if pooled_count is None or None in each else max(pooled_count, *each),
    }


def _detectable(
    published: float | None,
    pooled_mde: float | None,
    seeds: Mapping[int, dict],
    blocked: Sequence[int],
    testable: bool,
) -> bool | None:
    if published is None:
        return None
    if not testable:
        return False  # too few questions for the sign-flip test to reject whatever the difference
    if blocked:
        return False  # a seed's interval is its difference alone, and it is 0 or against the claim
    if pooled_mde is None:
        return None
    rule_mdes = [d["rule_mde"] for d in seeds.values() if d["rule_mde"] is not None]
    return max([pooled_mde, *rule_mdes]) <= abs(published)


def sub_agent_roles(spec: ArmConfig) -> list[str]:
    """The arm's trainable roles that its topology's first role (the central agent) delegates to.

    >>> sub_agent_roles(ArmConfig(trainable_roles=["central", "conclusion"])), sub_agent_roles(
    ...     ArmConfig(topology="single_agent", trainable_roles=["agent"]))
    (['conclusion'], [])
    """
    _, *delegates = TOPOLOGY_ROLES[spec.topology]
    return [role for role in delegates if role in spec.trainable_roles]


def arm_movement(spec: ArmConfig, movement: Mapping[int, dict], max_kl: float) -> dict:
    """One arm at one budget: each seed's movement per role (the evaluate stage's), the arm's trained sub-agents,
    the seeds in which none of them changed a single greedy output (`unmoved_seeds`), those in which no trained
    role did (`still_seeds`: there the arm is its untrained start, e.g. no step had a group whose rewards differ),
    and the trained roles whose KL to the start on the test calls passed `max_kl` (`past_max_kl`: seed, role, kl).
    The training guard (`rl.health`) estimates the KL (k3) on training samples of the policy each measured step
    starts from, never of the one the last update made; this exact KL on the test calls is where that policy is
    seen (another estimate on other inputs, so a figure near `max_kl` may fall on either side of the guard's)."""
    subs, trained = sub_agent_roles(spec), spec.trainable_roles
    return {
        "seeds": dict(movement),
        "trained": list(trained),
        "sub_agents": subs,
        "unmoved_seeds": _seeds_unchanged(movement, subs),
        "still_seeds": _seeds_unchanged(movement, trained),
        "past_max_kl": [
            {"seed": seed, "role": role, "kl": moved[role]["kl"]}
            for seed, moved in movement.items()
            for role in trained
            if (moved[role]["kl"] or 0.0) > max_kl
        ],
    }


def _seeds_unchanged(movement: Mapping[int, dict], roles: Sequence[str]) -> list[int]:
    """The seeds in which none of `roles` (if any) changed a single greedy output."""
    return [s for s, moved in movement.items() if roles and not any(moved[r]["changed"] for r in roles)]


def untrained_start(cfg: Config, arm: str) -> str:
    """The reference that is this arm before training: the first one of the same topology (`base`; the config
    refuses arms without one)."""
    topology = cfg.arm(arm).topology
    return next(ref for ref, spec in cfg.references.items() if spec.topology == topology)


def gains_over_start(
    cfg: Config, records: Mapping[str, Mapping[int, Sequence[dict]]], references: Mapping[str, Sequence[dict]]
) -> dict:
    """Did training help? Per arm and seed, the paired difference trained minus its untrained start (the same
    harness from the starting checkpoint), with its CI and p-value. `ci_above` when the macro F1 CI is above 0;
    `above` when, besides, the permutation p is at most alpha: the verdict's rule for one seed, since a percentile
    interval over a few differing questions is too narrow (4 of 24 questions better, none worse: CI [4.2, 33.3], p
    0.125)."""
    alpha = 1 - cfg.compare.level
    out = {}
    for arm in cfg.arms:
        start = untrained_start(cfg, arm)
        seeds = {seed: paired(records[arm][seed], references[start], cfg) for seed in cfg.seeds}
        out[arm] = {"start": start, "seeds": {seed: d | _above(d["f1"], alpha) for seed, d in seeds.items()}}
    return out


def _above(f1: dict, alpha: float) -> dict[str, bool]:
    ci_above = f1["macro"]["low"] > 0
    return {"ci_above": ci_above, "above": ci_above and f1["p_value"] <= alpha}


def budget_comparison(
    cfg: Config,
    records: Mapping[str, Mapping[int, Sequence[dict]]],
    cuts: Mapping[str, Mapping[int, dict]],
    movement: Mapping[str, Mapping[int, dict]],
    references: Mapping[str, Sequence[dict]],
) -> dict:
    """One budget on one backbone: every arm's scores, spending and role movement per seed, its gain over its
    untrained start, the claim's paired differences, their spread over seeds, the MDE and the verdict per metric.
    records[arm][seed], cuts[arm][seed] (budgets.json), movement[arm][seed] (the evaluate stage's, this budget's
    entry), references[name] (the untrained harnesses' records)."""
    first, second = cfg.claim
    arms = {
        arm: {
            "seeds": {seed: {**cuts[arm][seed], "scores": cell_scores(records[arm][seed], cfg)} for seed in cfg.seeds}
        }
        for arm in cfg.arms
    }
    for arm, row in arms.items():
        row["spread"] = {
            m: asdict(seed_spread([s["scores"][m]["macro"]["estimate"] for s in row["seeds"].values()]))
            for m in METRICS
        }
    differences = {seed: paired(records[first][seed], records[second][seed], cfg) for seed in cfg.seeds}
    claim = {}
    for metric in METRICS:
        per_seed = [differences[seed][metric]["macro"] for seed in cfg.seeds]
        claim[metric] = {
            "seeds": {seed: differences[seed][metric] for seed in cfg.seeds},
            "spread": asdict(seed_spread([d["estimate"] for d in per_seed])),
            "verdict": verdict(
                [_interval(d) for d in per_seed],
                [differences[seed][metric]["p_value"] for seed in cfg.seeds],
                alpha=1 - cfg.compare.level,
            ),
            "power": power(cfg, records[first], records[second], metric),
        }
    moved = {arm: arm_movement(cfg.arm(arm), movement[arm], cfg.train.health.max_kl) for arm in cfg.arms}
    return {"arms": arms, "claim": claim, "movement": moved, "gains": gains_over_start(cfg, records, references)}


def replayed_pairs(rows: Sequence[Mapping], revisit: int) -> list[tuple[str, int, float, float]]:
    """(question, batch, first reward, replayed reward) of a run whose last `revisit` steps replayed its first
    (`train.grpo.revisit`): each replayed batch's questions' group rewards (0-1), sorted. [] when the run's quarter
    is not `revisit` steps or its history predates per-question rewards."""
    quarter = max(1, len(rows) // 4)
    if (
        not revisit
        or quarter != revisit
        or any(QUESTION_REWARDS not in row for row in (*rows[:quarter], *rows[-quarter:]))
    ):
        return []
    # batch i of the last quarter replays batch i of the first: pair their groups question by question (a question
    # the deal gives two batches is two pairs); all of them, but where dynamic sampling drew other extra questions
    played = [(row[QUESTION_REWARDS], again[QUESTION_REWARDS]) for row, again in zip(rows[:quarter], rows[-quarter:])]
    return sorted(
        (question, batch, first[question], last[question])
        for batch, (first, last) in enumerate(played)
        for question in first
        if question in last
    )


def paired_rise(pairs: Sequence[tuple[str, int, float, float]], cfg: CompareConfig) -> dict:
    """The rise over `pairs` (`replayed_pairs`): replayed minus first reward, with the paired bootstrap CI, the
    exact or seeded sign-flip p (`compare.permutations`), the standard error over the pairs and the rise it could
    detect (`compare.power`)."""
    before, after = {"questions": [pair[2] for pair in pairs]}, {"questions": [pair[3] for pair in pairs]}
    ci = paired_difference_ci(after, before, seed=cfg.seed, resamples=cfg.resamples, level=cfg.level)
    rises = [pair[3] - pair[2] for pair in pairs]
    se = float(np.std(rises, ddof=1) / np.sqrt(len(rises))) if len(rises) > 1 else None
    return {
        "questions": len(pairs),
        **asdict(ci),
        "p": paired_permutation_pvalue(after, before, seed=cfg.seed, permutations=cfg.permutations),
        "se": se,
        "detectable": None if se is None else minimum_detectable_difference(se, level=cfg.level, power=cfg.power),
    }


def replayed_rise(rows: Sequence[Mapping], revisit: int, cfg: CompareConfig) -> dict | None:
    """The reward rise of a replaying run (`replayed_pairs`), paired by question (`paired_rise`). The same
    questions were played with the same random numbers, so a policy that did not change scores 0 on each; one
    that did samples other episodes, whose reward differs by chance as well as by what it learned: that is the
    noise here, over a handful of questions. None when the run did not replay."""
    pairs = replayed_pairs(rows, revisit)
    return paired_rise(pairs, cfg) if pairs else None


def replayed_rises(cfg: Config, histories: Mapping) -> dict:
    """`replayed_rise` of every trained run (histories[backbone][arm][seed]: its rows) that replayed its first
    quarter; {} without `train.grpo.revisit`."""
    revisit = cfg.train.grpo.revisit
    rises = {
        backbone: {
            arm: {seed: rise for seed, rows in seeds.items() if (rise := replayed_rise(rows, revisit, cfg.compare))}
            for arm, seeds in runs.items()
        }
        for backbone, runs in histories.items()
    }
    return {b: {arm: seeds for arm, seeds in runs.items() if seeds} for b, runs in rises.items() if any(runs.values())}


def pooled_replayed_rises(cfg: Config, histories: Mapping) -> dict:
    """Per arm of 2 or more replaying runs ([backbone][arm]): `paired_rise` over every seed's replayed pairs
    together, and `seeds`, how many. Fixed effects: it asks whether these runs, together, raised the reward of the
    questions they replayed, at about sqrt(seeds) less noise than one run; the spread between seeds is not in it
    (the verdict's seeds take that in)."""
    revisit, pooled = cfg.train.grpo.revisit, {}
    for backbone, runs in histories.items():
        for arm, seeds in runs.items():
            played = [pairs for rows in seeds.values() if (pairs := replayed_pairs(rows, revisit))]
            if len(played) > 1:
                rise = paired_rise([pair for pairs in played for pair in pairs], cfg.compare)
                pooled.setdefault(backbone, {})[arm] = rise | {"seeds": len(played)}
    return pooled


def lost_answers(cfg: Config, records: Mapping, reference_records: Mapping, shown: ShownPassages) -> dict:
    """Where each cell's wrong answers were last seen (`attribution.attribution_table`): backbone ->
    {"references": {reference: table}, "budgets": {budget: {arm: {seed: table}}}}. records and reference_records
    as `comparison` takes them; shown: passage id -> what a role saw of it (`attribution.shown_passages`)."""

    def table(name: str, rows: Sequence[dict]) -> dict:
        return attribution_table([(f"{name}, record {i}", row) for i, row in enumerate(rows, 1)], shown)

    return {
        backbone: {
            "references": {ref: table(ref, reference_records[backbone][ref]) for ref in cfg.references},
            "budgets": {
                budget: {
                    arm: {s: table(f"{arm} seed {s} {budget}", records[backbone][arm][s][budget]) for s in cfg.seeds}
                    for arm in cfg.arms
                }
                for budget in cfg.budgets
            },
        }
        for backbone in cfg.backbones
    }


def _interval(d: dict) -> Interval:
    return Interval(d["estimate"], d["low"], d["high"])


def comparison(cfg: Config, records: Mapping, reference_records: Mapping, cuts: Mapping, movement: Mapping) -> dict:
    """Everything the report shows, as data (also the DVC metrics file).

    records[backbone][arm][seed][budget], reference_records[backbone][reference], cuts[backbone][arm][seed][budget],
    movement[backbone][arm][seed][budget].
    """
    out = {
        "claim": list(cfg.claim),
        "rule": VERDICT_RULE,
        "level": cfg.compare.level,
        "power": cfg.compare.power,
        "rise": cfg.compare.rise,
        "published": PUBLISHED,
        "backbones": {},
    }
    if cfg.train.grpo.revisit:  # the runs replayed their first batches: the report's rise is then paired
        out["revisit"] = cfg.train.grpo.revisit
    for backbone in cfg.backbones:
        cells = {
            f"{arm}-seed{seed}-{budget}": records[backbone][arm][seed][budget]
            for arm in cfg.arms
            for seed in cfg.seeds
            for budget in cfg.budgets
        }
        check_same_questions(cells | {ref: reference_records[backbone][ref] for ref in cfg.references})
        out["backbones"][backbone] = {
            "references": {ref: cell_scores(reference_records[backbone][ref], cfg) for ref in cfg.references},
            "budgets": {
                budget: {
                    "budget": cfg.budgets[budget].model_dump(exclude_none=True),
                    **budget_comparison(
                        cfg,
                        {arm: {s: records[backbone][arm][s][budget] for s in cfg.seeds} for arm in cfg.arms},
                        {arm: {s: cuts[backbone][arm][s][budget] for s in cfg.seeds} for arm in cfg.arms},
                        {arm: {s: movement[backbone][arm][s][budget] for s in cfg.seeds} for arm in cfg.arms},
                        reference_records[backbone],
                    ),
                }
                for budget in cfg.budgets
            },
        }
    return out
