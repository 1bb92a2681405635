"""Stage `evaluate@<arm>`: run the Prefect flow `evaluate-harness` for one arm (greedy, every test question)."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (its profile overlay is applied)")
    parser.add_argument("--arm", required=True, help="a key of `arms` in params (base, single_agent, central_only, ...)")
    parser.add_argument("--model", required=True, help="input: the starting checkpoint (warmstart)")
    parser.add_argument("--adapters", required=True, help="input: the arm's adapters (train@<arm>; none for a reference)")
    parser.add_argument("--index", required=True, help="input: index directory (build_index)")
    parser.add_argument("--questions", required=True, help="input: evaluation questions (JSONL)")
    parser.add_argument("--records", required=True, help="output: one JSON line per question")
    parser.add_argument("--transcripts", required=True, help="output: markdown table and readable transcripts")
    parser.add_argument("--metrics", required=True, help="output: EM/F1/Acc per benchmark and macro-average (JSON)")
    args = parser.parse_args(argv)

    from flows.evaluation import evaluation_flow

    table = evaluation_flow(args.params, args.arm, args.model, args.adapters, args.index, args.questions, args.records,
                            args.transcripts, args.metrics)
    macro = table["macro"]
    print(f"evaluate@{args.arm}: {macro['questions']} questions, macro EM {macro['em']:.4f} F1 {macro['f1']:.4f} Acc {macro['acc']:.4f}")


if __name__ == "__main__":
    main()
