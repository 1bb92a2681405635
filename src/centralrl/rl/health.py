"""Collapse guards of a GRPO run: a step whose loss, reward, grad norm or KL is not finite, or whose KL to the
starting policy passes `train.health.max_kl`, stops the run before its state is saved.

The run (`centralrl.rl.run`) checks every step's metrics after logging them; a problem raises `TrainingDiverged`
naming the step and the monitor. Nothing of the bad step is saved, so the newest saved state stays the last good
one for inspection, and a rerun (`dvc repro`) resumes from it, never from the diverged state. Unstable GRPO is
the most common complaint about Search-R1-style training (its issue #88); this is the guard Search-R1 lacks.
The KL is the k3 estimate over the step's trained tokens, measured only when `kl_coef` > 0 (with no KL term the
reference forward is skipped, so only the finiteness monitors run).
"""

from __future__ import annotations

import math

from centralrl.errors import CentralRLError

FINITE = ("loss", "reward_mean", "grad_norm", "kl")


class TrainingDiverged(CentralRLError):
    """A step's metrics show the run has blown up; the run stops before saving that step."""


def health_problem(metrics: dict[str, float], max_kl: float) -> str | None:
    """What is wrong with a step's metrics, or None when they are healthy.

    >>> health_problem({"loss": 0.1, "reward_mean": 0.2, "grad_norm": 1.0, "kl": 0.01}, max_kl=1.0) is None
    True
    >>> health_problem({"loss": float("nan"), "reward_mean": 0.2, "grad_norm": 1.0, "kl": 0.0}, max_kl=1.0)
    'loss is nan'
    """
    for key in FINITE:
        if not math.isfinite(metrics[key]):
            return f"{key} is {metrics[key]}"
    if metrics["kl"] > max_kl:
        return f"kl to the starting policy {metrics['kl']:.4g} passed train.health.max_kl ({max_kl})"
    return None
