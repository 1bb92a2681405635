"""Compute accounting for RL training and evaluation of a LoRA-adapted causal LM.

Deterministic counts depend only on token counts and the architecture.

FLOPs of one causal forward over ``T`` positions whose output projection (``lm_head``) runs at ``K`` of them::

    forward_flops(T, K) = 2 * N_body * T + 2 * N_head * K + attention(T)
    attention(T)        = sum_{p=1..T} 4 * L * d_attn * p = 2 * L * d_attn * T * (T + 1)

where ``N_body`` is the number of weights of every ``nn.Linear`` of the decoder layers, ``N_head`` those of
``lm_head`` (counted even when tied to the embedding, since the output projection is a matmul; LoRA weights,
biases and embeddings excluded), ``L`` the number of layers and ``d_attn = num_attention_heads * head_dim``.
The attention term counts QK^T and attention-times-V at 2 FLOPs per multiply-add, position ``p`` attending to
``p`` positions. The head runs where logits are used: a generation prefill at its last position and each decode
step at its token (K = generated tokens), a teacher-forced update at the positions that predict trained tokens.

A generation call of ``G`` tokens after a ``P``-token prompt (prefill, then KV-cached decodes) is a forward over
the ``P + G - 1`` positions fed to the model (the last token is never fed back) with ``K = G``. An update on one
trained sequence is its forward (``K`` = the completion's tokens), a backward, and an adapters-off KL reference
forward when it runs. The backward through frozen weights computes input gradients only: one more pass of every
matmul (the weight gradients of the frozen matmuls are never formed), and twice the attention term (the
gradients of both operands of QK^T and of attention-times-V). So ``backward = forward + attention(T)``.

Departures from the project's design ("a LoRA backward over frozen weights ~ 2 x forward", and ``lm_head`` at
every position): torch's FLOP counter on a LoRA-wrapped Qwen2 counts the backward's matmuls as one forward's
(`tests/test_compute.py`), so 2 overstated every update by a third to a half, and the head at every position
overstated SmolLM2's prompts by about a fifth (its head is 21% of its matmul weights). Ignored: biases, norms,
activations, rotary embeddings, softmax, the embedding lookup, the LoRA adapters' own matmuls and weight
gradients, the input gradients below the lowest adapter (none needs them), padding tokens of a batch, and the
forward that activation checkpointing recomputes (`train.activation_checkpointing`, off by default).
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


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers the FLOPs formula needs: `matmul_params` counts every linear weight, `lm_head`'s
    (`head_params`) included."""

    matmul_params: int
    head_params: int
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
            head_params=int(base.get_output_embeddings().weight.numel()),
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


def forward_flops(shape: ModelShape, tokens: int, logits: int | None = None) -> int:
    """FLOPs of one causal forward over ``tokens`` positions, ``lm_head`` at ``logits`` of them (all by default).

    >>> shape = ModelShape(matmul_params=1000, head_params=200, layers=2, attention_width=8)
    >>> forward_flops(shape, 5), forward_flops(shape, 5, logits=1)
    (10960, 9360)
    """
    logits = tokens if logits is None else logits
    matmuls = 2 * (shape.matmul_params - shape.head_params) * tokens + 2 * shape.head_params * logits
    return int(matmuls + attention_flops(shape, tokens))


def attention_flops(shape: ModelShape, tokens: int) -> int:
    """QK^T and attention-times-V of a causal forward over ``tokens`` positions."""
    return 2 * shape.layers * shape.attention_width * tokens * (tokens + 1)


def generation_flops(shape: ModelShape, prompt_tokens: int, generated_tokens: int) -> int:
    """A prefill and KV-cached decodes: the positions fed to the model (every generated token but the last) and
    ``lm_head`` once per generated token (once for the prefill if nothing was generated)."""
    fed = prompt_tokens + max(generated_tokens - 1, 0)
    return forward_flops(shape, fed, logits=max(generated_tokens, 1))


def update_flops(shape: ModelShape, prompt_tokens: int, trained_tokens: int, *, reference_forward: bool) -> int:
    """Policy forward (``lm_head`` where trained tokens are predicted), the backward through frozen weights (one
    more pass of the matmuls for the input gradients, twice the attention term), and an adapters-off KL
    reference forward if asked."""
    tokens = prompt_tokens + trained_tokens
    forward = forward_flops(shape, tokens, logits=trained_tokens)
    backward = forward + attention_flops(shape, tokens)
    return (1 + int(reference_forward)) * forward + backward


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
