"""Outcome rewards: one float per episode, from its final answer, shared by training and evaluation.

The reward is the configured answer metric (`centralrl.metrics`: token F1 by default, EM or cover-EM selectable)
of the final answer against the golden answers, plus `format_weight` when the episode's actions were all valid.
Departure from Search-R1: its reward is EM only, with no format term; here the metric is a param and the format
term is optional (weight 0 by default, so the default reward is the metric alone).
"""

from __future__ import annotations

from collections.abc import Sequence

from centralrl.metrics import METRICS

# A training history row's {question id: its group's mean reward}: `compare.replayed_rise` pairs a replayed
# (`train.grpo.revisit`) question's two groups by it. In the history only, not an MLflow metric (a name per question).
QUESTION_REWARDS = "question_rewards"


def outcome_reward(
    prediction: str,
    golden_answers: Sequence[str],
    metric: str = "f1",
    format_ok: bool = True,
    format_weight: float = 0.0,
) -> float:
    """`metric(prediction, golden_answers)` plus `format_weight` if `format_ok`.

    >>> outcome_reward("Barack Obama", ["Obama"])  # F1: precision 1/2, recall 1/1
    0.6666666666666666
    >>> outcome_reward("Barack Obama", ["Obama"], metric="em")
    0.0
    >>> outcome_reward("It was Obama.", ["obama"], metric="acc", format_weight=0.5)
    1.5
    >>> outcome_reward("Obama", ["Obama"], metric="em", format_ok=False, format_weight=0.5)
    1.0
    >>> outcome_reward("Obama", ["Obama"], metric="bleu")
    Traceback (most recent call last):
    ...
    ValueError: unknown reward metric 'bleu'; allowed: acc, em, f1
    """
    try:
        score = METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown reward metric {metric!r}; allowed: {', '.join(sorted(METRICS))}") from None
    return score(prediction, golden_answers) + (format_weight if format_ok else 0.0)
