"""The retrieval interface every backend implements: a batch of queries in, top-k passages with scores out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Hit:
    """One retrieved passage and its BM25 score (higher is better)."""

    id: str
    title: str
    text: str
    score: float


class Retriever(Protocol):
    """What the harness and the recall report need from a backend."""

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Return, for each query in order, up to `k` hits sorted by descending score."""
        ...
