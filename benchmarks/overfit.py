"""Can GRPO fit a handful of training questions? The RL sanity check: the same few questions every step, so the
step reward measures the policy, not the draw, and a working update must raise it.

    python benchmarks/overfit.py --model models/main/start --index index --train data/train.jsonl \\
        --benchmarks synth-2hop --per-benchmark 4 --steps 16

One arm's GRPO run as the train stage makes it (`train.grpo` of --params, a fresh adapter from --seed), except
that its pool is the first --per-benchmark training questions of each of --benchmarks (never the dev split) and every
step rolls out all of them. Prints a line per step (mean reward, per-question reward, informative groups, KL,
sub-questions per episode) and writes the steps and the first- and last-quarter reward means to --out. When the
reward rises here but not in a full run, the update works and what fails is carrying it across questions.
--dev-every K scores the dev split greedily at the start and every K steps (as the train stage does), so the
figures also say whether what the pool taught carries to questions it never saw.
"""

from __future__ import annotations

import argparse

import cli
from cli import check_out, count, count_or_zero, run_main


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__)
    cli.harness_arguments(parser, start=True)
    parser.add_argument("--train", required=True, help="training questions (the dev split is left out)")
    parser.add_argument("--arm", default="central_only", help="a key of `arms` in params")
    parser.add_argument("--benchmarks", nargs="+", required=True, help="the benchmarks the pool's questions are from")
    parser.add_argument("--per-benchmark", type=count, default=4, help="questions of each benchmark in the pool")
    parser.add_argument("--steps", type=count, default=16, help="GRPO steps")
    parser.add_argument("--seed", type=int, default=0, help="training seed (adapter init, rollouts)")
    parser.add_argument("--threads", type=count, default=1, help="torch intra-op threads")
    parser.add_argument("--dev-every", type=count_or_zero, default=0, help="steps between greedy dev scores (0: none)")
    parser.add_argument("--out", default="benchmarks/results/overfit.json", help="figures (JSON)")
    return parser.parse_args(argv)


if __name__ == "__main__":  # the command line before the heavy imports below: --help and usage errors at once
    ARGUMENTS = arguments()

import json
from collections.abc import Sequence

import torch

from centralrl.assembly import fresh_policy
from centralrl.config import Config, load_config
from centralrl.errors import ConfigError
from centralrl.hardware import pick_device
from centralrl.io import write_json
from centralrl.report import reward_rise
from centralrl.retrieval import Retriever, open_retriever
from centralrl.data.split import split_dev
from centralrl.rl.dev import dev_scores
from centralrl.rl.trainer import Trainer
from centralrl.schema import Question, read_questions

TOPOLOGY = "central"  # the arms whose runs this fits


def pool(train: str, cfg: Config, benchmarks: list[str], n: int) -> tuple[list[Question], list[Question]]:
    """(the first `n` training questions of each of `benchmarks`, the dev split) from the training file."""
    training, dev = split_dev(read_questions(train, split="train"), cfg.train.dev, train)
    chosen = []
    for benchmark in benchmarks:
        mine = [q for q in training if q.benchmark == benchmark][:n]
        if len(mine) < n:
            known = ", ".join(sorted({q.benchmark for q in training}))
            raise ConfigError(f"{train}: {len(mine)} training questions of {benchmark}, {n} asked (it has {known})")
        chosen += mine
    return chosen, dev


def fit(
    cfg: Config,
    policy,
    retriever: Retriever,
    questions: list[Question],
    steps: int,
    seed: int,
    dev: Sequence[Question] = (),
    dev_every: int = 0,
) -> list[dict]:
    """`steps` GRPO steps on `questions`, all of them rolled out each step (no extra draws: the pool has no other
    questions to draw); a row of figures per step. With `dev_every`, the `dev` questions' greedy scores at the
    start (row of step 0) and every `dev_every` steps."""
    grpo = cfg.train.grpo.model_copy(update={"questions_per_step": len(questions), "extra_draws": 0})
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"grpo": grpo})})
    trainer = Trainer(cfg, policy, retriever, questions, TOPOLOGY, seed)
    rows = []
    if dev_every:
        rows.append({"step": 0, **dev_row(trainer, dev)})
        print(json.dumps(rows[-1]), flush=True)
    for _ in range(steps):
        episodes = trainer.rollout()
        rewards = trainer.rewards(episodes)
        metrics = trainer.learn(episodes, rewards)
        by_question = {e.question.id: r for e, r in zip(episodes[:: grpo.group_size], rewards.mean(dim=1).tolist())}
        rows.append(
            {
                "step": trainer.step,
                "reward_mean": round(float(rewards.mean()), 4),
                "reward_by_question": {q: round(r, 4) for q, r in sorted(by_question.items())},
                "informative_groups": metrics["informative_groups"],
                "kl": round(metrics.get("kl", 0.0), 4),
                "subquestions_per_episode": round(metrics["subquestions_per_episode"], 4),
            }
        )
        if dev_every and trainer.step % dev_every == 0:
            rows[-1] |= dev_row(trainer, dev)
        print(json.dumps(rows[-1]), flush=True)
    return rows


def dev_row(trainer: Trainer, dev: Sequence[Question]) -> dict[str, float]:
    """The trainer's policy's greedy scores on the dev questions, rounded (`centralrl.rl.dev.dev_scores`)."""
    scores = dev_scores(trainer.cfg, trainer.policy, trainer.retriever, dev, TOPOLOGY, trainer.world)
    return {key: round(value, 4) for key, value in scores.items()}


def main(args: argparse.Namespace) -> None:
    check_out(args.out, args)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.params)
    if cfg.arm(args.arm).topology != TOPOLOGY:
        raise ConfigError(f"--arm {args.arm}: overfit.py runs central-topology arms")
    questions, dev = pool(args.train, cfg, args.benchmarks, args.per_benchmark)
    retriever = open_retriever(cfg.retrieval, args.index, questions=(questions + dev, args.train))
    policy = fresh_policy(cfg, args.arm, args.seed, args.backbone, args.model, pick_device(cfg.harness.device))
    rows = fit(cfg, policy, retriever, questions, args.steps, args.seed, dev, args.dev_every)
    first, last = reward_rise([row for row in rows if row["step"] > 0])
    figures = {
        "params": args.params,
        "model": args.model,
        "arm": args.arm,
        "seed": args.seed,
        "questions": [q.id for q in questions],
        "reward_first_quarter": round(first, 4),
        "reward_last_quarter": round(last, 4),
        "steps": rows,
    }
    print({k: v for k, v in figures.items() if k != "steps"})
    write_json(args.out, figures)


if __name__ == "__main__":
    run_main(lambda: main(ARGUMENTS))
