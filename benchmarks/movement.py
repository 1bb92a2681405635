"""Movement benchmark: the evaluate stage's per-role movement (`centralrl.movement`) with the batch's common
prefix run once against every row run whole, side by side on the same greedy episodes.

    python benchmarks/movement.py --model models/main/start --index index --questions data/test.jsonl \\
        --adapters train/main/joint/seed0/adapters/equal_steps --arm joint

The episodes are the evaluation's own: the cut's adapters, greedy, on the test questions (what the evaluate
stage measures movement on). Figures: seconds per variant (each the best of `--repeats`), the ratio, the calls
measured, the mean prompt and shared-prefix tokens per batch, and how far the two variants' results differ (the
changed flags that disagree, the largest |KL difference|): the same up to float rounding.
"""

from __future__ import annotations

import argparse

import cli
from cli import check_out, count, run_main


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__)
    cli.harness_arguments(parser, start=True)
    parser.add_argument("--questions", required=True, help="questions to roll out greedily (the test split)")
    cli.cut_arguments(parser)
    parser.add_argument("--repeats", type=count, default=2, help="timed runs per variant; the best is reported")
    parser.add_argument("--threads", type=count, default=2, help="torch intra-op threads")
    parser.add_argument("--out", default="benchmarks/results/movement.json", help="figures (JSON)")
    return parser.parse_args(argv)


if __name__ == "__main__":  # the command line before the heavy imports below: --help and usage errors at once
    ARGUMENTS = arguments()

import json
import time
from pathlib import Path

import torch

from centralrl.assembly import run_settings, trained_policy
from centralrl.config import load_config
from centralrl.errors import DataError
from centralrl.harness.episodes import run_central
from centralrl.io import write_json
from centralrl.movement import batch_prefix, call_movement, movement_batches
from centralrl.retrieval import open_retriever
from centralrl.schema import read_questions


def timed(function, repeats: int) -> tuple[float, object]:
    """The best wall seconds of `repeats` calls of `function`, and its last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - started)
    return best, result


def main(args: argparse.Namespace) -> None:
    out = check_out(args.out, args)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.params)
    questions = [q for q in read_questions(args.questions) if q.split == "test"]  # inputs before the model loads
    if not Path(args.adapters).is_dir():
        where = "a cut's: train/<backbone>/<arm>/seed<s>/adapters/<budget>"
        raise DataError(f"--adapters {args.adapters}: no such folder ({where})")
    policy = trained_policy(cfg, args.backbone, args.model, args.adapters, args.arm)
    episodes = run_central(questions, policy, open_retriever(cfg.retrieval, args.index), run_settings(cfg, True, 0))
    calls = [c for e in episodes for c in e.calls if c.adapter is not None and c.completion_ids]
    pad, size = policy.tokenizer.pad_token_id, policy.batch_size
    figures = {"params": args.params, "adapters": args.adapters, "arm": args.arm, "calls": len(calls)}
    figures["threads"], figures["batch_size"] = args.threads, size
    figures["mean_prompt_tokens"] = round(sum(len(c.prompt_ids) for c in calls) / len(calls), 1)
    prefixes = [batch_prefix([calls[i] for i in batch]) for _, batch in movement_batches(calls, size)]
    figures["mean_shared_prefix_tokens"] = round(sum(prefixes) / len(prefixes), 1)
    whole_s, whole = timed(lambda: call_movement(policy.model, calls, pad, size, share_prefix=False), args.repeats)
    shared_s, shared = timed(lambda: call_movement(policy.model, calls, pad, size), args.repeats)
    figures["seconds"] = {"rows_whole": round(whole_s, 2), "prefix_shared": round(shared_s, 2)}
    figures["speedup"] = round(whole_s / shared_s, 2)
    figures["changed_flags_disagreeing"] = sum(a[0] != b[0] for a, b in zip(whole, shared))
    figures["max_abs_kl_difference"] = max(abs(a[1] - b[1]) for a, b in zip(whole, shared))
    figures["changed"] = sum(flag for flag, _ in shared)
    print(json.dumps(figures, indent=2))
    write_json(out, figures)
    print(f"written to {out}")


if __name__ == "__main__":
    run_main(lambda: main(ARGUMENTS))
