"""Prefect flow `build-index`: load the corpus, build the index, save it, report recall@k per benchmark.

The DVC stage `build_index` runs this flow, so `dvc repro` decides staleness and Prefect shows the run.
Besides the configured backend, every backend in `retrieval.compare_backends` is built in memory (each base
backend once: a hybrid reuses the bm25s and dense indexes) and scored on the same questions; only the
configured one is saved. Only the build task retries (it is the one that talks to Elasticsearch when that
backend is among them). No task caches its result (a cluster's retriever cannot be pickled for the cache key:
an ERROR and its traceback in the log), and the big arguments (the corpus, the questions, the retrievers) are
`quote`d, so Prefect does not walk them looking for futures (4.9 s for 200,000 passages here).
"""

from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from centralrl.config import RetrievalConfig, load_config
from centralrl.errors import DataError, ServiceUnavailable
from centralrl.io import atomic_directory, write_json
from centralrl.retrieval import Retriever, build_retrievers, check_servers, save_index
from centralrl.retrieval.recall import check_ks, recall_table
from centralrl.schema import (
    Passage,
    Question,
    by_id,
    check_supporting_ids,
    passage_problems,
    read_passages,
    read_questions,
    refuse_rows,
)


def backends_to_measure(cfg: RetrievalConfig) -> list[str]:
    """The configured backend first, then the compared ones not already listed.

    >>> backends_to_measure(RetrievalConfig(backend="dense", compare_backends=["bm25s", "dense", "hybrid"]))
    ['dense', 'bm25s', 'hybrid']
    """
    return list(dict.fromkeys([cfg.backend, *cfg.compare_backends]))


@task(cache_policy=NO_CACHE)
def load_corpus(path: str) -> list[Passage]:
    return read_passages(path)


def _server_was_down(task, task_run, state) -> bool:
    """Retry only when the cluster did not answer; a bad request or a failed document would fail again."""
    return isinstance(state.result(raise_on_failure=False), ServiceUnavailable)


@task(retries=2, retry_delay_seconds=10, retry_condition_fn=_server_was_down, cache_policy=NO_CACHE)
def build(passages: list[Passage], cfg: RetrievalConfig) -> dict[str, Retriever]:
    return build_retrievers(passages, cfg, backends_to_measure(cfg))


@task(cache_policy=NO_CACHE)
def save(index: Retriever, cfg: RetrievalConfig, passages: int, directory: str) -> None:
    with atomic_directory(directory) as tmp:
        save_index(index, cfg, passages, tmp)


@task(cache_policy=NO_CACHE)
def report(
    retrievers: dict[str, Retriever], cfg: RetrievalConfig, questions: dict[str, list[Question]], metrics_path: str
) -> dict:
    """{split: {benchmark: row}} for the configured backend, and the same under `compare.<backend>` for the
    others."""
    tables = {
        backend: {
            split: recall_table(qs, retriever, cfg.recall_ks, cfg.query_batch_size) for split, qs in questions.items()
        }
        for backend, retriever in retrievers.items()
    }
    metrics = tables.pop(cfg.backend)
    if tables:
        metrics["compare"] = tables
    write_json(metrics_path, metrics)
    return metrics


@flow(name="build-index")
def indexing_flow(
    params_path: str, corpus_path: str, question_files: list[str], index_dir: str, metrics_path: str
) -> dict:
    config = load_config(params_path)
    cfg = config.retrieval
    check_servers(cfg, backends_to_measure(cfg))
    questions = {}  # read and checked before the build, which can take hours
    for path in question_files:
        questions[Path(path).stem] = read_questions(path)
        if not questions[Path(path).stem]:
            raise DataError(f"{path}: no questions to measure recall on")
    passages = load_corpus(corpus_path)
    # a hand-made corpus skips prepare_data's checks: these are its
    refuse_rows(passage_problems(by_id(passages), config.data.max_passage_chars), corpus_path)
    check_ks(cfg.recall_ks, len(passages), corpus_path)
    for path in question_files:
        check_supporting_ids(questions[Path(path).stem], passages, f"{path} (corpus {corpus_path})")
    retrievers = build(quote(passages), cfg)
    save(quote(retrievers[cfg.backend]), cfg, len(passages), index_dir)
    return report(quote(retrievers), cfg, quote(questions), metrics_path)


if __name__ == "__main__":  # a module of the flow its stage runs; run as a script it did nothing, silently
    sys.exit(f"{sys.argv[0]}: the Prefect flow `build-index`, run by its stage: python -m stages.build_index --help")
