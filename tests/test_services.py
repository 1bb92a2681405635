"""The pipeline run the way users run it: `python -m centralrl.services ui` (real Prefect and MLflow servers),
prefect.yaml deployed with `prefect deploy` onto a real local Prefect server and run by a real process worker,
and the experiment flows' dvc command lines (checked against the real dvc.yaml's stage names)."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from centralrl import services
from centralrl.errors import ConfigError, TrackingError
from centralrl import dvc_runs

from conftest import REPO, project_pythonpath, session_prefect_env, write_params

PARAMS = {
    "profile": "default",
    "seeds": [0, 1],
    "backbones": ["main"],
    "references": {"base": {}, "single_agent": {}},
    "arms": {"central_only": {"x": 1}, "joint": {"x": 2}},
}


def need(*names: str) -> None:
    for name in names:
        try:
            services.executable(name)
        except services.ServiceError:
            pytest.skip(f"the `{name}` executable is not installed beside {sys.executable} nor on PATH")


def dvc(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True, env=dvc_runs.dvc_env()
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# ---- the dvc command lines ---------------------------------------------------------------------------------


def test_dvc_command_uses_repro_unless_params_differ():
    assert dvc_runs.dvc_command(PARAMS, "default", None, None, None, False) == ["repro"]
    assert dvc_runs.dvc_command(PARAMS, "default", None, [0, 1], ["build_index"], True) == [
        "repro",
        "--dry",
        "build_index",
    ]
    assert dvc_runs.dvc_command(PARAMS, "smoke", ["joint"], [3], None, False) == [
        "exp",
        "run",
        "-S",
        "profile=smoke",
        "-S",
        "seeds=[3]",
        "evaluate@joint-3-main",
    ]


def test_arms_become_stage_targets_and_unknown_arms_fail():
    targets = dvc_runs.stage_targets(PARAMS, ["train", "evaluate_reference"], ["central_only"], None)
    assert targets == ["train@central_only-0-main", "train@central_only-1-main", "evaluate_reference"]
    with pytest.raises(ConfigError, match="unknown arm.*'centrl_only'.*central_only, joint"):
        dvc_runs.stage_targets(PARAMS, None, ["centrl_only"], None)
    with pytest.raises(
        ConfigError, match=r"arms narrows only the train and evaluate stages, and targets \['compare'\]"
    ):
        dvc_runs.stage_targets(PARAMS, ["compare"], ["joint"], None)  # was: compare alone, the arm dropped


@pytest.mark.parametrize("empty", ["arms", "seeds", "targets"])
def test_an_empty_selection_is_refused_not_read_as_everything(empty):
    chosen = {"arms": ["joint"], "seeds": [0], "targets": ["evaluate"]} | {empty: []}
    with pytest.raises(ConfigError, match=f"{empty}: an empty list selects nothing"):
        dvc_runs.dvc_command(PARAMS, "default", chosen["arms"], chosen["seeds"], chosen["targets"], True)


@pytest.mark.parametrize("name", ["arms", "targets"])
def test_a_blank_name_in_a_selection_is_refused(name):
    """`--targets ''` ran `dvc exp run ... ''`, which DVC read as the whole pipeline."""
    chosen = {"arms": ["joint"], "targets": ["evaluate"]} | {name: ["evaluate", " "]}
    with pytest.raises(ConfigError, match=f"{name}: a blank name selects nothing"):
        dvc_runs.dvc_command(PARAMS, "default", chosen["arms"], [0], chosen["targets"], True)


def test_the_experiment_script_keeps_params_yamls_profile_unless_told(tmp_path):
    """`--profile` defaulted to the literal "default": with `profile: smoke` in params.yaml, a plain run started
    `dvc exp run -S profile=default`, the hour-long experiment, and wrote default back into params.yaml."""
    from flows.experiment import command

    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    params = yaml.safe_load((REPO / "params.yaml").read_text()) | {"profile": "smoke"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert command(str(tmp_path), None, None, None, ["train"], True)[3:] == ["repro", "--dry", "train"]
    assert "profile=default" in command(str(tmp_path), "default", None, None, None, True)


def test_the_experiment_script_validates_a_profile_before_dvc_writes_it_into_params(tmp_path):
    """`--profile` was only looked for as a file: one with an unknown key (or a matrix axis) became `dvc exp run -S
    profile=...`, which wrote it into params.yaml, where it stayed when prepare_data refused it."""
    from flows.experiment import command

    params = write_params(tmp_path, profile="default")
    (tmp_path / "profiles" / "typo.yaml").write_text("train:\n  grpo:\n    stepz: 3\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml \(profile typo\):\n  train\.grpo\.stepz: unknown param"):
        command(str(tmp_path), "typo", None, None, None, True)
    assert "profile=smoke" in command(str(tmp_path), "smoke", None, [7], None, True)
    assert yaml.safe_load(params.read_text())["profile"] == "default"


@pytest.mark.parametrize(("name", "twice"), [("arms", ["joint", "joint"]), ("seeds", [1, 0, 1])])
def test_a_selection_naming_something_twice_is_refused_before_dvc_writes_params(name, twice):
    """`--seeds 1 1` ran `dvc exp run -S seeds=[1,1]`: DVC wrote it into params.yaml, and a stage refused it later."""
    chosen = {"arms": ["joint"], "seeds": [0], "targets": ["evaluate"]} | {name: twice}
    with pytest.raises(ConfigError, match=f"{name}: {twice[0]} given twice; name each once"):
        dvc_runs.dvc_command(PARAMS, "default", chosen["arms"], chosen["seeds"], chosen["targets"], True)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "0", 2**63])
def test_a_seed_that_is_no_whole_number_from_0_is_refused_before_dvc_writes_params(bad):
    """A deployment run with seeds [-1] ran `dvc exp run -S seeds=[-1]`, which wrote it into params.yaml; 2**63
    passed this check, though params' `Seed` refuses it."""
    with pytest.raises(ConfigError, match=re.escape(f"seeds: {bad!r} is not a seed")):
        dvc_runs.dvc_command(PARAMS, "default", None, [0, bad], None, True)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("- a\n- b\n", "expected a mapping of params, got list"),
        ("a: [\n", "not valid YAML"),
        ("profile: default\nbackbones: [main]\narms: {a: {}}\n", "seeds (an axis of the DVC matrix) must be a list"),
    ],
)
def test_a_bad_params_file_is_named_before_dvc_runs(tmp_path, text, says):
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'params.yaml'}: {says}")):
        dvc_runs.read_params(tmp_path)


def test_an_unknown_profile_is_named_with_the_known_ones():
    params = dvc_runs.read_params(REPO)
    dvc_runs.check_profile(REPO, params, "smoke")
    for bad in ("bogus", ""):
        with pytest.raises(ConfigError, match=f"profile '{bad}': no profiles/{bad}.yaml in .*known: default, "):
            dvc_runs.check_profile(REPO, params, bad)


def test_the_experiment_script_parses_its_arguments_and_names_a_bad_one(prefect_server):
    """`--help` used to start a full `dvc repro` (any argument but --dry was ignored, a typo too)."""
    script = [sys.executable, str(REPO / "flows" / "experiment.py")]
    env = os.environ | session_prefect_env()
    shown = subprocess.run([*script, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0 and "--profile" in shown.stdout and "--dry" in shown.stdout
    bad = subprocess.run(
        [*script, "--profile", "bogus", "--dry"], capture_output=True, text=True, env=env, timeout=300
    )
    assert bad.returncode == 1 and "experiment: error: profile 'bogus': no profiles/bogus.yaml" in bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr


def dry_experiment_with_prefect_api(url: str) -> subprocess.CompletedProcess:
    """`flows/experiment.py --dry` for one stage, with PREFECT_API_URL set to `url`."""
    return subprocess.run(
        [sys.executable, str(REPO / "flows" / "experiment.py"), "--dry", "--targets", "prepare_data"],
        capture_output=True,
        text=True,
        env=os.environ | {"PREFECT_API_URL": url},
        timeout=120,
    )


def test_the_experiment_script_names_a_prefect_api_that_does_not_answer():
    """A stale PREFECT_API_URL was a 112-line traceback from Prefect's client."""
    url = f"http://127.0.0.1:{services.free_port()}/api"
    done = dry_experiment_with_prefect_api(url)
    assert done.returncode == 1 and done.stderr.startswith(f"experiment: error: PREFECT_API_URL={url}: no Prefect")
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_the_experiment_script_names_a_prefect_api_url_it_cannot_parse_in_one_line_as_a_stage_does():
    """Prefect validates PREFECT_API_URL when it is imported: `http://[::1` was a 39-line pydantic traceback."""
    url = "http://[::1"
    done = dry_experiment_with_prefect_api(url)
    with pytest.raises(services.ServiceError) as stage:
        services.check_prefect_api(url)  # what a stage says (`stage_prefect_server`)
    assert (done.returncode, done.stderr) == (1, f"experiment: error: {stage.value}\n")


@pytest.mark.parametrize(
    "flow, stage", [("indexing", "build_index"), ("training", "train"), ("evaluation", "evaluate")]
)
def test_a_stages_flow_module_run_as_a_script_names_its_stage(flow, stage):
    """`python flows/training.py --help` printed nothing and exited 0: a module, not a script."""
    done = subprocess.run([sys.executable, f"flows/{flow}.py", "--help"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1 and f"run by its stage: python -m stages.{stage} --help" in done.stderr


def test_a_dry_run_that_met_missing_inputs_says_why():
    """DVC's dry run fails on a stage whose inputs an upstream stage has not made yet (DVC issue #9021)."""
    from flows.experiment import _hint

    failed = ["ERROR: failed to reproduce 'build_index': [Errno 2] No such file or directory: 'data/corpus.jsonl'"]
    assert "DVC issue #9021" in _hint(["python", "-m", "dvc", "exp", "run", "--dry"], failed)
    assert _hint(["python", "-m", "dvc", "repro"], failed) == ""  # a real run that failed: its own lines say why
    alone = _hint(["python", "-m", "dvc", "repro", "--single-item", "--dry"], failed)  # the evaluation flow
    assert "DVC issue #9021" not in alone and "missing for a real run too: make it first" in alone
    copied = _hint(["python", "-m", "dvc", "exp", "run", "-S", "profile=smoke", "--single-item", "--dry"], failed)
    assert "DVC issue #9021" in copied  # `exp run` dry-runs in a copy of the workspace without the outputs


def test_arm_targets_are_stages_of_the_real_dvc_yaml(tmp_path):
    """The names built for arms are the names DVC gives the real pipeline's matrix stages."""
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    dvc(tmp_path, "init", "--no-scm", "-q")
    stages = set(dvc(tmp_path, "stage", "list", "--name-only").split())
    params = dvc_runs.read_params(tmp_path)
    arms = list(params["arms"])
    wanted = dvc_runs.stage_targets(params, ["train", "evaluate"], arms, None)
    assert len(wanted) == 2 * len(arms) * len(params["seeds"]) * len(params["backbones"])
    assert set(wanted) <= stages, set(wanted) - stages
    assert set(dvc_runs.EVALUATION_STAGES) <= {name.split("@")[0] for name in stages}


def test_stream_returns_the_exit_code_and_last_lines(tmp_path):
    lines: list[str] = []
    script = "import sys\nfor i in range(60): print(i)\nsys.exit(3)"
    code, tail = dvc_runs.stream([sys.executable, "-c", script], tmp_path, lines.append)
    assert code == 3 and lines == [str(i) for i in range(60)]
    assert tail == [str(i) for i in range(60 - dvc_runs.TAIL_LINES, 60)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_flow_takes_its_dvc_down():
    """dvc ran in a session of its own: a flow run SIGKILLed (Prefect's cancel, 30 s after SIGTERM) left `dvc
    repro` running and holding the repo's lock. The interrupt's grace ends before that SIGKILL."""
    assert dvc_runs.INTERRUPT_GRACE + 5 < 30
    child = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    flow = f"import sys; from centralrl.dvc_runs import stream; stream([sys.executable, '-c', {child!r}], '.', print)"
    with subprocess.Popen([sys.executable, "-c", flow], stdout=subprocess.PIPE, text=True) as parent:
        pid = int(parent.stdout.readline())
        parent.kill()
    deadline = time.monotonic() + 10
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if running(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the child outlived its SIGKILLed starter")


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ---- services: start-up errors -----------------------------------------------------------------------------


def test_a_taken_port_is_named_before_anything_starts(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a log folder would be made
    with socket.socket() as holder:
        holder.bind((services.HOST, 0))
        holder.listen()
        port = holder.getsockname()[1]
        code = services.main(["ui", "--prefect-port", str(services.free_port()), "--mlflow-port", str(port)])
    assert code == 1
    assert f"MLflow: port {port} on 127.0.0.1 is already in use" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no empty log folder left behind


def test_start_mlflow_names_a_taken_port_and_fails():
    """A taken port printed the script's banner and exited 0 about 30 s later."""
    with socket.socket() as holder:
        holder.bind((services.HOST, 0))
        holder.listen()
        port = holder.getsockname()[1]
        script, env = REPO / "infra" / "start-mlflow.sh", os.environ | {"MLFLOW_PORT": str(port)}
        done = subprocess.run([script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert f"start-mlflow.sh: port {port} on 127.0.0.1 cannot be bound (Address already in use)" in done.stderr


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("print('listening... no: bad config'); raise SystemExit(3)", "(code 3): listening... no: bad config"),
        # a store that is not a database: MLflow's 20-line traceback was the message; now its last line
        ("print('starting'); raise ValueError('file is not a database')", "(code 1): ValueError: file is not a"),
    ],
)
def test_a_server_that_dies_during_start_up_is_named_with_its_last_words(tmp_path, code, said):
    command = [sys.executable, "-c", code]
    service = services._spawn("MLflow", command, dict(os.environ), "http://127.0.0.1:9", "/health", tmp_path)
    with pytest.raises(services.ServiceError) as failed:
        services.wait_healthy(service, timeout=30)
    assert str(failed.value).startswith(f"MLflow exited during start-up {said}")
    assert "Traceback" not in str(failed.value) and f"(its log: {service.log})" in str(failed.value)


# ---- the UI command, for real ------------------------------------------------------------------------------


def _read_lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_ui_starts_both_servers_and_stops_them_on_ctrl_c(tmp_path, monkeypatch, migrated_prefect_home):
    """... run in a folder of a DVC repository, it serves the repository's store and artifacts folder, named in
    full (it made an empty store in the working directory and said it was the pipeline's), and a run logging to
    that MLflow server when it stops is told so in one error (not a traceback after minutes of retries)."""
    need("prefect", "mlflow")
    import mlflow
    import psutil

    from centralrl.errors import TrackingError
    from centralrl.tracking import MlflowTracker

    prefect_port, mlflow_port = services.free_port(), services.free_port()
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "sub").mkdir()
    command = [
        sys.executable,
        "-m",
        "centralrl.services",
        "ui",
        "--prefect-port",
        str(prefect_port),
        "--mlflow-port",
        str(mlflow_port),
        "--mlflow-store",
        "sqlite:///mlflow.db",
        "--mlflow-artifacts",
        "artifacts",
        "--prefect-home",
        str(migrated_prefect_home("prefect")),
        "--log-dir",
        str(tmp_path / "logs"),
        "--timeout",
        "90",
    ]
    ui = subprocess.Popen(
        command,
        cwd=tmp_path / "sub",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(ui.stdout, lines), daemon=True).start()
    output, deadline = [], time.monotonic() + 120
    try:
        while not any("Ctrl-C stops both servers" in line for line in output):
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            assert line is not None, "the ui command exited early:\n" + "".join(output)
            output.append(line)
        text = "".join(output)
        assert f"http://127.0.0.1:{prefect_port}" in text and f"http://127.0.0.1:{mlflow_port}" in text
        assert f"export PREFECT_API_URL=http://127.0.0.1:{prefect_port}/api" in text
        assert f"(store sqlite:///{tmp_path / 'mlflow.db'}, artifacts {tmp_path / 'artifacts'})" in text
        assert services.answers(f"http://127.0.0.1:{prefect_port}/api/health")
        assert services.answers(f"http://127.0.0.1:{mlflow_port}/health")
        children = psutil.Process(ui.pid).children(recursive=True)
        assert len(children) >= 2
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the default ~30 s of retries, cut short
        tracker = MlflowTracker(f"http://user:secret@127.0.0.1:{mlflow_port}", "probe")
        with pytest.raises(TrackingError, match=r"user:\*\*\*@.*no MLflow server answers.*stopped answering while"):
            with tracker.run("cell"):
                tracker.log_metrics({"reward": 0.5}, step=1)
                ui.send_signal(signal.SIGINT)
                assert ui.wait(60) == 0
                tracker.log_metrics({"reward": 0.6}, step=2)
    finally:
        mlflow.set_tracking_uri(None)
        if ui.poll() is None:
            ui.kill()
    assert not [child.pid for child in children if _alive(child.pid)]
    assert not services.answers(f"http://127.0.0.1:{prefect_port}/api/health")
    assert not services.answers(f"http://127.0.0.1:{mlflow_port}/health")
    assert (tmp_path / "mlflow.db").is_file() and list((tmp_path / "sub").iterdir()) == []


# ---- deployments on a real Prefect server and process worker ----------------------------------------------

TINY_DVC_YAML = """
stages:
  prepare_data:
    cmd: echo data > data.txt
    outs: [data.txt]
  train:
    matrix: {arm: "${arms}", seed: "${seeds}", backbone: "${backbones}"}
    cmd: mkdir -p train/${item.arm}-${item.seed} && echo trained > train/${item.arm}-${item.seed}/a.txt
    deps: [data.txt]
    params: ["arms.${item.arm}"]
    outs: ["train/${item.arm}-${item.seed}"]
  evaluate:
    matrix: {arm: "${arms}", seed: "${seeds}", backbone: "${backbones}"}
    cmd: mkdir -p eval/${item.arm}-${item.seed} && echo evaluated > eval/${item.arm}-${item.seed}/a.txt
    deps: ["train/${item.arm}-${item.seed}"]
    params: ["arms.${item.arm}"]
    outs: ["eval/${item.arm}-${item.seed}"]
  evaluate_reference:
    matrix: {reference: "${references}", backbone: "${backbones}"}
    cmd: mkdir -p eval/${item.reference} && echo evaluated > eval/${item.reference}/a.txt
    deps: [data.txt]
    outs: ["eval/${item.reference}"]
  compare:
    cmd: ls -R eval > compare.txt
    deps: [eval, train]
    outs: [compare.txt]
"""


@pytest.fixture
def tiny_repo(tmp_path) -> Path:
    """A DVC repo (no git) with the real pipeline's stage names and matrix axes, reproduced once, then one
    arm's params changed so that its stages are stale."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    (repo / "dvc.yaml").write_text(TINY_DVC_YAML)
    dvc(repo, "init", "--no-scm", "-q")
    dvc(repo, "repro", "-q")
    (repo / "params.yaml").write_text(yaml.safe_dump(PARAMS | {"arms": PARAMS["arms"] | {"joint": {"x": 3}}}))
    return repo


def _start(name: str, command: list[str], env: dict[str, str], log_dir: Path) -> services.Service:
    return services._spawn(name, command, env, "", "", log_dir)


@pytest.mark.slow
def test_deployments_run_on_a_process_worker(prefect_server, tmp_path, tiny_repo):
    """prefect.yaml, deployed as the README says, runs `evaluation` (dry) to COMPLETED on a process worker;
    `experiment` fails with dvc's last lines when dvc fails. On the session's API server (deployments, work
    pools and workers need no server services)."""
    need("prefect")
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.deployments import run_deployment

    home, logs = tmp_path / "prefect-home", tmp_path / "logs"
    logs.mkdir()
    env = (
        os.environ
        | session_prefect_env()
        | {
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
        }
    )
    cli = [services.executable("prefect"), "--no-prompt"]
    for args in (["work-pool", "create", "centralrl-local", "--type", "process"], ["deploy", "--all"]):
        done = subprocess.run(cli + args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    worker = _start("worker", cli + ["worker", "start", "--pool", "centralrl-local", "--limit", "1"], env, logs)
    try:
        run = run_deployment(
            "evaluation/evaluation",
            timeout=120,
            poll_interval=1,
            parameters={"repo": str(tiny_repo), "arms": ["joint"], "dry_run": True},
        )
        assert run.state.is_completed(), f"{run.state}\nworker log:\n{worker.tail(40)}"
        with get_client(sync_client=True) as client:
            for _ in range(20):  # the flow run's last logs may land a moment after its final state
                logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
                messages = [log.message for log in logs]
                if any("evaluate_reference" in message for message in messages[1:]):
                    break
                time.sleep(0.5)
            schedule = client.read_deployment_by_name("experiment/experiment").schedules[0]
        failed = run_deployment(
            "experiment/experiment",
            timeout=120,
            poll_interval=1,
            parameters={"repo": str(tiny_repo), "targets": ["no_such_stage"]},
        ).state
    finally:
        services.stop(worker)
    text = "\n".join(messages)
    assert "dvc repro --single-item --dry evaluate@joint-0-main evaluate@joint-1-main evaluate_reference" in text
    assert "Running stage 'evaluate@joint-0-main'" in text and "Running stage 'train@" not in text
    assert (tiny_repo / "eval" / "joint-0" / "a.txt").read_text() == "evaluated\n"  # dry: nothing ran
    assert schedule.active is False and schedule.schedule.cron == "0 2 * * *"
    assert failed.is_failed() and "Stage 'no_such_stage' not found" in failed.message


FAILING_FLOW = """
import os
import sys
sys.path.insert(0, {src!r})
from centralrl.services import stage_prefect_server


def get_ready():  # runs while the server starts, as a stage validates its params and imports torch and Prefect
    import prefect  # noqa: F401
    print("URL set before the server answered:", os.environ["PREFECT_API_URL"].startswith("http://127.0.0.1:"))


with stage_prefect_server(meanwhile=get_ready):
    from prefect import flow

    @flow
    def fails():
        raise ValueError("boom")

    try:
        fails()
    except ValueError:
        print("the flow failed", flush=True)
"""


def test_a_stage_server_takes_the_flow_logs_before_it_stops(tmp_path, migrated_prefect_home):
    """Prefect sends a failed flow's logs in the background; sent after the stage's server stopped, they used to
    print 'Error logging to API' under the stage's own error message. Prefect imported while the server starts
    (a stage's set-up overlaps it) reports to that server."""
    script = tmp_path / "failing_flow.py"
    script.write_text(FAILING_FLOW.format(src=str(REPO / "src")))
    home = migrated_prefect_home("prefect")
    env = os.environ | {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "the flow failed" in run.stdout, run.stderr
    assert "URL set before the server answered: True" in run.stdout
    assert "Error logging to API" not in run.stdout + run.stderr


LOGGING_STAGE = """
import sys
sys.argv = ["logging_stage", "--params", {params!r}]
from stages.cli import run_stage, stage_parser


def main():
    from prefect import flow, get_run_logger
    from prefect.runtime import flow_run

    @flow
    def says_goodbye():
        get_run_logger().warning("goodbye from the stage")  # the tests send WARNING and up
        print("flow run", flow_run.id, flush=True)

    says_goodbye()


run_stage(main, stage_parser("A stage that logs a warning.").parse_args, prefect_server=True)
"""


def test_a_stage_that_ends_sends_its_flow_logs_to_a_long_lived_server(prefect_server, tmp_path):
    """A stage ends with os._exit (`stages.cli.end_process`) after Prefect's exit hooks: the logs its flow queued
    reach the server named by PREFECT_API_URL (as `make ui`'s), which outlives the stage."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    script = tmp_path / "logging_stage.py"
    script.write_text(LOGGING_STAGE.format(params=str(write_params(tmp_path))))
    env = os.environ | project_pythonpath() | session_prefect_env()
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    flow_run_id = run.stdout.split("flow run ")[1].split()[0]
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    assert "goodbye from the stage" in [log.message for log in logs]


@pytest.mark.parametrize("port", ["99999", "0", "http"])
def test_a_port_out_of_range_is_a_usage_error(port, capsys):
    with pytest.raises(SystemExit) as stop:
        services.main(["ui", "--prefect-port", port])
    assert stop.value.code == 2 and f"{port!r} is not a port (1 to 65535)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, named",
    [
        (["--log-dir", "{file}"], "argument --log-dir: {file}: {file} exists and is not a folder"),  # FileExistsError
        (["--log-dir", "{file}/logs"], "argument --log-dir: {file}/logs: {file} exists and is not a folder"),
        (["--prefect-home", "{file}"], "argument --prefect-home: {file}: {file} exists and is not a folder"),
        (["--mlflow-store", "http://u:pw@127.0.0.1:9"], "http://u:***@127.0.0.1:9: not a database URI"),  # MLflow's
        (  # was: MLflow's traceback as the server exited
            ["--mlflow-store", "postgresql+psycopg2://u:pw@db/mlflow"],
            "postgresql+psycopg2://u:***@db/mlflow: its driver module 'psycopg2' is not installed (pip install "
            "'psycopg2-binary')",
        ),
        (["--mlflow-store", "mysql+nodriver://db/m"], "driver 'nodriver' of mysql is not one SQLAlchemy knows"),
        (  # MLflow made the folder and a new store there, in silence
            ["--mlflow-store", "sqlite:///{file}-nope/x.db"],
            "sqlite:///{file}-nope/x.db: its folder {file}-nope does not exist (make it, or correct the path)",
        ),
        (
            ["--log-dir", "/proc/x"],
            "argument --log-dir: /proc/x: cannot be made: /proc takes no new file",
        ),  # traceback
        (["--prefect-home", ""], "argument --prefect-home: a blank folder; name one"),  # was: the working directory
        (["--mlflow-artifacts", ""], "argument --mlflow-artifacts: a blank folder; name one"),  # as --prefect-home
        (
            ["--timeout", "-1"],
            "argument --timeout: '-1' is not a number of seconds above 0",
        ),  # was: the server's fault
        (["--prefect-port", "4301", "--mlflow-port", "4301"], "are both 4301; each server needs its own"),
    ],
)
def test_ui_refuses_arguments_it_cannot_use_before_starting_anything(tmp_path, capsys, args, named):
    file = tmp_path / "afile"
    file.write_text("")
    with pytest.raises(SystemExit) as stop:
        services.main(["ui", *(a.format(file=file) for a in args)])
    assert stop.value.code == 2 and named.format(file=file) in capsys.readouterr().err


def test_ui_takes_a_relative_store_and_artifacts_from_the_repository_root_as_the_stages_do(tmp_path, monkeypatch):
    """Run in a folder of the repository, it served a new empty store there, not the one the stages log to."""
    repo, elsewhere = tmp_path / "repo", tmp_path / "elsewhere"
    (repo / ".dvc").mkdir(parents=True)
    (repo / "sub").mkdir()
    elsewhere.mkdir()
    (elsewhere / "kept.db").write_bytes(b"")
    monkeypatch.chdir(repo / "sub")
    assert services.store_uri("sqlite:///mlflow.db") == f"sqlite:///{repo / 'mlflow.db'}"
    assert services.artifacts_folder("mlartifacts") == str(repo / "mlartifacts")
    assert services.store_uri(f"sqlite:///{elsewhere / 'm.db'}") == f"sqlite:///{elsewhere / 'm.db'}"
    monkeypatch.chdir(elsewhere)  # no repository: a store file already there is served, named in full
    if not any((folder / ".dvc").is_dir() for folder in elsewhere.parents):
        assert services.store_uri("sqlite:///kept.db") == f"sqlite:///{elsewhere / 'kept.db'}"


def test_ui_outside_a_repository_refuses_a_relative_store_it_would_make_empty(tmp_path, monkeypatch, capsys):
    if any((folder / ".dvc").is_dir() for folder in (tmp_path, *tmp_path.parents)):
        pytest.skip(f"{tmp_path} is inside a DVC repository")
    monkeypatch.chdir(tmp_path)
    with socket.socket() as holder:  # were the store accepted, `ui` would stop at this taken port
        holder.bind((services.HOST, 0))
        holder.listen()
        port = str(holder.getsockname()[1])
        with pytest.raises(SystemExit) as stop:
            services.main(["ui", "--prefect-port", str(services.free_port()), "--mlflow-port", port])
    assert stop.value.code == 2 and list(tmp_path.iterdir()) == []
    assert (
        "argument --mlflow-store: sqlite:///mlflow.db: no DVC repository (a folder holding .dvc/) at or above "
        f"{tmp_path} to take mlflow.db from, and no {tmp_path / 'mlflow.db'}; "
    ) in capsys.readouterr().err


# ---- the tracking store ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tables, options",
    [
        (["notes"], ""),
        (["alembic_version", "flow_run"], ""),  # Prefect's database (alembic-managed, as MLflow's is) passed
        (["notes"], "?timeout=30"),  # SQLAlchemy's options: the file 'notes.db?timeout=30' was checked, and missing
    ],
)
def test_another_applications_sqlite_database_is_refused_as_a_store_and_left_as_it_was(tmp_path, tables, options):
    """MLflow added its 66 tables to it in silence (the notes table stayed, among them)."""
    notes = tmp_path / "notes.db"
    with contextlib.closing(sqlite3.connect(notes)) as database, database:
        for table in tables:
            database.execute(f"CREATE TABLE {table} (text TEXT)")
            database.execute(f"INSERT INTO {table} VALUES ('not MLflow''s')")
    before = notes.read_bytes()
    with pytest.raises(TrackingError) as refused:
        services.check_reachable(f"sqlite:///{notes}{options}")
    assert str(refused.value) == (
        f"tracking.uri sqlite:///{notes}{options}: {notes} is another application's SQLite database, not an MLflow "
        f"store (its tables: {', '.join(tables)})"
    )
    assert notes.read_bytes() == before


def test_a_new_an_empty_and_an_mlflow_sqlite_store_are_allowed(tmp_path):
    import mlflow

    mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()  # MLflow makes its store
    (tmp_path / "empty.db").write_bytes(b"")
    with contextlib.closing(sqlite3.connect(tmp_path / "tableless.db")) as database:
        database.execute("PRAGMA user_version = 1")  # a SQLite header, no table
    for name in ("mlflow.db", "empty.db", "tableless.db", "new.db"):
        assert services.unusable_sqlite_file(f"sqlite:///{tmp_path / name}") is None, name
