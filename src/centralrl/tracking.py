"""Experiment tracking, passed in rather than imported: MLflow for real runs, a do-nothing tracker for tests
that do not look at tracking (those that do use a temporary sqlite store).

Every cell of the matrix (a train or evaluate stage of one arm, seed, backbone) is its own MLflow run, a child
of one parent run per experiment. Stages run in separate processes, so the parent is found by a tag (the hash
of the resolved params: same params, same parent) and created by the first stage that needs it. Children carry
the tags MLflow's compare view lines up on: arm, seed, backbone (and an evaluate run's budget), git commit, the
DVC stage and a hash of its deps (`cell_tags`), and the hardware the numbers depend on (`hardware.hardware_tags`).
Stages that start at once on one machine (cells run side by side by hand, or by several Prefect workers) would
race on a local sqlite store's first steps: creating its schema (MLflow's migrations fail with "table
alembic_version already exists"), the experiment, and the parent run (two parents). Those steps run under an
exclusive lock on a file beside the store (`store_lock`); a server store serialises them itself.
A relative sqlite store is found from DVC's repository root (`services.stage_store_uri`), not the working
directory: `dvc exp run --queue` and `--temp` run the stages in a temporary copy of the repository, where
`sqlite:///mlflow.db` would be a fresh store deleted with the copy. The experiment's artifacts (transcripts,
reports) live beside the store too.
Every param, tag and text goes through `centralrl.redact` first, so a URL's credentials never reach the store;
the tracking URI itself is handed to MLflow as it is (it needs the credentials to log in).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from centralrl.errors import TrackingError
from centralrl.hardware import hardware_tags
from centralrl.redact import redact
from centralrl.services import check_reachable, sqlite_store, stage_store_uri

if TYPE_CHECKING:
    from centralrl.config import Config, TrackingConfig

PARENT_TAG = "centralrl.experiment"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested params to MLflow's flat keys, text redacted.

    >>> flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x", "url": "http://u:pw@h:9"})
    {'a.b': 1, 'a.c': '[1, 2]', 'd': 'x', 'url': 'http://u:***@h:9'}
    """
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= flatten(value, f"{name}.")
        else:
            flat[name] = value if isinstance(value, (int, float, bool)) or value is None else redact(str(value))
    return flat


def experiment_key(cfg: Config) -> str:
    """The experiment's identity: a hash of every resolved param except where results are tracked."""
    params = cfg.model_dump(exclude={"tracking"}, mode="json")
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


def _dvc_outputs(dvc_yaml: Path = Path("dvc.yaml")) -> list[str]:
    """What `dvc repro` rewrites while the stages run: dvc.lock and every stage's outs, metrics and plots in
    `dvc_yaml`, each cut before its first templated part (`train/${item.backbone}/...` is `train`)."""
    stages = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"] if dvc_yaml.is_file() else {}
    paths = {"dvc.lock"}
    for stage in stages.values():
        stage = stage.get("do", stage)  # a foreach stage's body
        for entry in (entry for kind in ("outs", "metrics", "plots") for entry in stage.get(kind, [])):
            path = next(iter(entry)) if isinstance(entry, dict) else entry  # `- path: {cache: false}` or `- path`
            fixed, templated, _ = path.partition("${")
            fixed = fixed.rpartition("/")[0] if templated else fixed
            if fixed:
                paths.add(fixed)
    return sorted(paths)


def _git_commit() -> str:
    """HEAD, with `-dirty` when a tracked file differs from it, the pipeline's own outputs aside (`_dvc_outputs`:
    a stage run by `dvc repro` finds dvc.lock and the metrics of the stages before it rewritten)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        outputs = [f":(exclude){path}" for path in _dvc_outputs()]
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *outputs],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head}-dirty" if dirty else head


def _dvc_deps_sha256(stage: str) -> str:
    """A hash of what the DVC stage `stage` depends on, each dep as DVC hashes it for dvc.lock (the md5 of a file
    or folder, the values of the params it reads): the same code, inputs and params, the same hash. Not dvc.lock
    itself: `dvc repro` rewrites it as each stage finishes, so one experiment's runs had 16 hashes in 22 runs."""
    from dvc.repo import Repo

    try:  # a tag: a stage must not fail for want of it
        with Repo(config={"core": {"no_scm": True}}) as repo:  # the project this process runs in; no git needed
            (found,) = repo.stage.collect(stage)
            deps = {dep.def_path: dep.get_hash().to_dict() for dep in found.deps}
    except Exception as error:  # noqa: BLE001 - DVC's errors have no common base worth naming here
        return f"unknown ({type(error).__name__})"
    return hashlib.sha256(json.dumps(deps, sort_keys=True).encode()).hexdigest()


def cell_tags(cfg: Config, **cell: Any) -> dict[str, str]:
    """Tags of one cell's run: the cell (arm, seed, backbone, budget, ...), profile, git commit, the DVC stage
    running it (`$DVC_STAGE`, "none" for a stage run by hand) and the hash of its deps, hardware."""
    stage = os.environ.get("DVC_STAGE")
    return {
        **{k: str(v) for k, v in cell.items()},
        "profile": cfg.profile,
        "git_commit": _git_commit(),
        "dvc_stage": stage or "none",
        "dvc_deps_sha256": _dvc_deps_sha256(stage) if stage else "none",
        **hardware_tags(),
    }


class Tracker(Protocol):
    def run(self, name: str, tags: Mapping[str, str] | None = None, parent: Config | None = None) -> Any: ...
    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...
    def log_artifact(self, path: str | Path) -> None: ...


class NullTracker:
    """Records nothing; the code that logs stays free of `if tracking:` branches."""

    @contextmanager
    def run(self, name: str, tags: Mapping[str, str] | None = None, parent: Config | None = None) -> Iterator[None]:
        yield

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass

    def log_artifact(self, path: str | Path) -> None:
        pass


# How long MLflow keeps asking a tracking server that stopped answering, unless the environment says otherwise:
# about 30 s of retries (urllib3's backoff: 0 + 2 + 4 + 8 + 16 s; 32 s measured), where MLflow's own defaults spent
# 4.5 minutes before the error. The failed run is then closed without retries (`MlflowTracker._end_failed_run`).
HTTP_RETRY_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "5",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
}


# how MLflow's HTTP client begins the error of a request the server failed (5xx after the retries, a timeout), or
# answered with no JSON or with an error status outside MLflow's JSON (a proxy's page, an auth layer's 401)
SERVER_FAILED = "API request to"


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Held by one process at a time for a local sqlite store (a `<store>.lock` file beside it); a no-op for others."""
    store = sqlite_store(uri)
    if store is None:
        yield
        return
    with open(store.with_name(store.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, an error included
        yield


class MlflowTracker:
    """MLflow through its public API: one run per `run()`, under the experiment's parent run when `parent` is
    given; runs started inside another run nest under it. A server that stops answering during the run gives a
    `TrackingError` that says so (`_server_checked`), after about 30 s of retries (`HTTP_RETRY_DEFAULTS`) of the
    request that failed; closing the run then tries once (`_end_failed_run`)."""

    def __init__(self, uri: str, experiment: str, system_metrics: bool = False) -> None:
        import mlflow

        self.mlflow = mlflow
        self.uri = uri
        self.system_metrics = system_metrics
        for name, value in HTTP_RETRY_DEFAULTS.items():
            os.environ.setdefault(name, value)
        mlflow.set_tracking_uri(uri)
        with self._server_checked(), store_lock(uri):
            self.experiment_id = self._experiment(experiment)

    def _experiment(self, name: str) -> str:
        """The experiment's id, created if missing; a sqlite store's experiment keeps its artifacts in `mlruns/`
        beside the store (MLflow's default is the working directory's, which a temporary DVC copy deletes)."""
        if self.mlflow.get_experiment_by_name(name) is None:
            store = sqlite_store(self.uri)
            location = (store.resolve().parent / "mlruns").as_uri() if store else None
            self.mlflow.create_experiment(name, artifact_location=location)
        return self.mlflow.set_experiment(name).experiment_id

    @contextmanager
    def _server_checked(self) -> Iterator[None]:
        """MLflow's error as it is, unless the tracking server no longer answers, or answers a request with an
        error of its own (a 5xx after the retries, a page that is no JSON, 401 or 403: credentials): then a
        TrackingError naming it (MLflow's own says "Max retries exceeded" in a wall of text, with a traceback)."""
        from sqlalchemy.exc import DBAPIError

        try:
            yield
        except DBAPIError as error:  # MLflow lets the database's own error through, with two tracebacks
            raise TrackingError(f"tracking.uri {redact(self.uri)}: the store failed: {error.orig}") from None
        except self.mlflow.exceptions.MlflowException as error:
            kept = "what the stage wrote before is kept, and a train stage resumes from its last checkpoint when rerun"
            try:
                check_reachable(self.uri)
            except TrackingError as gone:
                raise TrackingError(f"{gone} (it stopped answering while the stage ran; {kept})") from None
            status = error.get_http_status_code()
            if str(error.message).startswith(SERVER_FAILED) or status in (401, 403):
                login = " (set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)" if status in (401, 403) else ""
                raise TrackingError(
                    f"tracking.uri {redact(self.uri)}: the server failed or refused a request{login}: "
                    f"{redact(str(error.message))[:300]} ({kept})"
                ) from None
            raise

    def parent_run(self, cfg: Config) -> str:
        """The id of the experiment's parent run, created (finished, holding the params) if it is not there yet."""
        key = experiment_key(cfg)
        with self._server_checked(), store_lock(self.uri):
            found = self.mlflow.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`{PARENT_TAG}` = '{key}'",
                max_results=1,
                output_format="list",
            )
            if found:
                return found[0].info.run_id
            with self.mlflow.start_run(
                run_name=f"{cfg.profile} {key[:8]}", tags={PARENT_TAG: key, "profile": cfg.profile}
            ) as run:
                self.mlflow.log_params(flatten(cfg.model_dump(mode="json")))
            return run.info.run_id

    @contextmanager
    def run(self, name: str, tags: Mapping[str, str] | None = None, parent: Config | None = None) -> Iterator[Any]:
        nested = self.mlflow.active_run() is not None
        tags = {k: redact(v) for k, v in (tags or {}).items()}
        tags |= {"mlflow.parentRunId": self.parent_run(parent)} if parent is not None else {}
        with (
            self._server_checked(),
            self.mlflow.start_run(
                run_name=name, tags=tags, nested=nested, log_system_metrics=self.system_metrics and not nested
            ) as active,
        ):
            try:
                yield active
            except TrackingError:
                self._end_failed_run()
                raise

    def _end_failed_run(self) -> None:
        """End the active run as failed with a single request: the store was just found failing, and closing the
        run the usual way retried as long again (65 s in all where the server had gone, not about 30 s)."""
        retries = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        try:
            with suppress(Exception):  # the TrackingError being raised says what failed
                self.mlflow.end_run("FAILED")  # leaves the run, then tells the store: at once if it is gone
        finally:
            if retries is None:
                del os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
            else:
                os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = retries

    def log_params(self, params: Mapping[str, Any]) -> None:
        with self._server_checked():
            self.mlflow.log_params(flatten(params))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        with self._server_checked():
            self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_text(self, text: str, artifact_file: str) -> None:
        with self._server_checked():
            self.mlflow.log_text(redact(text), artifact_file)

    def log_artifact(self, path: str | Path) -> None:
        with self._server_checked():
            self.mlflow.log_artifact(str(path))


def open_tracker(tracking: TrackingConfig) -> MlflowTracker:
    uri = stage_store_uri(tracking.uri, os.environ.get("DVC_ROOT"))
    check_reachable(uri)
    return MlflowTracker(uri, tracking.experiment, tracking.system_metrics)
