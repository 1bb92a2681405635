"""Answer metrics exactly as FlashRAG (`flashrag/evaluator/metrics.py`) and Search-R1 define them.

normalize: lowercase, drop ASCII punctuation (`string.punctuation`, so unicode letters and dashes survive),
drop the words a/an/the, collapse whitespace (the SQuAD normalizer FlashRAG and Search-R1 both use).
em: 1.0 if the normalized prediction equals some normalized golden answer.
acc (cover-EM, FlashRAG's "sub-EM", Search-R1's `cover_exact_match`): 1.0 if some normalized golden answer is a
substring of the normalized prediction.
f1: token F1 against each golden answer, best over them; when either side normalizes to yes/no/noanswer and
the two differ, that pair scores 0.

Departure: none in the arithmetic. Golden answers that normalize to an empty string would make `acc` match
everything in FlashRAG; the data stage refuses empty answers, so such a pair cannot reach these functions.
A single golden answer may be passed as a string.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

from centralrl.errors import DataError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
SPECIAL_ANSWERS = ("yes", "no", "noanswer")  # F1 gives them no partial credit; `attribution` cannot place them


def normalize_answer(text: str) -> str:
    """SQuAD-style normalization.

    >>> normalize_answer("  The Eiffel-Tower, in PARIS! ")
    'eiffeltower in paris'
    >>> normalize_answer("Café — Zürich")
    'café — zürich'
    """
    lowered = text.lower()
    no_punctuation = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", no_punctuation).split())


def _as_list(golden_answers: str | Sequence[str]) -> list[str]:
    return [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)


def em(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """Exact match after normalization, against any golden answer.

    >>> em("the Beatles", ["Beatles", "The Fab Four"])
    1.0
    >>> em("Beatles band", ["Beatles"])
    0.0
    """
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(gold) for gold in _as_list(golden_answers)))


def acc(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """Cover-EM: some normalized golden answer occurs inside the normalized prediction.

    >>> acc("It was the Beatles, surely.", ["beatles"])
    1.0
    >>> acc("", ["beatles"])
    0.0
    """
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(gold) in pred for gold in _as_list(golden_answers)))


def _pair_f1(pred: str, gold: str) -> float:
    if (pred in SPECIAL_ANSWERS or gold in SPECIAL_ANSWERS) and pred != gold:
        return 0.0
    common = Counter(pred.split()) & Counter(gold.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred.split())
    recall = same / len(gold.split())
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """Token-level F1, best over golden answers.

    >>> f1("Barack Obama", ["Obama"])  # precision 1/2, recall 1/1
    0.6666666666666666
    >>> f1("no", ["yes"])
    0.0
    """
    pred = normalize_answer(prediction)
    return max(_pair_f1(pred, normalize_answer(gold)) for gold in _as_list(golden_answers))


METRICS = {"em": em, "f1": f1, "acc": acc}


def refuse_empty_answers(questions: Iterable, origin: str) -> None:
    """Refuse a question (`id`, `benchmark`, `golden_answers`) with a golden answer that normalizes to "": every
    prediction would match it. prepare_data drops or refuses those, so only a file made by hand holds one."""
    for q in questions:
        empty = next((answer for answer in q.golden_answers if not normalize_answer(answer)), None)
        if empty is not None:
            raise DataError(
                f"{origin}: question {q.id} ({q.benchmark}): golden answer {empty!r} normalizes to the empty "
                "string, so every prediction would match it"
            )
