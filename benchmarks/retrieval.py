"""Retrieval benchmark: bm25s queries/second with and without numba on a 100k-passage synthetic corpus,
faiss search speed per index kind, and every backend (bm25s, dense, hybrid) on the world of `--params`.

    python benchmarks/retrieval.py --out benchmarks/results/retrieval.json
    python benchmarks/retrieval.py --params <realqa params> --out benchmarks/results/retrieval_realqa.json

The bm25s throughput corpus is random text over a Zipf-distributed invented vocabulary (passages of about 60
words, like DPR's 100-word Wikipedia chunks); queries are 6-word samples from random passages. The faiss part
searches 100k clustered unit vectors of the encoder's dimension: flat (exact), ivf and hnsw with the params'
settings (hnsw built on one thread, as the dense backend builds it), and their recall of flat's top k. The
world part builds each backend over the corpus that `params.yaml` (or --params) describes with the configured
encoder (by default the shipped all-MiniLM-L6-v2, the real model, which the test suite replaces with a tiny
random BERT) and reports encode passages/s, queries/s (encoding included), index bytes, resident memory and
recall@k on the test questions. Torch threads follow `threads` in params (auto: the OMP_NUM_THREADS a
launcher sets, else the CPUs this process may use).
"""

from __future__ import annotations

import argparse
import cli
from cli import check_out, count, run_main


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__)
    parser.add_argument("--params", default="params.yaml", help="params file: its world, retrieval and threads")
    parser.add_argument(
        "--passages", type=count, default=100_000, help="synthetic passages (bm25s) and vectors (faiss)"
    )
    parser.add_argument("--queries", type=count, default=1_000, help="queries per throughput measurement")
    parser.add_argument("--repeats", type=count, default=3, help="timings per figure (the fastest is kept)")
    parser.add_argument("--k", type=count, default=5, help="hits per query (faiss recall of the exact top k)")
    parser.add_argument("--seed", type=int, default=0, help="synthetic corpus, queries and vectors")
    parser.add_argument("--skip-bm25s-throughput", action="store_true", help="only the faiss and world parts")
    parser.add_argument("--out", default="benchmarks/results/retrieval.json", help="figures (JSON)")
    args = parser.parse_args(argv)
    if args.k > args.passages:  # faiss's recall of the exact top k would divide by a k it cannot return
        parser.error(f"--k {args.k} is more than --passages {args.passages}")
    return args


if __name__ == "__main__":  # the command line before the heavy imports below: --help and usage errors at once
    ARGUMENTS = arguments()

import json
import os
import platform
import random
import resource
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
import psutil
import torch

from centralrl.config import load_config
from centralrl.data.prepare import collect
from centralrl.hardware import set_threads
from centralrl.io import write_json
from centralrl.retrieval import save_index
from centralrl.retrieval.bm25 import Bm25sIndex
from centralrl.retrieval.dense import (
    IVF_MIN_PER_LIST,
    IVF_TRAIN_PER_LIST,
    DenseIndex,
    faiss_threads,
    new_index,
    set_search_params,
)
from centralrl.retrieval.encoder import Encoder
from centralrl.retrieval.hybrid import HybridRetriever
from centralrl.retrieval.recall import recall_table
from centralrl.schema import Passage


def random_corpus(n_passages: int, words_per_passage: int, vocab_size: int, seed: int) -> list[Passage]:
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ren", "sa", "tor", "vel", "dun", "osh", "ari", "bel", "quo", "zan", "pel"]
    word_rng = random.Random(seed)
    vocab = sorted({"".join(word_rng.choices(syllables, k=word_rng.randint(2, 4))) for _ in range(vocab_size * 2)})[
        :vocab_size
    ]
    ranks = np.arange(1, len(vocab) + 1)
    weights = 1.0 / ranks**1.07
    weights /= weights.sum()
    ids = rng.choice(len(vocab), size=(n_passages, words_per_passage), p=weights)
    return [Passage(f"r{i}", vocab[row[0]], " ".join(vocab[w] for w in row)) for i, row in enumerate(ids)]


def queries_from(passages: list[Passage], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.sample(rng.choice(passages).text.split(), 6)) for _ in range(n)]


def queries_per_second(index, queries: list[str], k: int, repeats: int) -> float:
    index.search(queries[:10], k)  # warm-up (numba compiles on first use)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        index.search(queries, k)
        best = min(best, time.perf_counter() - start)
    return len(queries) / best


def throughput(args) -> dict:
    """Build one index, save it, load it with each scorer backend, and time the same query batch on each."""
    passages = random_corpus(args.passages, 60, 50_000, args.seed)
    queries = queries_from(passages, args.queries, args.seed + 1)
    start = time.perf_counter()
    index = Bm25sIndex.build(passages, 1.2, 0.75, stemming=True, backend="numpy")
    build_seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        index.save(folder)
        rates = {
            backend: queries_per_second(Bm25sIndex.load(folder, backend), queries, args.k, args.repeats)
            for backend in ("numpy", "numba")
        }
    return {
        "passages": len(passages),
        "queries": len(queries),
        "k": args.k,
        "build_seconds": round(build_seconds, 2),
        "queries_per_second_numpy": round(rates["numpy"], 1),
        "queries_per_second_numba": round(rates["numba"], 1),
        "numba_speedup": round(rates["numba"] / rates["numpy"], 2),
    }


def clustered_unit_vectors(n: int, dimension: int, clusters: int, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors around `clusters` random directions (cosine about 0.7 to their centre): embeddings cluster by
    topic, and uniform random vectors would make every approximate index look worse than it is on text."""
    centres = rng.standard_normal((clusters, dimension), dtype=np.float32)
    faiss.normalize_L2(centres)
    noise = rng.standard_normal((n, dimension), dtype=np.float32) / np.sqrt(dimension, dtype=np.float32)
    vectors = centres[rng.integers(clusters, size=n)] + noise
    faiss.normalize_L2(vectors)
    return vectors


def faiss_search(dimension: int, args) -> dict:
    """Build each faiss index kind (params' defaults) over clustered unit vectors; queries/s, recall of flat's
    top k, bytes. Queries are perturbed copies of random vectors. ivf gets params' `ivf_lists`, or as many lists
    as the vectors can train (`IVF_MIN_PER_LIST` each) when there are fewer, and is skipped below one list."""
    rng = np.random.default_rng(args.seed)
    vectors = clustered_unit_vectors(args.passages, dimension, 1000, rng)
    queries = vectors[rng.choice(args.passages, args.queries)] + rng.standard_normal(
        (args.queries, dimension), dtype=np.float32
    ) / np.sqrt(dimension, dtype=np.float32)
    faiss.normalize_L2(queries)
    cfg = load_config(args.params).retrieval.dense
    lists = min(cfg.ivf_lists, args.passages // IVF_MIN_PER_LIST)
    figures, exact = {}, None
    if lists < cfg.ivf_lists:
        figures["ivf_note"] = (
            f"params' ivf_lists {cfg.ivf_lists} needs {IVF_MIN_PER_LIST * cfg.ivf_lists} vectors, there are "
            f"{args.passages}: " + (f"ivf built with {lists} lists" if lists else "ivf skipped (not one list)")
        )
        print(f"faiss search: {figures['ivf_note']}", flush=True)
    cfg = cfg.model_copy(update={"ivf_lists": lists})
    for kind in ("flat", "ivf", "hnsw") if lists else ("flat", "hnsw"):
        kind_cfg = cfg.model_copy(update={"index": kind})
        start = time.perf_counter()
        index = new_index(kind_cfg, dimension, len(vectors))
        if kind == "ivf":
            index.train(vectors[:: max(1, len(vectors) // (IVF_TRAIN_PER_LIST * lists))])
        with faiss_threads(1 if kind == "hnsw" else None):  # as DenseIndex builds it
            index.add(vectors)
        build = time.perf_counter() - start
        set_search_params(index, kind_cfg)
        start = time.perf_counter()
        _, ids = index.search(queries, args.k)
        seconds = time.perf_counter() - start
        exact = ids if exact is None else exact
        overlap = np.mean([len(set(a) & set(b)) / args.k for a, b in zip(ids.tolist(), exact.tolist())])
        figures[kind] = {
            "build_seconds": round(build, 2),
            "queries_per_second": round(len(queries) / seconds, 1),
            f"recall_of_flat_top{args.k}": round(float(overlap), 4),
            "bytes": int(faiss.serialize_index(index).nbytes),
        }
    settings = {"ivf_lists": cfg.ivf_lists, "ivf_probe": cfg.ivf_probe, "hnsw_m": cfg.hnsw_m}
    settings |= {"hnsw_ef_construction": cfg.hnsw_ef_construction, "hnsw_ef_search": cfg.hnsw_ef_search}
    threads = {"faiss_threads": faiss.omp_get_max_threads()}
    return {"vectors": args.passages, "dimension": dimension} | threads | settings | figures


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _rss_mb() -> float:
    return round(psutil.Process().memory_info().rss / 2**20, 1)


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def world(params: str, args) -> dict:
    """Every backend over the world's corpus: build cost, speed, size, memory and recall on the test split."""
    cfg = load_config(params)
    retrieval = cfg.retrieval
    dataset = collect(cfg.data, Path(params).resolve().parent)
    passages, questions = dataset.passages, [q.question for q in dataset.questions]
    rss_start = _rss_mb()
    bm25, bm25_seconds = _timed(lambda: Bm25sIndex.build(passages, retrieval.k1, retrieval.b, retrieval.stemming))
    encoder, load_seconds = _timed(lambda: Encoder.load(retrieval.dense))
    rss_encoder = _rss_mb()
    dense, dense_seconds = _timed(lambda: DenseIndex.build(passages, encoder, retrieval.dense))
    retrievers = {
        "bm25s": bm25,
        "dense": dense,
        "hybrid": HybridRetriever({"bm25s": bm25, "dense": dense}, retrieval.hybrid),
    }
    figures = {
        "passages": len(passages),
        "query_texts": len(questions),
        "encoder": retrieval.dense.encoder,
        "dense_dimension": encoder.dimension,
        "dense_index": retrieval.dense.index,
        "encoder_parameters": sum(p.numel() for p in encoder.model.parameters()),
        "torch_threads": torch.get_num_threads(),
        "build_seconds_bm25s": round(bm25_seconds, 2),
        "encoder_load_seconds": round(load_seconds, 2),
        "build_seconds_dense": round(dense_seconds, 2),
        "encode_passages_per_second": round(len(passages) / dense_seconds, 1),
        "rss_mb_start": rss_start,
        "rss_mb_with_encoder": rss_encoder,
        "rss_mb_after_dense_build": _rss_mb(),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    with tempfile.TemporaryDirectory() as folder:
        for name in ("bm25s", "dense"):
            directory = Path(folder) / name
            save_index(retrievers[name], retrieval.model_copy(update={"backend": name}), len(passages), directory)
            figures[f"index_bytes_{name}"] = _folder_bytes(directory)
    for name, retriever in retrievers.items():  # all questions of every split, encoding included
        figures[f"queries_per_second_{name}"] = round(queries_per_second(retriever, questions, args.k, 1), 1)
    figures["recall_test_split"] = {
        name: recall_table(dataset.split("test"), retriever, retrieval.recall_ks)
        for name, retriever in retrievers.items()
    }
    return figures


def main(args: argparse.Namespace) -> None:
    check_out(args.out, args)
    set_threads(load_config(args.params).threads)
    figures = {"machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    if not args.skip_bm25s_throughput:
        figures["throughput"] = throughput(args)
    figures["world"] = world(args.params, args)
    figures["faiss_search"] = faiss_search(figures["world"]["dense_dimension"], args)
    print(json.dumps(figures, indent=2))
    write_json(args.out, figures)
    print(f"written to {args.out}")


if __name__ == "__main__":
    run_main(lambda: main(ARGUMENTS))
