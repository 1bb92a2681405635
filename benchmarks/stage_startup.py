"""Stage overhead benchmark: what a stage process costs around its own work, side by side in fresh processes
(each round runs every variant, alternating the order).

- Start: a stage with Prefect flows, its set-up (params validation, torch and Prefect imports) overlapping its
  Prefect server's start (today's `stages.cli.run_stage`) against the same set-up done after the server answers
  (before this overlap). A no-op stage: `run_stage(lambda: None, prefect_server=True)` (overlapped), or the server
  started and waited for, then the same `_prepare` and Prefect import (sequential).
- End: a stage whose main loads what the train and evaluate stages load (transformers through
  `centralrl.assembly`, MLflow), ending through `stages.cli.end_process` (today's: atexit handlers, then
  `os._exit`) against plain `sys.exit` (the interpreter's full teardown).

    python benchmarks/stage_startup.py --rounds 3 --out benchmarks/results/stage_startup.json

Times are wall seconds of the whole process, interpreter start and server stop included.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from centralrl.config import load_config
from centralrl.errors import CentralRLError
import cli
from cli import check_out, count, run_main, write_indented_json

ROOT = Path(__file__).resolve().parents[1]

OVERLAPPED = """
import sys
sys.argv = ["stage", "--params", {params!r}]
from stages.cli import run_stage, stage_parser
run_stage(lambda: None, stage_parser("A no-op stage.").parse_args, prefect_server=True)
"""

SEQUENTIAL = """
import sys
from centralrl.services import quiet_known_errors_in_prefect_logs, stage_prefect_server
from stages.cli import _prepare
with stage_prefect_server():
    _prepare({params!r}, ["--params", {params!r}], tracked=False)
    quiet_known_errors_in_prefect_logs()
"""


LOADED = """
import sys
sys.argv = ["stage", "--params", {params!r}]
import stages.cli
{patch}

def main():
    import centralrl.assembly, centralrl.tracking, mlflow  # noqa: F401  (what train and evaluate load)

stages.cli.run_stage(main, stages.cli.stage_parser("A stage that loads.").parse_args, prefect_server=True)
"""
VARIANTS = {
    "overlapped": OVERLAPPED,
    "sequential": SEQUENTIAL,
    "end_process": LOADED.replace("{patch}", ""),
    "sys_exit": LOADED.replace("{patch}", "stages.cli.end_process = sys.exit"),
}


def seconds(name: str, code: str) -> float:
    """Wall seconds of one variant's process; one that fails is an error quoting its last line of stderr."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    env.pop("PREFECT_API_URL", None)  # each stage starts its own server, as under `dvc repro`
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise CentralRLError(f"variant {name} exited with status {done.returncode}: {last}")
    return time.perf_counter() - started


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--params", default="params.yaml", help="params file the variants load")
    parser.add_argument("--rounds", type=count, default=3, help="runs of each variant, alternating their order")
    parser.add_argument("--out", default="benchmarks/results/stage_startup.json", help="figures (JSON)")
    args = parser.parse_args()
    check_out(args.out, args)
    params = str(Path(args.params).resolve())  # the variants run in ROOT
    load_config(params)  # a bad params file fails here, in one line, not in every variant
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            times[name].append(round(seconds(name, VARIANTS[name].format(params=params)), 2))
            print(f"round {round_ + 1}: {name} {times[name][-1]:.2f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "seconds": times,
        "median_seconds": medians,
        "overlap_speedup_median": round(medians["sequential"] / medians["overlapped"], 2),
        "end_process_speedup_median": round(medians["sys_exit"] / medians["end_process"], 2),
        "end_process_saved_seconds_median": round(medians["sys_exit"] - medians["end_process"], 2),
    }
    print(json.dumps(result, indent=2))
    write_indented_json(args.out, result)


if __name__ == "__main__":
    run_main(main)
