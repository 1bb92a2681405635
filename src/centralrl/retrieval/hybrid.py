"""Hybrid retrieval: reciprocal rank fusion (RRF) of several backends' rankings (Cormack, Clarke and Buettcher,
SIGIR 2009), so a passage that one backend ranks high and another misses still surfaces.

A passage's fused score is sum over backends of weight / (rrf_k + rank), rank counted from 1 in that backend's
top `candidates`; a backend that did not return it adds nothing. A search for more than `candidates` hits is
refused: fused from deeper lists, its top k would not be the one a search for fewer hits ranks (so a recall@k
would not measure the retriever the harness searches). Departures from the paper: per-backend weights (the
paper weighs every ranking 1; here `retrieval.hybrid.weights`, 1 each by default), and ties go to the passage
seen first (backends in `retrieval.hybrid.backends` order, then rank), so the fused order is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from centralrl.config import HybridConfig
from centralrl.errors import ConfigError
from centralrl.retrieval.base import Hit, Retriever


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hit]], weights: Sequence[float], rrf_k: int) -> list[Hit]:
    """Fuse rankings (best first) into one, best first, each hit's score replaced by its fused score.

    >>> a, b, c = (Hit(i, i, "", 0.0) for i in "abc")
    >>> fused = reciprocal_rank_fusion([[a, b], [b, c]], [1.0, 1.0], rrf_k=0)
    >>> [(h.id, round(h.score, 3)) for h in fused]  # b: 1/2 + 1/1; a: 1/1; c: 1/2
    [('b', 1.5), ('a', 1.0), ('c', 0.5)]
    """
    scores: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, hit in enumerate(ranking, start=1):
            first.setdefault(hit.id, hit)
            scores[hit.id] = scores.get(hit.id, 0.0) + weight / (rrf_k + rank)
    order = sorted(first, key=lambda pid: -scores[pid])  # stable: ties keep first-seen order
    return [Hit(pid, first[pid].title, first[pid].text, scores[pid]) for pid in order]


class HybridRetriever:
    """A `Retriever` over other retrievers (by backend name), fused with RRF."""

    def __init__(self, components: Mapping[str, Retriever], cfg: HybridConfig) -> None:
        self.components = {name: components[name] for name in cfg.backends}
        self.cfg = cfg

    @property
    def corpus_sha256(self) -> str:
        """The components' corpus digest (they are built from the same passages)."""
        return next(iter(self.components.values())).corpus_sha256

    def missing(self, ids: Sequence[str]) -> list[str]:
        """Those of `ids` that some component lacks, in order (a component folder rebuilt from another corpus)."""
        lacking = {i for component in self.components.values() for i in component.missing(ids)}
        return [i for i in ids if i in lacking]

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The top k of each query's fusion of every backend's top `candidates`; k may not exceed `candidates`."""
        if k > self.cfg.candidates:
            raise ConfigError(
                f"hybrid search for {k} hits: more than the {self.cfg.candidates} each backend contributes "
                f"(retrieval.hybrid.candidates); raise it to at least {k}"
            )
        per_backend = [component.search(queries, self.cfg.candidates) for component in self.components.values()]
        fuse = reciprocal_rank_fusion
        return [fuse(rankings, self.cfg.weights, self.cfg.rrf_k)[:k] for rankings in zip(*per_backend)]
