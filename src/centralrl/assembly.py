"""What every entry point that runs the harness assembles from params: the model on its device, the policy
(backbone -> role adapters -> device -> generation engine) and the settings of a batch of episodes.

Used by the GRPO run (`rl/run.py`), the warm start, the evaluation flow and the rollout benchmark, so each of
them loads a backbone, attaches adapters and picks a device the same way. Questions are read with
`schema.read_questions`, which stays out of here so that the index stage does not depend on the harness.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from centralrl.config import Config, adapter_names
from centralrl.hardware import pick_device
from centralrl.harness.engine import RolePolicy, open_policy
from centralrl.harness.episodes import RunSettings
from centralrl.models.adapters import attach_adapters, load_adapters
from centralrl.models.backbone import load_backbone
from centralrl.seeding import derive_seed


def load_model(
    cfg: Config, backbone: str, model_dir: str | Path, device: torch.device | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The checkpoint in `model_dir` in the dtype of `models.<backbone>`, on `device` (default: `harness.device`)."""
    model, tokenizer = load_backbone(Path(model_dir), cfg.backbone(backbone).dtype)
    return model.to(device or pick_device(cfg.harness.device)), tokenizer


def trained_policy(
    cfg: Config, backbone: str, model_dir: str | Path, adapters_dir: str | Path | None = None, arm: str | None = None
) -> RolePolicy:
    """The policy of an evaluation: the starting checkpoint, untrained, or with a cut's adapters from
    `adapters_dir`, which must be exactly those `arm` trains; on `harness.engine`."""
    model, tokenizer = load_model(cfg, backbone, model_dir)
    adapters: dict[str, str | None] = {}
    if adapters_dir is not None:
        adapters = cfg.arm_adapters(arm)
        model = load_adapters(model, adapters_dir, adapter_names(adapters))
    return open_policy(cfg.harness, model, tokenizer, adapters, model_dir)


def fresh_policy(
    cfg: Config, arm: str, seed: int, backbone: str, model_dir: str | Path, device: torch.device
) -> RolePolicy:
    """The policy a GRPO run starts from: the starting checkpoint on `device` with new LoRA adapters for the
    arm's trainable roles, initialised from `seed` alone, so every arm of a seed starts from the same weights."""
    model, tokenizer = load_model(cfg, backbone, model_dir, device=device)
    adapters = cfg.arm_adapters(arm)
    torch.manual_seed(derive_seed(seed, "lora-init"))
    return open_policy(cfg.harness, attach_adapters(model, adapters, cfg.lora), tokenizer, adapters, model_dir)


def run_settings(cfg: Config, greedy: bool, seed: int, greedy_roles: Iterable[str] = ()) -> RunSettings:
    """How a batch of episodes runs under `harness` and `retrieval.top_k`: greedy, or sampled from `seed` (but
    `greedy_roles` greedy)."""
    h = cfg.harness
    return RunSettings(
        h.max_turns,
        h.max_new_tokens,
        h.passage_chars,
        cfg.retrieval.top_k,
        greedy=greedy,
        temperature=h.temperature,
        seed=seed,
        greedy_roles=frozenset(greedy_roles),
    )
