"""Shared fixtures: a private Prefect home, the smoke params written to a temp folder, the realqa samples."""

from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
REALQA = REPO.parent / "shared" / "data" / "realqa"


def _private_prefect_home() -> str:
    """A new folder for Prefect's database, removed when this process exits (each run left one in /tmp)."""
    home = tempfile.mkdtemp(prefix="centralrl-prefect-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


# Prefect reads these at import: keep its database out of the user's home and skip the analytics ping.
if "PYTEST_XDIST_WORKER" in os.environ:  # each worker its own database (workers inherit the controller's env),
    os.environ["PREFECT_HOME"] = _private_prefect_home()
    os.environ["OMP_NUM_THREADS"] = "1"  # and one torch thread, here and in its subprocesses: two workers share
elif "PREFECT_HOME" not in os.environ:  # the cores, and two threads each made decoding several times slower here
    os.environ["PREFECT_HOME"] = _private_prefect_home()
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DVC_NO_ANALYTICS"] = "1"  # the tests' fresh DVC repositories: each dvc call left a report file in /tmp
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def pytest_collection_modifyitems(config, items):
    """Longest first, so two workers finish together (`make test` keeps this order: --no-loadscope-reorder):
    the DVC pipeline file (two thirds of one worker's time), then the other files with slow tests, then the rest;
    within a file its slow tests first. xdist gives a worker its next file once at most 2 tests of its current
    one are left: with the pipeline file's quick tests first, the next file waited behind its 6-minute test."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(
        key=lambda item: (
            item.path.name != "test_pipeline.py",
            item.path not in slow_files,
            item.get_closest_marker("slow") is None,
        )
    )


SHARED_PREFECT = "CENTRALRL_TEST_PREFECT"  # "<url> <home>" of the server the xdist controller started
_SERVER = pytest.StashKey()  # that server, in the controller's config


def pytest_configure(config):
    """Under xdist, the controller starts the session's Prefect server (below) before it spawns the workers, which
    inherit its URL and home: one server instead of one per worker, booting while the workers collect (a worker's
    own took 8.5-22 s of its first test that needed one)."""
    if "PYTEST_XDIST_WORKER" in os.environ or not getattr(config.option, "numprocesses", None):
        return
    from centralrl import services

    home = Path(_private_prefect_home())
    server = services.start_prefect(services.free_port(), home=home, log_dir=home, api_only=True)
    config.stash[_SERVER] = server
    os.environ[SHARED_PREFECT] = f"{server.url} {home}"


def pytest_unconfigure(config):
    from centralrl import services

    if _SERVER in config.stash:
        services.stop(config.stash[_SERVER])


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """One temporary Prefect API server for every test that runs a flow, set as this process's PREFECT_API_URL
    (yields its home): the server a stage starts for itself (API only, no UI, no background services), which came
    up in 8.5 s here where `prefect_test_harness`'s full one took 20 s and kept its services busy all session.
    The xdist controller's (`pytest_configure`) when there is one, else this process's own."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from centralrl import services

    if SHARED_PREFECT in os.environ:
        url, home = os.environ[SHARED_PREFECT].split(" ", 1)
        _wait_answering(f"{url}/api/health", Path(home) / "prefect.log")
        with temporary_settings({PREFECT_API_URL: f"{url}/api"}):
            yield Path(home)
        return
    home = tmp_path_factory.mktemp("prefect-server")
    server = services.start_prefect(services.free_port(), home=home, log_dir=home, api_only=True)
    try:
        services.wait_healthy(server, timeout=120)
        with temporary_settings({PREFECT_API_URL: f"{server.url}/api"}):
            yield home
    finally:
        services.stop(server)


def _wait_answering(health_url: str, log: Path, timeout: float = 120) -> None:
    from centralrl import services

    deadline = time.monotonic() + timeout
    while not services.answers(health_url):
        assert time.monotonic() < deadline, f"the controller's Prefect server did not answer {health_url}; see {log}"
        time.sleep(0.5)


@pytest.fixture
def migrated_prefect_home(prefect_server, tmp_path) -> Callable[[str], Path]:
    """Makes a new Prefect home under tmp_path holding a copy of the session server's database, for a test
    whose processes start Prefect servers of their own: a server on an empty home first runs Prefect's
    migrations, 12.6 s of its 20.6 s start here (8.0 s on a migrated one)."""

    def make(name: str) -> Path:
        home = tmp_path / name
        home.mkdir()
        source = sqlite3.connect(f"file:{prefect_server / 'prefect.db'}?mode=ro", uri=True)  # no new empty one
        copy = sqlite3.connect(home / "prefect.db")
        try:
            source.backup(copy)  # consistent while the server writes, unlike a file copy beside its WAL
        finally:
            source.close()
            copy.close()
        return home

    return make


def project_pythonpath(root: Path = REPO, *extra: Path) -> dict[str, str]:
    """PYTHONPATH for a subprocess that runs the project's code from `root` (this checkout by default): root/src
    first, so `centralrl` is imported from it and not from the venv's editable install (which may point at another
    checkout's src: with PYTHONPATH=root alone the child ran that code), then root (stages/, flows/), then `extra`."""
    return {"PYTHONPATH": os.pathsep.join(str(path) for path in (root / "src", root, *extra))}


def session_prefect_env() -> dict[str, str]:
    """PREFECT_API_URL of the `prefect_server` this test runs under (empty outside one), for a stage started in a
    subprocess: it reports there instead of starting a server of its own (about 8 core-seconds each)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    return {"PREFECT_API_URL": url} if url else {}


@pytest.fixture
def realqa_dir() -> Path:
    if not REALQA.is_dir():
        pytest.skip(f"{REALQA} not found: the real-data samples live in ../shared beside the repo (CI has them)")
    return REALQA


def write_params(folder: Path, overrides: dict | None = None, profile: str = "smoke") -> Path:
    """Copy params.yaml and profiles/ into `folder`, select `profile`, merge `overrides` (into the profile
    too, which would otherwise win); return the params path."""
    from centralrl.config import MATRIX_AXES, deep_merge

    shutil.copytree(REPO / "profiles", folder / "profiles", dirs_exist_ok=True)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw = deep_merge(raw, {"profile": profile, **(overrides or {})})
    overlay = folder / "profiles" / f"{profile}.yaml"
    in_profile = {k: v for k, v in (overrides or {}).items() if k not in MATRIX_AXES}  # axes live in params.yaml only
    if in_profile and overlay.is_file():  # the profile wins over params.yaml, so the overrides go there too
        overlay.write_text(
            yaml.safe_dump(deep_merge(yaml.safe_load(overlay.read_text()) or {}, in_profile), sort_keys=False)
        )
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def hub_cache_repo(
    cache: Path, repo_id: str, repo_type: str, files: Path, commit: str = "c0" * 20, ref: str = "main"
) -> Path:
    """Put the folder `files` into the HF hub cache `cache` as huggingface_hub lays a download of `ref` (a branch or
    tag) out: blobs/<sha256>, snapshots/<commit>/<path> linked to them, refs/<ref> naming the commit; return the
    snapshot folder."""
    import hashlib

    from huggingface_hub.file_download import repo_folder_name

    repo = cache / repo_folder_name(repo_id=repo_id, repo_type=repo_type)
    snapshot = repo / "snapshots" / commit
    for file in sorted(p for p in files.rglob("*") if p.is_file()):
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(file, blob)
        link = snapshot / file.relative_to(files)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def smoke_params(tmp_path) -> Path:
    return write_params(tmp_path)


@pytest.fixture(scope="session")
def tiny_backbone(tmp_path_factory) -> Path:
    """The smoke backbone: a randomly initialised tiny Qwen2 with its small tokenizer, prepared once."""
    from centralrl.config import ModelConfig
    from centralrl.models.backbone import prepare_backbone

    folder = tmp_path_factory.mktemp("backbone") / "tiny"
    prepare_backbone(ModelConfig(source="tiny_qwen2"), folder)
    return folder


@pytest.fixture(scope="session")
def smoke_world(tmp_path_factory):
    """The smoke profile's synthetic world and a bm25s index over it."""
    from centralrl.config import load_config
    from centralrl.data.synthetic import generate
    from centralrl.retrieval.bm25 import Bm25sIndex

    folder = tmp_path_factory.mktemp("world")  # pytest's: removed with old test sessions, not left in /tmp
    cfg = load_config(write_params(folder))
    questions, passages = generate(cfg.data.synthetic)
    return questions, passages, Bm25sIndex.build(passages, cfg.retrieval.k1, cfg.retrieval.b, cfg.retrieval.stemming)


# The smoke world's questions give a random tiny model no reward at all (every group all zeros, so GRPO has
# nothing to follow). These tests train on a toy task the random model scores on about half the time: answer
# with one word from the first half of the alphabet (the conclusion writes one token). LoRA also adapts
# lm_head: a random tiny Qwen2's hidden states are too weak to move its near-uniform output otherwise. Rollouts in
# float32 on every CPU, so the seeded runs are the same on an AVX2 and a bf16 one (in bf16 the two-process run of
# tests/test_distributed.py learned nothing).
TOY = {
    "harness": {
        "max_turns": 1,
        "max_new_tokens": {"central": 4, "retrieval": 4, "conclusion": 1, "agent": 4},
        "precision": "float32",
    },
    "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj", "lm_head"]},
    "train": {"grpo": {"steps": 2, "questions_per_step": 2, "group_size": 4, "learning_rate": 0.05}},
    # cuts after one and two steps, and at the first step with any trained token (so: the first)
    "budgets": {"one_step": {"steps": 1}, "two_steps": {"steps": 2}, "any_token": {"trained_tokens": 1}},
}


def toy_questions(tokenizer, n: int = 16) -> list:
    from centralrl.metrics import normalize_answer
    from centralrl.schema import Question

    words = {normalize_answer(tokenizer.decode([i])) for i in range(len(tokenizer))}
    first_half = tuple(sorted(w for w in words if w.isalpha() and w[0] < "n"))
    return [
        Question(f"toy/{i}", f"Name a word from the first half of the alphabet ({i}).", first_half, "toy", "train")
        for i in range(n)
    ]


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, prefect_server):
    """Smoke data and index, the tiny backbone as the starting checkpoint, toy training questions, sqlite MLflow."""
    from centralrl.config import load_config
    from centralrl.io import write_jsonl
    from centralrl.models.backbone import load_backbone, prepare_backbone
    from stages import build_index, prepare_data

    folder = tmp_path_factory.mktemp("smoke")
    params = write_params(folder, {"tracking": {"uri": f"sqlite:///{folder}/mlflow.db"}, **TOY})
    data = {name: folder / f"{name}.jsonl" for name in ("train", "test", "corpus")}
    prepare_data.main(
        ["--params", str(params), *[f"--{k}={v}" for k, v in data.items()], f"--metrics={folder}/d.json"]
    )
    build_index.main(
        [
            "--params",
            str(params),
            "--corpus",
            str(data["corpus"]),
            "--questions",
            str(data["test"]),
            "--index",
            str(folder / "index"),
            "--metrics",
            str(folder / "r.json"),
        ]
    )
    prepare_backbone(load_config(params).backbone("main"), folder / "start")
    data["train"] = folder / "toy.jsonl"
    write_jsonl(data["train"], (q.to_json() for q in toy_questions(load_backbone(folder / "start")[1])))
    return folder, params, data


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder holding a previous result that refuses new entries: mode 555, and for root (whom modes do not
    stop) the immutable flag."""
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "result.json").write_text('{\n  "old": true\n}\n')
    folder.chmod(0o555)
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        folder.chmod(0o755)
        pytest.skip("root, and chattr +i is not allowed here: no folder can refuse root a new file")
    yield folder
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    folder.chmod(0o755)


def poison_adapter(folder: Path) -> None:
    """Write NaN over the first LoRA tensor of the adapter saved in `folder` (a damaged or diverged adapter)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = folder / "adapter_model.safetensors"
    tensors = load_file(weights)
    first = min(name for name in tensors if "lora_" in name)
    save_file(tensors | {first: torch.full_like(tensors[first], float("nan"))}, weights)
