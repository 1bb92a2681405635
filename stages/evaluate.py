"""Stage `evaluate@<arm>-<seed>-<backbone>` (every budget cut of a trained cell) or
`evaluate_reference@<reference>-<backbone>` (an untrained harness): the Prefect flow `evaluate-harness`,
greedy, on every test question; for a trained cell also how far each role moved from the start."""

from __future__ import annotations

import argparse

from stages.cell import check_cell
from stages.cli import InputPath, run_stage, stage_parser


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = stage_parser(__doc__)
    parser.add_argument("--backbone", required=True, help="a key of `models` in params")
    parser.add_argument("--model", type=InputPath, required=True, help="input: the starting checkpoint (warmstart)")
    parser.add_argument("--index", type=InputPath, required=True, help="input: index directory (build_index)")
    parser.add_argument("--questions", type=InputPath, required=True, help="input: evaluation questions (JSONL)")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--reference", help="a key of `references`: evaluate the untrained harness")
    who.add_argument("--arm", help="a key of `arms`: evaluate every budget cut of its training (with --seed)")
    parser.add_argument("--seed", type=int, help="with --arm: the training seed (one of `seeds`)")
    parser.add_argument(
        "--adapters", type=InputPath, help="with --arm: input, the cell's adapters, one folder per budget (train)"
    )
    parser.add_argument("--budgets", type=InputPath, help="with --arm: input, where each budget cut the run (train)")
    parser.add_output(
        "--out",
        "records.jsonl, transcripts.md and cell.json (per budget for an arm)",
        marks=("records.jsonl", "*/records.jsonl"),
        writes=tuple(
            f"{where}{name}" for where in ("", "*/") for name in ("records.jsonl", "transcripts.md", "cell.json")
        ),
    )
    parser.add_output("--metrics", "EM/F1/Acc per benchmark, macro-average, compute (JSON)", suffix=".json")
    parser.add_output(
        "--movement",
        "with --arm, per budget and role the share of greedy calls changed from the start and the mean per-token "
        "KL to it (JSON)",
        suffix=".json",
        required=False,
    )
    args = parser.parse_args(argv)
    arm_only = {
        "--seed": args.seed,
        "--adapters": args.adapters,
        "--budgets": args.budgets,
        "--movement": args.movement,
    }
    if args.arm and None in arm_only.values():
        parser.error("--arm needs --seed, --adapters, --budgets and --movement")
    given = [flag for flag, value in arm_only.items() if value is not None]
    if args.reference and given:
        parser.error(f"{', '.join(given)}: only with --arm; a --reference evaluation reads no training")
    return args


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)

    from flows.evaluation import evaluation_flow

    results = evaluation_flow(
        args.params,
        args.backbone,
        args.model,
        args.index,
        args.questions,
        args.out,
        args.metrics,
        reference=args.reference,
        arm=args.arm,
        seed=args.seed,
        adapters_dir=args.adapters,
        budgets_path=args.budgets,
        movement_path=args.movement,
    )
    for name, result in ({args.reference: results} if args.reference else results).items():
        macro = result["scores"]["macro"]
        print(
            f"evaluate {name}: {macro['questions']} questions, macro EM {macro['em']:.4f} F1 {macro['f1']:.4f} Acc "
            f"{macro['acc']:.4f}"
        )


if __name__ == "__main__":
    run_stage(main, arguments, prefect_server=True, tracked=True, checks=check_cell)
