"""The optional vLLM generation engine: config, the clear error without vLLM, the preflight line, the
conversion of a vLLM completion into the transformers engine's record, and the dtype vLLM serves in. The last two
tests need the gpu extra and a CUDA GPU (skipped elsewhere): one runs the same prompts through both engines on a tiny
bf16 Qwen2 with adapters, the other serves a float32 one with adapters (in bfloat16)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from centralrl import plan
from centralrl.config import HarnessConfig, LoraConfig, load_config
from centralrl.errors import BackboneError, ConfigError
from centralrl.harness.engine import RolePolicy, end_of_sequence_ids, open_policy, trim_generation
from centralrl.harness.vllm_engine import MISSING, completion_to_generation, serving_dtype
from centralrl.models.backbone import load_backbone

from conftest import write_params

HAS_VLLM = importlib.util.find_spec("vllm") is not None
FROZEN = {"central": None, "retrieval": None, "conclusion": None, "agent": None}
ON_GPU = pytest.mark.skipif(not (HAS_VLLM and torch.cuda.is_available()), reason="needs the gpu extra and a CUDA GPU")


@pytest.fixture(scope="module")
def backbone(tiny_backbone):
    return load_backbone(tiny_backbone)


def logprob_dicts(ids: list[int], values: list[float]) -> list[dict]:
    """vLLM's per-token logprobs: a dict token id -> Logprob per step. types.SimpleNamespace(logprob=...) stands
    in for vllm.logprobs.Logprob (vLLM is not installed here); each step also holds a runner-up token, as with
    logprobs >= 1, so the conversion must pick the chosen token's entry."""
    return [
        {token: SimpleNamespace(logprob=value), token + 1: SimpleNamespace(logprob=value - 5.0)}
        for token, value in zip(ids, values)
    ]


def test_config_takes_the_engine_and_names_a_bad_one(tmp_path):
    cfg = load_config(write_params(tmp_path / "ok", {"harness": {"engine": "vllm", "vllm": {"max_model_len": 2048}}}))
    assert cfg.harness.engine == "vllm" and cfg.harness.vllm.max_model_len == 2048
    assert cfg.harness.vllm.gpu_memory_utilization == 0.4
    with pytest.raises(ConfigError, match=r"harness\.engine: .*'transformers' or 'vllm'"):
        load_config(write_params(tmp_path / "bad", {"harness": {"engine": "tensorrt"}}))
    with pytest.raises(ConfigError, match=r"harness\.vllm\.gpu_memory_utilization: "):
        load_config(write_params(tmp_path / "worse", {"harness": {"vllm": {"gpu_memory_utilization": 1.5}}}))


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here, so there is no missing-extra error to see")
def test_open_policy_without_vllm_says_how_to_get_it(backbone, tiny_backbone):
    model, tokenizer = backbone
    assert type(open_policy(HarnessConfig(), model, tokenizer, FROZEN, tiny_backbone)) is RolePolicy
    with pytest.raises(BackboneError) as error:
        open_policy(HarnessConfig(engine="vllm"), model, tokenizer, FROZEN, tiny_backbone)
    assert MISSING in str(error.value) and "pip install -e '.[gpu]'" in str(error.value)
    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in str(error.value)


def test_preflight_and_plan_name_the_engine(tmp_path):
    cfg = load_config(write_params(tmp_path, {"harness": {"engine": "vllm"}}))
    checks = {check.name: check for check in plan.preflight(cfg, tmp_path)}
    assert "generation engine: vllm (gpu_memory_utilization 0.4, max_model_len 4096" in "\n".join(
        plan.plan_lines(cfg, tmp_path)
    )
    if HAS_VLLM and torch.cuda.is_available():
        assert checks["vllm"].ok
    else:
        assert not checks["vllm"].ok
        assert ("gpu extra" in checks["vllm"].reason) == (not HAS_VLLM)
        assert ("needs a CUDA GPU" in checks["vllm"].reason) == (not torch.cuda.is_available())
    default = load_config(write_params(tmp_path / "default"))
    assert "vllm" not in {check.name for check in plan.preflight(default, tmp_path)}
    assert "generation engine: transformers" in "\n".join(plan.plan_lines(default, tmp_path))


def test_a_vllm_completion_cut_at_a_stop_string_is_the_transformers_record(backbone):
    tokenizer = backbone[1]
    end_ids = end_of_sequence_ids(*backbone)
    prompt = tokenizer.encode(
        "<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n<note>", add_special_tokens=False
    )
    ids = tokenizer.encode("the director</note> and more text after", add_special_tokens=False)
    values = [-0.25 * (i + 1) for i in range(len(ids))]
    expected = trim_generation(tokenizer, end_ids, prompt, ids, values, "retrieval")
    assert expected.text.endswith("</note>") and len(expected.completion_ids) < len(ids)
    assert (
        completion_to_generation(tokenizer, end_ids, prompt, ids, logprob_dicts(ids, values), "retrieval") == expected
    )


@pytest.mark.parametrize("end", ["<|im_end|>", "<|endoftext|>"])  # the tokenizer's eos; another the model declares
def test_a_vllm_completion_ending_in_eos_is_the_transformers_record(backbone, end):
    tokenizer = backbone[1]
    end_ids = end_of_sequence_ids(*backbone) | {tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    prompt = tokenizer.encode("<answer>", add_special_tokens=False)
    ids = tokenizer.encode(f"Telmarra{end} more", add_special_tokens=False)
    values = [-0.5] * len(ids)
    generation = completion_to_generation(tokenizer, end_ids, prompt, ids, logprob_dicts(ids, values), "conclusion")
    assert generation == trim_generation(tokenizer, end_ids, prompt, ids, values, "conclusion")
    assert generation.completion_ids[-1] == tokenizer.convert_tokens_to_ids(end) and generation.text == "Telmarra"
    with pytest.raises(BackboneError, match="logprobs=0"):
        completion_to_generation(tokenizer, end_ids, prompt, ids, logprob_dicts(ids, values)[:-1], "conclusion")


def test_a_float32_backbone_with_adapters_is_served_in_bfloat16(tmp_path):
    """vLLM's LoRA kernels assert float16/bfloat16 inputs and weights (its lora_dtype "auto" is the model's), so a
    float32 backbone with adapters would crash at the first LoRA request; without adapters it keeps float32."""
    assert serving_dtype("float32", lora=False) == "float32"
    assert serving_dtype("float32", lora=True) == "bfloat16"
    assert serving_dtype("bfloat16", lora=True) == serving_dtype("bfloat16", lora=False) == "bfloat16"
    cfg = load_config(write_params(tmp_path, {"harness": {"engine": "vllm"}}))
    assert "with adapters it serves main float32 in bfloat16" in "\n".join(plan.plan_lines(cfg, tmp_path))
    bf16 = load_config(
        write_params(tmp_path / "bf16", {"harness": {"engine": "vllm"}, "models": {"main": {"dtype": "bfloat16"}}})
    )
    assert "with adapters it serves" not in "\n".join(plan.plan_lines(bf16, tmp_path))


def tiny_qwen2_with_adapters(folder: Path, dtype: str) -> tuple:
    """A tiny Qwen2 in `dtype` saved to `folder` (head size 64: one vLLM's attention backends all take), loaded on
    the GPU with an adapter on central: (model, tokenizer, role adapters)."""
    from centralrl.config import ModelConfig, TinyQwen2Config, role_adapters
    from centralrl.models.adapters import attach_adapters
    from centralrl.models.backbone import prepare_backbone

    tiny = TinyQwen2Config(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256)
    prepare_backbone(ModelConfig(source="tiny_qwen2", dtype=dtype, tiny=tiny), folder)
    model, tokenizer = load_backbone(folder, dtype)
    adapters = role_adapters(["central"], "per_role")
    return attach_adapters(model, adapters, LoraConfig(r=8, alpha=16)).to("cuda").eval(), tokenizer, adapters


def vllm_policy(model, tokenizer, adapters: dict, folder: Path, memory: float):
    """The vLLM engine over `model` (saved in `folder`), taking `memory` of the GPU."""
    from centralrl.config import VllmConfig

    settings = VllmConfig(gpu_memory_utilization=memory, max_model_len=1024, enforce_eager=True)
    return open_policy(HarnessConfig(engine="vllm", vllm=settings), model, tokenizer, adapters, folder)


@ON_GPU
def test_a_float32_backbone_with_adapters_generates_on_vllm_in_bfloat16(tmp_path):
    """The float32 backbone with adapters that vLLM's LoRA kernels refuse: the engine serves it in bfloat16, and
    each role generates, the adapter's and the frozen one (the other GPU test's backbone is bf16 already)."""
    from centralrl.harness.protocol import PREFILL

    model, tokenizer, adapters = tiny_qwen2_with_adapters(tmp_path / "tiny", "float32")
    vl = vllm_policy(model, tokenizer, adapters, tmp_path / "tiny", memory=0.2)
    assert next(model.parameters()).dtype == torch.float32
    assert vl.llm.llm_engine.model_config.dtype == torch.bfloat16
    prompt = vl.encode_chat([{"role": "user", "content": "Who directed the film?"}], PREFILL["central"])
    for role in ("central", "retrieval"):
        [generation] = vl.generate(role, [prompt], 8, greedy=True)
        assert generation.completion_ids and len(generation.logprobs) == len(generation.completion_ids)


@ON_GPU
def test_vllm_and_transformers_agree_on_greedy_episodes_with_adapters(tmp_path):
    """Same prompts, greedy, a trained-looking adapter on central and a frozen retrieval role, through both engines,
    on a bfloat16 backbone (vLLM's LoRA kernels take 16-bit weights only), the transformers engine in bfloat16 too.

    Exact equality is not expected: vLLM's attention and LoRA kernels (its LoRA weights cast to bf16, peft's kept in
    float32) are not transformers'/peft's, and a random tiny model's bf16 logits (about 1 in size, 2**-8 apart)
    have near-ties and exact ties such a difference can flip (measured on CPU: top-two gaps of 0.01-0.08 at the first
    token of central, 0 further on). So: prompt ids equal exactly; first tokens equal for all prompts but one;
    and every token vLLM records, greedy or sampled, scored by the HF model on the same ids as that role: its
    log-prob within TOL of vLLM's (log_softmax(logits / temperature), the processed_logprobs semantics the
    trainer relies on) and, greedy, within TOL of the HF argmax's logit (the greedy choice up to a near-tie)."""
    from centralrl.harness.protocol import PREFILL
    from centralrl.models.adapters import acting_as

    tol = 0.05  # about 12 bf16 steps at these logits; an adapter not applied moves log-probs by about 0.5
    model, tokenizer, adapters = tiny_qwen2_with_adapters(tmp_path / "tiny", "bfloat16")

    def perturb(seed: int) -> None:  # peft starts lora_B at zero (a no-op adapter); make it matter
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.5)

    def scored(role: str, generation, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """The HF model's log-probs of the generation's tokens as `role`, and its argmax logit's lead over each."""
        ids = torch.tensor([list(generation.prompt_ids) + list(generation.completion_ids)], device="cuda")
        with torch.no_grad(), acting_as(model, adapters[role]):
            logits = model(input_ids=ids).logits[0, len(generation.prompt_ids) - 1 : -1].float() / temperature
        chosen = ids[0, len(generation.prompt_ids) :, None]
        lead = logits.max(-1).values - logits.gather(-1, chosen).squeeze(-1)
        return logits.log_softmax(-1).gather(-1, chosen).squeeze(-1).cpu(), lead.cpu()

    perturb(0)
    hf = RolePolicy(model, tokenizer, adapters, precision="bfloat16", eval_precision="bfloat16")
    vl = vllm_policy(model, tokenizer, adapters, tmp_path / "tiny", memory=0.3)
    questions = ["Who directed the film?", "Where was the founder born?", "Which city is older?", "Who married whom?"]
    prompts = [hf.encode_chat([{"role": "user", "content": q}], PREFILL["central"]) for q in questions]

    def compare() -> None:
        firsts = {}
        for role in ("central", "retrieval"):
            ours, theirs = hf.generate(role, prompts, 16, greedy=True), vl.generate(role, prompts, 16, greedy=True)
            assert [g.prompt_ids for g in ours] == [g.prompt_ids for g in theirs] == [tuple(p) for p in prompts]
            assert sum(a.completion_ids[0] == b.completion_ids[0] for a, b in zip(ours, theirs)) >= len(prompts) - 1
            for g in theirs:
                logprobs, lead = scored(role, g)
                assert torch.allclose(logprobs, torch.tensor(g.logprobs), atol=tol) and lead.max() <= tol
            firsts[role] = [g.completion_ids[:4] for g in theirs]
        assert firsts["central"] != firsts["retrieval"]  # the adapter is applied (and the frozen role has none)

    compare()
    perturb(1)  # an optimizer step, as far as the engines can tell
    vl.weights_changed()
    compare()

    sampled = vl.generate("central", prompts, 12, greedy=False, temperature=0.7, seed=3)
    assert sampled == vl.generate("central", prompts, 12, greedy=False, temperature=0.7, seed=3)  # seeded per prompt
    for g in sampled:
        assert torch.allclose(scored("central", g, 0.7)[0], torch.tensor(g.logprobs), atol=tol)
