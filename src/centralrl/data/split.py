"""The dev split: a fixed sample of the training questions that neither the warm start nor GRPO ever trains on,
on which the train stage scores the current policy greedily every `train.dev.every` steps (`centralrl.rl.dev`).
By default it is stratified (`train.dev.sampling`): each benchmark gives as many questions as the others (within
one, while it has questions left), so its pooled F1 weighs the question types as the test split's macro F1 does
(drawn at random, stop 58's default world gave 6 one-hop and 10 two-hop dev questions; its test split held 12
and 12).

It gives learning curves (dev F1 against step and training FLOPs, per arm and seed) and a split to choose
hyperparameters on without touching the test split. The sample derives from `train.dev.seed` alone, so every
arm and seed is scored on the same questions, and it is drawn from the training file as a whole before any
other selection (the warm start's questions and each step's draw come from what is left).

What is left excludes every training question that asks a hop a dev question asks (questions with a
decomposition: the synthetic world, MuSiQue): a dev question whose hop GRPO was rewarded for would score the
training, not the transfer. A hop is its sub-question with MuSiQue's placeholders filled in ("#1 >> country"
names step 1's answer), so two questions that only share a template do not count. In the default world 15 of
the 224 other training questions share a hop with the 16 dev questions (9 two-hop, 6 one-hop; at stop 59's 12
test questions per type 13, all 2-hop; in stop 57's world 19, 17). A hop asked from its other side counts too:
"Who is Y married to?" (X) asks the fact of "Who is X married to?" (Y), as the synthetic world keeps its test
facts out of training (`synthetic._fact`, which has the passages; here the texts show it: `reversed_hop`). The
dev questions may share a hop with one another. The data stage checks that enough questions are left
(`training_left`), so a run does not fail on it after the warm start.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from centralrl.config import Config, DevConfig
from centralrl.errors import DataError
from centralrl.schema import Question, interleave
from centralrl.seeding import derive_seed

PLACEHOLDER = re.compile(r"#(\d+)")


def hops(question: Question) -> list[tuple[str, str]]:
    """The question's (sub-question, answer) pairs, each placeholder "#k" replaced by step k's answer.

    >>> from centralrl.schema import SubQuestion
    >>> steps = (SubQuestion("Who wrote Brand?", "Henrik Ibsen"), SubQuestion("#1 >> country", "Norway"))
    >>> hops(Question("m", "?", ("Norway",), "musique", "train", decomposition=steps))
    [('Who wrote Brand?', 'Henrik Ibsen'), ('Henrik Ibsen >> country', 'Norway')]
    """
    answers = [step.answer for step in question.decomposition]

    def answer(match: re.Match) -> str:
        k = int(match.group(1))
        return answers[k - 1] if 1 <= k <= len(answers) else match.group(0)

    return [(PLACEHOLDER.sub(answer, step.question), step.answer) for step in question.decomposition]


def reversed_hop(hop: tuple[str, str], other: tuple[str, str]) -> bool:
    """Whether `hop` asks `other`'s fact from its other side: each answer is, once and as whole words, the other's
    subject, in one template. A relation that is not symmetric ("Who succeeded Al?" against "Who succeeded Bo?")
    passes too: it only leaves a training question out, and the synthetic world's one relation between two people
    is a marriage.

    >>> reversed_hop(("Who is Ann married to?", "Bo"), ("Who is Bo married to?", "Ann"))
    True
    >>> reversed_hop(("How many seasons did Series 3 run?", "2"), ("How many seasons did Series 2 run?", "3"))
    True
    >>> reversed_hop(("Who is Annabel married to?", "Bo"), ("Who is Bo married to?", "Ann"))  # not a whole word
    False
    >>> reversed_hop(("Who founded Acme?", "Bo"), ("Who is Bo married to?", "Ann"))
    False
    """
    (text, answer), (other_text, other_answer) = hop, other
    subject = re.compile(rf"\b{re.escape(other_answer)}\b")
    if len(subject.findall(text)) != 1:
        return False
    return subject.sub(lambda _: answer, text) == other_text


def _shares_a_hop(question: Question, asked: list[tuple[str, str]]) -> bool:
    """Whether `question` asks a hop of `asked` (dev questions' hops), as asked or from its other side."""
    texts = {text for text, _ in asked}
    return any(hop[0] in texts or any(reversed_hop(hop, other) for other in asked) for hop in hops(question))


def split_dev(
    questions: Sequence[Question], dev: DevConfig, source: str = "the training file"
) -> tuple[list[Question], list[Question]]:
    """(training questions, dev questions): `dev.questions` of them drawn from `dev.seed`, in file order; the
    training questions are the others, less those asking a hop a dev question asks. `source` names where the
    questions came from in the error for too few of them."""
    if dev.questions >= len(questions):
        raise DataError(
            f"{source}: its {len(questions)} questions leave none to train on after train.dev.questions "
            f"({dev.questions}) are held out"
        )
    held = _held(questions, dev)
    dev_questions = [questions[i] for i in sorted(held)]
    asked = [hop for question in dev_questions for hop in hops(question)]
    training = [q for i, q in enumerate(questions) if i not in held and not _shares_a_hop(q, asked)]
    if not training:
        raise DataError(
            f"{source}: each of its {len(questions) - dev.questions} questions outside the dev split "
            f"(train.dev.questions {dev.questions}) asks a sub-question a dev question asks: none left to train on"
        )
    return training, dev_questions


def _held(questions: Sequence[Question], dev: DevConfig) -> set[int]:
    """The positions of the dev questions: `dev.questions` of them, drawn from `dev.seed`; stratified, the
    shuffled questions dealt round-robin over their benchmarks (as `train.grpo.question_sampling` deals a step),
    so each benchmark gives as many as the others, within one, while it has questions left."""
    rng = random.Random(derive_seed(dev.seed, "dev"))
    if dev.sampling == "uniform":
        return set(rng.sample(range(len(questions)), dev.questions))
    shuffled = rng.sample(range(len(questions)), len(questions))
    return set(interleave(shuffled, lambda i: questions[i].benchmark)[: dev.questions])


def training_left(cfg: Config, questions: Sequence[Question], source: str) -> None:
    """Refuse training questions that leave a step (or `train.grpo.pool`) too few, or a benchmark none, once the
    dev split and the questions sharing a hop with it are out: the data stage's check, before hours of warm
    start."""
    training, dev = split_dev(questions, cfg.train.dev, source)
    if gone := sorted({q.benchmark for q in questions} - {q.benchmark for q in training}):
        raise DataError(
            f"{source}: every training question of {', '.join(gone)} is in the dev split (train.dev.questions "
            f"{len(dev)}, {cfg.train.dev.sampling}) or shares a hop with it, so training would never see that "
            "benchmark; lower train.dev.questions or add its training questions"
        )
    needed = max(cfg.train.grpo.questions_per_step, cfg.train.grpo.pool)
    if len(training) < needed:
        raise DataError(
            f"{source}: {len(questions)} training questions leave {len(training)} to train on after the dev split "
            f"(train.dev.questions {len(dev)}) and the {len(questions) - len(dev) - len(training)} sharing a hop "
            f"with it, but train.grpo.questions_per_step or pool, the larger, is {needed}; add training questions "
            f"or lower those params"
        )
