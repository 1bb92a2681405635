"""The dev split: a fixed sample of the training questions that neither the warm start nor GRPO ever trains on,
on which the train stage scores the current policy greedily every `train.dev.every` steps.

It gives learning curves (dev F1 against step and training FLOPs, per arm and seed) and a split to choose
hyperparameters on without touching the test split. The sample derives from `train.dev.seed` alone, so every
arm and seed is scored on the same questions, and it is drawn from the training file as a whole before any
other selection (the warm start's questions and each step's draw come from what is left).

What is left excludes every training question that asks a sub-question a dev question asks (questions with a
decomposition: the synthetic world, MuSiQue): the synthetic world keeps its test facts out of training that way
(README: Data), and a dev question whose hop GRPO was rewarded for would score the training, not the transfer. In
the default world 15 of the 224 other training questions shared a hop with the 16 dev questions (14 of them
2-hop). The dev questions are still drawn from the training file, so unlike the test split they may share a hop
with one another.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from centralrl.assembly import run_settings
from centralrl.config import Config, DevConfig
from centralrl.distributed import World
from centralrl.errors import DataError
from centralrl.harness.engine import RolePolicy
from centralrl.harness.episodes import TOPOLOGIES
from centralrl.metrics import em, f1
from centralrl.retrieval.base import Retriever
from centralrl.schema import Question
from centralrl.seeding import derive_seed


DEV_KEYS = ("dev.f1", "dev.em")


def dev_keys(questions: Sequence[Question]) -> list[str]:
    """What `dev_scores` returns for these questions: DEV_KEYS, then F1 per benchmark (`dev.f1.<benchmark>`).

    >>> from centralrl.schema import Question
    >>> dev_keys([Question("a", "?", ("x",), "synth-2hop", "train"), Question("b", "?", ("y",), "nq", "train")])
    ['dev.f1', 'dev.em', 'dev.f1.nq', 'dev.f1.synth-2hop']
    """
    return [*DEV_KEYS, *(f"dev.f1.{b}" for b in sorted({q.benchmark for q in questions}))]


def split_dev(
    questions: Sequence[Question], dev: DevConfig, source: str = "the training file"
) -> tuple[list[Question], list[Question]]:
    """(training questions, dev questions): `dev.questions` of them drawn from `dev.seed`, in file order; the
    training questions are the others, less those asking a sub-question a dev question asks. `source` names
    where the questions came from in the error for too few of them."""
    if dev.questions >= len(questions):
        raise DataError(
            f"{source}: its {len(questions)} questions leave none to train on after train.dev.questions "
            f"({dev.questions}) are held out"
        )
    held = set(random.Random(derive_seed(dev.seed, "dev")).sample(range(len(questions)), dev.questions))
    dev_questions = [questions[i] for i in sorted(held)]
    asked = {step.question for question in dev_questions for step in question.decomposition}
    training = [
        q for i, q in enumerate(questions) if i not in held and asked.isdisjoint(s.question for s in q.decomposition)
    ]
    if not training:
        raise DataError(
            f"{source}: each of its {len(questions) - dev.questions} questions outside the dev split "
            f"(train.dev.questions {dev.questions}) asks a sub-question a dev question asks: none left to train on"
        )
    return training, dev_questions


def dev_scores(
    cfg: Config, policy: RolePolicy, retriever: Retriever, questions: Sequence[Question], topology: str, world: World
) -> dict[str, float]:
    """Mean F1 and EM of the policy's greedy episodes on the dev questions, and mean F1 per benchmark (a pooled
    score can hide a gain on one question type paid for on another). Each process plays its share
    (`World.shard`) and the sums are totalled, so several training processes score the split once between them
    (one process: every question, and the plain mean)."""
    policy.model.eval()
    share = world.shard(questions)
    episodes = TOPOLOGIES[topology](share, policy, retriever, run_settings(cfg, greedy=True, seed=0)) if share else []
    scores = [f1(e.prediction, e.question.golden_answers) for e in episodes]
    benchmarks = sorted({q.benchmark for q in questions})
    sums = world.total(
        [
            sum(scores),
            sum(em(e.prediction, e.question.golden_answers) for e in episodes),
            *(sum(s for s, e in zip(scores, episodes) if e.question.benchmark == b) for b in benchmarks),
        ]
    )
    counts = [len(questions), len(questions), *(sum(q.benchmark == b for q in questions) for b in benchmarks)]
    return {key: total / count for key, total, count in zip(dev_keys(questions), sums, counts)}
