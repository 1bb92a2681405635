"""Retrieval: one interface (`Retriever.search`: queries in, top-k hits out) and two BM25 backends.

`build_index` writes what a backend needs into an index directory (the bm25s arrays, or for Elasticsearch a
manifest naming the cluster index it filled); `open_retriever` turns that directory back into a Retriever.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from centralrl.config import RetrievalConfig
from centralrl.errors import RetrievalError
from centralrl.io import read_json, write_json
from centralrl.retrieval.base import Hit, Retriever
from centralrl.schema import Passage

MANIFEST = "manifest.json"

__all__ = ["Hit", "Retriever", "build_index", "open_retriever", "save_index"]


def _elasticsearch(cfg: RetrievalConfig):
    from centralrl.retrieval.elastic import ElasticsearchIndex

    return ElasticsearchIndex.from_config(cfg)


def build_index(passages: Sequence[Passage], cfg: RetrievalConfig) -> Retriever:
    """Index `passages` with the configured backend: in memory for bm25s, into the cluster for Elasticsearch."""
    if cfg.backend == "bm25s":
        from centralrl.retrieval.bm25 import Bm25sIndex

        return Bm25sIndex.build(passages, cfg.k1, cfg.b, cfg.stemming, cfg.bm25s_backend)
    index = _elasticsearch(cfg)
    index.create(passages)
    return index


def save_index(index: Retriever, cfg: RetrievalConfig, passages: int, directory: str | Path) -> None:
    """Write the index directory: bm25s arrays (Elasticsearch keeps its own) plus a manifest of the settings."""
    directory = Path(directory)
    if cfg.backend == "bm25s":
        index.save(directory)
    manifest = {"backend": cfg.backend, "passages": passages, "k1": cfg.k1, "b": cfg.b, "stemming": cfg.stemming}
    if cfg.backend == "elasticsearch":
        manifest |= {"url": cfg.elasticsearch.url, "index": cfg.elasticsearch.index}
    write_json(directory / MANIFEST, manifest)


def open_retriever(cfg: RetrievalConfig, directory: str | Path) -> Retriever:
    """The retriever that `build_index` left in `directory`; refuses an index built with other settings."""
    directory = Path(directory)
    if not (directory / MANIFEST).is_file():
        raise RetrievalError(f"{directory}: no index manifest (run `dvc repro build_index` first)")
    manifest = read_json(directory / MANIFEST)
    wanted = {"backend": cfg.backend, "k1": cfg.k1, "b": cfg.b, "stemming": cfg.stemming}
    stale = {key: manifest.get(key) for key, value in wanted.items() if manifest.get(key) != value}
    if stale:
        raise RetrievalError(f"{directory}: index was built with {stale}, params say {wanted}; rebuild it")
    if cfg.backend == "bm25s":
        from centralrl.retrieval.bm25 import Bm25sIndex

        return Bm25sIndex.load(directory, cfg.bm25s_backend)
    return _elasticsearch(cfg)
