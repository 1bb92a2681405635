"""Retrieval benchmark: bm25s queries/second with and without numba on a 100k-passage synthetic corpus,
measured side by side on the same index and queries, and recall@k on the synthetic multi-hop world.

    python benchmarks/retrieval.py --out benchmarks/results/retrieval.json

The throughput corpus is random text over a Zipf-distributed invented vocabulary (passages of about 60
words, like DPR's 100-word Wikipedia chunks); queries are 6-word samples from random passages. Recall comes
from the world that `params.yaml` (or --params) describes, on its test questions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import random
import time

import numpy as np

from centralrl.config import load_config
from centralrl.data.prepare import collect
from centralrl.io import write_json
from centralrl.retrieval.bm25 import Bm25sIndex
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


def queries_per_second(index: Bm25sIndex, queries: list[str], k: int, repeats: int) -> float:
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


def world_recall(params: str) -> dict:
    cfg = load_config(params)
    dataset = collect(cfg.data)
    index = Bm25sIndex.build(dataset.passages, cfg.retrieval.k1, cfg.retrieval.b, cfg.retrieval.stemming)
    return recall_table(dataset.split("test"), index, cfg.retrieval.recall_ks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/retrieval.json")
    args = parser.parse_args()
    figures = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "throughput": throughput(args)}
    figures["recall_test_split"] = world_recall(args.params)
    print(json.dumps(figures, indent=2))
    write_json(args.out, figures)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
