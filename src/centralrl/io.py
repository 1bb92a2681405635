"""File I/O with two promises: malformed input names its file and line, and outputs appear whole or not at all.

Every stage output goes through `atomic_write`: the bytes land in a temporary file beside the target and
replace it in one `os.replace`, so an interrupted stage never leaves a half-written file for DVC to hash.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from centralrl.errors import DataError


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file next to `path`; on success move it over `path`, on error delete it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the permissions open() would
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it replaces `path` whole, on error it is removed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def dumps(obj: Any) -> str:
    """One canonical JSON line: same object, same bytes."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows as JSON lines atomically; return how many were written."""
    count = 0
    with atomic_write(path) as handle:
        for row in rows:
            handle.write(dumps(row) + "\n")
            count += 1
    return count


def write_json(path: str | Path, obj: Any) -> None:
    """Write pretty, key-sorted JSON atomically (DVC metrics files, reports)."""
    with atomic_write(path) as handle:
        handle.write(json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n")


def read_jsonl(path: str | Path) -> Iterator[tuple[str, dict]]:
    """Yield (`file:line`, row) for each non-blank line; a malformed line raises DataError naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{where}: malformed JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def read_json(path: str | Path) -> Any:
    """Load a whole JSON file; a syntax error names the file, line and column."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{error.lineno}: malformed JSON ({error.msg} at column {error.colno})") from None
