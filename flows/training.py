"""Prefect flow `train-arm`: GRPO for one arm, one visible task per phase of every step (rollout, reward,
update, checkpoint), per-step metrics to MLflow and to `history.jsonl`, resuming from the newest saved state.

An arm without trainable roles (a reference such as `base`) trains nothing: its adapters folder only records
that, so `evaluate@<arm>` reads the same path for every arm.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from centralrl.config import TOPOLOGY_ROLES, ArmConfig, Config, load_config
from centralrl.errors import ConfigError
from centralrl.harness.engine import RolePolicy, pick_device
from centralrl.harness.episodes import Episode
from centralrl.io import atomic_directory, read_jsonl, write_json, write_jsonl
from centralrl.models.adapters import attach_adapters, role_adapters, save_adapters
from centralrl.models.backbone import load_backbone
from centralrl.retrieval import open_retriever
from centralrl.rl.trainer import Trainer, latest_state, restore, save_state
from centralrl.schema import Question
from centralrl.seeding import derive_seed
from centralrl.tracking import MlflowTracker


def arm_config(cfg: Config, arm: str) -> ArmConfig:
    if arm not in cfg.arms:
        raise ConfigError(f"arms has no {arm!r}; known arms: {', '.join(cfg.arms)}")
    return cfg.arms[arm]


@task(cache_policy=NO_CACHE)
def build_trainer(cfg: Config, arm: str, model_dir: str, index_dir: str, train_path: str,
                  state_dir: str) -> tuple[Trainer, list[dict]]:
    """The arm's trainer, restored from its newest saved state if there is one, and the history up to it."""
    spec = arm_config(cfg, arm)
    model, tokenizer = load_backbone(Path(model_dir), cfg.model.dtype)
    model.to(pick_device(cfg.harness.device))
    adapters = role_adapters(spec.trainable_roles, spec.sharing or cfg.lora.sharing, TOPOLOGY_ROLES[spec.topology])
    torch.manual_seed(derive_seed(cfg.seed, "lora-init"))  # every arm starts from the same adapter weights
    model = attach_adapters(model, adapters, cfg.lora)
    questions = [Question.from_json(row, where) for where, row in read_jsonl(train_path)]
    trainer = Trainer(cfg, RolePolicy(model, tokenizer, adapters, cfg.harness.batch_size),
                      open_retriever(cfg.retrieval, index_dir), questions, spec.topology, cfg.seed)
    checkpoint = latest_state(Path(state_dir))
    return trainer, restore(trainer, checkpoint) if checkpoint else []


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
def checkpoint(trainer: Trainer, state_dir: str, history: list[dict]) -> None:
    save_state(trainer, Path(state_dir), history)


@flow(name="train-arm")
def training_flow(params_path: str, arm: str, model_dir: str, index_dir: str, train_path: str, adapters_dir: str,
                  state_dir: str, history_path: str, metrics_path: str) -> dict:
    cfg = load_config(params_path)
    spec = arm_config(cfg, arm)
    if not spec.trainable_roles:
        with atomic_directory(adapters_dir) as tmp:
            write_json(tmp / "arm.json", {"arm": arm, "trainable_roles": [], "steps": 0})
        write_jsonl(history_path, [])
        write_json(Path(state_dir) / "reference.json", {"arm": arm, "steps": 0})  # nothing to resume
        summary = {"arm": arm, "steps": 0, "reference": True}
        write_json(metrics_path, summary)
        return summary
    started = time.perf_counter()
    trainer, history = build_trainer(cfg, arm, model_dir, index_dir, train_path, state_dir)
    resumed_from = trainer.step
    tracker = MlflowTracker(cfg.tracking.uri, cfg.tracking.experiment)
    with tracker.run(f"train@{arm}", tags={"stage": "train", "arm": arm, "profile": cfg.profile,
                                          "resumed_from_step": str(resumed_from)}):
        tracker.log_params({"arm": arm, **cfg.model_dump(include={"seed", "arms", "train", "lora", "harness"})})
        while trainer.step < cfg.train.grpo.steps:
            episodes = rollout(trainer)
            metrics = update(trainer, episodes, reward(trainer, episodes))
            # timings go to MLflow only: history.jsonl is a DVC output and must be the same bytes on a rerun
            history.append({"step": trainer.step, **{k: v for k, v in metrics.items() if not k.endswith("_seconds")}})
            tracker.log_metrics(metrics, step=trainer.step)
            if trainer.checkpoint_due():
                checkpoint(trainer, state_dir, history)
    write_jsonl(history_path, history)
    with atomic_directory(adapters_dir) as tmp:
        save_adapters(trainer.policy.model, tmp)
        write_json(tmp / "arm.json", {"arm": arm, "trainable_roles": spec.trainable_roles, "steps": trainer.step})
    summary = _summary(arm, history)
    write_json(metrics_path, summary)
    print(f"train@{arm}: resumed from step {resumed_from}, {time.perf_counter() - started:.0f}s in this run")
    return summary


def _summary(arm: str, history: list[dict]) -> dict:
    """What the arm's training did, from its per-step history (no wall-clock: same bytes on every rerun)."""
    totals = sorted({key for row in history for key in row if key.startswith(("trained_tokens.", "generated_tokens."))})
    return {"arm": arm, "steps": len(history),
            "first_reward_mean": history[0]["reward_mean"] if history else None,
            "final_reward_mean": history[-1]["reward_mean"] if history else None,
            **{key: sum(row.get(key, 0.0) for row in history) for key in totals}}
