"""Prefect flow `train-arm`: GRPO for one cell of the matrix (arm, seed, backbone), one visible task per phase
of every step (rollout, reward, update, checkpoint), cut at every budget, resuming from the newest saved state.

Outputs: one adapters folder per budget (the adapters at the step that budget was reached), the per-step
history, and what every budget's cut spent. Per-step metrics, wall-clock and CPU time per phase, and peak
memory go to an MLflow run (a child of the experiment's parent run); DVC outputs carry only deterministic
numbers, so a rerun writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import torch
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from centralrl.compute import accelerator_hours, peak_memory
from centralrl.config import TOPOLOGY_ROLES, Config, load_config
from centralrl.harness.engine import RolePolicy, pick_device
from centralrl.harness.episodes import Episode
from centralrl.io import atomic_directory, read_jsonl, write_json, write_jsonl
from centralrl.models.adapters import attach_adapters, role_adapters
from centralrl.models.backbone import content_sha256, load_backbone
from centralrl.retrieval import open_retriever
from centralrl.rl.trainer import Progress, Trainer, latest_state, restore, save_cut, save_state, spending
from centralrl.schema import Question
from centralrl.seeding import derive_seed
from centralrl.tracking import cell_tags, open_tracker


def fingerprint(cfg: Config, arm: str, seed: int, backbone: str, inputs: list[Path]) -> str:
    """What makes a saved state resumable: the params that shape this run and the content of its inputs."""
    shaping = cfg.model_dump(include={"train", "lora", "harness", "budgets"}) | {
        "arm": cfg.arm(arm).model_dump(), "seed": seed, "model": cfg.backbone(backbone).model_dump(),
        "top_k": cfg.retrieval.top_k, "inputs": [content_sha256(p) if p.is_dir() else _file_sha256(p) for p in inputs]}
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@task(cache_policy=NO_CACHE)
def build_trainer(cfg: Config, arm: str, seed: int, backbone: str, model_dir: str, index_dir: str, train_path: str,
                  state_dir: str, fingerprint: str) -> tuple[Trainer, Progress]:
    """The cell's trainer, restored from its newest saved state if there is one, and its progress so far."""
    spec = cfg.arm(arm)
    model, tokenizer = load_backbone(Path(model_dir), cfg.backbone(backbone).dtype)
    model.to(pick_device(cfg.harness.device))
    adapters = role_adapters(spec.trainable_roles, spec.sharing or cfg.lora.sharing, TOPOLOGY_ROLES[spec.topology])
    torch.manual_seed(derive_seed(seed, "lora-init"))  # every arm of a seed starts from the same adapter weights
    model = attach_adapters(model, adapters, cfg.lora)
    questions = [Question.from_json(row, where) for where, row in read_jsonl(train_path)]
    trainer = Trainer(cfg, RolePolicy(model, tokenizer, adapters, cfg.harness.batch_size),
                      open_retriever(cfg.retrieval, index_dir), questions, spec.topology, seed)
    checkpoint = latest_state(Path(state_dir), fingerprint)
    return trainer, restore(trainer, checkpoint) if checkpoint else Progress([])


@task(cache_policy=NO_CACHE)
def rollout(trainer: Trainer) -> list[Episode]:
    return trainer.rollout()


@task(cache_policy=NO_CACHE)
def reward(trainer: Trainer, episodes: list[Episode]) -> torch.Tensor:
    return trainer.rewards(episodes)


@task(cache_policy=NO_CACHE)
def update(trainer: Trainer, episodes: list[Episode], rewards: torch.Tensor) -> dict[str, float]:
    return trainer.learn(episodes, rewards)


@task(cache_policy=NO_CACHE)
def checkpoint(trainer: Trainer, state_dir: str, progress: Progress, fingerprint: str) -> None:
    save_state(trainer, Path(state_dir), progress, fingerprint)


def cut_reached_budgets(cfg: Config, trainer: Trainer, progress: Progress, state_dir: Path, final: bool) -> None:
    """Snapshot the adapters for every budget reached at this step (at the last step, for every budget left)."""
    spent = spending(progress.history, progress.wall_seconds)
    for name, budget in cfg.budgets.items():
        if name not in progress.cuts and (final or budget.reached(spent)):
            save_cut(trainer, state_dir, name)
            progress.cuts[name] = {"budget": budget.model_dump(exclude_none=True), "reached": budget.reached(spent),
                                   "step": trainer.step, "spent": {k: v for k, v in spent.items() if k != "wall_seconds"}}


def step_timing(trainer: Trainer, seconds: float) -> dict[str, float]:
    """The machine-dependent side of a step (MLflow only): wall and CPU seconds per phase, peak memory."""
    timing = trainer.policy.clock.totals() | peak_memory() | {"step_seconds": seconds,
                                                               "accelerator_hours": accelerator_hours(seconds)}
    trainer.policy.clock.reset()
    return timing


@flow(name="train-arm")
def training_flow(params_path: str, arm: str, seed: int, backbone: str, model_dir: str, index_dir: str,
                  train_path: str, adapters_dir: str, budgets_path: str, state_dir: str, history_path: str,
                  metrics_path: str) -> dict:
    cfg = load_config(params_path)
    state = Path(state_dir)
    key = fingerprint(cfg, arm, seed, backbone, [Path(model_dir), Path(index_dir), Path(train_path)])
    trainer, progress = build_trainer(cfg, arm, seed, backbone, model_dir, index_dir, train_path, state_dir, key)
    resumed_from = trainer.step
    tracker = open_tracker(cfg.tracking)
    tags = cell_tags(cfg, arm=arm, seed=seed, backbone=backbone) | {"stage": "train", "resumed_from_step": str(resumed_from)}
    with tracker.run(f"train@{arm}-{seed}-{backbone}", tags, parent=cfg):
        tracker.log_params({"arm": arm, "seed": seed, "backbone": backbone,
                            **cfg.model_dump(include={"arms", "budgets", "train", "lora", "harness"})})
        while len(progress.cuts) < len(cfg.budgets) and trainer.step < cfg.train.grpo.steps:
            started = time.perf_counter()
            episodes = rollout(trainer)
            metrics = update(trainer, episodes, reward(trainer, episodes))
            progress.history.append({"step": trainer.step, **metrics})
            timing = step_timing(trainer, time.perf_counter() - started)
            progress.wall_seconds += timing["step_seconds"]
            cut_reached_budgets(cfg, trainer, progress, state, final=trainer.step == cfg.train.grpo.steps)
            tracker.log_metrics(metrics | timing | _cumulative(progress), step=trainer.step)
            if trainer.checkpoint_due() or len(progress.cuts) == len(cfg.budgets):
                checkpoint(trainer, state_dir, progress, key)
        summary = _summary(arm, seed, backbone, progress)
        tracker.log_metrics({f"total.{k}": v for k, v in _cumulative(progress).items()})
        tracker.log_text(json.dumps(progress.cuts, indent=2, sort_keys=True), "budgets.json")
    _write_outputs(progress, state, adapters_dir, budgets_path, history_path)
    write_json(metrics_path, summary)
    cuts = ", ".join(f"{name} at step {cut['step']}" for name, cut in sorted(progress.cuts.items()))
    print(f"train@{arm}-{seed}-{backbone}: resumed from step {resumed_from}, now at step {trainer.step}; cuts: {cuts}")
    return summary


def _cumulative(progress: Progress) -> dict[str, float]:
    return {f"spent.{k}": v for k, v in spending(progress.history, progress.wall_seconds).items()}


def _write_outputs(progress: Progress, state: Path, adapters_dir: str, budgets_path: str, history_path: str) -> None:
    with atomic_directory(adapters_dir) as tmp:
        for name in sorted(progress.cuts):
            shutil.copytree(state / "cuts" / name, tmp / name)
    write_json(budgets_path, progress.cuts)
    write_jsonl(history_path, progress.history)


def _summary(arm: str, seed: int, backbone: str, progress: Progress) -> dict:
    """What the cell's training did (no wall-clock: the same bytes on every rerun)."""
    history = progress.history
    totals = sorted({k for row in history for k in row if k.startswith(("trained_tokens.", "generated_tokens.", "prompt_tokens."))})
    return {"arm": arm, "seed": seed, "backbone": backbone, "steps": len(history),
            "first_reward_mean": history[0]["reward_mean"] if history else None,
            "final_reward_mean": history[-1]["reward_mean"] if history else None,
            **{k: sum(row.get(k, 0.0) for row in history) for k in totals},
            "flops": spending(history, 0.0)["flops"],
            "cuts": {name: cut["step"] for name, cut in sorted(progress.cuts.items())}}
