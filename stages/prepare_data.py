"""Stage `prepare_data`: every configured source -> train.jsonl, test.jsonl, corpus.jsonl and count metrics.

All four files are written atomically, and only after the whole dataset has loaded and passed its checks,
so a bad row anywhere leaves the previous outputs untouched. Being the first stage, it first runs the
preflight of `centralrl.plan` (GPU, hub, files, Elasticsearch, MLflow server as the profile needs them), so a
profile this machine cannot run stops here, naming what is missing, not hours later.
"""

from __future__ import annotations

from pathlib import Path

from centralrl.config import load_config
from centralrl.data.prepare import collect, counts
from centralrl.io import write_json, write_jsonl
from centralrl.plan import preflight
from stages.cli import stage_parser


def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--train", required=True, help="output: training questions (JSONL)")
    parser.add_argument("--test", required=True, help="output: evaluation questions (JSONL)")
    parser.add_argument("--corpus", required=True, help="output: passages (JSONL: id, title, text)")
    parser.add_argument("--metrics", required=True, help="output: counts per split and benchmark (JSON)")
    args = parser.parse_args(argv)

    cfg = load_config(args.params)
    missing = [check.line() for check in preflight(cfg, Path(args.params).resolve().parent) if not check.ok]
    if missing:
        raise SystemExit(f"prepare_data: this machine lacks what profile {cfg.profile!r} needs "
                         f"(python -m centralrl.plan --check lists it all):\n" + "\n".join(missing))
    dataset = collect(cfg.data)
    write_jsonl(args.train, (q.to_json() for q in dataset.split("train")))
    write_jsonl(args.test, (q.to_json() for q in dataset.split("test")))
    write_jsonl(args.corpus, (p.to_json() for p in dataset.passages))
    write_json(args.metrics, counts(dataset))
    print(f"prepare_data: {len(dataset.split('train'))} train, {len(dataset.split('test'))} test questions, "
          f"{len(dataset.passages)} passages")


if __name__ == "__main__":
    main()
