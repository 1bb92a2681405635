"""Which rollout temperature gives GRPO groups signal: the share of informative groups (rewards not all equal)
and the mean sampled reward per temperature, on the dev split, from the starting checkpoint.

    python benchmarks/temperature.py --model models/main/start --index index --train data/train.jsonl \\
        --temperatures 0.5 0.7 1.0 --n 16

A group of G sampled episodes with equal rewards has zero advantage everywhere and trains nothing (such steps
are skipped: `centralrl.rl.trainer`). Too hot, a small model's samples are all wrong (rewards all 0); too cold,
they are all the greedy answer. Every temperature runs the same dev questions with the same seeds; the greedy
F1 on them is printed beside. `--greedy-roles retrieval conclusion` samples the central agent alone, as a
central-only rollout under `train.grpo.frozen_roles: greedy` does. Figures go to --out as JSON. Uses the dev
split only, never the test split.
"""

from __future__ import annotations

import argparse
import cli
from cli import check_out, count, run_main
from centralrl.services import positive


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__)
    cli.harness_arguments(parser, start=True)
    parser.add_argument("--train", required=True, help="training questions; the dev split is drawn from them")
    parser.add_argument(
        "--temperatures",
        type=positive("a temperature"),
        nargs="+",
        default=[0.5, 0.7, 1.0],
        help="sampling temperatures compared",
    )
    parser.add_argument(
        "--greedy-roles",
        nargs="*",
        choices=["central", "retrieval", "conclusion"],
        default=[],
        help="roles decoded greedily while the others sample (train.grpo.frozen_roles: greedy plays an arm's "
        "frozen roles so): with retrieval and conclusion, the signal the central agent's own samples give",
    )
    parser.add_argument(
        "--n",
        type=count,
        default=None,
        help="dev questions used (default: the whole split; more than it holds is refused)",
    )
    parser.add_argument("--seeds", type=count, default=2, help="sampling seeds per temperature")
    parser.add_argument("--threads", type=count, default=1, help="torch intra-op threads")
    parser.add_argument("--out", default="benchmarks/results/temperature.json", help="figures (JSON)")
    args = parser.parse_args(argv)
    return args


if __name__ == "__main__":  # the command line before the heavy imports below: --help and usage errors at once
    ARGUMENTS = arguments()

import dataclasses

import torch

from centralrl.assembly import run_settings, trained_policy
from centralrl.config import load_config
from centralrl.errors import ConfigError
from centralrl.harness.episodes import TOPOLOGIES
from centralrl.io import write_json
from centralrl.retrieval import open_retriever
from centralrl.data.split import split_dev
from centralrl.rl.grpo import groups_with_signal
from centralrl.rl.trainer import episode_rewards
from centralrl.schema import read_questions


def measure(cfg, policy, retriever, questions, settings, group_size: int) -> dict:
    """Informative share of the groups and mean reward, over all `questions` and per benchmark (where the signal
    is: a benchmark the start always or never answers gives groups of equal rewards), and tokens generated."""
    episodes = TOPOLOGIES["central"]([q for q in questions for _ in range(group_size)], policy, retriever, settings)
    rewards = torch.tensor(episode_rewards(episodes, cfg)).view(-1, group_size)
    informative = groups_with_signal(rewards)
    benchmarks = [q.benchmark for q in questions]

    def shares(mine: list[bool]) -> dict:
        return {
            "informative_share": round(float(informative[mine].float().mean()), 4),
            "reward_mean": round(float(rewards[mine].mean()), 4),
        }

    return shares([True] * len(questions)) | {
        "by_benchmark": {b: shares([q == b for q in benchmarks]) for b in sorted(set(benchmarks))},
        "generated_tokens": sum(len(c.completion_ids) for e in episodes for c in e.calls),
    }


def averaged(runs: list[dict]) -> dict:
    """The mean of each figure over runs (nested dicts figure by figure)."""
    return {
        k: averaged([r[k] for r in runs])
        if isinstance(runs[0][k], dict)
        else round(sum(r[k] for r in runs) / len(runs), 4)
        for k in runs[0]
    }


def main(args: argparse.Namespace) -> None:
    check_out(args.out, args)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.params)
    _, dev = split_dev(read_questions(args.train, split="train"), cfg.train.dev, args.train)
    if args.n is not None and args.n > len(dev):  # it ran the dev questions there were, without a word
        raise ConfigError(f"{args.train}: {len(dev)} dev questions (train.dev), --n {args.n} asked")
    dev = dev[: args.n]
    retriever = open_retriever(cfg.retrieval, args.index, questions=(dev, args.train))
    policy = trained_policy(cfg, args.backbone, args.model, None)
    greedy = measure(cfg, policy, retriever, dev, run_settings(cfg, greedy=True, seed=0), 1)
    figures = {
        "params": args.params,
        "model": args.model,
        "question_types": cfg.data.synthetic.question_types,
        "harness_precision": cfg.harness.precision,
        "seeds": args.seeds,
        "greedy_roles": args.greedy_roles,
        "dev_questions": len(dev),
        "group_size": cfg.train.grpo.group_size,
        "greedy_f1": greedy["reward_mean"],
        "greedy_f1_by_benchmark": {b: f["reward_mean"] for b, f in greedy["by_benchmark"].items()},
    }
    for temperature in args.temperatures:
        runs = [
            measure(
                cfg,
                policy,
                retriever,
                dev,
                dataclasses.replace(run_settings(cfg, False, seed, args.greedy_roles), temperature=temperature),
                cfg.train.grpo.group_size,
            )
            for seed in range(args.seeds)
        ]
        figures[f"t{temperature}"] = averaged(runs)
        print(f"temperature {temperature}: {figures[f't{temperature}']}", flush=True)
    print(figures)
    write_json(args.out, figures)


if __name__ == "__main__":
    run_main(lambda: main(ARGUMENTS))
