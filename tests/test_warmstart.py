"""The warm start on tiny real runs: oracle traces from the smoke world, replayed through the real harness,
a few LoRA steps on the tiny Qwen2, the merged checkpoint and the stage."""

from __future__ import annotations

import json

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from centralrl.compute import PhaseClock
from centralrl.config import LoraConfig, RoleTokens, WarmstartConfig, load_config
from centralrl.errors import BackboneError, ConfigError, DataError
from centralrl.harness.engine import Generation, RolePolicy
from centralrl.harness.episodes import RunSettings, run_central
from centralrl.io import write_jsonl
from centralrl.models.backbone import content_sha256, load_backbone
from centralrl.retrieval import build_index, save_index
from centralrl.retrieval.bm25 import Bm25sIndex
from centralrl.rl.health import TrainingDiverged
from centralrl.rl.warmstart import (
    IGNORE,
    build_traces,
    collate,
    delegated_hops,
    follow_up,
    oracle_traces,
    parse_trace,
    supervised_finetune,
    target_loss,
    warmstart,
)
from centralrl.schema import Passage, Question, SubQuestion
from stages import warmstart as stage
from conftest import write_params

FROZEN = {"central": None, "retrieval": None, "conclusion": None, "agent": None}
TOP_K, CHARS = 3, 200


@pytest.fixture(scope="module")
def backbone(tiny_backbone):
    return load_backbone(tiny_backbone)


@pytest.fixture(scope="module")
def policy(backbone):
    return RolePolicy(*backbone, FROZEN)


@pytest.fixture(scope="module")
def train_questions(smoke_world):
    return [q for q in smoke_world[0] if q.split == "train"]


def one_per_benchmark(questions):
    seen = {}
    for q in questions:
        seen.setdefault(q.benchmark, q)
    return list(seen.values())


class ReplayPolicy(RolePolicy):
    """Stands in for the language model: each call returns the next trace's target, and records the prompt
    the harness built, so the harness's own prompts can be compared with the traces'."""

    def __init__(self, tokenizer, traces):
        self.tokenizer, self.adapters, self.queue, self.seen = tokenizer, dict(FROZEN), list(traces), []
        self.clock = PhaseClock()

    def generate(self, role, prompts, max_new_tokens, greedy, temperature=1.0, seed=0):
        replies = []
        for prompt in prompts:
            trace = self.queue.pop(0)
            assert trace.role == role, f"the harness called {role}, the next trace is {trace.role}"
            self.seen.append((role, tuple(prompt)))
            ids = trace.target_ids
            replies.append(
                Generation(
                    tuple(prompt), ids, (0.0,) * len(ids), self.tokenizer.decode(list(ids), skip_special_tokens=True)
                )
            )
        return replies


def test_traces_parse_to_the_intended_actions(policy, smoke_world, train_questions):
    tokenizer = policy.tokenizer
    for question in one_per_benchmark(train_questions):
        traces = oracle_traces(question, smoke_world[2], TOP_K, CHARS, policy)
        hops = delegated_hops(question)
        comparison = "comparison" in question.benchmark
        assert len(hops) == len(question.decomposition) - comparison  # a comparison's last step is not delegated
        parsed = [parse_trace(t, tokenizer) for t in traces]
        assert [kind for kind, _ in parsed] == ["delegate", "note"] * len(hops) + ["conclude", "answer"]
        assert [text for kind, text in parsed if kind == "delegate"] == [sub for sub, _ in hops]
        notes = [text for kind, text in parsed if kind == "note"]
        assert all(f" {hop.answer.lower()}" in f" {note.lower()}" for note, (_, hop) in zip(notes, hops))
        assert parsed[-1] == ("answer", question.golden_answers[0])
        assert all(t.target_ids[-1] == tokenizer.eos_token_id for t in traces)
        assert all(tokenizer.eos_token_id not in t.target_ids[:-1] for t in traces)


def test_counted_plans_state_the_facts_needed_and_held_on_the_same_prompts(policy, smoke_world, train_questions):
    for question in one_per_benchmark(train_questions):
        fixed = oracle_traces(question, smoke_world[2], TOP_K, CHARS, policy)
        counted = oracle_traces(question, smoke_world[2], TOP_K, CHARS, policy, counted=True)
        hops = len(delegated_hops(question))
        plans = [policy.tokenizer.decode(t.target_ids).split("</think>")[0] for t in counted if t.role == "central"]
        needs = f"The question needs {hops} fact{'s' if hops > 1 else ''}; the notes hold "
        assert len(plans) == hops + 1 and all(plan.startswith(f"{needs}{held}") for held, plan in enumerate(plans))
        asks = [plan.endswith(f"so I ask for fact {held + 1}.") for held, plan in enumerate(plans)]
        assert asks == [True] * hops + [False]
        assert plans[-1].endswith(f"hold {hops}, so I conclude.")
        assert [t.prompt_ids for t in counted] == [t.prompt_ids for t in fixed]  # a plan is never shown to a role
        assert [parse_trace(t, policy.tokenizer) for t in counted] == [parse_trace(t, policy.tokenizer) for t in fixed]


def test_traces_replayed_through_the_harness_see_the_harness_prompts(policy, smoke_world, train_questions):
    for question in one_per_benchmark(train_questions):
        traces = oracle_traces(question, smoke_world[2], TOP_K, CHARS, policy)
        replay = ReplayPolicy(policy.tokenizer, traces)
        hops = len(delegated_hops(question))
        s = RunSettings(hops + 1, RoleTokens(), passage_chars=CHARS, top_k=TOP_K, greedy=True)
        [episode] = run_central([question], replay, smoke_world[2], s)
        assert replay.seen == [(t.role, t.prompt_ids) for t in traces]  # every role, every turn, token for token
        assert episode.concluded and not episode.cut_at_turn_limit and episode.invalid_actions == 0
        assert episode.prediction == question.golden_answers[0]
        assert [sub for sub, _ in episode.notes] == [t.content for t in traces if t.action == "delegate"]


def test_musique_style_hops_become_self_contained_and_unseen_answers_skip_the_question(policy):
    passages = [
        Passage("a", "Velmar Gate", "The Velmar Gate is a film. It was directed by Ona Brill."),
        Passage("b", "Ona Brill", "Ona Brill is a director. She was born in Telmarra."),
    ]
    index = Bm25sIndex.build(passages, 1.2, 0.75, True)
    steps = (
        SubQuestion("The Velmar Gate >> director", "Ona Brill", ("a",)),
        SubQuestion("Where was #1 born?", "Telmarra", ("b",)),
    )
    question = Question(
        "m1", "Where was the director of The Velmar Gate born?", ("Telmarra",), "musique", "train", (), steps
    )
    traces = oracle_traces(question, index, 2, CHARS, policy)
    delegated = [parse_trace(t, policy.tokenizer)[1] for t in traces if t.role == "central"][:2]
    assert delegated == ["What is the director of The Velmar Gate?", "Where was Ona Brill born?"]
    assert [t.content for t in traces if t.role == "retrieval"] == [
        "It was directed by Ona Brill.",
        "She was born in Telmarra.",
    ]
    unseen = Question(
        "m2",
        question.question,
        ("Oshvania",),
        "musique",
        "train",
        (),
        (steps[0], SubQuestion("In which country is #1's birthplace?", "Oshvania", ("b",))),
    )
    assert oracle_traces(unseen, index, 2, CHARS, policy) == []


def test_only_target_tokens_are_trained(backbone, policy, smoke_world, train_questions):
    traces = oracle_traces(train_questions[0], smoke_world[2], TOP_K, CHARS, policy)
    ids, mask, labels = collate(traces, pad_id=policy.tokenizer.pad_token_id)
    for row, t in enumerate(traces):
        n_prompt, n_target = len(t.prompt_ids), len(t.target_ids)
        assert labels[row, :n_prompt].eq(IGNORE).all() and labels[row, n_prompt + n_target :].eq(IGNORE).all()
        assert labels[row, n_prompt : n_prompt + n_target].tolist() == list(t.target_ids)
        assert mask[row].sum().item() == n_prompt + n_target
    # The loss is the causal LM's own loss on target tokens (decoder, then the head where a target is predicted) ...
    model = backbone[0]
    with torch.no_grad():
        hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = target_loss(hidden, model.get_output_embeddings(), labels)
        reference = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE
        )
        assert torch.allclose(loss, reference, atol=1e-5)
        # ... blind to what the positions before prompt tokens predict, and moved by the target positions.
        predicts_prompt = torch.zeros_like(labels, dtype=torch.bool)
        predicts_prompt[:, :-1] = labels[:, 1:].eq(IGNORE)
        noise = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(0))
        head = model.get_output_embeddings()
        assert torch.equal(target_loss(hidden + 10 * predicts_prompt.unsqueeze(-1) * noise, head, labels), loss)
        assert not torch.allclose(target_loss(hidden + (~predicts_prompt).unsqueeze(-1) * noise, head, labels), loss)


def test_a_few_steps_lower_the_training_loss(tiny_backbone, policy, smoke_world, train_questions):
    traces, _ = build_traces(train_questions, 2, smoke_world[2], TOP_K, CHARS, policy)
    model, tokenizer = load_backbone(tiny_backbone)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = WarmstartConfig(epochs=6, learning_rate=3e-3, micro_batch_size=len(traces))  # one batch: same data each step
    merged, stats = supervised_finetune(model, tokenizer, traces, cfg, LoraConfig())
    # Measured: 7.647 -> 7.425 over 6 steps (log 2048 = 7.62: the random model starts near uniform).
    assert stats["steps"] == 6 and stats["last_loss"] < stats["first_loss"] - 0.1
    assert stats["trained_tokens"] == 6 * sum(len(t.target_ids) for t in traces)
    assert type(merged).__name__ == "Qwen2ForCausalLM" and not any("lora" in k for k in merged.state_dict())
    assert any(not torch.equal(before[k], v) for k, v in merged.state_dict().items())


@pytest.mark.parametrize(
    "schedule, factors", [("constant", [1, 1, 1, 1]), ("linear", [1, 0.75, 0.5, 0.25])], ids=["constant", "linear"]
)
def test_the_learning_rate_follows_warmstart_lr_schedule(
    tiny_backbone, policy, smoke_world, train_questions, schedule, factors
):
    traces, _ = build_traces(train_questions, 2, smoke_world[2], TOP_K, CHARS, policy)
    model, tokenizer = load_backbone(tiny_backbone)
    cfg = WarmstartConfig(epochs=4, learning_rate=1e-3, lr_schedule=schedule, micro_batch_size=len(traces))
    used = []  # the rate each optimizer step runs with, read just before it
    hook = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: used.append(optimizer.param_groups[0]["lr"])
    )
    try:
        supervised_finetune(model, tokenizer, traces, cfg, LoraConfig())
    finally:
        hook.remove()
    assert used == pytest.approx([1e-3 * f for f in factors])


def test_a_warm_start_whose_loss_is_not_finite_stops_naming_the_step(
    tiny_backbone, policy, smoke_world, train_questions
):
    traces, _ = build_traces(train_questions, 2, smoke_world[2], TOP_K, CHARS, policy)
    model, tokenizer = load_backbone(tiny_backbone)
    with torch.no_grad():
        model.get_output_embeddings().weight.fill_(float("inf"))  # diverged weights: every loss is NaN
    cfg = WarmstartConfig(epochs=1, micro_batch_size=len(traces))
    with pytest.raises(TrainingDiverged, match="warm start step 1/1: loss is nan; the start is not written"):
        supervised_finetune(model, tokenizer, traces, cfg, LoraConfig())


def test_activation_checkpointing_trains_the_same_warm_start(tiny_backbone, policy, smoke_world, train_questions):
    traces, _ = build_traces(train_questions, 2, smoke_world[2], TOP_K, CHARS, policy)
    runs = []
    for enabled in (False, True):
        model, tokenizer = load_backbone(tiny_backbone)
        cfg = WarmstartConfig(epochs=2, micro_batch_size=2, precision="float32", activation_checkpointing=enabled)
        merged, stats = supervised_finetune(model, tokenizer, traces, cfg, LoraConfig())
        runs.append((stats["losses"], merged.state_dict()))
    (losses, weights), (checkpointed_losses, checkpointed_weights) = runs
    assert checkpointed_losses == pytest.approx(losses, rel=1e-6)
    for name, tensor in weights.items():
        torch.testing.assert_close(checkpointed_weights[name], tensor, atol=1e-6, rtol=1e-5, msg=name)


def test_no_decomposition_is_a_clear_error(policy, smoke_world, train_questions):
    plain = [Question(q.id, q.question, q.golden_answers, "hotpotqa", "train") for q in train_questions[:3]]
    with pytest.raises(DataError, match="synthetic world and MuSiQue"):
        build_traces(plain, 4, smoke_world[2], TOP_K, CHARS, policy)


def test_a_follow_up_note_trains_the_conclusion_to_answer_from_the_note_that_answers(
    policy, smoke_world, train_questions
):
    hops = [(q.id, sub, hop) for q in train_questions for sub, hop in delegated_hops(q)]
    one_hop = [q for q in train_questions if len(delegated_hops(q)) == 1 and follow_up(q, hops)]
    assert one_hop, "the smoke world has 1-hop questions whose answer another question asks about"
    question = one_hop[0]
    sub, hop = follow_up(question, hops)
    plain = oracle_traces(question, smoke_world[2], TOP_K, CHARS, policy)
    traces = oracle_traces(question, smoke_world[2], TOP_K, CHARS, policy, after=(sub, hop))
    assert traces[: len(plain)] == plain and len(traces) == len(plain) + 1  # one more conclusion trace
    extra = policy.tokenizer.decode(list(traces[-1].prompt_ids))
    assert question.golden_answers[0] in sub and sub in extra and "2. Sub-question:" in extra
    assert parse_trace(traces[-1], policy.tokenizer) == ("answer", question.golden_answers[0])
    wanted = len(train_questions)
    base, counts = build_traces(train_questions, wanted, smoke_world[2], TOP_K, CHARS, policy)
    more, with_follow_ups = build_traces(
        train_questions, wanted, smoke_world[2], TOP_K, CHARS, policy, follow_ups_below=2
    )
    conclusions = [c["traces_by_role"]["conclusion"] - c["questions"] for c in (counts, with_follow_ups)]
    assert conclusions[0] == 0 < conclusions[1] == len(more) - len(base)  # one more conclusion trace per follow-up
    assert [t for t in more if t.role != "conclusion"] == [t for t in base if t.role != "conclusion"]


@pytest.fixture(scope="module")
def stage_inputs(tmp_path_factory, smoke_world):
    folder = tmp_path_factory.mktemp("warmstart")
    params = write_params(folder, {"warmstart": {"questions": 4}})
    cfg = load_config(params)
    questions, passages, _ = smoke_world
    save_index(build_index(passages, cfg.retrieval), cfg.retrieval, len(passages), folder / "index")
    write_jsonl(folder / "train.jsonl", (q.to_json() for q in questions if q.split == "train"))
    return folder, params


def run_stage(folder, params, model, name, train="train.jsonl"):
    out, metrics = folder / name, folder / f"{name}.json"
    stage.main(
        [
            "--params",
            str(params),
            "--backbone",
            "main",
            "--model",
            str(model),
            "--index",
            str(folder / "index"),
            "--train",
            str(folder / train),
            "--out",
            str(out),
            "--metrics",
            str(metrics),
        ]
    )
    return out, json.loads(metrics.read_text())


def test_stage_writes_a_loadable_merged_checkpoint_the_same_bytes_twice(stage_inputs, tiny_backbone):
    folder, params = stage_inputs
    first, metrics = run_stage(folder, params, tiny_backbone, "start-a")
    second, again = run_stage(folder, params, tiny_backbone, "start-b")
    assert metrics["enabled"] is True and metrics["questions"] == 4 and metrics["traces"] >= 4 * 4
    assert metrics["trained_tokens"] > 0 and metrics["first_loss"] > 0
    assert metrics["content_sha256"] == content_sha256(first) != content_sha256(tiny_backbone)
    model, tokenizer = load_backbone(first)
    assert type(model).__name__ == "Qwen2ForCausalLM" and tokenizer.eos_token == "<|im_end|>"
    files = sorted(p.name for p in first.iterdir())
    assert files == sorted(p.name for p in second.iterdir())
    assert all((first / name).read_bytes() == (second / name).read_bytes() for name in files)
    assert again["content_sha256"] == metrics["content_sha256"]


def test_counted_plans_reach_the_stages_traces(stage_inputs, tiny_backbone):
    folder, params = stage_inputs
    counted = write_params(folder / "counted", {"warmstart": {"questions": 4, "plans": "counted"}})
    _, fixed = run_stage(folder, params, tiny_backbone, "start-fixed")
    _, metrics = run_stage(folder, counted, tiny_backbone, "start-counted")
    assert metrics["traces"] == fixed["traces"] and metrics["trained_tokens"] > fixed["trained_tokens"]
    assert metrics["content_sha256"] != fixed["content_sha256"]


def test_the_stage_adds_follow_up_notes_unless_params_turn_them_off(stage_inputs, tiny_backbone):
    folder, params = stage_inputs
    plain = write_params(folder / "plain", {"warmstart": {"questions": 4, "follow_up_notes": False}})
    _, with_follow_ups = run_stage(folder, params, tiny_backbone, "start-follow-ups")
    _, without = run_stage(folder, plain, tiny_backbone, "start-plain")
    assert load_config(params).warmstart.follow_up_notes is True  # the default's setting
    assert with_follow_ups["questions"] == without["questions"] == 4
    assert with_follow_ups["traces"] > without["traces"]  # a 1-hop question's second conclusion trace
    assert with_follow_ups["content_sha256"] != without["content_sha256"]


def test_fewer_questions_than_asked_for_are_said_not_taken_silently(stage_inputs, tiny_backbone, capsys):
    folder, _ = stage_inputs
    lines = (folder / "train.jsonl").read_text().splitlines(keepends=True)
    (folder / "few.jsonl").write_text("".join(lines[:5]))  # the smoke dev split holds 3 of them out
    params = write_params(folder / "many", {"warmstart": {"questions": 4}})
    _, metrics = run_stage(folder, params, tiny_backbone, "start-many", train="few.jsonl")
    assert metrics["questions"] <= 2
    said = f"warm start: {metrics['questions']} questions gave traces, fewer than warmstart.questions (4)"
    assert said in capsys.readouterr().out


def test_disabled_warm_start_copies_the_backbone_byte_for_byte(stage_inputs, tiny_backbone):
    folder, _ = stage_inputs
    cfg = load_config(write_params(folder / "off", {"warmstart": {"enabled": False}}))
    metrics = warmstart(
        cfg, "main", tiny_backbone, folder / "no-index-needed", folder / "missing.jsonl", folder / "copy"
    )
    assert metrics == {"enabled": False, "content_sha256": content_sha256(tiny_backbone)}
    names = sorted(p.name for p in tiny_backbone.iterdir())
    assert names and names == sorted(p.name for p in (folder / "copy").iterdir())
    assert all((tiny_backbone / n).read_bytes() == (folder / "copy" / n).read_bytes() for n in names)
    not_a_backbone = folder / "questions-only"
    not_a_backbone.mkdir()
    (not_a_backbone / "test.jsonl").write_text("{}\n")
    refused = (
        ("nosuch", tiny_backbone, "models has no 'nosuch'"),
        ("main", not_a_backbone, "not a prepared backbone"),
    )
    for backbone, model, named in refused:
        with pytest.raises((ConfigError, BackboneError), match=named):
            warmstart(cfg, backbone, model, folder / "no-index-needed", folder / "missing.jsonl", folder / "bad")
        assert not (folder / "bad").exists()  # was: a copy of whatever folder --model named, and exit 0
