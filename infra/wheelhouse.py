"""Wheels for a machine without network access (an air-gapped GPU node, a cluster's compute node).

    python infra/wheelhouse.py --have target-packages.txt --python-version 3.12 --out wheelhouse

It walks the requirements of the installed project (`centralrl`, plus `--extras`) through this environment's
package metadata, extras included (prefect's `sqlalchemy[asyncio]` brings greenlet), with each requirement's
environment marker evaluated for the target (its Python version, Linux, `--machine`). It leaves out what the
target already has (`--have`: its `pip freeze` or `pip list`, or names) and `--exclude`, and downloads the rest,
each at the version installed here (the versions the tests ran with), as wheels for the target's Python and
platform. A package published only as a source archive is built into a wheel here (pure Python only: a compiled
one needs building on the target's platform). A needed package not installed here is downloaded at its newest
version, and said so. On the target, from this checkout:

    pip install --no-index --no-deps wheelhouse/*.whl && pip install --no-index --no-deps --no-build-isolation -e .

Markers are evaluated for CPython on Linux. torch is never fetched: the target needs its own build (CUDA, say)
from the PyTorch index, and the wheels here are the ones that build's absence does not change.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
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


def names_in(text: str) -> set[str]:
    """Canonical distribution names from a `pip freeze`, a `pip list` or a list of names.

    >>> sorted(names_in("Torch==2.11.0\\nnumpy @ file:///x\\nPackage    Version\\n---------- -------\\nscipy 1.16.0"))
    ['numpy', 'scipy', 'torch']
    >>> sorted(names_in("accelerate, aiohttp, typing_extensions"))
    ['accelerate', 'aiohttp', 'typing-extensions']
    """
    names = set()
    for line in text.replace(",", "\n").splitlines():
        match = NAME.match(line)
        if match and line.split()[:2] != ["Package", "Version"]:  # pip list's header
            names.add(canonicalize_name(match.group(1)))
    return names


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def fetch(spec: str, python_version: str, machine: str, out: Path) -> str:
    """Download `spec` as a wheel for the target, else build one here from its source archive; what was done."""
    target = ["--python-version", python_version, "--implementation", "cp"]
    target += [arg for tag in MANYLINUX for arg in ("--platform", f"{tag}_{machine}")]
    wheel = pip("download", "-q", "--no-deps", "--only-binary=:all:", *target, "-d", str(out), spec)
    if wheel.returncode == 0:
        return "wheel"
    with tempfile.TemporaryDirectory() as tmp:
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


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--have", type=Path, help="the target's packages: its `pip freeze` or `pip list`, or names")
    parser.add_argument("--python-version", default=platform.python_version(), help="the target's (3.12, 3.12.3)")
    parser.add_argument("--machine", default="x86_64", help="the target's processor (x86_64, aarch64)")
    parser.add_argument("--extras", nargs="*", default=[], help="the project's extras to include (gpu)")
    parser.add_argument("--exclude", nargs="*", default=[], help="distributions to leave out (not their needs)")
    parser.add_argument("--out", type=Path, default=Path("wheelhouse"), help="where the wheels go")
    args = parser.parse_args(argv)
    if args.have and not args.have.is_file():
        parser.error(f"--have {args.have}: no such file")
    return args


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    if installed_version("centralrl") is None:
        raise SystemExit("wheelhouse: the project is not installed here; run `make setup` first")
    have = names_in(args.have.read_text()) if args.have else set()
    environment = target_environment(args.python_version, args.machine)
    root = f"centralrl[{','.join(args.extras)}]" if args.extras else "centralrl"
    needed = closure([root], installed_requires, environment)
    skipped = have | {canonicalize_name(n) for n in args.exclude} | {"centralrl", "torch"}
    if "torch" not in have:
        print(f"torch: not fetched (here: {installed_version('torch')}); install the target's own build there")
    todo = sorted(set(needed) - skipped)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{len(needed)} distributions needed on the target, {len(needed) - len(todo)} there or left out")
    for i, name in enumerate(todo, 1):
        version = installed_version(name)
        how = fetch(f"{name}=={version}" if version else name, args.python_version, args.machine, args.out)
        print(f"[{i}/{len(todo)}] {name} {version or '(not installed here: newest)'}: {how}", flush=True)
    size = sum(p.stat().st_size for p in args.out.glob("*.whl")) / 2**20
    print(f"{args.out}: {len(list(args.out.glob('*.whl')))} wheels, {size:.1f} MiB")


if __name__ == "__main__":
    main()
