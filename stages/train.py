"""Stage `train@<arm>`: run the Prefect flow `train-arm` (GRPO of the arm's trainable roles, resumable)."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (its profile overlay is applied)")
    parser.add_argument("--arm", required=True, help="a key of `arms` in params")
    parser.add_argument("--model", required=True, help="input: the starting checkpoint (warmstart)")
    parser.add_argument("--index", required=True, help="input: index directory (build_index)")
    parser.add_argument("--train", required=True, help="input: training questions (JSONL)")
    parser.add_argument("--adapters", required=True, help="output: the arm's trained adapters, one folder per adapter")
    parser.add_argument("--state", required=True, help="output (persistent): training states to resume from")
    parser.add_argument("--history", required=True, help="output: per-step metrics (JSONL)")
    parser.add_argument("--metrics", required=True, help="output: summary of the run (JSON)")
    args = parser.parse_args(argv)

    from flows.training import training_flow

    summary = training_flow(args.params, args.arm, args.model, args.index, args.train, args.adapters, args.state,
                            args.history, args.metrics)
    print(f"train@{args.arm}: {summary}")


if __name__ == "__main__":
    main()
