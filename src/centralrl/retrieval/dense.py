"""The dense backend: passages embedded by an encoder (`encoder.py`) in a faiss inner-product index.

Embeddings are unit vectors, so the inner product is the cosine. A passage is encoded as
`passage_prefix + title + "\\n" + text` (the string the bm25s backend scores), a query as `query_prefix + query`.
`retrieval.dense.index` picks the faiss index:
- `flat` (default): IndexFlatIP, exact. Memory: passages x dimension x 4 bytes (wiki-18 with e5-base: 65 GB).
- `ivf`: IndexIVFFlat over `ivf_lists` k-means clusters, `ivf_probe` of them searched per query. Trained on an
  evenly strided sample of 64 passages per cluster, encoded for the purpose (faiss's k-means keeps at most 256
  per cluster and warns below 39); its seed is fixed, so the clusters are the same on every run.
- `hnsw`: IndexHNSWFlat with `hnsw_m` neighbours, built with `hnsw_ef_construction`, searched with
  `hnsw_ef_search` candidates, or k when a search asks for more (a shorter list returns fewer than k hits).
  Departure from faiss's default: built on one thread. faiss's multithreaded HNSW add runs in an unspecified
  order, so the graph would differ between runs (faiss issues #983, #2548); one thread makes hnsw slow to build
  at wiki scale, where ivf is the better choice.

The directory holds `faiss.index` (faiss.write_index) and `passages.jsonl`: the same corpus, params and
machine give the same bytes. Embedding and search both run in batches (the encoder's `batch_size`; faiss
searches a whole query batch in one call).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import faiss

from centralrl.config import DenseConfig
from centralrl.errors import RetrievalError
from centralrl.io import write_jsonl
from centralrl.retrieval.base import Hit, corpus_sha256, missing_from
from centralrl.retrieval.encoder import Encoder
from centralrl.schema import Passage, read_passages

INDEX_FILE = "faiss.index"
PASSAGES_FILE = "passages.jsonl"
IVF_TRAIN_PER_LIST = 64
IVF_MIN_PER_LIST = 39  # below this faiss warns that k-means has too few points per centroid


def passage_texts(passages: Sequence[Passage]) -> list[str]:
    return [f"{p.title}\n{p.text}" for p in passages]


def new_index(cfg: DenseConfig, dimension: int, passages: int) -> faiss.Index:
    """An empty faiss index of the configured kind over inner products."""
    if cfg.index == "flat":
        return faiss.IndexFlatIP(dimension)
    if cfg.index == "hnsw":
        index = faiss.IndexHNSWFlat(dimension, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.hnsw_ef_construction
        return index
    if passages < IVF_MIN_PER_LIST * cfg.ivf_lists:
        raise RetrievalError(
            f"retrieval.dense.index ivf with {cfg.ivf_lists} lists needs at least {IVF_MIN_PER_LIST * cfg.ivf_lists} "
            f"passages to train its clusters, the corpus has {passages}; lower ivf_lists or use index: flat"
        )
    return faiss.IndexIVFFlat(faiss.IndexFlatIP(dimension), dimension, cfg.ivf_lists, faiss.METRIC_INNER_PRODUCT)


def set_search_params(index: faiss.Index, cfg: DenseConfig) -> None:
    """Search-time settings (not part of the saved index): clusters probed, or the hnsw candidate list."""
    if cfg.index == "ivf":
        faiss.ParameterSpace().set_index_parameter(index, "nprobe", cfg.ivf_probe)
    elif cfg.index == "hnsw":
        faiss.ParameterSpace().set_index_parameter(index, "efSearch", cfg.hnsw_ef_search)


@contextlib.contextmanager
def faiss_threads(count: int | None) -> Iterator[None]:
    """Run the block with `count` faiss (OpenMP) threads, then restore; None leaves them as they are."""
    before = faiss.omp_get_max_threads()
    if count is not None:
        faiss.omp_set_num_threads(count)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


class DenseIndex:
    """Passages, their unit embeddings in a faiss index, and the encoder for queries; a `Retriever`."""

    def __init__(self, index: faiss.Index, passages: list[Passage], encoder: Encoder, cfg: DenseConfig) -> None:
        if index.ntotal != len(passages) or index.d != encoder.dimension:
            raise RetrievalError(
                f"dense index holds {index.ntotal} vectors of dimension {index.d}, expected {len(passages)} "
                f"(one per passage) of dimension {encoder.dimension} (encoder {encoder.name}); rebuild it"
            )
        set_search_params(index, cfg)
        self.index, self.passages, self.encoder, self.cfg = index, passages, encoder, cfg

    @classmethod
    def build(
        cls, passages: Sequence[Passage], encoder: Encoder, cfg: DenseConfig, progress: bool = True
    ) -> DenseIndex:
        if not passages:
            raise RetrievalError("cannot build a dense index over an empty corpus")
        texts = passage_texts(passages)
        index = new_index(cfg, encoder.dimension, len(texts))
        if cfg.index == "ivf":
            stride = max(1, len(texts) // (IVF_TRAIN_PER_LIST * cfg.ivf_lists))
            index.train(encoder.encode(texts[::stride], cfg.passage_prefix))
        with faiss_threads(1 if cfg.index == "hnsw" else None):
            for embeddings in encoder.chunks(texts, cfg.passage_prefix, progress):
                index.add(embeddings)
        return cls(index, list(passages), encoder, cfg)

    def save(self, directory: str | Path) -> None:
        """Write the faiss index and the passages into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(directory / INDEX_FILE))
        write_jsonl(directory / PASSAGES_FILE, (p.to_json() for p in self.passages))

    @classmethod
    def load(cls, directory: str | Path, encoder: Encoder, cfg: DenseConfig) -> DenseIndex:
        directory = Path(directory)
        if not (directory / INDEX_FILE).is_file():
            raise RetrievalError(f"{directory}: no dense index here (run `dvc repro build_index` first)")
        passages = read_passages(directory / PASSAGES_FILE)
        return cls(faiss.read_index(str(directory / INDEX_FILE)), passages, encoder, cfg)

    @property
    def corpus_sha256(self) -> str:
        return corpus_sha256(self.passages)

    def missing(self, ids: Sequence[str]) -> list[str]:
        return missing_from(self.passages, ids)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        vectors = self.encoder.encode(queries, self.cfg.query_prefix)
        k = min(k, len(self.passages))
        hnsw = self.cfg.index == "hnsw"  # a candidate list shorter than k would return fewer than k hits
        params = faiss.SearchParametersHNSW(efSearch=max(self.cfg.hnsw_ef_search, k)) if hnsw else None
        scores, ids = self.index.search(vectors, k, params=params)
        return [self._hits(row_ids, row_scores) for row_ids, row_scores in zip(ids.tolist(), scores.tolist())]

    def _hits(self, ids: list[int], scores: list[float]) -> list[Hit]:
        hits = []
        for i, score in zip(ids, scores):
            if i >= 0:  # faiss pads with -1 when an approximate index finds fewer than k
                passage = self.passages[i]
                hits.append(Hit(passage.id, passage.title, passage.text, float(score)))
        return hits
