"""Grouped decode attention for the generation copies: a decode step's few queries per row as two matmuls over the
key/value heads, instead of torch's scaled-dot-product kernel.

A decode step asks attention for one query per row (a few with prompt-lookup drafts) against the whole cache.
transformers' sdpa path packs the query heads of each key/value head into one (`pack_gqa`), and torch's CPU
flash-attention kernel then runs per (row, key/value head) at a cost that is mostly fixed: in bf16 on this
machine's CPU it took 53% of a decode step of SmolLM2-135M at 6 rows (1.9 ms per layer). Here the query heads of a
key/value head are one matrix, so a layer is `q @ k^T` and `p @ v` per key/value head (no key/value copies, as
`pack_gqa`), the softmax in float32. Measured per decode step of SmolLM2-135M, one thread: bf16 6 rows x 300
positions 132 -> 91 ms, 16 rows x 500 positions 405 -> 167 ms; float32 141 -> 135 and 235 -> 200 ms
(`benchmarks/rollout.py` measures it in rollouts). Forwards with more than `GROUPED_QUERIES` queries per row
(prefill) go to transformers' sdpa function unchanged, and the mask is sdpa's (`sdpa_mask`): a boolean mask, or
None where the mask is purely causal.

Registered with transformers as `GROUPED`; `harness.copy_attention` chooses it for the generation copies
(`engine.MergedCopies`). The result differs from sdpa's by rounding: in bf16 by as much as sdpa's own distance
from float32 (both about 1 logit at most on SmolLM2), in float32 by 1e-4.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED = "centralrl_grouped"
GROUPED_QUERIES = 16  # the most queries per row computed by the grouped path (a decode step with its drafts)


def grouped_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [B, H, q, D], key and value [B, Hkv, S, D], mask [B, 1, q, S] (True: attend) or None (causal,
    the queries being the last q positions) -> output [B, q, H, D], as transformers' attention functions return."""
    batch, heads, queries, dim = query.shape
    if queries > GROUPED_QUERIES or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    kv_heads, slots = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    grouped = query.reshape(batch, kv_heads, group * queries, dim)
    scores = (grouped @ key.transpose(-1, -2)).float().mul_(scale).view(batch, kv_heads, group, queries, slots)
    if attention_mask is None:
        attention_mask = torch.ones(queries, slots, dtype=torch.bool, device=query.device).tril(slots - queries)
    scores.masked_fill_(~attention_mask.view(-1, 1, 1, queries, slots), float("-inf"))
    probs = scores.softmax(-1).to(value.dtype).view(batch, kv_heads, group * queries, slots)
    out = (probs @ value).view(batch, heads, queries, dim)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED, grouped_attention)
AttentionMaskInterface.register(GROUPED, sdpa_mask)
