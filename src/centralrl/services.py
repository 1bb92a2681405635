"""Local services for watching the pipeline: a Prefect server (flow runs, deployments, workers) and an MLflow
server (the runs of every arm side by side), both on 127.0.0.1.

    python -m centralrl.services ui                  # Prefect on :4200, MLflow on :5000; Ctrl-C stops both
    python -m centralrl.services ui --prefect-port 4300 --mlflow-port 5100 --mlflow-store sqlite:///other.db

`ui` checks that both ports are free, starts both servers (each in its own process group, its output in a log
file), waits until both answer over HTTP (Prefect: GET /api/health, MLflow: GET /health), prints their
addresses and what to export so the pipeline reports to them, then waits. Ctrl-C or SIGTERM stops both: SIGTERM
to each process group, a grace period, then SIGKILL. A taken port, a server that exits during start-up or one
that does not answer in time is an error naming the server (what it said last as it exited, or the last lines of its
log when it does not answer); a server that dies later stops the other and exits non-zero.

The MLflow store defaults to `sqlite:///mlflow.db`: the URI the pipeline's `tracking.uri` uses, so the UI shows
every run logged so far, and the pipeline can keep writing the file directly or log through the server
(`tracking.uri: http://127.0.0.1:5000`). A relative sqlite path, and a relative artifacts folder, are taken from
the DVC repository's root (the nearest folder at or above the working directory holding `.dvc/`), as the stages
take `tracking.uri`, so `ui` serves their store from any folder of the repository; outside a repository only a
store file already in the working directory is served (a new empty one there would show nothing, in silence).
A store URI's credentials never print (`centralrl.redact` masks them in the banner, errors and log tails) and
never reach a command line: `mlflow server` gets the store through MLFLOW_BACKEND_STORE_URI.
The functions are small and importable; the tests start the same servers through them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from pathlib import Path

from centralrl.errors import CentralRLError, TrackingError, is_known
from centralrl.io import file_in_the_way, folder_refuses_files, scratch_folder
from centralrl.processes import exit_with, tied_to_this_process
from centralrl.redact import redact, split_credentials

HOST = "127.0.0.1"
EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception|Exit)\b.*")  # a traceback's last line: `ValueError: ...`


class ServiceError(CentralRLError, RuntimeError):
    """A server could not be started (port taken, exited, no answer) or died; the message says which and why."""


@dataclass
class Service:
    """One started server: its name, base URL, health URL, process (a process-group leader) and log file."""

    name: str
    url: str
    health_url: str
    process: subprocess.Popen
    log: Path

    def tail(self, lines: int = 20) -> str:
        """The last lines of the server's log (what it said before failing)."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return redact("\n".join(text.splitlines()[-lines:])) or "(empty log)"

    def last_words(self) -> str:
        """What the server said as it exited: its log's last exception line (`module.SomeError: why`, the
        end of a traceback), else its last line; the whole log stays in its file."""
        said = [line.strip() for line in self.tail(200).splitlines() if line.strip()]
        raised = [line for line in said if EXCEPTION_LINE.match(line)]
        return (raised or said or ["(empty log)"])[-1]

    def exited(self, when: str) -> ServiceError:
        """The error of a server that exited `when`: its code and last words, and where its log is."""
        code = self.process.returncode
        return ServiceError(f"{self.name} exited {when} (code {code}): {self.last_words()} (its log: {self.log})")


def executable(name: str) -> str:
    """The CLI `name` from this interpreter's environment (the venv), else from PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        raise ServiceError(f"`{name}` not found beside {sys.executable} or on PATH; install the project (make setup)")
    return found


def check_port_free(port: int, name: str, host: str = HOST) -> None:
    """Fail with the server's name when `port` is already bound on `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: a TIME_WAIT is not "in use"
        try:
            probe.bind((host, port))
        except OSError as err:
            raise ServiceError(
                f"{name}: port {port} on {host} is already in use ({err.strerror}); stop what holds it "
                f"or pick another port (--{name.lower()}-port)"
            ) from None


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now (for tests and --port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _spawn(name: str, command: list[str], env: dict[str, str], url: str, health: str, log_dir: Path) -> Service:
    """Start `command` in a new session (own process group; a terminal's Ctrl-C reaches only us), output to a log.
    It is SIGKILLed when this process exits, whatever kills it, so no server outlives its starter."""
    log = Path(log_dir) / f"{name.lower()}.log"
    with open(log, "wb") as handle:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=tied_to_this_process(),
        )
    return Service(name, url, url + health, process, log)


def start_prefect(
    port: int = 4200,
    home: str | Path | None = None,
    log_dir: str | Path | None = None,
    host: str = HOST,
    api_only: bool = False,
) -> Service:
    """`prefect server start` on host:port; `home` sets PREFECT_HOME (its database), None keeps the caller's;
    `api_only`: no UI and no background services (a stage's own server: starts faster, does less)."""
    check_port_free(port, "Prefect", host)
    # the UI's browser code calls PREFECT_UI_API_URL, which defaults to port 4200 whatever port the server has
    env = os.environ | {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_API_URL": f"http://{host}:{port}/api",
        "PREFECT_SERVER_UI_ENABLED": str(not api_only).lower(),
    }
    env.pop("PREFECT_API_URL", None)  # the server must not think it is a client of another server
    if home is not None:
        env["PREFECT_HOME"] = str(Path(home).resolve())
    command = [executable("prefect"), "server", "start", "--host", host, "--port", str(port)]
    command += ["--no-services"] if api_only else []
    return _spawn("Prefect", command, env, f"http://{host}:{port}", "/api/health", Path(log_dir or tempfile.mkdtemp()))


@contextlib.contextmanager
def stage_prefect_server(timeout: float = 120.0, meanwhile: Callable[[], None] | None = None) -> Iterator[str]:
    """The Prefect API a stage's flows report to, as long as the stage runs; yields its URL.

    `PREFECT_API_URL` already set (a long-lived server such as `make ui`'s): that one, nothing started.
    Otherwise a server of this stage's own (API only, no services) on a free 127.0.0.1 port, with the caller's
    PREFECT_HOME (so its runs land in the same database), exported as PREFECT_API_URL to this process and its
    children, and stopped when the block ends. Unlike Prefect's ephemeral server it dies with the stage even
    when the stage is SIGKILLed. Enter it before `prefect` is imported: Prefect reads its settings at import.
    `meanwhile` runs while the server starts, with the URL already exported (so it may import prefect); an error
    in it stops the server.
    """
    if os.environ.get("PREFECT_API_URL"):
        check_prefect_api(os.environ["PREFECT_API_URL"])
        if meanwhile:
            meanwhile()
        yield os.environ["PREFECT_API_URL"]
        return
    log_dir = scratch_folder("centralrl-prefect-server")
    server = start_prefect(free_port(), log_dir=log_dir, api_only=True)
    try:
        os.environ["PREFECT_API_URL"] = f"{server.url}/api"
        if meanwhile:
            meanwhile()
        wait_healthy(server, timeout)
        yield os.environ["PREFECT_API_URL"]
    finally:
        _send_queued_prefect_logs()
        os.environ.pop("PREFECT_API_URL", None)
        stop(server)
        shutil.rmtree(log_dir, ignore_errors=True)


def _send_queued_prefect_logs(timeout: float = 5.0) -> None:
    """Send the flow-run logs Prefect still holds while its server is up: otherwise its exit hook sends them to
    a stopped server and prints "Error logging to API ... All connection attempts failed" under a stage's
    error message."""
    if "prefect.logging.handlers" in sys.modules:
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=timeout)


def quiet_known_errors_in_prefect_logs() -> None:
    """Prefect logs a failed flow or task run with its traceback; keep only the message for known errors
    (`errors.is_known`: a bad param, bad data, a failed dvc run, ...)."""
    import logging

    import prefect.logging  # noqa: F401  (configures Prefect's loggers, which must exist before the filter)

    for logger in ("prefect.flow_runs", "prefect.task_runs"):
        logging.getLogger(logger).addFilter(_drop_known_tracebacks)


def _drop_known_tracebacks(record) -> bool:
    if record.exc_info and is_known(record.exc_info[1]):
        record.exc_info = record.exc_text = None
    return True


def is_file_store(uri: str) -> bool:
    """A path or file: URI, which MLflow 3 refuses as a tracking store ("databricks" names a workspace).

    >>> [is_file_store(u) for u in ("mlflow.db", "file:/x", "sqlite:///m.db", "http://h:5000", "databricks")]
    [True, True, False, False, False]
    """
    return uri.startswith("file:") or ("://" not in uri and uri != "databricks")


def start_mlflow(
    port: int = 5000,
    store_uri: str = "sqlite:///mlflow.db",
    artifacts: str | Path = "mlartifacts",
    log_dir: str | Path | None = None,
    host: str = HOST,
) -> Service:
    """`mlflow server` on host:port with one worker, the given backend store and proxied artifacts folder."""
    check_port_free(port, "MLflow", host)
    if is_file_store(store_uri):
        raise ServiceError(
            f"MLflow: store {redact(store_uri)!r} is a file store, which MLflow 3 refuses; use sqlite:///PATH"
        )
    command = [
        executable("mlflow"),
        "server",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        "--artifacts-destination",
        str(Path(artifacts).resolve()),
    ]
    env = os.environ | {"MLFLOW_BACKEND_STORE_URI": store_uri}  # not an argument: `ps` would show its password
    return _spawn("MLflow", command, env, f"http://{host}:{port}", "/health", Path(log_dir or tempfile.mkdtemp()))


def answers(url: str, timeout: float = 2.0) -> bool:
    """True when GET `url` returns a 2xx status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(service: Service, timeout: float = 90.0, interval: float = 0.5) -> None:
    """Poll the health URL until it answers; fail naming the server if it exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise service.exited("during start-up")
        if answers(service.health_url):
            return
        time.sleep(interval)
    raise ServiceError(
        f"{service.name} did not answer {service.health_url} within {timeout:g} s; "
        f"last lines of {service.log}:\n{service.tail()}"
    )


def stop(service: Service, timeout: float = 15.0) -> int | None:
    """SIGTERM the server's process group, wait up to `timeout`, then SIGKILL it; return the exit code."""
    process = service.process
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)  # the group: servers start workers of their own
        except ProcessLookupError:
            pass
        try:
            return process.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    return process.poll()


class _Shutdown(Exception):
    """Raised in the main thread by SIGTERM (SIGINT raises KeyboardInterrupt), to stop the servers cleanly."""


def _raise_shutdown(signum, frame) -> None:
    raise _Shutdown(signal.Signals(signum).name)


def banner(prefect: Service, mlflow: Service, store_uri: str, artifacts: str) -> str:
    return f"""
Prefect UI   {prefect.url}      (API {prefect.url}/api)
MLflow UI    {mlflow.url}      (store {redact(store_uri)}, artifacts {artifacts})
logs         {prefect.log}, {mlflow.log}

So that the pipeline's flow runs (dvc repro, workers, deployments) show in this Prefect server:
  export PREFECT_API_URL={prefect.url}/api
MLflow: the pipeline logs to `tracking.uri` in params.yaml. Keep it at `{redact(store_uri)}` (this UI reads the
same store; the stages take a relative sqlite:/// path from the repository root, as this UI does) or log through
the server with `tracking.uri: {mlflow.url}`.
Ctrl-C stops both servers.
"""


def ui(
    prefect_port: int,
    mlflow_port: int,
    store_uri: str,
    artifacts: str,
    prefect_home: str | None,
    log_dir: str | None,
    timeout: float,
) -> int:
    """Start both servers, print where they are, wait for Ctrl-C / SIGTERM or a server's death; stop both."""
    previous = {
        sig: signal.signal(sig, handler)
        for sig, handler in ((signal.SIGTERM, _raise_shutdown), (signal.SIGINT, signal.default_int_handler))
    }
    started: list[Service] = []
    try:
        check_port_free(prefect_port, "Prefect")
        check_port_free(mlflow_port, "MLflow")
        log_dir = log_dir or tempfile.mkdtemp(prefix="centralrl-services-")  # made only once something will log
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        started.append(start_prefect(prefect_port, prefect_home, log_dir))
        started.append(start_mlflow(mlflow_port, store_uri, artifacts, log_dir))
        for service in started:
            wait_healthy(service, timeout)
        print(banner(*started, store_uri, artifacts), flush=True)
        while True:
            for service in started:
                if service.process.poll() is not None:
                    raise service.exited("unexpectedly")
            time.sleep(1.0)
    except (KeyboardInterrupt, _Shutdown):
        print("stopping the servers ...", flush=True)
        return 0
    except ServiceError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        for sig in previous:  # a second Ctrl-C must not abandon the servers half-stopped
            signal.signal(sig, signal.SIG_IGN)
        for service in reversed(started):
            code = stop(service)
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            print(f"{service.name} stopped ({how})", flush=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def unanswered(url: str, timeout: float = 5.0) -> str | None:
    """Why nothing answers GET `<url>/health` within `timeout` seconds, or None when something does (any HTTP
    answer, even 401 or 404, means a server is there). For http(s) URLs: MLflow's and Prefect's APIs."""
    try:
        urllib.request.urlopen(endpoint(url, "/health"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as error:
        return str(getattr(error, "reason", error))
    return None


DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
DRIVER_PACKAGES = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient"}


def missing_driver(uri: str) -> str | None:
    """Why SQLAlchemy cannot open database `uri` on this machine (an unknown driver, or its module not
    installed), or None when it can: found before a server or a stage starts, not in MLflow's traceback.

    >>> missing_driver("sqlite:///mlflow.db") is None
    True
    >>> missing_driver("postgresql+nodriver://h/db")
    "driver 'nodriver' of postgresql is not one SQLAlchemy knows"
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(uri)
        url.get_dialect().import_dbapi()
    except NoSuchModuleError:  # an ArgumentError too
        return f"driver {url.get_driver_name()!r} of {url.get_backend_name()} is not one SQLAlchemy knows"
    except ArgumentError as error:
        return str(error)
    except ImportError as error:
        package = DRIVER_PACKAGES.get(error.name or "", error.name)
        return f"its driver module {error.name!r} is not installed (pip install '{package}')"
    return None


def stage_store_uri(uri: str, root: str | None) -> str:
    """The tracking URI a stage logs to: a relative `sqlite:///` store is taken from `root`, DVC's repository root
    (`$DVC_ROOT`, which DVC sets for every stage it runs, to the repository an experiment was started from even when
    it runs in a temporary copy); every other URI, or any URI when `root` is None, as it is.

    >>> stage_store_uri("sqlite:///mlflow.db", "/repo"), stage_store_uri("sqlite:////abs/m.db", "/repo")
    ('sqlite:////repo/mlflow.db', 'sqlite:////abs/m.db')
    >>> stage_store_uri("http://127.0.0.1:5000", "/repo"), stage_store_uri("sqlite:///mlflow.db", None)
    ('http://127.0.0.1:5000', 'sqlite:///mlflow.db')
    >>> stage_store_uri("sqlite:///mlflow.db?timeout=30", "/repo")
    'sqlite:////repo/mlflow.db?timeout=30'
    """
    store = sqlite_store(uri)
    if store is None or store.is_absolute() or not root:
        return uri
    scheme, _, rest = uri.partition(":///")
    _, mark, query = rest.partition("?")  # SQLAlchemy's options (?timeout=30), kept
    return f"{scheme}:///{Path(root) / store}{mark}{query}"


def sqlite_store(uri: str) -> Path | None:
    """The file of a `sqlite:///path` tracking store (relative or absolute; a driver may be named), else None.

    >>> sqlite_store("sqlite+pysqlite:////abs/m.db"), sqlite_store("sqlite:///:memory:"), sqlite_store("http://h")
    (PosixPath('/abs/m.db'), None, None)
    >>> sqlite_store("sqlite:///m.db?timeout=30")
    PosixPath('m.db')
    """
    match = re.fullmatch(r"sqlite(?:\+\w+)?:///([^?]+)(?:\?.*)?", uri)  # ?timeout=30: SQLAlchemy's, not the file's
    return None if match is None or match.group(1) == ":memory:" else Path(match.group(1))


SQLITE_HEADER = b"SQLite format 3\x00"


def unusable_sqlite_file(uri: str) -> str | None:
    """Why the file of a `sqlite:///PATH` store cannot hold MLflow's runs, or None: a folder or a file that is
    no database where it should be (SQLAlchemy's traceback, for evaluate after its whole evaluation), another
    application's database (MLflow added its tables to it in silence), or a folder above it that does not exist
    (a typo made a new store there in silence) or takes no file. An empty or missing file is a new store."""
    store = sqlite_store(uri)
    if store is None:
        return None
    if store.is_dir():
        return f"{store} is a folder, not a database file"
    if store.exists():
        with open(store, "rb") as file:
            head = file.read(len(SQLITE_HEADER))
        if head not in (b"", SQLITE_HEADER):
            return f"{store} is a file but not a SQLite database"
        return None if head == b"" else foreign_database(store)
    blocked = file_in_the_way(list(store.parents))
    if blocked is not None:
        return f"{blocked} is a file, not a folder"
    if not store.parent.is_dir():
        return f"its folder {store.parent} does not exist (make it, or correct the path)"
    return folder_refuses_files(store)


# every MLflow store has it, from the first statement that makes one (the other tables of its first schema refer to
# it), so a stage that starts beside a store MLflow is still making is not refused; `alembic_version` alone is no
# sign: Prefect's database (and any alembic-managed one) has it too
MLFLOW_TABLE = "experiments"


def foreign_database(store: Path) -> str | None:
    """Why the SQLite database `store` is not MLflow's, or None: one with tables but not `MLFLOW_TABLE` belongs
    to another application (Prefect's, say: MLflow would add its own beside them). Read-only: nothing is
    written."""
    try:
        with contextlib.closing(sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)) as database:
            tables = [row[0] for row in database.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    except sqlite3.Error as error:
        return f"{store} cannot be read as a SQLite database ({error})"
    if not tables or MLFLOW_TABLE in tables:
        return None
    shown = ", ".join(sorted(tables)[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    return f"{store} is another application's SQLite database, not an MLflow store (its tables: {shown})"


def url_problem(url: str) -> str | None:
    """Why urllib cannot take an http(s) `url` apart (an unclosed IPv6 bracket, a port that is no number), or
    None; other schemes are not urllib's to judge (databricks://scope:prefix, a multi-host database URI)."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme in ("http", "https"):
            parts.port  # parsing the port is the check
    except ValueError as error:
        return str(error)
    return None


def endpoint(url: str, path: str, query: dict[str, str] | None = None) -> str:
    """`url` without its credentials (urllib would read user:password as a port), with `path` appended."""
    parts = urllib.parse.urlsplit(split_credentials(url)[0])
    encoded = urllib.parse.urlencode(query or {})
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + path, encoded, ""))


def mlflow_api_problem(uri: str, timeout: float = 5.0) -> str | None:
    """Why the server at `uri` does not answer as MLflow's REST API, or None when it does: JSON from GET
    experiments/get-by-name (the experiment, or MLflow's RESOURCE_DOES_NOT_EXIST), or 401/403 from a server that
    wants the credentials this probe does not send. Another web server (the Prefect UI's port, a proxy's page)
    answers /health too, and the stage failed after its work."""
    api = endpoint(uri, "/api/2.0/mlflow/experiments/get-by-name", {"experiment_name": "Default"})
    answer = _get(api, timeout)
    if isinstance(answer, str) or answer[0] in (401, 403):
        return answer if isinstance(answer, str) else None
    status, reply = answer
    if isinstance(reply, dict) and ("experiment" in reply or "error_code" in reply):
        return None
    return f"GET {redact(api)} answered HTTP {status} without MLflow's JSON"


def _get(api: str, timeout: float) -> tuple[int, Any] | str:
    """GET `api`: its HTTP status (an error's too) and its body as JSON (None when it is not JSON), or why no
    answer came."""
    try:
        with urllib.request.urlopen(api, timeout=timeout) as answer:
            status, body = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    except (urllib.error.URLError, OSError, ValueError) as error:
        return f"GET {redact(api)}: {getattr(error, 'reason', error)}"
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Raise `TrackingError` when `uri` is an MLflow server (http or https) that does not answer within
    `timeout` seconds, instead of MLflow's minutes of retries ending in a traceback (measured: 4.5 minutes), or
    a server there that is not MLflow (`mlflow_api_problem`), a database whose driver this machine lacks
    (`missing_driver`), or a sqlite file that cannot be the store (`unusable_sqlite_file`). A file store is not
    checked."""
    if (problem := url_problem(uri)) is not None:
        raise TrackingError(f"tracking.uri {redact(uri)}: not a valid URL ({problem})")
    scheme = urllib.parse.urlsplit(uri).scheme.split("+")[0]
    if scheme in DATABASES:
        problem = missing_driver(uri) or unusable_sqlite_file(uri)
        if problem is not None:
            raise TrackingError(f"tracking.uri {redact(uri)}: {problem}")
        return
    if scheme not in ("http", "https"):
        return
    reason = unanswered(uri, timeout)
    if reason is not None:
        raise TrackingError(
            f"tracking.uri {redact(uri)}: no MLflow server answers ({reason}); start one (make ui) or set "
            "tracking.uri to sqlite:///mlflow.db"
        )
    if (problem := mlflow_api_problem(uri, timeout)) is not None:
        raise TrackingError(
            f"tracking.uri {redact(uri)}: a server answers /health there, but not as MLflow ({problem}); check the "
            "host and port (make ui serves MLflow on 5000, Prefect on 4200)"
        )


def check_prefect_url(url: str) -> None:
    """Raise `ServiceError` when PREFECT_API_URL (`url`) is not an http(s) URL. Checked before `prefect` is
    imported: Prefect validates its settings at import, and a URL it cannot parse was a pydantic traceback."""
    if (problem := url_problem(url)) is not None:
        raise ServiceError(f"PREFECT_API_URL={redact(url)} is not a valid URL ({problem})")
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ServiceError(f"PREFECT_API_URL={redact(url)} is not an http(s) URL, e.g. http://127.0.0.1:4200/api")


PREFECT_CLOUD = "https://api.prefect.cloud/"  # Prefect's client asks no version of its Cloud API


def prefect_api_problem(url: str, timeout: float = 5.0) -> str | None:
    """Why the server at PREFECT_API_URL `url` does not answer as a Prefect API this client can use, or None
    when it does: a version of the same major as this Prefect's from GET admin/version (what Prefect's client
    asks first), or 401/403 from a server that wants the credentials this probe does not send. Another web
    server (the MLflow UI's port, a proxy's error page) answers /health too, and Prefect's client failed with a
    traceback ("Failed to reach API", "Invalid version")."""
    from importlib.metadata import version

    if url.startswith(PREFECT_CLOUD):
        return None
    api = endpoint(url, "/admin/version")
    answer = _get(api, timeout)
    if isinstance(answer, str) or answer[0] in (401, 403):
        return answer if isinstance(answer, str) else None
    status, served = answer
    if status >= 400:
        return f"GET {redact(api)} answered HTTP {status}"
    if not isinstance(served, str) or not re.fullmatch(r"\d+(\.\d+)*\S*", served):
        shown = "no JSON" if served is None else json.dumps(served)[:60]
        return f"GET {redact(api)} answered no Prefect version ({shown})"
    client = version("prefect")
    if served.split(".")[0] != client.split(".")[0]:
        return f"it serves Prefect {served}, this client is Prefect {client}: the major versions must match"
    return None


def check_prefect_api(url: str, timeout: float = 5.0) -> None:
    """Raise `ServiceError` when PREFECT_API_URL (`url`) is not an http(s) URL (`check_prefect_url`), no
    Prefect server answers there, or the server there is not a Prefect API this client can use
    (`prefect_api_problem`), instead of Prefect's traceback after its retries."""
    check_prefect_url(url)
    reason = unanswered(url, timeout)
    if reason is not None:
        raise ServiceError(
            f"PREFECT_API_URL={redact(url)}: no Prefect server answers ({reason}); start it (make ui), or unset "
            "PREFECT_API_URL and a temporary server of its own is started"
        )
    if (problem := prefect_api_problem(url, timeout)) is not None:
        raise ServiceError(
            f"PREFECT_API_URL={redact(url)}: a server answers /health there, but not as a Prefect API this client "
            f"can use ({problem}); check the host, port and /api path (make ui serves Prefect on 4200, MLflow on "
            "5000), or unset PREFECT_API_URL and a temporary server of its own is started"
        )


def prefect_request_failed(error: BaseException, url: str) -> str | None:
    """What went wrong when `error` is Prefect's HTTP client failing a request to the Prefect API at `url` (the
    server stopped, or answered an error, while the stage ran), else None. Its traceback said nothing a user can
    act on."""
    httpx = sys.modules.get("httpx")  # Prefect's HTTP client, imported with Prefect
    if httpx is None or not isinstance(error, httpx.HTTPError):
        return None
    try:
        requested = str(error.request.url)
    except RuntimeError:  # an error raised outside a request
        return None
    if not requested.startswith(url.rstrip("/")):
        return None
    return (
        f"PREFECT_API_URL={redact(url)}: the Prefect server stopped answering or failed a request while the stage "
        f"ran ({type(error).__name__}: {redact(str(error))[:300]}); the outputs the stage finished before are kept"
    )


def folder_path(text: str) -> str:
    """A folder from the command line: one that exists, or that can still be made (nothing else in its way, the
    path itself or a folder above it, and a folder there that takes new files: /proc/x was a traceback); not
    blank (it meant the working directory, in silence)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a blank folder; name one")
    blocked = file_in_the_way([Path(text), *Path(text).parents])
    if blocked is not None:
        raise argparse.ArgumentTypeError(f"{text}: {blocked} exists and is not a folder")
    refused = None if Path(text).is_dir() else folder_refuses_files(Path(text))
    if refused is not None:
        raise argparse.ArgumentTypeError(f"{text}: cannot be made: {refused}")
    return text


def repository_root(start: Path) -> Path | None:
    """The root of the DVC repository holding `start`: the nearest folder at or above it with a `.dvc` folder,
    as DVC finds the root it exports to the stages as $DVC_ROOT (`stage_store_uri`); None outside one."""
    for folder in (start, *start.parents):
        if (folder / ".dvc").is_dir():
            return folder
    return None


def served_store(uri: str, start: Path) -> str:
    """The store `ui` serves for `uri`, run in the folder `start`: a relative sqlite:/// file from the root of the
    DVC repository holding `start`, as the stages take it, else from `start` where that file exists; any other
    URI as it is. Raise `ServiceError` for a relative file outside a repository and not in `start`: MLflow made
    an empty store there, and the banner said the UI read the pipeline's."""
    store = sqlite_store(uri)
    if store is None or store.is_absolute():
        return uri
    root = repository_root(start)
    if root is None and not (start / store).exists():
        raise ServiceError(
            f"no DVC repository (a folder holding .dvc/) at or above {start} to take {store} from, and no "
            f"{start / store}; run this in the repository, or name the store by its absolute path"
        )
    return stage_store_uri(uri, str(root or start))


def store_uri(text: str) -> str:
    """An MLflow backend store URI `mlflow server` can serve: a database URL (MLflow 3 refuses a file store, and
    an http URI names a server, not a store); a relative sqlite path made absolute (`served_store`)."""
    scheme = text.partition("://")[0].split("+")[0]
    if "://" not in text or scheme not in DATABASES:
        raise argparse.ArgumentTypeError(
            f"{redact(text)}: not a database URI (sqlite:///mlflow.db, postgresql://..., mysql://..., mssql://...)"
        )
    try:
        served = served_store(text, Path.cwd())
    except ServiceError as error:
        raise argparse.ArgumentTypeError(f"{redact(text)}: {error}") from None
    problem = missing_driver(served) or unusable_sqlite_file(served)  # a typo'd folder: MLflow made a store there
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{redact(text)}: {problem}")
    return served


def artifacts_folder(text: str) -> str:
    """The MLflow server's artifacts folder, as `folder_path` takes it; a relative one from the DVC repository's
    root (else the working directory), as a relative store is (`served_store`), so it stays beside the store."""
    if not text.strip():  # '' was the working directory to Path
        return folder_path(text)
    folder = Path(text)
    if not folder.is_absolute():
        folder = (repository_root(Path.cwd()) or Path.cwd()) / folder
    return folder_path(str(folder))


def positive(what: str) -> Callable[[str], float]:
    """An argparse type: a finite number above 0, refused as "'<text>' is not <what> above 0".

    >>> positive("a number of seconds")("90")
    90.0
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} above 0")
        return value

    return parse


def port_number(text: str) -> int:
    """A TCP port from the command line: 1 to 65535.

    >>> port_number("4200")
    4200
    """
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1 to 65535)")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m centralrl.services",
        description="\n\n".join(__doc__.split("\n\n")[:2]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("ui", help="start the Prefect and MLflow servers on 127.0.0.1 until Ctrl-C")
    run.add_argument("--prefect-port", type=port_number, default=4200, help="Prefect server port (default 4200)")
    run.add_argument("--mlflow-port", type=port_number, default=5000, help="MLflow server port (default 5000)")
    run.add_argument(
        "--mlflow-store",
        type=store_uri,
        default="sqlite:///mlflow.db",
        help="MLflow backend store URI (default sqlite:///mlflow.db, the pipeline's tracking.uri; a relative "
        "sqlite path is taken from the DVC repository's root, as the stages take it)",
    )
    run.add_argument(
        "--mlflow-artifacts",
        type=artifacts_folder,
        default="mlartifacts",
        help="folder for artifacts logged through the server (default mlartifacts; a relative one is taken from "
        "the DVC repository's root)",
    )
    run.add_argument(
        "--prefect-home",
        type=folder_path,
        default=None,
        help="PREFECT_HOME of the server (its sqlite database); default: the environment's (~/.prefect)",
    )
    run.add_argument(
        "--log-dir",
        type=folder_path,
        default=None,
        help="where the servers' logs go (default: a new temporary folder)",
    )
    run.add_argument(
        "--timeout",
        type=positive("a number of seconds"),
        default=120.0,
        help="seconds each server may take to answer (default 120)",
    )
    args = parser.parse_args(argv)
    if args.prefect_port == args.mlflow_port:
        parser.error(f"--prefect-port and --mlflow-port are both {args.prefect_port}; each server needs its own")
    return ui(
        args.prefect_port,
        args.mlflow_port,
        args.mlflow_store,
        args.mlflow_artifacts,
        args.prefect_home,
        args.log_dir,
        args.timeout,
    )


if __name__ == "__main__":
    exit_with(main)
