"""Data-parallel GRPO over the processes `accelerate launch` starts: each process rolls out its share of a
step's questions (whole groups, so advantages stay within a process), the accumulated gradients are summed over
processes once per step, and every process takes the same optimizer step, so all hold the same adapters after it.

How it departs from the usual `Accelerator.prepare(model)` (DDP) recipe, and why: DDP all-reduces at every
backward, but a process's share of a step is a varying number of micro-batches (samples are grouped by adapter,
and how many trainable calls an episode makes varies), so processes would call backward a different number of
times and hang. Summing the gradients once per step, with the loss normalised by the number of trained tokens
of all processes, is the arithmetic one process does when it accumulates every micro-batch; N processes make
the same update as one, up to the order of float sums. `accelerate` starts the processes and sets up the
process group (NCCL on GPUs, gloo on CPUs); the sums are `torch.distributed` collectives.

One process (`World()`, no launcher) is the default and touches no collective.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from centralrl.errors import ConfigError
from centralrl.hardware import pick_device
from centralrl.io import scratch_folder
from centralrl.processes import tied_to_this_process
from centralrl.services import HOST, free_port

LAUNCHED = "WORLD_SIZE"  # set by accelerate launch (and torchrun) in every process it starts


@dataclass(frozen=True)
class World:
    """This process's place among the training processes: rank, size and the device it computes on."""

    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @classmethod
    def join(cls, device: str, processes: int) -> World:
        """The world this process was launched into; `processes` (params) must say how many there are."""
        launched = int(os.environ.get(LAUNCHED, "1"))
        if launched != processes:
            raise ConfigError(
                f"train.processes is {processes} but this run was launched with {launched} process(es); "
                f"set -S train.processes={launched} so the params say how the run was made"
            )
        if processes == 1:
            return cls(device=pick_device(device))
        from accelerate import PartialState

        state = PartialState(cpu=device == "cpu" or not torch.cuda.is_available())
        where = state.device if state.device.type != "cpu" else torch.device("cpu")
        return cls(state.process_index, state.num_processes, where)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: Sequence) -> list:
        """This process's contiguous share of `items`; shares differ in length by at most one.

        >>> World(1, 3).shard(list(range(7)))
        [3, 4]
        """
        base, extra = divmod(len(items), self.size)
        start = self.rank * base + min(self.rank, extra)
        return list(items[start : start + base + (self.rank < extra)])

    def gather(self, items: Sequence) -> list:
        """Every process's `items`, concatenated in rank order (the order one process would have made them)."""
        if self.size == 1:
            return list(items)
        from accelerate.utils import gather_object

        return gather_object(list(items))

    def total(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums of `values` over processes (float64)."""
        if self.size == 1:
            return list(values)
        summed = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(summed)
        return summed.tolist()

    def slowest(self, seconds: float) -> float:
        """The longest of every process's `seconds` (a step takes as long as its slowest process)."""
        if self.size == 1:
            return seconds
        longest = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(longest, op=torch.distributed.ReduceOp.MAX)
        return float(longest)

    def barrier(self) -> None:
        """Wait until every process reaches this point."""
        if self.size > 1:
            torch.distributed.barrier()

    def sum_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Sum gradients over processes in one buffer. A parameter no process touched keeps no gradient (as one
        process would leave it, so AdamW skips it); one touched elsewhere only gets zeros here before the sum."""
        if self.size == 1:
            return
        touched = torch.tensor([p.grad is not None for p in parameters], dtype=torch.float32, device=self.device)
        torch.distributed.all_reduce(touched)
        live = [p for p, t in zip(parameters, touched.tolist()) if t > 0]
        for p in live:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if not live:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in live])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p in live:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()


def launch_command(processes: int, module: str, argv: Sequence[str], port: int | None = None) -> list[str]:
    """`accelerate launch` of `python -m module argv` on `processes` processes of this machine, their rendezvous on
    127.0.0.1 at `port` (default: a port free now), so nothing listens beyond this machine and two cells launched
    side by side do not collide on accelerate's fixed default port 29500.

    `--multi_gpu` is accelerate's multi-process launcher; without GPUs the processes join over gloo on CPUs.
    Several machines: run `accelerate launch` yourself with `--num_machines`, `--machine_rank` and
    `--main_process_ip <address the others reach>` (and `--main_process_port`), and set `train.processes` to the
    total number of processes; a stage launched that way does not relaunch itself.
    """
    port = free_port() if port is None else port
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--main_process_ip",
        HOST,
        "--main_process_port",
        str(port),
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        module,
        *argv,
    ]


def launch(processes: int, module: str, argv: Sequence[str]) -> int:
    """Run `launch_command` and return its exit code. The launcher is killed when this process exits, however it
    dies, and each launched stage dies with the launcher (`stages.cli.run_stage`), so no process outlives the
    stage. The launched processes' temporary files (torch elastic's log folder, which it never removes: one
    `torchelastic_*` per launch) go to a scratch folder removed afterwards."""
    scratch = scratch_folder("centralrl-launch")
    try:
        env = os.environ | {"TMPDIR": str(scratch)}
        command = launch_command(processes, module, argv)
        return subprocess.run(command, env=env, preexec_fn=tied_to_this_process()).returncode
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def needs_launch(processes: int) -> bool:
    """True when params ask for several processes and this one was not started by a launcher."""
    return processes > 1 and LAUNCHED not in os.environ
