"""Hand-computed cases for the arm-comparison statistics (bootstrap CIs, sign-flip test, seed verdict)."""

from __future__ import annotations

import math

import pytest

from centralrl.stats import (
    VERDICT_RULE,
    VERDICTS,
    Interval,
    bootstrap_ci,
    macro_bootstrap_ci,
    macro_mean,
    paired_difference_ci,
    paired_permutation_pvalue,
    seed_spread,
    verdict,
)


def test_macro_mean_averages_benchmarks_not_questions():
    # x: 1/2 = 0.5; y: 3/4 = 0.75; macro = (0.5 + 0.75) / 2 = 0.625 (the pooled mean would be 4/6)
    assert macro_mean({"x": [1, 0], "y": [1, 1, 1, 0]}) == 0.625


def test_macro_mean_names_an_empty_benchmark():
    with pytest.raises(ValueError, match="'hotpotqa'"):
        macro_mean({"nq": [1.0], "hotpotqa": []})


def test_bootstrap_of_a_constant_is_the_constant():
    # every resample of [0.75]*4 has mean 0.75 (dyadic, so exact in floats)
    assert bootstrap_ci([0.75] * 4, seed=1) == Interval(0.75, 0.75, 0.75)


def test_bootstrap_of_zero_one_spans_zero_to_one():
    # a resample mean of [0, 1] is 0, .5 or 1 with prob 1/4, 1/2, 1/4: the 2.5% and 97.5% quantiles are 0 and 1
    ci = bootstrap_ci([0, 1], seed=0, resamples=4000)
    assert (ci.estimate, ci.low, ci.high) == (0.5, 0.0, 1.0)


def test_bootstrap_is_deterministic_in_the_seed():
    values = [0.1, 0.4, 0.35, 0.8, 0.0, 1.0]
    assert bootstrap_ci(values, seed=7) == bootstrap_ci(values, seed=7)
    ci = bootstrap_ci(values, seed=7)
    assert ci.low < ci.estimate < ci.high


def test_macro_bootstrap_resamples_within_each_benchmark():
    # x is constant 1 and y constant 0: a stratified resample keeps both benchmarks, so every macro is (1 + 0)/2
    assert macro_bootstrap_ci({"x": [1, 1, 1], "y": [0, 0]}, seed=3) == Interval(0.5, 0.5, 0.5)


def test_paired_difference_of_identical_arms_is_zero():
    a = {"x": [0.1, 0.9, 0.4], "y": [1.0, 0.0]}
    assert paired_difference_ci(a, a, seed=0).as_dict() == {"estimate": 0.0, "low": 0.0, "high": 0.0}


def test_paired_difference_of_a_constant_shift_is_the_shift():
    # a = b + 0.2 on every question: every paired resample differs by exactly 0.2 (up to float rounding),
    # although an unpaired bootstrap of these spread-out scores would give a wide interval
    b = {"x": [0.1, 0.9, 0.4], "y": [0.7, 0.0]}
    a = {name: [s + 0.2 for s in scores] for name, scores in b.items()}
    ci = paired_difference_ci(a, b, seed=0)
    for value in (ci.estimate, ci.low, ci.high):
        assert value == pytest.approx(0.2, abs=1e-12)
    assert ci.excludes_zero() == 1


@pytest.mark.parametrize(
    ("b", "message"),
    [
        ({"x": [0, 0], "y": [0]}, r"'y': a has 2 questions, b has 1"),
        ({"x": [0, 0]}, r"only in a \['y'\]"),
        ({"x": [0, 0], "y": [0, 0], "z": [0]}, r"only in b \['z'\]"),
    ],
)
def test_paired_functions_refuse_different_questions(b, message):
    a = {"x": [1, 1], "y": [1, 1]}
    with pytest.raises(ValueError, match=message):
        paired_difference_ci(a, b, seed=0)
    with pytest.raises(ValueError, match=message):
        paired_permutation_pvalue(a, b, seed=0)


def test_permutation_exact_one_benchmark():
    # diffs [1, 1, 1]: T_obs = 1; of the 8 sign patterns only +++ (T=1) and --- (T=-1) reach |T| >= 1: p = 2/8
    assert paired_permutation_pvalue({"x": [1, 1, 1]}, {"x": [0, 0, 0]}, seed=0) == 0.25


def test_permutation_exact_no_effect():
    # diffs [1, -1]: T_obs = 0, and every one of the 4 patterns has |T| >= 0: p = 4/4
    assert paired_permutation_pvalue({"x": [1, 0]}, {"x": [0, 1]}, seed=0) == 1.0


def test_permutation_exact_two_benchmarks_uses_the_macro_statistic():
    # x diffs [1], y diffs [1, 0]: T = (s1 * 1 + (s2 * 1 + s3 * 0) / 2) / 2 = 0.5 s1 + 0.25 s2; T_obs = 0.75.
    # The 8 patterns (s1, s2, s3): T = +0.75 for (+,+,±), -0.75 for (-,-,±), +0.25 for (+,-,±), -0.25 for (-,+,±);
    # |T| >= 0.75 in 4 of 8: p = 0.5
    a, b = {"x": [1], "y": [1, 0]}, {"x": [0], "y": [0, 0]}
    assert paired_permutation_pvalue(a, b, seed=0) == 0.5


def test_permutation_of_identical_arms_is_one():
    a = {"x": [0.3] * 40}
    assert paired_permutation_pvalue(a, a, seed=0, permutations=99) == 1.0


def test_permutation_monte_carlo():
    # 30 questions: 2**30 > 999 draws, so Monte Carlo. All diffs +1: only the all-+ / all-- patterns reach |T| = 1
    # (probability 2 / 2**30 per draw), so none of 999 draws does and p = (1 + 0) / (1 + 999)
    a, b = {"x": [1] * 30}, {"x": [0] * 30}
    assert paired_permutation_pvalue(a, b, seed=0, permutations=999) == 1 / 1000
    mixed_a, mixed_b = {"x": [1, 0, 1] * 10, "y": [0.5] * 12}, {"x": [0, 0, 1] * 10, "y": [0.25, 0.75] * 6}
    p = paired_permutation_pvalue(mixed_a, mixed_b, seed=5, permutations=500)
    assert p == paired_permutation_pvalue(mixed_a, mixed_b, seed=5, permutations=500)
    assert 0 < p <= 1


def test_seed_spread():
    # [1, 3]: mean 2, std = sqrt(((1-2)**2 + (3-2)**2) / (2-1)) = sqrt(2)
    s = seed_spread([1, 3])
    assert (s.mean, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 2)
    assert s.std == pytest.approx(math.sqrt(2))
    assert seed_spread([5]).std == 0.0


def test_verdict():
    above, below, straddling = Interval(0.1, 0.02, 0.2), Interval(-0.1, -0.2, -0.02), Interval(0.1, -0.01, 0.2)
    assert verdict([above, above]) == "supported"
    assert verdict([below, below]) == "contradicted"
    assert verdict([above, straddling]) == "inconclusive"
    assert verdict([above, below]) == "inconclusive"
    assert set(VERDICTS) == {"supported", "contradicted", "inconclusive"} and "a - b" in VERDICT_RULE
    with pytest.raises(ValueError):
        verdict([])
