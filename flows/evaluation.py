"""Prefect flow `evaluate-harness`: greedy episodes on every test question, for a reference (the starting
checkpoint of some topology) or for every budget cut of one trained cell (arm, seed, backbone); scored and
written as per-question records, a per-benchmark table with the compute it took (DVC metrics) and one MLflow
run per evaluated cut (tables, transcripts, wall and CPU time per phase). For a trained cell, how far each role
moved from the start on the same greedy episodes (`centralrl.movement`) is a second metrics file, also logged.

Cuts that fell on the same step hold the same adapters, so they are evaluated once and their records shared.
Tasks: load inputs; roll out one chunk of questions at a time (each chunk a visible task and a progress step);
score and write; measure the roles' movement; log. Nothing retries: a failure here is a bug or bad input, not a
flaky service.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from tqdm import tqdm

from centralrl.assembly import run_settings, trained_policy
from centralrl.compute import ModelShape, accelerator_hours, peak_memory
from centralrl.config import TOPOLOGY_ROLES, Config, adapter_names, load_config
from centralrl.errors import DataError, TrackingError
from centralrl.evaluation import (
    budget_cuts,
    compute_spent,
    check_trained_files,
    copy_evaluation,
    cuts_by_step,
    markdown_table,
    write_cell,
    write_evaluation,
)
from centralrl.harness.engine import RolePolicy
from centralrl.harness.episodes import TOPOLOGIES, Episode, RunSettings
from centralrl.io import atomic_directory, read_json, write_json
from centralrl.metrics import refuse_empty_answers
from centralrl.models.adapters import checked_adapters
from centralrl.models.backbone import content_sha256
from centralrl.movement import movement_metrics, role_movement
from centralrl.retrieval import Retriever, open_retriever
from centralrl.schema import Question, read_questions
from centralrl.tracking import Tracker, cell_tags, open_tracker

load_questions = task(read_questions, name="load_questions")
# the starting checkpoint with a cut's trained adapters (none for a reference), on `harness.engine`
load_policy = task(trained_policy, name="load_policy", cache_policy=NO_CACHE)
write_results = task(write_evaluation, name="write_results", cache_policy=NO_CACHE)
measure_movement = task(role_movement, name="measure_movement", cache_policy=NO_CACHE)


@task(cache_policy=NO_CACHE)
def rollout(
    questions: list[Question], policy: RolePolicy, retriever: Retriever, topology: str, settings: RunSettings
) -> list[Episode]:
    return TOPOLOGIES[topology](questions, policy, retriever, settings)


class CountedPolicy:
    """`policy`, whose generate calls advance `bar` by one per prompt: an evaluation's progress in role calls (a
    chunk of 64 questions, the whole default test split, was one step of a bar that sat at 0 for minutes)."""

    def __init__(self, policy: RolePolicy, bar: tqdm) -> None:
        self.policy, self.bar = policy, bar

    def generate(self, role: str, prompts: list[list[int]], *args, **kwargs) -> list:
        generations = self.policy.generate(role, prompts, *args, **kwargs)
        self.bar.update(len(prompts))
        return generations

    def __getattr__(self, name: str):
        return getattr(self.policy, name)


def most_calls(topology: str, max_turns: int) -> int:
    """The most role calls of one episode: central, a central and a retrieval call per turn and the conclusion's;
    single agent, a call per step and the forced answer."""
    return 2 * max_turns + 1 if topology == "central" else max_turns + 1


def run_all(
    cfg: Config, name: str, questions: list[Question], policy: RolePolicy, retriever: Retriever, topology: str
) -> list[Episode]:
    settings = run_settings(cfg, greedy=True, seed=0)
    episodes: list[Episode] = []
    most = len(questions) * most_calls(topology, cfg.harness.max_turns)
    with tqdm(total=most, desc=f"evaluate@{name}", unit="call") as bar:
        counted = CountedPolicy(policy, bar)
        for start in range(0, len(questions), cfg.evaluate.chunk_size):
            chunk = questions[start : start + cfg.evaluate.chunk_size]
            episodes += rollout(chunk, counted, retriever, topology, settings)
        bar.total = bar.n  # episodes that concluded early made fewer calls than the most
    return episodes


@task(cache_policy=NO_CACHE)
def log_run(
    tracker: Tracker, cfg: Config, name: str, tags: dict, result: dict, movement: dict, timing: dict, out_dir: Path
) -> None:
    with tracker.run(f"evaluate@{name}", tags | {"stage": "evaluate"}, parent=cfg):
        tracker.log_params({**tags, **cfg.model_dump(include={"harness", "retrieval"})})
        table = result["scores"]
        tracker.log_metrics({f"{bench}.{m}": row[m] for bench, row in table.items() for m in ("em", "f1", "acc")})
        tracker.log_metrics({f"compute.{k}": v for k, v in result["compute"].items()} | timing)
        tracker.log_metrics(movement_metrics(movement))
        tracker.log_text(markdown_table(table), "benchmarks.md")
        tracker.log_text((out_dir / "transcripts.md").read_text(encoding="utf-8"), "transcripts.md")


def evaluate_one(
    cfg: Config,
    name: str,
    questions: list[Question],
    policy: RolePolicy,
    retriever: Retriever,
    topology: str,
    out_dir: Path,
) -> tuple[dict, dict, dict]:
    """Roll out, score and write one evaluation, measure how far its roles moved from the start; return
    ({scores, compute}, movement, timing), logged once the stage's outputs are written (`log_runs`)."""
    started = time.perf_counter()
    with policy.clock.phase("evaluation"):
        episodes = run_all(cfg, name, questions, policy, retriever, topology)
    result = {
        "scores": write_results(episodes, out_dir, cfg.tracking.transcripts),
        "compute": compute_spent(episodes, ModelShape.of(policy.model)),
    }
    with policy.clock.phase("movement"):
        movement = measure_movement(episodes, policy, TOPOLOGY_ROLES[topology])
    seconds = time.perf_counter() - started
    timing = policy.clock.totals() | peak_memory() | {"accelerator_hours": accelerator_hours(seconds, policy.device)}
    return result, movement, timing


def log_runs(cfg: Config, runs: list[tuple], *written: str) -> None:
    """Log each evaluated cut's run (name, tags, result, movement, timing, folder), after the stage's outputs
    (`written`) are whole: a tracking server that fails here leaves them as they are, and the error says so."""
    try:
        tracker = open_tracker(cfg.tracking)
        for run in runs:
            log_run(tracker, cfg, *run)
    except TrackingError as error:
        kept = ", ".join(written)
        raise TrackingError(
            f"{error}; the evaluation is written and kept ({kept}), only its MLflow runs are missing"
        ) from None


@flow(name="evaluate-harness")
def evaluation_flow(
    params_path: str,
    backbone: str,
    model_dir: str,
    index_dir: str,
    questions_path: str,
    out_dir: str,
    metrics_path: str,
    reference: str | None = None,
    arm: str | None = None,
    seed: int | None = None,
    adapters_dir: str | None = None,
    budgets_path: str | None = None,
    movement_path: str | None = None,
) -> dict:
    """Evaluate `reference`, or every budget cut of (`arm`, `seed`) found in `adapters_dir` / `budgets_path`
    (and write each cut's role movement, {budget: {role: ...}}, to `movement_path`)."""
    cfg = load_config(params_path)
    topology = cfg.reference(reference).topology if reference is not None else cfg.arm(arm).topology
    if reference is None:
        budgets = read_json(budgets_path)
        cuts = budget_cuts(budgets, cfg, budgets_path, arm, seed, backbone)
    questions = load_questions(questions_path, split="test")
    if not questions:
        raise DataError(f"{questions_path}: no questions to evaluate")
    refuse_empty_answers(questions, questions_path)  # EM and F1 would be 1 for every prediction
    retriever = open_retriever(cfg.retrieval, index_dir, questions=(questions, str(questions_path)))
    if reference is not None:
        policy = load_policy(cfg, backbone, model_dir, None)
        name = f"{reference}-{backbone}"
        with atomic_directory(out_dir) as written:  # untrained: every role is the start
            result, movement, timing = evaluate_one(cfg, name, questions, policy, retriever, topology, written)
            start = content_sha256(Path(model_dir))
            write_cell(written, {"reference": reference, "backbone": backbone, "start": start})
        write_json(metrics_path, result)
        tags = cell_tags(cfg, arm=reference, backbone=backbone, budget="none", seed="none")
        log_runs(cfg, [(name, tags, result, movement, timing, Path(out_dir))], out_dir, metrics_path)
        return result
    by_step = cuts_by_step(cuts)
    for first, *_ in by_step.values():  # every cut read before any is evaluated
        checked_adapters(Path(adapters_dir) / first, adapter_names(cfg.arm_adapters(arm)))
    check_trained_files(budgets, budgets_path, model_dir, adapters_dir)
    with atomic_directory(out_dir) as written:  # whole or absent: a later cut's failure leaves no earlier one
        results, movement, timing = evaluate_cuts(
            cfg, backbone, model_dir, arm, seed, adapters_dir, by_step, questions, retriever, written
        )
        for budget, cut in cuts.items():
            cell = {"arm": arm, "seed": seed, "backbone": backbone, "budget": budget}
            write_cell(written / budget, cell | {"start": budgets["cell"]["start"], "adapters": cut["adapters"]})
    write_json(metrics_path, dict(sorted(results.items())))
    write_json(movement_path, dict(sorted(movement.items())))
    runs = [
        (
            f"{arm}-{seed}-{backbone}-{budget}",
            cell_tags(cfg, arm=arm, seed=seed, backbone=backbone, budget=budget, step=step),
            results[budget],
            movement[budget],
            timing.get(budget, {}),  # the cuts that shared another's evaluation took no time of their own
            Path(out_dir) / budget,
        )
        for step, budgets in by_step.items()
        for budget in budgets
    ]
    log_runs(cfg, runs, out_dir, metrics_path, movement_path)
    return results


def evaluate_cuts(
    cfg: Config,
    backbone: str,
    model_dir: str,
    arm: str,
    seed: int,
    adapters_dir: str,
    by_step: dict[int, list[str]],
    questions: list[Question],
    retriever: Retriever,
    out_dir: Path,
) -> tuple[dict, dict, dict]:
    """({budget: result}, {budget: movement}, {budget: timing}) of one trained cell, a cut's adapters loaded and
    evaluated once per step (`cuts_by_step`), its records written for every budget cut there (timed once)."""
    topology = cfg.arm(arm).topology
    results, movement, timing = {}, {}, {}
    for first, *same in by_step.values():
        policy = load_policy(cfg, backbone, model_dir, str(Path(adapters_dir) / first), arm)
        results[first], movement[first], timing[first] = evaluate_one(
            cfg, f"{arm}-{seed}-{backbone}-{first}", questions, policy, retriever, topology, Path(out_dir) / first
        )
        for budget in same:  # the same adapters: evaluated once, written (and later logged) as each budget's cell
            results[budget], movement[budget] = results[first], movement[first]
            copy_evaluation(Path(out_dir) / first, Path(out_dir) / budget)
    return results, movement, timing


if __name__ == "__main__":  # a module of the flow its stage runs; run as a script it did nothing, silently
    sys.exit(f"{sys.argv[0]}: the Prefect flow `evaluate-harness`, run by its stage: python -m stages.evaluate --help")
