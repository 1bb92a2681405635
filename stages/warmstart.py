"""Stage `warmstart@<backbone>`: the backbone -> the starting checkpoint every arm shares (optional supervised cold
start).

With `warmstart.enabled`, the first `warmstart.questions` training questions that have a decomposition (taken
round-robin over benchmarks; the synthetic world and MuSiQue provide decompositions), once the dev split and the
questions sharing a hop with it are held out (`train.dev`, centralrl.data.split), become oracle traces:
the role calls a perfect harness makes, with the harness's own prompts and the passages the index returns.
One LoRA adapter shared by all roles is trained on the traces' target tokens and merged into the weights;
the merged model and tokenizer are written to --out in the backbone layout (load_backbone reads it).
Disabled, --out is a byte-for-byte copy of --model, so later stages always read the same path.
Same inputs and params, same bytes. See centralrl.rl.warmstart for the trace format and the departures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from centralrl.config import load_config
from centralrl.io import write_json
from stages.cli import InputPath, run_stage, stage_parser


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = stage_parser(__doc__)
    parser.add_argument("--backbone", required=True, help="a key of `models` in params (its dtype is used)")
    parser.add_argument("--model", type=InputPath, required=True, help="input: backbone directory (prepare_model)")
    parser.add_argument(
        "--index", type=InputPath, required=True, help="input: index directory (build_index); unused when disabled"
    )
    parser.add_argument(
        "--train", type=InputPath, required=True, help="input: training questions (JSONL); unused when disabled"
    )
    parser.add_output("--out", "the starting checkpoint directory (backbone layout)", marks=("config.json",))
    parser.add_output("--metrics", "questions, traces, trained tokens, losses, content hash (JSON)", suffix=".json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)

    from centralrl.rl.warmstart import warmstart

    metrics = warmstart(
        load_config(args.params),
        args.backbone,
        Path(args.model),
        Path(args.index),
        Path(args.train),
        Path(args.out),
        log=print,
    )
    # wall-clock time is printed, not written: a DVC metrics file must be the same bytes on every rerun
    write_json(args.metrics, {key: value for key, value in metrics.items() if key != "seconds"})
    if metrics["enabled"]:
        print(
            f"warmstart: {metrics['questions']} questions, {metrics['traces']} traces, {metrics['trained_tokens']} "
            f"trained tokens, loss {metrics['first_loss']:.3f} -> {metrics['last_loss']:.3f} in "
            f"{metrics['seconds']:.0f}s -> {args.out}"
        )
    else:
        print(f"warmstart: disabled, backbone copied unchanged -> {args.out}")


if __name__ == "__main__":
    run_stage(main, arguments)
