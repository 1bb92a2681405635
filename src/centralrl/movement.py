"""How far each role of a trained arm moved from the start, measured on the evaluation's own greedy episodes.

For every call of a role with an adapter, from one forward pass over its prompt + completion with the role's
adapter and one with every adapter off (the starting checkpoint), batched:

- changed: whether the start, generating greedily from the call's prompt, would write something else. Greedy
  decoding takes the argmax at every position, so the start reproduces the completion exactly when its argmax
  agrees with the policy's at every completion position (a completion that ended, by a stop token or the
  budget, ends the start's there too). Both argmaxes come from the same padded batch, so identical weights
  give identical decisions bit for bit: a role whose LoRA B is zero changes nothing.
- kl: the mean over the call's completion tokens of KL(policy || start) at that position, exact over the
  vocabulary (sum_v p log(p / q), temperature 1).

Per role (`role_movement`): calls, changed (a count), changed_share, and kl (the mean over calls of each call's
mean); both are null for a role that made no call. A role without an adapter runs the start itself
(`models.adapters.acting_as`), so it is reported with 0 changed and kl 0 without being measured.

Departures: "changed" is read off the teacher-forced argmaxes instead of regenerating every call with the start
(the same answer in exact arithmetic; on SmolLM2 on CPU regenerating cost 1.8 times these two passes, and a
near-tie that cached, differently batched generation resolves otherwise would count as movement). The KL is
exact per position on the policy's greedy tokens rather than the trainer's k3 estimate on sampled ones
(`rl.grpo.kl_k3`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from centralrl.harness.engine import RolePolicy
from centralrl.harness.episodes import Episode, RoleCall
from centralrl.models.adapters import acting_as


def position_kl(policy_logits: torch.Tensor, start_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(policy) || softmax(start)) per position: logits [..., V] -> [...], float32.

    >>> position_kl(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 0.0]])).tolist()
    [0.0]
    """
    logp = torch.log_softmax(policy_logits.float(), dim=-1)
    logq = torch.log_softmax(start_logits.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1).clamp_min(0.0)  # rounding can put a KL of ~0 just below 0


@torch.no_grad()
def _batch_movement(model, calls: Sequence[RoleCall], adapter: str, pad: int) -> list[tuple[bool, float]]:
    """(changed, mean per-token KL) of each call, from two forward passes over the left-padded batch."""
    device = next(model.parameters()).device
    rows = [list(c.prompt_ids) + list(c.completion_ids) for c in calls]
    width, longest = max(len(r) for r in rows), max(len(c.completion_ids) for c in calls)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    positions = (attention.cumsum(-1) - 1).clamp_min(0)  # as `generate` numbers a left-padded row
    logits = {}
    for name in (adapter, None):  # the last longest + 1 positions hold every completion token's prediction
        with acting_as(model, name):
            out = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=longest + 1)
        logits[name] = out.logits[:, :-1]  # [B, longest]: column j predicts the token at width - longest + j
    differs = logits[adapter].argmax(-1) != logits[None].argmax(-1)
    out = []
    for i, call in enumerate(calls):  # row by row: the KL's [positions, V] temporaries of one call at a time
        mine = slice(longest - len(call.completion_ids), None)
        kl = position_kl(logits[adapter][i, mine], logits[None][i, mine])
        out.append((bool(differs[i, mine].any()), float(kl.mean())))
    return out


def call_movement(model, calls: Sequence[RoleCall], pad: int, batch_size: int) -> list[tuple[bool, float]]:
    """(changed, mean per-token KL(policy || start)) of each call, in order; batched per adapter, rows of similar
    length together."""
    out: list[tuple[bool, float]] = [(False, 0.0)] * len(calls)
    for adapter in sorted({c.adapter for c in calls}):
        mine = sorted(
            (i for i, c in enumerate(calls) if c.adapter == adapter),
            key=lambda i: (len(calls[i].prompt_ids) + len(calls[i].completion_ids), i),
        )
        for start in range(0, len(mine), batch_size):
            batch = mine[start : start + batch_size]
            for i, moved in zip(batch, _batch_movement(model, [calls[i] for i in batch], adapter, pad)):
                out[i] = moved
    return out


def role_movement(episodes: Sequence[Episode], policy: RolePolicy, roles: Sequence[str]) -> dict[str, dict]:
    """{role: {adapter, calls, changed, changed_share, kl}} for every role of `roles` (see the module docstring)."""
    calls = [c for e in episodes for c in e.calls]
    measured = [c for c in calls if c.adapter is not None and c.completion_ids]
    moved = call_movement(policy.model, measured, policy.tokenizer.pad_token_id, policy.batch_size)
    out = {}
    for role in roles:
        n = sum(c.role == role for c in calls)
        mine = [m for c, m in zip(measured, moved) if c.role == role]  # none for a frozen role
        changed = sum(flag for flag, _ in mine)
        out[role] = {
            "adapter": policy.adapters.get(role),
            "calls": n,
            "changed": changed,
            "changed_share": changed / n if n else None,
            "kl": sum(kl for _, kl in mine) / n if n else None,
        }
    return out


def movement_metrics(movement: dict[str, dict]) -> dict[str, float]:
    """Flat MLflow metrics `movement.<role>.<calls|changed_share|kl>` (a role without calls logs only calls).

    >>> movement_metrics({"conclusion": {"calls": 2, "changed": 1, "changed_share": 0.5, "kl": 0.1}})
    {'movement.conclusion.calls': 2.0, 'movement.conclusion.changed_share': 0.5, 'movement.conclusion.kl': 0.1}
    """
    return {
        f"movement.{role}.{key}": float(row[key])
        for role, row in movement.items()
        for key in ("calls", "changed_share", "kl")
        if row[key] is not None
    }
