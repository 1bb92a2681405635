"""The transformers engine's decode loop on tiny real runs: greedy tokens as plain `model.generate` gives them
(shared prefixes, duplicate prompts, rows that finish early, buckets), seeded sampling, the bf16 merged copies
and their refresh after `weights_changed()`."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, GenerationConfig

from centralrl.config import LoraConfig
from centralrl.harness.engine import (
    RolePolicy,
    _sample,
    causal_lm,
    end_of_sequence_ids,
    roomy_cache,
    shared_prefix,
    trim_generation,
)
from centralrl.harness.episodes import _without_eos
from centralrl.models.adapters import acting_as, attach_adapters
from centralrl.models.backbone import load_backbone

ADAPTERS = {"central": "central", "retrieval": None, "conclusion": None, "agent": None}
SYSTEM = "You coordinate a team that answers multi-hop questions. Think briefly, then act.\n"
QUESTIONS = (
    "Where was Okosi born?",
    "Who?",
    "Which film came first, the one by Ardo or the one by Belun?",
    "Where was Okosi born?",  # a duplicate, prefilled once
    "Name the river that runs through the capital.",
)
MAX_NEW = 12


def _redraw(model, scale: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)


@pytest.fixture(scope="module")
def lively(tiny_backbone):
    """The tiny Qwen2 with its matrices redrawn larger (seeded), so that greedy output follows the context
    instead of repeating one token, with a random LoRA adapter on the central role; and its tokenizer."""
    model, tokenizer = load_backbone(tiny_backbone)
    _redraw(model, 0.3, seed=0)
    torch.manual_seed(0)  # LoRA's A matrices draw from the global generator
    model = attach_adapters(model, ADAPTERS, LoraConfig(r=4, alpha=8))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model.eval(), tokenizer


def ending_early(model, tokenizer, role):
    """A copy of `tokenizer` whose end-of-sequence is the fifth greedy token of the first prompt as `role`, so
    that some completions end early."""
    first = plain_greedy(model, tokenizer, _prompts(tokenizer)[0], role)
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(first.completion_ids[4])
    return tokenizer


def _prompts(tokenizer) -> list[list[int]]:
    system = tokenizer.encode(SYSTEM)
    return [system + tokenizer.encode(q) for q in QUESTIONS]


def plain_greedy(model, tokenizer, prompt, role):
    """One prompt alone (no padding) through `model.generate`, greedy, as the engine before ours ran it."""
    end_ids = end_of_sequence_ids(model, tokenizer)
    config = GenerationConfig(
        max_new_tokens=MAX_NEW,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=sorted(end_ids),
        output_scores=True,
        return_dict_in_generate=True,
    )
    with acting_as(model, ADAPTERS[role]), torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)), generation_config=config
        )
    ids = out.sequences[0, len(prompt) :].tolist()
    logprobs = torch.stack(out.scores, dim=1)[0].float().log_softmax(-1)
    return trim_generation(
        tokenizer, end_ids, prompt, ids, logprobs.gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist(), role
    )


@pytest.mark.parametrize("role", ["central", "retrieval"])  # the adapter active; every adapter disabled
@pytest.mark.parametrize("batch_size", [16, 2])  # one batch with a shared prefix; buckets of two
def test_greedy_tokens_equal_plain_generate(lively, role, batch_size):
    model, tokenizer = lively
    tokenizer = ending_early(model, tokenizer, role)
    prompts = _prompts(tokenizer) + [tokenizer.encode("Another opening, no system prompt.")]
    reference = [plain_greedy(model, tokenizer, p, role) for p in prompts]
    lengths = [len(g.completion_ids) for g in reference]
    assert min(lengths) < MAX_NEW == max(lengths)  # some rows finish early, some run to the budget
    assert shared_prefix(prompts[:-1]) > 0 and shared_prefix(prompts) == 0
    policy = RolePolicy(model, tokenizer, ADAPTERS, batch_size=batch_size)
    for batch in (prompts[:-1], prompts):  # with a shared prefix and duplicates; without
        got = policy.generate(role, batch, MAX_NEW, greedy=True)
        want = reference[: len(batch)]
        assert [g.completion_ids for g in got] == [g.completion_ids for g in want]
        for a, b in zip(got, want):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_generation_ends_at_every_end_of_sequence_id_the_model_declares(lively, monkeypatch):
    """Qwen2.5-Instruct's generation config ends at <|im_end|> and <|endoftext|>, its tokenizer names only the
    first; HF `generate` and vLLM stop at either. Here the second id is a token the model emits greedily early."""
    model, tokenizer = lively
    prompts = _prompts(tokenizer)[:2]
    unended = RolePolicy(model, tokenizer, ADAPTERS).generate("retrieval", prompts, MAX_NEW, greedy=True)
    assert [len(g.completion_ids) for g in unended] == [MAX_NEW] * 2
    second = unended[0].completion_ids[3]
    ends_at = unended[0].completion_ids.index(second) + 1
    config = causal_lm(model).generation_config
    monkeypatch.setattr(config, "eos_token_id", [tokenizer.eos_token_id, second])
    policy = RolePolicy(model, tokenizer, ADAPTERS)
    assert policy.end_ids == {tokenizer.eos_token_id, second} and second != tokenizer.eos_token_id
    got = policy.generate("retrieval", prompts, MAX_NEW, greedy=True)
    assert got[0].completion_ids == unended[0].completion_ids[:ends_at] and ends_at < MAX_NEW
    assert got[0].logprobs == unended[0].logprobs[:ends_at]
    assert got[0].completion_ids == plain_greedy(model, tokenizer, prompts[0], "retrieval").completion_ids  # as HF
    assert _without_eos(policy, got[0].completion_ids) == list(got[0].completion_ids[:-1])
    for sole in (None, []):  # a generation config without eos ids: the tokenizer's alone
        monkeypatch.setattr(config, "eos_token_id", sole)
        assert end_of_sequence_ids(model, tokenizer) == {tokenizer.eos_token_id}


def test_the_rollout_benchmarks_engine_before_issue_12_ends_where_todays_does(lively, monkeypatch):
    """benchmarks/rollout.py --old-vs-new's `OldRolePolicy` (`model.generate` through the PEFT wrapper): its greedy
    completions are today's engine's, ended at every end-of-sequence id the model declares, and its `generate`
    stops there too. It called `trim_generation` without the end ids (a TypeError) and stopped only at the
    tokenizer's eos, running every row to the budget."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import rollout

    model, tokenizer = lively
    prompts = _prompts(tokenizer)[:2]
    unended = RolePolicy(model, tokenizer, ADAPTERS).generate("retrieval", prompts, MAX_NEW, greedy=True)
    second = unended[0].completion_ids[3]
    ends_at = unended[0].completion_ids.index(second) + 1
    monkeypatch.setattr(causal_lm(model).generation_config, "eos_token_id", [tokenizer.eos_token_id, second])
    old = rollout.OldRolePolicy(model, tokenizer, ADAPTERS)
    got = old.generate("retrieval", prompts, MAX_NEW, greedy=True)
    want = RolePolicy(model, tokenizer, ADAPTERS).generate("retrieval", prompts, MAX_NEW, greedy=True)
    assert [g.completion_ids for g in got] == [g.completion_ids for g in want]
    assert len(got[0].completion_ids) == ends_at < MAX_NEW
    for a, b in zip(got, want):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    forwards = []
    hook = causal_lm(model).register_forward_hook(lambda module, args, out: forwards.append(1))
    try:
        old.generate("retrieval", prompts[:1], MAX_NEW, greedy=True)
    finally:
        hook.remove()
    assert len(forwards) == ends_at  # the prefill gives the first token, each decode step one more: none after it


def test_sampling_follows_the_seed_not_the_batch(lively):
    model, tokenizer = lively
    prompts = _prompts(tokenizer)

    def sample(seed, batch_size=16):
        policy = RolePolicy(model, tokenizer, ADAPTERS, batch_size=batch_size)
        return [g.completion_ids for g in policy.generate("central", prompts, MAX_NEW, greedy=False, seed=seed)]

    assert sample(1) == sample(1) == sample(1, batch_size=2)
    assert sample(1) != sample(2)
    assert sample(1)[0] != sample(1)[3]  # the same prompt twice in a call: two draws


def test_bf16_copy_records_float32_logprobs_aligned_with_its_tokens(lively):
    model, tokenizer = lively
    prompts = _prompts(tokenizer)
    policy = RolePolicy(model, tokenizer, ADAPTERS, precision="bfloat16")
    generations = policy.generate("central", prompts, MAX_NEW, greedy=False, seed=3)
    copy = policy.copies.get("central", torch.bfloat16)
    assert next(copy.parameters()).dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    for g in generations:
        assert len(g.logprobs) == len(g.completion_ids) > 0
        assert all(math.isfinite(lp) and lp <= 0 for lp in g.logprobs)
        with torch.no_grad():  # the copy's own scores of the whole sequence, at the completion's positions
            logits = copy(input_ids=torch.tensor([g.prompt_ids + g.completion_ids])).logits[0].float()
        scored = logits[len(g.prompt_ids) - 1 : -1].log_softmax(-1)
        rescored = scored.gather(-1, torch.tensor(g.completion_ids)[:, None])[:, 0]
        error = (torch.tensor(g.logprobs) - rescored).abs()  # bf16 rounding only; one position off errs by nats
        assert error.mean() < 0.03 and error.max() < 0.15
    recorded = torch.tensor([lp for g in generations for lp in g.logprobs])
    assert (recorded.to(torch.bfloat16).float() != recorded).any()  # computed in float32, not bf16


def _adapted(tiny_backbone):
    """The redrawn tiny backbone with the role adapters attached, in eval mode."""
    model, _ = load_backbone(tiny_backbone)
    _redraw(model, 0.3, seed=0)
    torch.manual_seed(0)
    return attach_adapters(model, ADAPTERS, LoraConfig(r=4, alpha=8)).eval()


def test_weights_changed_makes_the_merged_copy_follow_the_adapter(tiny_backbone, lively):
    _, tokenizer = lively
    model = _adapted(tiny_backbone)
    prompts = _prompts(tokenizer)
    policy = RolePolicy(model, tokenizer, ADAPTERS, eval_precision="bfloat16")
    before = policy.generate("central", prompts, MAX_NEW, greedy=True)
    with torch.no_grad():  # an optimizer step's worth of change to the adapter
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(2)) * 0.3)
    policy.weights_changed()
    after = policy.generate("central", prompts, MAX_NEW, greedy=True)
    fresh = RolePolicy(model, tokenizer, ADAPTERS, eval_precision="bfloat16").generate(
        "central", prompts, MAX_NEW, greedy=True
    )
    assert after == fresh
    assert [g.logprobs for g in after] != [g.logprobs for g in before]
    backbone, _ = load_backbone(tiny_backbone)  # a frozen role runs the backbone's copy, no adapter in it
    _redraw(backbone, 0.3, seed=0)
    plain = RolePolicy(backbone, tokenizer, ADAPTERS, eval_precision="bfloat16")
    retrieval = policy.generate("retrieval", prompts, MAX_NEW, greedy=True)
    assert retrieval == plain.generate("retrieval", prompts, MAX_NEW, greedy=True)


def test_released_copies_are_rebuilt_to_generate_the_same(tiny_backbone, lively):
    """The trainer frees the bf16 copies before each update; the next generation rebuilds them unchanged."""
    _, tokenizer = lively
    model = _adapted(tiny_backbone)
    policy = RolePolicy(model, tokenizer, ADAPTERS, eval_precision="bfloat16")
    before = policy.generate("central", _prompts(tokenizer), MAX_NEW, greedy=True)
    assert policy.copies.plain and policy.copies.merged
    policy.release_copies()
    assert not policy.copies.plain and not policy.copies.merged
    assert policy.generate("central", _prompts(tokenizer), MAX_NEW, greedy=True) == before


def test_inverse_cdf_sampling_draws_from_the_distribution():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    logprobs = probs.log().expand(4000, 4)
    generators = [torch.Generator().manual_seed(i) for i in range(4000)]
    counts = torch.bincount(_sample(logprobs, generators), minlength=4) / 4000
    assert counts[1] == 0
    assert counts.tolist() == pytest.approx(probs.tolist(), abs=0.03)


def test_the_roomy_cache_holds_what_transformers_cache_holds(lively):
    model, tokenizer = lively
    lm = model.get_base_model()
    ids = torch.tensor([p[:9] for p in _prompts(tokenizer)[:2]])  # two rows, same length
    caches = [roomy_cache(lm.config, capacity=4), DynamicCache(config=lm.config)]  # 4: the room runs out
    with torch.no_grad(), acting_as(model, None):
        for cache in caches:
            lm(input_ids=ids, cache=cache, use_cache=True)
            lm(input_ids=ids[:, :1], cache=cache, use_cache=True)
            cache.reorder_cache(torch.tensor([1]))
        logits = [lm(input_ids=ids[1:, 3:5], cache=cache, use_cache=True).logits for cache in caches]
    assert torch.equal(logits[0], logits[1])
    for roomy, dynamic in zip(caches[0].layers, caches[1].layers):
        assert torch.equal(roomy.keys, dynamic.keys) and torch.equal(roomy.values, dynamic.values)


def test_a_lora_target_that_names_no_module_of_the_backbone_is_refused(tiny_backbone):
    from centralrl.errors import ConfigError

    model, _ = load_backbone(tiny_backbone)  # peft: a traceback when no target matches, silence when one does
    with pytest.raises(ConfigError, match=r"lora\.target_modules: \['qproj'\] name no module of the backbone \(Qwen2"):
        attach_adapters(model, ADAPTERS, LoraConfig(target_modules=["q_proj", "qproj"]))
