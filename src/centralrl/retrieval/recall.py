"""Recall@k of gold passages, per benchmark: how often the retriever surfaces the evidence a question needs.

recall@k of a question = |supporting passages in the top-k for the question text| / |supporting passages|,
averaged over the benchmark's questions that have supporting passages (benchmarks without evidence in the
corpus, like NQ here, report only their question count). `subquestion_recall@k` asks each gold sub-question
of a decomposition instead, the upper bound a central agent that delegates perfectly would see per hop. A k
that is not below the corpus size is refused (`check_ks`): its recall is 1 by construction. A hybrid answers no
k above `retrieval.hybrid.candidates` (params refuse such recall_ks at load), so its recall@k is that of the
fusion the harness searches.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from tqdm import tqdm

from centralrl.errors import ConfigError, DataError
from centralrl.retrieval.base import Retriever
from centralrl.schema import Question


def check_ks(ks: Sequence[int], passages: int, corpus: str) -> None:
    """Refuse a k that is not below the corpus size: its top k holds every passage, so its recall is 1 by
    construction and says nothing about the retriever."""
    if passages == 0:
        raise DataError(f"{corpus}: the corpus holds no passages; nothing to index or retrieve")
    trivial = [k for k in ks if k >= passages]
    if trivial:
        raise ConfigError(
            f"retrieval.recall_ks: {trivial} not below the {passages} passages of {corpus}: a top {trivial[0]} holds "
            "every passage, so its recall would be 1 whatever the retriever does"
        )


def _batched_ids(retriever: Retriever, queries: list[str], k: int, batch_size: int, label: str) -> list[list[str]]:
    ids: list[list[str]] = []
    starts = range(0, len(queries), batch_size)
    for start in tqdm(starts, desc=f"recall: {label}", unit="batch", disable=len(starts) < 2):
        ids.extend([hit.id for hit in hits] for hits in retriever.search(queries[start : start + batch_size], k))
    return ids


def _recall(gold: Sequence[str], found: Sequence[str], k: int) -> float:
    return len(set(gold) & set(found[:k])) / len(set(gold))


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 6)


def recall_table(
    questions: Sequence[Question], retriever: Retriever, ks: Sequence[int], batch_size: int = 256
) -> dict:
    """{benchmark: {"questions": n, "with_passages": m, "recall@k": ..., "subquestion_recall@k": ...}}."""
    k_max = max(ks)
    with_gold = [q for q in questions if q.supporting_passage_ids]
    found = _batched_ids(retriever, [q.question for q in with_gold], k_max, batch_size, "questions")
    hops = [(q.benchmark, step) for q in questions for step in q.decomposition if step.passage_ids]
    hop_found = _batched_ids(retriever, [step.question for _, step in hops], k_max, batch_size, "sub-questions")

    per_question: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for q, ids in zip(with_gold, found):
        for k in ks:
            per_question[q.benchmark][k].append(_recall(q.supporting_passage_ids, ids, k))
    per_hop: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (benchmark, step), ids in zip(hops, hop_found):
        for k in ks:
            per_hop[benchmark][k].append(_recall(step.passage_ids, ids, k))

    table = {}
    for benchmark in sorted({q.benchmark for q in questions}):
        row: dict = {
            "questions": sum(q.benchmark == benchmark for q in questions),
            "with_passages": len(per_question[benchmark][ks[0]]),
        }
        for k in ks:
            if per_question[benchmark][k]:
                row[f"recall@{k}"] = _mean(per_question[benchmark][k])
            if per_hop[benchmark][k]:
                row[f"subquestion_recall@{k}"] = _mean(per_hop[benchmark][k])
        table[benchmark] = row
    return table
