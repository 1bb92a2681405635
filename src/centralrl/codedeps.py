"""Which project source files a piece of code runs, found statically: the rule for stage deps and fingerprints.

`project_sources(entries, root)` follows every import statement (module-level and inside functions, absolute
and relative, `from pkg import submodule` included) from the entry files through the project's own packages
(`centralrl` under `src/`, `stages`, `flows`), reading the syntax tree only: nothing is imported or run, so
lazy imports inside `main()` count and third-party packages (torch, ...) are ignored. `sources_sha256` hashes
such a list, independent of the checkout folder; `folder_sha256` every file of a folder the same way.

Command line (`python -m centralrl.codedeps --help`): `--check dvc.yaml` lists, per stage, the project files
its entry module imports that the stage's deps do not cover; `--refresh-lock` rewrites the deps and commands of
dvc.lock (`--keep STAGE` leaves a stage whose outputs the change alters as it was).
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from centralrl.errors import CentralRLError
from centralrl.processes import exit_with


if TYPE_CHECKING:
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

# Top-level project packages and the folder (relative to the repository root) each one lives in.
PACKAGE_HOMES = {"centralrl": Path("src"), "stages": Path("."), "flows": Path(".")}
# How a stage's cmd names its entry module: `python -m stages.train ...`.
ENTRY_MODULE = re.compile(r"\bpython3?\s+-m\s+([\w.]+)")


def project_sources(entries: Iterable[Path], root: Path) -> list[Path]:
    """Sorted root-relative paths of the entry files and every project file they import, transitively, with
    the `__init__.py` of every package on the way (the entries' own packages included: `python -m` runs them).

    Entries may be absolute or relative to `root`."""
    root = Path(root).resolve()
    seen: set[Path] = set()
    pending = [_absolute(Path(entry), root) for entry in entries]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        module = _module_name(path, root)
        if module:  # running or importing a module first runs the __init__.py of its packages
            pending.extend(_module_files(module, root))
        for name in _file_imports(path, module, _stamp(path)):
            pending.extend(_module_files(name, root))
    return sorted(path.relative_to(root) for path in seen)


def _stamp(path: Path) -> tuple[int, int]:
    status = path.stat()
    return status.st_mtime_ns, status.st_size


@functools.lru_cache(maxsize=4096)
def _file_imports(path: Path, module: str | None, stamp: tuple[int, int]) -> tuple[str, ...]:
    """`_imported_modules` of a file as of its `stamp` (mtime, size): the stages of a pipeline share most of
    their files, and parsing each once, not once per stage, took `--check dvc.yaml` from 8.8-10.4 s to 5.0-6.1 s
    here."""
    return tuple(_imported_modules(path, module))


def sources_sha256(paths: Iterable[Path], root: Path) -> str:
    """One sha256 over the files' root-relative paths (POSIX form) and contents, in sorted order, so the same
    sources give the same hash in any checkout folder."""
    root = Path(root).resolve()
    digest = hashlib.sha256()
    for relative in sorted({_absolute(Path(path), root).relative_to(root).as_posix() for path in paths}):
        content = (root / relative).read_bytes()
        digest.update(f"{relative}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def folder_sha256(folder: str | Path) -> str:
    """`sources_sha256` over every file under `folder` (a saved adapter folder): the same files, the same hash."""
    folder = Path(folder).resolve()
    return sources_sha256((path for path in folder.rglob("*") if path.is_file()), folder)


def module_file(module: str, root: Path) -> Path | None:
    """The file of a project module (`stages.train` -> `stages/train.py`, a package -> its `__init__.py`),
    relative to `root`; None when the module is not the project's or does not exist."""
    top = module.split(".")[0]
    if top not in PACKAGE_HOMES:
        return None
    base = PACKAGE_HOMES[top].joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if (Path(root) / candidate).is_file():
            return Path(candidate.as_posix())  # drops the leading "./" of the stages and flows homes
    return None


def entry_modules(dvc_yaml: Path) -> dict[str, str | None]:
    """Per stage of `dvc_yaml` (foreach and matrix expanded, by DVC), the module its cmd runs with `python -m`
    (`stages.train`), or None when it runs none."""
    with _open_repo(Path(dvc_yaml).resolve().parent) as repo:
        return {stage.name: _entry_module(stage.cmd) for stage in _pipeline_stages(repo, dvc_yaml)}


def uncovered_sources(dvc_yaml: Path) -> dict[str, list[str]]:
    """Per stage of `dvc_yaml`, the project files its entry module imports that no dep covers (a dep covers a
    file when it is the file or a folder above it). A stage whose cmd runs no project module cannot be checked,
    and is reported as such."""
    root = Path(dvc_yaml).resolve().parent
    gaps = {}
    with _open_repo(root) as repo:
        for stage in _pipeline_stages(repo, dvc_yaml):
            module = _entry_module(stage.cmd)
            entry = module_file(module, root) if module else None
            if entry is None:
                gaps[stage.name] = [f"(its cmd runs no project module with `python -m`: {stage.cmd})"]
                continue
            deps = [PurePosixPath(dep.def_path) for dep in _file_deps(stage)]
            missing = [source.as_posix() for source in project_sources([entry], root) if not _covered(source, deps)]
            if missing:
                gaps[stage.name] = missing
    return gaps


def refresh_lock_deps(dvc_yaml: Path, keep: Iterable[str] = ()) -> list[str]:
    """Rewrite the `deps` and `cmd` of every stage of `dvc_yaml` that dvc.lock records, except the stages named
    in `keep`, to match dvc.yaml as it is now, and return those stages' names. `outs`, `params` and stages no
    longer in dvc.yaml are left as they are; so are the kept stages, whose outputs the change would alter:
    `dvc repro` reruns them.

    Source deps are hashed by DVC itself (`Dependency.save`, what `dvc commit` does). A dep on a pipeline output
    (or a folder holding one) keeps the hash the lock records for it, or takes the producing stage's recorded
    out; outputs need not be in the workspace. Only for a refactor whose outputs are known to be unchanged:
    the lock then claims the new code made the recorded outputs."""
    from dvc.stage.serialize import to_single_stage_lockfile
    from dvc.utils.serialize import modify_yaml

    root = Path(dvc_yaml).resolve().parent
    if not (root / "dvc.lock").is_file():
        kind = "a folder, not a lock file" if (root / "dvc.lock").is_dir() else "no such file"
        raise CentralRLError(f"{root / 'dvc.lock'}: {kind} (nothing to refresh: run dvc repro)")
    with _open_repo(root) as repo, modify_yaml(str(root / "dvc.lock")) as lock:
        if not isinstance(lock, dict) or not isinstance(lock.get("stages"), dict):
            raise CentralRLError(f"{root / 'dvc.lock'}: not a DVC lock file (no stages mapping)")
        pipeline = _pipeline_stages(repo, dvc_yaml)
        unknown = sorted(set(keep) - {stage.name for stage in pipeline})
        if unknown:
            raise CentralRLError(f"--keep {', '.join(unknown)}: no such stage in {dvc_yaml}")
        outs = {PurePosixPath(out.def_path): out for stage in pipeline for out in stage.outs}
        holding_outs = {folder for path in outs for folder in (path, *path.parents)}
        stages = [stage for stage in pipeline if stage.name in lock["stages"] and stage.name not in keep]
        for stage in stages:
            for dep in _file_deps(stage):
                _rehash(stage, dep, outs, holding_outs)
            entry = to_single_stage_lockfile(stage)
            lock["stages"][stage.name]["cmd"], lock["stages"][stage.name]["deps"] = entry["cmd"], entry["deps"]
    return [stage.name for stage in stages]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m centralrl.codedeps",
        description=__doc__.partition("\n")[0],
        epilog="A dep covers a file when it is the file or a folder above it. The import closure is static: "
        "every import statement counts, even one in a branch that never runs.",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument(
        "--check",
        metavar="DVC_YAML",
        type=Path,
        help="list, per stage, the project files its entry module (`python -m stages.X` in its cmd) "
        "imports that its deps do not cover; exit 1 if any",
    )
    action.add_argument(
        "--refresh-lock",
        metavar="DVC_YAML",
        type=Path,
        help="maintainers only, after a refactor whose outputs are known to be unchanged (outputs "
        "need not be present): rewrite only the deps and cmd of every stage in the dvc.lock beside "
        "DVC_YAML to match DVC_YAML (new deps added, removed ones dropped, source files rehashed by "
        "DVC); outs and params are kept. Otherwise run `dvc repro`",
    )
    parser.add_argument(
        "--keep",
        metavar="STAGE",
        action="append",
        default=[],
        help="with --refresh-lock: leave this stage's lock entry as it is, because the change alters its outputs "
        "(`dvc repro` then reruns it); repeatable",
    )
    args = parser.parse_args(argv)
    if args.keep and not args.refresh_lock:
        parser.error("--keep goes with --refresh-lock")
    dvc_yaml = args.check or args.refresh_lock
    if not dvc_yaml.is_file():
        parser.error(f"{dvc_yaml}: {'a folder; give its dvc.yaml' if dvc_yaml.is_dir() else 'no such file'}")
    if dvc_yaml.name != "dvc.yaml":  # DVC reads no other name, so no stage would match and the check would pass
        parser.error(f"{dvc_yaml}: DVC reads a pipeline only from a file named dvc.yaml")
    from dvc.exceptions import DvcException

    try:
        return _print_gaps(uncovered_sources(dvc_yaml)) if args.check else _print_refreshed(dvc_yaml, args.keep)
    except CentralRLError as error:
        print(f"error: {error}", file=sys.stderr)
    except DvcException as error:  # a malformed dvc.yaml or dvc.lock, or no DVC project: DVC says which and why
        print(f"error: {dvc_yaml}: DVC cannot read the pipeline: {dvc_reason(error)}", file=sys.stderr)
    except BrokenPipeError:  # stdout's reader went away: `exit_with` ends the command
        raise
    except OSError as error:  # a dvc.lock that cannot be written (read-only, immutable): left as it was
        print(f"error: {error.filename or dvc_yaml}: {error.strerror or error}", file=sys.stderr)
    return 1


def dvc_reason(error: Exception) -> str:
    """DVC's message on one line, with what its cause says (which field, which line): DVC's own message names only
    the file and how many errors it found in it."""
    cause = error.__cause__
    details = [str(item) for item in getattr(cause, "errors", [cause])] if cause is not None else []
    return "; ".join(" ".join(text.split()) for text in [str(error), *details] if text.strip())


def _print_gaps(gaps: dict[str, list[str]]) -> int:
    for stage, missing in gaps.items():
        print(f"{stage}: deps do not cover {', '.join(missing)}")
    if not gaps:
        print("every stage's deps cover the project files its entry module imports")
    return 1 if gaps else 0


def _print_refreshed(dvc_yaml: Path, keep: list[str]) -> int:
    stages = refresh_lock_deps(dvc_yaml, keep)
    kept = f"; kept as they were: {', '.join(keep)}" if keep else ""
    print(f"dvc.lock: deps and cmd refreshed for {len(stages)} stages: {', '.join(stages)}{kept}")
    return 0


def _open_repo(root: Path) -> Repo:
    """The DVC project at `root`, without git: reading the pipeline and hashing files need none."""
    from dvc.repo import Repo

    return Repo(str(root), config={"core": {"no_scm": True}})


def _pipeline_stages(repo: Repo, dvc_yaml: Path) -> list[PipelineStage]:
    path = Path(dvc_yaml).resolve()
    stages = [stage for stage in repo.index.stages if Path(stage.path).resolve() == path]
    if not stages:
        raise CentralRLError(f"{dvc_yaml}: no stages")
    return stages


def _file_deps(stage: PipelineStage) -> list:
    from dvc.dependency import ParamsDependency

    return [dep for dep in stage.deps if not isinstance(dep, ParamsDependency)]


def _entry_module(cmd: str | list[str]) -> str | None:
    match = ENTRY_MODULE.search(cmd if isinstance(cmd, str) else " ".join(cmd))
    return match.group(1) if match else None


def _covered(source: Path, deps: list[PurePosixPath]) -> bool:
    posix = PurePosixPath(source.as_posix())
    return any(dep == posix or dep in posix.parents for dep in deps)


def _rehash(stage: PipelineStage, dep, outs: dict, holding_outs: set) -> None:
    """Hash a source dep as DVC does; a dep on pipeline outputs (an out, a folder holding one, or a path inside
    one: `holding_outs` is every out and every folder above one) keeps its recorded hash (see refresh_lock_deps)."""
    path = PurePosixPath(dep.def_path)
    if path not in holding_outs and not any(folder in outs for folder in path.parents):
        if not dep.exists:
            raise CentralRLError(f"dvc.yaml: stage {stage.name}: dep {path} does not exist")
        dep.save()
    elif not dep.hash_info and path in outs and outs[path].hash_info:
        dep.hash_info, dep.meta = outs[path].hash_info, outs[path].meta
    elif not dep.hash_info:  # a new dep on pipeline outputs: left unrecorded, so DVC reruns the stage
        print(f"dvc.lock: stage {stage.name}: new dep {path} holds pipeline outputs; `dvc repro` will rerun it")


def _absolute(path: Path, root: Path) -> Path:
    return (path if path.is_absolute() else root / path).resolve()


def _module_name(path: Path, root: Path) -> str | None:
    """The dotted name of a project file (`src/centralrl/rl/grpo.py` -> `centralrl.rl.grpo`), None otherwise."""
    relative = path.relative_to(root)
    for top, home in PACKAGE_HOMES.items():
        parts = relative.relative_to(home).with_suffix("").parts if relative.is_relative_to(home / top) else ()
        if parts:
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return None


def _module_files(module: str, root: Path) -> Iterator[Path]:
    """The files importing `module` executes: each enclosing package's `__init__.py`, then the module's."""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        found = module_file(".".join(parts[:depth]), root)
        if found is not None:
            yield root / found


def _parse(path: Path, attempts: int = 5) -> ast.Module:
    """`ast.parse` of the file, retried when CPython 3.11 fails with "AST constructor recursion depth mismatch":
    its AST builder keeps one recursion counter for all threads (python/cpython#106905), so a parse that races
    another thread's (Prefect's and MLflow's threads format tracebacks, which parses source) can fail although
    the file is fine. A lock of ours could not stop other libraries' threads."""
    for _ in range(attempts - 1):
        try:
            return ast.parse(path.read_bytes(), filename=str(path))
        except SystemError as error:
            if "recursion depth mismatch" not in str(error):
                raise
    return ast.parse(path.read_bytes(), filename=str(path))


def _imported_modules(path: Path, module: str | None) -> Iterator[str]:
    """Every module an import statement anywhere in the file names, `from a import b` giving both `a` and
    `a.b` (b may be a submodule; a name that is not a module simply has no file)."""
    is_package = path.name == "__init__.py"
    tree = _parse(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(node, module, is_package)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def _resolve_from(node: ast.ImportFrom, module: str | None, is_package: bool) -> str:
    """The absolute module of `from <node.module> import ...`, relative levels resolved against `module`."""
    if not node.level:
        return node.module or ""
    package = (module or "").split(".")
    package = package if is_package else package[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


if __name__ == "__main__":
    exit_with(main)
