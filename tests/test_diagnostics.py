"""The diagnostic benchmarks on the smoke world's questions and bm25s index: headroom.py swaps perfect roles into
the real harness (a tiny random Qwen2 plays the start's roles); temperature.py finds which benchmarks' groups give
GRPO a signal; overfit.py trains on the same few questions every step."""

from __future__ import annotations

import sys

import pytest

from centralrl.config import Config
from centralrl.evaluation import benchmark_table, episode_record, markdown_table, transcript
from centralrl.harness.engine import RolePolicy
from centralrl.harness.episodes import run_central
from centralrl.metrics import f1
from centralrl.rl.warmstart import delegated_hops, evidence_note
from conftest import REPO
from test_harness import FROZEN, ScriptedPolicy, settings

sys.path.insert(0, str(REPO / "benchmarks"))
import headroom  # noqa: E402 (scripts of benchmarks/, found through the path above)
import overfit  # noqa: E402
import temperature  # noqa: E402


@pytest.fixture(scope="module")
def world(tiny_backbone, smoke_world):
    from centralrl.models.backbone import load_backbone

    model, tokenizer = load_backbone(tiny_backbone)
    two_hop = [q for q in smoke_world[0] if q.benchmark == "synth-2hop" and q.split == "test"][:3]
    one_hop = [q for q in smoke_world[0] if q.benchmark == "synth-1hop" and q.split == "test"][:3]
    return RolePolicy(model, tokenizer, FROZEN), one_hop + two_hop, smoke_world[2]


def play(world, perfect):
    policy, questions, index = world
    return run_central(
        questions, headroom.PerfectRoles(policy, questions, index, perfect, settings()), index, settings()
    )


def test_a_perfect_central_agent_asks_each_gold_hop_in_turn_and_the_start_answers_it(world):
    for episode in play(world, ["central"]):
        hops = [sub for sub, _ in delegated_hops(episode.question)]
        assert [asked for asked, _ in episode.notes] == hops  # one and two hops fit settings()'s two turns
        concludes = len(hops) < settings().max_turns  # else the harness forces the conclusion after the last turn
        roles = ["central", "retrieval"] * len(hops) + ["central"] * concludes + ["conclusion"]
        assert [c.role for c in episode.calls] == roles and episode.concluded == concludes
        written = [c for c in episode.calls if c.role != "central"]
        assert all(c.logprobs and any(c.logprobs) for c in written)  # the tiny model's own generations


def test_a_perfect_two_hop_episode_is_counted_as_cut_at_the_turn_limit_not_as_forced(world):
    # max_turns 2: a 2-hop question needs both turns for its sub-questions, so the harness never asks the perfect
    # central agent again; the evaluation says so by name ("forced" read as "ran out of turns" before)
    episodes = play(world, ["central"])
    records = [episode_record(e) for e in episodes]
    for episode, record in zip(episodes, records):
        hops = len(delegated_hops(episode.question))
        assert record["turns"] == settings().max_turns and len(record["sub_questions"]) == hops
        assert record["cut_at_turn_limit"] == (hops == 2) == (not episode.concluded)
        assert f"cut at the turn limit: {hops == 2}" in transcript(episode)
    table = benchmark_table(records)
    assert (
        table["synth-1hop"]["cut_at_turn_limit_rate"] == 0.0 and table["synth-2hop"]["cut_at_turn_limit_rate"] == 1.0
    )
    assert "forced_rate" not in table["synth-2hop"]
    header = markdown_table(table).splitlines()[0]
    assert "| turns | cut at turn limit | invalid/q |" in header and "forced" not in header


def test_a_perfect_reader_writes_the_evidence_note_of_what_was_retrieved(world):
    _, _, index = world
    for episode in play(world, ["central", "retrieval"]):
        for (asked, note), (_, hop) in zip(episode.notes, delegated_hops(episode.question)):
            hits = index.search([asked], settings().top_k)[0]
            assert note == (evidence_note(hop, hits, settings().passage_chars) or headroom.NOTHING_FOUND)


def test_all_three_perfect_answer_every_question_and_the_start_does_not(world):
    perfect = play(world, ["central", "retrieval", "conclusion"])
    assert [f1(e.prediction, e.question.golden_answers) for e in perfect] == [1.0] * 6
    start = play(world, [])
    assert sum(f1(e.prediction, e.question.golden_answers) for e in start) < 1.0  # a random model
    assert headroom.scores(perfect)["f1"] == 1.0 and set(headroom.scores(perfect)["f1_by_benchmark"]) == {
        "synth-1hop",
        "synth-2hop",
    }


def test_informative_groups_are_counted_per_benchmark(world):
    """Groups of 4: every other sample of a 1-hop question is answered right, every 2-hop one wrong, so the 1-hop
    groups all carry a signal and the 2-hop ones none."""
    policy, questions, index = world
    answers = iter(range(10**6))

    def conclusion(prompt: str) -> str:
        (question,) = [q for q in questions if q.question in prompt]
        right = question.benchmark == "synth-1hop" and next(answers) % 2 == 0
        return f"{question.golden_answers[0] if right else 'nobody'}</answer>"

    script = {"central": lambda prompt: "x</think><conclude></conclude>", "conclusion": conclusion}
    figures = temperature.measure(Config(), ScriptedPolicy(policy.tokenizer, script), index, questions, settings(), 4)
    assert figures["by_benchmark"] == {
        "synth-1hop": {"informative_share": 1.0, "reward_mean": 0.5},
        "synth-2hop": {"informative_share": 0.0, "reward_mean": 0.0},
    }
    assert (figures["informative_share"], figures["reward_mean"]) == (0.5, 0.25)


def test_overfit_on_a_fixed_pool_raises_its_reward_and_unseen_dev_questions_follow(tiny_backbone, tmp_path):
    import torch

    from centralrl.config import load_config
    from centralrl.config import role_adapters
    from centralrl.models.adapters import attach_adapters
    from centralrl.models.backbone import load_backbone
    from centralrl.retrieval.bm25 import Bm25sIndex
    from centralrl.schema import Passage
    from conftest import TOY, toy_questions, write_params

    grpo = {"questions_per_step": 1, "group_size": 8, "learning_rate": 0.05, "kl_coef": 0.0}
    cfg = load_config(write_params(tmp_path, {**TOY, "train": {"grpo": grpo}}))
    model, tokenizer = load_backbone(tiny_backbone)
    adapters = role_adapters(["conclusion"], "per_role")
    torch.manual_seed(0)
    policy = RolePolicy(attach_adapters(model, adapters, cfg.lora), tokenizer, adapters, 32)
    index = Bm25sIndex.build([Passage("p", "Nothing", "nothing to find here")], 1.2, 0.75, True)
    questions, dev = toy_questions(tokenizer)[:4], toy_questions(tokenizer)[4:8]
    rows = overfit.fit(cfg, policy, index, questions, 8, seed=0, dev=dev, dev_every=4)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6, 7, 8]  # step 0: the start's dev scores
    steps = rows[1:]
    assert all(sorted(r["reward_by_question"]) == [q.id for q in questions] for r in steps)  # all 4, each step
    print("mean reward per step:", [r["reward_mean"] for r in steps])
    first, last = overfit.reward_rise(steps)
    assert last > first + 0.25, [r["reward_mean"] for r in steps]
    scored = [r["step"] for r in rows if "dev.f1" in r]
    print("dev F1 at steps", scored, [r["dev.f1"] for r in rows if "dev.f1" in r])
    assert scored == [0, 4, 8]
    assert rows[-1]["dev.f1"] > rows[0]["dev.f1"]  # the 4 unseen questions ask the same: what it learned carries
