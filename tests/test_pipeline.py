"""The first stages as users run them: the stage CLIs, the Prefect indexing flow, and `dvc repro` itself."""

from __future__ import annotations

import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from centralrl.attribution import PLACES
from centralrl.errors import BackboneError, ConfigError, DataError
from stages import build_index, prepare_data

from conftest import REPO, project_pythonpath, session_prefect_env, write_params


def _prepare(params: Path, out: Path) -> dict[str, Path]:
    paths = {name: out / f"{name}.jsonl" for name in ("train", "test", "corpus")} | {"metrics": out / "data.json"}
    prepare_data.main(["--params", str(params), *[f"--{k}={v}" for k, v in paths.items()]])
    return paths


def test_prepare_data_writes_every_output_and_same_bytes_twice(smoke_params, tmp_path):
    first = _prepare(smoke_params, tmp_path / "a")
    second = _prepare(smoke_params, tmp_path / "b")
    for name in first:
        assert first[name].read_bytes() == second[name].read_bytes(), name
    counts = json.loads(first["metrics"].read_text())
    assert counts["test"]["synth-2hop"]["questions"] == 3  # smoke: test_per_type 3
    assert counts["train"]["synth-4hop"]["with_decomposition"] == 6
    assert counts["corpus_passages"] == sum(1 for _ in first["corpus"].open())


def test_a_failing_prepare_leaves_previous_outputs_whole(smoke_params, tmp_path):
    outputs = _prepare(smoke_params, tmp_path)
    before = {name: path.read_bytes() for name, path in outputs.items()}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"], "metadata": {}}\n{"id": \n')
    broken = write_params(
        tmp_path / "broken",
        {
            "data": {
                "questions": [
                    {"kind": "synthetic"},
                    {"kind": "flashrag_jsonl", "path": str(bad), "benchmark": "x", "split": "test"},
                ]
            }
        },
    )
    with pytest.raises(DataError, match=r"bad\.jsonl:2: malformed JSON"):
        _prepare(broken, tmp_path)
    assert {name: path.read_bytes() for name, path in outputs.items()} == before


def test_build_index_flow_reports_recall_for_every_benchmark(prefect_server, smoke_params, tmp_path):
    data = _prepare(smoke_params, tmp_path)
    metrics = tmp_path / "retrieval.json"
    build_index.main(
        [
            "--params",
            str(smoke_params),
            "--corpus",
            str(data["corpus"]),
            "--questions",
            str(data["test"]),
            str(data["train"]),
            "--index",
            str(tmp_path / "index"),
            "--metrics",
            str(metrics),
        ]
    )
    table = json.loads(metrics.read_text())
    assert set(table) == {"test", "train"}
    assert set(table["test"]) == {
        f"synth-{t}" for t in ("1hop", "2hop", "3hop", "4hop", "comparison", "bridge_comparison")
    }
    one_hop = table["test"]["synth-1hop"]
    assert 0.0 <= one_hop["recall@1"] <= one_hop["recall@3"] <= one_hop["recall@5"] <= 1.0
    assert (tmp_path / "index" / "manifest.json").is_file()

    row = json.loads(Path(data["test"]).read_text().splitlines()[0]) | {"supporting_passage_ids": ["p-gone"]}
    refused = {  # was: an index, with recall of {} for that split / recall quietly 0 for the question
        "empty.jsonl": ("", r"empty\.jsonl: no questions to measure recall on"),
        "stray.jsonl": (json.dumps(row) + "\n", r"stray\.jsonl \(corpus .*\): supporting passages missing from the "),
    }
    for name, (text, message) in refused.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(DataError, match=message):
            build_index.main(
                [
                    *("--params", str(smoke_params), "--corpus", str(data["corpus"])),
                    *("--questions", str(tmp_path / name), "--index", str(tmp_path / "index2")),
                    *("--metrics", str(tmp_path / "r2.json")),
                ]
            )
        assert not (tmp_path / "index2").exists()  # refused before the build

    corpus = data["corpus"].read_text()  # a corpus made by hand skips prepare_data's checks: build_index has them
    for name, text, message in [
        ("blank.jsonl", "   ", r"blank\.jsonl: 1 row\(s\) refused: passage p-new \('New'\) has no text"),
        ("long.jsonl", "w" * 20_001, r"long\.jsonl: 1 row\(s\) refused: passage p-new \('New'\) has 20001 characters"),
    ]:
        (tmp_path / name).write_text(corpus + json.dumps({"id": "p-new", "title": "New", "text": text}) + "\n")
        with pytest.raises(DataError, match=message):
            build_index.main(
                [
                    *("--params", str(smoke_params), "--corpus", str(tmp_path / name)),
                    *("--questions", str(data["test"]), "--index", str(tmp_path / "index2")),
                    *("--metrics", str(tmp_path / "r2.json")),
                ]
            )
        assert not (tmp_path / "index2").exists()


# Credentials a user's shell may hold while the pipeline runs; none may reach an output, the store or the log.
SECRETS = {
    "ELASTIC_PASSWORD": "ESPASSWORD0",
    "ELASTIC_API_KEY": "ESAPIKEY0",
    "AWS_SECRET_ACCESS_KEY": "AWSSECRET0",
    "MLFLOW_TRACKING_PASSWORD": "MLPASSWORD0",
    "MLFLOW_TRACKING_URI": "http://mlflow:URLPASSWORD0@127.0.0.1:9",
}


def _run(command: list[str], cwd: Path) -> str:
    """Run `command` with the secrets above in its environment; its stdout and stderr (the log). The stages run the
    code copied into `cwd` (the code their DVC deps and fingerprints hash), not this checkout's or the venv's."""
    # every stage's flow reports to the test server instead of starting its own (seconds per stage saved)
    env = (
        os.environ
        | SECRETS
        | project_pythonpath(cwd)
        | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "ELASTIC_USERNAME": "elastic"}
        | session_prefect_env()
    )
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def _assert_no_secret_in(folder: Path, log: str) -> None:
    """No secret value in the log or in any file under `folder` (outputs, DVC cache, dvc.lock, mlflow.db, mlruns/)."""
    secrets = ["URLPASSWORD0", *SECRETS.values()]
    assert [s for s in secrets if s in log] == []
    files = [p for p in folder.rglob("*") if p.is_file() and ".git" not in p.parts]
    assert [(str(p), s) for p in files for s in secrets if s.encode() in p.read_bytes()] == []


@pytest.mark.slow
def test_dvc_repro_runs_the_matrix_to_a_report_then_has_nothing_to_do_and_reruns_to_the_same_bytes(
    prefect_server, tmp_path, monkeypatch
):
    """What `make experiment` does, on the smoke profile, in a fresh git + DVC repository: every cell of
    arms x seeds x budgets, the references, the verdict report, and MLflow runs under one parent; with secrets
    in the environment (one inside a URL), none of which reaches an output, dvc.lock, the store or the log."""
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    for name in ("profiles", "stages", "flows", "src"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    # every kind of cell, each once: more seeds, or the single-agent reference (its stage: test_movement), would
    # only add stage processes (~25 s each here, nearly all of it imports)
    smoke = params | {"profile": "smoke", "seeds": [0], "references": {"base": params["references"]["base"]}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(smoke, sort_keys=False))
    _run(["git", "init", "-q"], tmp_path)
    _run(["dvc", "init", "-q"], tmp_path)

    log = _run(["dvc", "repro"], tmp_path)
    _assert_no_secret_in(tmp_path, log)
    lock = (tmp_path / "dvc.lock").read_text()
    for cell in (
        "train@central_only-0-main",
        "train@joint-0-main",
        "evaluate@joint-0-main",
        "evaluate_reference@base-main",
    ):
        assert f"{cell}:" in lock
    assert "Data and pipelines are up to date" in _run(["dvc", "repro"], tmp_path)

    result = json.loads((tmp_path / "metrics" / "compare.json").read_text())
    equal_tokens = result["backbones"]["main"]["budgets"]["equal_tokens"]
    # the random tiny Qwen2 answers no smoke test question, trained or not: every paired difference is 0, so the
    # sign-flip p is 1 and the verdict can only be inconclusive
    for metric in ("f1", "acc"):
        for arm in ("central_only", "joint"):
            assert equal_tokens["arms"][arm]["seeds"]["0"]["scores"][metric]["macro"]["estimate"] == 0.0
        claim = equal_tokens["claim"][metric]
        assert claim["seeds"]["0"]["macro"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
        assert claim["seeds"]["0"]["p_value"] == 1.0 and set(claim["seeds"]) == {"0"}
        assert claim["verdict"] == "inconclusive"
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Verdict" in report and "## What each arm spent" in report and "47.79" in report
    assert "## Where the wrong answers were lost" in report
    lost = result["lost"]["main"]
    tables = [*lost["references"].values()] + [
        table for arms in lost["budgets"].values() for seeds in arms.values() for table in seeds.values()
    ]
    assert len(tables) == 1 + 2 * 2  # base; 2 arms x 1 seed x 2 budgets
    assert all(t["right"] + sum(t[place] for place in PLACES) == t["questions"] == 18 for t in tables)
    assert {p.name for p in (tmp_path / "report").glob("*.png")} >= {"training_main.png", "f1_vs_compute_main.png"}
    assert (tmp_path / "report" / "report.html").read_text().startswith("<!doctype html>")
    _assert_one_parent_run(tmp_path / "mlflow.db")

    # a rerun of one cell's evaluation and the comparison, by their dvc.lock commands, writes the same bytes (a
    # train stage's own, and the upstream stages', have their tests: test_training's resumed run against a straight
    # one, test_warmstart); in this process, as the stage processes' imports would cost ~30 s more
    rerun = {name: yaml.safe_load(lock)["stages"][name] for name in ("evaluate@central_only-0-main", "compare")}
    made = {out["path"]: _bytes_under(tmp_path / out["path"]) for stage in rerun.values() for out in stage["outs"]}
    monkeypatch.chdir(tmp_path)
    for stage in rerun.values():
        module, *argv = shlex.split(stage["cmd"])[2:]  # python -m stages.<name> ...
        importlib.import_module(module).main(argv)
    assert [path for path, files in made.items() if _bytes_under(tmp_path / path) != files] == []

    # a damaged cut is named before any cut is evaluated, and the stage's output is whole or absent: a failure
    # in the second cut left the first one's records behind
    cuts = json.loads((tmp_path / "train/main/joint/seed0/budgets.json").read_text())["cuts"]
    last = min(b for b in cuts if cuts[b]["step"] == max(cut["step"] for cut in cuts.values()))
    weights = tmp_path / "train/main/joint/seed0/adapters" / last / "central" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    shutil.rmtree(tmp_path / "eval/main/joint/seed0")
    module, *argv = shlex.split(yaml.safe_load(lock)["stages"]["evaluate@joint-0-main"]["cmd"])[2:]
    with pytest.raises(BackboneError, match=f"{last}/central: not a LoRA adapter this model can load"):
        importlib.import_module(module).main(argv)
    assert not (tmp_path / "eval/main/joint/seed0").exists()


def _bytes_under(path: Path) -> dict[str, bytes]:
    """Every file at or under `path`, by its path relative to `path`."""
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(file.relative_to(path)): file.read_bytes() for file in files if file.is_file()}


def _assert_one_parent_run(store: Path) -> None:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("centralrl").experiment_id], max_results=500)
    parents = {r.info.run_id for r in runs if "centralrl.experiment" in r.data.tags}
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in parents]
    assert len(parents) == 1
    cells = {
        (r.data.tags["stage"], r.data.tags.get("arm"), r.data.tags.get("seed"), r.data.tags.get("budget"))
        for r in children
    }
    assert ("evaluate", "joint", "0", "equal_tokens") in cells and ("train", "central_only", "0", None) in cells
    assert all(r.data.tags["git_commit"] for r in children)
    assert all(r.data.tags["dvc_stage"].startswith(r.data.tags["stage"]) for r in children)  # train@..., compare
    hashes = {r.data.tags["dvc_deps_sha256"] for r in children if r.data.tags["dvc_stage"] == "evaluate@joint-0-main"}
    assert len(hashes) == 1 and len(hashes.pop()) == 64  # every cut a stage evaluated: the same deps
    assert {r.data.tags["cpu_bf16"] for r in children} <= {"yes", "no"}
    assert all(r.data.tags["cpu_capability"] and r.data.tags["torch"] == torch.__version__ for r in children)


def test_prepare_data_stops_first_naming_what_the_profile_needs(tmp_path, monkeypatch):
    """A paper profile on this machine: no GPU, no hub, no cluster. The first stage says so before any work."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_cache"))  # offline, an empty cache: no model
    params = write_params(
        tmp_path, {"retrieval": {"elasticsearch": {"url": "http://127.0.0.1:9"}}}, profile="paper-3b"
    )
    with pytest.raises(
        ConfigError, match=r"lacks what profile 'paper-3b' needs(.|\n)*missing +hugging face hub(.|\n)*elasticsearch"
    ):
        _prepare(params, tmp_path / "out")
    assert not (tmp_path / "out").exists()
