"""What this process may use: its device, fast bf16 arithmetic, and how many CPU threads torch should run.

`compute_dtype(name, device)` resolves a precision param (`auto`, `float32`, `bfloat16`) to a torch dtype. `auto`
is bfloat16 where the hardware has bf16 arithmetic (a CUDA device that supports it; a CPU whose flags include
`avx512_bf16` or `amx_bf16`) and float32 elsewhere, so a laptop without it is not slowed by emulated bf16.

`hardware_tags()` names what a run's numbers depend on (torch's CPU kernel level, bf16 arithmetic, the GPU, the
torch version and thread count): every MLflow run carries them, because `auto` precision and the CPU's kernels
change sampled tokens, so two machines running the same params write different results.

`available_cpus()` counts the CPUs this process may really run on: its affinity mask, capped by a cgroup v2 CPU
quota (`cpu.max`) when one is set, so a container limited to 2 CPUs on a 64-core host gets 2 threads, not 64.
`set_threads(requested)` applies `threads` from params: `auto` is `OMP_NUM_THREADS` when the environment sets
it (the standard way a launcher says how many threads each process gets), else that count; a number is taken as
given. Running several torch processes at once on a small machine (tests, parallel stages), each should get one:
on a loaded 2-core machine two threads per process ran decode steps 10-30x slower in wall time than one.

`return_free_memory()` hands the C heap's free pages back to the operating system (glibc's `malloc_trim`; a no-op
elsewhere) when the process's resident memory is above a ceiling. Freed tensors below glibc's mmap threshold stay
in the heap: without it, the train stage's peak RSS holds the freed generation copies and the update's
activations together. Returning them costs the next micro-batch its page faults (0-25% of an update's or warm
start's time), so below the ceiling the heap keeps them for reuse. `set_memory_return(enabled, above_gb)` applies
`return_memory` and `return_memory_above_gb` from params: off, it does nothing; a ceiling of 0 returns every
time (faster or less memory; the same results either way).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

from centralrl.errors import ConfigError

PRECISIONS = ("auto", "float32", "bfloat16")


@functools.cache
def cpu_has_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU advertises native bf16 arithmetic (AVX-512 BF16 or AMX), read from /proc/cpuinfo."""
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def fast_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_bf16()


def pick_device(requested: str) -> torch.device:
    """The torch device of `harness.device`: `auto` is cuda when available, else cpu; cuda without one is an
    error (it was torch's AssertionError from the first `model.to`)."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"harness.device is {requested}, but torch sees no CUDA device here; use auto or cpu")
    return torch.device(requested)


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """The torch dtype of precision `name` on `device` (see the module docstring for `auto`)."""
    if name not in PRECISIONS:
        raise ValueError(f"precision {name!r} is not one of {', '.join(PRECISIONS)}")
    if name == "auto":
        return torch.bfloat16 if fast_bf16(device) else torch.float32
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def hardware_tags() -> dict[str, str]:
    """What results depend on beyond params and inputs, as MLflow tags (see the module docstring)."""
    cuda = torch.cuda.is_available()
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16": "yes" if cpu_has_bf16() else "no",
        "gpu": torch.cuda.get_device_name() if cuda else "none",
        "torch": torch.__version__,
        "torch_threads": str(torch.get_num_threads()),
    }


def cgroup_cpu_limit(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """CPUs allowed by a cgroup v2 quota ("200000 100000" -> 2), or None when unlimited or unreadable."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, int(quota) // int(period))


def available_cpus() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return min(cpus, limit) if limit else cpus


def _omp_threads() -> int:
    value = os.environ.get("OMP_NUM_THREADS", "")
    if not value:
        return 0
    if not value.isdigit():
        raise ConfigError(f"OMP_NUM_THREADS={value!r} is not a thread count; unset it or give a whole number")
    return int(value)


def set_threads(requested: int | str) -> int:
    """Set torch's intra-op threads from `threads` in params ("auto" or a count); return the count set."""
    if requested != "auto":
        count = int(requested)
    else:
        count = _omp_threads() or available_cpus()
    torch.set_num_threads(count)
    return count


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none (macOS, musl)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_return_memory = True  # `return_memory` from params (`set_memory_return`)
_return_above_bytes = 0  # `return_memory_above_gb` from params


def set_memory_return(enabled: bool, above_gb: float = 0.0) -> None:
    """Apply `return_memory` and `return_memory_above_gb` from params: whether `return_free_memory` gives free heap
    pages back to the OS, and above what resident memory."""
    global _return_memory, _return_above_bytes
    _return_memory, _return_above_bytes = enabled, int(above_gb * 1e9)


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux's /proc/self/statm), or None where it cannot be read."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def return_free_memory(always: bool = False) -> bool:
    """Return the heap's free pages to the OS (see the module docstring) when the process's resident memory is above
    `return_memory_above_gb` (or cannot be read), or `always`; False where the C library cannot, `return_memory`
    is off, or the process is below the ceiling."""
    trim = _malloc_trim()
    if trim is None or not _return_memory:
        return False
    if not always and _return_above_bytes:
        resident = resident_bytes()
        if resident is not None and resident <= _return_above_bytes:
            return False
    trim(0)
    return True
