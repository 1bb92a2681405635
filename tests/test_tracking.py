"""A local sqlite MLflow store as stages use it (real MLflow): stages that start at once share a fresh store, each
logs its run, and the experiment has one parent run (real processes released together); a relative store is the
DVC repository's, even when DVC runs the stages in a temporary copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import project_pythonpath, write_params

from centralrl.config import TrackingConfig
from centralrl.tracking import open_tracker

CELL = """
import pathlib, sys, time
import mlflow  # imported before the start signal, so the processes reach the store together
from centralrl.config import load_config
from centralrl.tracking import MlflowTracker
folder, uri, name = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(folder / f"{name}.ready").touch()
while not (folder / "go").exists():
    time.sleep(0.005)
tracker = MlflowTracker(uri, "centralrl")
with tracker.run(name, tags={"stage": "train", "arm": name}, parent=load_config(folder / "params.yaml")):
    tracker.log_metrics({"reward": 1.0}, step=0)
"""

CELLS = 4


def test_stages_starting_at_once_share_a_fresh_sqlite_store_under_one_parent(tmp_path):
    import mlflow

    write_params(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = os.environ | project_pythonpath()
    cells = [
        subprocess.Popen(
            [sys.executable, "-c", CELL, str(tmp_path), uri, f"cell{i}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(CELLS)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.ready"))) < CELLS and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / "go").touch()
    outputs = [cell.communicate(timeout=180)[0] for cell in cells]
    assert [cell.returncode for cell in cells] == [0] * CELLS, "\n".join(outputs)

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("centralrl").experiment_id])
    parents = [r for r in runs if "centralrl.experiment" in r.data.tags]
    children = {r.data.tags["arm"] for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id}
    assert len(parents) == 1 and children == {f"cell{i}" for i in range(CELLS)}


def test_a_relative_sqlite_store_is_the_dvc_repositorys_even_from_a_temporary_copy(tmp_path, monkeypatch):
    """`dvc exp run --temp` and `--queue` run the stages in a temporary copy of the repository, with `DVC_ROOT`
    naming the repository: a run and its artifacts land in the repository's store, nothing in the copy."""
    import mlflow

    repo = tmp_path / "repo"
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpcopy"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.setenv("DVC_ROOT", str(repo))
    tracker = open_tracker(TrackingConfig(uri="sqlite:///mlflow.db", experiment="queued", system_metrics=False))
    with tracker.run("train@joint-0-main"):
        tracker.log_text("a transcript", "transcripts/0.txt")

    assert list(copy.iterdir()) == []
    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("queued").experiment_id])
    assert run.info.run_name == "train@joint-0-main"
    assert [p.read_text() for p in (repo / "mlruns").rglob("0.txt")] == ["a transcript"]


def test_a_run_whose_server_stopped_is_closed_without_retrying_again(tmp_path, monkeypatch):
    """The failed log's retries are the only ones: closing the run retried as long again (65 s in all with the
    default retries, where about 30 s were said)."""
    import mlflow

    from centralrl import services
    from centralrl.errors import TrackingError
    from centralrl.tracking import MlflowTracker

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")  # 0 + 2 + 4 s of backoff per failed request
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    port = services.free_port()
    server = services.start_mlflow(port, f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "artifacts", tmp_path)
    try:
        services.wait_healthy(server)
        services.check_reachable(f"http://user:pw@127.0.0.1:{port}")  # a real server passes the stricter check
        tracker = MlflowTracker(f"http://127.0.0.1:{port}", "gone")
        with pytest.raises(TrackingError, match="stopped answering while the stage ran"):
            with tracker.run("cell"):
                tracker.log_metrics({"reward": 0.5}, step=1)
                services.stop(server)
                started = time.monotonic()
                tracker.log_metrics({"reward": 0.6}, step=2)
        assert time.monotonic() - started < 10  # one request's retries (6 s); 13.7 s when the close retried too
        assert mlflow.active_run() is None
    finally:
        mlflow.set_tracking_uri(None)
        services.stop(server)


DVC_YAML = """
stages:
  prepare:
    cmd: echo
    outs: [data/train.jsonl]
    metrics: [{metrics/data.json: {cache: false}}]
  train:
    matrix: {arm: [a, b]}
    cmd: echo
    outs:
      - train/${item.arm}/adapters
    metrics:
      - metrics/train/${item.arm}.json:
          cache: false
  compare:
    cmd: echo
    outs: [{report: {cache: false}}]
"""


def test_the_git_commit_is_dirty_for_a_changed_source_not_for_the_pipelines_outputs(tmp_path, monkeypatch):
    """`dvc repro` rewrites dvc.lock and the git-tracked metrics and report as the stages finish: every run's
    `git_commit` read '<sha>-dirty', a changed source included or not."""
    from centralrl.config import load_config
    from centralrl.tracking import cell_tags

    cfg = load_config(write_params(tmp_path / "params"))
    repo = tmp_path / "repo"
    files = ["dvc.yaml", "dvc.lock", "src.py", "metrics/data.json", "metrics/train/a.json", "report/report.md"]
    for name in files:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(DVC_YAML if name == "dvc.yaml" else "before\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    monkeypatch.chdir(repo)

    for name in files[1:]:
        (repo / name).write_text("after\n")
        assert cell_tags(cfg)["git_commit"] == (f"{head}-dirty" if name == "src.py" else head), name
        subprocess.run([*git, "checkout", "-q", "--", name], check=True)


def test_a_runs_dvc_tag_is_the_hash_of_its_stages_deps_not_of_dvc_lock(tmp_path, monkeypatch):
    """dvc.lock's hash was the tag: `dvc repro` rewrites the lock as each stage finishes, so the runs of one
    experiment had 16 hashes in 22 runs. The hash of the stage's deps changes with them and nothing else."""
    from dvc.repo import Repo

    from centralrl.config import load_config
    from centralrl.tracking import cell_tags

    cfg = load_config(write_params(tmp_path / "params"))
    repo = tmp_path / "repo"
    repo.mkdir()
    Repo.init(str(repo), no_scm=True).close()
    stage = {"cmd": "echo", "deps": ["src.py", "data.txt"], "params": ["a"], "outs": ["out.txt"]}
    (repo / "dvc.yaml").write_text(json.dumps({"stages": {"train": stage}}))
    for name, text in {"src.py": "code", "data.txt": "data", "params.yaml": "a: 1\nb: 1\n", "out.txt": "out"}.items():
        (repo / name).write_text(text)
    monkeypatch.chdir(repo)
    assert (cell_tags(cfg)["dvc_stage"], cell_tags(cfg)["dvc_deps_sha256"]) == ("none", "none")  # not under DVC

    monkeypatch.setenv("DVC_STAGE", "train")
    with Repo(str(repo)) as running, running.lock:  # `dvc repro` holds the project's lock while its stages run
        tags = cell_tags(cfg)
    assert tags["dvc_stage"] == "train" and len(tags["dvc_deps_sha256"]) == 64 and "dvc_lock_sha256" not in tags
    (repo / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")  # what the run writes: the same stage ran
    (repo / "out.txt").write_text("another out")
    (repo / "params.yaml").write_text("a: 1\nb: 2\n")  # a param the stage does not read
    assert cell_tags(cfg)["dvc_deps_sha256"] == tags["dvc_deps_sha256"]
    hashes = {tags["dvc_deps_sha256"]}
    for name, text in {"params.yaml": "a: 2\nb: 2\n", "data.txt": "other data", "src.py": "other code"}.items():
        (repo / name).write_text(text)
        hashes.add(cell_tags(cfg)["dvc_deps_sha256"])
    assert len(hashes) == 4
