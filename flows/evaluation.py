"""Prefect flow `evaluate-harness`: greedy episodes on every test question, for a reference (the starting
checkpoint of some topology) or for every budget cut of one trained cell (arm, seed, backbone); scored and
written as per-question records, a per-benchmark table with the compute it took (DVC metrics) and one MLflow
run per evaluated cut (tables, transcripts, wall and CPU time per phase).

Cuts that fell on the same step hold the same adapters, so they are evaluated once and their records shared.
Tasks: load inputs; roll out one chunk of questions at a time (each chunk a visible task and a progress step);
score and write; log. Nothing retries: a failure here is a bug or bad input, not a flaky service.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from tqdm import tqdm

from centralrl.compute import ModelShape, accelerator_hours, peak_memory
from centralrl.config import Config, load_config
from centralrl.evaluation import benchmark_table, episode_record, markdown_table, transcript
from centralrl.harness.engine import RolePolicy, open_policy, pick_device
from centralrl.harness.episodes import TOPOLOGIES, Episode, RunSettings
from centralrl.io import atomic_write, read_json, read_jsonl, write_json, write_jsonl
from centralrl.models.adapters import adapters_of, load_adapters
from centralrl.models.backbone import load_backbone
from centralrl.retrieval import Retriever, open_retriever
from centralrl.schema import Question
from centralrl.tracking import Tracker, cell_tags, open_tracker


@task
def load_questions(path: str) -> list[Question]:
    return [Question.from_json(row, where) for where, row in read_jsonl(path)]


@task(cache_policy=NO_CACHE)
def load_policy(cfg: Config, backbone: str, model_dir: str, adapters_dir: str | None) -> RolePolicy:
    """The starting checkpoint with a cut's trained adapters (none for a reference), on `harness.engine`."""
    model, tokenizer = load_backbone(Path(model_dir), cfg.backbone(backbone).dtype)
    model = load_adapters(model, adapters_dir) if adapters_dir else model
    model.to(pick_device(cfg.harness.device))
    return open_policy(cfg.harness, model, tokenizer, adapters_of(model), model_dir)


@task(cache_policy=NO_CACHE)
def rollout(questions: list[Question], policy: RolePolicy, retriever: Retriever, topology: str, settings: RunSettings) -> list[Episode]:
    return TOPOLOGIES[topology](questions, policy, retriever, settings)


def run_all(cfg: Config, name: str, questions: list[Question], policy: RolePolicy, retriever: Retriever, topology: str) -> list[Episode]:
    h = cfg.harness
    settings = RunSettings(h.max_turns, h.max_new_tokens, h.passage_chars, cfg.retrieval.top_k, greedy=True, seed=0)
    episodes: list[Episode] = []
    for start in tqdm(range(0, len(questions), cfg.evaluate.chunk_size), desc=f"evaluate@{name}", unit="chunk"):
        episodes += rollout(questions[start : start + cfg.evaluate.chunk_size], policy, retriever, topology, settings)
    return episodes


def compute_spent(episodes: list[Episode], shape: ModelShape) -> dict[str, float]:
    """Deterministic cost of an evaluation: prompt and generated tokens per role, estimated FLOPs."""
    spent: dict[str, float] = {"flops": float(sum(e.flops(shape) for e in episodes))}
    for episode in episodes:
        for role, row in episode.tokens_by_role().items():
            for kind in ("prompt", "generated"):
                spent[f"{kind}_tokens.{role}"] = spent.get(f"{kind}_tokens.{role}", 0.0) + row[kind]
    return dict(sorted(spent.items()))


@task(cache_policy=NO_CACHE)
def write_results(episodes: list[Episode], out_dir: Path, transcripts: int) -> dict:
    records = [episode_record(e) for e in episodes]
    table = benchmark_table(records)
    write_jsonl(out_dir / "records.jsonl", records)
    with atomic_write(out_dir / "transcripts.md") as handle:
        handle.write(markdown_table(table) + "\n" + "\n".join(transcript(e) for e in _spread(episodes, transcripts)))
    return table


def _spread(episodes: list[Episode], n: int) -> list[Episode]:
    """n episodes spread over the benchmarks (the first of each, then the second, ...), for readable samples."""
    seen: dict[str, int] = {}
    ranked = []
    for episode in episodes:
        rank = seen[episode.question.benchmark] = seen.get(episode.question.benchmark, -1) + 1
        ranked.append((rank, episode))
    return [episode for _, episode in sorted(ranked, key=lambda pair: pair[0])][:n]


@task(cache_policy=NO_CACHE)
def log_run(tracker: Tracker, cfg: Config, name: str, tags: dict, result: dict, timing: dict, out_dir: Path) -> None:
    with tracker.run(f"evaluate@{name}", tags | {"stage": "evaluate"}, parent=cfg):
        tracker.log_params({**tags, **cfg.model_dump(include={"harness", "retrieval"})})
        table = result["scores"]
        tracker.log_metrics({f"{bench}.{m}": row[m] for bench, row in table.items() for m in ("em", "f1", "acc")})
        tracker.log_metrics({f"compute.{k}": v for k, v in result["compute"].items()} | timing)
        tracker.log_text(markdown_table(table), "benchmarks.md")
        tracker.log_text((out_dir / "transcripts.md").read_text(encoding="utf-8"), "transcripts.md")


def evaluate_one(cfg: Config, name: str, tags: dict, questions: list[Question], policy: RolePolicy, retriever: Retriever,
                 topology: str, out_dir: Path) -> dict:
    """Roll out, score and write one evaluation; log it with its timing; return {scores, compute}."""
    started = time.perf_counter()
    with policy.clock.phase("evaluation"):
        episodes = run_all(cfg, name, questions, policy, retriever, topology)
    result = {"scores": write_results(episodes, out_dir, cfg.tracking.transcripts),
              "compute": compute_spent(episodes, ModelShape.of(policy.model))}
    seconds = time.perf_counter() - started
    timing = policy.clock.totals() | peak_memory() | {"accelerator_hours": accelerator_hours(seconds, policy.device)}
    log_run(open_tracker(cfg.tracking), cfg, name, tags, result, timing, out_dir)
    return result


@flow(name="evaluate-harness")
def evaluation_flow(params_path: str, backbone: str, model_dir: str, index_dir: str, questions_path: str, out_dir: str,
                    metrics_path: str, reference: str | None = None, arm: str | None = None, seed: int | None = None,
                    adapters_dir: str | None = None, budgets_path: str | None = None) -> dict:
    """Evaluate `reference`, or every budget cut of (`arm`, `seed`) found in `adapters_dir` / `budgets_path`."""
    cfg = load_config(params_path)
    questions = load_questions(questions_path)
    retriever = open_retriever(cfg.retrieval, index_dir)
    if reference is not None:
        policy = load_policy(cfg, backbone, model_dir, None)
        tags = cell_tags(cfg, arm=reference, backbone=backbone, budget="none", seed="none")
        result = evaluate_one(cfg, f"{reference}-{backbone}", tags, questions, policy, retriever,
                              cfg.topology_of(reference), Path(out_dir))
        write_json(metrics_path, result)
        return result
    results = {}
    for step, (first, *same) in _cuts_by_step(read_json(budgets_path)).items():
        policy = load_policy(cfg, backbone, model_dir, str(Path(adapters_dir) / first))
        name = f"{arm}-{seed}-{backbone}"
        results[first] = evaluate_one(cfg, f"{name}-{first}", cell_tags(cfg, arm=arm, seed=seed, backbone=backbone,
                                      budget=first, step=step), questions, policy, retriever, cfg.topology_of(arm),
                                      Path(out_dir) / first)
        for budget in same:  # the same adapters: evaluated once, written and logged as each budget's cell
            results[budget] = results[first]
            _copy_evaluation(Path(out_dir) / first, Path(out_dir) / budget)
            log_run(open_tracker(cfg.tracking), cfg, f"{name}-{budget}", cell_tags(
                cfg, arm=arm, seed=seed, backbone=backbone, budget=budget, step=step), results[first], {}, Path(out_dir) / budget)
    write_json(metrics_path, dict(sorted(results.items())))
    return results


def _cuts_by_step(cuts: dict) -> dict[int, list[str]]:
    by_step: dict[int, list[str]] = {}
    for budget, cut in sorted(cuts.items()):
        by_step.setdefault(cut["step"], []).append(budget)
    return dict(sorted(by_step.items()))


def _copy_evaluation(source: Path, target: Path) -> None:
    for name in ("records.jsonl", "transcripts.md"):
        with atomic_write(target / name) as handle:
            handle.write((source / name).read_text(encoding="utf-8"))
