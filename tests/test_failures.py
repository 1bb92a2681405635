"""Failures that name themselves: one line and exit 1 for a known error, a traceback for a bug; outputs whole
or untouched when a write fails; stale temporaries cleaned; text refused before it can break an output;
cross-field params refused at load time; the training launch bound to 127.0.0.1."""

from __future__ import annotations

import errno
import importlib
import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from centralrl.config import load_config
from centralrl.data.formats import records
from centralrl.distributed import launch_command
from centralrl.errors import ConfigError, DataError, OutputError
from centralrl.io import (
    atomic_directory,
    atomic_files,
    clean_stale_temporaries,
    read_jsonl,
    write_json,
    write_jsonl,
    write_rows,
)
from conftest import REPO, project_pythonpath, session_prefect_env, write_params

STAGE = """
import errno, os, sys
from stages.cli import run_stage, stage_parser
from centralrl.io import write_json

def arguments(argv):
    parser = stage_parser("A stage that fails the way it is told.")
    parser.add_argument("what")
    parser.add_argument("target")
    return parser.parse_args(argv)

def main():
    args = arguments(sys.argv[1:])
    what, target = args.what, args.target
    if what == "missing":
        open(target)
    if what == "full":
        def full(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.fsync = full  # the disk fills up while the output is written
        write_json(target, {"new": True})
    if what == "bug":
        1 / 0

if __name__ == "__main__":
    run_stage(main, arguments)
"""


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | project_pythonpath() | {"OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_a_stage_subprocess_runs_this_checkouts_code(tmp_path):
    """The subprocesses of these tests import `centralrl` and `stages` from this checkout, not from the venv's
    editable install (which may be another checkout's src: with PYTHONPATH the repo root alone, they were)."""
    done = run(["-c", "import centralrl, stages; print(centralrl.__file__); print(stages.__file__)"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        str(REPO / "src" / "centralrl" / "__init__.py"),
        str(REPO / "stages" / "__init__.py"),
    ]


@pytest.fixture
def stage(tmp_path) -> Path:
    write_params(tmp_path)
    (tmp_path / "tiny_stage.py").write_text(STAGE)
    return tmp_path


USAGE_ERRORS = """
import importlib, sys
from stages.cli import run_stage
codes = {}
for name in ("prepare_data", "build_index", "prepare_model", "warmstart", "train", "evaluate", "compare"):
    stage = importlib.import_module(f"stages.{name}")
    sys.argv = [f"{name}.py", "--no-such-option"]
    try:
        run_stage(stage.main, stage.arguments, prefect_server=True, tracked=True)
    except SystemExit as stop:
        codes[name] = stop.code
print(codes, sorted(m for m in ("torch", "prefect", "mlflow", "transformers") if m in sys.modules))
"""


def test_a_usage_error_ends_every_stage_before_any_server_or_heavy_import(tmp_path):
    """Each stage parses its command line first: a typo is answered in about a second (it took 11-16 s when
    the stage started its Prefect server, imported torch and validated the params before parsing)."""
    done = run(["-c", USAGE_ERRORS], tmp_path)
    stages = ("prepare_data", "build_index", "prepare_model", "warmstart", "train", "evaluate", "compare")
    assert done.stdout == f"{dict.fromkeys(stages, 2)} []\n", done.stderr
    assert done.stderr.count(": error: the following arguments are required: ") == len(stages)


def test_a_stage_help_describes_it_in_its_whole_first_paragraph():
    """The description was cut at the docstring's first line break, mid-sentence ('... (optional supervised
    cold'), and the rest of the sentence began the epilog below the options."""
    import stages.warmstart
    from stages.cli import stage_parser

    parser = stage_parser(stages.warmstart.__doc__)
    assert parser.description.endswith("every arm shares (optional supervised cold\nstart).")
    assert parser.epilog.startswith("With `warmstart.enabled`, the first")


def test_a_param_no_stage_reads_is_refused_by_every_stage_in_one_message(tmp_path):
    params = write_params(tmp_path, {"data": {"synthetic": {"n_people": -1}}})  # prepare_model does not track data
    done = run(
        [
            "-m",
            "stages.prepare_model",
            "--params",
            str(params),
            "--backbone",
            "main",
            "--out",
            str(tmp_path / "m"),
            "--metrics",
            str(tmp_path / "m.json"),
        ],
        REPO,
    )
    assert done.returncode == 1
    assert "data.synthetic.n_people" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.startswith("prepare_model: error: invalid params")


def test_a_tracking_server_that_is_down_stops_a_tracked_stage_in_seconds_naming_it(tmp_path):
    from centralrl.services import free_port

    uri = f"http://user:secret@127.0.0.1:{free_port()}"  # nothing listens there
    params = write_params(tmp_path, {"tracking": {"uri": uri}})
    started = time.perf_counter()
    cell = "{backbone}{arm}{seed}"  # each pattern names every cell it is filled for
    inputs = [f"--records={cell}{{budget}}", "--reference-records={backbone}{reference}", "--corpus=x"]
    inputs += [f"--{name}={cell}" for name in ("budgets", "history", "movement")]
    outputs = [f"--report={tmp_path / 'report'}", f"--metrics={tmp_path / 'm.json'}"]
    done = run(["-m", "stages.compare", "--params", str(params), *inputs, *outputs], REPO)  # before any input is read
    assert time.perf_counter() - started < 60  # MLflow alone retried for 4.5 minutes, then gave a traceback
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"compare: error: tracking.uri {uri.replace('secret', '***')}: no MLflow server")


@pytest.mark.parametrize(
    "store, named",
    [
        ("junk.db", "{tmp}/junk.db is a file but not a SQLite database"),  # SQLAlchemy's traceback, after the work
        ("afolder", "{tmp}/afolder is a folder, not a database file"),
        ("typo/m.db", "its folder {tmp}/typo does not exist (make it, or correct the path)"),  # was: made, exit 0
        ("junk.db/m.db", "{tmp}/junk.db is a file, not a folder"),
    ],
)
def test_a_sqlite_store_that_cannot_be_one_stops_a_tracked_stage_before_its_work(tmp_path, store, named):
    (tmp_path / "junk.db").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "afolder").mkdir()
    params = write_params(tmp_path, {"tracking": {"uri": f"sqlite:///{tmp_path / store}"}})
    cell = "{backbone}{arm}{seed}"
    inputs = [f"--records={cell}{{budget}}", "--reference-records={backbone}{reference}", "--corpus=x"]
    inputs += [f"--{name}={cell}" for name in ("budgets", "history", "movement")]
    outputs = [f"--report={tmp_path / 'report'}", f"--metrics={tmp_path / 'm.json'}"]
    done = run(["-m", "stages.compare", "--params", str(params), *inputs, *outputs], REPO)  # before any input is read
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"compare: error: tracking.uri sqlite:///{tmp_path / store}: ")
    assert named.format(tmp=tmp_path) in done.stderr and not (tmp_path / "typo").exists()


class _MlflowLike(http.server.BaseHTTPRequestHandler):
    """Answers MLflow's REST API as a server without the experiment does; everything else (/health) 501."""

    def do_GET(self) -> None:
        if "/api/2.0/mlflow/experiments/get-by-name" not in self.path:
            return self.send_error(501)  # as BaseHTTPRequestHandler answers /health: a proxy might
        body = json.dumps({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such experiment"}).encode()
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_a_tracking_server_is_one_that_answers_mlflows_api(tmp_path):
    """Any HTTP answer at /health, then MLflow's JSON from its REST API: a web server that is not MLflow (a
    wrong port) passed and the stage failed after its work."""
    from centralrl.errors import TrackingError
    from centralrl.services import check_reachable

    for handler, works in ((_MlflowLike, True), (http.server.BaseHTTPRequestHandler, False)):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            if works:
                check_reachable(f"http://u:pw@127.0.0.1:{server.server_port}/mlflow")
            else:
                with pytest.raises(TrackingError, match=r"answers /health there, but not as MLflow \(GET .* HTTP 501"):
                    check_reachable(f"http://127.0.0.1:{server.server_port}")
        finally:
            server.shutdown()
            server.server_close()
    check_reachable(f"sqlite:///{tmp_path}/mlflow.db")  # a store, not a server: nothing to check
    with pytest.raises(TrackingError, match="no MLflow server answers"):
        check_reachable(f"http://127.0.0.1:{server.server_port}", timeout=2)
    with pytest.raises(TrackingError, match=r"http://127.0.0.1:99999: not a valid URL \(Port out of range"):
        check_reachable("http://127.0.0.1:99999")
    with pytest.raises(TrackingError, match=r"u:\*\*\*@db/m: its driver module 'psycopg2' is not installed"):
        check_reachable("postgresql+psycopg2://u:pw@db/m")  # was: MLflow's traceback after the stage's work


class _MlflowFailing(_MlflowLike):
    """Passes the check (`_MlflowLike`), then answers MLflow's requests 500 (a store that fails behind it)."""

    def do_POST(self) -> None:
        self.send_error(500)


class _MlflowWantsLogin(_MlflowLike):
    """An MLflow behind a login: 401 to everything."""

    def do_GET(self) -> None:
        self.send_error(401)


@pytest.mark.parametrize(
    ("handler", "says"),
    [
        (
            _MlflowFailing,
            r"refused a request: API request to http://u:\*\*\*@127.0.0.1:\d+/api/2.0/mlflow/experiments/",
        ),
        (_MlflowWantsLogin, r"refused a request \(set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD\)"),
    ],
)
def test_a_tracking_server_that_fails_or_refuses_a_request_is_named_not_a_traceback(monkeypatch, handler, says):
    """A server that passes the check but answers MLflow's requests with an error: MLflow's exception and
    traceback (the stage's outputs already written, for evaluate); now a TrackingError naming the URI."""
    import mlflow

    from centralrl.config import TrackingConfig
    from centralrl.errors import TrackingError
    from centralrl.tracking import open_tracker

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://u:pw@127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(
            TrackingError, match=rf"^tracking.uri http://u:\*\*\*@127.0.0.1:\d+: the server failed or {says}"
        ):
            open_tracker(TrackingConfig(uri=uri, experiment="centralrl", system_metrics=False))
    finally:
        mlflow.set_tracking_uri(None)
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:{port}/api", "no Prefect server answers"),
        ("notaurl", "is not an http(s) URL"),
        ("http://[::1", "is not a valid URL (Invalid IPv6 URL)"),  # was a traceback
    ],
)
def test_a_prefect_api_that_is_down_stops_a_flow_stage_naming_it(tmp_path, url, says):
    """PREFECT_API_URL naming a server that is down (or no URL at all) was a 109-line traceback from Prefect's
    HTTP client; now the stage says so before its work."""
    from centralrl.services import free_port

    url = url.format(port=free_port())
    params = write_params(tmp_path)
    index = ["--corpus", "c.jsonl", "--questions", "q.jsonl", "--index", "index", "--metrics", "r.json"]
    env = os.environ | project_pythonpath() | {"PREFECT_API_URL": url, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "stages.build_index", "--params", str(params), *index]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"build_index: error: PREFECT_API_URL={url}"), done.stderr
    assert says in done.stderr


@pytest.mark.parametrize(
    ("version", "says"),
    [
        (None, r"admin/version answered HTTP 500"),  # a proxy's error page: "Failed to reach API", a traceback
        ("true", r"admin/version answered no Prefect version \(true\)"),  # was pydantic's "Invalid version"
        ('"2.20.2"', r"it serves Prefect 2.20.2, this client is Prefect \d+\.\S+: the major versions must match"),
    ],
)
def test_a_prefect_api_url_where_another_server_answers_is_named(version, says):
    """A server at PREFECT_API_URL that answers /health but not as Prefect's API (another service's port, an
    error page, another major version): Prefect's client failed with a traceback as the flow started."""
    from importlib.metadata import version as installed

    from centralrl.services import ServiceError, check_prefect_api

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (version or "").encode()
            self.send_response(200 if version and self.path.endswith("/admin/version") else 500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/api"
    try:
        with pytest.raises(ServiceError, match=rf"^PREFECT_API_URL={url}: a server answers /health there, .*{says}"):
            check_prefect_api(url)
        version = json.dumps(installed("prefect"))
        check_prefect_api(url)  # the same server serving this Prefect's version passes
    finally:
        server.shutdown()
        server.server_close()


class _PrefectFailing(http.server.BaseHTTPRequestHandler):
    """Passes the stage's check (/health, this Prefect's admin/version), then fails every request 500."""

    def do_GET(self) -> None:
        from importlib.metadata import version

        answers = {"/api/health": "true", "/api/admin/version": json.dumps(version("prefect"))}
        body = answers.get(self.path, '{"detail": "database is locked"}').encode()
        self.send_response(200 if self.path in answers else 500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PATCH = do_PUT = do_GET

    def log_message(self, *args) -> None:
        pass


def test_a_prefect_api_that_fails_while_a_stage_runs_is_named_in_one_line(tmp_path):
    """A Prefect server that answers the check, then fails (or stops answering) while the stage runs: Prefect's
    traceback (PrefectHTTPStatusError, httpx.ConnectError) after the stage's work; now one line naming it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PrefectFailing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/api"
    params = write_params(tmp_path)
    index = ["--corpus", "c.jsonl", "--questions", "q.jsonl", "--index", "index", "--metrics", "r.json"]
    env = os.environ | project_pythonpath() | {"PREFECT_API_URL": url, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "stages.build_index", "--params", str(params), *index]
    try:
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    says = f"build_index: error: PREFECT_API_URL={url}: the Prefect server stopped answering or failed a request"
    assert says in done.stderr and "500 Internal Server Error" in done.stderr


EVALUATE_BASE = ["--backbone", "main", "--model", "m", "--index", "i", "--questions", "q.jsonl", "--reference", "base"]


@pytest.mark.parametrize(
    ("stage", "arguments", "named"),
    [
        (
            "prepare_data",
            ["--train", "d/q.jsonl", "--test", "d/q.jsonl", "--corpus", "d/c.jsonl", "--metrics", "d.json"],
            "--train and --test both name d/q.jsonl",
        ),
        (
            "prepare_model",
            ["--backbone", "main", "--out", "model", "--metrics", "model/m.json"],
            "--metrics model/m.json is inside --out's folder model",
        ),
        (  # replaced the corpus with the retrieval metrics, exit 0
            "build_index",
            ["--corpus", "c.jsonl", "--questions", "q.jsonl", "--index", "index", "--metrics", "c.jsonl"],
            "--metrics c.jsonl overlaps the input --corpus c.jsonl: the stage would write over what it reads",
        ),
        (
            "evaluate",
            ["--backbone", "main", "--model", "m", "--index", "i", "--questions", "q.jsonl", "--arm", "joint"]
            + ["--seed", "0", "--adapters", "a", "--budgets", "b.json", "--out", "ev", "--metrics", "m.json"]
            + ["--movement", "taken"],
            "--movement: taken: this output is a file, but a folder of that name is in the way",
        ),
        (
            "evaluate",
            EVALUATE_BASE + ["--out", "ev", "--metrics", "m.json", "--seed", "5", "--budgets", "b.json"],
            "--seed, --budgets: only with --arm",
        ),
        (  # recall is keyed by file name: the second file's figures replaced the first's, exit 0
            "build_index",
            ["--corpus", "c.jsonl", "--questions", "q.jsonl", "more/q.jsonl", "--index", "i", "--metrics", "r.json"],
            "--questions q.jsonl and more/q.jsonl share the name 'q': rename one",
        ),
        (  # the adapters folder is replaced whole at the end: the resume state inside it went with it
            "train",
            ["--arm", "joint", "--seed", "0", "--backbone", "main", "--model", "m", "--index", "i", "--train", "t"]
            + ["--adapters", "ad", "--budgets", "b.json", "--history", "h.jsonl", "--metrics", "m.json"]
            + ["--state", "ad/state"],
            "--state ad/state is inside --adapters's folder ad, which the stage replaces whole",
        ),
        (  # deleted the folder and what it held, exit 0
            "build_index",
            ["--corpus", "c.jsonl", "--questions", "q.jsonl", "--index", "mine", "--metrics", "r.json"],
            "--index: mine holds 'notes.txt' but not manifest.json: not an earlier output of this stage, which repl",
        ),
        (
            "evaluate",
            EVALUATE_BASE + ["--out", "mine", "--metrics", "m.json"],
            "--out: mine holds 'notes.txt' but not records.jsonl or */records.jsonl",
        ),
        (  # a folder above earlier evaluations (an arm's, the seed forgotten) is not one of them
            "evaluate",
            EVALUATE_BASE + ["--out", "arm", "--metrics", "m.json"],
            "--out: arm holds 'seed0' but not records.jsonl or */records.jsonl",
        ),
        (  # an earlier output of the flag, with someone's notes beside its cuts: deleted with it, exit 0
            "train",
            ["--arm", "joint", "--seed", "0", "--backbone", "main", "--model", "m", "--index", "i", "--train", "t"]
            + ["--adapters", "cuts", "--budgets", "b.json", "--history", "h.jsonl", "--metrics", "m.json"]
            + ["--state", "state"],
            "--adapters: cuts holds 'end/central/notes.md', 'notes.md', which this stage does not write there",
        ),
        (  # replaced the params file with the model's metrics, exit 0
            "prepare_model",
            ["--backbone", "main", "--out", "model", "--metrics", "params.yaml"],
            "--metrics params.yaml overlaps the input --params params.yaml: the stage would write over what it reads",
        ),
        (  # and a profile overlay, which the params file reads
            "prepare_model",
            ["--backbone", "main", "--out", "model", "--metrics", "profiles/smoke.yaml"],
            "--metrics profiles/smoke.yaml overlaps the input --params profiles",
        ),
        (  # replaced the training questions with the model's metrics, exit 0
            "prepare_model",
            ["--backbone", "main", "--out", "model", "--metrics", "train.jsonl"],
            "--metrics: train.jsonl: not a .json file name, which this output is",
        ),
        (  # replaced another params file with the evaluation's metrics
            "evaluate",
            EVALUATE_BASE + ["--out", "ev", "--metrics", "other.yaml"],
            "--metrics: other.yaml: not a .json file name, which this output is",
        ),
        (
            "train",
            ["--arm", "joint", "--seed", "0", "--backbone", "main", "--model", "m", "--index", "i", "--train", "t"]
            + ["--adapters", "ad", "--budgets", "b.json", "--history", "other.yaml", "--metrics", "m.json"]
            + ["--state", "state"],
            "--history: other.yaml: not a .jsonl file name",
        ),
        (  # wrote a file named newdir
            "prepare_model",
            ["--backbone", "main", "--out", "model", "--metrics", "newdir/"],
            "argument --metrics: newdir/: ends in /, as a folder does, but this output is a file",
        ),
        (  # the checkout's folder: "--out:  holds '.ci', '.dvc' ... and 26 more"
            "evaluate",
            EVALUATE_BASE + ["--out", "", "--metrics", "m.json"],
            "argument --out: empty or blank path",
        ),
        (  # ".: this output is a file, but a folder of that name is in the way"
            "prepare_model",
            ["--backbone", "main", "--out", "model", "--metrics", ""],
            "argument --metrics: empty or blank path",
        ),
        (  # a file named by one space
            "prepare_model",
            ["--backbone", "main", "--out", "model", "--metrics", " "],
            "argument --metrics: empty or blank path",
        ),
        (
            "build_index",
            ["--corpus", "", "--questions", "q.jsonl", "--index", "index", "--metrics", "r.json"],
            "argument --corpus: empty or blank path",
        ),
        (  # found at the stage's last write, with its other outputs already replaced
            "prepare_data",
            ["--train", "t.jsonl", "--test", "e.jsonl", "--corpus", "c.jsonl", "--metrics", "/proc/centralrl.json"],
            "--metrics: /proc/centralrl.json: cannot be written: /proc takes no new file",
        ),
    ],
)
def test_outputs_that_could_not_all_be_written_are_refused_before_the_stage_starts(tmp_path, stage, arguments, named):
    """A folder in an output file's place, two outputs on one path, an output inside another's folder, a folder
    output holding someone else's files, or flags that only an arm reads: a usage error naming them, before
    anything is read or written (a folder in the way was found at the last write, with the other outputs
    already written)."""
    write_params(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    (tmp_path / "arm" / "seed0" / "equal_steps").mkdir(parents=True)
    (tmp_path / "arm" / "seed0" / "equal_steps" / "records.jsonl").write_text("{}\n")
    (tmp_path / "train.jsonl").write_text("{}\n")
    (tmp_path / "other.yaml").write_text("profile: smoke\n")
    for name in ("end/central/adapter_config.json", "end/README.md", "end/central/notes.md", "notes.md"):
        (tmp_path / "cuts" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cuts" / name).write_text("{}\n")
    before = {path: path.is_file() and path.read_bytes() for path in tmp_path.rglob("*")}
    done = run(["-m", f"stages.{stage}", "--params", "params.yaml", *arguments], tmp_path)
    assert done.returncode == 2 and named in done.stderr, done.stderr
    assert {path: path.is_file() and path.read_bytes() for path in tmp_path.rglob("*")} == before


def test_an_output_folder_holding_files_its_stage_does_not_write_is_refused_naming_them(tmp_path, monkeypatch, capsys):
    """report/my_notes.md beside an earlier report.md was deleted without a word when compare reran: an output
    folder that lists what its stage writes there (`add_output(writes=...)`) refuses any other file, naming up to
    3, while its own earlier files pass."""
    from stages.cli import stage_parser

    write_params(tmp_path)
    monkeypatch.chdir(tmp_path)
    parser = stage_parser("A stage.")
    parser.add_output("--report", "the report", marks=("report.md",), writes=("report.md", "report.html", "*.png"))
    for name in ("report.md", "report.html", "training_main.png"):
        (tmp_path / "report" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "report" / name).write_text("earlier")
    assert parser.parse_args(["--report", "report"]).report == "report"
    for name in ("my_notes.md", "a.txt", "b.txt", "plots/extra.png"):
        (tmp_path / "report" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "report" / name).write_text("mine")
    with pytest.raises(SystemExit):
        parser.parse_args(["--report", "report"])
    assert (
        "--report: report holds 'a.txt', 'b.txt', 'my_notes.md' and 1 more, which this stage does not write there: "
        "it replaces its folder whole, so they would be deleted; move them out of it"
    ) in capsys.readouterr().err


DVC_ITEMS = {"${item.arm}": "joint", "${item.seed}": "0", "${item.backbone}": "main", "${item.reference}": "base"}
# what a smoke run of each folder output of dvc.yaml held (tests/conftest.py's smoke_run, tests/test_pipeline.py)
MODEL_FILES = ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]
EARLIER_FOLDERS = {
    "index": ["manifest.json", "params.index.json", "vocab.index.json", "data.csc.index.npy", "passages.jsonl"],
    "models/main/backbone": MODEL_FILES,
    "models/main/start": MODEL_FILES,
    "train/main/joint/seed0/adapters": [
        f"{cut}/{file}"
        for cut in ("equal_steps", "equal_tokens")
        for file in ("README.md", "central/adapter_config.json", "central/adapter_model.safetensors")
    ],
    "eval/main/joint/seed0": [
        f"{cut}/{file}"
        for cut in ("equal_steps", "equal_tokens")
        for file in ("records.jsonl", "transcripts.md", "cell.json")
    ],
    "eval/main/base": ["records.jsonl", "transcripts.md", "cell.json"],
    "report": ["report.md", "report.html", "training_main.png", "f1_vs_compute_main.png"],
}


def test_every_stage_takes_dvc_yamls_outputs_again_over_their_earlier_versions(tmp_path, monkeypatch):
    """An existing output file not named as its flag writes, or an output folder holding files its stage does not
    write, is refused (above); the outputs of dvc.yaml's own commands, there from the last run, are each stage's
    own and pass."""
    write_params(tmp_path)
    monkeypatch.chdir(tmp_path)
    for folder, files in EARLIER_FOLDERS.items():
        for file in files:
            (tmp_path / folder / file).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / folder / file).write_text("{}\n")
    for name, stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items():
        command = stage.get("do", stage)["cmd"]
        for placeholder, value in (DVC_ITEMS | {"${item}": "main"}).items():
            command = command.replace(placeholder, value)
        argv = shlex.split(command)
        for path in (Path(arg) for arg in argv if arg.endswith((".json", ".jsonl"))):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}\n")
        assert importlib.import_module(argv[2]).arguments(argv[3:]).params == "params.yaml", name


def test_a_training_file_too_small_for_the_dev_split_is_named():
    from centralrl.config import DevConfig
    from centralrl.data.split import split_dev
    from centralrl.schema import Question

    questions = [Question(f"q{i}", "Who?", ("x",), "toy", "train") for i in range(3)]
    with pytest.raises(DataError, match=r"data/train\.jsonl: its 3 questions leave none to train on after"):
        split_dev(questions, DevConfig(questions=3), "data/train.jsonl")
    assert len(split_dev(questions, DevConfig(questions=2), "data/train.jsonl")[0]) == 1


def test_a_benchmark_the_dev_split_takes_whole_is_named_before_training(tmp_path):
    """Stratified, the dev split deals round-robin over benchmarks, so a small benchmark can go to it whole (3
    two-hop questions beside 50 one-hop ones): training then never saw that benchmark, in silence."""
    from centralrl.config import load_config
    from centralrl.data.split import training_left
    from centralrl.schema import Question

    questions = [Question(f"a{i}", f"Who is a{i}?", ("x",), "big", "train") for i in range(50)]
    questions += [Question(f"b{i}", f"Who is b{i}?", ("x",), "small", "train") for i in range(3)]
    cfg = load_config(write_params(tmp_path, {"train": {"dev": {"questions": 6}}}))
    with pytest.raises(DataError, match=r"t\.jsonl: every training question of small is in the dev split \("):
        training_left(cfg, questions, "t.jsonl")
    training_left(load_config(write_params(tmp_path, {"train": {"dev": {"questions": 4}}})), questions, "t.jsonl")


def test_training_questions_sharing_a_hop_with_the_dev_split_are_left_out_and_none_left_is_named():
    from centralrl.config import DevConfig
    from centralrl.data.split import split_dev
    from centralrl.schema import Question, SubQuestion

    def asking(qid: str, *hops: str) -> Question:
        steps = tuple(SubQuestion(hop, "x", ()) for hop in hops)
        return Question(qid, "Who?", ("x",), "toy", "train", decomposition=steps)

    questions = [asking("a", "Who founded A?"), asking("b", "Who founded A?", "Where was X born?"), asking("c")]
    dev = DevConfig(questions=1, seed=0)
    training, held = split_dev(questions, dev)
    kept = {q.id for q in training}
    assert len(held) == 1 and held[0].id not in kept and "c" in kept
    assert ("a" in kept) == ("b" in kept) == (held[0].id == "c")  # a and b share a hop: one held drops the other
    with pytest.raises(DataError, match=r"data/train\.jsonl: each of its 2 questions outside the dev split"):
        split_dev(questions[:2] + [asking("d", "Who founded A?")], DevConfig(questions=1), "data/train.jsonl")


def test_questions_sharing_only_a_musique_template_are_not_left_out():
    """MuSiQue's later hops name the previous answer by a placeholder ("#1 >> country"): before, two questions
    asking the country of different people shared that text, so the training one was dropped."""
    from centralrl.config import DevConfig
    from centralrl.data.split import split_dev
    from centralrl.schema import Question, SubQuestion

    def musique(qid: str, first: str, answer: str, country: str) -> Question:
        steps = (SubQuestion(first, answer), SubQuestion("#1 >> country of citizenship", country))
        return Question(qid, "?", (country,), "musique", "train", decomposition=steps)

    strauss = musique("m1", "Who composed Salome?", "Richard Strauss", "Germany")
    ibsen = musique("m2", "Who wrote Brand?", "Henrik Ibsen", "Norway")
    again = musique("m3", "Who wrote Peer Gynt?", "Henrik Ibsen", "Norway")  # asks Ibsen's country too
    training, dev = split_dev([strauss, ibsen, again], DevConfig(questions=1, seed=0))
    assert {q.id for q in training} == ({"m1"} if dev[0].id != "m1" else {"m2", "m3"})


def test_a_training_question_asking_a_dev_hop_from_its_other_side_is_left_out():
    """ "Who is Y married to?" asks the fact of "Who is X married to?": it was compared as asked and trained on
    (the synthetic world keeps its test split apart by such facts)."""
    from centralrl.config import DevConfig
    from centralrl.data.split import split_dev
    from centralrl.schema import Question, SubQuestion

    def married(qid: str, who: str, spouse: str) -> Question:
        step = SubQuestion(f"Who is {who} married to?", spouse, ())
        return Question(qid, f"Who is the spouse of {who}?", (spouse,), "toy", "train", decomposition=(step,))

    questions = [married("ann", "Ann Lee", "Bo Park"), married("bo", "Bo Park", "Ann Lee"), married("cy", "Cy", "Di")]
    training, held = split_dev(questions, DevConfig(questions=1, seed=0))
    kept = {q.id for q in training}
    assert "cy" in kept and held[0].id != "cy"  # this seed holds one of the couple out
    assert kept == {"cy"}  # and the other side of that marriage goes with it


def test_a_budgets_file_must_be_the_cells_and_cut_every_budget_of_the_params_at_a_step(tmp_path):
    from centralrl.config import Config
    from centralrl.evaluation import budget_cuts

    cfg = Config()  # budgets equal_steps (8 steps) and equal_tokens (2400 trained tokens), 8 steps
    steps, tokens = {"step": 8, "budget": {"steps": 8}}, {"step": 3, "budget": {"trained_tokens": 2400}}
    good = {"equal_steps": steps, "equal_tokens": tokens}
    cell = {"arm": "joint", "seed": 1, "backbone": "main", "start": "ab12"}

    def cuts(document: object) -> dict:
        return budget_cuts(document, cfg, "b.json", "joint", 1, "main")

    assert cuts({"cell": cell, "cuts": good}) == good
    with pytest.raises(DataError, match=r"b\.json: expected the train stage's \{\"cell\": \.\.\., \"cuts\": \.\.\.\}"):
        cuts(good)  # an older version's file: the cuts alone
    # another seed's file, given by hand, was evaluated and reported as this cell's
    with pytest.raises(
        DataError, match=r"b\.json: written by the training of \{'arm': 'joint', 'seed': 2, 'backbone'"
    ):
        cuts({"cell": cell | {"seed": 2}, "cuts": good})
    with pytest.raises(DataError, match=r"b\.json: expected a cut for each budget .*got \[\]"):
        cuts({"cell": cell, "cuts": {}})  # was: evaluated nothing and exited 0
    with pytest.raises(DataError, match=r"b\.json: budget 'equal_tokens' has no cut step .*'two'"):
        cuts({"cell": cell, "cuts": good | {"equal_tokens": tokens | {"step": "two"}}})
    # each was evaluated and reported as the cut it named (a step the run never took, another budget's cut)
    with pytest.raises(DataError, match=r"budget 'equal_steps' has no cut step \(a whole number from 1 to .*, 10\)"):
        cuts({"cell": cell, "cuts": good | {"equal_steps": steps | {"step": 11}}})
    with pytest.raises(DataError, match=r"'equal_steps' was cut for \{'steps': 5\}, but params define it as \{'s"):
        cuts({"cell": cell, "cuts": good | {"equal_steps": steps | {"budget": {"steps": 5}}}})


@pytest.mark.parametrize(
    ("change", "split", "named"),
    [
        ({"split": "test"}, "train", r"q\.jsonl:2 \(question b\): a test question where train questions are"),
        ({"golden_answers": [" "]}, None, r"q\.jsonl:2 \(question b\): golden_answers must be a non-empty list"),
        ({"question": " "}, None, r"q\.jsonl:2 \(question b\): empty question text"),
        # scored as a benchmark of their own: "" into the macro average, "macro" over the average's row
        ({"benchmark": ""}, None, r"q\.jsonl:2 \(question b\): empty benchmark name ''"),
        ({"benchmark": "macro"}, None, r"q\.jsonl:2 \(question b\): benchmark name 'macro' is reserved"),
        ({"id": " "}, None, r"q\.jsonl:2 \(question  \): empty id"),
        # were an AttributeError, a TypeError, and ids split into characters
        ({"decomposition": ["x"]}, None, r"q\.jsonl:2 \(question b\) decomposition\[0\]: should be an object"),
        ({"supporting_passage_ids": None}, None, r"'supporting_passage_ids' should be a list of strings, got None"),
        (
            {"supporting_passage_ids": "p1"},
            None,
            r"q\.jsonl:2 \(question b\): field 'supporting_passage_ids' .*got str",
        ),
        # read as no supporting passages: build_index measured no recall for the benchmark, exit 0
        (
            {"supporting_pasage_ids": ["p1"]},
            None,
            r"q\.jsonl:2 \(question b\): unknown field\(s\) 'supporting_pasage_ids'",
        ),
        (
            {"decomposition": [{"question": "Who?", "answer": "x", "passage": "p1"}]},
            None,
            r"q\.jsonl:2 \(question b\) decomposition\[0\]: unknown field\(s\) 'passage'; known: answer, passa",
        ),
    ],
)
def test_a_question_row_a_stage_cannot_use_is_named_by_file_and_line(tmp_path, change, split, named):
    """A test file given to a training stage trained on the test questions, and an answer that normalizes to
    "" scored every prediction right (prepare_data refuses both kinds; a file made by hand reached the stages)."""
    from centralrl.schema import read_questions

    row = {"question": "Who?", "golden_answers": ["x"], "benchmark": "toy", "split": "train"}
    rows = [row | {"id": "a"}, row | {"id": "b"} | change]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=named):
        read_questions(tmp_path / "q.jsonl", split=split)


def test_a_golden_answer_that_normalizes_to_nothing_is_refused_by_training_and_evaluation():
    """evaluate scored `---` EM 1 against the prediction `>>>>>>>>` (prepare_data refuses such answers; a file
    made by hand reached the stage)."""
    from centralrl.metrics import refuse_empty_answers
    from centralrl.schema import Question

    fine = Question("a", "Who?", ("Ada",), "toy", "test")
    refuse_empty_answers([fine], "q.jsonl")
    with pytest.raises(DataError, match=r"q\.jsonl: question b \(toy\): golden answer '---' normalizes to the emp"):
        refuse_empty_answers([fine, Question("b", "Who?", ("Ada", "---"), "toy", "test")], "q.jsonl")


def test_a_repeated_question_or_passage_id_or_an_unknown_reference_is_named(tmp_path):
    from centralrl.config import Config
    from centralrl.schema import read_passages, read_questions

    row = {"question": "Who?", "golden_answers": ["x"], "benchmark": "toy", "split": "test"}
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(row | {"id": i}) + "\n" for i in ("a", "b", "a")))
    with pytest.raises(DataError, match=r"q\.jsonl:3: id 'a' is already used at .*q\.jsonl:1"):
        read_questions(tmp_path / "q.jsonl")
    passage = {"id": "p1", "title": "T", "text": "one"}
    (tmp_path / "c.jsonl").write_text(json.dumps(passage) + "\n" + json.dumps(passage | {"text": "two"}) + "\n")
    with pytest.raises(DataError, match=r"c\.jsonl:2: id 'p1' is already used at .*c\.jsonl:1"):
        read_passages(tmp_path / "c.jsonl")  # build_index's corpus: a retriever answers with ids
    (tmp_path / "c.jsonl").write_text(json.dumps(passage | {"contents": "one"}) + "\n")
    with pytest.raises(DataError, match=r"c\.jsonl:1 \(passage p1\): unknown field\(s\) 'contents'; known: id, t"):
        read_passages(tmp_path / "c.jsonl")
    with pytest.raises(ConfigError, match="references has no 'bsae'; known references: base, single_agent"):
        Config().reference("bsae")


@pytest.mark.parametrize(
    "change, named",
    [
        ({"f1": None}, "'f1' must be a score from 0 to 1, got None"),  # the field missing
        ({"acc": "zero"}, "'acc' must be a score from 0 to 1, got 'zero'"),
        ({"em": 7.0}, "'em' must be a score from 0 to 1, got 7.0"),
        ({"benchmark": 3}, "'benchmark' must be a string, got 3"),
        ({"golden_answers": "Ann"}, "'golden_answers' should be a list of strings, got 'Ann'"),  # the lost table's
    ],
)
def test_a_record_the_statistics_cannot_read_is_named(change, named):
    from centralrl.compare import checked_record

    from centralrl.metrics import f1

    record = {"id": "q1", "benchmark": "toy", "em": 0.0, "f1": f1("Bo Ann", ["Ann"]), "acc": 1, "question": "Who?"}
    record |= {"prediction": "Bo Ann", "golden_answers": ["Ann"], "notes": ["Bo wrote it."], "retrieved": [["p1"]]}
    assert checked_record(record, "r.jsonl:1") == record
    with pytest.raises(DataError, match=re.escape(f"r.jsonl:4: field {named}")):
        checked_record({k: v for k, v in (record | change).items() if v is not None}, "r.jsonl:4")


@pytest.mark.parametrize(
    "change", [{"benchmark": "popqa"}, {"question": "Who else?"}, {"golden_answers": ["Bo"]}]
)  # the last two: a records file of another question set under the same ids was paired and reported
def test_cells_that_answer_one_id_as_two_questions_are_refused(change):
    from centralrl.compare import check_same_questions

    row = {"id": "q1", "benchmark": "nq", "question": "Who?", "golden_answers": ["Ann"]}
    cells = {"eval/base/records.jsonl": [row], "eval/joint/seed0/records.jsonl": [row | change]}
    with pytest.raises(
        DataError,
        match=re.escape(
            "eval/joint/seed0/records.jsonl: answered other questions than eval/base/records.jsonl (1 vs 1; ids, "
            "benchmarks, texts or golden answers differ for q1)"
        ),
    ):
        check_same_questions(cells)


@pytest.mark.parametrize(
    "row, named",
    [
        ({"step": 1}, "'reward_mean' must be a finite number, got None"),
        ({"step": 1, "reward_mean": "high"}, "'reward_mean' must be a finite number, got 'high'"),
        ({"step": 1, "reward_mean": float("nan")}, "'reward_mean' must be a finite number, got nan"),
        ({"step": 1, "reward_mean": -5}, "'reward_mean' must be a reward, never below 0, got -5"),
        ({"step": 2, "reward_mean": 0.5, "dev.f1": 0.3}, "'spent.flops' must be a finite number, got None"),
        ({"step": 2, "reward_mean": 0.5, "dev.f1": float("nan"), "spent.flops": 1.0}, "'dev.f1' must be a finite"),
        ({"step": 1, "reward_mean": 0.5, "question_rewards": [0.5]}, "'question_rewards' must map question ids to"),
        ({"step": 1, "reward_mean": 0.5, "question_rewards": {"q1": "x"}}, "'question_rewards.q1' must be a finite"),
    ],
)
def test_a_history_row_the_report_cannot_read_is_named(row, named):
    from stages.compare import checked_history_row

    assert checked_history_row({"step": 1, "reward_mean": 0.25}, "h.jsonl:1")["reward_mean"] == 0.25
    with pytest.raises(DataError, match=re.escape(f"h.jsonl:3: field {named}")):
        checked_history_row(row, "h.jsonl:3")


@pytest.mark.parametrize("steps", [[2, 1], [1, 1], [1, 3], [2, 3]])
def test_a_history_whose_steps_are_not_one_row_each_is_named(steps):
    # reversed rows turned a reward rise of +0.6 into -0.6 in the report; a missing step made a run read shorter
    from stages.compare import checked_history

    assert checked_history([{"step": 1}, {"step": 2}], Path("h.jsonl"))
    with pytest.raises(DataError, match=re.escape(f"h.jsonl: steps must be 1, 2, ... one row each, got {steps}")):
        checked_history([{"step": s} for s in steps], Path("h.jsonl"))


def test_an_empty_output_the_report_reads_is_named(tmp_path):
    # every records file empty ended in numpy's "no benchmarks given"; an empty history showed 0 steps, +0.000
    from stages.compare import _rows

    (tmp_path / "records.jsonl").write_text("")
    with pytest.raises(DataError, match=re.escape("records.jsonl: no rows; rerun `dvc repro evaluate@joint-0-main`")):
        _rows(tmp_path / "records.jsonl", "evaluate@joint-0-main")


GOOD_CUT = {"step": 2, "reached": True, "spent": {"steps": 2, "trained_tokens": 10, "flops": 1e9}}
CUTS = {
    "equal_steps": GOOD_CUT | {"budget": {"steps": 8}},
    "equal_tokens": GOOD_CUT | {"budget": {"trained_tokens": 2400}},
}


@pytest.mark.parametrize(
    "cuts, named",
    [
        ([GOOD_CUT], "b.json: expected a mapping of budgets, got list"),
        ({"equal_steps": CUTS["equal_steps"]}, "b.json: budget 'equal_tokens': no cut with its `spent`"),
        (CUTS | {"equal_tokens": {**CUTS["equal_tokens"], "reached": "yes"}}, "field 'reached' must be"),
        (
            CUTS | {"equal_tokens": {**CUTS["equal_tokens"], "spent": {"steps": 1, "flops": 1.0}}},
            "'spent.trained_tokens' must",
        ),
        (
            CUTS | {"equal_steps": {**CUTS["equal_steps"], "spent": {"trained_tokens": 1, "flops": 1.0}}},
            "'spent.steps' must",
        ),
        (CUTS | {"equal_tokens": {**CUTS["equal_tokens"], "step": 3}}, "cut at step 3, but its history holds 2"),
    ],
)
def test_budget_cuts_the_report_cannot_read_are_named(cuts, named):
    from centralrl.config import Config
    from stages.compare import checked_cuts

    cell = {"arm": "joint", "seed": 0, "backbone": "main"}
    assert checked_cuts({"cell": cell, "cuts": CUTS}, Path("b.json"), Config(), ("joint", 0, "main"), 2)
    with pytest.raises(DataError, match=re.escape(named)):
        checked_cuts({"cell": cell, "cuts": cuts}, Path("b.json"), Config(), ("joint", 0, "main"), 2)


MOVED = {"adapter": "central", "calls": 4, "changed": 1, "changed_share": 0.25, "kl": 0.01}
ADAPTERS = {"central": "central", "conclusion": "conclusion"}
TRAINED = MOVED | {"adapter": "conclusion"}


@pytest.mark.parametrize(
    "movement, named",
    [
        ({"steps": {"central": MOVED}}, "m.json: budget 'steps', role 'conclusion': missing"),
        ({"steps": [MOVED]}, "m.json: budget 'steps': expected a mapping of roles, got [{"),  # an AttributeError
        ({"steps": {"central": MOVED, "conclusion": {**TRAINED, "kl": float("nan")}}}, "field 'kl' must be a finite"),
        ({"steps": {"central": MOVED, "conclusion": {**TRAINED, "changed": "3"}}}, "field 'changed' must be a finite"),
        ({"steps": {"central": MOVED, "conclusion": MOVED}}, "adapter 'central', but this arm gives it 'conclusion'"),
        ({"steps": {"central": {**MOVED, "changed_share": 0.5}, "conclusion": MOVED}}, "1 changed of 4 calls with"),
    ],
)
def test_a_movement_file_the_report_cannot_read_is_named(movement, named):
    from stages.compare import checked_movement

    still = {"adapter": "conclusion", "calls": 0, "changed": 0, "changed_share": None, "kl": None}
    assert checked_movement({"steps": {"central": MOVED, "conclusion": still}}, Path("m.json"), ["steps"], ADAPTERS)
    with pytest.raises(DataError, match=re.escape(named)):
        checked_movement(movement, Path("m.json"), ["steps"], ADAPTERS)


def test_a_pattern_with_an_unknown_placeholder_is_a_usage_error(capsys):
    from stages import compare

    cell = "x/{backbone}/{arm}/{seed}"
    args = {name: cell for name in ("budgets", "history", "movement")} | {"records": cell + "/{budget}"}
    args |= {"reference-records": "x/{backbone}/{reference}", "history": "train/{backbone}/{arm}/{sede}/h.jsonl"}
    with pytest.raises(SystemExit) as stop:
        compare.main([*(f"--{k}={v}" for k, v in args.items()), "--report=r", "--metrics=m.json"])
    assert stop.value.code == 2
    assert "--history: 'train/{backbone}/{arm}/{sede}/h.jsonl': unknown placeholder {sede}" in capsys.readouterr().err


CELL_PATHS = {
    "train": ("model", "index", "train", "adapters", "budgets", "state", "history", "metrics"),
    "evaluate": ("model", "index", "questions", "adapters", "budgets", "out", "metrics", "movement"),
}
CELL_FILES = {"budgets": "budgets.json", "history": "history.jsonl", "metrics": "metrics.json", "movement": "m.json"}


def cell_paths(stage: str, folder: Path) -> list[str]:
    """The path flags of a train or evaluate command line, under `folder`, each file named as the stage writes it."""
    return [f"--{name}={folder / CELL_FILES.get(name, name)}" for name in CELL_PATHS[stage]]


@pytest.mark.parametrize("stage", ["train", "evaluate"])
@pytest.mark.parametrize(
    ("seed", "backbone", "arm", "named"),
    [
        (7, "main", "joint", r"--seed 7 is not one of seeds \[0, 1, 2\]"),
        (0, "large", "joint", r"--backbone large is not one of backbones"),
        (0, "main", "jnt", r"--arm jnt is not one of arms \['central_only', 'joint'\]"),  # was found in the flow
    ],
)
def test_a_cell_outside_the_matrix_is_refused(tmp_path, stage, seed, backbone, arm, named):
    """A seed or backbone that params define but the matrix does not run, or an arm params do not define: no
    compare stage would read the cell."""
    import importlib

    from stages.cell import check_cell

    params = write_params(
        tmp_path, {"models": {"large": {"source": "tiny_qwen2"}}}
    )  # seeds [0, 1, 2], backbones [main]
    paths = cell_paths(stage, tmp_path)
    argv = ["--params", str(params), "--arm", arm, "--seed", str(seed), "--backbone", backbone, *paths]
    with pytest.raises(ConfigError, match=named):
        check_cell(importlib.import_module(f"stages.{stage}").arguments(argv), load_config(params))


@pytest.mark.parametrize("stage", ["train", "evaluate"])
def test_a_cell_stage_process_refuses_a_cell_outside_the_matrix_and_a_cluster_that_is_down(
    prefect_server, tmp_path, stage
):
    """The stage process runs `check_cell` while its Prefect server starts: the refusal came after the server
    was up, about 8 s later, and a cluster that is down was found by train after loading the model, by
    evaluate after starting its flow."""
    from centralrl.services import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    es = {"backend": "elasticsearch", "elasticsearch": {"url": url, "max_retries": 0}}
    params = write_params(tmp_path, {"retrieval": es})
    paths = cell_paths(stage, tmp_path)
    cell = ["--params", str(params), "--seed", "0", "--backbone", "main", *paths]
    env = os.environ | project_pythonpath() | session_prefect_env()
    for arm, said in (("jnt", r"--arm jnt is not one of arms"), ("joint", rf"Elasticsearch at {url} unreachable")):
        command = [sys.executable, "-m", f"stages.{stage}", "--arm", arm, *cell]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 1 and re.search(f"{stage}: error: {said}", done.stderr), done.stderr
        assert "Traceback" not in done.stderr and "Prefect server" not in done.stderr + done.stdout


def test_a_file_given_as_the_state_folder_is_refused_before_any_step(tmp_path):
    from centralrl.rl.run import train_cell

    params = write_params(tmp_path)
    (tmp_path / "state").write_text("not a folder")
    names = ("model", "index", "train", "adapters", "budgets", "state", "history", "metrics")
    with pytest.raises(OutputError, match=r"--state .*state: a file, not a folder"):  # was: found after a step
        train_cell(str(params), "joint", 0, "main", *(str(tmp_path / n) for n in names), "stages/train.py")


def test_a_missing_index_stops_training_naming_the_stage_that_builds_it(tmp_path):
    """Training hashed its inputs first, so a missing index was a bare "No such file or directory"; the stages
    that open the index said which stage writes it."""
    from centralrl.errors import RetrievalError
    from centralrl.rl.run import train_cell

    params = write_params(tmp_path)
    names = ("model", "index", "train", "adapters", "budgets", "state", "history", "metrics")
    with pytest.raises(RetrievalError, match=r"index: no index manifest \(run `dvc repro build_index` first\)"):
        train_cell(str(params), "joint", 0, "main", *(str(tmp_path / n) for n in names), "stages/train.py")


def test_a_missing_input_is_one_line_naming_it(stage):
    done = run(["tiny_stage.py", "missing", str(stage / "nowhere.jsonl")], stage)
    assert (done.returncode, done.stderr) == (
        1,
        f"tiny_stage: error: {stage / 'nowhere.jsonl'}: No such file or directory\n",
    )


def test_a_full_disk_names_the_output_and_keeps_the_previous_one(stage):
    target = stage / "metrics.json"
    write_json(target, {"old": True})
    done = run(["tiny_stage.py", "full", str(target)], stage)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{target}: could not be written (No space left on device)" in done.stderr
    assert target.read_text() == '{\n  "old": true\n}\n'
    assert sorted(p.name for p in stage.glob(".*")) == []  # no temporary left


def test_a_folder_that_refuses_new_files_is_said_of_the_output_not_the_temporary(read_only_folder):
    for write in (lambda path: write_json(path, {}), lambda path: atomic_directory(path).__enter__()):
        target = read_only_folder / "out"
        with pytest.raises(OutputError, match=re.escape(f"{target}: could not be written (")):
            write(target)  # was: PermissionError naming ro/.out.<pid>.<random>.incomplete


def test_a_bug_keeps_its_traceback(stage):
    done = run(["tiny_stage.py", "bug", "-"], stage)
    assert done.returncode == 1 and "Traceback" in done.stderr and "ZeroDivisionError" in done.stderr


def test_a_checkpoint_that_cannot_be_written_leaves_nothing_to_resume(tmp_path):
    state = tmp_path / "state"
    with pytest.raises(OutputError, match=r"step-000002: could not be written \(No space left on device\)"):
        with atomic_directory(state / "step-000002") as tmp:
            (tmp / "adapter.safetensors").write_bytes(b"half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as torch.save reports a full disk
    assert list(state.iterdir()) == []


def test_a_replaced_directory_is_never_a_mix(tmp_path):
    target = tmp_path / "index"
    for version in ("old", "new"):
        with atomic_directory(target) as tmp:
            (tmp / version).write_text(version)
    assert [p.name for p in tmp_path.iterdir()] == ["index"] and [p.name for p in target.iterdir()] == ["new"]


def test_temporaries_of_dead_writers_are_cleaned_by_the_next_write(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".train.jsonl.{dead.stdout.strip()}.x1y2.incomplete"
    live = tmp_path / f".test.jsonl.{os.getpid()}.x1y2.incomplete"  # being written by a live process: kept
    stale.write_text("half")
    live.write_text("half")
    write_jsonl(tmp_path / "train.jsonl", [{"id": "a"}])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "train.jsonl"])
    assert clean_stale_temporaries(tmp_path) == []


def test_outputs_written_together_are_replaced_together_or_not_at_all(tmp_path):
    paths = [tmp_path / f"{name}.jsonl" for name in ("train", "test", "corpus")]
    for path in paths:
        path.write_text("old\n")
    with pytest.raises(DataError, match=r"corpus\.jsonl: row 'p1' has text UTF-8 cannot encode"):
        with atomic_files(*paths) as handles:
            for handle, path, text in zip(handles, paths, ["fine", "fine", "lone \ud800 surrogate"]):
                write_rows(handle, [{"id": "p1", "text": text}], path)
    assert [p.read_text() for p in paths] == ["old\n"] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "test.jsonl", "train.jsonl"]


def test_a_params_key_given_twice_is_refused_naming_both_lines(tmp_path):
    params = tmp_path / "params.yaml"  # was: the second harness section replaced the first one silently
    params.write_text("profile: smoke\nharness:\n  max_turns: 3\nseeds: [0]\nharness:\n  temperature: 0.5\n")
    with pytest.raises(ConfigError, match=r"key 'harness' given twice \(first on line 2\)\n.*params\.yaml\", line 5"):
        load_config(params)


def test_undecodable_and_surrogate_lines_name_file_and_line(tmp_path):
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"id": "a"}\n{"id": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"latin\.jsonl:2: not UTF-8 \(byte 0xe9"):
        list(read_jsonl(latin))
    with pytest.raises(DataError, match=r"latin\.jsonl:2: not UTF-8 \(byte 0xe9"):
        list(records(latin))  # a question source: JSON lines or a JSON list, told apart by the first byte
    params = tmp_path / "params.yaml"
    params.write_bytes(b"profile: smoke\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"params\.yaml: not UTF-8 \(byte 0xe9\)"):
        load_config(params)
    escaped = tmp_path / "escaped.jsonl"
    escaped.write_text('{"id": "pair \\ud83d\\ude00"}\n{"id": "lone \\ud800"}\n')
    with pytest.raises(DataError, match=r"escaped\.jsonl:2: an escaped lone UTF-16 surrogate"):
        list(read_jsonl(escaped))


@pytest.mark.parametrize("name", ["", " nq", "macro"])
def test_a_question_source_whose_benchmark_cannot_name_a_score_row_is_refused(tmp_path, name):
    source = {"kind": "nq_open", "path": "nq.jsonl", "benchmark": name, "split": "test"}
    with pytest.raises(ConfigError, match=r"data\.questions\.0\.benchmark: .*benchmark name"):
        load_config(write_params(tmp_path, {"data": {"questions": [source]}}))


@pytest.mark.parametrize(
    "overrides, both",
    [
        ({"train": {"grpo": {"questions_per_step": 40}}}, ["questions_per_step (40)", "36 training questions"]),
        ({"budgets": {"far": {"steps": 5}}}, ["{'far': 5}", "train.grpo.steps (2)"]),
        ({"train": {"grpo": {"warmup_steps": 3}}}, ["warmup_steps (3)", "train.grpo.steps (2)"]),
    ],
)
def test_cross_field_params_fail_at_load_naming_both_values(tmp_path, overrides, both):
    with pytest.raises(ConfigError) as error:
        load_config(write_params(tmp_path, overrides))  # smoke: 6 training questions x 6 types
    assert all(value in str(error.value) for value in both)


def test_the_training_launch_binds_its_rendezvous_to_loopback_on_a_free_port():
    command = launch_command(2, "stages.train", [])
    ip, port = (command[command.index(flag) + 1] for flag in ("--main_process_ip", "--main_process_port"))
    assert ip == "127.0.0.1" and port != "29500" and int(port) > 0


def test_an_empty_corpus_a_missing_adapter_folder_and_a_negative_seed_are_named(tmp_path, capsys):
    """Each was said in other words: the recall_ks bound of a corpus of 0 passages, "holds adapters []" for a
    folder that does not exist, and a DVC error about `dvc exp run` for seed -1."""
    from centralrl.models.adapters import load_adapters
    from centralrl.retrieval.recall import check_ks
    from flows.experiment import main as experiment

    with pytest.raises(DataError, match=r"c\.jsonl: the corpus holds no passages"):
        check_ks([1, 3], 0, "c.jsonl")
    with pytest.raises(DataError, match=r"nope: no such folder of adapters"):
        load_adapters(None, tmp_path / "nope", ["central"])  # refused before the model is touched
    with pytest.raises(SystemExit) as stop:
        experiment(["--profile", "smoke", "--seeds", "-1", "--dry"])
    assert stop.value.code == 2 and "'-1': a seed is a whole number >= 0" in capsys.readouterr().err


def test_the_start_and_adapters_evaluated_must_be_those_budgets_json_recorded(tmp_path):
    """Budgets cut at one step are evaluated once, from the first one's folder (a damaged copy in the other went
    unread); adapters trained from another start, or another run's, were evaluated as this cell's."""
    from centralrl.codedeps import folder_sha256
    from centralrl.evaluation import check_trained_files
    from centralrl.models.backbone import content_sha256

    (tmp_path / "start").mkdir()
    (tmp_path / "start" / "model.safetensors").write_bytes(b"start weights")
    for budget in ("equal_steps", "equal_tokens"):
        (tmp_path / "adapters" / budget / "central").mkdir(parents=True)
        (tmp_path / "adapters" / budget / "central" / "adapter_model.safetensors").write_bytes(b"weights")
    cuts = {
        b: {"step": 3, "adapters": folder_sha256(tmp_path / "adapters" / b)} for b in ("equal_steps", "equal_tokens")
    }
    budgets = {"cell": {"start": content_sha256(tmp_path / "start")}, "cuts": cuts}

    def check() -> None:
        check_trained_files(budgets, "b.json", str(tmp_path / "start"), str(tmp_path / "adapters"))

    check()
    weights = tmp_path / "adapters" / "equal_tokens" / "central" / "adapter_model.safetensors"
    weights.write_bytes(b"weigh")  # cut short
    with pytest.raises(DataError, match=r"adapters/equal_tokens: not the adapters b\.json recorded for budget 'eq"):
        check()
    weights.unlink()
    with pytest.raises(DataError, match=r"adapters/equal_tokens: not the adapters b\.json recorded .* \(missing, "):
        check()
    weights.write_bytes(b"weights")
    check()
    (tmp_path / "adapters" / "equal_tokens" / "central" / "adapter_model.safetensors").write_bytes(b"other weights")
    cuts["equal_tokens"]["adapters"] = folder_sha256(tmp_path / "adapters" / "equal_tokens")  # cut at another step,
    with pytest.raises(DataError, match=r"b\.json: budgets \['equal_steps', 'equal_tokens'\] are cut at step 3 but"):
        check()  # its step edited to equal_steps': it was given equal_steps' records
    cuts["equal_tokens"]["step"] = 4
    check()
    (tmp_path / "start" / "model.safetensors").write_bytes(b"another start")
    with pytest.raises(DataError, match=r"start: not the start b\.json was trained from \(other weights\)"):
        check()
