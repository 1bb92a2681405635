"""Prefect flow `train-arm`: one cell's GRPO run (`centralrl.rl.run`) with every phase of every step (build,
rollout, reward, update, checkpoint) a visible Prefect task.

With `train.processes` > 1 only the main process runs the flow; the other processes run `train_cell` with the
plain phases, so the Prefect UI shows one flow run per cell.
"""

from __future__ import annotations

import sys
from dataclasses import fields

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from centralrl.rl.run import PLAIN, Phases, train_cell


def as_tasks(phases: Phases) -> Phases:
    """The same phases, each wrapped as a Prefect task named after it (never cached: every call is new work)."""
    return Phases(
        **{f.name: task(getattr(phases, f.name), name=f.name, cache_policy=NO_CACHE) for f in fields(phases)}
    )


TRACKED = as_tasks(PLAIN)


@flow(name="train-arm")
def training_flow(
    params_path: str,
    arm: str,
    seed: int,
    backbone: str,
    model_dir: str,
    index_dir: str,
    train_path: str,
    adapters_dir: str,
    budgets_path: str,
    state_dir: str,
    history_path: str,
    metrics_path: str,
    entry: str,
    start_scores_dir: str | None = None,
) -> dict:
    return train_cell(
        params_path,
        arm,
        seed,
        backbone,
        model_dir,
        index_dir,
        train_path,
        adapters_dir,
        budgets_path,
        state_dir,
        history_path,
        metrics_path,
        entry,
        phases=TRACKED,
        start_scores_dir=start_scores_dir,
    )


if __name__ == "__main__":  # a module of the flow its stage runs; run as a script it did nothing, silently
    sys.exit(f"{sys.argv[0]}: the Prefect flow `train-arm`, run by its stage: python -m stages.train --help")
