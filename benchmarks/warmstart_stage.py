"""Warm start stage benchmark: the stage's own command in fresh processes, side by side (each round runs every
variant, alternating the order), for its wall time, CPU time and peak RSS, the figures issue 12 sets (at most
5 minutes and 3 GB for SmolLM2-135M).

- `owned`: today's stage. In bf16 the model is first copied out of its checkpoint's file mapping
  (`models.backbone.own_memory`), so the frozen weights' float32 originals, spilled to a temporary file for the
  fine-tuning (`frozen_linears_in`), leave the resident set.
- `mapped`: the same with `own_memory` patched out: the weights stay views of the mapped checkpoint, whose pages
  all stay resident while any weight views it (before this copy).

    python benchmarks/warmstart_stage.py --rounds 1 --out benchmarks/results/warmstart_stage.json

Both variants must write the same start (`content_sha256`); the figures say whether they did. Peak RSS is the
process's `ru_maxrss` (KiB) / 1e6, as every peak RSS in the README.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from centralrl.config import load_config
from centralrl.errors import CentralRLError
import cli
from cli import check_out, count, run_main, write_indented_json

ROOT = Path(__file__).resolve().parents[1]

STAGE = """
import runpy, sys
sys.argv = ["stages.warmstart"] + {argv!r}
import centralrl.rl.warmstart
{patch}
runpy.run_module("stages.warmstart", run_name="__main__")
"""
PATCHES = {"owned": "", "mapped": "centralrl.rl.warmstart.own_memory = lambda model: None"}


def run_variant(name: str, argv: list[str]) -> dict:
    """One stage process: wall seconds, CPU seconds (user + system) and peak RSS (GB) from its own rusage."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    code = STAGE.format(argv=argv, patch=PATCHES[name])
    with tempfile.TemporaryFile("w+") as stderr:
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)  # this child's rusage, not the largest child's so far
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so Popen must be told
        if process.returncode:
            stderr.seek(0)
            last = (stderr.read().strip().splitlines() or ["(no stderr)"])[-1]
            raise CentralRLError(f"variant {name} exited with status {process.returncode}: {last}")
    return {
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_gb": round(usage.ru_maxrss / 1e6, 3),
    }


def measured(name: str, params: str, inputs: argparse.Namespace) -> dict:
    """Run `name` once, its start and metrics in a temporary folder; its figures and the start's digest."""
    with tempfile.TemporaryDirectory(prefix=f"warmstart-{name}-") as folder:
        metrics = Path(folder) / "metrics.json"
        argv = ["--params", params, "--backbone", inputs.backbone, "--model", inputs.model, "--index", inputs.index]
        argv += ["--train", inputs.train, "--out", str(Path(folder) / "start"), "--metrics", str(metrics)]
        figures = run_variant(name, argv)
        figures["content_sha256"] = json.loads(metrics.read_text())["content_sha256"]
    return figures


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--params", default="params.yaml", help="params file of the stage")
    parser.add_argument("--backbone", default="main", help="a key of the params' backbones")
    parser.add_argument("--model", default="models/main/backbone", help="the prepared backbone (prepare_model)")
    parser.add_argument("--index", default="index", help="the retrieval index (index stage)")
    parser.add_argument("--train", default="data/train.jsonl", help="training questions (data stage)")
    parser.add_argument("--rounds", type=count, default=1, help="runs of each variant, alternating their order")
    parser.add_argument("--out", default="benchmarks/results/warmstart_stage.json", help="figures (JSON)")
    args = parser.parse_args()
    check_out(args.out, args)
    params = str(Path(args.params).resolve())
    load_config(params)  # a bad params file fails here, in one line, not in every variant
    for path in (args.model, args.index, args.train):
        if not (ROOT / path).exists():
            raise CentralRLError(f"{path}: not found; build it first (dvc repro prepare_model@main index data)")
    runs: dict[str, list[dict]] = {name: [] for name in PATCHES}
    for round_ in range(args.rounds):
        for name in list(PATCHES) if round_ % 2 == 0 else list(reversed(PATCHES)):
            runs[name].append(measured(name, params, args))
            print(f"round {round_ + 1}: {name} {json.dumps(runs[name][-1])}", flush=True)
    best = {name: min(values, key=lambda run: run["wall_seconds"]) for name, values in runs.items()}
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "runs": runs,
        "same_start": len({run["content_sha256"] for values in runs.values() for run in values}) == 1,
        "owned_peak_rss_saved_gb": round(best["mapped"]["peak_rss_gb"] - best["owned"]["peak_rss_gb"], 3),
        "owned_speedup_wall": round(best["mapped"]["wall_seconds"] / best["owned"]["wall_seconds"], 3),
    }
    print(json.dumps(result, indent=2))
    write_indented_json(args.out, result)


if __name__ == "__main__":
    run_main(main)
