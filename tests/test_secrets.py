"""Secrets stay secret: a URL's credentials are masked (user:***@) in MLflow (a real sqlite store), in config
errors, in the plan and its preflight, and in what infra/start-mlflow.sh prints; a DVC-tracked URL refuses them.
The pipeline run with secrets in its environment is in test_pipeline.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from centralrl.config import load_config
from centralrl.errors import ConfigError
from centralrl.plan import main as plan_main
from centralrl.services import free_port
from centralrl.tracking import MlflowTracker
from conftest import REPO, write_params

SECRET = "SECRETPW"
URL = f"http://mlflow-user:{SECRET}@127.0.0.1:9"


def _files_holding(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_mlflow_params_tags_and_texts_hold_no_url_credentials(tmp_path, monkeypatch):
    import mlflow

    cfg = load_config(write_params(tmp_path, {"tracking": {"uri": URL}}))
    store = tmp_path / "store"
    store.mkdir()
    monkeypatch.chdir(store)  # the sqlite store and the artifacts (mlruns/) land here
    tracker = MlflowTracker(f"sqlite:///{store}/mlflow.db", "secrets")
    with tracker.run("cell", tags={"source": URL}, parent=cfg) as run:
        tracker.log_params({"tracking": cfg.tracking.model_dump()})
        tracker.log_text(f"served from {URL}", "notes.md")
    assert (store / "mlflow.db").is_file() and list(store.rglob("notes.md"))
    assert _files_holding(store, SECRET) == []
    logged = mlflow.MlflowClient(f"sqlite:///{store}/mlflow.db").get_run(run.info.run_id).data
    assert logged.params["tracking.uri"] == logged.tags["source"] == "http://mlflow-user:***@127.0.0.1:9"


def test_a_dvc_tracked_url_refuses_credentials_without_showing_them(tmp_path):
    params = write_params(tmp_path, {"retrieval": {"elasticsearch": {"url": f"http://elastic:{SECRET}@127.0.0.1:9"}}})
    with pytest.raises(
        ConfigError,
        match=r"retrieval\.elasticsearch\.url: http://elastic:\*\*\*@127\.0\.0\.1:9 holds "
        r"credentials, which DVC would copy verbatim into dvc\.lock",
    ) as caught:
        load_config(params)
    assert SECRET not in str(caught.value)


def test_the_plan_and_its_mlflow_probe_print_no_credentials(tmp_path, capsys):
    params = write_params(tmp_path, {"tracking": {"uri": URL}})
    assert plan_main(["--params", str(params), "--check"]) == 1  # nothing answers at port 9
    printed = capsys.readouterr().out
    assert "tracking: http://mlflow-user:***@127.0.0.1:9" in printed
    assert "missing mlflow server: no answer at http://mlflow-user:***@127.0.0.1:9" in printed
    assert SECRET not in printed


def test_start_mlflow_never_echoes_the_store_password(tmp_path):
    store = f"postgresql+psycopg2://mlflow:{SECRET}@127.0.0.1:9/mlflow"  # no such server: mlflow stops at once
    env = os.environ | {
        "MLFLOW_BACKEND_STORE_URI": store,
        "MLFLOW_PORT": str(free_port()),  # port 9 is refused to a user other than root, before mlflow starts
        "MLFLOW_ARTIFACTS_DESTINATION": str(tmp_path),
    }
    result = subprocess.run([REPO / "infra" / "start-mlflow.sh"], env=env, capture_output=True, text=True, timeout=120)
    assert "store postgresql+psycopg2://mlflow:***@127.0.0.1:9/mlflow" in result.stdout
    assert SECRET not in result.stdout + result.stderr
