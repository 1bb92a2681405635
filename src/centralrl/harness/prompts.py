"""Chat messages for each role, built from an episode's state. Every piece of data goes through `as_data`.

The prompts follow the harness of the central-agent paper in spirit (a coordinator that plans sub-questions,
a retrieval worker that reads passages, a conclusion worker that answers) and Search-R1's template for the
single-agent reference; the wording is ours, kept short for small backbones: the three roles' system prompts hold
100 SmolLM2 tokens (they held 156; the warm-started roles follow the protocol from either, README: Benchmarks).
No worked examples: a 135M model copies their entities.
"""

from __future__ import annotations

from collections.abc import Sequence

from centralrl.harness.protocol import as_data
from centralrl.retrieval.base import Hit

CENTRAL_SYSTEM = (
    "Ask ONE sub-question, or conclude if the notes answer the question.\n"
    "Format: <think>reasoning</think> then <subquestion>question</subquestion> or <conclude></conclude>"
)
RETRIEVAL_SYSTEM = (
    "Quote the fact that answers the sub-question, or say nothing relevant was found.\nFormat: <note>evidence</note>"
)
CONCLUSION_SYSTEM = "Reply with the shortest answer: a name, place, year or yes/no.\nFormat: <answer>answer</answer>"
SINGLE_AGENT_SYSTEM = (
    "Answer the question. Think inside <think> and </think> first. If you lack knowledge, search with "
    "<search>query</search> and the results come back inside <information> and </information>. You may "
    "search several times. When you know the answer, write it inside <answer> and </answer>, shortly, "
    "without explanation."
)


def _notes_block(notes: Sequence[tuple[str, str]]) -> str:
    if not notes:
        return "Notes so far: none."
    lines = [f"{i}. Sub-question: {as_data(q)}\n   Note: {as_data(note)}" for i, (q, note) in enumerate(notes, 1)]
    return "Notes so far:\n" + "\n".join(lines)


def central_messages(question: str, notes: Sequence[tuple[str, str]], feedback: str | None) -> list[dict]:
    user = f"Question: {as_data(question)}\n{_notes_block(notes)}"
    if feedback:
        user += f"\n{feedback}"
    return [{"role": "system", "content": CENTRAL_SYSTEM}, {"role": "user", "content": user}]


def format_passages(hits: Sequence[Hit], max_chars: int) -> str:
    if not hits:
        return "(no passages found)"
    return "\n".join(f"[{i}] {as_data(h.title)}: {as_data(h.text[:max_chars])}" for i, h in enumerate(hits, 1))


def retrieval_messages(sub_question: str, hits: Sequence[Hit], max_chars: int) -> list[dict]:
    user = f"Sub-question: {as_data(sub_question)}\nPassages:\n{format_passages(hits, max_chars)}"
    return [{"role": "system", "content": RETRIEVAL_SYSTEM}, {"role": "user", "content": user}]


def conclusion_messages(question: str, notes: Sequence[tuple[str, str]]) -> list[dict]:
    user = f"Question: {as_data(question)}\n{_notes_block(notes)}"
    return [{"role": "system", "content": CONCLUSION_SYSTEM}, {"role": "user", "content": user}]


def single_agent_messages(question: str) -> list[dict]:
    return [
        {"role": "system", "content": SINGLE_AGENT_SYSTEM},
        {"role": "user", "content": f"Question: {as_data(question)}"},
    ]


def information_block(hits: Sequence[Hit], max_chars: int) -> str:
    """What the single agent sees after a search (Search-R1's <information> block), as inert data."""
    return f"\n<information>{format_passages(hits, max_chars)}</information>\n"
