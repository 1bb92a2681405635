"""How far each role moved from the start, on tiny real runs: exact KL per position; batched movement equal to
one call at a time and to regenerating with the start; the evaluate stage's movement file and the report's "did
not move" statement when the sub-agents' LoRA B is zero (their outputs then equal the start's bit for bit)."""

from __future__ import annotations

import json

import math

import pytest
import torch

from centralrl.codedeps import folder_sha256
from centralrl.compare import arm_movement
from centralrl.config import load_config
from centralrl.harness.engine import RolePolicy
from centralrl.harness.episodes import RunSettings, run_central
from centralrl.io import read_json, write_json
from centralrl.config import role_adapters
from centralrl.models.adapters import acting_as, attach_adapters, save_adapters
from centralrl.models.backbone import content_sha256, load_backbone
from centralrl.movement import call_movement, position_kl
from centralrl.report import movement_notes, movement_section

JOINT = ("central", "retrieval", "conclusion")
STATEMENT = "the sub-agents did not move; this compares central against central"


def _joint_model(start, lora, moved: tuple[str, ...]):
    """The start with joint's three adapters; the `moved` ones get a random LoRA B, the others keep peft's B = 0."""
    model, tokenizer = load_backbone(start)
    adapters = role_adapters(JOINT, "per_role")
    model = attach_adapters(model, adapters, lora)
    generator = torch.Generator().manual_seed(0)
    for name, parameter in sorted(model.named_parameters()):
        if "lora_B" in name and any(f".{role}." in name for role in moved):
            parameter.data = 0.5 * torch.randn(parameter.shape, generator=generator)
    return model.eval(), tokenizer, adapters


def test_position_kl_by_hand():
    # p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3)
    p, q = torch.log(torch.tensor([0.5, 0.5])), torch.log(torch.tensor([0.25, 0.75]))
    assert float(position_kl(p, q)) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), rel=1e-6)
    assert float(position_kl(q, q)) == 0.0


def test_batched_movement_equals_each_call_alone_and_regenerating(tiny_backbone, smoke_world):
    """Right-padded batches (rows of similar length together, their shared prefix run once, the output head only at
    completion positions) give each call's KL and argmax decisions as a plain forward pass of it alone; "changed"
    is what regenerating greedily with the start finds."""
    from centralrl.config import LoraConfig, RoleTokens

    model, tokenizer, adapters = _joint_model(tiny_backbone, LoraConfig(r=8, alpha=16), ("central",))
    questions = [q for q in smoke_world[0] if q.split == "test"][:6]
    s = RunSettings(2, RoleTokens(central=12, retrieval=12, conclusion=6, agent=12), 200, 2, greedy=True)
    episodes = run_central(questions, RolePolicy(model, tokenizer, adapters), smoke_world[2], s)
    calls = [c for e in episodes for c in e.calls]
    assert len({len(c.prompt_ids) for c in calls}) > 1 and len({len(c.completion_ids) for c in calls}) > 1

    def alone(call) -> tuple[bool, float]:
        ids = torch.tensor([call.prompt_ids + call.completion_ids])
        logits = {}
        for name in (call.adapter, None):
            with torch.no_grad(), acting_as(model, name):
                logits[name] = model(input_ids=ids).logits[0, len(call.prompt_ids) - 1 : -1]
        changed = bool((logits[call.adapter].argmax(-1) != logits[None].argmax(-1)).any())
        return changed, float(position_kl(logits[call.adapter], logits[None]).mean())

    batched = call_movement(model, calls, tokenizer.pad_token_id, batch_size=4)
    expected = [alone(c) for c in calls]
    assert [flag for flag, _ in batched] == [flag for flag, _ in expected]
    assert [kl for _, kl in batched] == pytest.approx([kl for _, kl in expected], abs=1e-5)
    assert [kl > 0 for _, kl in batched] == [c.role == "central" for c in calls]  # B = 0 elsewhere: KL exactly 0

    start = RolePolicy(model, tokenizer, dict.fromkeys(adapters))
    regenerated = [start.generate(c.role, [c.prompt_ids], len(c.completion_ids), greedy=True)[0] for c in calls]
    assert [flag for flag, _ in batched] == [g.completion_ids != c.completion_ids for g, c in zip(regenerated, calls)]
    assert 0 < sum(flag for flag, _ in batched) < len(calls)  # the central calls changed, the others did not


def _inputs(folder, data) -> list[str]:
    """The evaluate stage's inputs in the smoke run: the start, the index, the test questions."""
    return ["--model", str(folder / "start"), "--index", str(folder / "index"), "--questions", str(data["test"])]


def _evaluate_cell(folder, params, data, moved: tuple[str, ...], out: str) -> dict:
    """The evaluate stage on one trained cell of joint whose `moved` adapters differ from the start, every budget
    cut at step 1 (so evaluated once, from the first budget's folder); the movement of that cut."""
    from stages import evaluate

    cfg = load_config(params)
    model, _, _ = _joint_model(folder / "start", cfg.lora, moved)
    first = sorted(cfg.budgets)[0]
    adapters = folder / out / "adapters"
    for budget in cfg.budgets:  # every cut at the same step: the same adapters in each budget's folder
        save_adapters(model, adapters / budget)
    cuts = {
        name: {"step": 1, "budget": budget.model_dump(exclude_none=True), "adapters": folder_sha256(adapters / name)}
        for name, budget in cfg.budgets.items()
    }
    cell = {"arm": "joint", "seed": 0, "backbone": "main", "start": content_sha256(folder / "start")}
    write_json(folder / out / "budgets.json", {"cell": cell, "cuts": cuts})
    evaluate.main(
        [
            "--params",
            str(params),
            "--arm",
            "joint",
            "--seed",
            "0",
            "--backbone",
            "main",
            *_inputs(folder, data),
            "--adapters",
            str(adapters),
            "--budgets",
            str(folder / out / "budgets.json"),
            "--out",
            str(folder / out / "eval"),
            "--metrics",
            str(folder / out / "metrics.json"),
            "--movement",
            str(folder / out / "movement.json"),
        ]
    )
    return read_json(folder / out / "movement.json")[first]


@pytest.mark.parametrize(
    "moved", [(), ("central",), ("central", "conclusion")], ids=["all_zero", "sub_agents_zero", "moved"]
)
def test_the_report_says_when_the_sub_agents_did_not_move(smoke_run, moved):
    folder, params, data = smoke_run
    movement = _evaluate_cell(folder, params, data, moved, f"movement-{'-'.join(moved)}")
    questions = sum(1 for line in data["test"].read_text().splitlines() if line.strip())

    assert movement["conclusion"]["calls"] == questions  # every episode concludes once
    for role in ("central", "conclusion"):
        if role in moved:
            assert movement[role]["changed"] > 0 and movement[role]["kl"] > 0
        else:  # B = 0: the same function as the start, so the same bytes out and an exact 0 KL
            assert movement[role]["changed"] == 0 and movement[role]["kl"] == 0.0

    moved_arm = arm_movement(load_config(params).arm("joint"), {0: movement}, max_kl=2.0)
    result = {"backbones": {"main": {"budgets": {"cut": {"movement": {"joint": moved_arm}}}}}}
    notes = "\n".join(movement_notes(result))
    assert (STATEMENT in notes) == ("conclusion" not in moved)
    still = "in seed(s) 0 no trained role (central, retrieval, conclusion) changed a greedy output"
    assert (still in notes) == (not moved)
    table = "\n".join(movement_section(result))
    conclusion_share = f"{100 * movement['conclusion']['changed_share']:.0f}%"
    assert f"| main | cut | joint | conclusion | {questions} | s0: {conclusion_share} |" in table


def test_the_report_says_central_against_central_only_of_the_seeds_whose_sub_agents_did_not_move(smoke_params):
    """Two seeds of joint: in seed 0 only central moved, in seed 1 the conclusion did too. The bold statement (no
    seed's sub-agents moved) is not made; the per-seed sentence names seed 0 alone."""

    def movement(changed: dict[str, int]) -> dict:
        return {
            role: {"calls": 10, "changed": changed.get(role, 0), "changed_share": changed.get(role, 0) / 10, "kl": 0.0}
            for role in JOINT
        }

    seeds = {0: movement({"central": 3}), 1: movement({"central": 3, "conclusion": 2})}
    moved_arm = arm_movement(load_config(smoke_params).arm("joint"), seeds, max_kl=2.0)
    assert moved_arm["unmoved_seeds"] == [0] and moved_arm["still_seeds"] == [] and moved_arm["past_max_kl"] == []
    result = {"backbones": {"main": {"budgets": {"cut": {"movement": {"joint": moved_arm}}}}}}
    assert movement_notes(result) == [
        "- main, cut, joint: in seed(s) 0 the sub-agents (retrieval, conclusion) did not move; those seeds compare "
        "central against central.",
        "",
    ]


def test_the_report_says_when_a_seed_never_called_a_role(smoke_params):
    """A central agent that stopped delegating (realqa's joint seed 0: sub-questions per episode 0.81 -> 0) left
    its retrieval agent no test call; the movement table showed "-" and nothing said why."""
    seeds = {
        seed: {
            role: {"calls": calls, "changed": 0, "changed_share": 0.0 if calls else None, "kl": 0.0 if calls else None}
            for role, calls in zip(JOINT, counts, strict=True)
        }
        for seed, counts in {0: (10, 0, 10), 1: (20, 10, 10)}.items()
    }
    notes = movement_notes(
        {
            "backbones": {
                "main": {
                    "budgets": {
                        "cut": {
                            "movement": {
                                "joint": arm_movement(load_config(smoke_params).arm("joint"), seeds, max_kl=2.0)
                            }
                        }
                    }
                }
            }
        }
    )
    uncalled = [line for line in notes if "never called" in line]
    assert uncalled == [
        "- main, cut, joint: in seed 0 the retrieval agent was never called on the test questions: that seed's "
        "harness ran without it, and its movement is not measured."
    ]


def test_the_report_flags_a_final_policy_past_max_kl_which_the_training_guard_never_measures(smoke_params):
    """The guard measures the policy a step starts from, so the last update's policy is first measured by the
    evaluate stage: a trained role past `train.health.max_kl` there is named; a frozen one's KL is never checked."""
    seeds = {
        seed: {
            role: {"calls": 10, "changed": 5, "changed_share": 0.5, "kl": kl}
            for role, kl in zip(JOINT, ({0: (0.1, 2.5, 0.2), 1: (2.0, 0.1, 0.1)}[seed]), strict=True)
        }
        for seed in (0, 1)
    }
    moved_arm = arm_movement(load_config(smoke_params).arm("joint"), seeds, max_kl=2.0)
    assert moved_arm["past_max_kl"] == [{"seed": 0, "role": "retrieval", "kl": 2.5}]  # 2.0 is at the limit, not past
    frozen = arm_movement(load_config(smoke_params).arm("central_only"), seeds, max_kl=2.0)
    assert frozen["past_max_kl"] == []  # central_only trains only the central agent, at 0.1 and 2.0
    result = {"backbones": {"main": {"budgets": {"cut": {"movement": {"joint": moved_arm}}}}}}
    assert movement_notes(result)[0] == (
        "- **main, cut, joint: seed 0's retrieval agent ended 2.5 nats per token from the start on the test calls "
        "(exact KL), past train.health.max_kl**: the training guard estimates the KL (k3) on training samples of the "
        "policy each measured step starts from, and never measures the one the last update made."
    )


def test_the_single_agent_reference_evaluates_through_the_stage(smoke_run, capfd):
    """The pipeline test runs the base reference only; this is the other topology's stage run, in-process. Its
    progress bar counts the role calls the records hold (it was one step per chunk: 0/1 for minutes)."""
    from stages import evaluate

    folder, params, data = smoke_run
    out = folder / "single_agent"
    evaluate.main(
        [
            *("--params", str(params), "--reference", "single_agent", "--backbone", "main"),
            *_inputs(folder, data),
            *("--out", str(out / "eval"), "--metrics", str(out / "metrics.json")),
        ]
    )
    questions = sum(1 for line in data["test"].read_text().splitlines() if line.strip())
    records = (out / "eval" / "records.jsonl").read_text().splitlines()
    assert len(records) == questions
    assert all(set(json.loads(r)["tokens"]) == {"agent"} for r in records)  # the single agent works alone
    assert "f1" in json.dumps(read_json(out / "metrics.json"))
    calls = sum(json.loads(r)["tokens"]["agent"]["calls"] for r in records)
    assert f"{calls}/{calls} [" in capfd.readouterr().err


def test_an_index_of_another_corpus_is_refused_before_the_model_loads(smoke_run, tmp_path):
    """The stage is not given the corpus, so an index built from other passages was searched without a word."""
    from centralrl.errors import RetrievalError
    from centralrl.retrieval import build_index, save_index
    from centralrl.schema import read_passages, read_questions
    from stages import evaluate

    folder, params, data = smoke_run
    cfg = load_config(params).retrieval
    gold = {pid for q in read_questions(data["test"]) for pid in q.supporting_passage_ids}
    others = [p for p in read_passages(data["corpus"]) if p.id not in gold]
    save_index(build_index(others, cfg), cfg, len(others), tmp_path / "index")
    inputs = _inputs(folder, data)
    inputs[inputs.index("--index") + 1] = str(tmp_path / "index")
    with pytest.raises(RetrievalError, match=rf"of {data['test']} are not in this index .*another corpus"):
        evaluate.main(
            [
                *("--params", str(params), "--reference", "base", "--backbone", "main"),
                *inputs,
                *("--out", str(tmp_path / "eval"), "--metrics", str(tmp_path / "metrics.json")),
            ]
        )
    assert not (tmp_path / "eval").exists()


def test_a_tracking_server_gone_after_the_evaluation_leaves_its_outputs_written(smoke_run, tmp_path):
    """The runs are logged once the outputs are whole: a server that stopped answering failed the stage, and its
    temporary folder took every record already evaluated with it."""
    from centralrl.errors import TrackingError
    from centralrl.services import free_port
    from conftest import TOY, write_params
    from stages import evaluate

    folder, _, data = smoke_run
    params = write_params(tmp_path, {"tracking": {"uri": f"http://127.0.0.1:{free_port()}"}, **TOY})  # no server
    kept = "the evaluation is written and kept .*, only its MLflow runs are missing"
    with pytest.raises(TrackingError, match=f"no MLflow server answers.*; {kept}"):
        _evaluate_cell(folder, params, data, ("central",), "gone")
    budgets = sorted(load_config(params).budgets)
    assert sorted(read_json(folder / "gone" / "metrics.json")) == sorted(read_json(folder / "gone" / "movement.json"))
    assert sorted(read_json(folder / "gone" / "metrics.json")) == budgets
    questions = len(data["test"].read_text().splitlines())
    for budget in budgets:
        assert len((folder / "gone" / "eval" / budget / "records.jsonl").read_text().splitlines()) == questions
    with pytest.raises(TrackingError, match=kept):
        evaluate.main(
            [
                *("--params", str(params), "--reference", "base", "--backbone", "main"),
                *_inputs(folder, data),
                *("--out", str(tmp_path / "eval"), "--metrics", str(tmp_path / "metrics.json")),
            ]
        )
    assert len((tmp_path / "eval" / "records.jsonl").read_text().splitlines()) == questions
    assert "f1" in json.dumps(read_json(tmp_path / "metrics.json"))


def test_the_movement_benchmark_finds_the_same_movement_with_and_without_the_shared_prefix(smoke_run):
    """benchmarks/movement.py on a joint cut whose central adapter moved: both variants measure the same calls
    alike (the prefix is an order of summation, not another computation)."""
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    import movement as benchmark  # benchmarks/movement.py, found through the path above

    folder, params, data = smoke_run
    model, _, _ = _joint_model(folder / "start", load_config(params).lora, ("central",))
    save_adapters(model, folder / "bench-adapters")
    out = folder / "movement-bench.json"
    args = [*_inputs(folder, data), "--params", str(params), "--adapters", str(folder / "bench-adapters")]
    args += ["--arm", "joint", "--repeats", "1", "--threads", "1", "--out", str(out)]
    benchmark.main(benchmark.arguments(args))
    figures = read_json(out)
    assert figures["calls"] > 0 and 0 < figures["mean_shared_prefix_tokens"] < figures["mean_prompt_tokens"]
    assert figures["changed_flags_disagreeing"] == 0 and figures["max_abs_kl_difference"] < 1e-4
    assert 0 < figures["changed"] <= figures["calls"]


def test_the_role_swap_benchmark_puts_back_the_start_role_by_role(smoke_run):
    """benchmarks/role_swap.py on a joint cut whose conclusion adapter alone moved: every subset without the
    conclusion agent plays the start's episodes exactly, every subset with it the cut's answers."""
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    import role_swap  # benchmarks/role_swap.py, found through the path above

    folder, params, data = smoke_run
    model, _, _ = _joint_model(folder / "start", load_config(params).lora, ("conclusion",))
    save_adapters(model, folder / "swap-adapters")
    out = folder / "role-swap.json"
    args = ["--model", str(folder / "start"), "--index", str(folder / "index"), "--train", str(data["train"])]
    args += ["--params", str(params), "--adapters", str(folder / "swap-adapters"), "--arm", "joint"]
    role_swap.main(role_swap.arguments([*args, "--threads", "1", "--out", str(out)]))
    figures = read_json(out)
    names = ["start", "central", "retrieval", "conclusion", "central+retrieval", "central+conclusion"]
    names += ["retrieval+conclusion", "central+retrieval+conclusion"]
    assert [name for name in figures if name in names] == names and set(figures["against_start"]) == set(names[1:])
    answers = {name: [e["prediction"] for e in figures[name]["episodes"]] for name in names}
    notes = {name: [e["notes"] for e in figures[name]["episodes"]] for name in names}
    assert all(notes[name] == notes["start"] for name in names)  # central and retrieval never moved
    with_conclusion = [name for name in names if "conclusion" in name]
    assert all(answers[name] == answers["start"] for name in names if name not in with_conclusion)
    assert all(answers[name] == answers["conclusion"] for name in with_conclusion)
    assert answers["conclusion"] != answers["start"]
    unmoved = {"difference": 0.0, "low": 0.0, "high": 0.0, "p": 1.0}  # paired over the questions: no question moved
    assert all(figures["against_start"][name] == unmoved for name in names[1:] if name not in with_conclusion)
    moved = figures["against_start"]["conclusion"]
    assert moved["difference"] == pytest.approx(figures["conclusion"]["f1"] - figures["start"]["f1"], abs=1e-4)
    assert moved["low"] <= moved["difference"] <= moved["high"] and 0 < moved["p"] <= 1


def test_the_role_swap_benchmark_plays_the_training_questions_neither_the_warm_start_nor_a_history_drew(smoke_run):
    """--unseen: the smoke world's training questions outside the dev split, less the warm start's (as many as
    `build_traces` trains on) and a history's; --single: the start, each role alone and the whole arm."""
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    import role_swap  # benchmarks/role_swap.py, found through the path above

    from centralrl.data.split import split_dev
    from centralrl.io import write_jsonl
    from centralrl.retrieval import open_retriever
    from centralrl.rl.warmstart import build_traces
    from centralrl.schema import read_questions

    folder, params, _ = smoke_run
    cfg = load_config(params)
    train = folder / "train.jsonl"  # the smoke world's own training questions, with decompositions
    training, _ = split_dev(read_questions(train, split="train"), cfg.train.dev, str(train))
    model, tokenizer, adapters = _joint_model(folder / "start", cfg.lora, ("conclusion",))
    save_adapters(model, folder / "unseen-adapters")
    drawn = [training[-1].id, training[-2].id]
    write_jsonl(folder / "history.jsonl", [{"step": 1, "question_rewards": {q: 0.5 for q in drawn}}])
    out = folder / "role-swap-unseen.json"
    args = ["--model", str(folder / "start"), "--index", str(folder / "index"), "--train", str(train)]
    args += ["--params", str(params), "--adapters", str(folder / "unseen-adapters"), "--arm", "joint", "--single"]
    args += ["--unseen", str(folder / "history.jsonl"), "--threads", "1", "--out", str(out)]
    role_swap.main(role_swap.arguments(args))
    figures = read_json(out)
    names = ["start", "central", "retrieval", "conclusion", "central+retrieval+conclusion"]
    assert [name for name in figures if name in names] == names and figures["questions"] == "unseen"
    played = {e["id"] for e in figures["start"]["episodes"]}
    policy = RolePolicy(model, tokenizer, dict.fromkeys(adapters))
    retriever = open_retriever(cfg.retrieval, folder / "index", questions=(training, str(train)))
    below = cfg.harness.max_turns if cfg.warmstart.follow_up_notes else 0
    wanted, top_k, chars = cfg.warmstart.questions, cfg.retrieval.top_k, cfg.harness.passage_chars
    warm = build_traces(training, wanted, retriever, top_k, chars, policy, follow_ups_below=below)[1]
    assert 0 < warm["questions"] and not played & set(drawn)
    assert len(played) == figures["n_questions"] == len(training) - warm["questions"] - len(drawn)
