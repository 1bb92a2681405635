"""Role-swap benchmark: which trained role moved a cell's held-out F1, measured by putting back the start's.

    python benchmarks/role_swap.py --model models/main/start --index index --train data/train.jsonl \\
        --adapters train/main/joint/seed0/adapters/equal_steps --arm joint

A joint cell trains the central agent and both sub-agents at once, and its dev F1 says only what they did
together. This runs the real harness greedily on the dev split (never the test split) once for every subset of
the arm's trained roles: the roles in the subset keep the cut's adapter, the others play the start (adapter
off). `start` (no trained role) is the `base` reference on the dev split; the full subset is the cell itself.
So the effect of each role is read against the start, alone and beside the others (the two differ where the
roles interact: a trained central agent asking what only a trained reader quotes right).

Figures per variant: dev F1 and EM (per benchmark too), F1 minus the start's paired over the questions (with its
bootstrap CI and sign-flip p: on 16 dev questions one question is 0.06), each question's F1, and each episode's
sub-questions, notes and answer.
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
    parser.add_argument(
        "--unseen",
        nargs="+",
        metavar="HISTORY",
        help="play, instead of the dev split, the training questions outside it that the warm start did not trace "
        "and that none of these training histories (train/.../history.jsonl) drew: more questions than the dev "
        "split, though their facts may have been trained on",
    )
    parser.add_argument(
        "--single", action="store_true", help="only the start, each trained role alone and the whole arm"
    )
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
from centralrl.compare import paired_rise
from centralrl.config import CompareConfig, load_config
from centralrl.data.split import split_dev
from centralrl.errors import DataError
from centralrl.harness.engine import RolePolicy
from centralrl.harness.episodes import TOPOLOGIES
from centralrl.io import read_jsonl
from centralrl.metrics import f1
from centralrl.retrieval import open_retriever
from centralrl.retrieval.base import Retriever
from centralrl.rl.rewards import QUESTION_REWARDS
from centralrl.rl.warmstart import trace_settings, tried_questions
from centralrl.schema import Question, read_questions


def subsets(roles: Sequence[str], single: bool = False) -> list[tuple[str, ...]]:
    """Every subset of the trained roles, the empty one (the start) first and the whole arm last; `single`: only
    the start, each role alone and the whole arm.

    >>> subsets(["central", "retrieval"])
    [(), ('central',), ('retrieval',), ('central', 'retrieval')]
    >>> subsets(["central", "retrieval", "conclusion"], single=True)[-2:]
    [('conclusion',), ('central', 'retrieval', 'conclusion')]
    """
    every = [combo for size in range(len(roles) + 1) for combo in itertools.combinations(roles, size)]
    return [combo for combo in every if not single or len(combo) in (0, 1, len(roles))]


def unseen_questions(cfg, training: Sequence[Question], retriever: Retriever, policy: RolePolicy, histories) -> list:
    """The training questions (outside the dev split) that the warm start did not trace (`tried_questions`, as the
    stage picks them) and that no history row drew (its `question_rewards`)."""
    candidates = [q for q in training if q.decomposition]
    traced = tried_questions(candidates, retriever=retriever, policy=policy, **trace_settings(cfg))
    seen = {q.id for q, built in traced if built} if cfg.warmstart.enabled else set()
    for path in histories:
        for where, row in read_jsonl(path):
            drawn = row.get(QUESTION_REWARDS)
            if not isinstance(drawn, dict):
                raise DataError(f"{where}: no {QUESTION_REWARDS} object (a history from before per-question rewards?)")
            seen |= set(drawn)
    return [q for q in training if q.id not in seen]


def variant_name(trained: Sequence[str]) -> str:
    return "+".join(trained) or "start"


def measure(
    cfg, policy: RolePolicy, retriever: Retriever, questions: Sequence[Question], topology: str, single: bool = False
) -> dict:
    """Each subset's (`subsets`) greedy scores on `questions`, with the untrained roles' adapters turned off."""
    cut = dict(policy.adapters)
    trained = [role for role, adapter in cut.items() if adapter is not None]
    settings = run_settings(cfg, greedy=True, seed=0)
    figures = {}
    for subset in subsets(trained, single):
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
    return figures | {"against_start": against_start(figures, cfg.compare)}


def against_start(variants: dict, cfg: CompareConfig) -> dict:
    """Each variant's F1 minus the start's, paired over the questions (`compare.paired_rise`, the replayed rise's
    statistics): the difference, its bootstrap CI and the sign-flip p, so a difference of a question or two is
    read with its noise."""
    start = variants["start"]["f1_by_question"]
    figures = {}
    for name, variant in variants.items():
        if name == "start":
            continue
        pairs = [(question, 0, start[question], variant["f1_by_question"][question]) for question in sorted(start)]
        rise = paired_rise(pairs, cfg)
        figures[name] = {"difference": round(rise["estimate"], 4), "low": round(rise["low"], 4)}
        figures[name] |= {"high": round(rise["high"], 4), "p": round(rise["p"], 4)}
    return figures


def main(args: argparse.Namespace) -> None:
    out = check_out(args.out, args)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.params)
    topology = cfg.arm(args.arm).topology  # an unknown arm is refused before anything loads
    training, questions = split_dev(read_questions(args.train, split="train"), cfg.train.dev, args.train)
    retriever = open_retriever(cfg.retrieval, args.index, questions=(questions, args.train))
    policy = trained_policy(cfg, args.backbone, args.model, args.adapters, args.arm)
    if args.unseen:
        questions = unseen_questions(cfg, training, retriever, policy, args.unseen)
    figures = {"params": args.params, "model": args.model, "adapters": args.adapters, "arm": args.arm}
    figures |= {"questions": "unseen" if args.unseen else "dev", "histories": args.unseen or []}
    figures |= {"n_questions": len(questions)} | measure(cfg, policy, retriever, questions, topology, args.single)
    print(json.dumps(figures["against_start"], indent=2))
    cli.write_indented_json(out, figures)
    print(f"written to {out}")


if __name__ == "__main__":
    run_main(lambda: main(ARGUMENTS))
