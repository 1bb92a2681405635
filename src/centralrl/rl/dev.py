"""Dev scores: the current policy's greedy F1 and EM on the dev split (`centralrl.data.split`, which says how it
is drawn and what it keeps out of training), every `train.dev.every` steps of a run."""

from __future__ import annotations

from collections.abc import Sequence

from centralrl.assembly import run_settings
from centralrl.config import Config
from centralrl.distributed import World
from centralrl.harness.engine import RolePolicy
from centralrl.harness.episodes import TOPOLOGIES
from centralrl.metrics import em, f1
from centralrl.retrieval.base import Retriever
from centralrl.schema import Question


DEV_KEYS = ("dev.f1", "dev.em")


def dev_keys(questions: Sequence[Question]) -> list[str]:
    """What `dev_scores` returns for these questions: DEV_KEYS, then F1 per benchmark (`dev.f1.<benchmark>`).

    >>> from centralrl.schema import Question
    >>> dev_keys([Question("a", "?", ("x",), "synth-2hop", "train"), Question("b", "?", ("y",), "nq", "train")])
    ['dev.f1', 'dev.em', 'dev.f1.nq', 'dev.f1.synth-2hop']
    """
    return [*DEV_KEYS, *(f"dev.f1.{b}" for b in sorted({q.benchmark for q in questions}))]


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
