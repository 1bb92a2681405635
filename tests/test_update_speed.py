"""The cheaper GRPO update (issue 12) on a tiny real Qwen2 with LoRA adapters: completion-only log-probs equal the
full-logit ones, the update's gradients are the full-logit loss's, a shared prefix run once changes neither, a bf16
update trains, and the old log-probs are the rollout's recorded ones. benchmarks/update.py measures the speed;
nothing here is timed."""

from __future__ import annotations

import contextlib

import pytest
import torch

from centralrl.config import Config, GrpoConfig, LoraConfig
from centralrl.harness.engine import open_policy
from centralrl.config import role_adapters
from centralrl.models.adapters import attach_adapters, frozen_linears_in, set_activation_checkpointing
from centralrl.models.backbone import load_backbone
from centralrl.rl import trainer
from centralrl.rl.grpo import grpo_loss, token_logprobs
from centralrl.rl.trainer import Sample, _logprobs, _padded, loss_denominator, prefix_positions, update

ROLES = ["central", "retrieval"]
LORA = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj", "lm_head"])
TEMPERATURE = 0.7


@pytest.fixture
def peft(tiny_backbone):
    """The tiny Qwen2 with two adapters whose LoRA B is random, so the adapters (lm_head's too) change the output."""
    model, tokenizer = load_backbone(tiny_backbone)
    torch.manual_seed(0)
    model = attach_adapters(model, role_adapters(ROLES, "per_role"), LORA)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return model, tokenizer


def make_samples(
    model, tokenizer, shift: float = 0.0, advantages=(1.0, -0.5, 0.25, 2.0), plan=None, system: int = 0
) -> list[Sample]:
    """Sequences of different lengths over both adapters (four by default: `plan` holds (adapter, prompt length,
    completion length)), whose recorded log-probs are the float32 policy's own (as a float32 rollout records them)
    plus `shift`. Each adapter's prompts open with the same `system` tokens, as a role's system prompt."""
    g = torch.Generator().manual_seed(1)
    plan = plan or [("central", 13, 5), ("retrieval", 9, 3), ("central", 6, 4), ("retrieval", 17, 6)]
    openings = {a: torch.randint(3, len(tokenizer), (system,), generator=g).tolist() for a in ROLES}
    samples = []
    for (adapter, prompt, completion), advantage in zip(plan, advantages):
        own = torch.randint(3, len(tokenizer), (prompt + completion - system,), generator=g).tolist()
        ids = tuple(openings[adapter] + own)
        draft = Sample(adapter, ids, prompt, advantage, (0.0,) * completion)
        samples.append(Sample(adapter, ids, prompt, advantage, tuple(v + shift for v in full_recorded(model, draft))))
    return samples


@torch.no_grad()
def full_recorded(model, sample: Sample) -> list[float]:
    model.set_adapter(sample.adapter)
    ids = torch.tensor([sample.ids])
    logp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:], TEMPERATURE)[0]
    return logp[sample.completion_start - 1 :].tolist()


def full_logprobs(model, ids, attention):
    return token_logprobs(model(input_ids=ids, attention_mask=attention).logits[:, :-1], ids[:, 1:], TEMPERATURE)


def test_completion_only_logprobs_equal_the_full_logits(peft):
    model, tokenizer = peft
    samples = [s for s in make_samples(model, tokenizer) if s.adapter == "central"]
    ids, attention, mask, _ = _padded(samples, tokenizer.pad_token_id, "cpu")
    base = model.get_base_model()
    head, decoder = base.get_output_embeddings(), base.base_model
    model.set_adapter("central")
    with torch.no_grad():
        policy = full_logprobs(model, ids, attention), _logprobs(decoder, head, ids, attention, mask, TEMPERATURE)
        with model.disable_adapter():  # the reference
            reference = (
                full_logprobs(model, ids, attention),
                _logprobs(decoder, head, ids, attention, mask, TEMPERATURE),
            )
    for full, sliced in (policy, reference):
        torch.testing.assert_close(sliced[mask], full[mask], atol=1e-5, rtol=0)
        assert torch.all(sliced[~mask] == 0)
    assert not torch.allclose(policy[0][mask], reference[0][mask], atol=1e-3)  # the adapters change the output


def test_float32_update_has_the_gradients_of_the_full_logit_loss(peft):
    model, tokenizer = peft
    samples = make_samples(model, tokenizer, shift=0.1)  # ratios e^-0.1: the recorded log-probs enter the loss
    g = GrpoConfig(precision="float32", micro_batch_size=2, kl_coef=0.05)
    denominator = loss_denominator(samples, g.loss_normalization)
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad}
    for adapter in ROLES:  # by hand: one full-logit forward per adapter, rollout order, no micro-batches
        group = [s for s in samples if s.adapter == adapter]
        ids, attention, mask, recorded = _padded(group, tokenizer.pad_token_id, "cpu")
        model.set_adapter(adapter)
        with torch.no_grad(), model.disable_adapter():
            reference = full_logprobs(model, ids, attention)
        loss, _ = grpo_loss(
            full_logprobs(model, ids, attention),
            recorded,
            reference,
            torch.tensor([s.advantage for s in group]),
            mask,
            g.clip_eps,
            g.kl_coef,
            g.loss_normalization,
            denominator,
        )
        loss.backward()
    expected = {n: p.grad.clone() for n, p in lora.items()}
    model.zero_grad(set_to_none=True)
    update(model, samples, g, TEMPERATURE, tokenizer.pad_token_id, denominator)
    assert any(expected[n].abs().max() > 0 for n in lora)
    for name, p in lora.items():
        torch.testing.assert_close(p.grad, expected[name], atol=1e-6, rtol=1e-4, msg=name)


def test_activation_checkpointing_gives_the_same_update(peft):
    """Recomputing the activations in the backward changes memory, not the numbers: loss sums and gradients equal."""
    model, tokenizer = peft
    samples = make_samples(model, tokenizer, shift=0.1)
    g = GrpoConfig(precision="float32", micro_batch_size=2, kl_coef=0.05)
    denominator = loss_denominator(samples, g.loss_normalization)
    model.train()  # checkpointing acts in training mode only, as in the trainer's update
    runs = []
    for enabled in (False, True):
        set_activation_checkpointing(model, enabled)
        assert model.get_base_model().model.layers[0].gradient_checkpointing is enabled
        model.zero_grad(set_to_none=True)
        totals = update(model, samples, g, TEMPERATURE, tokenizer.pad_token_id, denominator)
        runs.append((totals, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (plain, plain_grads), (checkpointed, checkpointed_grads) = runs
    assert plain == pytest.approx(checkpointed, rel=1e-6, abs=1e-7)
    assert plain_grads.keys() == checkpointed_grads.keys() and any(v.abs().max() > 0 for v in plain_grads.values())
    for name, grad in plain_grads.items():
        torch.testing.assert_close(checkpointed_grads[name], grad, atol=1e-7, rtol=1e-5, msg=name)


def test_a_shared_prefix_run_once_gives_the_same_logprobs_and_update(peft):
    """`shared_prefix`: each micro-batch's common prefix runs once as one row, its KV expanded to every row. The
    log-probs equal the full-logit ones, and the loss and every gradient equal the plain update's (which the test
    above checks against the full-logit loss), with the KL reference forward sharing the prefix too."""
    model, tokenizer = peft
    plan = [("central", 14, 5), ("retrieval", 11, 3), ("central", 12, 4), ("retrieval", 17, 6), ("central", 9, 3)]
    samples = make_samples(model, tokenizer, 0.1, (1.0, -0.5, 0.25, 2.0, -1.0), plan, system=8)
    central = [s for s in samples if s.adapter == "central"]
    assert prefix_positions(central) == 8  # the opening, and no position that predicts a trained token
    ids, attention, mask, _ = _padded(central, tokenizer.pad_token_id, "cpu")
    base = model.get_base_model()
    model.set_adapter("central")
    with torch.no_grad():
        shared = _logprobs(base.base_model, base.get_output_embeddings(), ids, attention, mask, TEMPERATURE, 8)
        torch.testing.assert_close(shared[mask], full_logprobs(model, ids, attention)[mask], atol=1e-5, rtol=0)
    runs = []
    for on in (False, True):
        g = GrpoConfig(precision="float32", micro_batch_size=2, forward_tokens=40, kl_coef=0.05, shared_prefix=on)
        model.zero_grad(set_to_none=True)
        totals = update(model, samples, g, TEMPERATURE, tokenizer.pad_token_id, loss_denominator(samples, "token"))
        runs.append((totals, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (plain, plain_grads), (once, once_grads) = runs
    assert plain == pytest.approx(once, rel=1e-5, abs=1e-7) and plain["kl"] > 0
    assert plain_grads.keys() == once_grads.keys() and any(v.abs().max() > 0 for v in plain_grads.values())
    for name, grad in plain_grads.items():
        torch.testing.assert_close(once_grads[name], grad, atol=1e-7, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match="shared_prefix and activation_checkpointing"):
        GrpoConfig(shared_prefix=True, activation_checkpointing=True)
    with pytest.raises(ValueError, match="set train.grpo.shared_prefix: false too"):  # shared_prefix is the default
        GrpoConfig(activation_checkpointing=True)
    assert not GrpoConfig(activation_checkpointing=True, shared_prefix=False).shared_prefix


def test_old_logprobs_are_the_recorded_ones(peft):
    model, tokenizer = peft
    pad = tokenizer.pad_token_id
    g = GrpoConfig(precision="float32", kl_coef=0.0)
    honest = make_samples(model, tokenizer)
    totals = update(model, honest, g, TEMPERATURE, pad, loss_denominator(honest, "token"))
    assert totals["clipped"] == 0 and totals["drift"] / totals["tokens"] < 1e-5
    # recorded log-probs 0.5 below the policy's: every ratio is e^0.5 > 1.2, so with A > 0 every token is clipped
    # and no gradient flows; the update sees the gap (drift 0.5) instead of a ratio of 1
    model.zero_grad(set_to_none=True)
    shifted = make_samples(model, tokenizer, shift=-0.5, advantages=(1.0, 0.5, 2.0, 1.0))
    totals = update(model, shifted, g, TEMPERATURE, pad, loss_denominator(shifted, "token"))
    assert totals["clipped"] == totals["tokens"] > 0
    assert abs(totals["drift"] / totals["tokens"] - 0.5) < 1e-4
    assert all(p.grad is None or not p.grad.any() for p in model.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="3 completion tokens but 2 recorded"):
        Sample("central", (5, 6, 7, 8), 1, 1.0, (-1.0, -2.0))


def test_a_float32_rollouts_recorded_logprobs_match_the_update(peft, tiny_backbone):
    """The engine records one log-prob per completion token, under the sampling temperature: a float32 rollout's
    record and the float32 update agree, so the ratio is 1 where nothing changed."""
    model, tokenizer = peft
    harness = Config().harness.model_copy(update={"precision": "float32", "temperature": TEMPERATURE})
    policy = open_policy(harness, model, tokenizer, {role: role for role in ROLES}, tiny_backbone)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in (7, 12, 9)]
    samples = [
        Sample(role, gen.prompt_ids + gen.completion_ids, len(gen.prompt_ids), 1.0, gen.logprobs)
        for role in ROLES
        for gen in policy.generate(role, prompts, 6, greedy=False, temperature=TEMPERATURE, seed=3)
    ]
    grpo = GrpoConfig(precision="float32", kl_coef=0.0)
    totals = update(model, samples, grpo, TEMPERATURE, tokenizer.pad_token_id, loss_denominator(samples, "token"))
    assert totals["tokens"] == sum(s.trained_tokens for s in samples) > len(samples)
    assert totals["drift"] / totals["tokens"] < 1e-4 and totals["clipped"] == 0


def test_a_bf16_update_trains(peft):
    """A few bf16-autocast updates with optimizer steps: the weights move, and the surrogate loss falls as the
    positive-advantage tokens gain probability and the negative ones lose it."""
    model, tokenizer = peft
    samples = make_samples(model, tokenizer, advantages=(1.0, -1.0, 1.0, -1.0))
    g = GrpoConfig(precision="bfloat16", kl_coef=0.02, micro_batch_size=2)
    lora = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in lora]
    optimizer = torch.optim.AdamW(lora, lr=3e-3)
    model.train()
    losses = []
    for _ in range(4):
        optimizer.zero_grad(set_to_none=True)
        totals = update(model, samples, g, TEMPERATURE, tokenizer.pad_token_id, loss_denominator(samples, "token"))
        optimizer.step()
        losses.append(totals["loss"])
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.05, losses
    assert any(not torch.equal(b, p) for b, p in zip(before, lora))


def test_frozen_weights_cast_once_give_autocasts_gradients_bit_for_bit(peft, monkeypatch):
    """A bf16 update (and warm start) casts the frozen Linear weights once (`frozen_linears_in`) instead of letting
    autocast cast them at every forward: the same loss sums and gradients to the bit, and the float32 weights are
    back, unchanged, after it."""
    model, tokenizer = peft
    samples = make_samples(model, tokenizer, shift=0.1)
    g = GrpoConfig(precision="bfloat16", micro_batch_size=2, kl_coef=0.05)
    denominator = loss_denominator(samples, g.loss_normalization)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    runs = []
    for once in (True, False):
        if not once:  # what autocast did before: the float32 weights cast again by every forward
            monkeypatch.setattr(trainer, "frozen_linears_in", lambda *_: contextlib.nullcontext(0))
        model.zero_grad(set_to_none=True)
        totals = update(model, samples, g, TEMPERATURE, tokenizer.pad_token_id, denominator)
        runs.append((totals, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (cast_once, once_grads), (recast, recast_grads) = runs
    assert cast_once == recast and once_grads.keys() == recast_grads.keys()
    assert any(v.abs().max() > 0 for v in once_grads.values())
    assert all(torch.equal(once_grads[n], recast_grads[n]) for n in once_grads)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            assert p.dtype == torch.float32 and torch.equal(p, frozen[name]), name


@pytest.mark.parametrize("spill", [False, True])
def test_frozen_weights_come_back_the_same_bytes(peft, spill):
    """After the block the frozen weights are float32 again and equal to the originals bit for bit, whether they
    waited in memory or in a temporary file (`spill`, the warm start's); inside it they are bf16 and a LoRA
    forward and backward run."""
    model, tokenizer = peft
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    decoder = model.get_base_model().base_model
    with frozen_linears_in(decoder, torch.bfloat16, spill=spill) as cast:
        assert cast == 2 * 7 and decoder.layers[0].self_attn.k_proj.weight.dtype == torch.bfloat16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = decoder(input_ids=torch.tensor([[5, 6, 7]])).last_hidden_state
        hidden.float().square().mean().backward()
    assert any(p.grad is not None and p.grad.abs().max() > 0 for p in model.parameters() if p.requires_grad)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            assert p.dtype == torch.float32 and torch.equal(p, frozen[name]), name
