"""Batched episodes of the central-agent harness and of the single-agent (Search-R1-style) reference.

Central topology, per turn: every live episode's central call is one generation batch; the sub-questions of
the episodes that delegated are one retriever batch and their retrieval sub-agent calls one generation batch.
After `max_turns` (or when every episode concluded) the conclusion calls of all episodes are one batch, the
same call whether the central agent concluded or not. Single-agent topology: one role ("agent") continues its
own transcript; each step is one batch; searches are one retriever batch and their results are appended as an
<information> block; after `max_turns` steps without an answer the answer is forced by appending "<answer>".

`Episode.cut_at_turn_limit`: the turn limit, not the policy, ended the episode. Central: the central agent took
`max_turns` turns and concluded in none of them (each asked a sub-question or was invalid); the harness never
asks it for a decision after its last turn, so with `max_turns` 2 an episode that asked two sub-questions,
exactly what a 2-hop question needs, is cut too. Single agent: `max_turns` steps without an answer (each a search
or invalid), then the forced answer. It counts episodes that used every turn without ending themselves, not
failures: whether a cut episode would have asked again is never observed.

Every role call is kept whole (prompt ids, generated ids, their log-probs, role, adapter), so a trainer builds
its per-role loss masks from the ids, never from re-tokenized text (`loss_mask`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from centralrl.compute import ModelShape, generation_flops
from centralrl.config import RoleTokens
from centralrl.harness import prompts as P
from centralrl.harness.engine import Generation, RolePolicy
from centralrl.harness.protocol import (
    INVALID_CENTRAL_FEEDBACK,
    INVALID_SEARCH_FEEDBACK,
    PREFILL,
    parse_answer,
    parse_central,
    parse_note,
    parse_single_agent,
)
from centralrl.retrieval.base import Retriever
from centralrl.schema import Question
from centralrl.seeding import derive_seed


@dataclass(frozen=True)
class RoleCall:
    """One generation by one role: what it saw (prompt ids) and what it wrote (completion ids, log-probs)."""

    role: str
    adapter: str | None
    turn: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    valid: bool

    def loss_mask(self) -> list[int]:
        """1 over the tokens this role generated, 0 over its prompt (question, passages, other roles' text)."""
        return [0] * len(self.prompt_ids) + [1] * len(self.completion_ids)


@dataclass
class Episode:
    question: Question
    calls: list[RoleCall] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    retrieved: list[list[str]] = field(default_factory=list)
    invalid_actions: int = 0
    turns: int = 0
    concluded: bool = False
    cut_at_turn_limit: bool = False  # the turn limit, not the policy, ended it (module docstring)
    feedback: str | None = None
    prediction: str = ""
    context_ids: list[int] = field(default_factory=list)  # single agent: its transcript after the chat prompt

    def record(self, policy: RolePolicy, role: str, turn: int, generation: Generation, valid: bool) -> None:
        self.calls.append(
            RoleCall(
                role,
                policy.adapters.get(role),
                turn,
                generation.prompt_ids,
                generation.completion_ids,
                generation.logprobs,
                generation.text,
                valid,
            )
        )

    def flops(self, shape: ModelShape) -> int:
        """Estimated FLOPs of generating this episode (every call's prompt and completion, padding excluded)."""
        return sum(generation_flops(shape, len(c.prompt_ids), len(c.completion_ids)) for c in self.calls)

    def tokens_by_role(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for call in self.calls:
            row = counts.setdefault(call.role, {"calls": 0, "prompt": 0, "generated": 0})
            row["calls"] += 1
            row["prompt"] += len(call.prompt_ids)
            row["generated"] += len(call.completion_ids)
        return counts


@dataclass(frozen=True)
class RunSettings:
    max_turns: int
    max_new_tokens: RoleTokens
    passage_chars: int
    top_k: int
    greedy: bool
    temperature: float = 1.0
    seed: int = 0
    greedy_roles: frozenset[str] = frozenset()  # in a sampled run, these roles decode greedily


def _generate(
    policy: RolePolicy, role: str, prompts: list[list[int]], budget: int, s: RunSettings, *where
) -> list[Generation]:
    greedy = s.greedy or role in s.greedy_roles
    return policy.generate(role, prompts, budget, greedy, s.temperature, derive_seed(s.seed, role, *where))


def _central_turn(
    episodes: list[Episode], policy: RolePolicy, retriever: Retriever, s: RunSettings, turn: int
) -> None:
    prompts = [
        policy.encode_chat(P.central_messages(e.question.question, e.notes, e.feedback), PREFILL["central"])
        for e in episodes
    ]
    asks: list[tuple[Episode, str]] = []
    for episode, generation in zip(episodes, _generate(policy, "central", prompts, s.max_new_tokens.central, s, turn)):
        action = parse_central(PREFILL["central"] + generation.text)
        episode.record(policy, "central", turn, generation, action.kind != "invalid")
        episode.turns += 1
        episode.feedback = None
        if action.kind == "conclude":
            episode.concluded = True
        elif action.kind == "delegate":
            asks.append((episode, action.text))
        else:
            episode.invalid_actions += 1
            episode.feedback = INVALID_CENTRAL_FEEDBACK
    if asks:
        _delegate(asks, policy, retriever, s, turn)


def _delegate(
    asks: list[tuple[Episode, str]], policy: RolePolicy, retriever: Retriever, s: RunSettings, turn: int
) -> None:
    with policy.clock.phase("retrieval"):
        results = retriever.search([question for _, question in asks], s.top_k)
    prompts = [
        policy.encode_chat(P.retrieval_messages(q, hits, s.passage_chars), PREFILL["retrieval"])
        for (_, q), hits in zip(asks, results)
    ]
    generations = _generate(policy, "retrieval", prompts, s.max_new_tokens.retrieval, s, turn)
    for (episode, question), hits, generation in zip(asks, results, generations):
        note, valid = parse_note(PREFILL["retrieval"] + generation.text)
        episode.record(policy, "retrieval", turn, generation, valid)
        episode.notes.append((question, note))
        episode.retrieved.append([hit.id for hit in hits])


def run_central(
    questions: Sequence[Question], policy: RolePolicy, retriever: Retriever, s: RunSettings
) -> list[Episode]:
    episodes = [Episode(q) for q in questions]
    for turn in range(s.max_turns):
        live = [e for e in episodes if not e.concluded]
        if not live:
            break
        _central_turn(live, policy, retriever, s, turn)
    for episode in episodes:
        episode.cut_at_turn_limit = not episode.concluded
    prompts = [
        policy.encode_chat(P.conclusion_messages(e.question.question, e.notes), PREFILL["conclusion"])
        for e in episodes
    ]
    for episode, generation in zip(episodes, _generate(policy, "conclusion", prompts, s.max_new_tokens.conclusion, s)):
        episode.prediction, valid = parse_answer(PREFILL["conclusion"] + generation.text)
        episode.record(policy, "conclusion", s.max_turns, generation, valid)
    return episodes


def _encode(policy: RolePolicy, text: str) -> list[int]:
    return policy.tokenizer.encode(text, add_special_tokens=False)


def _agent_step(
    episodes: list[Episode],
    base: dict[int, list[int]],
    policy: RolePolicy,
    retriever: Retriever,
    s: RunSettings,
    step: int,
) -> None:
    prompts = [base[id(e)] + e.context_ids for e in episodes]
    searches: list[tuple[Episode, str]] = []
    for episode, generation in zip(episodes, _generate(policy, "agent", prompts, s.max_new_tokens.agent, s, step)):
        action = parse_single_agent(generation.text)
        episode.record(policy, "agent", step, generation, action.kind != "invalid")
        episode.context_ids += _without_eos(policy, generation.completion_ids)
        episode.turns += 1
        if action.kind == "answer":
            episode.prediction, episode.concluded = action.text, True
        elif action.kind == "search":
            searches.append((episode, action.text))
        else:
            episode.invalid_actions += 1
            episode.context_ids += _encode(policy, f"\n{INVALID_SEARCH_FEEDBACK}\n")
    if searches:
        with policy.clock.phase("retrieval"):
            results = retriever.search([query for _, query in searches], s.top_k)
        for (episode, query), hits in zip(searches, results):
            episode.notes.append((query, P.format_passages(hits, s.passage_chars)))
            episode.retrieved.append([hit.id for hit in hits])
            episode.context_ids += _encode(policy, P.information_block(hits, s.passage_chars))


def _without_eos(policy: RolePolicy, ids: Sequence[int]) -> list[int]:
    """A reply as the transcript goes on from it: an invalid one that ended its turn with end-of-sequence continues
    with the feedback, in the same assistant turn, so the end-of-sequence is left out (the record keeps it: the
    model generated it), as Search-R1's rollout, which decodes replies without special tokens. Any of the
    policy's end-of-sequence ids counts (`RolePolicy.end_ids`)."""
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] in policy.end_ids else ids


def _force_answers(episodes: list[Episode], base: dict[int, list[int]], policy: RolePolicy, s: RunSettings) -> None:
    opener = _encode(policy, "\n<answer>")
    prompts = [base[id(e)] + e.context_ids + opener for e in episodes]
    for episode, generation in zip(
        episodes, _generate(policy, "agent", prompts, s.max_new_tokens.conclusion, s, "forced")
    ):
        episode.prediction, _ = parse_answer("<answer>" + generation.text)
        episode.record(policy, "agent", s.max_turns, generation, bool(episode.prediction))
        episode.cut_at_turn_limit = True


def run_single_agent(
    questions: Sequence[Question], policy: RolePolicy, retriever: Retriever, s: RunSettings
) -> list[Episode]:
    episodes = [Episode(q) for q in questions]
    base = {
        id(e): policy.encode_chat(P.single_agent_messages(e.question.question), PREFILL["agent"]) for e in episodes
    }
    for step in range(s.max_turns):
        live = [e for e in episodes if not e.concluded]
        if not live:
            break
        _agent_step(live, base, policy, retriever, s, step)
    unanswered = [e for e in episodes if not e.concluded]
    if unanswered:
        _force_answers(unanswered, base, policy, s)
    return episodes


TOPOLOGIES: dict[str, Callable[..., list[Episode]]] = {"central": run_central, "single_agent": run_single_agent}
