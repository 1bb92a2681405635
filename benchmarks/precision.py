"""Precision benchmark: float32 against bfloat16 on this machine, at the shapes the default's SmolLM2 runs, side
by side in one process, and what `precision: auto` resolves to here -> benchmarks/results/precision.json.

    python benchmarks/precision.py --out benchmarks/results/precision.json

Shapes: a 512 x 512 x 512 matmul (prefill-like: many rows) and a decode step's MLP projection (5 rows of 576 ->
1,536: the few rows a harness call keeps while decoding), on one torch thread and on the process's threads. Why
it matters: `auto` (warm start, sampled rollouts) picks bf16 only where the CPU has bf16 arithmetic (`avx512_bf16`
or `amx_bf16`, `centralrl.hardware.fast_bf16`); elsewhere torch has no bf16 kernels to use and the same work
runs far slower than in float32.
"""

from __future__ import annotations

import argparse

import cli
from cli import check_out, run_main


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__)
    parser.add_argument("--out", default="benchmarks/results/precision.json", help="figures (JSON)")
    args = parser.parse_args(argv)
    return args


if __name__ == "__main__":  # the command line before the heavy imports below: --help and usage errors at once
    ARGUMENTS = arguments()

import json
import os
import platform

import torch

from centralrl.hardware import compute_dtype, cpu_has_bf16
from cli import write_indented_json
from rollout import matmul_gflops, timed

DTYPES = ("float32", "bfloat16")


def decode_projection_us(dtype: torch.dtype, rows: int = 5, repeats: int = 200) -> float:
    """Best of `repeats` timings of `rows` x 576 -> 1,536 (SmolLM2's MLP up-projection), in microseconds."""
    x, w = torch.randn(rows, 576).to(dtype), torch.randn(1536, 576).to(dtype)
    torch.nn.functional.linear(x, w)  # warm-up
    return round(1e6 * min(timed(lambda: torch.nn.functional.linear(x, w))[1] for _ in range(repeats)), 1)


def measure(threads: int) -> dict:
    torch.set_num_threads(threads)
    result = {
        "matmul512_gflops": {name: matmul_gflops(getattr(torch, name), size=512, repeats=3) for name in DTYPES},
        "decode_projection_us": {name: decode_projection_us(getattr(torch, name)) for name in DTYPES},
    }
    result["bf16_matmul512_speedup"] = round(
        result["matmul512_gflops"]["bfloat16"] / result["matmul512_gflops"]["float32"], 3
    )
    result["bf16_decode_projection_speedup"] = round(
        result["decode_projection_us"]["float32"] / result["decode_projection_us"]["bfloat16"], 3
    )
    return result


def main(args: argparse.Namespace) -> None:
    check_out(args.out, args)
    threads = torch.get_num_threads()
    result = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_bf16": cpu_has_bf16(),
        },
        "auto_resolves_to": str(compute_dtype("auto", torch.device("cpu"))).removeprefix("torch."),
        "threads": {str(n): measure(n) for n in sorted({1, threads})},
    }
    print(json.dumps(result, indent=2))
    write_indented_json(args.out, result)


if __name__ == "__main__":
    run_main(lambda: main(ARGUMENTS))
