"""What a process may use: cgroup CPU quotas, the threads param, the precision param, the return_memory param."""

from __future__ import annotations

import functools

import pytest
import torch

from centralrl import hardware
from centralrl.errors import ConfigError
from centralrl.hardware import cgroup_cpu_limit, compute_dtype, set_threads
from conftest import write_params


@pytest.mark.parametrize(("text", "cpus"), [("200000 100000\n", 2), ("50000 100000", 1), ("max 100000", None)])
def test_a_cgroup_quota_caps_the_cpus(tmp_path, text, cpus):
    (tmp_path / "cpu.max").write_text(text)
    assert cgroup_cpu_limit(tmp_path / "cpu.max") == cpus


def test_no_cgroup_file_means_no_limit(tmp_path):
    assert cgroup_cpu_limit(tmp_path / "absent") is None


def test_auto_threads_follow_omp_num_threads_and_a_number_is_taken_as_given(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert set_threads("auto") == 1 == torch.get_num_threads()
        assert set_threads(2) == 2 == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "two")
        with pytest.raises(ConfigError, match="OMP_NUM_THREADS='two'"):
            set_threads("auto")
    finally:
        torch.set_num_threads(before)


def test_precisions_resolve_and_auto_is_bf16_only_where_the_cpu_flags_say_so(tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    assert compute_dtype("float32", cpu) == torch.float32 and compute_dtype("bfloat16", cpu) == torch.bfloat16
    read_flags = hardware.cpu_has_bf16
    for flags, expected in [("fpu avx2 avx512f", torch.float32), ("fpu avx512f avx512_bf16", torch.bfloat16)]:
        cpuinfo = tmp_path / f"cpuinfo-{expected}"
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(hardware, "cpu_has_bf16", functools.partial(read_flags, cpuinfo))
        assert compute_dtype("auto", cpu) == expected
        assert hardware.hardware_tags()["cpu_bf16"] == ("yes" if expected == torch.bfloat16 else "no")
    with pytest.raises(ValueError, match="half"):
        compute_dtype("half", cpu)


def _rss_mb() -> float:
    """Resident memory of this process now (Linux /proc)."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0]) / 1024


@pytest.mark.skipif(not hardware.return_free_memory(), reason="no glibc malloc_trim in this C library")
@pytest.mark.parametrize("enabled", [True, False])  # `return_memory` in params
def test_freed_tensors_held_in_the_heap_go_back_to_the_os(enabled):
    # tensors of 1 MB come from glibc's heap once a freed 16 MB block has raised its mmap threshold; one kept
    # above them pins the heap's top, so freeing them returns nothing by itself: the case of the update's
    # activations, freed between micro-batches under the optimizer's and the cache's live tensors
    big = torch.ones(4 * 2**20)
    del big
    blocks = [torch.ones(2**18) for _ in range(256)]
    pinned = torch.ones(2**18)
    del blocks
    held = _rss_mb()
    hardware.set_memory_return(enabled)
    try:
        assert hardware.return_free_memory() is enabled
    finally:
        hardware.set_memory_return(True)
    if enabled:
        assert held - _rss_mb() > 128, "malloc_trim returned less than half of the 256 MB freed"
    else:
        assert held - _rss_mb() < 32, "return_memory is off, yet the heap shrank"
    assert pinned.sum() == 2**18


@pytest.mark.skipif(not hardware.return_free_memory(), reason="no glibc malloc_trim in this C library")
def test_below_the_ceiling_the_heap_keeps_freed_memory():
    """`return_memory_above_gb`: under it nothing is returned (the next micro-batch reuses the heap); over it, or
    when asked `always`, it is."""
    resident = hardware.resident_bytes()
    assert resident and 10e6 < resident < 1e12
    try:
        hardware.set_memory_return(True, above_gb=(resident + 2**30) / 1e9)
        assert hardware.return_free_memory() is False
        assert hardware.return_free_memory(always=True) is True
        hardware.set_memory_return(True, above_gb=resident / 2 / 1e9)
        assert hardware.return_free_memory() is True
    finally:
        hardware.set_memory_return(True)


def test_a_stage_applies_return_memory_from_params(tmp_path):
    from argparse import Namespace

    from stages.cli import _prepare

    threads = torch.get_num_threads()
    params = [
        write_params(tmp_path / name, changes)
        for name, changes in (
            ("off", {"return_memory": False, "threads": threads}),
            ("ceiling", {"return_memory_above_gb": 1e6, "threads": threads}),
        )
    ]
    try:
        _prepare(Namespace(params=str(params[0])), [], tracked=False, checks=None)
        assert hardware.return_free_memory() is False
        _prepare(Namespace(params=str(params[1])), [], tracked=False, checks=None)
        assert hardware.return_free_memory() is False  # below a ceiling of a million GB
    finally:
        hardware.set_memory_return(True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_asked_for_without_cuda_names_the_param():
    """It was torch's AssertionError ("Torch not compiled with CUDA enabled") from the stage's first model.to."""
    with pytest.raises(
        ConfigError, match="harness.device is cuda, but torch sees no CUDA device here; use auto or cpu"
    ):
        hardware.pick_device("cuda")
    assert hardware.pick_device("auto").type == "cpu"
