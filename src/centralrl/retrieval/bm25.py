"""The embedded BM25 backend: a `bm25s` index saved to and loaded from a directory.

Scoring is Lucene's BM25 (`method="lucene"`) with the same k1 and b as the Elasticsearch backend; text is
lowercased, split on words, English stop words removed and (by default) Snowball-stemmed, the closest match
to Elasticsearch's `english` analyzer. Hits with score 0 (no query term in the passage) are dropped, as
Elasticsearch returns only matching documents. The directory holds bm25s's arrays plus `passages.jsonl`,
so the index answers with titles and texts on its own.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path

import bm25s
import numpy as np

from centralrl.errors import RetrievalError
from centralrl.io import read_json, write_json, write_jsonl
from centralrl.retrieval.base import Hit, corpus_sha256, missing_from
from centralrl.schema import Passage, read_passages

logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG: "Building index from IDs objects" in logs

PASSAGES_FILE = "passages.jsonl"
SETTINGS_FILE = "centralrl_index.json"
SCORING_FILE = "params.index.json"  # bm25s's own: k1, b, method, num_docs
TIE_MARGIN = 8  # passages fetched past k, so that a tie at the cut is rarely searched again


def resolve_backend(requested: str) -> str:
    """'auto' means numba when it is installed, numpy otherwise; numba's compiled scorer is cached on disk."""
    backend = requested if requested != "auto" else "numba" if importlib.util.find_spec("numba") else "numpy"
    if backend == "numba":
        _cache_numba_scorer()
    return backend


@functools.cache
def _cache_numba_scorer() -> None:
    """Keep bm25s's compiled numba scorer in numba's on-disk cache (beside bm25s's sources, or under
    NUMBA_CACHE_DIR), which bm25s does not ask for: every process that searched compiled it again, 10.9-12.5 s
    each here (the default experiment has about 16 such processes), against 0.4-0.5 s loaded from the cache. The
    cache holds the machine code numba compiled, keyed by bm25s's source, numba's version and the CPU, so results
    are the same. The scorer is the serial one: `search` passes one thread. A bm25s without that function, or a
    folder numba cannot write, leaves compiling per process as before."""
    try:
        from bm25s.numba.retrieve_utils import _retrieve_internal_jitted_serial

        _retrieve_internal_jitted_serial.enable_caching()
    except (ImportError, RuntimeError):  # RuntimeError: numba found no writable cache folder
        return


def tokenize(texts: Sequence[str], stemming: bool) -> list[list[str]]:
    """Word tokens without English stop words, Snowball-stemmed when `stemming`."""
    stemmer = None
    if stemming:
        import Stemmer  # PyStemmer

        stemmer = Stemmer.Stemmer("english")
    return bm25s.tokenize(list(texts), stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)


def _with_sorted_vocab(documents: list[list[str]]) -> bm25s.tokenization.Tokenized:
    """Token ids from a sorted vocabulary: bm25s numbers tokens in set order, which changes with PYTHONHASHSEED
    and would make the saved index differ byte-wise between identical runs."""
    vocab = {token: number for number, token in enumerate(sorted({t for doc in documents for t in doc}))}
    return bm25s.tokenization.Tokenized(ids=[[vocab[t] for t in doc] for doc in documents], vocab=vocab)


def _damaged(directory: Path, what: str) -> RetrievalError:
    return RetrievalError(f"{directory}: a damaged bm25s index ({what}); rebuild it with build_index")


class Bm25sIndex:
    """A BM25 index over passages; `search` takes a batch of queries and returns top-k hits per query."""

    def __init__(self, model: bm25s.BM25, passages: list[Passage], stemming: bool) -> None:
        self.model = model
        self.passages = passages
        self.stemming = stemming

    @classmethod
    def build(
        cls, passages: Sequence[Passage], k1: float, b: float, stemming: bool, backend: str = "auto"
    ) -> Bm25sIndex:
        if not passages:
            raise RetrievalError("cannot build a BM25 index over an empty corpus")
        model = bm25s.BM25(k1=k1, b=b, method="lucene", backend=resolve_backend(backend))
        model.index(
            _with_sorted_vocab(tokenize([f"{p.title}\n{p.text}" for p in passages], stemming)), show_progress=False
        )
        return cls(model, list(passages), stemming)

    def save(self, directory: str | Path) -> None:
        """Write the index into `directory` (which must be empty or absent; use io.atomic_directory)."""
        directory = Path(directory)
        self.model.save(directory, show_progress=False)
        write_jsonl(directory / PASSAGES_FILE, (p.to_json() for p in self.passages))
        write_json(directory / SETTINGS_FILE, {"stemming": self.stemming, "passages": len(self.passages)})

    @classmethod
    def load(cls, directory: str | Path, backend: str = "auto") -> Bm25sIndex:
        directory = Path(directory)
        if not (directory / SETTINGS_FILE).is_file():
            raise RetrievalError(f"{directory}: no bm25s index here (run `dvc repro build_index` first)")
        settings = read_json(directory / SETTINGS_FILE)
        try:  # an array file cut short, or settings edited
            model = bm25s.BM25.load(directory, backend=resolve_backend(backend), show_progress=False)
            stemming, saved = bool(settings["stemming"]), int(settings["passages"])
        except (OSError, EOFError, ValueError, KeyError, TypeError) as error:
            raise _damaged(directory, f"{type(error).__name__}: {error}") from None
        passages = read_passages(directory / PASSAGES_FILE)
        indexed = int(model.scores["num_docs"])
        if not indexed == saved == len(passages):  # a search hitting a passage past the end would fail mid-rollout
            counts = f"{saved} in {SETTINGS_FILE}, {indexed} indexed, {len(passages)} in {PASSAGES_FILE}"
            raise _damaged(directory, f"passages: {counts}")
        return cls(model, passages, stemming)

    @property
    def scored_with(self) -> dict:
        """The k1 and b that bm25s recorded in SCORING_FILE (the stored scores were computed with them at build)."""
        return {"k1": self.model.k1, "b": self.model.b}

    @property
    def corpus_sha256(self) -> str:
        return corpus_sha256(self.passages)

    def missing(self, ids: Sequence[str]) -> list[str]:
        return missing_from(self.passages, ids)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(k, len(self.passages))
        tokens = tokenize(queries, self.stemming)
        # a query of stop words only (a model can ask "the of a") has no tokens and no hits; bm25s's numba path
        # refuses a batch whose first query has none, so only the others are searched
        searched = [i for i, query in enumerate(tokens) if query]
        hits: list[list[Hit]] = [[] for _ in queries]
        for i, (row_docs, row_scores) in zip(searched, self._ranked([tokens[i] for i in searched], k)):
            hits[i] = self._hits(row_docs[:k], row_scores[:k])
        return hits

    def _ranked(self, tokens: list[list[str]], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each query's top passages by score, equal scores by passage order, at least k and every passage that
        ties the k-th. bm25s's top-k selection orders ties as its scorer happens to (numba and numpy differently,
        which moved 58 of 660 of the world's top-3 lists), so a tie at the cut is searched deeper until the last
        passage fetched scores below the k-th, then sorted stably."""
        ranked: list[tuple[np.ndarray, np.ndarray]] = [(np.empty(0, int), np.empty(0))] * len(tokens)
        pending, fetch = list(range(len(tokens))), min(k + TIE_MARGIN, len(self.passages))
        while pending:
            documents, scores = self.model.retrieve(
                [tokens[i] for i in pending], k=fetch, show_progress=False, n_threads=1
            )
            deeper = []
            for i, row_docs, row_scores in zip(pending, documents, scores):
                if fetch < len(self.passages) and row_scores[k - 1] > 0 and row_scores[-1] == row_scores[k - 1]:
                    deeper.append(i)
                    continue
                order = np.lexsort((row_docs, -row_scores))
                ranked[i] = (row_docs[order], row_scores[order])
            pending, fetch = deeper, min(2 * fetch, len(self.passages))
        return ranked

    def _hits(self, documents: np.ndarray, scores: np.ndarray) -> list[Hit]:
        hits = []
        for doc, score in zip(documents.tolist(), scores.tolist()):
            if score > 0:
                passage = self.passages[doc]
                hits.append(Hit(passage.id, passage.title, passage.text, float(score)))
        return hits
