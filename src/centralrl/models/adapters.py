"""Role adapters: the central, retrieval and conclusion roles as named peft LoRA adapters on one frozen backbone.

Which roles have an adapter is data: `trainable_roles` (an arm's entry in params). A role without an adapter
is frozen and runs with adapters disabled, so it is exactly the starting checkpoint. With `sharing: shared`
every trainable role uses one adapter named "shared" (as MMOA-RAG/JADE share parameters across agents).

peft reads transformers' deprecated `is_gradient_checkpointing` when it wraps a model, which printed a
FutureWarning in every stage; `_wrapping` silences that one warning, and only while peft wraps.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import PreTrainedModel

from centralrl.config import ROLES, SHARED, LoraConfig
from centralrl.errors import BackboneError, ConfigError, DataError


def adapters_of(model: PreTrainedModel) -> dict[str, str | None]:
    """Role -> adapter for a model with loaded adapters: a role's own adapter, else the shared one, else frozen."""
    names = set(model.peft_config) if isinstance(model, PeftModel) else set()
    return {role: role if role in names else SHARED if SHARED in names else None for role in (*ROLES, "agent")}


def _peft_config(cfg: LoraConfig) -> PeftLoraConfig:
    return PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


@contextmanager
def _wrapping() -> Iterator[None]:
    """peft wrapping a model, without transformers' FutureWarning about the alias peft reads."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def check_target_modules(model: PreTrainedModel, cfg: LoraConfig) -> None:
    """Refuse a `lora.target_modules` entry that names no module of the backbone (peft matches a module whose
    name is the entry or ends with "." + it). peft itself fails with a traceback only when none matches, and
    skips the rest silently, so one mistyped name would train fewer matrices than asked."""
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in cfg.target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(
            f"lora.target_modules: {missing} name no module of the backbone ({type(model).__name__}); its linear "
            f"layers are {', '.join(linear)}"
        )


def attach_adapters(model: PreTrainedModel, adapters: dict[str, str | None], cfg: LoraConfig) -> PreTrainedModel:
    """Wrap `model` with one fresh LoRA adapter per distinct adapter name (none at all if every role is frozen)."""
    names = sorted({name for name in adapters.values() if name})
    if not names:
        return model
    check_target_modules(model, cfg)
    with _wrapping():
        peft_model = get_peft_model(model, _peft_config(cfg), adapter_name=names[0])
    for name in names[1:]:
        peft_model.add_adapter(name, _peft_config(cfg))
    return peft_model


@contextmanager
def acting_as(model: PreTrainedModel, adapter: str | None) -> Iterator[None]:
    """Run the model as a role: its adapter active, or every adapter disabled when the role is frozen."""
    if not isinstance(model, PeftModel):
        yield
    elif adapter is None:
        with model.disable_adapter():
            yield
    else:
        model.set_adapter(adapter)
        yield


def save_adapters(model: PreTrainedModel, directory: str | Path) -> list[str]:
    """Save every adapter into directory/<adapter name>/ (peft's layout); return the names saved."""
    if not isinstance(model, PeftModel):
        Path(directory).mkdir(parents=True, exist_ok=True)
        return []
    names = sorted(model.peft_config)
    # The base weights never train, so only LoRA's are saved: peft's "auto" would also save lm_head and the
    # embedding (the whole vocabulary) whenever LoRA adapts lm_head.
    model.save_pretrained(str(directory), selected_adapters=names, save_embedding_layers=False)
    # peft writes the first adapter at the top level and the others in subfolders; move the first too, so
    # every adapter lives in directory/<name>/ and loading needs no special case.
    top = Path(directory)
    if (top / "adapter_config.json").exists() and not (top / names[0]).exists():
        (top / names[0]).mkdir()
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            (top / file).rename(top / names[0] / file)
    for name in names:
        _canonical_config(top / name / "adapter_config.json")
    return names


def _canonical_config(path: Path) -> None:
    """peft keeps target_modules as a set, so its saved order follows PYTHONHASHSEED; sort it (same bytes)."""
    config = json.loads(path.read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def checked_adapters(directory: str | Path, expected: Iterable[str]) -> list[Path]:
    """The adapter folders `save_adapters` wrote in `directory`, which must be exactly `expected` (the adapters
    the arm trains: a folder that lost one, or holds another arm's, would otherwise be evaluated as something it
    is not), each one's weights read whole and finite: an adapter that cannot be read is a BackboneError naming
    it, found before any work (an evaluation met a damaged second cut after evaluating the first)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: no such folder of adapters (the train stage writes one per budget)")
    folders = sorted(p for p in directory.iterdir() if (p / "adapter_config.json").is_file())
    found, wanted = [f.name for f in folders], sorted(set(expected))
    if found != wanted:
        raise DataError(f"{directory}: holds adapters {found}, but the arm trains {wanted}")
    for folder in folders:
        with _naming(folder):
            weights = load_file(folder / "adapter_model.safetensors")
        bad = _non_finite(weights.items())
        if bad:
            raise BackboneError(f"{folder}: {bad} non-finite (NaN or infinite): a damaged or diverged adapter")
    return folders


def load_adapters(model: PreTrainedModel, directory: str | Path, expected: Iterable[str]) -> PreTrainedModel:
    """Load the adapters saved by `save_adapters` in `directory` onto `model` (a plain backbone), once
    `checked_adapters` has read them."""
    folders = checked_adapters(directory, expected)
    if not folders:
        return model
    with _wrapping(), _naming(folders[0]):
        peft_model = PeftModel.from_pretrained(model, str(folders[0]), adapter_name=folders[0].name)
    for folder in folders[1:]:
        with _naming(folder):
            peft_model.load_adapter(str(folder), adapter_name=folder.name)
    return peft_model


def non_finite_weights(model: PeftModel, adapter: str) -> str:
    """'' when every weight of `adapter` is finite, else the first tensor that is not and how many more: such an
    adapter's every output is garbage and its movement and KL NaN."""
    return _non_finite((name, p) for name, p in model.named_parameters() if f".{adapter}." in name)


def _non_finite(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    bad = [name for name, tensor in tensors if not torch.isfinite(tensor).all()]
    return f"{bad[0]}{f' and {len(bad) - 1} more tensors' if len(bad) > 1 else ''}" if bad else ""


@contextmanager
def _naming(folder: Path) -> Iterator[None]:
    """A damaged adapter (truncated weights, a config that is not JSON or does not fit the weights) as one line."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as error:
        reason = " ".join(str(error).split())[:300]
        raise BackboneError(
            f"{folder}: not a LoRA adapter this model can load ({type(error).__name__}: {reason})"
        ) from None


def set_activation_checkpointing(model: PreTrainedModel, enabled: bool) -> None:
    """Turn non-reentrant gradient checkpointing of the decoder layers on or off. It acts in training mode only,
    so generation (eval mode) is unaffected; LoRA needs no input gradients with the non-reentrant form.
    transformers 5 names it activation checkpointing, 4.x gradient checkpointing."""
    lm = model.get_base_model() if isinstance(model, PeftModel) else model
    name = "activation_checkpointing" if hasattr(lm, "activation_checkpointing_enable") else "gradient_checkpointing"
    if enabled:
        getattr(lm, f"{name}_enable")({"use_reentrant": False})
    else:
        getattr(lm, f"{name}_disable")()


@contextmanager
def frozen_linears_in(decoder: torch.nn.Module, dtype: torch.dtype, spill: bool = False) -> Iterator[int]:
    """Hold the frozen Linear weights of `decoder` in `dtype` for the block, the originals put back after it;
    yields how many were cast. Under bf16 autocast a frozen float32 weight is cast again at every forward
    (autocast caches the casts of leaves that require grad only): cast once here, the matmuls see the same bf16
    values (the same gradients, bit for bit: tested) and each forward skips reading and writing every weight.
    LoRA weights (an inactive adapter's too: `set_adapter` makes them trainable), norms and embeddings are left
    as they are. `spill`: the originals wait in a temporary file instead of memory (a long block, such as the warm
    start, holds the bf16 copies alone: 424 MB less for SmolLM2, where the process owns the originals' memory, not
    a mapped checkpoint: `backbone.own_memory`) and are read back, the same bytes, at the end."""
    weights = [
        m.weight
        for name, m in decoder.named_modules()
        if isinstance(m, torch.nn.Linear) and "lora_" not in name and not m.weight.requires_grad
        if m.weight.dtype != dtype
    ]
    originals = [weight.data for weight in weights]
    for weight, data in zip(weights, originals):
        weight.data = data.to(dtype)
    with tempfile.TemporaryDirectory(prefix="frozen-") if spill else nullcontext() as folder:
        if spill:
            torch.save(originals, Path(folder) / "weights.pt")
            originals.clear()
        try:
            yield len(weights)
        finally:
            back = torch.load(Path(folder) / "weights.pt", mmap=True) if spill else originals
            for weight, data in zip(weights, back):
                weight.data = data
