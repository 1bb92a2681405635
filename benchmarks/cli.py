"""What every benchmark script's command line shares: count arguments that refuse 0 and negatives (a usage
error naming the argument), an --out checked before any measuring, and `run`, which turns a known failure
(`CentralRLError`: a missing file, a bad param) into one line `<script>: error: <message>` and exit 1, as the
stages print theirs (`stages.cli`, whose signal handling and Prefect server a benchmark does not want). Anything
else is a bug and keeps its traceback.

The scripts run as `python benchmarks/<script>.py`, so this folder is first on `sys.path` and they import this
module as `cli`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from centralrl.errors import CentralRLError, OutputError
from centralrl.io import atomic_write, out_file_problem
from centralrl.redact import redact


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help shows the script's docstring as written and each option's default (unless none, or a flag's)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        no_default = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if no_default or "%(default)" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser: its module docstring (what it measures, example commands) as the description."""
    return argparse.ArgumentParser(description=doc, formatter_class=_HelpFormatter)


def harness_arguments(parser: argparse.ArgumentParser, start: bool) -> None:
    """--params, --backbone, --model and --index, as the benchmarks that run the harness read them. `start`: the
    model is the starting checkpoint, named on the command line (else the prepared backbone, by default)."""
    parser.add_argument("--params", default="params.yaml", help="params file")
    parser.add_argument("--backbone", default="main", help="a key of `models` in params (its dtype)")
    if start:
        parser.add_argument("--model", required=True, help="the starting checkpoint (models/<backbone>/start)")
        parser.add_argument("--index", required=True, help="index folder (build_index)")
    else:
        parser.add_argument("--model", default="models/main/backbone", help="model folder (prepare_model's backbone)")
        parser.add_argument("--index", default="index", help="index folder (build_index)")


def cut_arguments(parser: argparse.ArgumentParser) -> None:
    """--adapters and --arm: one trained cut, as the benchmarks that load a cell's adapters read it."""
    parser.add_argument("--adapters", required=True, help="one cut's adapters folder (train/.../adapters/<budget>)")
    parser.add_argument("--arm", required=True, help="the arm that trained them (which roles hold an adapter)")


def count(text: str, least: int = 1) -> int:
    """argparse type: an integer of at least `least` (1: a count of something that must happen)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def count_or_zero(text: str) -> int:
    """argparse type: an integer of at least 0 (where 0 skips something)."""
    return count(text, least=0)


def counts(text: str) -> list[int]:
    """argparse type: comma-separated counts (each at least 1), e.g. `1,2,4`."""
    return [count(part) for part in text.split(",") if part]


def check_out(path: str, args: argparse.Namespace) -> str:
    """Refuse an --out that could not be written, before the measuring (`io.out_file_problem`): its inputs are
    every other argument naming a path that exists, and the profile overlays beside --params. Returns `path`."""
    if (problem := out_file_problem(path, _input_paths(args))) is not None:
        raise OutputError(problem)
    return path


def _input_paths(args: argparse.Namespace) -> Iterator[tuple[str, Path]]:
    """(flag, path) for every argument but --out that names an existing file or folder."""
    from centralrl.config import profiles_folder

    for key, value in vars(args).items():
        flag = "--" + key.replace("_", "-")
        for item in value if isinstance(value, list) else [value]:
            if key != "out" and isinstance(item, str) and item and Path(item).exists():
                yield flag, Path(item)
    if isinstance(getattr(args, "params", None), str):
        yield "--params", profiles_folder(args.params)


def write_indented_json(path: str, obj: object) -> None:
    """Write `obj` atomically as `json.dumps(obj, indent=2)` plus a newline, keys in their order: the format of
    the results that were written that way (`centralrl.io.write_json` sorts keys and keeps non-ASCII)."""
    with atomic_write(path) as handle:
        handle.write(json.dumps(obj, indent=2) + "\n")


def run_main(main: Callable[[], object]) -> None:
    """Run a script's `main`; a CentralRLError prints one line naming the script and exits 1, Ctrl-C one line
    and 130 (its traceback said nothing more)."""
    try:
        main()
    except CentralRLError as error:
        print(f"{Path(sys.argv[0]).stem}: error: {redact(str(error))}", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{Path(sys.argv[0]).stem}: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
