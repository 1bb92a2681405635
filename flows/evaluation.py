"""Prefect flow `evaluate-harness`: greedy episodes of one arm on every test question, scored
and written as per-question records, a per-benchmark table (DVC metrics) and an MLflow run with transcripts.

Tasks: load inputs; roll out one chunk of questions at a time (each chunk a visible task and a progress step);
score and write; log to the tracker. Nothing retries: a failure here is a bug or bad input, not a flaky service.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from tqdm import tqdm

from centralrl.config import Config, load_config
from flows.training import arm_config
from centralrl.evaluation import benchmark_table, episode_record, markdown_table, transcript
from centralrl.harness.engine import RolePolicy, pick_device
from centralrl.harness.episodes import TOPOLOGIES, Episode, RunSettings
from centralrl.io import atomic_write, read_jsonl, write_json, write_jsonl
from centralrl.models.adapters import adapters_of, load_adapters
from centralrl.models.backbone import load_backbone
from centralrl.retrieval import Retriever, open_retriever
from centralrl.schema import Question
from centralrl.tracking import MlflowTracker, Tracker


@task
def load_questions(path: str) -> list[Question]:
    return [Question.from_json(row, where) for where, row in read_jsonl(path)]


@task(cache_policy=NO_CACHE)
def load_policy(cfg: Config, model_dir: str, adapters_dir: str) -> RolePolicy:
    """The starting checkpoint with the arm's trained adapters (none for a reference arm)."""
    model, tokenizer = load_backbone(Path(model_dir), cfg.model.dtype)
    model = load_adapters(model, adapters_dir)
    model.to(pick_device(cfg.harness.device))
    return RolePolicy(model, tokenizer, adapters_of(model), cfg.harness.batch_size)


@task(cache_policy=NO_CACHE)
def rollout(questions: list[Question], policy: RolePolicy, retriever: Retriever, topology: str, settings: RunSettings) -> list[Episode]:
    return TOPOLOGIES[topology](questions, policy, retriever, settings)


@task(cache_policy=NO_CACHE)
def write_results(episodes: list[Episode], records_path: str, transcripts_path: str, metrics_path: str, transcripts: int) -> dict:
    records = [episode_record(e) for e in episodes]
    table = benchmark_table(records)
    write_jsonl(records_path, records)
    write_json(metrics_path, table)
    with atomic_write(transcripts_path) as handle:
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
def log_run(tracker: Tracker, cfg: Config, arm: str, table: dict, transcripts_path: str) -> None:
    with tracker.run(f"evaluate@{arm}", tags={"stage": "evaluate", "arm": arm, "profile": cfg.profile}):
        tracker.log_params({"arm": arm, **cfg.model_dump(include={"profile", "seed", "model", "harness", "retrieval", "arms"})})
        tracker.log_metrics({f"{bench}.{m}": row[m] for bench, row in table.items() for m in ("em", "f1", "acc")})
        tracker.log_text(markdown_table(table), "benchmarks.md")
        tracker.log_text(Path(transcripts_path).read_text(encoding="utf-8"), "transcripts.md")


@flow(name="evaluate-harness")
def evaluation_flow(params_path: str, arm: str, model_dir: str, adapters_dir: str, index_dir: str, questions_path: str,
                    records_path: str, transcripts_path: str, metrics_path: str) -> dict:
    cfg = load_config(params_path)
    topology = arm_config(cfg, arm).topology
    questions = load_questions(questions_path)
    policy = load_policy(cfg, model_dir, adapters_dir)
    retriever = open_retriever(cfg.retrieval, index_dir)
    h = cfg.harness
    settings = RunSettings(h.max_turns, h.max_new_tokens, h.passage_chars, cfg.retrieval.top_k, greedy=True, seed=cfg.seed)
    episodes: list[Episode] = []
    chunks = range(0, len(questions), cfg.evaluate.chunk_size)
    for start in tqdm(chunks, desc=f"evaluate@{arm}", unit="chunk"):
        episodes += rollout(questions[start : start + cfg.evaluate.chunk_size], policy, retriever, topology, settings)
    table = write_results(episodes, records_path, transcripts_path, metrics_path, cfg.tracking.transcripts)
    log_run(MlflowTracker(cfg.tracking.uri, cfg.tracking.experiment), cfg, arm, table, transcripts_path)
    return table
