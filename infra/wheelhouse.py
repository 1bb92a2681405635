"""Wheels for a machine without network access (an air-gapped GPU node, a cluster's compute node).

    python infra/wheelhouse.py --have target-packages.txt --python-version 3.12 --out wheelhouse

It walks the requirements of the installed project (`centralrl`, plus `--extras`) through this environment's
package metadata, extras included (prefect's `sqlalchemy[asyncio]` brings greenlet), with each requirement's
environment marker evaluated for the target (its Python version, Linux, `--machine`). It leaves out what the
target already has (`--have`: its `pip freeze` or `pip list`, or names, in UTF-8; a line that is none of these is
refused before anything is downloaded) and `--exclude`, and downloads the rest, each at the version installed here
(the versions the tests ran with), as wheels for the target's Python and platform, into `--out` only once all of
them are there (a failure partway adds nothing to it). A package published only as a source archive is built into
a wheel here (pure Python only: a compiled one needs building on the target's platform). A needed package not
installed here is downloaded at its newest version, and said so. On the target, from this checkout:

    pip install --no-index --no-deps wheelhouse/*.whl && pip install --no-index --no-deps --no-build-isolation -e .

Markers are evaluated for CPython on Linux. torch is never fetched: the target needs its own build (CUDA, say)
from the PyTorch index, and the wheels here are the ones that build's absence does not change.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
LISTED = re.compile(rf"({NAME})\s+(\S+)(?:\s+\S.*)?")  # a `pip list` row: name, version, maybe location, installer
EGG = re.compile(rf"#egg=({NAME})")  # the name on a `pip freeze` line of an editable install from version control
COMMENT = re.compile(r"(?:^|\s)#.*")  # as in a requirements file: a `#` at the start or after a space
PYTHON_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?")
# The processors manylinux wheels are tagged for (PEP 599, PEP 600 as auditwheel builds them): `uname -m` there.
MACHINES = ("x86_64", "i686", "aarch64", "armv7l", "ppc64", "ppc64le", "s390x", "riscv64", "loongarch64")
UNREAD_SHOWN = 10  # lines of an unreadable `--have` named one by one; past these, only counted
MANYLINUX = ["manylinux1", "manylinux2010", "manylinux2014", *(f"manylinux_2_{n}" for n in range(5, 40))]


def target_environment(python_version: str, machine: str) -> dict[str, str]:
    """The marker variables of a CPython `python_version` (3.12, or 3.12.3 where markers name micro versions:
    without one, 3.12.0) on Linux `machine`.

    >>> keys = ("python_version", "python_full_version")
    >>> [target_environment(v, "x86_64")[k] for v in ("3.12", "3.12.3") for k in keys]
    ['3.12', '3.12.0', '3.12', '3.12.3']
    """
    parts = python_version.split(".")
    return {
        "python_version": ".".join(parts[:2]),
        "python_full_version": python_version if len(parts) > 2 else f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": machine,
    }


def applies(requirement: Requirement, extras: Iterable[str], environment: dict[str, str]) -> bool:
    """Whether `requirement` holds on the target when its package is installed with `extras`.

    >>> env = target_environment("3.12", "x86_64")
    >>> applies(Requirement('greenlet>=1; extra == "asyncio"'), {"asyncio"}, env), applies(
    ...     Requirement('greenlet>=1; extra == "asyncio"'), set(), env)
    (True, False)
    >>> applies(Requirement("tomli; python_version < '3.11'"), set(), env)
    False
    """
    if requirement.marker is None:
        return True
    marker: Marker = requirement.marker
    return any(marker.evaluate({**environment, "extra": extra}) for extra in [*extras, ""])


def closure(
    roots: Iterable[str], requires: Callable[[str], list[str] | None], environment: dict[str, str]
) -> dict[str, set[str]]:
    """Every distribution `roots` need on the target (canonical name -> the extras asked of it). `requires(name)`
    is the distribution's requirement strings, None when it is not installed here (then its own needs are
    unknown, and it stays a leaf).

    >>> reqs = {"a": ["b[x]", "c; python_version < '3.11'"], "b": ["d; extra == 'x'", "e; extra == 'y'"], "d": []}
    >>> sorted(closure(["a"], reqs.get, target_environment("3.12", "x86_64")))
    ['a', 'b', 'd']
    """
    wanted: dict[str, set[str]] = {}
    todo = [Requirement(root) for root in roots]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        done = wanted.get(name)
        if done is not None and set(requirement.extras) <= done:
            continue
        wanted[name] = (done or set()) | set(requirement.extras)
        for line in requires(name) or []:
            needed = Requirement(line)
            if applies(needed, wanted[name], environment):
                todo.append(needed)
    return wanted


def installed_requires(name: str) -> list[str] | None:
    """The requirement strings of the distribution installed here; None when it is not installed."""
    try:
        return metadata.distribution(name).requires or []
    except metadata.PackageNotFoundError:
        return None


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def line_names(line: str) -> set[str] | None:
    """The canonical names one line of a `pip freeze`, a `pip list` or a list of names gives; None when it is none of
    these. A blank line, a comment, `pip list`'s header and rule, and an editable install without `#egg=` (pip
    freeze's `-e /path`: its name is in a comment) give none.

    >>> [line_names(line) for line in ("Torch==2.11.0", "numpy @ file:///x", "scipy   1.16.0  /src")], sorted(
    ...     line_names("a, b_c,"))
    ([{'torch'}, {'numpy'}, {'scipy'}], ['a', 'b-c'])
    >>> [line_names(line) for line in ("Package  Version", "-------  -------", "-e /src", "# x", "-e git+h#egg=y")]
    [set(), set(), set(), set(), {'y'}]
    >>> [line_names(line) for line in ("hello world", "!!!", "a, b c")]
    [None, None, None]
    """
    line = COMMENT.sub("", line).strip()
    if not line or line.split()[:2] == ["Package", "Version"] or not line.strip("- "):
        return set()
    if line.split()[0] in ("-e", "--editable"):
        return {canonicalize_name(egg) for egg in EGG.findall(line)}
    try:
        return {canonicalize_name(Requirement(line).name)}
    except InvalidRequirement:
        pass
    listed = LISTED.fullmatch(line)
    if listed and is_version(listed.group(2)):
        return {canonicalize_name(listed.group(1))}
    names = [name.strip() for name in line.split(",") if name.strip()]
    if "," in line and all(re.fullmatch(NAME, name) for name in names):
        return {canonicalize_name(name) for name in names}
    return None


def is_version(text: str) -> bool:
    """Whether `text` is a PEP 440 version: what tells a `pip list` row from two words."""
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def names_in(text: str, source: str) -> set[str]:
    """Canonical distribution names from a `pip freeze`, a `pip list` or a list of names (`source`, in messages).
    Lines that are none of these are refused, all named, so that a wrong file does not pass as a target that has
    nothing.

    >>> sorted(names_in("Torch==2.11.0\\nnumpy @ file:///x\\nPackage  Version\\n-------- -------\\nscipy 1.16.0", "h"))
    ['numpy', 'scipy', 'torch']
    >>> sorted(names_in("accelerate, aiohttp, typing_extensions", "h"))
    ['accelerate', 'aiohttp', 'typing-extensions']
    >>> names_in("numpy\\n<html>\\n", "have.txt")
    Traceback (most recent call last):
    SystemExit: wheelhouse: have.txt:2: not a `pip freeze`, `pip list` or names line: '<html>'
    """
    names: set[str] = set()
    unread = []
    for number, line in enumerate(text.splitlines(), 1):
        found = line_names(line)
        if found is None:
            unread.append(f"wheelhouse: {source}:{number}: not a `pip freeze`, `pip list` or names line: {line!r}")
        else:
            names |= found
    if len(unread) > UNREAD_SHOWN:
        unread[UNREAD_SHOWN:] = [f"wheelhouse: {source}: and {len(unread) - UNREAD_SHOWN} more lines like these"]
    if unread:
        raise SystemExit("\n".join(unread))
    return names


def have_names(path: Path) -> set[str]:
    """The names in the `--have` file, read as UTF-8 (a byte-order mark allowed). Another encoding (PowerShell's
    `pip freeze > file` writes UTF-16) is refused, naming the line and byte, not guessed."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SystemExit(f"wheelhouse: {path}: cannot read: {error.strerror}") from None
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise SystemExit(
            f"wheelhouse: {path}:{line}: not UTF-8 (byte {data[error.start]:#04x} at offset {error.start}); "
            "save it as UTF-8"
        ) from None
    return names_in(text, str(path))


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def fetch(spec: str, python_version: str, machine: str, out: Path) -> str:
    """Download `spec` as a wheel for the target, else build one here from its source archive; what was done."""
    target = ["--python-version", python_version, "--implementation", "cp"]
    target += [arg for tag in MANYLINUX for arg in ("--platform", f"{tag}_{machine}")]
    wheel = pip("download", "-q", "--no-deps", "--only-binary=:all:", *target, "-d", str(out), spec)
    if wheel.returncode == 0:
        return "wheel"
    with tempfile.TemporaryDirectory(dir=out) as tmp:  # on `out`'s file system, for the move below
        built = pip("wheel", "-q", "--no-deps", "-w", tmp, spec)
        wheels = list(Path(tmp).glob("*-py3-none-any.whl")) + list(Path(tmp).glob("*-py2.py3-none-any.whl"))
        if built.returncode == 0 and wheels:
            for path in wheels:
                path.replace(out / path.name)
            return "built here (pure Python)"
    last = (wheel.stderr.strip().splitlines() or ["(no message)"])[-1]
    raise SystemExit(
        f"wheelhouse: {spec}: no wheel for Python {python_version} on {machine}, nor a pure-Python build: {last}"
    )


def fetch_all(names: list[str], python_version: str, machine: str, out: Path) -> None:
    """Fetch each of `names`, at the version installed here, into `out`: all or none. The wheels gather in a hidden
    folder inside `out` and move into it once every one is there, so a failure partway adds nothing to `out` (a
    wheelhouse short of some wheels would look complete)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".incomplete-") as staging:
        for i, name in enumerate(names, 1):
            version = installed_version(name)
            try:
                how = fetch(f"{name}=={version}" if version else name, python_version, machine, Path(staging))
            except SystemExit as failed:
                raise SystemExit(f"{failed.code}; so nothing was added to {out} ({i - 1} fetched, dropped)") from None
            print(f"[{i}/{len(names)}] {name} {version or '(not installed here: newest)'}: {how}", flush=True)
        for wheel in Path(staging).glob("*.whl"):
            wheel.replace(out / wheel.name)


def python_version(text: str) -> str:
    """`--python-version`, checked: X.Y or X.Y.Z, what pip's `--python-version` and the markers take."""
    if not PYTHON_VERSION.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python version like 3.12 or 3.12.3")
    return text


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--have", type=Path, help="the target's `pip freeze` or `pip list`, or names (UTF-8)")
    here = ".".join(map(str, sys.version_info[:3]))
    parser.add_argument("--python-version", type=python_version, default=here, help="the target's (3.12, 3.12.3)")
    parser.add_argument("--machine", choices=MACHINES, default="x86_64", help="the target's (`uname -m`)")
    parser.add_argument("--extras", nargs="*", default=[], help="the project's extras to include (gpu)")
    parser.add_argument("--exclude", nargs="*", default=[], help="distributions to leave out (not their needs)")
    parser.add_argument("--out", type=Path, default=Path("wheelhouse"), help="where the wheels go")
    args = parser.parse_args(argv)
    if args.have and not args.have.is_file():
        parser.error(f"--have {args.have}: no such file")
    return args


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    have = have_names(args.have) if args.have else set()
    if installed_version("centralrl") is None:
        raise SystemExit("wheelhouse: the project is not installed here; run `make setup` first")
    environment = target_environment(args.python_version, args.machine)
    root = f"centralrl[{','.join(args.extras)}]" if args.extras else "centralrl"
    needed = closure([root], installed_requires, environment)
    skipped = have | {canonicalize_name(n) for n in args.exclude} | {"centralrl", "torch"}
    if "torch" not in have:
        print(f"torch: not fetched (here: {installed_version('torch')}); install the target's own build there")
    todo = sorted(set(needed) - skipped)
    print(f"{len(needed)} distributions needed on the target, {len(needed) - len(todo)} there or left out")
    fetch_all(todo, args.python_version, args.machine, args.out)
    size = sum(p.stat().st_size for p in args.out.glob("*.whl")) / 2**20
    print(f"{args.out}: {len(list(args.out.glob('*.whl')))} wheels, {size:.1f} MiB")


if __name__ == "__main__":
    main()
