"""Role-swap benchmark: which trained role moved a cell's held-out F1, measured by putting back the start's.

    python benchmarks/role_swap.py --model models/main/start --index index --train data/train.jsonl \\
        --adapters train/main/joint/seed0/adapters/equal_steps --arm joint

A joint cell trains the central agent and both sub-agents at once, and its dev F1 says only what they did
together. This runs the real harness greedily on the dev split (never the test split) once for every subset of
the arm's trained roles: the roles in the subset keep the cut's adapter, the others play the start (adapter
off). `start` (no trained role) is the `base` reference on the dev split; the full subset is the cell itself.
So the effect of each role is read against the start, alone and beside the others (the two differ where the
roles interact: a trained central agent asking what only a trained reader quotes right).

Figures per variant: dev F1 and EM (per benchmark too), F1 minus the start's, each question's F1 (paired
across variants), and each episode's sub-questions, notes and answer.
"""

from __future__ import annotations

import argparse

import cli
from cli import check_out, count, run_main


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__)
    cli.harness_arguments(parser, start=True)
    parser.add_argument("--train", required=True, help="training questions; the dev split is drawn from them")
    cli.cut_arguments(parser)
    parser.add_argument("--threads", type=count, default=2, help="torch intra-op threads")
    parser.add_argument("--out", default="benchmarks/results/role_swap.json", help="figures (JSON)")
    return parser.parse_args(argv)


if __name__ == "__main__":  # the command line before the heavy imports below: --help and usage errors at once
    ARGUMENTS = arguments()

import itertools
import json
import time
from collections.abc import Sequence

import torch
from headroom import scores

from centralrl.assembly import run_settings, trained_policy
from centralrl.config import load_config
from centralrl.data.split import split_dev
from centralrl.harness.engine import RolePolicy
from centralrl.harness.episodes import TOPOLOGIES
from centralrl.metrics import f1
from centralrl.retrieval import open_retriever
from centralrl.retrieval.base import Retriever
from centralrl.schema import Question, read_questions


def subsets(roles: Sequence[str]) -> list[tuple[str, ...]]:
    """Every subset of the trained roles, the empty one (the start) first and the whole arm last.

    >>> subsets(["central", "retrieval"])
    [(), ('central',), ('retrieval',), ('central', 'retrieval')]
    """
    return [combo for size in range(len(roles) + 1) for combo in itertools.combinations(roles, size)]


def variant_name(trained: Sequence[str]) -> str:
    return "+".join(trained) or "start"


def measure(cfg, policy: RolePolicy, retriever: Retriever, questions: Sequence[Question], topology: str) -> dict:
    """Each subset's greedy scores on `questions`, with the untrained roles' adapters turned off."""
    cut = dict(policy.adapters)
    trained = [role for role, adapter in cut.items() if adapter is not None]
    settings = run_settings(cfg, greedy=True, seed=0)
    figures = {}
    for subset in subsets(trained):
        policy.adapters = {role: (adapter if role in subset else None) for role, adapter in cut.items()}
        started = time.perf_counter()
        episodes = TOPOLOGIES[topology](questions, policy, retriever, settings)
        name = variant_name(subset)
        figures[name] = scores(episodes) | {
            "f1_by_question": {e.question.id: f1(e.prediction, e.question.golden_answers) for e in episodes},
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(f"{name}: F1 {figures[name]['f1']:.3f} ({figures[name]['seconds']:.0f}s)", flush=True)
    policy.adapters = cut
    start = figures["start"]["f1"]
    figures["against_start"] = {name: round(v["f1"] - start, 4) for name, v in figures.items() if name != "start"}
    return figures


def main(args: argparse.Namespace) -> None:
    out = check_out(args.out, args)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.params)
    topology = cfg.arm(args.arm).topology  # an unknown arm is refused before anything loads
    _, dev = split_dev(read_questions(args.train, split="train"), cfg.train.dev, args.train)
    retriever = open_retriever(cfg.retrieval, args.index, questions=(dev, args.train))
    policy = trained_policy(cfg, args.backbone, args.model, args.adapters, args.arm)
    figures = {"params": args.params, "model": args.model, "adapters": args.adapters, "arm": args.arm}
    figures |= {"dev_questions": len(dev)} | measure(cfg, policy, retriever, dev, topology)
    print(json.dumps(figures["against_start"], indent=2))
    cli.write_indented_json(out, figures)
    print(f"written to {out}")


if __name__ == "__main__":
    run_main(lambda: main(ARGUMENTS))
