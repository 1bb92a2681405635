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

SHAPE = ModelShape(matmul_params=1000, layers=2, attention_width=8)


def test_forward_flops_by_hand():
    # matmuls 2*1000*5 = 10000; attention 4*2*8*(1+2+3+4+5) = 64*15 = 960
    assert forward_flops(SHAPE, 5) == 10960
    assert forward_flops(SHAPE, 0) == 0


def test_generation_and_update_flops():
    assert generation_flops(SHAPE, 3, 2) == forward_flops(SHAPE, 5)
    assert update_flops(SHAPE, 5, reference_forward=True) == 4 * 10960
    assert update_flops(SHAPE, 5, reference_forward=False) == 3 * 10960


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
    expected = ModelShape(matmul_params=6208, layers=2, attention_width=16)
    assert ModelShape.of(model) == expected
    assert ModelShape.of(model).as_dict() == {"matmul_params": 6208, "layers": 2, "attention_width": 16}
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
