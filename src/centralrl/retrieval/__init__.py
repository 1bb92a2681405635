"""Retrieval: one interface (`Retriever.search`: queries in, top-k hits out) and four backends.

- `bm25s`: embedded BM25 (bm25.py); `elasticsearch`: BM25 in a cluster (elastic.py);
- `dense`: an encoder and a faiss index (encoder.py, dense.py);
- `hybrid`: reciprocal rank fusion of the backends named in `retrieval.hybrid.backends` (hybrid.py).

`build_index` writes what a backend needs into an index directory (the bm25s arrays, the faiss index, for
Elasticsearch a manifest naming the cluster index it filled, for hybrid one subdirectory per fused backend);
`open_retriever` turns that directory back into a Retriever. Every directory has a `manifest.json`: the
backend, the settings the index was built with (`index_settings`), the passage count and the corpus sha256
(`base.corpus_sha256`), plus the dimension and weights digest of a dense encoder, or the url, name and uuid of
an Elasticsearch index. `open_retriever` refuses an index whose settings differ from the params (naming both
sides), one whose files disagree with its manifest (the passages' count or sha256, the k1 and b bm25s stored its
scores with), an Elasticsearch index recreated or changed since (another uuid or passage count), when given the
corpus file, one built over another corpus, and, when given questions, one that lacks their supporting passages.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from centralrl.config import BASE_BACKENDS, RetrievalConfig
from centralrl.errors import RetrievalError
from centralrl.io import read_json, write_json
from centralrl.retrieval.base import Hit, Retriever, corpus_file_sha256
from centralrl.schema import Passage, Question, examples

MANIFEST = "manifest.json"

__all__ = ["Hit", "Retriever", "build_index", "build_retrievers", "index_settings", "open_retriever", "save_index"]


def _as(cfg: RetrievalConfig, backend: str) -> RetrievalConfig:
    """The same retrieval params with another backend (a hybrid's components, compared backends)."""
    return cfg.model_copy(update={"backend": backend})


def _elasticsearch(cfg: RetrievalConfig):
    from centralrl.retrieval.elastic import ElasticsearchIndex

    return ElasticsearchIndex.from_config(cfg)


def _encoder(cfg: RetrievalConfig):
    from centralrl.retrieval.encoder import Encoder

    return Encoder.load(cfg.dense)


def _build_base(passages: Sequence[Passage], cfg: RetrievalConfig, backend: str) -> Retriever:
    if backend == "bm25s":
        from centralrl.retrieval.bm25 import Bm25sIndex

        return Bm25sIndex.build(passages, cfg.k1, cfg.b, cfg.stemming, cfg.bm25s_backend)
    if backend == "dense":
        from centralrl.retrieval.dense import DenseIndex

        return DenseIndex.build(passages, _encoder(cfg), cfg.dense)
    index = _elasticsearch(cfg)
    index.create(passages)
    return index


def _hybrid(components: dict[str, Retriever], cfg: RetrievalConfig) -> Retriever:
    from centralrl.retrieval.hybrid import HybridRetriever

    return HybridRetriever(components, cfg.hybrid)


def base_backends(cfg: RetrievalConfig, backends: Sequence[str]) -> set[str]:
    """The base backends that `backends` build: each itself, or what a hybrid fuses."""
    return {name for backend in backends for name in (cfg.hybrid.backends if backend == "hybrid" else [backend])}


def check_servers(cfg: RetrievalConfig, backends: Sequence[str]) -> None:
    """Raise `ServiceUnavailable` (after the backend's retries) when `backends` need an Elasticsearch cluster that
    does not answer: before a corpus of millions of passages is read, not after."""
    if "elasticsearch" in base_backends(cfg, backends):
        from centralrl.retrieval.elastic import ElasticsearchIndex

        with ElasticsearchIndex.from_config(cfg) as cluster:
            cluster.health()


def build_retrievers(passages: Sequence[Passage], cfg: RetrievalConfig, backends: Sequence[str]) -> dict:
    """{backend: Retriever} over `passages` for each of `backends`; each base backend is built once, and a
    hybrid fuses those same retrievers."""
    needed = base_backends(cfg, backends)
    built = {name: _build_base(passages, cfg, name) for name in BASE_BACKENDS if name in needed}
    if "hybrid" in backends:
        built["hybrid"] = _hybrid(built, cfg)
    return {backend: built[backend] for backend in backends}


def build_index(passages: Sequence[Passage], cfg: RetrievalConfig) -> Retriever:
    """Index `passages` with the configured backend: in memory, or into the cluster for Elasticsearch."""
    return build_retrievers(passages, cfg, [cfg.backend])[cfg.backend]


def index_settings(cfg: RetrievalConfig) -> dict:
    """The params an index of `cfg.backend` is built from: an index answers only under the same ones.
    Search-time params (top k, ivf_probe, hnsw_ef_search, query_prefix, hybrid weights) are not among them."""
    if cfg.backend == "hybrid":
        return {"components": sorted(cfg.hybrid.backends)}
    if cfg.backend != "dense":
        return {"k1": cfg.k1, "b": cfg.b, "stemming": cfg.stemming}
    dense = cfg.dense
    settings = {
        "encoder": dense.encoder,
        "revision": dense.revision,
        "pooling": dense.pooling,
        "passage_prefix": dense.passage_prefix,
        "max_length": dense.max_length,
        "index": dense.index,
    }
    if dense.index == "ivf":
        settings["ivf_lists"] = dense.ivf_lists
    if dense.index == "hnsw":
        settings |= {"hnsw_m": dense.hnsw_m, "hnsw_ef_construction": dense.hnsw_ef_construction}
    return settings


def save_index(index: Retriever, cfg: RetrievalConfig, passages: int, directory: str | Path) -> None:
    """Write the index directory: the backend's files (Elasticsearch keeps its own) plus the manifest."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if cfg.backend == "hybrid":
        for name, component in index.components.items():
            save_index(component, _as(cfg, name), passages, directory / name)
    elif cfg.backend != "elasticsearch":
        index.save(directory)
    manifest = {"backend": cfg.backend, "passages": passages, "corpus_sha256": index.corpus_sha256}
    manifest |= index_settings(cfg)
    if cfg.backend == "dense":
        manifest |= {"dimension": index.encoder.dimension, "encoder_sha256": index.encoder.weights_sha256}
    if cfg.backend == "elasticsearch":
        manifest |= {"url": cfg.elasticsearch.url, "index": cfg.elasticsearch.index, "index_uuid": index.uuid()}
    write_json(directory / MANIFEST, manifest)


def _refuse_mismatch(manifest: dict, wanted: dict, directory: Path, source: str = "params say") -> None:
    """Raise naming, for each key where the manifest and `wanted` differ, both values."""
    differ = [key for key, value in wanted.items() if manifest.get(key) != value]
    if differ:
        built = {key: manifest.get(key) for key in differ}
        asked = {key: wanted[key] for key in differ}
        raise RetrievalError(f"{directory}: index was built with {built}, {source} {asked}; rebuild it")


def require_index(directory: Path) -> Path:
    """The index manifest in `directory`; a missing one names the stage that writes it."""
    if not (directory / MANIFEST).is_file():
        raise RetrievalError(f"{directory}: no index manifest (run `dvc repro build_index` first)")
    return directory / MANIFEST


def open_retriever(
    cfg: RetrievalConfig,
    directory: str | Path,
    corpus: str | Path | None = None,
    questions: tuple[Sequence[Question], str] | None = None,
) -> Retriever:
    """The retriever that `build_index` left in `directory`. Refuses an index built with other settings, and,
    when `corpus` (the corpus file) is given, one built over other passages; `questions` ((questions, their file)):
    one that lacks some of their supporting passages (an index of another corpus, which the stages that are not
    given the corpus would otherwise search without a word)."""
    retriever = _open(cfg, Path(directory), corpus)
    if questions is not None:
        rows, source = questions
        wanted = list(dict.fromkeys(pid for q in rows for pid in q.supporting_passage_ids))
        missing = retriever.missing(wanted) if wanted else []
        if missing:
            raise RetrievalError(
                f"{directory}: {len(missing)} of the {len(wanted)} supporting passages of {source} are not in this "
                f"index ({examples(missing)}): an index of another corpus? Build it from these questions' corpus "
                "(`dvc repro build_index`)"
            )
    return retriever


def _open(cfg: RetrievalConfig, directory: Path, corpus: str | Path | None) -> Retriever:
    manifest = read_json(require_index(directory))
    if not isinstance(manifest, dict):
        raise RetrievalError(f"{directory / MANIFEST}: not an index manifest (a JSON object); rebuild the index")
    _refuse_mismatch(manifest, {"backend": cfg.backend, **index_settings(cfg)}, directory)
    if corpus is not None:
        wanted = {"corpus_sha256": corpus_file_sha256(corpus)}  # of the passages, whatever the file's JSON spacing
        _refuse_mismatch(manifest, wanted, directory, f"the corpus {corpus} has")
    if cfg.backend == "bm25s":
        from centralrl.retrieval.bm25 import SCORING_FILE, Bm25sIndex

        index = Bm25sIndex.load(directory, cfg.bm25s_backend)
        _refuse_mismatch(manifest, index.scored_with, directory, f"its bm25s {SCORING_FILE} has")
        return _recorded_passages(index, manifest, directory)
    if cfg.backend == "dense":
        return _recorded_passages(_open_dense(cfg, directory, manifest), manifest, directory)
    if cfg.backend == "hybrid":
        return _hybrid({name: _open(_as(cfg, name), directory / name, corpus) for name in cfg.hybrid.backends}, cfg)
    return _open_elasticsearch(cfg, directory, manifest)


def _recorded_passages(index: Retriever, manifest: dict, directory: Path) -> Retriever:
    """`index` when the passages it holds are those the manifest recorded, by count and sha256: an edited passages
    file (same count) was searched and its text shown to the roles without a word."""
    recorded = (manifest.get("passages"), manifest.get("corpus_sha256"))
    if (len(index.passages), index.corpus_sha256) != recorded:
        raise RetrievalError(
            f"{directory}: holds other passages than its {MANIFEST} recorded (edited or damaged); rebuild it"
        )
    return index


def _open_elasticsearch(cfg: RetrievalConfig, directory: Path, manifest: dict) -> Retriever:
    """The cluster index the manifest names, refused when params name another or it was recreated or changed
    since (another uuid or passage count: another build, perhaps another experiment's, replaced it)."""
    es = cfg.elasticsearch
    _refuse_mismatch(manifest, {"url": es.url, "index": es.index}, directory)
    index = _elasticsearch(cfg)
    now = {"index_uuid": index.uuid(), "passages": index.count()}
    built = {key: manifest.get(key) for key in now}
    if now != built:
        raise RetrievalError(
            f"{directory}: the cluster index {es.index} at {es.url} was rebuilt or changed since this index directory "
            f"was built (then {built}, now {now}); rebuild it"
        )
    return index


def _open_dense(cfg: RetrievalConfig, directory: Path, manifest: dict) -> Retriever:
    from centralrl.retrieval.dense import DenseIndex

    encoder = _encoder(cfg)
    source = f"encoder {encoder.name} ({encoder.folder}) has"
    _refuse_mismatch(manifest, {"encoder_sha256": encoder.weights_sha256}, directory, source)
    return DenseIndex.load(directory, encoder, cfg.dense)
