"""Stage `compare`: every arm's evaluation records -> a comparison table (DVC metrics) and a markdown report."""

from __future__ import annotations

import argparse
from pathlib import Path

from centralrl.compare import comparison, report
from centralrl.config import load_config
from centralrl.io import atomic_write, read_json, read_jsonl, write_json


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--evals", required=True, help="input: folder with <arm>/records.jsonl per arm")
    parser.add_argument("--training", required=True, help="input: folder with <arm>.json training summaries")
    parser.add_argument("--metrics", required=True, help="output: the comparison table (JSON)")
    parser.add_argument("--report", required=True, help="output: the comparison as markdown")
    args = parser.parse_args(argv)

    cfg = load_config(args.params)
    records = {arm: [row for _, row in read_jsonl(Path(args.evals) / arm / "records.jsonl")] for arm in cfg.arms}
    training = {arm: read_json(Path(args.training) / f"{arm}.json") for arm in cfg.arms}
    table = comparison(records)
    write_json(args.metrics, table)
    with atomic_write(args.report) as handle:
        handle.write(report(table, training, cfg.profile))
    print(report(table, training, cfg.profile))


if __name__ == "__main__":
    main()
