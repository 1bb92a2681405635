"""`infra/wheelhouse.py`: which distributions a machine without network needs, from this environment's real
package metadata. Downloading needs PyPI, so it is not run here; the rest is."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO
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
