"""One GRPO run: one cell of the matrix (arm, seed, backbone) from its starting checkpoint to the adapters at
every budget's cut, resuming from the newest saved state.

`train_cell` builds the trainer (`centralrl.assembly` for the policy), restores the newest state the cell saved
under the same fingerprint, steps until every budget is cut, and writes the outputs: one adapters folder per budget,
the per-step history, what every budget's cut spent, and a summary. Per-step metrics, wall-clock and CPU time
per phase, and peak memory go to an MLflow run (a child of the experiment's parent run); outputs carry only
deterministic numbers, so a rerun writes the same bytes.

Budgets: a run is cut for comparison at the first step whose spending (steps, trained tokens, estimated FLOPs
of rollout generation plus update, or wall seconds) reaches each budget; the adapters at that step are the
budget's cut, and the run stops once every budget is reached (or at `grpo.steps`, which is also the lr
schedule's horizon, so every cut is a prefix of the same run).

Resume: every `checkpoint_every` steps (and once every budget is cut) the whole state is saved
(`centralrl.rl.checkpoint`). Its fingerprint covers the params that shape the run, the content of its inputs
and the code the train stage runs: the stage's entry file and every project file it imports, the same rule as
the stage's DVC deps (`centralrl.codedeps`). A state left by other params, inputs, code or machine is never resumed;
one left by another cell is refused.

The phases of a step (`Phases`: build, rollout, reward, update, checkpoint) are plain calls here; the Prefect
flow `train-arm` runs the same phases as tasks. With `train.processes` > 1 every process runs `train_cell`
(rollouts of its share of questions, the summed update of `centralrl.distributed`); only the main process logs
to MLflow and writes states and outputs. The state folder must be one every process sees.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from centralrl.assembly import fresh_policy
from centralrl.codedeps import folder_sha256, project_sources, sources_sha256
from centralrl.compute import accelerator_hours, peak_memory
from centralrl.config import Config, load_config
from centralrl.distributed import World
from centralrl.errors import DataError, OutputError
from centralrl.hardware import hardware_tags
from centralrl.harness.episodes import Episode
from centralrl.io import atomic_directory, pretty_json, read_json, write_json, write_jsonl
from centralrl.metrics import refuse_empty_answers
from centralrl.models.backbone import content_sha256
from centralrl.retrieval import open_retriever, require_index
from centralrl.rl.checkpoint import Progress, StateKey, latest_state, restore, save_cut, save_state
from centralrl.data.split import split_dev
from centralrl.rl.dev import dev_keys, dev_scores
from centralrl.rl.health import TrainingDiverged, collapse_problem, kl_problem, update_problem
from centralrl.rl.rewards import QUESTION_REWARDS
from centralrl.rl.trainer import Trainer, fixed_pool
from centralrl.schema import read_questions
from centralrl.tracking import NullTracker, Tracker, cell_tags, open_tracker


def code_sha256(entry: Path) -> str:
    """The hash of the code a run executes: `entry` (a stage's file, `<project root>/stages/<stage>.py`) and
    every project file it imports, transitively; the same files the stage's DVC deps must cover."""
    root = entry.resolve().parents[1]
    return sources_sha256(project_sources([entry], root), root)


def fingerprint(cfg: Config, arm: str, seed: int, backbone: str, inputs: list[str], code: str) -> str:
    """What makes a saved state resumable: the params that shape this run, the content of its inputs (their
    `input_hashes`), the code that runs it (a fix to the trainer must not resume a state the old trainer
    left), and the machine's part (`hardware_tags`: the thread count and the CPU's bf16, which `threads: auto`
    and `precision: auto` resolve from; a run resumed under another would match no uninterrupted run)."""
    shaping = cfg.model_dump(include={"train", "lora", "harness", "budgets"}) | {
        "arm": cfg.arm(arm).model_dump(),
        "seed": seed,
        "model": cfg.backbone(backbone).model_dump(),
        "search": search_settings(cfg),
        "inputs": inputs,
        "code": code,
        "machine": hardware_tags(),
    }
    return _sha256(shaping)


def search_settings(cfg: Config) -> dict:
    """The retrieval params that change what a search returns from a built index (the others change the index,
    an input): top_k and the dense, hybrid and Elasticsearch query settings (dvc.yaml lists the same)."""
    return cfg.retrieval.model_dump(include={"top_k", "dense", "hybrid", "elasticsearch"})


def start_scores_key(cfg: Config, backbone: str, topology: str, inputs: list[str], code: str) -> str:
    """What the start's greedy dev scores depend on: the harness, retrieval and dev params, the backbone, the
    topology, the processes that share the scoring, the content of the inputs, the code and the machine's part
    (as in `fingerprint`). Not the arm or the seed: a fresh LoRA adapter's B is zero, so the start plays exactly
    as it does without adapters, and dev episodes are greedy."""
    shaping = cfg.model_dump(include={"harness", "retrieval"}) | {
        "dev": cfg.train.dev.model_dump(),
        "processes": cfg.train.processes,
        "model": cfg.backbone(backbone).model_dump(),
        "topology": topology,
        "inputs": inputs,
        "code": code,
        "machine": hardware_tags(),
    }
    return _sha256(shaping)


def _sha256(shaping: dict) -> str:
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()


def input_hashes(paths: Sequence[Path]) -> list[str]:
    """The content hash of each input file or folder."""
    return [content_sha256(path) if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest() for path in paths]


def spending(history: Sequence[dict], wall_seconds: float) -> dict[str, float]:
    """What a run has spent after the steps in `history`, in every unit a budget can be stated in. Steps are those
    that trained (an update of `updates_per_rollout` optimizer steps): a skipped step (no group had signal) spent
    its rollout's FLOPs and time but trained nothing."""
    return {
        "steps": float(sum(not row["skipped"] for row in history)),
        "trained_tokens": sum(v for row in history for k, v in row.items() if k.startswith("trained_tokens.")),
        "flops": sum(row["flops.generation"] + row["flops.update"] for row in history),
        "wall_seconds": wall_seconds,
    }


def build_trainer(
    cfg: Config,
    arm: str,
    seed: int,
    backbone: str,
    model_dir: str,
    index_dir: str,
    train_path: str,
    state_dir: str,
    key: StateKey,
    world: World,
) -> tuple[Trainer, Progress]:
    """The cell's trainer, restored from its newest saved state if there is one, and its progress so far."""
    sifting = cfg.train.grpo.pool_filter == "informative"  # from the start's rollouts, also when resuming
    questions = read_questions(train_path, split="train")
    refuse_empty_answers(questions, str(train_path))  # the reward would be 1 for every answer
    training, dev = split_dev(questions, cfg.train.dev, str(train_path))
    retriever = open_retriever(cfg.retrieval, index_dir, questions=(questions, str(train_path)))  # before the model
    trainer = Trainer(
        cfg,
        fresh_policy(cfg, arm, seed, backbone, model_dir, world.device),
        retriever,
        fixed_pool(
            training, 0 if sifting else cfg.train.grpo.pool, cfg.train.grpo.questions_per_step, seed, str(train_path)
        ),
        cfg.arm(arm).topology,
        seed,
        world=world,
        dev=dev,
    )
    if sifting:
        trainer.sift_pool(str(train_path))
    if not world.is_main:
        world.barrier()  # the main process first discards a state left by other params
    checkpoint = latest_state(Path(state_dir), key)
    if world.is_main:
        world.barrier()
    return trainer, restore(trainer, checkpoint) if checkpoint else Progress([])


@dataclass(frozen=True)
class Phases:
    """The phases of a run, each a plain call; the Prefect flow `train-arm` swaps in the same calls as tasks."""

    build: Callable[..., tuple[Trainer, Progress]] = build_trainer
    rollout: Callable[[Trainer], list[Episode]] = Trainer.rollout
    reward: Callable[[Trainer, list[Episode]], torch.Tensor] = Trainer.rewards
    update: Callable[[Trainer, list[Episode], torch.Tensor], dict[str, float]] = Trainer.learn
    checkpoint: Callable[..., None] = save_state


PLAIN = Phases()


def ends_run(cfg: Config, progress: Progress, metrics: dict[str, float], seconds: float, step: int) -> bool:
    """Whether the step that logged `metrics` in `seconds` is the run's last: the horizon, or every budget cut once
    its spending counts (the dev split is scored there too, so the curve ends where the run does). Under
    `train.grpo.revisit` only the horizon: the batches that replay the first ones are the last."""
    if step == cfg.train.grpo.steps:
        return True
    if cfg.train.grpo.revisit:
        return False
    spent = spending([*progress.history, metrics], progress.wall_seconds + seconds)
    return all(name in progress.cuts or budget.reached(spent) for name, budget in cfg.budgets.items())


def cut_reached_budgets(cfg: Config, trainer: Trainer, progress: Progress, state_dir: Path, final: bool) -> None:
    """Snapshot the adapters for every budget reached at this step (at the last step, for every budget left)."""
    spent = spending(progress.history, progress.wall_seconds)
    for name, budget in cfg.budgets.items():
        if name not in progress.cuts and (final or budget.reached(spent)):
            if trainer.world.is_main:
                save_cut(trainer, state_dir, name)
            progress.cuts[name] = {
                "budget": budget.model_dump(exclude_none=True),
                "reached": budget.reached(spent),
                "step": trainer.step,
                "spent": {k: v for k, v in spent.items() if k != "wall_seconds"},
            }


def step_timing(trainer: Trainer, seconds: float) -> dict[str, float]:
    """The machine-dependent side of a step (MLflow only): wall and CPU seconds per phase, peak memory."""
    world = trainer.world
    timing = (
        trainer.policy.clock.totals()
        | peak_memory()
        | {"step_seconds": seconds, "accelerator_hours": accelerator_hours(seconds, world.device, world.size)}
    )
    trainer.policy.clock.reset()
    return timing


def start_scores(trainer: Trainer, memo: Path | None) -> dict[str, float]:
    """The start's dev scores: read from `memo` when another cell wrote them there (the main process reads it
    and every process gets its values), else scored, and written there by the main process. Every cell of a
    backbone plays the same greedy dev episodes from the same start, so one of them scoring is enough. A memo
    that is not those scores (a damaged cache file) is scored again and rewritten: raising in the main process
    alone would leave the others waiting in the collective."""
    world, keys = trainer.world, dev_keys(trainer.dev)
    known = _memo(memo, keys) if world.is_main and memo is not None else {}
    if world.total([float(bool(known))])[0]:
        return dict(zip(keys, world.total([known.get(key, 0.0) for key in keys])))
    scores = score_dev(trainer)
    if world.is_main and memo is not None and scores:
        write_json(memo, scores)
    return scores


def _memo(path: Path, keys: Sequence[str]) -> dict[str, float]:
    """The scores `keys` a cell left at `path`, or {} when there are none there (or it is not them)."""
    try:
        known = read_json(path) if path.is_file() else {}
    except DataError:
        return {}
    ok = isinstance(known, dict) and all(isinstance(known.get(key), float) and 0 <= known[key] <= 1 for key in keys)
    return {key: known[key] for key in keys} if ok else {}


def score_dev(trainer: Trainer) -> dict[str, float]:
    """The current policy's greedy dev scores (`centralrl.rl.dev`), or none without a dev split. Each process
    scores its share of the questions and every process gets the totals."""
    if not trainer.dev:
        return {}
    with trainer.policy.clock.phase("dev"):
        return dev_scores(trainer.cfg, trainer.policy, trainer.retriever, trainer.dev, trainer.topology, trainer.world)


def step_line(step: int, steps: int, group_size: int, metrics: dict[str, float], seconds: float) -> str:
    """One step's progress for the console: reward, informative groups, dev F1 when scored, time.

    >>> step_line(3, 8, 4, {"reward_mean": 0.3125, "informative_groups": 2.0, "episodes": 16.0, "dev.f1": 0.31}, 41.6)
    'step 3/8: reward 0.312, informative groups 2 of 4, dev F1 0.310 (42s)'
    """
    dev = f", dev F1 {metrics['dev.f1']:.3f}" if "dev.f1" in metrics else ""
    groups = metrics["episodes"] / group_size
    return (
        f"step {step}/{steps}: reward {metrics['reward_mean']:.3f}, informative groups "
        f"{metrics['informative_groups']:.0f} of {groups:.0f}{dev} ({seconds:.0f}s)"
    )


def run_steps(
    cfg: Config,
    trainer: Trainer,
    progress: Progress,
    state: Path,
    key: StateKey,
    phases: Phases,
    tracker: Tracker,
    log: Callable[[str], None] | None = None,
    memo: Path | None = None,
) -> None:
    """Step until every budget is cut (under `revisit`, on to the replayed batches) or `grpo.steps` is reached;
    only the main process writes. `log` gets a line per step; `memo` is where the start's dev scores are shared
    between cells (`start_scores`)."""
    start = start_scores(trainer, memo) if not progress.history else {}  # kept in the first step's row
    if start:
        tracker.log_metrics(start, step=0)
    g = cfg.train.grpo
    while (len(progress.cuts) < len(cfg.budgets) or g.revisit) and trainer.step < g.steps:
        started = time.perf_counter()
        episodes = phases.rollout(trainer)
        metrics = phases.update(trainer, episodes, phases.reward(trainer, episodes))
        if not progress.history and trainer.pool_flops:  # the first step pays for choosing the pool
            metrics |= {"flops.pool": trainer.pool_flops}
            metrics["flops.generation"] += trainer.pool_flops
        # scoring the dev split is not training: no budget pays for it; every process must see the same clock, or
        # a wall_seconds budget would cut them at different steps
        seconds = trainer.world.slowest(time.perf_counter() - started)
        if trainer.step % cfg.train.dev.every == 0 or ends_run(cfg, progress, metrics, seconds, trainer.step):
            metrics |= score_dev(trainer)
        progress.history.append({"step": trainer.step, **metrics, **{f"{k}@start": v for k, v in start.items()}})
        progress.history[-1]["spent.flops"] = spending(progress.history, 0.0)["flops"]  # the dev curve's x
        start = {}
        timing = step_timing(trainer, seconds)
        progress.wall_seconds += timing["step_seconds"]
        scalars = {k: v for k, v in metrics.items() if k != QUESTION_REWARDS}
        tracker.log_metrics(scalars | timing | _cumulative(progress), step=trainer.step)
        if log:
            log(step_line(trainer.step, g.steps, g.group_size, metrics, timing["step_seconds"]))
        _stop_if_diverged(cfg, metrics, progress.history, trainer.step, state, trainer.world.is_main)
        cut_reached_budgets(cfg, trainer, progress, state, final=trainer.step == g.steps)
        all_cut = len(progress.cuts) == len(cfg.budgets)
        if trainer.world.is_main and (trainer.step % cfg.train.grpo.checkpoint_every == 0 or all_cut):
            phases.checkpoint(trainer, state, progress, key)


def _stop_if_diverged(
    cfg: Config, metrics: dict[str, float], history: list[dict], step: int, state: Path, is_main: bool
) -> None:
    """Raise `TrainingDiverged` when a monitor (`centralrl.rl.health`) finds a problem at `step`, naming the state
    a rerun resumes from. The KL is that of the policy the step started from, so the KL monitor also sets aside the
    state saved after the step before (the main process moves it out of `step-*`: never resumed), and says what is
    known of the newest kept one: whether its KL was measured (`history`: the steps with a "kl"), else when the KL
    was last measured under the limit (without a KL term only every `train.health.kl_every` steps)."""
    health = cfg.train.health
    kl = kl_problem(metrics, health.max_kl)
    update = update_problem(metrics)
    problem = kl or update or collapse_problem(history, health.dead_questions, cfg.train.grpo.questions_per_step)
    if not problem:
        return
    saved = sorted(state.glob("step-*"))
    why = "nothing of this step was saved"
    if kl:
        why = "the KL is measured before this step's update, so it is that of the policy the step started from"
        judged = state / f"step-{step - 1:06d}"
        if judged in saved:
            saved.remove(judged)
            aside = state / f"past-max-kl-{judged.name}"
            if is_main:
                shutil.rmtree(aside, ignore_errors=True)  # left by an earlier run that stopped here
                judged.rename(aside)
            why += f": {judged.name}, now set aside as {aside.name} (never resumed)"
    newest = saved[-1] if saved else "none (a rerun starts from step 0)"
    if kl:
        kept = f"{why}; the newest kept state is {newest}" + (_kl_known(history, step, saved[-1]) if saved else "")
    elif update:
        kept = f"{why}; the last good state is {newest}"
    else:
        kept = (
            f"the newest state, {newest}, is kept for inspection: the zero-reward steps skipped their updates, so a "
            f"state saved during them plays the policy that scored 0"
        )
    raise TrainingDiverged(
        f"training diverged at step {step}: {problem}; {kept}; lower train.grpo.learning_rate or check the step's "
        f"metrics in MLflow"
    )


def _kl_known(history: list[dict], step: int, newest: Path) -> str:
    """What the KL monitor knows of the newest kept state when it trips at `step`: the KL a step logs is that of the
    state saved after the step before, and the earlier measurements were all under the limit."""
    measured = [row["step"] for row in history if "kl" in row and row["step"] < step]
    judged_at = int(newest.name.removeprefix("step-")) + 1  # the step whose KL would be this state's
    if judged_at in measured:
        return f", whose KL was measured under the limit at step {judged_at}"
    if not measured:
        return f", whose KL was not measured (no KL was measured before step {step})"
    last = measured[-1]
    policy = "the starting policy" if last == 1 else f"the policy saved after step {last - 1}"
    return f", whose KL was not measured (the KL was last measured under the limit at step {last}, that of {policy})"


def train_cell(
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
    phases: Phases = PLAIN,
    start_scores_dir: str | None = None,
) -> dict:
    """One cell's run in this process: build or resume, step, and (main process only) log and write outputs.
    `entry` is the file of the stage that runs it: the code fingerprint starts there. `start_scores_dir`, a
    cache folder shared by a backbone's cells, keeps the start's dev scores under a key of what they depend on
    (`start_scores_key`): the first cell scores the start, the others read it."""
    cfg = load_config(params_path)
    world = World.join(cfg.harness.device, cfg.train.processes)
    state = Path(state_dir)
    if state.exists() and not state.is_dir():  # found at the first save, after a step's work
        raise OutputError(f"--state {state}: a file, not a folder for the training states")
    require_index(Path(index_dir))  # before hashing it: a missing index names the stage that builds it
    inputs, code = input_hashes([Path(model_dir), Path(index_dir), Path(train_path)]), code_sha256(Path(entry))
    key = StateKey(arm, seed, backbone, fingerprint(cfg, arm, seed, backbone, inputs, code))
    memo = None
    if start_scores_dir is not None:
        topology = cfg.arm(arm).topology
        memo = Path(start_scores_dir) / f"{start_scores_key(cfg, backbone, topology, inputs, code)}.json"
    trainer, progress = phases.build(cfg, arm, seed, backbone, model_dir, index_dir, train_path, state_dir, key, world)
    resumed_from = trainer.step
    tracker = open_tracker(cfg.tracking) if world.is_main else NullTracker()
    tags = cell_tags(cfg, arm=arm, seed=seed, backbone=backbone) | {
        "stage": "train",
        "resumed_from_step": str(resumed_from),
        "processes": str(world.size),
    }
    with tracker.run(f"train@{arm}-{seed}-{backbone}", tags, parent=cfg):
        tracker.log_params(
            {
                "arm": arm,
                "seed": seed,
                "backbone": backbone,
                **cfg.model_dump(include={"arms", "budgets", "train", "lora", "harness"}),
            }
        )
        label = f"train@{arm}-{seed}-{backbone}"
        if world.is_main and resumed_from:
            print(f"{label} resumed from its saved step {resumed_from}", flush=True)
        log = functools.partial(print, label, flush=True) if world.is_main else None
        if log and trainer.pool_flops:
            chosen = f"{len(trainer.questions)} questions the start sometimes solves"
            log(f"pool: {chosen} ({trainer.pool_flops:.3g} FLOPs of rollouts to find)")
        run_steps(cfg, trainer, progress, state, key, phases, tracker, log, memo)
        summary = _summary(arm, seed, backbone, progress)
        if world.is_main:  # written before the last logs: a tracking store that fails there leaves them whole
            cell = {"arm": arm, "seed": seed, "backbone": backbone, "start": inputs[0]}
            budgets = budgets_document(cell, progress, state)
            _write_outputs(progress, state, adapters_dir, history_path)
            write_json(budgets_path, budgets)
            write_json(metrics_path, summary)
        tracker.log_metrics({f"total.{k}": v for k, v in _cumulative(progress).items()})
        if world.is_main:
            tracker.log_text(pretty_json(budgets), "budgets.json")
    cuts = ", ".join(
        f"{name} at step {cut['step']}{'' if cut['reached'] else ' (not reached: the last step)'}"
        for name, cut in sorted(progress.cuts.items())
    )
    began = f"resumed from step {resumed_from}" if resumed_from else "started at step 0"
    print(
        f"train@{arm}-{seed}-{backbone} (process {world.rank + 1} of {world.size}): {began}, now at step "
        f"{trainer.step}; cuts: {cuts}"
    )
    return summary


def _cumulative(progress: Progress) -> dict[str, float]:
    return {f"spent.{k}": v for k, v in spending(progress.history, progress.wall_seconds).items()}


def budgets_document(cell: dict, progress: Progress, state: Path) -> dict:
    """budgets.json: the cell (arm, seed, backbone and the start's `content_sha256`) and each budget's cut with
    the `folder_sha256` of its adapters, so that evaluate can refuse a start or adapters this run did not use."""
    cuts = {name: cut | {"adapters": folder_sha256(state / "cuts" / name)} for name, cut in progress.cuts.items()}
    return {"cell": cell, "cuts": dict(sorted(cuts.items()))}


def _write_outputs(progress: Progress, state: Path, adapters_dir: str, history_path: str) -> None:
    with atomic_directory(adapters_dir) as tmp:
        for name in sorted(progress.cuts):
            shutil.copytree(state / "cuts" / name, tmp / name)
    write_jsonl(history_path, progress.history)


def _summary(arm: str, seed: int, backbone: str, progress: Progress) -> dict:
    """What the cell's training did (no wall-clock: the same bytes on every rerun)."""
    history = progress.history
    token_kinds = ("trained_tokens.", "generated_tokens.", "prompt_tokens.")
    totals = sorted({k for row in history for k in row if k.startswith(token_kinds)})
    return {
        "arm": arm,
        "seed": seed,
        "backbone": backbone,
        "steps": len(history),
        "skipped_steps": sum(int(row["skipped"]) for row in history),
        "first_reward_mean": history[0]["reward_mean"] if history else None,
        "final_reward_mean": history[-1]["reward_mean"] if history else None,
        **{k: sum(row.get(k, 0.0) for row in history) for k in totals},
        "flops": spending(history, 0.0)["flops"],
        "cuts": {name: cut["step"] for name, cut in sorted(progress.cuts.items())},
    }
