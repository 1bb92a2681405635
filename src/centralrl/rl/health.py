"""Collapse guards of a GRPO run: a step whose loss, reward, grad norm or KL is not finite, or whose KL to the
starting policy passes `train.health.max_kl`, stops the run before its state is saved.

The run (`centralrl.rl.run`) checks every step's metrics after logging them; a problem raises `TrainingDiverged`
naming the step and the monitor. Nothing of the bad step is saved, so the newest saved state stays the last good
one for inspection, and a rerun (`dvc repro`) resumes from it, never from the diverged state. Unstable GRPO is
the most common complaint about Search-R1-style training (its issue #88); this is the guard Search-R1 lacks.
The KL is the k3 estimate over the step's trained tokens, measured every step when `kl_coef` > 0; with no KL term
the reference forward is skipped, except every `train.health.kl_every` steps, where one no-grad reference forward
measures the KL for this guard (a step without it has no "kl" metric, and only the finiteness monitors run).

The KL guard cannot see a policy that collapsed to answers that are always wrong: every group then has equal
(zero) rewards, the step is skipped, and no KL is measured. Measured on SmolLM2 at learning rate 1e-3: the
central agent stopped asking sub-questions within 5 steps and every later step scored 0. So a run whose reward
was positive earlier and has been exactly 0 over the last `train.health.dead_questions` training questions stops
as well. The window is counted in questions, not steps: at 2 questions per step, 20 of the default experiment's
48 steps scored 0 on hard draws alone (two runs of 4 in a row, dev F1 rising meanwhile), so a guard of 5 steps
would stop healthy runs; 12 questions is 6 such steps, or 2 steps of 8 questions.
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
    >>> health_problem({"loss": 0.1, "reward_mean": 0.2, "grad_norm": 1.0}, max_kl=1.0) is None  # KL not measured
    True
    """
    for key in FINITE:
        if key in metrics and not math.isfinite(metrics[key]):
            return f"{key} is {metrics[key]}"
    if metrics.get("kl", 0.0) > max_kl:
        return f"kl to the starting policy {metrics['kl']:.4g} passed train.health.max_kl ({max_kl})"
    return None


def collapse_problem(history: list[dict[str, float]], dead_questions: int, questions_per_step: int) -> str | None:
    """A reward collapse in a run's per-step metrics (oldest first), or None: the last ceil(`dead_questions` /
    `questions_per_step`) steps' mean rewards are all 0 after an earlier positive one (0 disables the check). It
    names the roles every one of whose outputs in those steps was an invalid action (the protocol lost, as at
    learning rate 3e-3: docs/probes.md), as against answers that are merely wrong.

    >>> runs = [(0.3, 0), (0.2, 0.1), (0, 1), (0, 1), (0, 1)]  # (mean reward, central's invalid-action rate)
    >>> rows = [{"reward_mean": r, "invalid_rate.central": i} for r, i in runs]
    >>> problem = collapse_problem(rows, dead_questions=6, questions_per_step=2)
    >>> problem.split(": ")[0]
    'mean reward 0 in the last 3 steps (6 questions, train.health.dead_questions) after 0.3 earlier'
    >>> problem.split(": ")[1]
    'a collapse (every central output of those steps was an invalid action)'
    >>> collapse_problem(rows[:4] + [{"reward_mean": 0, "invalid_rate.central": 0.5}], 6, 2).endswith("a collapse")
    True
    >>> collapse_problem(rows[:3], dead_questions=6, questions_per_step=2) is None  # 4 questions so far
    True
    >>> collapse_problem(rows[2:], dead_questions=2, questions_per_step=2) is None  # never positive
    True
    """
    rewards = [row["reward_mean"] for row in history]
    dead_steps = -(-dead_questions // questions_per_step)
    if dead_steps == 0 or len(rewards) <= dead_steps or any(rewards[-dead_steps:]):
        return None
    best = max(rewards[:-dead_steps])
    if best <= 0:
        return None
    dead = history[-dead_steps:]
    roles = [key.removeprefix("invalid_rate.") for key in dead[-1] if key.startswith("invalid_rate.")]
    lost = [role for role in roles if all(row.get(f"invalid_rate.{role}", 0.0) >= 1.0 for row in dead)]
    why = f" (every {' and '.join(lost)} output of those steps was an invalid action)" if lost else ""
    return (
        f"mean reward 0 in the last {dead_steps} steps ({dead_steps * questions_per_step} questions, "
        f"train.health.dead_questions) after {best:.3g} earlier: a collapse{why}"
    )
