"""Stage `train@<arm>-<seed>-<backbone>`: run the Prefect flow `train-arm` for one cell of the matrix (GRPO of
the arm's trainable roles, cut at every budget, resumable).

With `train.processes: N` > 1 (params) the stage starts itself again under `accelerate launch` with N processes
on this machine; or launch it yourself (`accelerate launch --num_processes N ... -m stages.train ...`, several
machines included) with `train.processes` set to the total number of processes."""

from __future__ import annotations

import argparse
import sys

from stages.cell import check_cell
from stages.cli import InputPath, OutputFolder, run_stage, stage_parser

# what `models.adapters.save_adapters` writes per cut: each adapter's two files and peft's model card (named here,
# not imported: that module loads torch, and the command line is checked in about a second)
ADAPTER_FILES = ("*/*/adapter_config.json", "*/*/adapter_model.safetensors", "*/README.md")


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = stage_parser(__doc__)
    parser.add_argument("--arm", required=True, help="a key of `arms` in params")
    parser.add_argument("--seed", required=True, type=int, help="training seed (one of `seeds`)")
    parser.add_argument("--backbone", required=True, help="a key of `models` in params (one of `backbones`)")
    parser.add_argument("--model", type=InputPath, required=True, help="input: the starting checkpoint (warmstart)")
    parser.add_argument("--index", type=InputPath, required=True, help="input: index directory (build_index)")
    parser.add_argument("--train", type=InputPath, required=True, help="input: training questions (JSONL)")
    parser.add_output(
        "--adapters",
        "<budget>/<adapter>/ for every budget's cut",
        marks=("*/*/adapter_config.json",),
        writes=ADAPTER_FILES,
    )
    parser.add_output("--budgets", "where each budget cut the run and what it spent (JSON)", suffix=".json")
    parser.add_output("--history", "per-step metrics (JSONL)", suffix=".jsonl")
    parser.add_output("--metrics", "summary of the run (JSON)", suffix=".json")
    parser.add_argument(  # caches, not DVC outputs, but checked as outputs: outside every input and output
        "--state", type=OutputFolder, required=True, help="resume cache (not a DVC output): states, budget cuts"
    )
    parser.add_argument(
        "--start-scores",
        type=OutputFolder,
        help="cache folder shared by the backbone's cells (not a DVC output): the start's dev scores, scored by "
        "the first cell that needs them (without it, every cell scores the start)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)

    from centralrl.config import load_config
    from centralrl.distributed import World, launch, needs_launch

    cfg = load_config(args.params)
    if needs_launch(cfg.train.processes):
        sys.exit(launch(cfg.train.processes, "stages.train", sys.argv[1:] if argv is None else argv))
    from centralrl.rl.run import train_cell
    from flows.training import training_flow

    main = World.join(cfg.harness.device, cfg.train.processes).is_main
    run = training_flow if main else train_cell
    summary = run(
        args.params,
        args.arm,
        args.seed,
        args.backbone,
        args.model,
        args.index,
        args.train,
        args.adapters,
        args.budgets,
        args.state,
        args.history,
        args.metrics,
        entry=__file__,
        start_scores_dir=args.start_scores,
    )
    if main:  # every process holds the same summary: one copy on the console
        print(f"train@{args.arm}-{args.seed}-{args.backbone}: {summary}")


if __name__ == "__main__":
    run_stage(main, arguments, prefect_server=True, tracked=True, checks=check_cell)
