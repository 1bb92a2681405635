"""Stage deps that cannot go stale: the static import closure, its hash, dvc.yaml's coverage of it, DVC's view."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from centralrl.codedeps import (
    entry_modules,
    main,
    module_file,
    project_sources,
    refresh_lock_deps,
    sources_sha256,
)
from centralrl.errors import CentralRLError
from tests.conftest import REPO

TINY_TREE = {
    "stages/__init__.py": "",
    "stages/entry.py": "import os\n\n\ndef main():\n    from centralrl.pkg import sub\n    import torch\n",
    "src/centralrl/__init__.py": "",
    "src/centralrl/pkg/__init__.py": "from .helper import VALUE\n",
    "src/centralrl/pkg/helper.py": "VALUE = 1\n",
    "src/centralrl/pkg/sub.py": "from .. import top\n",
    "src/centralrl/top.py": "import centralrl.deep.leaf\n",
    "src/centralrl/deep/__init__.py": "",
    "src/centralrl/deep/leaf.py": "",
    "src/centralrl/unused.py": "import centralrl.pkg\n",
    "flows/__init__.py": "",
}


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_project_sources_follows_lazy_from_relative_and_package_imports(tmp_path):
    root = write_tree(tmp_path, TINY_TREE)
    expected = sorted(Path(name) for name in TINY_TREE if name not in {"src/centralrl/unused.py", "flows/__init__.py"})
    assert project_sources([Path("stages/entry.py")], root) == expected
    leaf = ["src/centralrl/__init__.py", "src/centralrl/deep/__init__.py", "src/centralrl/deep/leaf.py"]
    assert project_sources([root / "src/centralrl/deep/leaf.py"], root) == [Path(name) for name in leaf]


def test_sources_sha256_depends_on_paths_and_contents_not_the_checkout_folder(tmp_path):
    first, second = write_tree(tmp_path / "a", TINY_TREE), write_tree(tmp_path / "b", TINY_TREE)
    sources = project_sources([Path("stages/entry.py")], first)
    assert sources_sha256(sources, first) == sources_sha256(sources, second)
    (second / "src/centralrl/top.py").write_text("import centralrl.deep.leaf  # edited\n")
    assert sources_sha256(sources, first) != sources_sha256(sources, second)
    assert sources_sha256(sources[1:], first) != sources_sha256(sources, first)


def test_importing_a_stage_loads_only_project_modules_of_its_static_closure():
    """A sanity check of the static analysis: what Python really loads at import is inside the closure."""
    modules = sorted({module for module in entry_modules(REPO / "dvc.yaml").values() if module})
    probe = (
        "import importlib, json, sys\n"
        "ours = lambda name: name.split('.')[0] in ('centralrl', 'stages', 'flows')\n"
        "loaded = {}\n"
        f"for module in {modules!r}:\n"
        "    for name in [name for name in sys.modules if ours(name)]: del sys.modules[name]\n"
        "    importlib.import_module(module)\n"
        "    loaded[module] = sorted(name for name in sys.modules if ours(name))\n"
        "print(json.dumps(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    for module, names in json.loads(result.stdout.splitlines()[-1]).items():
        closure = set(project_sources([module_file(module, REPO)], REPO))
        assert {module_file(name, REPO) for name in names} <= closure, module


@pytest.fixture
def workspace(tmp_path) -> Path:
    """The checkout's files (tracked and new, not ignored ones: no outputs) in a fresh git repository."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tmp_path / name)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    return tmp_path


def codedeps(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "centralrl.codedeps", *args], cwd=folder, capture_output=True, text=True
    )


def changed_deps(folder: Path) -> dict[str, set[str]]:
    """`dvc status` per stage: the deps it reports changed."""
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=folder, capture_output=True, text=True, check=True
    )
    return {
        stage: {path for entry in entries if isinstance(entry, dict) for path in entry.get("changed deps", {})}
        for stage, entries in json.loads(status.stdout).items()
    }


def lock_outs_and_params(lock: bytes) -> dict:
    """dvc.lock without what `--refresh-lock` rewrites (deps and cmd)."""
    document = yaml.safe_load(lock)
    return {
        **document,
        "stages": {
            name: {key: value for key, value in stage.items() if key not in ("deps", "cmd")}
            for name, stage in document["stages"].items()
        },
    }


def test_every_stage_deps_cover_its_imports_and_check_names_a_gap(workspace):
    """The checkout's dvc.yaml covers every stage's import closure: with one dep line removed, `--check` names
    that stage and file, and nothing else (`python -m centralrl.codedeps --check dvc.yaml` lists any gap)."""
    dvc_yaml = workspace / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("      - src/centralrl/report.py\n", "", 1))
    result = codedeps(workspace, "--check", "dvc.yaml")
    assert result.stdout.splitlines() == ["compare: deps do not cover src/centralrl/report.py"], result.stdout
    assert result.returncode == 1


def test_check_refuses_a_file_dvc_would_not_read_as_a_pipeline(tmp_path):
    other = tmp_path / "pipeline.yaml"  # was: no stage matched it, so "every stage's deps cover ..." and exit 0
    other.write_text("stages: {}\n")
    result = codedeps(tmp_path, "--check", "pipeline.yaml")
    assert result.returncode == 2 and "pipeline.yaml: DVC reads a pipeline only from a file named dvc.yaml" in (
        result.stderr
    )


@pytest.mark.parametrize(
    ("dvc_yaml", "lock", "message"),
    [
        ("stages:\n  a: [\n", "stages: {}\n", "DVC cannot read the pipeline: unable to read: "),
        ("stages:\n  a: [\n", "stages: {}\n", "but found '<stream end>' in \"<unicode string>\", line 3"),  # where
        (  # DVC's message said "validation failed: 2 errors" and no more
            "stages:\n  a:\n    cmd: 5\n    deps: 3\n",
            "stages: {}\n",
            "2 errors; expected str for dictionary value @ data['stages']['a']['cmd']; expected a list",
        ),
        ("stages:\n  a:\n    cmd: echo ${x}\n", "schema: '2.0'\nstages: {}\n", "failed to parse 'stages.a.cmd'"),
        ("stages:\n  a:\n    cmd: echo\n", None, "dvc.lock: no such file (nothing to refresh: run dvc repro)"),
        ("stages:\n  a:\n    cmd: echo\n", "folder", "dvc.lock: a folder, not a lock file (nothing to refresh"),
        ("stages:\n  a:\n    cmd: echo\n", "schema: '2.0'\n", "dvc.lock: not a DVC lock file (no stages mapping)"),
    ],
)
def test_a_pipeline_dvc_cannot_read_is_one_line(tmp_path, capsys, dvc_yaml, lock, message):
    """Each was a DVC traceback (or a KeyError) of 20-114 lines; dvc.lock is left as it was."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "dvc.yaml").write_text(dvc_yaml)
    if lock == "folder":  # was: "no such file"
        (tmp_path / "dvc.lock").mkdir()
    elif lock is not None:
        (tmp_path / "dvc.lock").write_text(lock)
    assert main(["--refresh-lock", str(tmp_path / "dvc.yaml")]) == 1
    assert message in capsys.readouterr().err
    assert lock in (None, "folder") or (tmp_path / "dvc.lock").read_text() == lock


@pytest.mark.slow
def test_refreshed_lock_then_a_code_edit_reruns_exactly_the_stages_that_import_it(workspace):
    before = (workspace / "dvc.lock").read_bytes()
    stale = yaml.safe_load(before)  # a command changed in dvc.yaml (an option added) that the lock predates
    stale["stages"]["prepare_data"]["cmd"] = "python -m stages.prepare_data --an-older-command"
    (workspace / "dvc.lock").write_text(yaml.safe_dump(stale, sort_keys=False))
    assert codedeps(workspace, "--refresh-lock", "dvc.yaml").returncode == 0
    refreshed = (workspace / "dvc.lock").read_bytes()
    assert codedeps(workspace, "--refresh-lock", "dvc.yaml").returncode == 0
    assert (workspace / "dvc.lock").read_bytes() == refreshed  # deterministic
    assert lock_outs_and_params(refreshed) == lock_outs_and_params(before)
    command = [yaml.safe_load(lock)["stages"]["prepare_data"]["cmd"] for lock in (refreshed, before)]
    assert command[0] == command[1]  # dvc.yaml's, again

    # from here on, no stage but those the edit below reaches has a changed code dep (the outputs are absent)
    (workspace / "src/centralrl/harness/__pycache__").mkdir()  # .dvcignore: bytecode is not a source
    (workspace / "src/centralrl/harness/__pycache__/engine.pyc").write_bytes(b"bytecode")
    code = ("src/", "stages/", "flows/", "profiles/")
    with (workspace / "src/centralrl/metrics.py").open("a") as metrics:
        metrics.write("# an edit\n")
    changed = {stage for stage, deps in changed_deps(workspace).items() if any(d.startswith(code) for d in deps)}
    importers = {
        stage
        for stage, module in entry_modules(workspace / "dvc.yaml").items()
        if Path("src/centralrl/metrics.py") in project_sources([module_file(module, workspace)], workspace)
    }
    assert changed == importers
    assert {"train", "evaluate", "evaluate_reference"} <= {stage.split("@")[0] for stage in changed}
    assert not any(stage.startswith("prepare_model") for stage in changed)

    # an edit that alters one stage's outputs: refresh the rest, keep that one stale so dvc repro reruns it
    kept = sorted(changed)[0]
    assert codedeps(workspace, "--refresh-lock", "dvc.yaml", "--keep", kept).returncode == 0
    assert {stage for stage, deps in changed_deps(workspace).items() if any(d.startswith(code) for d in deps)} == {
        kept
    }
    with pytest.raises(CentralRLError, match="--keep no_such_stage: no such stage in .*dvc.yaml"):
        refresh_lock_deps(workspace / "dvc.yaml", keep=["no_such_stage"])
