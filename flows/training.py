"""Prefect flow `train-arm`: GRPO for one cell of the matrix (arm, seed, backbone), one visible task per phase
of every step (rollout, reward, update, checkpoint), cut at every budget, resuming from the newest saved state.

Outputs: one adapters folder per budget (the adapters at the step that budget was reached), the per-step
history, and what every budget's cut spent. Per-step metrics, wall-clock and CPU time per phase, and peak
memory go to an MLflow run (a child of the experiment's parent run); DVC outputs carry only deterministic
numbers, so a rerun writes the same bytes.

With `train.processes` > 1 the train stage runs under `accelerate launch`: every process runs `train_cell`
(rollouts of its share of questions, the summed update of `centralrl.distributed`); the main process runs it
inside the Prefect flow and alone logs to MLflow and writes states and outputs, the others run the same phases
as plain calls, so the Prefect UI shows one flow run per cell. The state folder must be one every process sees.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from centralrl.compute import accelerator_hours, peak_memory
from centralrl.config import TOPOLOGY_ROLES, Config, load_config
from centralrl.distributed import World
from centralrl.harness.engine import open_policy
from centralrl.harness.episodes import Episode
from centralrl.io import atomic_directory, read_jsonl, write_json, write_jsonl
from centralrl.models.adapters import attach_adapters, role_adapters
from centralrl.models.backbone import content_sha256, load_backbone
from centralrl.retrieval import open_retriever
from centralrl.rl.trainer import Progress, Trainer, latest_state, restore, save_cut, save_state, spending
from centralrl.schema import Question
from centralrl.seeding import derive_seed
from centralrl.tracking import NullTracker, Tracker, cell_tags, open_tracker


def fingerprint(cfg: Config, arm: str, seed: int, backbone: str, inputs: list[Path], code: str) -> str:
    """What makes a saved state resumable: the params that shape this run, the content of its inputs, and the
    code that runs it (a fix to the trainer must not resume a state the old trainer left)."""
    shaping = cfg.model_dump(include={"train", "lora", "harness", "budgets"}) | {
        "arm": cfg.arm(arm).model_dump(), "seed": seed, "model": cfg.backbone(backbone).model_dump(),
        "top_k": cfg.retrieval.top_k, "inputs": [content_sha256(p) if p.is_dir() else _file_sha256(p) for p in inputs],
        "code": code}
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()


def source_sha256(files: list[Path]) -> str:
    """One hash over the contents of `files`, whatever their order or the folder they were checked out in."""
    return hashlib.sha256("".join(sorted(_file_sha256(path) for path in files)).encode()).hexdigest()


def training_code() -> list[Path]:
    """The sources a training run executes: the centralrl package, this flow and the train stage."""
    import centralrl
    import stages.train

    return [*Path(centralrl.__file__).parent.rglob("*.py"), Path(__file__), Path(stages.train.__file__)]


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_trainer(cfg: Config, arm: str, seed: int, backbone: str, model_dir: str, index_dir: str, train_path: str,
                  state_dir: str, fingerprint: str, world: World) -> tuple[Trainer, Progress]:
    """The cell's trainer, restored from its newest saved state if there is one, and its progress so far."""
    spec = cfg.arm(arm)
    model, tokenizer = load_backbone(Path(model_dir), cfg.backbone(backbone).dtype)
    model.to(world.device)
    adapters = role_adapters(spec.trainable_roles, spec.sharing or cfg.lora.sharing, TOPOLOGY_ROLES[spec.topology])
    torch.manual_seed(derive_seed(seed, "lora-init"))  # every arm of a seed starts from the same adapter weights
    model = attach_adapters(model, adapters, cfg.lora)
    questions = [Question.from_json(row, where) for where, row in read_jsonl(train_path)]
    trainer = Trainer(cfg, open_policy(cfg.harness, model, tokenizer, adapters, model_dir),
                      open_retriever(cfg.retrieval, index_dir), questions, spec.topology, seed, world=world)
    if not world.is_main:
        world.barrier()  # the main process first discards a state left by other params
    checkpoint = latest_state(Path(state_dir), fingerprint)
    if world.is_main:
        world.barrier()
    return trainer, restore(trainer, checkpoint) if checkpoint else Progress([])


@dataclass(frozen=True)
class Phases:
    """The phases of a run; the main process runs them as Prefect tasks (one visible task per phase and step),
    the other processes of a multi-process run as plain calls."""

    build: Callable[..., tuple[Trainer, Progress]] = build_trainer
    rollout: Callable[[Trainer], list[Episode]] = Trainer.rollout
    reward: Callable[[Trainer, list[Episode]], torch.Tensor] = Trainer.rewards
    update: Callable[[Trainer, list[Episode], torch.Tensor], dict[str, float]] = Trainer.learn
    checkpoint: Callable[..., None] = save_state

    def as_tasks(self) -> Phases:
        return Phases(**{f.name: task(getattr(self, f.name), name=f.name, cache_policy=NO_CACHE) for f in fields(self)})


PLAIN = Phases()
TRACKED = PLAIN.as_tasks()


def cut_reached_budgets(cfg: Config, trainer: Trainer, progress: Progress, state_dir: Path, final: bool) -> None:
    """Snapshot the adapters for every budget reached at this step (at the last step, for every budget left)."""
    spent = spending(progress.history, progress.wall_seconds)
    for name, budget in cfg.budgets.items():
        if name not in progress.cuts and (final or budget.reached(spent)):
            if trainer.world.is_main:
                save_cut(trainer, state_dir, name)
            progress.cuts[name] = {"budget": budget.model_dump(exclude_none=True), "reached": budget.reached(spent),
                                   "step": trainer.step, "spent": {k: v for k, v in spent.items() if k != "wall_seconds"}}


def step_timing(trainer: Trainer, seconds: float) -> dict[str, float]:
    """The machine-dependent side of a step (MLflow only): wall and CPU seconds per phase, peak memory."""
    world = trainer.world
    timing = trainer.policy.clock.totals() | peak_memory() | {
        "step_seconds": seconds, "accelerator_hours": accelerator_hours(seconds, world.device, world.size)}
    trainer.policy.clock.reset()
    return timing


def run_steps(cfg: Config, trainer: Trainer, progress: Progress, state: Path, key: str, phases: Phases,
              tracker: Tracker) -> None:
    """Step until every budget is cut or `grpo.steps` is reached; only the main process writes."""
    while len(progress.cuts) < len(cfg.budgets) and trainer.step < cfg.train.grpo.steps:
        started = time.perf_counter()
        episodes = phases.rollout(trainer)
        metrics = phases.update(trainer, episodes, phases.reward(trainer, episodes))
        progress.history.append({"step": trainer.step, **metrics})
        # every process must see the same clock, or a wall_seconds budget would cut them at different steps
        timing = step_timing(trainer, trainer.world.slowest(time.perf_counter() - started))
        progress.wall_seconds += timing["step_seconds"]
        cut_reached_budgets(cfg, trainer, progress, state, final=trainer.step == cfg.train.grpo.steps)
        tracker.log_metrics(metrics | timing | _cumulative(progress), step=trainer.step)
        if trainer.world.is_main and (trainer.checkpoint_due() or len(progress.cuts) == len(cfg.budgets)):
            phases.checkpoint(trainer, state, progress, key)


def train_cell(params_path: str, arm: str, seed: int, backbone: str, model_dir: str, index_dir: str, train_path: str,
               adapters_dir: str, budgets_path: str, state_dir: str, history_path: str, metrics_path: str,
               phases: Phases = PLAIN) -> dict:
    """One cell's run in this process: build or resume, step, and (main process only) log and write outputs."""
    cfg = load_config(params_path)
    world = World.join(cfg.harness.device, cfg.train.processes)
    state = Path(state_dir)
    key = fingerprint(cfg, arm, seed, backbone, [Path(model_dir), Path(index_dir), Path(train_path)],
                      source_sha256(training_code()))
    trainer, progress = phases.build(cfg, arm, seed, backbone, model_dir, index_dir, train_path, state_dir, key, world)
    resumed_from = trainer.step
    tracker = open_tracker(cfg.tracking) if world.is_main else NullTracker()
    tags = cell_tags(cfg, arm=arm, seed=seed, backbone=backbone) | {"stage": "train", "resumed_from_step": str(resumed_from),
                                                                     "processes": str(world.size)}
    with tracker.run(f"train@{arm}-{seed}-{backbone}", tags, parent=cfg):
        tracker.log_params({"arm": arm, "seed": seed, "backbone": backbone,
                            **cfg.model_dump(include={"arms", "budgets", "train", "lora", "harness"})})
        run_steps(cfg, trainer, progress, state, key, phases, tracker)
        summary = _summary(arm, seed, backbone, progress)
        tracker.log_metrics({f"total.{k}": v for k, v in _cumulative(progress).items()})
        tracker.log_text(json.dumps(progress.cuts, indent=2, sort_keys=True), "budgets.json")
    if world.is_main:
        _write_outputs(progress, state, adapters_dir, budgets_path, history_path)
        write_json(metrics_path, summary)
    cuts = ", ".join(f"{name} at step {cut['step']}" for name, cut in sorted(progress.cuts.items()))
    print(f"train@{arm}-{seed}-{backbone} (process {world.rank + 1} of {world.size}): resumed from step {resumed_from}, "
          f"now at step {trainer.step}; cuts: {cuts}")
    return summary


@flow(name="train-arm")
def training_flow(params_path: str, arm: str, seed: int, backbone: str, model_dir: str, index_dir: str,
                  train_path: str, adapters_dir: str, budgets_path: str, state_dir: str, history_path: str,
                  metrics_path: str) -> dict:
    return train_cell(params_path, arm, seed, backbone, model_dir, index_dir, train_path, adapters_dir, budgets_path,
                      state_dir, history_path, metrics_path, phases=TRACKED)


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
