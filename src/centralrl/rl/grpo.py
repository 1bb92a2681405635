"""GRPO's pieces as small tensor functions: group advantages, token log-probs, clipped surrogate, k3 KL, loss
aggregation (with gradient accumulation) and the learning-rate schedule.

Shapes: Q questions, G episodes per question, B sequences (episodes) in a (micro-)batch, T tokens, V vocabulary,
H hidden size, N trained tokens. A trainer strings them together once per micro-batch::

    adv = group_advantages(rewards, normalize_std, eps).flatten()             # [Q*G], one per episode
    logp = token_logprobs(logits, targets, temperature)                        # [B, T]
    loss, stats = grpo_loss(logp, old_logp, ref_logp, adv[rows], mask, clip_eps, kl_coef, mode,
                            denominator=batch_denominator(full_batch_mask, mode))
    loss.backward()                                                            # summed over micro-batches

`head_logprobs(hidden[mask], head, targets[mask], temperature)` gives the same log-probs as `token_logprobs` on
the full logits at the trained positions only ([N], in chunks), so no [B, T, V] tensor is built; `old_logp` is
the rollout's recorded log-probs of the sampled tokens (the policy that sampled them), not the update's own.

How this departs from GRPO as DeepSeekMath (arXiv 2402.03300, outcome supervision) states it, and from TRL's
`GRPOTrainer` and veRL's `core_algos`:

- Advantage std: the unbiased (Bessel, n-1) group std, as TRL (`rewards.view(-1, G).std(dim=1)`) and veRL
  (`torch.std`) compute it; the paper does not say which. A group whose rewards are all equal gets exactly 0
  (float32 round-off in the mean would otherwise leave ~1e-8 / (0 + eps) ~ 0.01, a spurious advantage).
- Loss normalization: the paper averages per sequence, then over the group ("sequence" here, TRL's original
  `loss_type="grpo"`). The default here is "token": one mean over every trained token of the batch (veRL's
  `token-mean`, DAPO, TRL's `dapo`/`bnpo`), as design.md asks, so long episodes are not down-weighted per token.
- KL: the paper's k3 estimator pi_ref/pi - log(pi_ref/pi) - 1, added to the per-token loss (not to the reward,
  as PPO-RLHF does), as the paper and TRL do. veRL's `low_var_kl` clamps it to [-10, 10]; here it is not clamped.
- Clipping: symmetric `clip_eps` (no DAPO clip-higher), no dual clip (veRL's `clip_ratio_c`), ratio unclamped.
- Masked tokens (prompt, retrieved passages, other roles' text, padding) enter neither the loss nor the
  statistics; `grpo_loss` neutralises them before any `exp`, so garbage log-probs there cannot make NaN gradients.
- Learning rate: linear warmup starts at 1/(warmup+1) instead of HF's 0, so no optimizer step is wasted at lr 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from centralrl.rl.choices import LOSS_MODES, LR_SCHEDULES


def groups_with_signal(rewards: Tensor) -> Tensor:
    """Which groups of rewards [Q, G] carry signal (rewards not all equal) -> bool [Q]; the others have zero
    advantage everywhere.

    >>> groups_with_signal(torch.tensor([[1.0, 0.0], [0.5, 0.5]])).tolist()
    [True, False]
    """
    return (rewards != rewards[:, :1]).any(dim=1)


def group_advantages(rewards: Tensor, normalize_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Group-relative advantages: rewards [Q, G] -> advantages [Q, G], one scalar per episode.

    A = (r - mean_g r) / (std_g r + eps) when `normalize_std`, else r - mean_g r, with mean and std over each row
    (the G episodes of one question). std is the unbiased one (divides by G - 1), as in TRL and veRL. A row of
    identical rewards gives exactly zeros, never NaN. Computed in float64, returned in the rewards' float dtype
    (float32 for integer rewards).

    >>> group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), normalize_std=False)
    tensor([[ 0.5000, -0.5000, -0.5000,  0.5000]])
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [Q, G], got shape {tuple(rewards.shape)}")
    if normalize_std and rewards.shape[1] < 2:
        raise ValueError(f"normalize_std needs at least 2 episodes per group (unbiased std), got G={rewards.shape[1]}")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    r = rewards.double()
    advantages = r - r.mean(dim=1, keepdim=True)
    if normalize_std:
        advantages = advantages / (r.std(dim=1, keepdim=True, unbiased=True) + eps)
    constant = (r == r[:, :1]).all(dim=1, keepdim=True)
    advantages = torch.where(constant, torch.zeros_like(advantages), advantages)
    return advantages.to(out_dtype)


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each target token: logits [B, T, V], targets [B, T] (int) -> [B, T] float32.

    log_softmax(logits / temperature)[b, t, targets[b, t]], in float32 whatever the logits' dtype (bf16
    log-softmax loses the small differences the ratio is made of). `logits[:, t]` must already be the
    prediction for `targets[:, t]` (shift by one before calling). Dividing by the sampling temperature matches
    the distribution the episodes were drawn from, as TRL does.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


HEAD_CHUNK = 1024  # positions per output-head call: caps the forward's transient [chunk, V] logits (200 MB at 49k)


def head_logprobs(
    hidden: Tensor,
    head: torch.nn.Module,
    targets: Tensor,
    temperature: float = 1.0,
    chunk: int = HEAD_CHUNK,
) -> Tensor:
    """`token_logprobs(head(hidden), targets, temperature)` over `chunk` positions at a time: hidden [N, H] (the
    states that predict `targets`), targets [N] -> [N] float32. `head` maps H -> V logits (a causal LM's output
    layer). It runs outside any autocast, in its weights' dtype (float32 for a float32 model): under bf16 autocast
    the decoder's arithmetic is bf16 but the logits are not rounded to bf16 (an error of ~0.05 on a logit of 10,
    which on a near-uniform output drowned what a LoRA on the head learned). It costs N rows, not B * T. Autograd
    keeps each chunk's log-softmax for the backward pass: N * V floats.

    >>> head = torch.nn.Linear(2, 4)
    >>> _ = torch.nn.init.zeros_(head.weight), torch.nn.init.zeros_(head.bias)  # every token: log(1/4)
    >>> head_logprobs(torch.randn(3, 2), head, torch.tensor([0, 1, 3]), chunk=2).exp().tolist()
    [0.25, 0.25, 0.25]
    """
    dtype = next(head.parameters()).dtype
    with torch.autocast(hidden.device.type, enabled=False):
        pieces = zip(hidden.to(dtype).split(chunk), targets.split(chunk))
        return torch.cat([token_logprobs(head(h), t, temperature) for h, t in pieces])


def micro_batches(lengths: Sequence[int], max_rows: int, max_positions: int) -> list[list[int]]:
    """Indices of the sequences of `lengths`, sorted by length (stably) and cut into micro-batches of at most
    `max_rows` sequences and `max_positions` padded positions (rows x longest); a longer sequence goes alone.
    Sorting keeps padding low; the position cap bounds a forward's activations, so its peak memory.

    >>> micro_batches([5, 1, 2, 9, 2], max_rows=2, max_positions=8)
    [[1, 2], [4], [0], [3]]
    """
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches and len(batches[-1]) < max_rows and (len(batches[-1]) + 1) * lengths[i] <= max_positions:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def clipped_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_eps: float) -> tuple[Tensor, Tensor]:
    """PPO clipped objective as a per-token loss: logp, old_logp [B, T], advantages [B] -> (loss, clipped), [B, T].

    ratio = exp(logp - old_logp); loss = -min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A), A
    broadcast over T. `clipped` (bool) marks where the clipped term was strictly the smaller one, i.e. where the
    token gives no gradient: ratio > 1 + eps with A > 0, or ratio < 1 - eps with A < 0 (TRL's `is_high_clipped`
    / `is_low_clipped`). `old_logp` is treated as a constant (detached).
    """
    ratio = torch.exp(logp - old_logp.detach())
    adv = advantages.to(ratio.dtype).unsqueeze(-1)
    unclipped = ratio * adv
    clipped_term = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    return -torch.minimum(unclipped, clipped_term), clipped_term < unclipped


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) per token: logp, ref_logp [B, T] -> [B, T], always >= 0.

    exp(ref_logp - logp) - (ref_logp - logp) - 1: unbiased for the KL on tokens sampled from pi, 0 where the two
    agree, gradient w.r.t. logp is 1 - exp(ref_logp - logp). `ref_logp` is treated as a constant (detached).
    Not clamped (veRL's `low_var_kl` clamps to [-10, 10]).
    """
    delta = ref_logp.detach() - logp
    return torch.exp(delta) - delta - 1.0


def batch_denominator(mask: Tensor, mode: str) -> float:
    """The `denominator` of `aggregate` for a whole batch, from its full mask [B, T] (before micro-batching).

    "token": the number of trained tokens; "sequence": the number of sequences with at least one trained token.

    >>> m = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    >>> batch_denominator(m, "token"), batch_denominator(m, "sequence")
    (3.0, 2.0)
    """
    _check_mode(mode)
    trained = mask.bool()
    if mode == "token":
        return float(trained.sum())
    return float(trained.any(dim=-1).sum())


def aggregate(per_token: Tensor, mask: Tensor, mode: str, denominator: float | None = None) -> Tensor:
    """Reduce a per-token loss [B, T] over the trained tokens (`mask` [B, T], bool or 0/1) to a scalar.

    "token": sum(per_token over masked tokens) / N, with N = `denominator` if given else this mask's token count.
    "sequence": each sequence's masked mean m_b (sequences with an empty mask are skipped), then
    sum_b m_b / S, with S = `denominator` if given else the number of non-empty sequences here (a plain mean).

    Gradient accumulation: split a batch into micro-batches by rows, pass every micro-batch the SAME
    `denominator = batch_denominator(full_mask, mode)` (total trained tokens, or total non-empty sequences, of the
    whole batch), and the micro-batch losses (and their gradients) sum to the full-batch loss without a
    denominator. For "sequence" this is the brief's "mean divided by (denominator / B)" when every sequence has a
    trained token; with empty sequences, dividing the sum by S keeps the equality exact where the former does not.

    With no trained token and no denominator the result is 0 (still attached to the graph). Masked positions
    are dropped with `where`, so a NaN or inf there does not reach the value.
    """
    _check_mode(mode)
    if denominator is not None and denominator <= 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    trained = mask.bool()
    kept = torch.where(trained, per_token, torch.zeros_like(per_token))
    if mode == "token":
        n = denominator if denominator is not None else trained.sum().clamp(min=1).to(per_token.dtype)
        return kept.sum() / n
    counts = trained.sum(dim=-1)
    nonempty = counts > 0
    seq_means = kept.sum(dim=-1) / counts.clamp(min=1).to(per_token.dtype)  # an empty sequence gives 0 / 1 = 0
    s = denominator if denominator is not None else nonempty.sum().clamp(min=1).to(per_token.dtype)
    return seq_means.sum() / s


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    kl_coef: float,
    mode: str = "token",
    denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO loss of one (micro-)batch and its statistics.

    logp (with grad), old_logp (sampling policy), ref_logp (frozen starting policy) [B, T]; advantages [B];
    mask [B, T]. Returns aggregate(clipped_surrogate + kl_coef * kl_k3, mask, mode, denominator) and
    {"clip_fraction", "kl", "ratio_mean"}: the fraction of trained tokens that were clipped, the mean k3 and the
    mean ratio over trained tokens of this micro-batch (0, 0, 1 when it has none). `ref_logp=None` is allowed
    only with kl_coef == 0 (no reference forward needed); "kl" is then reported as 0.

    old_logp is the rollout's recorded log-probs. In the first update of a rollout batch the ratio is 1 up to the
    gap between the sampling engine's numerics (bf16, merged weights, other kernels) and the update's, and the
    clip bounds how far that gap moves the gradient; in later ones (`updates_per_rollout` > 1) it also bounds how
    far the earlier updates moved the policy. With old_logp = logp.detach() the ratio is exactly 1 and the
    gradient of the token-mode loss w.r.t. logp is -A / N on trained tokens. Masked positions are set to logp =
    old_logp = ref_logp = 0 (ratio 1, KL 0) before any exp, so their gradient is exactly 0 whatever values they held.
    """
    if ref_logp is None and kl_coef != 0:
        raise ValueError(f"ref_logp is required when kl_coef != 0 (got kl_coef={kl_coef})")
    trained = mask.bool()
    zero = torch.zeros_like(logp)
    logp = torch.where(trained, logp, zero)
    old_logp = torch.where(trained, old_logp.to(logp.dtype), zero)
    surrogate, clipped = clipped_surrogate(logp, old_logp, advantages, clip_eps)
    kl = zero if ref_logp is None else kl_k3(logp, torch.where(trained, ref_logp.to(logp.dtype), zero))
    per_token = surrogate + kl_coef * kl if kl_coef else surrogate  # a measured k3 can be inf: 0 x inf is NaN
    loss = aggregate(per_token, trained, mode, denominator)
    with torch.no_grad():
        n = int(trained.sum())
        if n == 0:
            stats = {"clip_fraction": 0.0, "kl": 0.0, "ratio_mean": 1.0}
        else:
            ratio = torch.exp(logp - old_logp)
            stats = {
                "clip_fraction": float((clipped & trained).sum()) / n,
                "kl": float(kl[trained].sum()) / n,
                "ratio_mean": float(ratio[trained].sum()) / n,
            }
    return loss, stats


def lr_multiplier(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The factor on the base learning rate at optimizer step s (0-based), for `torch.optim.lr_scheduler.LambdaLR`.

    LambdaLR evaluates it at s = 0 when built and at s = k after the k-th `scheduler.step()`, so the k-th update
    (0-based) uses factor(k). Warmup (s < warmup_steps): (s + 1) / (warmup_steps + 1), so the first update is not
    at lr 0 (HF's `get_*_schedule_with_warmup` start at s / warmup_steps = 0). Then, with
    p = (s - warmup_steps) / max(1, total_steps - warmup_steps) clipped to [0, 1]:
    "constant": 1; "linear": 1 - p (HF's linear, 0 at s = total_steps); "cosine": (1 + cos(pi p)) / 2 (HF's
    cosine with 0.5 cycles). The last update, s = total_steps - 1, still has a positive factor.

    >>> f = lr_multiplier("linear", warmup_steps=1, total_steps=5)
    >>> [round(f(s), 4) for s in range(6)]
    [0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; allowed: {', '.join(LR_SCHEDULES)}")
    if warmup_steps < 0 or total_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and total_steps >= 1, got {warmup_steps} and {total_steps}")
    decay_steps = max(1, total_steps - warmup_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def _check_mode(mode: str) -> None:
    if mode not in LOSS_MODES:
        raise ValueError(f"unknown loss normalization {mode!r}; allowed: {', '.join(LOSS_MODES)}")
