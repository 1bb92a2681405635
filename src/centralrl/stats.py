"""Statistics for comparing two training arms (say `a` = central_only, `b` = joint) on per-question scores.

Scores come grouped by benchmark (`Groups`: benchmark name -> per-question scores). The headline number is
the macro-average: the plain mean within each benchmark, then the plain mean over benchmarks, as the
FlashRAG / Search-R1 tables average. Everything here is a pure numpy function, deterministic from an integer
seed (`numpy.random.default_rng(seed)`):

- `bootstrap_ci`: the mean of one sample with a percentile bootstrap confidence interval.
- `macro_bootstrap_ci`: the macro-average with a stratified bootstrap, resampling questions within each
  benchmark (in sorted name order), so every resample keeps each benchmark's size and weight.
- `paired_difference_ci`: macro(a) - macro(b) with a paired stratified bootstrap: the same resampled question
  indices for both arms, so the question-to-question variation they share cancels.
- `paired_permutation_pvalue`: a two-sided sign-flip permutation test of "no difference" on the macro-average
  of per-question differences; exact (all 2**n sign patterns) when that is no more than `permutations`.
  `differing_questions`: its p-value is at least 2 / 2^k, k the questions whose difference is not 0 (a tie
  flips to itself), so observed scores with few differing questions cannot reject (`sign_flip_rejects`).
- `seed_spread` and `verdict`: summarise the same comparison repeated over training seeds (the verdict asks
  every seed's interval and its permutation test).
- `paired_difference_se` and `minimum_detectable_difference`: the bootstrap standard error of the seed-averaged
  paired difference (questions resampled with the same indices for both arms and every seed) and the smallest
  true difference a two-sided z-test at level `level` finds with probability `power`, (z_{1-alpha/2} + z_power) *
  SE (the normal approximation of a power analysis; about 2.80 * SE at alpha 0.05 and power 0.8).
- `detectable_difference`: the minimum detectable difference (MDE) of the verdict's test, with the seeds' part:
  of the seed-averaged difference (`se_seeds`, in the test and the estimate), or the `spread` of one seed's own
  difference over training, which its test over the questions (the seed's trained model fixed) does not see but
  its estimate carries: t + z_power * SE_estimate, t = `sign_flip_threshold` at SE_test (below).
- `questions_to_detect`: the number of questions at which that difference reaches a target, the questions'
  standard error shrinking as 1/sqrt(questions) and the seeds' part of it held (None when that part alone is
  too large: then no number of questions would do).

Departure from the textbook MDE, (z_{1-alpha/2} + z_power) * SE: the verdict rule asks each seed's sign-flip test
as well as its interval, and that test's null spread is not SE. Its statistic is T = sum_i v_i, v_i = d_i /
(K n_i) (the macro-average of the differences d_i), and under sign flips T has the spread sqrt(sum_i v_i^2): the
differences themselves, not centred (E[d^2] = Var(d) + delta^2), so it grows with the observed difference:
sqrt(SE^2 + T^2 / m), SE^2 = sum_k var0(d_k) / (K^2 n_k) the bootstrap's (`paired_difference_se`) and m = K^2 /
sum_k (1 / n_k) the effective number of questions (`sign_flip_terms`), when every benchmark's mean is T. Its
normal approximation, with a continuity correction of half the step one sign flip moves T by (w = mean |v_i|
over the nonzero v_i), rejects when T - w >= z_{1-alpha/2} * sqrt(SE^2 + T^2 / m), i.e. from T = t, t = (w +
sqrt(c w^2 + (1 - c) z^2 SE^2)) / (1 - c), c = z^2 / m (`sign_flip_threshold`). For 0/1 scores in benchmarks of one
size the test is a sign test and t its exact threshold (checked for 24-100 questions); the percentile interval,
above 0 from about z * SE, asks less. So the MDE is t + z_power * SE: the true difference whose estimate (normal,
SE) passes t with probability `power`. With 0/1 scores at 24 questions (2 x 12) the rule passes at it with
probability 0.80-0.86 (1000 simulated seeds each, at 0, 5 and 10% of questions worse), where the textbook MDE
gave 0.55-0.64; many questions make c and w vanish and t = z_{1-alpha/2} * SE, the textbook's. For finer
differences (F1's partial credit) the correction errs high: normal differences at 24 questions passed 0.88-0.95.

Percentile intervals use `np.quantile` (linear method) at (1 - level)/2 and 1 - (1 - level)/2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

Groups = Mapping[str, Sequence[float]]

VERDICTS = ("supported", "contradicted", "inconclusive")
VERDICT_RULE = (
    "supported when, for every seed, the paired bootstrap CI of the macro-average difference (first arm minus "
    "second, a - b) lies entirely above 0 and the sign-flip permutation test rejects no difference at alpha "
    "= 1 - level; contradicted when the same holds below 0; inconclusive otherwise."
)
EXACT_MAX_QUESTIONS = 20  # exact sign-flip enumeration holds 2**n x n int64 signs: 2**20 x 20 x 8 bytes, 168 MB
_TIE = 1e-12  # |T| >= |T_obs| - _TIE counts as "at least as extreme" (absorbs float summation order)


@dataclass(frozen=True)
class Interval:
    """A point estimate on the full sample and its percentile bootstrap interval [low, high]."""

    estimate: float
    low: float
    high: float

    def excludes_zero(self) -> int:
        """+1 if the interval lies above 0, -1 if below 0, else 0.

        >>> Interval(0.1, 0.05, 0.2).excludes_zero(), Interval(-0.1, -0.2, -0.05).excludes_zero()
        (1, -1)
        >>> Interval(0.1, 0.0, 0.2).excludes_zero()
        0
        """
        return 1 if self.low > 0 else -1 if self.high < 0 else 0

    def as_dict(self) -> dict[str, float]:
        """{"estimate": ..., "low": ..., "high": ...} (for JSON metrics files)."""
        return {"estimate": self.estimate, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class Spread:
    """Mean, sample std (ddof=1; 0.0 for one value), min, max and count of per-seed values."""

    mean: float
    std: float
    low: float
    high: float
    n: int


def _scores(what: str, values: Sequence[float]) -> np.ndarray:
    """`values` as a non-empty, finite 1-D float array; ValueError naming `what` otherwise."""
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{what} must be a non-empty 1-D sequence of scores (got shape {arr.shape})")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} has a non-finite score")
    return arr


def _groups(groups: Groups) -> dict[str, np.ndarray]:
    """Benchmark -> score array, in sorted benchmark order."""
    if not groups:
        raise ValueError("no benchmarks given")
    return {name: _scores(f"benchmark {name!r}", groups[name]) for name in sorted(groups)}


def _paired_differences(a: Groups, b: Groups) -> dict[str, np.ndarray]:
    """Benchmark -> per-question a - b, in sorted order; a and b must hold the same questions."""
    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        raise ValueError(f"a and b must have the same benchmarks: only in a {only_a}, only in b {only_b}")
    xs, ys = _groups(a), _groups(b)
    for name in xs:
        if xs[name].size != ys[name].size:
            raise ValueError(f"benchmark {name!r}: a has {xs[name].size} questions, b has {ys[name].size}")
    return {name: xs[name] - ys[name] for name in xs}


def _check(resamples: int, level: float) -> None:
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")


def _stratified_macro(arrays: Sequence[np.ndarray], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """[resamples] macro-averages, each resampling every array (in the given order) within itself."""
    means = [arr[rng.integers(0, arr.size, size=(resamples, arr.size))].mean(axis=1) for arr in arrays]
    return np.mean(means, axis=0)


def _interval(estimate: float, samples: np.ndarray, level: float) -> Interval:
    low, high = np.quantile(samples, [(1 - level) / 2, 1 - (1 - level) / 2])
    return Interval(float(estimate), float(low), float(high))


def macro_mean(groups: Groups) -> float:
    """Mean within each benchmark, then the mean over benchmarks.

    >>> macro_mean({"x": [1, 0], "y": [1, 1, 1, 0]})  # (0.5 + 0.75) / 2
    0.625
    """
    return float(np.mean([arr.mean() for arr in _groups(groups).values()]))


def bootstrap_ci(values: Sequence[float], *, seed: int, resamples: int = 2000, level: float = 0.95) -> Interval:
    """The mean of `values` with its percentile bootstrap CI.

    >>> bootstrap_ci([0.5, 0.5, 0.5], seed=0)
    Interval(estimate=0.5, low=0.5, high=0.5)
    """
    _check(resamples, level)
    arr = _scores("values", values)
    return _interval(arr.mean(), _stratified_macro([arr], np.random.default_rng(seed), resamples), level)


def macro_bootstrap_ci(groups: Groups, *, seed: int, resamples: int = 2000, level: float = 0.95) -> Interval:
    """`macro_mean(groups)` with a stratified percentile bootstrap CI (questions resampled within benchmarks)."""
    _check(resamples, level)
    arrays = list(_groups(groups).values())
    return _interval(macro_mean(groups), _stratified_macro(arrays, np.random.default_rng(seed), resamples), level)


def paired_difference_ci(a: Groups, b: Groups, *, seed: int, resamples: int = 2000, level: float = 0.95) -> Interval:
    """`macro_mean(a) - macro_mean(b)` with a paired stratified bootstrap CI (same question indices for a and b).

    >>> paired_difference_ci({"x": [1, 1]}, {"x": [0, 0]}, seed=0)
    Interval(estimate=1.0, low=1.0, high=1.0)
    """
    _check(resamples, level)
    diffs = list(_paired_differences(a, b).values())  # mean(a[idx]) - mean(b[idx]) == mean((a - b)[idx])
    samples = _stratified_macro(diffs, np.random.default_rng(seed), resamples)
    return _interval(macro_mean(a) - macro_mean(b), samples, level)


def paired_permutation_pvalue(a: Groups, b: Groups, *, seed: int, permutations: int = 10000) -> float:
    """Two-sided sign-flip test of "no difference" on T = macro-average of per-question differences a - b.

    Exact over all 2**n sign patterns when 2**n <= permutations and n <= 20 (2**n rows of n signs are held at
    once), else Monte Carlo with (1 + hits) / (1 + draws), in chunks.

    >>> paired_permutation_pvalue({"x": [1, 1, 1]}, {"x": [0, 0, 0]}, seed=0)  # only +++ and --- reach |T| = 1
    0.25
    """
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations}")
    diffs = list(_paired_differences(a, b).values())
    # T(signs) = sum_i signs_i * v_i, with v_i = d_i / (benchmarks * questions in i's benchmark)
    v = np.concatenate([d / (len(diffs) * d.size) for d in diffs])
    if not v.any():
        return 1.0
    n, threshold = v.size, abs(v.sum()) - _TIE
    if n <= EXACT_MAX_QUESTIONS and 2**n <= permutations:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
        return float(np.mean(np.abs(signs @ v) >= threshold))
    rng, hits, chunk = np.random.default_rng(seed), 0, max(1, 2**20 // n)  # chunks bound memory
    for start in range(0, permutations, chunk):
        signs = 1 - 2 * rng.integers(0, 2, size=(min(chunk, permutations - start), n), dtype=np.int8)
        hits += int(np.count_nonzero(np.abs(signs @ v) >= threshold))
    return (1 + hits) / (1 + permutations)


def seed_spread(values: Sequence[float]) -> Spread:
    """Mean, sample std (ddof=1), min and max of one number per seed.

    >>> seed_spread([1, 3])
    Spread(mean=2.0, std=1.4142135623730951, low=1.0, high=3.0, n=2)
    """
    arr = _scores("values", values)
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return Spread(float(arr.mean()), std, float(arr.min()), float(arr.max()), int(arr.size))


def verdict(per_seed: Sequence[Interval], p_values: Sequence[float], alpha: float = 0.05) -> str:
    """The claim "a > b" from the paired CI of macro(a) - macro(b) of every seed and its permutation p-value
    (see VERDICT_RULE). The test guards small samples, where a percentile bootstrap interval is too narrow: with
    one question per benchmark it has no width at all, and one question would have decided the claim.

    >>> verdict([Interval(0.1, 0.02, 0.2), Interval(0.05, -0.01, 0.1)], [0.01, 0.2])
    'inconclusive'
    """
    if not per_seed or len(p_values) != len(per_seed):
        raise ValueError(f"verdict needs an interval and a p-value per seed, got {len(per_seed)} and {len(p_values)}")
    if any(p > alpha for p in p_values):
        return "inconclusive"
    if all(i.low > 0 for i in per_seed):
        return "supported"
    if all(i.high < 0 for i in per_seed):
        return "contradicted"
    return "inconclusive"


def paired_difference_se(a: Sequence[Groups], b: Sequence[Groups], *, seed: int, resamples: int = 2000) -> float:
    """Bootstrap standard error of mean over seeds s of macro(a[s]) - macro(b[s]) (a[s], b[s]: seed s's scores).

    Questions are resampled within each benchmark with the same indices for both arms and every seed (the
    seeds answer the same questions), so the statistic is the macro-average of each question's difference
    averaged over seeds; its SE tends to sqrt(sum_k var0(D_k) / n_k) / K for K benchmarks, where D_k are the
    seed-averaged differences of benchmark k's n_k questions and var0 their variance with ddof 0. The spread of
    training itself over seeds is not in it: the seeds are the experiment's, not resampled (`compare.power` adds
    it).

    >>> paired_difference_se([{"x": [1, 1]}], [{"x": [0, 0]}], seed=0)
    0.0
    """
    if resamples < 2:
        raise ValueError(f"resamples must be >= 2 for a standard error, got {resamples}")
    averaged = _seed_averaged(a, b)
    return float(_stratified_macro(averaged, np.random.default_rng(seed), resamples).std(ddof=1))


def _seed_averaged(a: Sequence[Groups], b: Sequence[Groups]) -> list[np.ndarray]:
    """Per benchmark (sorted), each question's a - b averaged over the seeds (a[s], b[s]: seed s's scores)."""
    if not a or len(a) != len(b):
        raise ValueError(f"need the same positive number of seeds for a and b, got {len(a)} and {len(b)}")
    per_seed = [_paired_differences(x, y) for x, y in zip(a, b)]
    for differences in per_seed[1:]:
        if {k: v.size for k, v in differences.items()} != {k: v.size for k, v in per_seed[0].items()}:
            raise ValueError("every seed must answer the same benchmarks and number of questions")
    return [np.mean([d[name] for d in per_seed], axis=0) for name in per_seed[0]]


def sign_flip_terms(a: Sequence[Groups], b: Sequence[Groups]) -> tuple[float, float]:
    """(questions, step) of the sign-flip test on the seed-averaged macro difference (a[s], b[s]: seed s's
    scores), as `detectable_difference` takes them. With v_i = D_i / (K n_i), D_i question i's difference
    averaged over seeds, K benchmarks and n_i questions in i's benchmark (T = sum v_i, `paired_permutation_pvalue`):
    `questions` = 1 / sum_i (1 / (K n_i))^2 = K^2 / sum_k (1 / n_k), the effective number of questions (all of
    them for benchmarks of one size); `step` = the mean |v_i| over the nonzero v_i, half the step one sign flip
    moves T by (0 when every difference is 0).

    >>> sign_flip_terms([{"x": [100, 0, 100, 0]}], [{"x": [0, 0, 0, 0]}])  # v = [25, 0, 25, 0]
    (4.0, 25.0)
    >>> sign_flip_terms([{"x": [100, 0], "y": [0, 0, 0, -100]}], [{"x": [0, 0], "y": [0, 0, 0, 0]}])
    (5.333333333, 18.75)
    """
    averaged = _seed_averaged(a, b)
    v = np.abs(np.concatenate([d / (len(averaged) * d.size) for d in averaged]))
    v = v[v > _TIE]  # seeds' differences that cancel can leave a float residue (F1 1 - 0.8 - 0.2: 6e-15), not a step
    questions = round(len(averaged) ** 2 / sum(1 / d.size for d in averaged), 9)  # 24.0, not 24.000000000000004
    return questions, float(v.mean()) if v.size else 0.0


def differing_questions(a: Groups, b: Groups) -> int:
    """The questions whose paired difference a - b is not 0: the only ones a sign flip moves T by (a tie flips to
    itself), so the sign-flip test on these scores has at most 2^this distinct patterns and its smallest p-value
    is 2 / 2^this (`sign_flip_rejects` on it: whether this observed comparison could reject at all).

    >>> differing_questions({"x": [100, 50, 0], "y": [0]}, {"x": [100, 0, 0], "y": [100]})
    2
    """
    return int(sum(np.count_nonzero(d) for d in _paired_differences(a, b).values()))


def minimum_detectable_difference(se: float, *, level: float = 0.95, power: float = 0.8) -> float:
    """(z_{1 - alpha/2} + z_power) * se, alpha = 1 - level: the true difference a two-sided test finds with
    probability `power` (normal approximation).

    >>> round(minimum_detectable_difference(1.0), 4)  # 1.9600 + 0.8416
    2.8016
    """
    if not se >= 0:
        raise ValueError(f"se must be >= 0, got {se}")
    return sum(_z(level, power)) * se


def _z(level: float, power: float) -> tuple[float, float]:
    """(z_{1 - alpha/2}, z_power), alpha = 1 - level."""
    if not 0 < level < 1 or not 0 < power < 1:
        raise ValueError(f"level and power must be in (0, 1), got {level} and {power}")
    z = NormalDist().inv_cdf
    return z(1 - (1 - level) / 2), z(power)


def detectable_difference(
    se: float,
    *,
    se_seeds: float = 0.0,
    spread: float = 0.0,
    questions: float | None = None,
    step: float = 0.0,
    count: float | None = None,
    level: float = 0.95,
    power: float = 0.8,
) -> float | None:
    """The true difference that the verdict's two-sided sign-flip test at alpha = 1 - level finds with
    probability `power`: `sign_flip_threshold` + z_power * sqrt(se^2 + se_seeds^2 + spread^2), the threshold at
    the test's SE sqrt(se^2 + se_seeds^2). None when the test cannot reject at any difference, or its normal
    approximation gives no threshold (`sign_flip_threshold`).

    `se`: over the questions; `se_seeds`: how the seeds' mean varies with training, in the test and the estimate
    (a test of the seed-averaged difference that is about training); `spread`: how one seed's own difference
    varies with training, which its test over the questions (its trained model fixed) does not see.
    `questions`, `step`: `sign_flip_terms` (None: many questions, where the threshold is z_{1-alpha/2} x SE and
    this is `minimum_detectable_difference(se)` with neither seed term); `count`: the real number of questions
    (None: `questions`, as for benchmarks of one size).

    >>> round(detectable_difference(3.0, spread=4.0), 4)  # 1.9600 x 3 + 0.8416 x sqrt(3^2 + 4^2)
    10.088
    >>> round(detectable_difference(3.0, se_seeds=4.0), 4) == round(minimum_detectable_difference(5.0), 4)
    True
    >>> round(detectable_difference(1.0, questions=24), 4)  # 1.9600 / sqrt(1 - 1.9600^2 / 24) + 0.8416
    2.9802
    """
    if not se >= 0 or not se_seeds >= 0 or not spread >= 0:
        raise ValueError(f"se, se_seeds and spread must be >= 0, got {se}, {se_seeds} and {spread}")
    null = math.hypot(se, se_seeds)
    threshold = sign_flip_threshold(null, questions, step, level=level, count=count)
    return None if threshold is None else threshold + _z(level, power)[1] * math.hypot(null, spread)


def sign_flip_threshold(
    se: float, questions: float | None, step: float = 0.0, *, level: float = 0.95, count: float | None = None
) -> float | None:
    """The smallest estimate that the two-sided sign-flip test at alpha = 1 - level rejects, normal approximation:
    t solving t - step = z_{1-alpha/2} * sqrt(se^2 + t^2 / questions), i.e. t = (step + sqrt(c step^2 + (1 - c)
    z^2 se^2)) / (1 - c), c = z^2 / questions (see the module docstring); `questions` the effective number
    (`sign_flip_terms`), `count` the real one (None: `questions`, as for benchmarks of one size). None when the
    test cannot reject at all (not `sign_flip_rejects`: at `count`), or when the approximation has no threshold
    (not `sign_flip_approximable`: c >= 1; unequal benchmarks can leave that few effective questions of many
    real ones, whose exact test rejects). `questions` None: z_{1-alpha/2} * se (a z-test, many questions).

    >>> round(sign_flip_threshold(1.0, 24), 4), round(sign_flip_threshold(1.0, None), 4)
    (2.1386, 1.96)
    >>> sign_flip_threshold(1.0, 5) is None  # 2 / 2^5 > 0.05
    True
    >>> sign_flip_threshold(1.0, 3.81, count=21) is None, sign_flip_threshold(1.0, 5, count=21) is None  # 1 + 20
    (True, False)
    """
    z_alpha = _z(level, 0.5)[0]
    if questions is None:
        return z_alpha * se
    c = z_alpha**2 / questions
    if not sign_flip_approximable(questions, level=level) or not sign_flip_rejects(
        questions if count is None else count, level=level
    ):
        return None
    return (step + math.sqrt(c * step**2 + (1 - c) * (z_alpha * se) ** 2)) / (1 - c)


def sign_flip_rejects(count: float, *, level: float = 0.95) -> bool:
    """Whether the two-sided sign-flip test over `count` questions can reject "no difference" at alpha = 1 - level
    at all: the most extreme of their 2^count sign patterns has p = 2 / 2^count, which must be at most alpha.
    With `count` the real number of questions this is the design's answer (any question may differ); on observed
    scores only the differing ones count (`differing_questions`): 24 questions of which 21 tie cannot reject.

    >>> sign_flip_rejects(5), sign_flip_rejects(6)  # 2 / 32 > 0.05 >= 2 / 64
    (False, True)
    """
    return 2 ** (1 - count) <= 1 - level


def sign_flip_approximable(questions: float, *, level: float = 0.95) -> bool:
    """Whether the sign-flip test's normal approximation (`sign_flip_threshold`) gives a threshold at `questions`
    effective questions (`sign_flip_terms`): c = z_{1-alpha/2}^2 / questions below 1, i.e. more than 3.84 at
    alpha 0.05. Benchmarks of one size have as many as they have questions, and 6 are the fewest that
    `sign_flip_rejects` at that alpha.

    >>> sign_flip_approximable(3.81), sign_flip_approximable(3.87)
    (False, True)
    """
    return _z(level, 0.5)[0] ** 2 < questions


def questions_to_detect(
    target: float,
    se_questions: float,
    questions: int,
    *,
    se_seeds: float | None = None,
    spread: float | None = None,
    effective: float | None = None,
    step: float = 0.0,
    level: float = 0.95,
    power: float = 0.8,
) -> int | None:
    """The fewest questions (in the same mix) at which `detectable_difference` reaches |`target`|: at `questions`
    the SE over questions is `se_questions`, the sign-flip terms `effective` (its `questions`; None: left out) and
    `step`; at r times the questions the SE shrinks as 1/sqrt(r), `effective` grows r-fold and `step` shrinks
    r-fold (whether the test rejects at all is decided on the real count, `sign_flip_rejects`), while the seeds'
    `se_seeds` and `spread` (None: not measured) stay. None when they alone leave no room, z_{1-alpha/2} *
    se_seeds + z_power * sqrt(se_seeds^2 + spread^2) >= |target|: no number of questions would reach the target.

    >>> questions_to_detect(2 * minimum_detectable_difference(1.0), 4.0, 24)  # SE 4 -> 2: 4x the questions
    96
    >>> questions_to_detect(2 * minimum_detectable_difference(1.0), 4.0, 24, effective=24)  # + the test's terms
    99
    >>> questions_to_detect(2.43, 4.0, 24, se_seeds=1.0) is None  # 2.43 needs SE <= 0.87; the seeds give 1.0
    True
    >>> questions_to_detect(2.43, 4.0, 24, spread=2.0, power=0.93) is None  # z_0.93 = 1.48 x 2 > 2.43
    True
    """
    if not se_questions > 0 or questions < 1:
        raise ValueError(f"se_questions must be > 0 and questions >= 1, got {se_questions} and {questions}")
    seeds = {"se_seeds": se_seeds or 0.0, "spread": spread or 0.0, "level": level, "power": power}

    def reached(count: int) -> bool:
        r = count / questions
        terms = {"questions": None} if effective is None else {"questions": effective * r, "step": step / r}
        terms["count"] = count
        mde = detectable_difference(se_questions / math.sqrt(r), **terms, **seeds)
        return mde is not None and mde <= abs(target) + 1e-9

    limit = detectable_difference(0.0, **seeds)  # infinitely many questions
    if limit >= abs(target):
        return None
    low, high = 0, 1  # not reached at `low` (0: none asked), reached at `high`
    while not reached(high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if reached(middle) else (middle, high)
    return high
