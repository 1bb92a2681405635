"""Stage `build_index`: run the Prefect indexing flow (load corpus, build, save, report recall@k).

The configured `retrieval.backend` is saved to --index; it and every backend of `retrieval.compare_backends`
are scored on the same questions in --metrics.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stages.cli import InputPath, run_stage, stage_parser


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = stage_parser(__doc__)
    parser.add_argument("--corpus", type=InputPath, required=True, help="input: passages (JSONL)")
    parser.add_argument(
        "--questions", type=InputPath, required=True, nargs="+", help="inputs: question files to measure recall on"
    )
    parser.add_output("--index", "index directory", marks=("manifest.json",))
    parser.add_output("--metrics", "recall@k per split and benchmark, per backend (JSON)", suffix=".json")
    args = parser.parse_args(argv)
    named: dict[str, str] = {}
    for path in args.questions:  # recall is reported per file name: two files of one name would be one entry
        other = named.setdefault(Path(path).stem, path)
        if other != path:
            parser.error(f"--questions {other} and {path} share the name {Path(path).stem!r}: rename one")
    return args


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)

    from flows.indexing import indexing_flow

    indexing_flow(args.params, args.corpus, args.questions, args.index, args.metrics)


if __name__ == "__main__":
    run_stage(main, arguments, prefect_server=True)
