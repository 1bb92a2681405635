"""What the stages of one matrix cell (train, evaluate) check before their work: `check_cell`, which `run_stage`
runs while the stage's Prefect server starts. Apart from `stages.cli` so that the stages without a cell do not
import (and so depend on) the retrieval package."""

from __future__ import annotations

import argparse

from centralrl.config import Config
from centralrl.errors import ConfigError


def check_cell(args: argparse.Namespace, cfg: Config) -> None:
    """Refuse what a cell's stage (train, evaluate) would otherwise find seconds or minutes into its work: a cell
    outside the matrix (`backbones`, `seeds`, `arms`, `references` in params: no compare stage would ever read it),
    and an Elasticsearch cluster its retrieval backend needs that does not answer (found at the first search)."""
    from centralrl.retrieval import check_servers

    arm, reference, seed = (getattr(args, name, None) for name in ("arm", "reference", "seed"))
    if arm is not None and arm not in cfg.arms:
        raise ConfigError(f"--arm {arm} is not one of arms {list(cfg.arms)} in {args.params}")
    if reference is not None and reference not in cfg.references:
        raise ConfigError(f"--reference {reference} is not one of references {list(cfg.references)} in {args.params}")
    if args.backbone not in cfg.backbones:
        raise ConfigError(f"--backbone {args.backbone} is not one of backbones {cfg.backbones} in {args.params}")
    if seed is not None and seed not in cfg.seeds:
        raise ConfigError(f"--seed {seed} is not one of seeds {cfg.seeds} in {args.params}")
    check_servers(cfg.retrieval, [cfg.retrieval.backend])
