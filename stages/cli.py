"""What every stage's command line shares: its description from the module docstring, `--params`, and
`run_stage`, which runs a stage's `main` the way DVC needs it:

- it dies with whatever started it (`dvc repro` killed by any signal, SIGKILL included), and SIGTERM or Ctrl-C
  unwinds it like an exception, so its temporaries are deleted and its children stopped; a second signal, or
  unwinding that takes 20 s, ends it at once;
- every section of the params file is validated first, whether or not the stage reads it, and a stage that
  logs to an MLflow server checks that it answers (seconds) before its work, not after it;
- its command line is parsed first (the stage's `arguments`), so `--help` or a usage error ends it in about a
  second, before any server starts or torch is imported (it took 11-16 s when `main` parsed it); its outputs
  (`StageParser.add_output`) are checked then too, against each other, its inputs (`InputPath`) and what is in
  their way (a file or folder there that is no earlier output of its flag), so it never fails at its last write
  nor writes over what it reads;
- a stage whose flows report to Prefect gets a server that lives exactly as long as the stage
  (`centralrl.services.stage_prefect_server`), unless PREFECT_API_URL names a long-lived one; the params are
  validated (and torch and Prefect imported) while that server starts, which takes seconds;
- a known failure (a bad param, bad data, a missing file, a server down, a full disk) prints one line naming
  what and where (URL credentials masked), with no traceback, and exits 1; an interrupted stage exits 128 + the signal
  number;
  anything else is a bug and keeps its traceback;
- a stage that returns or fails in a known way ends with `os._exit` once the interpreter's own exit steps have
  run (threading's exit hooks, where Prefect sends the logs and events it queued; the atexit handlers, MLflow's
  and logging's; `end_process`): the teardown of the ~6,000 modules that torch, transformers, Prefect and MLflow
  load, which it skips, took 2.5-6 s of every stage here, after its outputs were written
  (`benchmarks/stage_startup.py`).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import fnmatch
import functools
import itertools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from centralrl.config import Config, profiles_folder
from centralrl.errors import USER_OS_ERRORS, CentralRLError
from centralrl.io import clean_stale_temporaries, folder_refuses_files, foreign_file, output_in_the_way, overlaps
from centralrl.processes import Terminated, die_with_parent, terminate_as_interrupt, watch_grandparent
from centralrl.schema import examples

INTERRUPTED = 128 + 2  # SIGINT, as a shell reports it


def _not_empty(text: str) -> str:
    if not str(
        text
    ).strip():  # '' is the current folder to Path: an output folder holding the checkout, or in a file's way
        raise argparse.ArgumentTypeError("empty or blank path")
    return text


class OutputFile(str):
    """An argparse `type` for a stage's output file; the parser checks these before the stage starts. A path
    ending in a separator names a folder, so it is refused (it wrote a file of the folder's name)."""

    folder = False

    def __new__(cls, text: str) -> OutputFile:
        if not cls.folder and text.endswith(os.sep):
            raise argparse.ArgumentTypeError(f"{text}: ends in {os.sep}, as a folder does, but this output is a file")
        return super().__new__(cls, _not_empty(text))


class OutputFolder(OutputFile):
    """An argparse `type` for a stage's output folder (written whole, `io.atomic_directory`)."""

    folder = True


class InputPath(str):
    """An argparse `type` for a stage's input file or folder: no output may be it, hold it or lie inside it."""

    def __new__(cls, text: str) -> InputPath:
        return super().__new__(cls, _not_empty(text))


def outputs_problem(outputs: dict[str, OutputFile], inputs: dict[str, list[InputPath]] | None = None) -> str | None:
    """Why these outputs (flag -> path) could not all be written, or None: two flags naming one path, one inside
    another's folder (which is replaced whole), one that is, holds or lies inside an input (flag -> paths),
    something in the way (`io.output_in_the_way`), or a folder that takes no new file (`io.folder_refuses_files`).
    Checked before the stage's work, so it never fails at its last write with the others already written, nor
    overwrites what it reads.

    >>> outputs_problem({"--train": OutputFile("d/q.jsonl"), "--test": OutputFile("d/./q.jsonl")})
    '--train and --test both name d/q.jsonl: each output needs its own path'
    >>> outputs_problem({"--out": OutputFolder("eval/base"), "--metrics": OutputFile("eval/base/m.json")})
    "--metrics eval/base/m.json is inside --out's folder eval/base, which the stage replaces whole"
    >>> outputs_problem({"--metrics": OutputFile("data/c.jsonl")}, {"--corpus": [InputPath("data/c.jsonl")]})
    '--metrics data/c.jsonl overlaps the input --corpus data/c.jsonl: the stage would write over what it reads'
    """
    where = {flag: Path(path).resolve() for flag, path in outputs.items()}
    for (flag, path), (other, other_path) in itertools.combinations(where.items(), 2):
        if path == other_path:
            return f"{flag} and {other} both name {outputs[flag]}: each output needs its own path"
        for inner, outer in ((flag, other), (other, flag)):
            if outputs[outer].folder and where[outer] in where[inner].parents:
                inside = f"{inner} {outputs[inner]} is inside {outer}'s folder {outputs[outer]}"
                return f"{inside}, which the stage replaces whole"
    for (flag, path), (source_flag, sources) in itertools.product(outputs.items(), (inputs or {}).items()):
        for source in sources:
            if overlaps(path, source):
                overlap = f"{flag} {path} overlaps the input {source_flag} {source}"
                return f"{overlap}: the stage would write over what it reads"
    for flag, path in outputs.items():
        problem = output_in_the_way(Path(path), path.folder)
        if problem is None and (refused := folder_refuses_files(Path(path))) is not None:
            problem = f"{path}: cannot be written: {refused}"
        if problem is not None:
            return f"{flag}: {problem}"
    return None


def foreign_folder_problem(path: str, marks: tuple[str, ...]) -> str | None:
    """Why the output folder `path` may not be replaced, or None: it holds files, none matching `marks` (globs
    of what the stage always writes there, none recursive: a folder above an earlier output is not one), so it
    is not an earlier output of the stage: a mistyped flag would have deleted someone's folder whole."""
    folder = Path(path)
    try:
        if not folder.is_dir() or any(match for mark in marks for match in folder.glob(mark)):
            return None
        held = sorted(item.name for item in folder.iterdir())
    except OSError as error:
        return f"{path} cannot be listed ({error.strerror})"
    if not held:
        return None
    return (
        f"{path} holds {examples(held, 3)} but not {' or '.join(marks)}: not an earlier output of this stage, "
        "which replaces its folder whole; name a new or empty folder"
    )


def stray_files_problem(path: str, writes: tuple[str, ...]) -> str | None:
    """Why the output folder `path` may not be replaced, or None: it holds files that match none of `writes` (globs
    of every file the stage may write there, relative to the folder). The stage replaces the folder whole, so
    notes put beside an earlier output (report/my_notes.md) were deleted with it, without a word."""
    folder = Path(path)
    try:
        stray = [name for name in files_under(folder) if not any(glob_matches(name, glob) for glob in writes)]
    except OSError as error:
        return f"{path} cannot be listed ({error.strerror})"
    if not stray:
        return None
    return (
        f"{path} holds {examples(stray, 3)}, which this stage does not write there: it replaces its folder whole, "
        "so they would be deleted; move them out of it"
    )


def files_under(folder: Path) -> list[str]:
    """Every file under `folder` (a link to a folder counts as one, not followed), by its path relative to
    `folder` with `/` between names; none when `folder` is no folder."""
    found: list[str] = []
    if not folder.is_dir():
        return found
    for top, folders, files in os.walk(folder, onerror=_raise):
        linked = [name for name in folders if os.path.islink(os.path.join(top, name))]
        found += [Path(top, name).relative_to(folder).as_posix() for name in [*files, *linked]]
    return found


def _raise(error: OSError) -> NoReturn:
    """os.walk's `onerror`: a folder it cannot list is an error, not one it skips in silence."""
    raise error


def glob_matches(name: str, glob: str) -> bool:
    """Whether the relative path `name` matches `glob` whole, name by name (`*` stays within one name).

    >>> glob_matches("cut/central/adapter_config.json", "*/*/adapter_config.json"), glob_matches("a/b.png", "*.png")
    (True, False)
    """
    names, globs = name.split("/"), glob.split("/")
    return len(names) == len(globs) and all(fnmatch.fnmatchcase(n, g) for n, g in zip(names, globs, strict=True))


class StageParser(argparse.ArgumentParser):
    """Parses a stage's command line, then refuses outputs that could not all be written (`outputs_problem`),
    an output folder that holds something else (`foreign_folder_problem`) or files the stage does not write beside
    its own (`stray_files_problem`), and an output file that is something else (`io.foreign_file`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.folder_marks: dict[str, tuple[str, ...]] = {}
        self.folder_writes: dict[str, tuple[str, ...]] = {}
        self.file_suffixes: dict[str, str] = {}

    def add_output(
        self,
        flag: str,
        what: str,
        marks: tuple[str, ...] = (),
        suffix: str = "",
        required: bool = True,
        writes: tuple[str, ...] = (),
    ) -> None:
        """An output flag, checked with the others when parsed: a folder when `marks` are given (globs of the
        files the stage always writes in it: how an earlier output is told from someone else's folder), else a
        file whose name ends in `suffix` (".json": an existing file that does not is someone else's). A folder's
        `writes` are globs of every file the stage may write in it (`stray_files_problem`): an earlier output
        holding any other file is refused; without them (a model's or an index's files, which vary with the
        model and the libraries' versions) only `marks` are checked."""
        if bool(marks) == bool(suffix) or (writes and not marks):
            raise ValueError(f"{flag}: an output folder needs marks (and may list writes), an output file a suffix")
        self.add_argument(flag, type=OutputFolder if marks else OutputFile, required=required, help=f"output: {what}")
        if marks:
            self.folder_marks[flag] = marks
        else:
            self.file_suffixes[flag] = suffix
        if writes:
            self.folder_writes[flag] = writes

    def parse_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed = super().parse_args(args, namespace)
        given = {"--" + key.replace("_", "-"): value for key, value in vars(parsed).items()}
        outputs = {flag: path for flag, path in given.items() if isinstance(path, OutputFile)}
        listed = {flag: value if isinstance(value, list) else [value] for flag, value in given.items()}
        inputs = {flag: paths for flag, paths in listed.items() if paths and isinstance(paths[0], InputPath)}
        inputs["--params"].append(InputPath(profiles_folder(parsed.params)))  # its profile overlays are read too
        problem = outputs_problem(outputs, inputs)
        for flag, marks in self.folder_marks.items():
            if problem is None and (foreign := foreign_folder_problem(outputs[flag], marks)) is not None:
                problem = f"{flag}: {foreign}"
        for flag, writes in self.folder_writes.items():
            if problem is None and flag in outputs and (stray := stray_files_problem(outputs[flag], writes)):
                problem = f"{flag}: {stray}"
        for flag, suffix in self.file_suffixes.items():
            if problem is None and flag in outputs and (foreign := foreign_file(Path(outputs[flag]), suffix)):
                problem = f"{flag}: {foreign}"
        if problem is not None:
            self.error(problem)
        return parsed


def stage_parser(doc: str) -> StageParser:
    """A parser whose help is the stage module's docstring (its first paragraph, then the rest) with `--params`
    added."""
    first, _, rest = doc.partition("\n\n")
    parser = StageParser(
        description=first, epilog=rest.strip() or None, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--params",
        type=InputPath,
        default="params.yaml",
        help="params file (its profile overlay is applied; default params.yaml)",
    )
    return parser


def run_stage(
    main: Callable[[], object],
    arguments: Callable[[list[str]], argparse.Namespace],
    prefect_server: bool = False,
    tracked: bool = False,
    checks: Callable[[argparse.Namespace, Config], None] | None = None,
) -> NoReturn:
    """Run `main` as a stage process (see the module docstring) and exit with its status. `arguments` parses
    the stage's command line (exiting on `--help` or a usage error); a `tracked` stage (one that logs to
    MLflow) first checks that its tracking server answers, and `checks(args, cfg)` refuses what the stage would
    find wrong only later (a cell outside the matrix, a search cluster that is down): both while the stage's
    Prefect server starts, so a refusal comes in a second, not after it."""
    name = Path(sys.argv[0]).stem
    die_with_parent()
    watch_grandparent()
    terminate_as_interrupt()
    argv = sys.argv[1:]
    args = arguments(argv)
    try:
        with _prefect(prefect_server, functools.partial(_prepare, args, argv, tracked, checks)):
            main()
    except KeyboardInterrupt as stop:
        code = 128 + stop.signum if isinstance(stop, Terminated) else INTERRUPTED
        _exit(name, f"interrupted ({stop or 'SIGINT'}); outputs it was writing were discarded", code)
    except CentralRLError as error:
        _exit(name, f"error: {error}", 1)
    except OSError as error:
        if error.errno not in USER_OS_ERRORS:
            raise
        _exit(name, f"error: {describe_os_error(error)}", 1)
    end_process(0)


def _prepare(
    args: argparse.Namespace,
    argv: list[str],
    tracked: bool,
    checks: Callable[[argparse.Namespace, Config], None] | None,
) -> None:
    """Validate the whole params file, run the stage's `checks` and check the tracking server when the stage logs
    to one (before its work, not after), and remove temporaries that killed runs left beside the stage's paths."""
    from centralrl.config import load_config
    from centralrl.hardware import set_memory_return, set_threads
    from centralrl.services import check_reachable, stage_store_uri

    cfg = load_config(args.params)
    if checks is not None:
        checks(args, cfg)
    set_threads(cfg.threads)
    set_memory_return(cfg.return_memory, cfg.return_memory_above_gb)
    if tracked:  # the store the stage will open: a relative sqlite one in DVC's repository, not a temporary copy
        check_reachable(stage_store_uri(cfg.tracking.uri, os.environ.get("DVC_ROOT")))
    for folder in {Path(arg) if Path(arg).is_dir() else Path(arg).parent for arg in argv if "/" in arg}:
        clean_stale_temporaries(folder)


@contextlib.contextmanager
def _prefect(wanted: bool, prepare: Callable[[], None]):
    """The stage's Prefect server when `wanted`, with `prepare` run while it starts; else just `prepare`."""
    if not wanted:
        prepare()
        yield
        return
    from centralrl.services import (
        ServiceError,
        prefect_request_failed,
        quiet_known_errors_in_prefect_logs,
        stage_prefect_server,
    )

    def get_ready() -> None:
        prepare()
        quiet_known_errors_in_prefect_logs()

    with stage_prefect_server(meanwhile=get_ready) as url:
        try:
            yield
        except Exception as error:  # the server going (or failing) mid-stage: one line, not Prefect's traceback
            if (failed := prefect_request_failed(error, url)) is None:
                raise
            raise ServiceError(failed) from None


def describe_os_error(error: OSError) -> str:
    """'<path>: <reason>' for an OSError, naming both paths of a rename and saying when the path is unknown."""
    reason = error.strerror or errno.errorcode.get(error.errno, str(error))
    paths = [str(p) for p in (error.filename, error.filename2) if p is not None]
    where = " -> ".join(paths) if paths else "(path not reported by the operating system)"
    return f"{where}: {reason}"


def _exit(name: str, message: str, code: int) -> NoReturn:
    from centralrl.redact import redact  # a library's message may quote a URL with its credentials

    print(f"{name}: {redact(message)}", file=sys.stderr, flush=True)
    end_process(code)


def end_process(code: int) -> NoReturn:
    """Exit with `code` as `sys.exit` would, minus the interpreter's teardown of every loaded module, which
    nothing the stage wrote depends on. First what the interpreter runs before that teardown, in its order:
    `threading._shutdown` (joins non-daemon threads and runs the hooks registered with
    `threading._register_atexit`, among them Prefect's, which send the logs and events its flows queued), then
    `atexit._run_exitfuncs` (MLflow's, logging's); then stdio is flushed."""
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
