"""Stage start-up benchmark: how long a stage with Prefect flows takes before its own work starts, with its
set-up (params validation, torch and Prefect imports) overlapping its Prefect server's start (today's
`stages.cli.run_stage`) against the same set-up done after the server answers (before this overlap), side by
side: each round runs both, in fresh processes, alternating which goes first.

    python benchmarks/stage_startup.py --rounds 3 --out benchmarks/results/stage_startup.json

A no-op stage: `run_stage(lambda: None, prefect_server=True)` (overlapped), or the server started and waited
for, then the same `_prepare` and Prefect import (sequential). Times are wall seconds of the whole process,
interpreter start and server stop included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OVERLAPPED = """
import sys
sys.argv = ["stage", "--params", {params!r}]
from stages.cli import run_stage
run_stage(lambda: None, prefect_server=True)
"""

SEQUENTIAL = """
import sys
from centralrl.services import stage_prefect_server
from stages.cli import _prepare, _quiet_known_errors_in_prefect_logs
with stage_prefect_server():
    _prepare(["--params", {params!r}])
    _quiet_known_errors_in_prefect_logs()
"""


def seconds(code: str) -> float:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    env.pop("PREFECT_API_URL", None)  # each stage starts its own server, as under `dvc repro`
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "stage_startup.json"))
    args = parser.parse_args()
    variants = {"overlapped": OVERLAPPED, "sequential": SEQUENTIAL}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
        for name in order:
            times[name].append(round(seconds(variants[name].format(params=args.params)), 2))
            print(f"round {round_ + 1}: {name} {times[name][-1]:.2f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "seconds": times,
        "median_seconds": medians,
        "overlap_speedup_median": round(medians["sequential"] / medians["overlapped"], 2),
    }
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
