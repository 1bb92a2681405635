"""Prefect flow `build-index`: load the corpus, build the BM25 index, save it, report recall@k per benchmark.

The DVC stage `build_index` runs this flow, so `dvc repro` decides staleness and Prefect shows the run.
Only the build task retries (it is the one that talks to Elasticsearch when that backend is chosen).
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from centralrl.config import RetrievalConfig, load_config
from centralrl.errors import ServiceUnavailable
from centralrl.io import atomic_directory, read_jsonl, write_json
from centralrl.retrieval import Retriever, build_index, save_index
from centralrl.retrieval.recall import recall_table
from centralrl.schema import Passage, read_questions


@task
def load_corpus(path: str) -> list[Passage]:
    return [Passage.from_json(row, where) for where, row in read_jsonl(path)]


def _server_was_down(task, task_run, state) -> bool:
    """Retry only when the cluster did not answer; a bad request or a failed document would fail again."""
    return isinstance(state.result(raise_on_failure=False), ServiceUnavailable)


@task(retries=2, retry_delay_seconds=10, retry_condition_fn=_server_was_down)
def build(passages: list[Passage], cfg: RetrievalConfig) -> Retriever:
    return build_index(passages, cfg)


@task
def save(index: Retriever, cfg: RetrievalConfig, passages: int, directory: str) -> None:
    with atomic_directory(directory) as tmp:
        save_index(index, cfg, passages, tmp)


@task
def report(index: Retriever, cfg: RetrievalConfig, question_files: list[str], metrics_path: str) -> dict:
    tables = {}
    for path in question_files:
        tables[Path(path).stem] = recall_table(read_questions(path), index, cfg.recall_ks, cfg.query_batch_size)
    write_json(metrics_path, tables)
    return tables


@flow(name="build-index")
def indexing_flow(
    params_path: str, corpus_path: str, question_files: list[str], index_dir: str, metrics_path: str
) -> dict:
    cfg = load_config(params_path).retrieval
    passages = load_corpus(corpus_path)
    index = build(passages, cfg)
    save(index, cfg, len(passages), index_dir)
    return report(index, cfg, question_files, metrics_path)
