"""`infra/wheelhouse.py`: which distributions a machine without network needs, from this environment's real
package metadata. Downloading needs PyPI, so it is not run here; the rest is."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO
from packaging.utils import canonicalize_name
from infra import wheelhouse

TARGET = wheelhouse.target_environment("3.12", "x86_64")


def test_closure_follows_extras_and_target_markers():
    requires = {
        "app": ["lib[fast]", "old-backport; python_version < '3.11'", "winonly; sys_platform == 'win32'"],
        "lib": ["speedup; extra == 'fast'", "docs-tool; extra == 'docs'", "base"],
        "base": [],
        "speedup": ["lib"],  # a cycle back to a package already walked
    }
    assert set(wheelhouse.closure(["app"], requires.get, TARGET)) == {"app", "lib", "base", "speedup"}
    older = wheelhouse.target_environment("3.10", "x86_64")
    assert "old-backport" in wheelhouse.closure(["app"], requires.get, older)


def test_an_extra_asked_after_its_package_was_walked_is_walked_too():
    for first_plain in (["b", "lib"], ["lib", "b"]):  # the walk meets plain `lib` before `lib[fast]`, and after
        requires = {"a": first_plain, "b": ["lib[fast]"], "lib": ["speedup; extra == 'fast'"], "speedup": []}
        needed = wheelhouse.closure(["a"], requires.get, TARGET)
        assert needed["lib"] == {"fast"} and "speedup" in needed, first_plain


def test_the_installed_project_needs_sqlalchemy_asyncio_greenlet():
    """prefect asks for sqlalchemy[asyncio], whose greenlet a walk that ignored extras would miss (it did, by
    hand, on the first GPU machine: Prefect's server would not start)."""
    needed = wheelhouse.closure(["centralrl"], wheelhouse.installed_requires, TARGET)
    assert {"prefect", "dvc", "mlflow", "bm25s", "sqlalchemy", "greenlet"} <= set(needed)
    assert "asyncio" in needed["sqlalchemy"]


def test_nothing_to_fetch_when_the_target_has_everything(tmp_path):
    freeze = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True)
    have = tmp_path / "have.txt"
    have.write_text(freeze.stdout)
    run = subprocess.run(
        [sys.executable, "infra/wheelhouse.py", "--have", str(have), "--out", str(tmp_path / "wheels")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    assert f"{tmp_path / 'wheels'}: 0 wheels" in run.stdout


def test_a_missing_have_file_is_named(tmp_path):
    run = subprocess.run(
        [sys.executable, "infra/wheelhouse.py", "--have", str(tmp_path / "absent.txt")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 2 and "absent.txt: no such file" in run.stderr


def wheelhouse_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The tool run as a user runs it, from the repository root."""
    return subprocess.run(
        [sys.executable, "infra/wheelhouse.py", *args], capture_output=True, text=True, cwd=REPO, env=env
    )


def test_a_have_file_not_in_utf8_is_refused_naming_the_line(tmp_path):
    have = tmp_path / "have.txt"
    have.write_bytes(b"numpy==2.0\n\xff\xfe\n")
    run = wheelhouse_run("--have", str(have), "--out", str(tmp_path / "wheels"))
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"{have}:2: not UTF-8 (byte 0xff at offset 11)" in run.stderr
    assert not (tmp_path / "wheels").exists()


def test_unreadable_have_lines_are_refused_before_anything_is_fetched(tmp_path):
    have = tmp_path / "have.txt"
    pip_list = "Package Version\n------- -------\nnumpy   2.0.0\n\n# the GPU node\n"
    have.write_text(f"{pip_list}<html>\nnumpy is there\ntorch==2.11.0\n")
    run = wheelhouse_run("--have", str(have), "--out", str(tmp_path / "wheels"))
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.splitlines() == [
        f"wheelhouse: {have}:6: not a `pip freeze`, `pip list` or names line: '<html>'",
        f"wheelhouse: {have}:7: not a `pip freeze`, `pip list` or names line: 'numpy is there'",
    ]
    assert not (tmp_path / "wheels").exists()


def test_an_unknown_target_is_refused_before_any_work(tmp_path):
    for flag, value in (("--python-version", "banana"), ("--python-version", "3"), ("--machine", "sparc")):
        run = wheelhouse_run(flag, value, "--out", str(tmp_path / "wheels"))
        assert run.returncode == 2 and f"argument {flag}: " in run.stderr and repr(value) in run.stderr, run.stderr
    assert not (tmp_path / "wheels").exists()


def test_a_failure_partway_adds_nothing_to_the_wheelhouse(tmp_path):
    """Of the two distributions the target lacks, the first is in a local index and the second nowhere: its
    failure leaves `--out` as it was, not short of a wheel. No network: pip sees only the local folder."""
    needed = wheelhouse.closure(["centralrl"], wheelhouse.installed_requires, TARGET)
    first, second = sorted(set(needed) - {"centralrl", "torch"})[:2]
    freeze = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True)
    have = tmp_path / "have.txt"
    lines = freeze.stdout.splitlines()
    have.write_text("\n".join(line for line in lines if canonicalize_name(line.split("==")[0]) not in (first, second)))
    index = tmp_path / "index"
    index.mkdir()
    tiny_wheel(index, first, wheelhouse.installed_version(first))
    out = tmp_path / "wheels"
    out.mkdir()
    (out / "earlier-1.0-py3-none-any.whl").write_bytes(b"kept")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_CONFIG_FILE": os.devnull}
    run = wheelhouse_run("--have", str(have), "--python-version", "3.12", "--out", str(out), env=env)
    assert run.returncode == 1 and f"[1/2] {first} " in run.stdout, run.stdout + run.stderr
    assert f"wheelhouse: {second}==" in run.stderr and f"nothing was added to {out} (1 fetched, dropped)" in run.stderr
    assert [path.name for path in out.iterdir()] == ["earlier-1.0-py3-none-any.whl"]


def tiny_wheel(folder: Path, name: str, version: str) -> None:
    """An empty but valid pure-Python wheel of `name` `version`, for a local index."""
    stem = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{stem}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{stem}.dist-info/RECORD", "")
