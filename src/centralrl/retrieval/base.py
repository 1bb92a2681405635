"""The retrieval interface every backend implements: a batch of queries in, top-k passages with scores out.

Also the corpus content hash that every index manifest records: the sha256 of the passages as JSON lines, the
same bytes `prepare_data` writes to the corpus file, so `sha256sum data/corpus.jsonl` gives the same digest. A
corpus file is compared by the passages it holds (`corpus_file_sha256`), so a hand-made one written with other
JSON spacing or key order matches the index built from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from centralrl.io import dumps, read_jsonl
from centralrl.schema import Passage


@dataclass(frozen=True)
class Hit:
    """One retrieved passage and its score under the backend that found it (higher is better)."""

    id: str
    title: str
    text: str
    score: float


class Retriever(Protocol):
    """What the harness and the recall report need from a backend."""

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Return, for each query in order, up to `k` hits sorted by descending score."""
        ...

    def missing(self, ids: Sequence[str]) -> list[str]:
        """Those of `ids` that are no passage of the index, in order."""
        ...


def missing_from(passages: Sequence[Passage], ids: Sequence[str]) -> list[str]:
    """Those of `ids` that are no passage of `passages`, in order (the in-memory backends' `missing`).

    >>> missing_from([Passage("p1", "T", "x")], ["p2", "p1"])
    ['p2']
    """
    held = {passage.id for passage in passages}
    return [i for i in ids if i not in held]


def passage_line(passage: Passage) -> bytes:
    """The passage as one line of the corpus file."""
    return (dumps(passage.to_json()) + "\n").encode("utf-8")


def corpus_sha256(passages: Iterable[Passage]) -> str:
    """sha256 of the passages as the corpus file holds them.

    >>> corpus_sha256([]) == hashlib.sha256(b"").hexdigest()
    True
    """
    digest = hashlib.sha256()
    for passage in passages:
        digest.update(passage_line(passage))
    return digest.hexdigest()


def corpus_file_sha256(path: str | Path) -> str:
    """`corpus_sha256` of the passages a corpus file holds, read one line at a time: the file's own sha256 when
    prepare_data wrote it, and the same digest for the same passages written another way."""
    return corpus_sha256(Passage.from_json(row, where) for where, row in read_jsonl(path))
