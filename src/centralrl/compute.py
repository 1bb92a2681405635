"""Compute accounting for RL training and evaluation of a LoRA-adapted causal LM.

Deterministic counts depend only on token counts and the architecture.

FLOPs of one causal forward over ``T`` positions (a prompt prefill followed by
generation with a KV cache costs the same)::

    forward_flops(T) = 2 * N * T + sum_{p=1..T} 4 * L * d_attn * p
                     = 2 * N * T + 2 * L * d_attn * T * (T + 1)

where ``N`` is the number of weights of every ``nn.Linear`` of the base model
(``lm_head`` included even when tied to the embedding, since the output
projection is a matmul; LoRA weights, biases and embeddings excluded), ``L`` is
the number of transformer layers and ``d_attn = num_attention_heads * head_dim``.
The attention term counts QK^T and attention-times-V at 2 FLOPs per
multiply-add, position ``p`` attending to ``p`` positions.

An update on one trained sequence costs
``(1 + BACKWARD_MULTIPLE + [reference_forward]) * forward_flops(T)``.

Departures from an exact count: biases, norms, activations, rotary embeddings,
softmax, the embedding lookup and the LoRA adapters' own matmuls are ignored;
padding tokens of a batch are not counted; the backward is taken as
``BACKWARD_MULTIPLE = 2`` forwards (activation gradients through the frozen
matmuls plus the adapters' weight gradients), as the project's design states.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

BACKWARD_MULTIPLE = 2


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers the FLOPs formula needs."""

    matmul_params: int
    layers: int
    attention_width: int

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        """Read the shape of a transformers model, or of a peft model wrapping one."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            matmul_params=_linear_weights(base),
            layers=int(config.num_hidden_layers),
            attention_width=int(config.num_attention_heads * head_dim),
        )

    def as_dict(self) -> dict:
        return asdict(self)


def _linear_weights(model: nn.Module) -> int:
    """Weights (not biases) of every nn.Linear outside the LoRA adapters."""
    return sum(
        module.weight.numel()
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and "lora_" not in name
    )


def forward_flops(shape: ModelShape, tokens: int) -> int:
    """FLOPs of one causal forward over ``tokens`` positions.

    >>> forward_flops(ModelShape(matmul_params=1000, layers=2, attention_width=8), 5)
    10960
    """
    matmuls = 2 * shape.matmul_params * tokens
    attention = 2 * shape.layers * shape.attention_width * tokens * (tokens + 1)
    return int(matmuls + attention)


def generation_flops(shape: ModelShape, prompt_tokens: int, generated_tokens: int) -> int:
    """Prefill plus KV-cached generation: the cost of one forward over both."""
    return forward_flops(shape, prompt_tokens + generated_tokens)


def update_flops(shape: ModelShape, sequence_tokens: int, *, reference_forward: bool) -> int:
    """Policy forward + backward, plus an adapters-off KL reference forward if asked."""
    return (1 + BACKWARD_MULTIPLE + int(reference_forward)) * forward_flops(shape, sequence_tokens)


class PhaseClock:
    """Accumulates wall-clock seconds and process CPU seconds per named phase (e.g. "generation", "retrieval",
    "update", "evaluation")."""

    def __init__(self) -> None:
        self._wall: dict[str, float] = {}
        self._cpu: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self._wall[name] = self._wall.get(name, 0.0) + time.perf_counter() - wall
            self._cpu[name] = self._cpu.get(name, 0.0) + time.process_time() - cpu

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in sorted(self._wall):
            out[f"{name}_seconds"] = self._wall[name]
            out[f"{name}_cpu_seconds"] = self._cpu[name]
        return out

    def reset(self) -> None:
        self._wall.clear()
        self._cpu.clear()


def peak_memory() -> dict[str, float]:
    """Peak resident set size of this process, and peak accelerator memory when there is one."""
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB
    if torch.cuda.is_available():
        out["peak_accelerator_mb"] = (
            sum(torch.cuda.max_memory_allocated(device) for device in range(torch.cuda.device_count())) / 2**20
        )
    return out


def accelerator_hours(wall_seconds: float, device: torch.device, processes: int = 1) -> float:
    """Accelerator-hours of `processes` processes, one GPU each, for `wall_seconds` (0.0 off CUDA).

    >>> accelerator_hours(1800, torch.device("cuda"), processes=4), accelerator_hours(1800, torch.device("cpu"))
    (2.0, 0.0)
    """
    return wall_seconds / 3600 * processes if device.type == "cuda" else 0.0
