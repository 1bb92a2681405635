from __future__ import annotations

import time

import pytest
import torch

from centralrl.compute import (
    ModelShape,
    PhaseClock,
    accelerator_hours,
    forward_flops,
    generation_flops,
    peak_memory,
    update_flops,
)

SHAPE = ModelShape(matmul_params=1000, head_params=200, layers=2, attention_width=8)


def test_forward_flops_by_hand():
    # body 2*800*5 = 8000, lm_head 2*200*5 = 2000; attention 4*2*8*(1+2+3+4+5) = 64*15 = 960
    assert forward_flops(SHAPE, 5) == 10960
    assert forward_flops(SHAPE, 5, logits=2) == 10960 - 2 * 200 * 3  # the head at 2 positions of 5
    assert forward_flops(SHAPE, 0) == 0


def test_generation_and_update_flops():
    # a 3-token prompt, 2 generated tokens: 4 positions fed (the last token never is), the head at 2
    assert generation_flops(SHAPE, 3, 2) == forward_flops(SHAPE, 4, logits=2)
    # the update: forward with the head at the 2 trained tokens, backward one more pass and the attention again
    forward = forward_flops(SHAPE, 5, logits=2)
    assert update_flops(SHAPE, 3, 2, reference_forward=False) == 2 * forward + 960
    assert update_flops(SHAPE, 3, 2, reference_forward=True) == 3 * forward + 960


def test_the_formulas_matmuls_are_what_torch_counts_in_a_lora_update():
    """torch's FLOP counter (attention is not counted on CPU) over the trainer's own forward and backward of a
    LoRA-wrapped Qwen2: the forward is the formula's matmuls, lm_head at the trained tokens only, plus the
    adapters' own; the backward through frozen weights is one more pass (input gradients only), not two."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from torch.utils.flop_counter import FlopCounterMode

    from centralrl.compute import attention_flops
    from centralrl.rl.trainer import Sample, _logprobs, _padded

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = peft.get_peft_model(transformers.Qwen2ForCausalLM(config), peft.LoraConfig(r=2, target_modules=targets))
    prompt, trained = 9, 5
    ids, attention, mask, _ = _padded([Sample("default", list(range(1, 15)), prompt, 1.0, [0.0] * trained)], 0, "cpu")
    base = model.get_base_model()
    with FlopCounterMode(display=False) as forward:
        logprobs = _logprobs(base.model, base.lm_head, ids, attention, mask, 1.0)
    with FlopCounterMode(display=False) as backward:
        logprobs.sum().backward()

    shape, tokens = ModelShape.of(model), prompt + trained
    matmuls = forward_flops(shape, tokens, logits=trained) - attention_flops(shape, tokens)
    adapters = 2 * tokens * sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)
    assert forward.get_total_flops() == matmuls + adapters
    # the backward: the matmuls' input gradients (all but those below the lowest adapter, which none needs) and
    # the adapters' input and weight gradients; the design's "2 x forward" would be twice the matmuls
    assert matmuls < backward.get_total_flops() <= matmuls + 2 * adapters < 2 * matmuls


def test_model_shape_of_qwen2_and_its_lora_wrapper():
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=100,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = transformers.Qwen2ForCausalLM(config)
    # per layer: q 16*16=256, k 16*8=128, v 128, o 256, gate 512, up 512, down 512 = 2304
    # 2 layers = 4608, + lm_head 100*16 = 1600 -> 6208 (biases and embeddings not counted)
    expected = ModelShape(matmul_params=6208, head_params=1600, layers=2, attention_width=16)
    assert ModelShape.of(model) == expected
    assert ModelShape.of(model).as_dict() == {
        "matmul_params": 6208,
        "head_params": 1600,
        "layers": 2,
        "attention_width": 16,
    }
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert ModelShape.of(wrapped) == expected


def test_phase_clock():
    clock = PhaseClock()
    with clock.phase("retrieval"):
        time.sleep(0.02)
    with clock.phase("generation"):
        time.sleep(0.01)
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass
    totals = clock.totals()
    assert list(totals) == [
        "generation_seconds",
        "generation_cpu_seconds",
        "retrieval_seconds",
        "retrieval_cpu_seconds",
    ]
    assert totals["retrieval_seconds"] >= 0.02
    assert totals["generation_seconds"] >= 0.01
    assert totals["generation_cpu_seconds"] > 0
    clock.reset()
    assert clock.totals() == {}


def test_peak_memory_and_accelerator_hours():
    assert peak_memory()["peak_rss_mb"] > 0
    assert accelerator_hours(3600, torch.device("cpu"), processes=2) == 0.0
    assert accelerator_hours(900, torch.device("cuda", 1), processes=8) == 2.0  # counted, not measured: no GPU needed
