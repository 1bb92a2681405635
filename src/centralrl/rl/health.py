"""Collapse guards of a GRPO run: a step whose loss, reward, grad norm or KL is not finite, or whose KL to the
starting policy passes `train.health.max_kl`, stops the run.

The run (`centralrl.rl.run`) checks every step's metrics after logging them and before saving the step's state;
a problem raises `TrainingDiverged` naming the step, the monitor and the state a rerun resumes from. Every metric
of step k comes from its rollout and update, and both start from the policy saved after step k-1; which state is
bad depends on the monitor:

- loss, reward or grad norm not finite (`update_problem`): step k's update (the rewards are its input).
  Applied, it would write non-finite weights, so nothing of step k is saved, and the newest state (the policy
  the step started from when `checkpoint_every` is 1) is the last good one: its weights are finite, though its
  forward may be what overflowed.
- KL not finite or above `max_kl` (`kl_problem`): the policy step k started from. The KL is measured in the
  update's first forward, before any of its optimizer steps (with `updates_per_rollout` > 1 it is the mean over
  the passes, the later ones on the policy within the step), so the state saved after step k-1 is the one past
  the limit: the run sets it aside as `past-max-kl-step-<k-1>` (kept for inspection, never resumed), and the
  state saved before it (`centralrl.rl.checkpoint` keeps two for this) is the newest kept one. That state is
  known to be under the limit only when its own KL was measured (step k-1's, every step with a KL term); without
  a KL term the KL is measured every `kl_every` steps, so the message says whether it was, and if not, the step
  at which the KL was last measured under the limit (the states since were not measured). It is checked first:
  with a KL term, an infinite KL makes the loss infinite too.
- a reward collapse (`collapse_problem`): the policy of the last steps, every one of which scored 0. A
  zero-reward step skips its update, so a state saved during those steps plays that policy; the newest state
  is kept for inspection, not as a good one.

A rerun with the same params (`dvc repro`) resumes from the newest state (`step-*`) and, as every draw derives
from (seed, step), stops at the same step again; other params (a lower learning rate, another `max_kl`) change
the run's fingerprint, and it starts from step 0. Unstable GRPO is the most common complaint about
Search-R1-style training (its issue #88); this is the guard Search-R1 lacks.

The KL is the k3 estimate over the step's trained tokens, measured every step when `kl_coef` > 0; with no KL term
the reference forward is skipped, except every `train.health.kl_every` steps, where one no-grad reference forward
measures the KL for this guard (a step without it has no "kl" metric, and only the finiteness monitors run).
The policy a run ends with is never measured: the last step's KL is that of the policy it started from (after
step `steps` - 1), and measuring the one its update made would take another rollout, so the last update can pass
`max_kl` unseen here (the finiteness monitors still see its loss and grad norm); the evaluate stage measures
each trained role's KL to the start on the test calls, and the report names a role past `max_kl` there
(`compare.arm_movement`). Likewise a budget's cut (the adapters
after step b) is measured only when step b + 1 measures the KL, and a run ends at its last cut.

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

FINITE = ("loss", "reward_mean", "grad_norm")


class TrainingDiverged(CentralRLError):
    """A step's metrics show the run has blown up; the run stops before saving that step."""


def kl_problem(metrics: dict[str, float], max_kl: float) -> str | None:
    """What the KL monitor finds in a step's metrics, or None when the KL is fine or was not measured: a KL that
    is not finite or passes `max_kl`. It is the KL of the policy the step started from.

    >>> kl_problem({"kl": 0.01}, max_kl=1.0) is None
    True
    >>> kl_problem({"kl": 3.0}, max_kl=1.0)
    'kl to the starting policy 3 passed train.health.max_kl (1.0)'
    >>> kl_problem({"loss": float("inf"), "kl": float("inf")}, max_kl=1.0)
    'kl is inf'
    >>> kl_problem({"loss": 0.1}, max_kl=1.0) is None  # not measured at this step
    True
    """
    kl = metrics.get("kl", 0.0)
    if not math.isfinite(kl):
        return f"kl is {kl}"
    if kl > max_kl:
        return f"kl to the starting policy {kl:.4g} passed train.health.max_kl ({max_kl})"
    return None


def update_problem(metrics: dict[str, float]) -> str | None:
    """What is wrong with a step's update, or None: its loss, mean reward or grad norm is not finite.

    >>> update_problem({"loss": 0.1, "reward_mean": 0.2, "grad_norm": 1.0}) is None
    True
    >>> update_problem({"loss": float("nan"), "reward_mean": 0.2, "grad_norm": 1.0})
    'loss is nan'
    """
    for key in FINITE:
        if key in metrics and not math.isfinite(metrics[key]):
            return f"{key} is {metrics[key]}"
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
