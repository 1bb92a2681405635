"""One GRPO update of fixed samples, split over the processes `accelerate launch` started (test_distributed runs
it so); each process writes its gradients after the sum. `summed_gradients` is also what one process computes."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from centralrl.config import ROLES, Config
from centralrl.distributed import World
from centralrl.config import role_adapters
from centralrl.models.adapters import attach_adapters
from centralrl.models.backbone import load_backbone
from centralrl.rl.trainer import Sample, loss_denominator, update

# The first process gets central and conclusion calls, the second retrieval and central ones: each process
# leaves an adapter the other trains without a gradient.
PLAN = [
    ("central", 12, 0.5),
    ("central", 9, -1.0),
    ("conclusion", 7, 1.5),
    ("retrieval", 11, -0.5),
    ("retrieval", 8, 1.0),
    ("central", 10, 0.25),
]


def fixed_samples(vocab: int) -> list[Sample]:
    rng = random.Random(0)
    return [
        Sample(
            adapter,
            tuple(rng.randrange(vocab) for _ in range(length)),
            length // 2,
            advantage,
            tuple(-1.0 for _ in range(length - length // 2)),  # recorded rollout log-probs of the completion
        )
        for adapter, length, advantage in PLAN
    ]


def summed_gradients(backbone: Path, world: World) -> dict[str, torch.Tensor]:
    cfg = Config()
    model, tokenizer = load_backbone(backbone)
    torch.manual_seed(0)
    model = attach_adapters(model, role_adapters(ROLES, "per_role"), cfg.lora)
    parameters = [p for name, p in sorted(model.named_parameters()) if "lora_" in name]
    samples = world.shard(fixed_samples(len(tokenizer)))
    denominator = world.total([loss_denominator(samples, cfg.train.grpo.loss_normalization)])[0]
    model.train()
    update(model, samples, cfg.train.grpo, 1.0, tokenizer.pad_token_id, denominator)
    world.sum_gradients(parameters)
    return {name: p.grad.clone() for name, p in sorted(model.named_parameters()) if p.grad is not None}


if __name__ == "__main__":
    backbone, out = Path(sys.argv[1]), Path(sys.argv[2])
    world = World.join("cpu", int(sys.argv[3]))
    torch.save(summed_gradients(backbone, world), out / f"rank{world.rank}.pt")
