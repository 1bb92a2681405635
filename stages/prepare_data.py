"""Stage `prepare_data`: every configured source -> train.jsonl, test.jsonl, corpus.jsonl and count metrics.

The four files are written to temporaries only after the whole dataset has loaded and passed its checks, and
replace the previous outputs together once all four are complete; text UTF-8 cannot encode (a lone surrogate)
is refused naming the row before any output is replaced, so a bad row anywhere leaves the previous outputs
untouched (when run by hand: `dvc repro` deletes a stage's outputs before it runs). Being the first stage, it
first runs the preflight of `centralrl.plan` (GPU, hub, files, Elasticsearch, MLflow server as the profile needs
them), so a profile this machine cannot run stops here, naming what is missing, not hours later.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from centralrl.config import DataConfig, load_config
from centralrl.data.prepare import collect, counts, source_files
from centralrl.data.split import training_left
from centralrl.errors import ConfigError, DataError
from centralrl.io import atomic_files, pretty_json, write_rows
from centralrl.plan import params_dvc_misses, preflight
from stages.cli import InputPath, OutputFile, outputs_problem, run_stage, stage_parser


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = stage_parser(__doc__)
    parser.add_output("--train", "training questions (JSONL)", suffix=".jsonl")
    parser.add_output("--test", "evaluation questions (JSONL)", suffix=".jsonl")
    parser.add_output("--corpus", "passages (JSONL: id, title, text)", suffix=".jsonl")
    parser.add_output("--metrics", "counts per split and benchmark (JSON)", suffix=".json")
    return parser.parse_args(argv)


def refuse_outputs_over_sources(args: argparse.Namespace, data: DataConfig, base: Path) -> None:
    """A source file that is also an output would be replaced by its own converted rows (a qa_jsonl training
    file given as --train): refuse it, naming the source's param, before anything is read."""
    outputs = {f"--{name}": path for name, path in vars(args).items() if isinstance(path, OutputFile)}
    inputs = {param: [InputPath(path)] for param, path in source_files(data, base).items()}
    problem = outputs_problem(outputs, inputs)
    if problem is not None:
        raise ConfigError(f"{problem} (in {args.params})")


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)

    cfg = load_config(args.params)
    base = Path(args.params).resolve().parent
    refuse_outputs_over_sources(args, cfg.data, base)
    if (problem := params_dvc_misses(Path(args.params), cfg)) is not None:
        raise ConfigError(problem)
    missing = [check.line() for check in preflight(cfg, base) if not check.ok]
    if missing:
        raise ConfigError(
            f"this machine lacks what profile {cfg.profile!r} needs "
            f"(python -m centralrl.plan --check lists it all):\n" + "\n".join(missing)
        )
    dataset = collect(cfg.data, base)
    trained, needed = len(dataset.split("train")), cfg.training_questions_needed()
    if trained < needed:  # the config checks the sources' limits, which a shorter file does not reach
        raise DataError(
            f"only {trained} training questions loaded, but {cfg.training_need()} come to {needed} "
            f"(in {args.params}); add training questions or lower those params"
        )
    training_left(cfg, dataset.split("train"), f"the training questions of {args.params}")
    with atomic_files(args.train, args.test, args.corpus, args.metrics) as (train, test, corpus, metrics):
        write_rows(train, (q.to_json() for q in dataset.split("train")), args.train)
        write_rows(test, (q.to_json() for q in dataset.split("test")), args.test)
        write_rows(corpus, (p.to_json() for p in dataset.passages), args.corpus)
        metrics.write(pretty_json(counts(dataset)))
    print(
        f"prepare_data: {len(dataset.split('train'))} train, {len(dataset.split('test'))} test questions, "
        f"{len(dataset.passages)} passages"
    )


if __name__ == "__main__":
    run_stage(main, arguments)
