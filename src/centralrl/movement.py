"""How far each role of a trained arm moved from the start, measured on the evaluation's own greedy episodes.

For every call of a role with an adapter, from one forward pass over its prompt + completion with the role's
adapter and one with every adapter off (the starting checkpoint), batched:

- changed: whether the start, generating greedily from the call's prompt, would write something else. Greedy
  decoding takes the argmax at every position, so the start reproduces the completion exactly when its argmax
  agrees with the policy's at every completion position (a completion that ended, by a stop token or the
  budget, ends the start's there too). Both argmaxes come from the same padded batch, so identical weights
  give identical decisions bit for bit: a role whose LoRA B is zero changes nothing. The calls of a batch share
  their role's system prompt (and a question's calls more), which each pass runs once for the batch, as the
  update does (`benchmarks/movement.py` measures what that saves).
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

from centralrl.harness.engine import RolePolicy, causal_lm, prefixed_states, shared_prefix
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


def movement_batches(calls: Sequence[RoleCall], batch_size: int) -> list[tuple[str, list[int]]]:
    """(adapter, indices into `calls`) of each batch `call_movement` runs: per adapter (sorted), rows of similar
    length together (by prompt + completion tokens, ties in call order), `batch_size` at most.

    >>> call = lambda adapter, prompt: RoleCall("central", adapter, 0, prompt, (9,), (0.0,), "", True)
    >>> movement_batches([call("b", (1, 2)), call("a", (1, 2, 3)), call("a", (1,)), call("a", (2,))], 2)
    [('a', [2, 3]), ('a', [1]), ('b', [0])]
    """
    out = []
    for adapter in sorted({c.adapter for c in calls}):
        mine = sorted(
            (i for i, c in enumerate(calls) if c.adapter == adapter),
            key=lambda i: (len(calls[i].prompt_ids) + len(calls[i].completion_ids), i),
        )
        out += [(adapter, mine[start : start + batch_size]) for start in range(0, len(mine), batch_size)]
    return out


def batch_prefix(calls: Sequence[RoleCall]) -> int:
    """The tokens every call of a batch shares before its first completion position's input: run once."""
    rows = [list(c.prompt_ids) + list(c.completion_ids) for c in calls]
    return min(shared_prefix(rows), min(len(c.prompt_ids) for c in calls) - 1)


@torch.no_grad()
def _batch_movement(
    model, calls: Sequence[RoleCall], adapter: str, pad: int, share_prefix: bool
) -> list[tuple[bool, float]]:
    """(changed, mean per-token KL) of each call, from two forward passes over the right-padded batch, each running
    the rows' common prefix once (`prefixed_states`; every row whole without `share_prefix`) and the output head
    only at completion positions."""
    device = next(model.parameters()).device
    rows = [list(c.prompt_ids) + list(c.completion_ids) for c in calls]
    shared = batch_prefix(calls) if share_prefix else 0
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
    predicts = torch.zeros((len(rows), width - 1), dtype=torch.bool, device=device)  # position t predicts token t+1
    for row, call in enumerate(calls):
        predicts[row, len(call.prompt_ids) - 1 : len(rows[row]) - 1] = True
    lm = causal_lm(model)
    logits = {}
    for name in (adapter, None):
        with acting_as(model, name):
            hidden = prefixed_states(lm.base_model, ids, attention, shared)[:, :-1][predicts[:, shared:]]
            logits[name] = lm.get_output_embeddings()(hidden)  # [completion tokens of every row, V], row by row
    differs = logits[adapter].argmax(-1) != logits[None].argmax(-1)
    out, first = [], 0
    for call in calls:  # call by call: the KL's [positions, V] temporaries of one call at a time
        mine = slice(first, first + len(call.completion_ids))
        kl = position_kl(logits[adapter][mine], logits[None][mine])
        out.append((bool(differs[mine].any()), float(kl.mean())))
        first = mine.stop
    return out


def call_movement(
    model, calls: Sequence[RoleCall], pad: int, batch_size: int, share_prefix: bool = True
) -> list[tuple[bool, float]]:
    """(changed, mean per-token KL(policy || start)) of each call, in order; batched per adapter, rows of similar
    length together (`share_prefix`: see `_batch_movement`; off only to measure what it saves)."""
    out: list[tuple[bool, float]] = [(False, 0.0)] * len(calls)
    for adapter, batch in movement_batches(calls, batch_size):
        for i, moved in zip(batch, _batch_movement(model, [calls[i] for i in batch], adapter, pad, share_prefix)):
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
