"""GRPO pieces and outcome rewards against hand-computed cases (the arithmetic is in the comments)."""

import math

import pytest
import torch

from centralrl.rl.grpo import (
    aggregate,
    batch_denominator,
    clipped_surrogate,
    grpo_loss,
    group_advantages,
    kl_k3,
    lr_multiplier,
    token_logprobs,
)
from centralrl.rl.rewards import outcome_reward

LN2 = math.log(2.0)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected), atol=atol, rtol=0)


# ---------------------------------------------------------------- advantages


def test_group_advantages_unbiased_std():
    # [1, 0, 0, 1]: mean 0.5, deviations +-0.5; unbiased var = 4 * 0.25 / (4 - 1) = 1/3, std = 0.5773503
    # A = +-0.5 / 0.5773503 = +-sqrt(3)/2 = +-0.8660254 (the biased std 0.5 would give +-1).
    # [2, 0, 1, 1]: mean 1, deviations 1, -1, 0, 0; unbiased var = 2 / 3, std = 0.8164966; A = +-1.2247449, 0.
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0]])
    adv = group_advantages(rewards, normalize_std=True, eps=1e-6)
    close(adv, [[0.8660254, -0.8660254, -0.8660254, 0.8660254], [1.2247449, -1.2247449, 0.0, 0.0]], atol=1e-5)
    assert adv.dtype == torch.float32


def test_group_advantages_without_std_only_centres():
    # row means 0.5 and 1.0
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0]]), normalize_std=False, eps=1e-6)
    close(adv, [[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]])


def test_group_advantages_eps_in_denominator():
    # [1, 0]: mean 0.5, unbiased std = sqrt(0.5) = 0.7071068; with eps = 0.2929 the denominator is 1.0 -> A = +-0.5
    adv = group_advantages(torch.tensor([[1.0, 0.0]]), normalize_std=True, eps=1.0 - math.sqrt(0.5))
    close(adv, [[0.5, -0.5]])


@pytest.mark.parametrize(
    ("rewards", "dtype"),
    [
        ([[1.0] * 4], torch.float32),
        ([[0.0] * 4], torch.float32),
        ([[0.11] * 3], torch.float32),
        ([[0.05] * 3], torch.float64),
        ([[0.11] * 5], torch.float64),
    ],
)
def test_group_with_identical_rewards_gives_exact_zeros(rewards, dtype):
    # a plain float32 mean of [0.11] * 3 is off by an ulp (~1e-8; / (0 + 1e-6) -> an advantage ~0.007), and a
    # float64 mean of [0.05] * 3 or [0.11] * 5 by ~1e-17 (-> ~1e-11). The result must be exactly 0.
    for normalize_std in (True, False):
        adv = group_advantages(torch.tensor(rewards, dtype=dtype), normalize_std=normalize_std, eps=1e-6)
        assert adv.dtype == dtype
        assert torch.equal(adv, torch.zeros_like(adv))


def test_group_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"\[Q, G\]"):
        group_advantages(torch.tensor([1.0, 0.0]), normalize_std=True, eps=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages(torch.tensor([[1.0]]), normalize_std=True, eps=1e-6)


# ---------------------------------------------------------------- token log-probs


def test_token_logprobs_hand_case_and_temperature():
    # position 0: logits [0, ln 3] -> softmax [1/4, 3/4]; target 1 -> ln(3/4) = -0.2876821
    # position 1: logits [ln 3, 0] -> softmax [3/4, 1/4]; target 1 -> ln(1/4) = -1.3862944
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(3.0), 0.0]]])
    targets = torch.tensor([[1, 1]])
    close(token_logprobs(logits, targets), [[-0.2876821, -1.3862944]])
    # temperature 2: logits [0, ln 3 / 2] -> p(target 0) = 1 / (1 + sqrt 3); ln = -ln(2.7320508) = -1.0050525
    # position 1: logits [ln 3 / 2, 0] -> p(target 1) = 1 / (sqrt 3 + 1), the same value
    close(token_logprobs(logits, torch.tensor([[0, 1]]), temperature=2.0), [[-1.0050525, -1.0050525]])


def test_token_logprobs_is_float32_from_bf16():
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.bfloat16)
    out = token_logprobs(logits, torch.tensor([[1]]))
    assert out.dtype == torch.float32
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, torch.tensor([[1]]), temperature=0.0)


# ---------------------------------------------------------------- clipped surrogate


def test_clipped_surrogate_hand_cases():
    # eps 0.2. Row 0 has A = +1, row 1 has A = -1; ratios 1.5 and 0.5 in both rows.
    # ratio 1.5, A=+1: min(1.5, 1.2) = 1.2 -> loss -1.2, clipped
    # ratio 0.5, A=+1: min(0.5, 0.8) = 0.5 -> loss -0.5, not clipped
    # ratio 1.5, A=-1: min(-1.5, -1.2) = -1.5 -> loss 1.5, not clipped (a bad token keeps its full gradient)
    # ratio 0.5, A=-1: min(-0.5, -0.8) = -0.8 -> loss 0.8, clipped
    logp = torch.log(torch.tensor([[1.5, 0.5], [1.5, 0.5]])).requires_grad_()
    old = torch.zeros(2, 2, requires_grad=True)  # a constant of the objective: gets no gradient
    loss, clipped = clipped_surrogate(logp, old, torch.tensor([1.0, -1.0]), clip_eps=0.2)
    close(loss, [[-1.2, -0.5], [1.5, 0.8]])
    assert clipped.tolist() == [[True, False], [False, True]]
    # d(-ratio * A)/dlogp = -ratio * A on unclipped tokens; clipped tokens get 0
    loss.sum().backward()
    close(logp.grad, [[0.0, -0.5], [1.5, 0.0]])
    assert old.grad is None


def test_clipped_surrogate_inside_the_range_and_zero_advantage():
    # ratio 1.1 inside [0.8, 1.2], A=2: loss -2.2, not clipped; A=0: loss 0, not clipped even at ratio 1.5
    logp = torch.log(torch.tensor([[1.1], [1.5]]))
    loss, clipped = clipped_surrogate(logp, torch.zeros(2, 1), torch.tensor([2.0, 0.0]), clip_eps=0.2)
    close(loss, [[-2.2], [0.0]])
    assert not clipped.any()


# ---------------------------------------------------------------- KL


def test_kl_k3_hand_cases():
    # ref - logp = ln 2: 2 - ln 2 - 1 = 0.3068528; ref - logp = -ln 2: 0.5 + ln 2 - 1 = 0.1931472; equal: 0
    logp = torch.tensor([[0.0, 0.0, -1.3]])
    ref = torch.tensor([[LN2, -LN2, -1.3]])
    close(kl_k3(logp, ref), [[0.3068528, 0.1931472, 0.0]])


def test_kl_k3_nonnegative_and_flat_at_equality():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 7, generator=gen)
    ref = torch.randn(4, 7, generator=gen)
    assert (kl_k3(logp, ref) >= 0).all()
    # gradient 1 - exp(ref - logp) is 0 where the policies agree
    same = logp.clone().requires_grad_()
    ref = logp.clone().requires_grad_()  # the reference is a constant: gets no gradient
    kl_k3(same, ref).sum().backward()
    assert torch.equal(same.grad, torch.zeros_like(same))
    assert ref.grad is None


# ---------------------------------------------------------------- aggregation

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_aggregate_token_vs_sequence_on_2x3():
    # token: (1 + 2 + 4) / 3 = 2.3333333; sequence: mean(mean(1, 2), mean(4)) = (1.5 + 4) / 2 = 2.75
    close(aggregate(PER_TOKEN, MASK, "token"), 7 / 3)
    close(aggregate(PER_TOKEN, MASK, "sequence"), 2.75)
    # a bool mask is the same mask
    close(aggregate(PER_TOKEN, MASK.bool(), "sequence"), 2.75)


def test_aggregate_skips_empty_sequences_and_masked_garbage():
    per_token = torch.cat([PER_TOKEN, torch.tensor([[7.0, 8.0, 9.0]])])
    per_token[0, 2] = float("nan")  # masked: must not reach the value
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    close(aggregate(per_token, mask, "token"), 7 / 3)
    close(aggregate(per_token, mask, "sequence"), 2.75)  # the empty row is not a 0 in the mean (that gives 1.8333)
    # nothing trained at all: 0, not NaN
    assert aggregate(PER_TOKEN, torch.zeros(2, 3), "token").item() == 0.0
    assert aggregate(PER_TOKEN, torch.zeros(2, 3), "sequence").item() == 0.0


def test_aggregate_with_a_denominator():
    # token: 7 / 10 = 0.7; sequence: (1.5 + 4) / 5 = 1.1
    close(aggregate(PER_TOKEN, MASK, "token", denominator=10.0), 0.7)
    close(aggregate(PER_TOKEN, MASK, "sequence", denominator=5.0), 1.1)


@pytest.mark.parametrize(
    ("mode", "full", "denominator"),
    [
        # trained tokens: row0 1, 2; row1 4; row2 none; row3 3, 6, 9 -> sum 25 over 6 tokens = 4.1666667
        ("token", 25 / 6, 6.0),
        # sequence means 1.5, 4, (skipped), 6 -> 11.5 / 3 = 3.8333333
        ("sequence", 11.5 / 3, 3.0),
    ],
)
def test_gradient_accumulation_matches_the_full_batch(mode, full, denominator):
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [3.0, 6.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]])
    assert batch_denominator(mask, mode) == denominator

    whole = per_token.clone().requires_grad_()
    full_loss = aggregate(whole, mask, mode)
    full_loss.backward()
    close(full_loss, full)

    split = per_token.clone().requires_grad_()
    # micro-batches rows 0-1 and rows 2-3; token: 7/6 + 18/6; sequence: (1.5 + 4)/3 + 6/3
    total = sum(aggregate(split[rows], mask[rows], mode, denominator) for rows in (slice(0, 2), slice(2, 4)))
    total.backward()
    close(total, full)
    torch.testing.assert_close(split.grad, whole.grad)
    # without the global denominator each micro-batch normalizes by itself and the sum is wrong
    local = sum(aggregate(per_token[rows], mask[rows], mode) for rows in (slice(0, 2), slice(2, 4)))
    assert abs(local.item() - full) > 0.5


def test_aggregate_rejects_bad_mode_and_denominator():
    with pytest.raises(ValueError, match="allowed: token, sequence"):
        aggregate(PER_TOKEN, MASK, "sample")
    with pytest.raises(ValueError, match="denominator"):
        aggregate(PER_TOKEN, MASK, "token", denominator=0.0)


# ---------------------------------------------------------------- the loss

# mask [[1, 1], [1, 0]], A = [+1, -1], old_logp = 0, eps 0.2, kl_coef 0.1
#   r0t0: ratio 1.5 -> surrogate -1.2 (clipped); ref - logp = ln 2   -> k3 = 1 - ln 2
#   r0t1: ratio 1.1 -> surrogate -1.1;           ref - logp = 0      -> k3 = 0
#   r1t0: ratio 0.5 -> surrogate  0.8 (clipped); ref - logp = -ln 2  -> k3 = ln 2 - 0.5
#   r1t1: masked garbage: logp -100, ref 100; exp(ref - logp) or exp(old - logp) would overflow float32
# k3 over trained tokens sums to 0.5; stats: clip 2/3, kl 0.5/3, ratio (1.5 + 1.1 + 0.5)/3 = 1.0333333
LOGP = [[math.log(1.5), math.log(1.1)], [math.log(0.5), -100.0]]
REF = [[math.log(3.0), math.log(1.1)], [math.log(0.25), 100.0]]
LOSS_MASK = torch.tensor([[1, 1], [1, 0]])
ADV = torch.tensor([1.0, -1.0])


def _loss(mode, denominator=None):
    logp = torch.tensor(LOGP, requires_grad=True)
    loss, stats = grpo_loss(
        logp,
        torch.zeros(2, 2),
        torch.tensor(REF),
        ADV,
        LOSS_MASK,
        clip_eps=0.2,
        kl_coef=0.1,
        mode=mode,
        denominator=denominator,
    )
    loss.backward()
    return loss, stats, logp.grad


def test_grpo_loss_token_mode_hand_value():
    # (-1.2 - 1.1 + 0.8 + 0.1 * 0.5) / 3 = -1.45 / 3 = -0.4833333
    loss, stats, grad = _loss("token")
    close(loss, -1.45 / 3)
    assert stats.keys() == {"clip_fraction", "kl", "ratio_mean"}
    assert stats["clip_fraction"] == pytest.approx(2 / 3)
    assert stats["kl"] == pytest.approx(0.5 / 3, abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx(3.1 / 3, abs=1e-6)
    # masked token: exactly zero gradient, no NaN from the garbage ref value
    assert grad[1, 1].item() == 0.0
    assert torch.isfinite(grad).all()
    # r0t1 (ratio 1.1, unclipped, k3' = 0): -ratio * A / 3 = -1.1/3; r0t0 clipped: only KL, 0.1 * (1 - 2) / 3
    close(grad[0, 1], -1.1 / 3)
    close(grad[0, 0], -0.1 / 3)


def test_grpo_loss_sequence_mode_hand_value():
    # row 0: (-1.2 + 0.1 * (1 - ln 2) - 1.1) / 2 = -1.1346574; row 1: 0.8 + 0.1 * (ln 2 - 0.5) = 0.8193147
    # mean: (-1.1346574 + 0.8193147) / 2 = -0.1576713
    loss, _, grad = _loss("sequence")
    close(loss, -0.1576713)
    # r0t1: -ratio * A / (2 tokens) / (2 sequences) = -1.1 / 4; masked r1t1: 0
    close(grad[0, 1], -1.1 / 4)
    assert grad[1, 1].item() == 0.0
    # with denominator 4 (sequences of a larger batch): (-1.1346574 + 0.8193147) / 4 = -0.0788357
    loss, _, _ = _loss("sequence", denominator=4.0)
    close(loss, -0.0788357)


def test_grpo_loss_without_reference_needs_zero_kl_coef():
    logp = torch.tensor(LOGP)
    # kl_coef 0: (-1.2 - 1.1 + 0.8) / 3 = -0.5
    loss, stats = grpo_loss(logp, torch.zeros(2, 2), None, ADV, LOSS_MASK, 0.2, 0.0, "token")
    close(loss, -0.5)
    assert stats["kl"] == 0.0
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, torch.zeros(2, 2), None, ADV, LOSS_MASK, 0.2, 0.1, "token")


def test_a_measured_kl_that_overflows_does_not_reach_a_loss_without_a_kl_term():
    # kl_coef 0 with the KL measured (the health guard's steps): a token 93 nats below the reference has k3 = inf
    # in float32, and 0 x inf made the loss and that token's gradient NaN before the guard could see it
    logp = torch.tensor([[-2.0, -95.0]], requires_grad=True)
    loss, stats = grpo_loss(
        logp, logp.detach(), torch.tensor([[-2.0, -1.0]]), torch.tensor([1.0]), torch.ones(1, 2), 0.2, 0.0
    )
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all() and stats["kl"] == math.inf
    close(loss, -1.0)  # the surrogate alone: -A at ratio 1


def test_token_mode_gradient_at_ratio_one_is_minus_advantage_over_n():
    # on-policy: old = ref = logp, so ratio 1 (no clipping) and k3' = 0; d loss / d logp = -A / N on trained tokens
    gen = torch.Generator().manual_seed(1)
    base = -torch.rand(2, 3, generator=gen) * 3
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # N = 3
    for denominator, n in ((None, 3.0), (6.0, 6.0)):
        logp = base.clone().requires_grad_()
        loss, stats = grpo_loss(
            logp, logp.detach(), logp.detach(), torch.tensor([2.0, -1.0]), mask, 0.2, 0.5, "token", denominator
        )
        loss.backward()
        close(logp.grad, [[-2 / n, -2 / n, 0.0], [1 / n, 0.0, 0.0]])
        assert stats == {"clip_fraction": 0.0, "kl": 0.0, "ratio_mean": 1.0}


# ---------------------------------------------------------------- rewards


def test_outcome_reward_metric_and_format_weight():
    assert outcome_reward("Obama", ["Obama"], metric="em", format_ok=True, format_weight=0.25) == 1.25
    assert outcome_reward("Obama", ["Obama"], metric="em", format_ok=False, format_weight=0.25) == 1.0
    # F1 of "Barack Obama" vs "Obama": precision 1/2, recall 1 -> 2/3; plus 0.5
    assert outcome_reward("Barack Obama", ["Obama"], format_weight=0.5) == pytest.approx(2 / 3 + 0.5)
    assert outcome_reward("Paris", ["Obama"], metric="acc") == 0.0
    with pytest.raises(ValueError, match="allowed: acc, em, f1"):
        outcome_reward("Obama", ["Obama"], metric="EM")


# ---------------------------------------------------------------- learning-rate schedule


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # warmup 2: (s + 1) / 3 -> 1/3, 2/3; then p = (s - 2) / 4
        ("constant", [1 / 3, 2 / 3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ("linear", [1 / 3, 2 / 3, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]),
        # (1 + cos(pi p)) / 2 at p = 0.25, 0.5, 0.75: 0.8535534, 0.5, 0.1464466
        ("cosine", [1 / 3, 2 / 3, 1.0, 0.8535534, 0.5, 0.1464466, 0.0, 0.0]),
    ],
)
def test_lr_multiplier_with_warmup(schedule, expected):
    factor = lr_multiplier(schedule, warmup_steps=2, total_steps=6)
    assert [factor(s) for s in range(8)] == pytest.approx(expected, abs=1e-6)


def test_lr_multiplier_without_warmup_drives_lambda_lr():
    # linear, total 4: 1, 0.75, 0.5, 0.25 times lr 0.1 for the four updates
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier("linear", 0, 4))
    seen = []
    for _ in range(4):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.1, 0.075, 0.05, 0.025])
    assert lr_multiplier("constant", 0, 4)(0) == 1.0


def test_lr_multiplier_rejects_unknown_schedule():
    with pytest.raises(ValueError, match="allowed: constant, linear, cosine"):
        lr_multiplier("step", 0, 4)
