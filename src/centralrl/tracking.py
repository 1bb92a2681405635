"""Experiment tracking, passed in rather than imported: MLflow for real runs, a do-nothing tracker for tests
that do not look at tracking (those that do use a temporary sqlite store).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested params to MLflow's flat keys.

    >>> flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x"})
    {'a.b': 1, 'a.c': '[1, 2]', 'd': 'x'}
    """
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= flatten(value, f"{name}.")
        else:
            flat[name] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return flat


class Tracker(Protocol):
    def run(self, name: str, tags: Mapping[str, str] | None = None) -> Any: ...
    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...


class NullTracker:
    """Records nothing; the code that logs stays free of `if tracking:` branches."""

    @contextmanager
    def run(self, name: str, tags: Mapping[str, str] | None = None) -> Iterator[None]:
        yield

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass


class MlflowTracker:
    """MLflow through its public API: one run per `run()`; runs started inside another run nest under it."""

    def __init__(self, uri: str, experiment: str) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(experiment)

    @contextmanager
    def run(self, name: str, tags: Mapping[str, str] | None = None) -> Iterator[Any]:
        nested = self.mlflow.active_run() is not None
        with self.mlflow.start_run(run_name=name, tags=dict(tags or {}), nested=nested) as active:
            yield active

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.mlflow.log_params(flatten(params))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.mlflow.log_text(text, artifact_file)
