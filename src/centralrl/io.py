"""File I/O with three promises: malformed input names its file and line, outputs appear whole or not at all,
and an output that cannot be written (a full disk, say) is an error naming its path.

Every stage output goes through `atomic_write` or `atomic_directory`: the bytes land in a temporary beside the
target (`.<name>.<pid>.<random>.incomplete`, git-ignored) and replace it in one `os.replace`, so an interrupted
stage never leaves a half-written file for DVC to hash or a half-written checkpoint for a rerun to resume.
`atomic_files` writes several outputs to temporaries and replaces them only once all are complete. A
temporary whose writer process is gone (killed by SIGKILL mid-write) is removed by the next write into the
same folder. `scratch_folder` names a process's own folder in the system temp folder the same way, so the next
one removes what a killed process left there (a stage's Prefect server logs). `markdown_text` and
`markdown_code` put data (questions, answers, generations, benchmark names) into the markdown outputs as written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, NoReturn

import psutil

from centralrl.errors import DataError, OutputError

TEMP_SUFFIX = ".incomplete"
# errors that say the output cannot be written where it is asked for; any other OSError is left as it is
UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
# and where a folder refuses new entries: said of the output, not of the temporary name that met it
UNCREATABLE = UNWRITABLE | {errno.EACCES, errno.EPERM}
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # a JSON escape that decodes to a UTF-16 surrogate
LINE_BREAK = re.compile(r"\r\n|\r|\n")
LINE_BREAK_MARK = "\u23ce"  # ⏎: a line break of the data, on one markdown line
MARKDOWN_ACTIVE = re.compile(r"[\\`|<]|&(?=#?\w+;)")  # what markdown would act on inside a line of text


def _temporary_prefix(target: Path) -> str:
    return f".{target.name}.{os.getpid()}."


def _writer_gone(name: str) -> bool:
    """True for a temporary of ours whose writing process no longer exists."""
    parts = name.removesuffix(TEMP_SUFFIX).rsplit(".", 2)
    return (
        name.startswith(".")
        and name.endswith(TEMP_SUFFIX)
        and len(parts) == 3
        and parts[1].isdigit()
        and not psutil.pid_exists(int(parts[1]))
    )


def clean_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove temporaries in `folder` left by writers that died mid-write; return what was removed."""
    folder = Path(folder)
    stale = [entry for entry in folder.iterdir() if _writer_gone(entry.name)] if folder.is_dir() else []
    for entry in stale:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
    return stale


def scratch_folder(name: str) -> Path:
    """A new folder in the system's temp folder for this process's own files (a server's logs), named as our
    temporaries are (`.<name>.<pid>.<random>.incomplete`): the caller removes it when done, and if its process
    died first (a SIGKILLed stage cannot clean up), the next call removes it."""
    target = Path(tempfile.gettempdir()) / name
    _prepare(target, folder=True)
    return Path(_temporary_beside(target, tempfile.mkdtemp))


def file_in_the_way(folders: Iterable[Path]) -> Path | None:
    """The first of `folders` that exists but is not a folder (so nothing can be made inside it), or None."""
    return next((path for path in folders if path.exists() and not path.is_dir()), None)


def overlaps(output: str | Path, source: str | Path) -> bool:
    """Whether writing `output` would write over `source`: the same path, or one holding the other."""
    written, read = Path(output).resolve(), Path(source).resolve()
    return read == written or read in written.parents or written in read.parents


def output_in_the_way(target: Path, folder: bool) -> str | None:
    """What stands in the way of writing `target` (a folder when `folder`), said as an error message: a file
    where a folder above it should be, or a folder where the output is a file (and the reverse); else None."""
    blocked = file_in_the_way(target.parents)
    if blocked is not None:
        return f"{target}: cannot be written: {blocked} is a file, not a folder"
    if target.exists() and target.is_dir() != folder:
        kinds = ("a file", "a folder") if target.is_dir() else ("a folder", "a file")
        return f"{target}: this output is {kinds[0]}, but {kinds[1]} of that name is in the way"
    return None


def foreign_file(target: Path, suffix: str) -> str | None:
    """Why `target` may not be an output written as `suffix` (".json"), or None: its name must end in `suffix`,
    whether or not it exists yet. An existing file of another name is someone else's (the training questions
    named as a metrics output), and a new one would be refused on the rerun, once it exists.

    >>> foreign_file(Path("m.json"), ".json") is None, foreign_file(Path("m"), ".json")
    (True, 'm: not a .json file name, which this output is; an existing file of another kind would be replaced')
    """
    if target.name.lower().endswith(suffix.lower()):
        return None
    return (
        f"{target}: not a {suffix} file name, which this output is; an existing file of another kind would be replaced"
    )


def folder_refuses_files(target: Path) -> str | None:
    """Why the nearest existing folder above `target`, where its temporary (and any missing folders) would be
    made, takes no new file, found by making and deleting one (a read-only mount, no permission, /proc); else
    None."""
    folder = next((path for path in target.parents if path.exists()), None)
    if folder is None:
        return None
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as error:
        return f"{folder} takes no new file ({os.strerror(error.errno) if error.errno else error})"


def out_file_problem(path: str, inputs: Iterable[tuple[str, Path]], suffix: str = ".json") -> str | None:
    """Why a script's `--out` file `path` (written as `suffix`) could not be written, or None; the benchmark
    scripts and `centralrl.attribution` check theirs with it before any work. Unlike a stage's outputs (which
    make their folders), its folder must exist: a typo in it is refused, not created.

    >>> out_file_problem("  ", [])
    '--out: blank path; name the .json file to write'
    >>> out_file_problem("t.json", [("--corpus", Path("t.json"))])
    '--out t.json overlaps the input --corpus t.json: it would write over what it reads'
    """
    if not path.strip():  # '' is the current folder to Path
        return f"--out: blank path; name the {suffix} file to write"
    if path.endswith(os.sep):  # wrote a file of the folder's name
        return f"--out {path}: ends in {os.sep}, as a folder does; name the {suffix} file to write"
    target = Path(path)
    if target.is_dir():
        return f"--out {path}: a folder; name the {suffix} file to write"
    for flag, source in inputs:
        if overlaps(path, source):
            return f"--out {path} overlaps the input {flag} {source}: it would write over what it reads"
    problem = output_in_the_way(target, folder=False) or foreign_file(target, suffix)
    if problem is None and not target.parent.is_dir():
        problem = f"{path}: folder {target.parent} does not exist; create it first"
    if problem is None and (refused := folder_refuses_files(target)) is not None:
        problem = f"{path}: cannot be written: {refused}"
    return None if problem is None else f"--out {problem}"


def _prepare(target: Path, folder: bool) -> None:
    """Make `target`'s folder, after refusing what stands in the way (`output_in_the_way`), before any temporary
    is made."""
    problem = output_in_the_way(target, folder)
    if problem is not None:
        raise OutputError(problem)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        _raise_unwritable(error, target, UNCREATABLE)
    clean_stale_temporaries(target.parent)


def _temporary_beside(target: Path, make: Callable[..., Any]) -> Any:
    """`make` (tempfile.mkstemp or mkdtemp) in `target`'s folder, under a name of `target`'s."""
    try:
        return make(prefix=_temporary_prefix(target), suffix=TEMP_SUFFIX, dir=target.parent)
    except OSError as error:
        _raise_unwritable(error, target, UNCREATABLE)


def _raise_unwritable(error: OSError, target: Path, causes: set[int] = UNWRITABLE) -> NoReturn:
    """Re-raise an OSError that says `target` cannot be written (its errno in `causes`) as an OutputError naming
    it; any other as it is."""
    if error.errno in causes:
        raise OutputError(
            f"{target}: could not be written ({os.strerror(error.errno)}); "
            f"the previous version, if any, is left as it was"
        ) from error
    raise error


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file next to `path`; on success move it over `path`, on error delete it."""
    target = Path(path)
    _prepare(target, folder=False)
    fd, tmp = _temporary_beside(target, tempfile.mkstemp)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the permissions open() would
        os.replace(tmp, target)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(error, OSError):
            _raise_unwritable(error, target)
        raise


@contextlib.contextmanager
def atomic_files(*paths: str | Path) -> Iterator[list[IO[str]]]:
    """Text handles for several outputs; they replace their targets only after every one is complete.

    An error while any is written leaves every target as it was. The replacements then follow one another
    (POSIX has no rename of several files at once), after all the bytes are on disk.
    """
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(atomic_write(path)) for path in paths]


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it replaces `path` whole, on error it is removed.

    The previous directory is first renamed to a temporary name (removed afterwards, or by the next write here
    if this process dies in between), so `path` is at every moment the old directory, the new one, or absent,
    never a mix. Every file is fsynced before the rename, so a crash cannot leave renamed but empty files.
    """
    target = Path(path)
    _prepare(target, folder=True)
    tmp = None
    try:  # made inside: a Ctrl-C just after it is made removes it too
        tmp = Path(_temporary_beside(target, tempfile.mkdtemp))
        yield tmp
        _fsync_tree(tmp)
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        _replace_directory(tmp, target)
    except BaseException as error:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError):
            _raise_unwritable(error, target)
        raise


def _replace_directory(new: Path, target: Path) -> None:
    if not target.exists():
        os.replace(new, target)
        return
    old = Path(_temporary_beside(target, tempfile.mkdtemp))
    os.replace(target, old)  # onto the empty directory just made: atomic, and the name is ours
    os.replace(new, target)
    shutil.rmtree(old)


def _fsync_tree(folder: Path) -> None:
    for file in folder.rglob("*"):
        if file.is_file() and not file.is_symlink():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def markdown_text(text: str) -> str:
    """`text` as markdown that renders as written on one line, a table cell included: each line break as ⏎ (a
    newline ends a table row and can start a heading or a list), and a backslash before what markdown would act on
    (`|` splits a table cell, a backtick opens code, `<` raw HTML, `&name;` an entity, `\\` an escape). Other
    text is returned unchanged.

    >>> markdown_text("Who wrote Dune?"), markdown_text("a|b <b>c</b> &amp; `d`\\n# e")
    ('Who wrote Dune?', 'a\\\\|b \\\\<b>c\\\\</b> \\\\&amp; \\\\`d\\\\`⏎# e')
    """
    return MARKDOWN_ACTIVE.sub(r"\\\g<0>", LINE_BREAK.sub(LINE_BREAK_MARK, text))


def markdown_code(text: str) -> str:
    """`text` as one markdown code span: each line break as ⏎ (a blank line ends a span, and what follows renders
    as markdown), fenced by one backtick more than its longest run of them, so none inside ends it (a space
    inside the fence where the text starts or ends with one).

    >>> markdown_code("<search>x</search>"), markdown_code("```py\\nx = `y`\\n```")
    ('`<search>x</search>`', '```` ```py⏎x = `y`⏎``` ````')
    """
    text = LINE_BREAK.sub(LINE_BREAK_MARK, text)
    fence = "`" * (1 + max(map(len, re.findall("`+", text)), default=0))
    pad = " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def dumps(obj: Any) -> str:
    """One canonical JSON line: same object, same bytes."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write_rows(handle: IO[str], rows: Iterable[dict], name: str | Path) -> int:
    """Write rows as JSON lines to an open handle; return how many. Text that UTF-8 cannot encode (a lone
    surrogate, say) raises DataError naming `name` and the row's id, before the row is written."""
    count = 0
    for row in rows:
        line = dumps(row)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as error:
            raise DataError(
                f"{name}: row {row.get('id', count + 1)!r} has text UTF-8 cannot encode "
                f"({error.reason}: {error.object[error.start : error.end]!a}); fix or drop it"
            ) from None
        handle.write(line + "\n")
        count += 1
    return count


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows as JSON lines atomically; return how many were written."""
    with atomic_write(path) as handle:
        return write_rows(handle, rows, path)


def pretty_json(obj: Any) -> str:
    """Pretty, key-sorted JSON with a final newline (DVC metrics files, reports): same object, same bytes."""
    return json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n"


def write_json(path: str | Path, obj: Any) -> None:
    """Write `pretty_json(obj)` atomically."""
    with atomic_write(path) as handle:
        handle.write(pretty_json(obj))


def read_jsonl(path: str | Path) -> Iterator[tuple[str, dict]]:
    """Yield (`file:line`, row) for each non-blank line. A line that is not UTF-8, not JSON, not an object, gives
    a key twice in one object, or has text no UTF-8 file can hold (an escaped lone surrogate) raises DataError
    naming the file and line."""
    for number, line in enumerate(text_lines(path), start=1):
        if line.strip():
            yield f"{path}:{number}", _parsed(line, f"{path}:{number}")


def require_file(path: str | Path) -> Path:
    """`path` as a Path, or DataError when there is no file there (a folder, or a device such as /dev/null, is
    said to be one)."""
    path = Path(path)
    if not path.is_file():
        kind = "a folder, not a file" if path.is_dir() else "not a regular file" if path.exists() else "no such file"
        raise DataError(f"{path}: {kind}")
    return path


def text_lines(path: str | Path) -> Iterator[str]:
    """The lines of a text file (with their line ends); a line that is not UTF-8 raises DataError naming the
    file and line."""
    path = require_file(path)
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            yield _decoded(raw, f"{path}:{number}")


def _decoded(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(
            f"{where}: not UTF-8 (byte {raw[error.start]:#04x} at byte {error.start + 1} of the line); "
            f"convert the file to UTF-8"
        ) from None


class _RepeatedKey(ValueError):
    """A JSON object that gives one key twice (json.loads would keep the last value without a word)."""


def _object(pairs: list[tuple[str, Any]]) -> dict:
    row = dict(pairs)
    if len(row) < len(pairs):
        seen: set[str] = set()
        raise _RepeatedKey(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return row


def _repeated(where: str, error: _RepeatedKey) -> DataError:
    return DataError(f"{where}: key {error.args[0]!r} appears twice in one object; which value is meant?")


def json_problem(error: json.JSONDecodeError) -> str:
    """What is wrong and at which column: some of json's messages end in "at" ("Unterminated string starting
    at"), which read "starting at at column 7" with the column added after them.

    >>> try:
    ...     json.loads('{"a": "b')
    ... except json.JSONDecodeError as error:
    ...     json_problem(error)
    'Unterminated string starting at column 7'
    """
    return f"{error.msg.removesuffix(' at')} at column {error.colno}"


def _parsed(line: str, where: str) -> dict:
    try:
        row = json.loads(line, object_pairs_hook=_object)
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: malformed JSON ({json_problem(error)})") from None
    except _RepeatedKey as error:
        raise _repeated(where, error) from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if SURROGATE_ESCAPE.search(line):
        try:
            dumps(row).encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(
                f"{where}: an escaped lone UTF-16 surrogate (\\ud800-\\udfff without its pair) "
                f"cannot be written as UTF-8"
            ) from None
    return row


def read_json(path: str | Path) -> Any:
    """Load a whole JSON file; a syntax or decoding error names the file and line, a key given twice in one
    object names the file and the key."""
    raw = require_file(path).read_bytes()
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_object)
    except _RepeatedKey as error:
        raise _repeated(str(path), error) from None
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 (byte {raw[error.start]:#04x}); convert the file to UTF-8"
        ) from None
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{error.lineno}: malformed JSON ({json_problem(error)})") from None
