"""Steps without signal do not move the policy; steps with some move only trainable adapters; several updates per
rollout batch; collapse guards."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from centralrl.config import load_config
from centralrl.rl.checkpoint import StateKey

from conftest import TOY, toy_questions, write_params

KEY = StateKey("test", 0, "main", "key")  # the cell and fingerprint of the states these tests save


def _trainer(
    tiny_backbone, tmp_path, trainable: list[str], grpo: dict | None = None, health: dict | None = None, **params
):
    from centralrl.harness.engine import RolePolicy
    from centralrl.config import role_adapters
    from centralrl.models.adapters import attach_adapters
    from centralrl.models.backbone import load_backbone
    from centralrl.retrieval.bm25 import Bm25sIndex
    from centralrl.rl.trainer import Trainer
    from centralrl.schema import Passage

    train = {"grpo": {**TOY["train"]["grpo"], "kl_coef": 0.02, **(grpo or {})}, "health": health or {}}
    cfg = load_config(write_params(tmp_path, {**TOY, "train": train, **params}))
    model, tokenizer = load_backbone(tiny_backbone)
    adapters = role_adapters(trainable, "per_role")
    torch.manual_seed(0)
    policy = RolePolicy(attach_adapters(model, adapters, cfg.lora), tokenizer, adapters, 32)
    index = Bm25sIndex.build([Passage("p", "Nothing", "nothing to find here")], 1.2, 0.75, True)
    return Trainer(cfg, policy, index, toy_questions(tokenizer), "central", seed=0)


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.policy.model.named_parameters()}


def _moved(before: dict[str, torch.Tensor], trainer) -> set[str]:
    return {name for name, p in trainer.policy.model.named_parameters() if not torch.equal(before[name], p)}


SIGNAL = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])  # the first group informative, not the second


def test_a_step_with_all_equal_rewards_moves_nothing_and_trains_no_tokens(tiny_backbone, tmp_path):
    trainer = _trainer(tiny_backbone, tmp_path, ["central", "conclusion"])
    trainer.learn(trainer.rollout(), SIGNAL)  # a real update first, so AdamW has momentum that could move weights
    weights, optimizer = _weights(trainer), copy.deepcopy(trainer.optimizer.state_dict())
    scheduler = trainer.scheduler.state_dict()
    metrics = trainer.learn(trainer.rollout(), torch.full((2, 4), 0.25))
    assert _moved(weights, trainer) == set()
    assert str(trainer.optimizer.state_dict()) == str(optimizer)
    assert trainer.scheduler.state_dict() == scheduler
    assert metrics["skipped"] == 1.0 and metrics["informative_groups"] == 0.0 and metrics["informative_share"] == 0
    assert metrics["trained_tokens.central"] == metrics["trained_tokens.conclusion"] == 0.0
    assert metrics["flops.update"] == 0.0 and metrics["flops.generation"] > 0
    assert trainer.step == 2  # the next rollout draws new questions


def test_one_informative_group_moves_only_the_trainable_adapters(tiny_backbone, tmp_path):
    trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"])
    episodes = trainer.rollout()
    weights = _weights(trainer)
    metrics = trainer.learn(episodes, SIGNAL)
    moved = _moved(weights, trainer)
    assert moved and all("lora_" in name and ".conclusion." in name for name in moved)
    assert metrics["skipped"] == 0.0 and metrics["informative_groups"] == 1.0 and metrics["informative_share"] == 0.5
    informative = sum(len(c.completion_ids) for e in episodes[:4] for c in e.calls if c.adapter == "conclusion")
    assert metrics["trained_tokens.conclusion"] == informative  # the equal-reward group trains no token


def test_the_reported_loss_is_normalised_by_the_steps_trained_tokens(tiny_backbone, tmp_path):
    """loss_normalization token: the loss a step reports is the sum of its per-token terms over every trained token
    of the step, divided by their count; here central's samples train 4 tokens and conclusion's 1, so a count of
    samples would differ. By hand: one full-logit forward per adapter, one `grpo_loss` each, that denominator.
    The episodes are learned twice: at the first update the ratio is 1 and every episode of a group trains as many
    tokens, so the loss is 0 whatever it is divided by; at the second the policy has moved from the recorded one."""
    from centralrl.rl.grpo import grpo_loss, token_logprobs
    from centralrl.rl.trainer import _padded, informative_samples

    trainer = _trainer(tiny_backbone, tmp_path, ["central", "conclusion"], {"kl_coef": 0.0})
    g, model, pad = trainer.cfg.train.grpo, trainer.policy.model, trainer.policy.tokenizer.pad_token_id
    episodes = trainer.rollout()
    _, samples = informative_samples(episodes, SIGNAL, g)
    tokens = sum(s.trained_tokens for s in samples)
    assert {s.trained_tokens for s in samples} == {1, 4} and tokens != len(samples)
    trainer.learn(episodes, SIGNAL)
    expected = 0.0
    with torch.no_grad():
        for adapter in ("central", "conclusion"):
            group = [s for s in samples if s.adapter == adapter]
            ids, attention, mask, recorded = _padded(group, pad, "cpu")
            model.set_adapter(adapter)
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
            logp = token_logprobs(logits, ids[:, 1:], trainer.cfg.harness.temperature)
            advantages = torch.tensor([s.advantage for s in group])
            loss, _ = grpo_loss(logp, recorded, None, advantages, mask, g.clip_eps, 0.0, "token", float(tokens))
            expected += float(loss)
    assert abs(expected) > 0.01
    assert trainer.learn(episodes, SIGNAL)["loss"] == pytest.approx(expected, rel=1e-5)


def test_the_updates_dropout_masks_derive_from_the_seed_and_step_not_the_global_generator(tiny_backbone, tmp_path):
    """A resumed run restores no generator: a mask drawn from the global one (on CUDA, or in another process,
    never saved) made the resumed update differ from the uninterrupted one."""
    moved = []
    for global_seed in (1, 2):
        trainer = _trainer(tiny_backbone, tmp_path / str(global_seed), ["central"], lora={"dropout": 0.5})
        episodes = trainer.rollout()
        torch.manual_seed(global_seed)
        state = torch.get_rng_state()
        trainer.learn(episodes, SIGNAL)
        assert torch.equal(torch.get_rng_state(), state)  # the global generator is as it was
        moved.append(_weights(trainer))
    assert all(torch.equal(moved[0][name], moved[1][name]) for name in moved[0])


def test_the_informative_groups_own_episodes_are_trained_with_their_own_advantages(tiny_backbone, tmp_path):
    """Only the second group differs: its four episodes (indices 4-7) are the samples, each with its advantage."""
    from centralrl.rl.grpo import group_advantages
    from centralrl.rl.trainer import informative_samples, training_samples

    trainer = _trainer(tiny_backbone, tmp_path, ["central", "conclusion"])
    episodes = trainer.rollout()
    rewards = torch.tensor([[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 0.0, 0.5]])
    informative, samples = informative_samples(episodes, rewards, trainer.cfg.train.grpo)
    advantages = group_advantages(rewards)[1].tolist()
    assert informative == [False, True]
    assert samples == training_samples(episodes[4:], advantages)
    assert sorted({s.advantage for s in samples}) == sorted(set(advantages))  # every episode's own advantage
    assert {s.ids for s in samples}.isdisjoint({s.ids for s in training_samples(episodes[:4], [1.0] * 4)})


def test_several_updates_per_rollout_step_the_optimizer_each_time_and_the_clip_bounds_the_later_ones(
    tiny_backbone, tmp_path
):
    """mu = 3 on the same episodes as mu = 1: three optimizer steps and one schedule step, three updates' FLOPs;
    the first pass's ratio is 1 up to the sampling precision's gap, the later passes' moves, so the clip acts more."""
    runs = {}
    for mu in (1, 3):
        trainer = _trainer(tiny_backbone, tmp_path / str(mu), ["conclusion"], {"updates_per_rollout": mu})
        episodes = trainer.rollout()
        runs[mu] = (trainer, episodes, trainer.learn(episodes, SIGNAL))
    (once, episodes_once, one), (thrice, episodes_thrice, three) = runs[1], runs[3]
    assert [e.prediction for e in episodes_once] == [e.prediction for e in episodes_thrice]  # the same batch
    assert [s["step"] for s in thrice.optimizer.state.values()] == [3.0] * len(thrice.parameters)
    assert [s["step"] for s in once.optimizer.state.values()] == [1.0] * len(once.parameters)
    assert thrice.scheduler.last_epoch == once.scheduler.last_epoch == 1
    assert three["flops.update"] == 3 * one["flops.update"] > 0
    assert three["trained_tokens.conclusion"] == one["trained_tokens.conclusion"]  # generated once, trained thrice
    assert one["clip_fraction"] < three["clip_fraction"]
    assert one["logprob_drift"] < three["logprob_drift"]  # logged: the first pass's gap, the later passes' moves
    assert _moved(_weights(once), thrice)  # three steps end elsewhere than one


def test_the_logged_learning_rate_is_the_one_the_steps_update_used(tiny_backbone, tmp_path):
    """Linear schedule, 1 warmup step of 10: the first update runs at half the rate, the second at the full one
    (step 1 logged the full rate: the schedule had already stepped). A skipped step logs the rate it would have
    used, the one the next update then uses (neither it nor the schedule stepped)."""
    grpo = {"learning_rate": 3e-4, "lr_schedule": "linear", "warmup_steps": 1, "steps": 10}
    trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"], grpo)
    used: list[float] = []  # read by the optimizer itself, at each of its steps
    trainer.optimizer.register_step_pre_hook(lambda optimizer, *_: used.append(optimizer.param_groups[0]["lr"]))
    logged = [
        trainer.learn(trainer.rollout(), rewards)["learning_rate"]
        for rewards in (SIGNAL, SIGNAL, torch.full((2, 4), 0.25), SIGNAL)
    ]
    assert used == pytest.approx([1.5e-4, 3e-4, 3e-4 * 8 / 9])
    assert logged == pytest.approx([1.5e-4, 3e-4, 3e-4 * 8 / 9, 3e-4 * 8 / 9])


def test_a_resumed_run_continues_the_learning_rate_schedule(tiny_backbone, tmp_path):
    """Linear schedule, 1 warmup step of 10: a run saved after step 1 and resumed in a fresh trainer uses the rates
    and ends with the adapters of the uninterrupted run. The optimizer's own state holds the rate of step 2, so only
    step 3 shows a schedule that was not restored (it would step from 0 again: the full rate, not 8/9 of it)."""
    from centralrl.rl.checkpoint import Progress, restore, save_state

    grpo = {"learning_rate": 3e-4, "lr_schedule": "linear", "warmup_steps": 1, "steps": 10}
    straight = _trainer(tiny_backbone, tmp_path / "straight", ["conclusion"], grpo)
    first = straight.learn(straight.rollout(), SIGNAL)
    save_state(straight, tmp_path / "state", Progress([{"step": 1, **first}]), KEY)
    rates = [straight.learn(straight.rollout(), SIGNAL)["learning_rate"] for _ in range(2)]
    assert rates == pytest.approx([3e-4, 3e-4 * 8 / 9])

    resumed = _trainer(tiny_backbone, tmp_path / "resumed", ["conclusion"], grpo)
    restore(resumed, tmp_path / "state" / "step-000001")
    assert [resumed.learn(resumed.rollout(), SIGNAL)["learning_rate"] for _ in range(2)] == rates
    assert resumed.scheduler.state_dict() == straight.scheduler.state_dict()
    assert _moved(_weights(straight), resumed) == set()


def test_a_step_logs_reward_and_subquestions_per_benchmark(tiny_backbone, tmp_path):
    from dataclasses import replace

    from centralrl.rl.trainer import subquestions

    trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"])
    episodes = [  # the first group's question from benchmark a, the second's from b
        replace(e, question=replace(e.question, benchmark="ab"[i // 4])) for i, e in enumerate(trainer.rollout())
    ]
    metrics = trainer.learn(episodes, torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.25, 0.25, 0.25, 0.25]]))
    assert (metrics["reward_mean.a"], metrics["reward_mean.b"], metrics["reward_mean"]) == (0.5, 0.25, 0.375)
    for benchmark, group in (("a", episodes[:4]), ("b", episodes[4:])):
        assert metrics[f"subquestions_per_episode.{benchmark}"] == sum(map(subquestions, group)) / 4
    assert metrics["subquestions_per_episode"] == sum(map(subquestions, episodes)) / 8


def test_spending_counts_optimizer_steps_not_skipped_ones():
    from centralrl.rl.run import spending

    history = [
        {"skipped": 0.0, "trained_tokens.central": 10.0, "flops.generation": 100.0, "flops.update": 300.0},
        {"skipped": 1.0, "trained_tokens.central": 0.0, "flops.generation": 50.0, "flops.update": 0.0},
    ]
    assert spending(history, 1.0) == {"steps": 1.0, "trained_tokens": 10.0, "flops": 450.0, "wall_seconds": 1.0}


def test_an_absurd_learning_rate_stops_the_run_naming_the_step_and_monitor(tiny_backbone, tmp_path):
    """At learning rate 50 step 1's update throws the policy far: step 2 measures the KL of the state saved after
    step 1, past max_kl, sets that state aside and stops before saving anything of step 2 (seeded: always step 2)."""
    from centralrl.rl.checkpoint import Progress, latest_state
    from centralrl.rl.health import TrainingDiverged
    from centralrl.rl.run import Phases, run_steps
    from centralrl.tracking import NullTracker

    trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"], {"learning_rate": 50.0, "steps": 6}, {"max_kl": 0.5})
    always_signal = Phases(reward=lambda trainer, episodes: SIGNAL)
    state = tmp_path / "state"
    lines: list[str] = []
    with pytest.raises(TrainingDiverged, match=r"diverged at step 2: kl to the starting policy [\d.]+ passed"):
        run_steps(trainer.cfg, trainer, Progress([]), state, KEY, always_signal, NullTracker(), lines.append)
    assert trainer.step == 2
    # step 1's state set aside, nothing of step 2 saved (a check after the save would have left step-000002)
    assert sorted(p.name for p in state.iterdir()) == ["cuts", "past-max-kl-step-000001"]
    assert latest_state(state, KEY) is None
    # the console shows every step up to the one that diverged
    assert [line.split(": reward")[0] for line in lines] == ["step 1/6", "step 2/6"]


def test_a_non_finite_loss_stops_the_run_before_saving_its_step_and_keeps_the_state_before(tiny_backbone, tmp_path):
    """Step 3's rewards hold a NaN (a broken reward): its advantages, loss and update are NaN. The run stops at
    step 3 naming the loss, saves nothing of it, and the last good state (step 2's, finite) is the one a rerun
    resumes. Its KL, measured before the update, is finite: the loss monitor, not the KL's, must catch it."""
    from centralrl.rl.checkpoint import Progress, latest_state, restore
    from centralrl.rl.health import TrainingDiverged
    from centralrl.rl.run import Phases, run_steps
    from centralrl.tracking import NullTracker

    broken = torch.tensor([[1.0, 0.0, 0.0, float("nan")], [0.5, 0.5, 0.5, 0.5]])
    grpo, budgets = {"steps": 4}, {"four_steps": {"steps": 4}}
    trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"], grpo, {"max_kl": 1e9}, budgets=budgets)
    nan_at_step_3 = Phases(reward=lambda trainer, episodes: broken if trainer.step == 2 else SIGNAL)
    state = tmp_path / "state"
    progress = Progress([])
    with pytest.raises(
        TrainingDiverged, match=r"diverged at step 3: loss is nan; nothing of this step was saved"
    ) as stop:
        run_steps(trainer.cfg, trainer, progress, state, KEY, nan_at_step_3, NullTracker())
    assert f"the last good state is {state / 'step-000002'};" in str(stop.value)
    assert progress.history[-1]["step"] == 3 and math.isfinite(progress.history[-1]["kl"])
    assert [p.name for p in sorted(state.glob("step-*"))] == ["step-000001", "step-000002"]
    assert latest_state(state, KEY) == state / "step-000002"
    # restoring it over the NaN weights: `restore` refuses a state with non-finite weights
    assert restore(trainer, state / "step-000002").history[-1]["step"] == 2 and trainer.step == 2


def test_a_kl_past_max_kl_sets_aside_the_state_it_measured_and_a_rerun_resumes_the_one_before(tiny_backbone, tmp_path):
    """The KL step k logs is measured in its update's first forward: that of the policy step k started from, the
    state saved after step k-1. max_kl between the KLs of steps 2 and 3 (a first run's) stops the run at step 3:
    the state of step 2 is the one past the limit, set aside (it was kept as the last good one); the state of step 1
    is the last good one. A rerun resumes from it, measures its KL under the limit again, and stops at step 3."""
    from centralrl.rl.checkpoint import Progress, latest_state, restore
    from centralrl.rl.health import TrainingDiverged
    from centralrl.rl.run import Phases, run_steps
    from centralrl.tracking import NullTracker

    always_signal = Phases(reward=lambda trainer, episodes: SIGNAL)
    grpo = {"steps": 3, "learning_rate": 0.5}  # measured KLs: 0, 0.021, 5.8
    budgets = {"three_steps": {"steps": 3}}  # not TOY's, which are all cut at step 2
    free = _trainer(tiny_backbone, tmp_path / "free", ["conclusion"], grpo, {"max_kl": 1e9}, budgets=budgets)
    progress = Progress([])
    run_steps(free.cfg, free, progress, tmp_path / "free" / "state", KEY, always_signal, NullTracker())
    kl = [row["kl"] for row in progress.history]
    assert kl[0] == 0 < kl[1] < kl[2]  # step 1 starts from the start itself
    max_kl = (kl[1] + kl[2]) / 2
    state = tmp_path / "state"

    for resumed in (None, state / "step-000001"):
        trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"], grpo, {"max_kl": max_kl}, budgets=budgets)
        assert latest_state(state, KEY) == resumed
        progress = restore(trainer, resumed) if resumed else Progress([])
        with pytest.raises(TrainingDiverged, match=r"diverged at step 3: kl to the starting policy") as stop:
            run_steps(trainer.cfg, trainer, progress, state, KEY, always_signal, NullTracker())
        assert "set aside as past-max-kl-step-000002" in str(stop.value)
        kept = f"the newest kept state is {state / 'step-000001'}, whose KL was measured under the limit at step 2;"
        assert kept in str(stop.value)
        assert [p.name for p in sorted(state.glob("step-*"))] == ["step-000001"]
        assert (state / "past-max-kl-step-000002" / "meta.json").is_file()  # kept for inspection
        assert [row["kl"] for row in progress.history] == pytest.approx(kl)
    assert progress.history[1]["kl"] < max_kl  # the rerun measured the kept state's KL: under the limit


def test_without_a_kl_term_the_kl_is_measured_every_kl_every_steps_and_its_guard_stops_the_run(
    tiny_backbone, tmp_path
):
    """kl_coef 0 skips the reference forward, except every `kl_every` steps, whose KL the max_kl guard reads; the
    other steps have no "kl" (not a 0 that would read as an unmoved policy). kl_every 0: no KL, no KL guard."""
    from centralrl.rl.checkpoint import Progress
    from centralrl.rl.health import TrainingDiverged
    from centralrl.rl.run import Phases, run_steps
    from centralrl.tracking import NullTracker

    grpo = {"kl_coef": 0.0, "learning_rate": 0.5, "steps": 4}
    always_signal = Phases(reward=lambda trainer, episodes: SIGNAL)
    trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"], grpo, {"kl_every": 2, "max_kl": 1e-3})
    lines: list[str] = []
    with pytest.raises(TrainingDiverged, match=r"diverged at step 2: kl to the starting policy"):
        run_steps(
            trainer.cfg, trainer, Progress([]), tmp_path / "state", KEY, always_signal, NullTracker(), lines.append
        )
    assert len(lines) == 2  # step 1 passed: its KL was not measured
    unwatched = _trainer(tiny_backbone, tmp_path / "never", ["conclusion"], grpo, {"kl_every": 0, "max_kl": 1e-3})
    progress = Progress([])
    run_steps(unwatched.cfg, unwatched, progress, tmp_path / "never" / "state", KEY, always_signal, NullTracker())
    assert unwatched.step == 4 and all("kl" not in row for row in progress.history)
    assert progress.history[0]["flops.update"] > 0
    # a run shorter than kl_every is measured at its last step: it was never measured, so never guarded
    short = _trainer(tiny_backbone, tmp_path / "short", ["conclusion"], grpo, {"kl_every": 8, "max_kl": 1e-3})
    with pytest.raises(TrainingDiverged, match=r"diverged at step 4: kl to the starting policy"):
        run_steps(short.cfg, short, Progress([]), tmp_path / "short" / "state", KEY, always_signal, NullTracker())


def test_a_kl_measured_every_few_steps_names_the_newest_kept_state_for_what_is_known_of_it(tiny_backbone, tmp_path):
    """kl_every 2: the KL is measured at steps 2 (of the state after step 1) and 4 (after step 3). max_kl between
    them stops the run at step 4 and sets step 3's state aside; the newest kept state, step 2's, was never
    measured, so it is not "the last good state": the message says when the KL was last measured under the limit."""
    from centralrl.rl.checkpoint import Progress
    from centralrl.rl.health import TrainingDiverged
    from centralrl.rl.run import Phases, run_steps
    from centralrl.tracking import NullTracker

    grpo = {"kl_coef": 0.0, "learning_rate": 1.0, "steps": 4}  # KLs 0, 0.031, 0.017, 6.0
    budgets = {"four_steps": {"steps": 4}}
    always_signal = Phases(reward=lambda trainer, episodes: SIGNAL)
    free = _trainer(
        tiny_backbone, tmp_path / "free", ["conclusion"], grpo, {"kl_every": 2, "max_kl": 1e9}, budgets=budgets
    )
    progress = Progress([])
    run_steps(free.cfg, free, progress, tmp_path / "free" / "state", KEY, always_signal, NullTracker())
    kl = {row["step"]: row["kl"] for row in progress.history if "kl" in row}
    assert list(kl) == [2, 4] and kl[2] < kl[4]
    state = tmp_path / "state"
    health = {"kl_every": 2, "max_kl": (kl[2] + kl[4]) / 2}
    trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"], grpo, health, budgets=budgets)
    with pytest.raises(TrainingDiverged, match=r"diverged at step 4: kl to the starting policy") as stop:
        run_steps(trainer.cfg, trainer, Progress([]), state, KEY, always_signal, NullTracker())
    said = str(stop.value)
    assert "set aside as past-max-kl-step-000003" in said and "last good" not in said
    assert (
        f"the newest kept state is {state / 'step-000002'}, whose KL was not measured (the KL was last measured "
        "under the limit at step 2, that of the policy saved after step 1);"
    ) in said
    # a run shorter than kl_every is measured at its last step only: nothing before it was measured
    short = _trainer(tiny_backbone, tmp_path / "short", ["conclusion"], grpo, {"kl_every": 8, "max_kl": 1e-3})
    with pytest.raises(TrainingDiverged, match=r"diverged at step 4") as stop:
        run_steps(short.cfg, short, Progress([]), tmp_path / "short" / "state", KEY, always_signal, NullTracker())
    assert "whose KL was not measured (no KL was measured before step 4);" in str(stop.value)


def test_a_reward_collapse_stops_the_run_though_no_kl_is_measured(tiny_backbone, tmp_path):
    """Rewards positive, then 0 everywhere: the zero steps are skipped (no KL), and the collapse guard stops it."""
    from centralrl.rl.checkpoint import Progress
    from centralrl.rl.health import TrainingDiverged
    from centralrl.rl.run import Phases, run_steps
    from centralrl.tracking import NullTracker

    trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"], {"steps": 6}, {"dead_questions": 4})
    collapsing = Phases(reward=lambda trainer, episodes: SIGNAL if trainer.step == 0 else torch.zeros(2, 4))
    state = tmp_path / "state"
    with pytest.raises(TrainingDiverged, match=r"diverged at step 3: mean reward 0 in the last 2 steps"):
        run_steps(trainer.cfg, trainer, Progress([]), state, KEY, collapsing, NullTracker())
    assert sorted(p.name for p in state.glob("step-*"))[-1] == "step-000002"


def test_extra_draws_add_new_questions_only_while_too_few_groups_differ(tiny_backbone, tmp_path):
    """DAPO's dynamic sampling on real rollouts and rewards: each added draw was needed, the last one stopped it
    (enough groups differ) or the cap did, and no question comes twice in a step. Half of the questions cannot
    be answered (their groups never differ), so steps need different numbers of draws."""
    from centralrl.rl.grpo import groups_with_signal

    questions, size, extra = 2, 4, 3
    trainer = _trainer(tiny_backbone, tmp_path, ["central"], {"extra_draws": extra})
    trainer.questions = [_unanswerable(q) if i % 2 else q for i, q in enumerate(trainer.questions)]
    seen = set()
    for _ in range(3):
        episodes = trainer.rollout()
        signal = groups_with_signal(trainer.rewards(episodes))
        draws = len(episodes) // (questions * size)
        seen.add(draws)
        assert all(signal[: d * questions].sum() < questions for d in range(1, draws))
        assert draws == 1 + extra or signal.sum() >= questions
        ids = [e.question.id for e in episodes[::size]]
        assert len(ids) == draws * questions == len(set(ids))
        metrics = trainer.learn(episodes, trainer.rewards(episodes))
        assert metrics["episodes"] == len(episodes) and metrics["informative_groups"] == float(signal.sum())
    assert len(seen) > 1  # both kinds of step happened: one draw was enough, and more were needed


def _unanswerable(question):
    import dataclasses

    return dataclasses.replace(question, golden_answers=("unanswerable zebra quartet",))


def test_extra_draws_stop_at_the_cap_when_no_group_ever_differs(tiny_backbone, tmp_path):
    trainer = _trainer(tiny_backbone, tmp_path, ["central"], {"extra_draws": 2})
    trainer.questions = [_unanswerable(q) for q in trainer.questions]
    episodes = trainer.rollout()
    assert len(episodes) == 3 * 2 * 4 and not trainer.rewards(episodes).any()
    assert trainer.learn(episodes, trainer.rewards(episodes))["skipped"] == 1.0


def test_a_steps_keys_do_not_depend_on_the_hash_seed(tiny_backbone, tmp_path):
    """The history's bytes: a skipped step lists every adapter's trained tokens in one order. A set of adapter names
    iterates in an order set by PYTHONHASHSEED (1 gives retrieval, central, conclusion), so run it under that seed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[3]); from test_signal_free import _trainer; "
        "from pathlib import Path; t = _trainer(Path(sys.argv[1]), Path(sys.argv[2]), "
        "['central', 'retrieval', 'conclusion']); "
        "print([k for k in t.learn(t.rollout(), torch.zeros(2, 4)) if k.startswith('trained_tokens.')])"
    )
    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONHASHSEED": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tiny_backbone), str(tmp_path), tests],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    keys = ["trained_tokens.central", "trained_tokens.conclusion", "trained_tokens.retrieval"]
    assert out.stdout.strip().splitlines()[-1] == str(keys)


@pytest.mark.parametrize("per_step", [2, 3])
def test_stratified_steps_hold_each_benchmarks_share_and_uniform_ones_need_not(tiny_backbone, tmp_path, per_step):
    """A pool of 12 questions of one type and 4 of another: every stratified draw (extra draws too) holds each
    type as evenly as the draw size allows, the odd question goes to either type, and no question comes twice in a
    step; uniform draws often miss the rarer type (the step-to-step swing stratifying removes)."""
    import dataclasses

    def mixes(sampling: str) -> list[list[tuple[int, int]]]:
        grpo = {"questions_per_step": per_step, "extra_draws": 1, "question_sampling": sampling}
        trainer = _trainer(tiny_backbone, tmp_path, ["central"], grpo)
        trainer.questions = [
            dataclasses.replace(q, benchmark="hard" if i % 4 == 3 else "easy") for i, q in enumerate(trainer.questions)
        ]
        steps = []
        for trainer.step in range(20):
            draws = trainer.draws()
            assert len(draws) == 2 and all(len(d) == per_step for d in draws)
            assert len({q.id for d in draws for q in d}) == 2 * per_step
            steps.append(
                [(sum(q.benchmark == "easy" for q in d), sum(q.benchmark == "hard" for q in d)) for d in draws]
            )
        return steps

    even = {(per_step // 2, per_step - per_step // 2), (per_step - per_step // 2, per_step // 2)}
    stratified = mixes("stratified")
    assert all(set(step) <= even for step in stratified)
    assert {step[0] for step in stratified} == even  # the odd question goes to either type (per_step 3)
    assert any(not set(step) <= even for step in mixes("uniform"))


def test_revisit_plays_the_first_batches_again_at_the_end_and_an_unchanged_policy_gets_the_same_episodes(
    tiny_backbone, tmp_path
):
    """`train.grpo.revisit` k: the last k of the `steps` batches draw the first k's questions and sampling streams,
    so a policy that did not change plays them the same episodes (a first-to-last-quarter rise is then the
    policy's, not the draw's); the batches between draw their own. Half the steps or more is refused."""
    from centralrl.errors import ConfigError

    trainer = _trainer(tiny_backbone, tmp_path, ["central"], {"steps": 6, "revisit": 2})

    def played(step: int) -> tuple[list[str], list[tuple[int, ...]], int]:
        trainer.step = step
        calls = [c.completion_ids for e in trainer.rollout() for c in e.calls]
        return [q.id for d in trainer.draws() for q in d], calls, trainer.settings().seed

    first = [played(0), played(1)]
    assert [played(4), played(5)] == first
    assert played(2)[2] not in {seed for _, _, seed in first}
    with pytest.raises(ConfigError, match=r"revisit 4 is more than half of train.grpo.steps \(6\)"):
        load_config(write_params(tmp_path, {"train": {"grpo": {"steps": 6, "revisit": 4}}}))


def test_a_revisit_run_goes_on_past_its_last_budget_cut_to_the_replayed_batches(tiny_backbone, tmp_path):
    """Every budget is cut at step 1, which ends a run; under `revisit` it goes on to `steps`, whose last batch is
    the replay of the first."""
    from centralrl.rl.checkpoint import Progress
    from centralrl.rl.run import Phases, run_steps
    from centralrl.tracking import NullTracker

    budgets = {"equal_steps": {"steps": 1}, "equal_tokens": {"trained_tokens": 1}}
    for revisit, rows in ((0, 1), (1, 3)):
        trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"], {"steps": 3, "revisit": revisit}, budgets=budgets)
        progress = Progress([])
        signal = Phases(reward=lambda trainer, episodes: SIGNAL)
        run_steps(trainer.cfg, trainer, progress, tmp_path / f"state{revisit}", KEY, signal, NullTracker())
        assert [row["step"] for row in progress.history] == list(range(1, rows + 1))
        assert {cut["step"] for cut in progress.cuts.values()} == {1}


def test_a_replayed_runs_rise_is_paired_by_question_from_the_historys_per_question_rewards(tiny_backbone, tmp_path):
    """Every history row holds each question's group reward (their mean is the step's reward); a run whose last
    quarter replayed its first pairs them by question: the rise, its sign-flip p and its standard error."""
    from centralrl.compare import replayed_rise
    from centralrl.rl.checkpoint import Progress
    from centralrl.rl.rewards import QUESTION_REWARDS
    from centralrl.rl.run import Phases, run_steps
    from centralrl.tracking import NullTracker

    trainer = _trainer(tiny_backbone, tmp_path, ["conclusion"], {"steps": 4, "revisit": 1})
    later = SIGNAL + torch.tensor([[0.0] * 4, [0.25] * 4])  # the second question's group scores 0.25 more

    def reward(trainer, episodes):
        return later if trainer.step == 3 else SIGNAL  # the replay of step 1 (trainer.step counts those done)

    progress = Progress([])
    run_steps(trainer.cfg, trainer, progress, tmp_path / "state", KEY, Phases(reward=reward), NullTracker())
    rows = progress.history
    assert len(rows) == 4 and all(len(row[QUESTION_REWARDS]) == 2 for row in rows)
    assert all(sum(row[QUESTION_REWARDS].values()) / 2 == pytest.approx(row["reward_mean"]) for row in rows)
    assert list(rows[0][QUESTION_REWARDS]) == list(rows[-1][QUESTION_REWARDS])  # the replay: the same questions
    assert list(rows[0][QUESTION_REWARDS]) != list(rows[1][QUESTION_REWARDS])
    paired = replayed_rise(rows, 1, trainer.cfg.compare)
    assert paired["questions"] == 2 and paired["estimate"] == pytest.approx(0.125)
    assert paired["p"] == 1.0 and paired["se"] == pytest.approx(0.125)  # (0, 0.25): every sign pattern as far
    assert replayed_rise(rows, 2, trainer.cfg.compare) is None  # a quarter of 4 steps is 1, not 2
    unrecorded = [{k: v for k, v in row.items() if k != QUESTION_REWARDS} for row in rows]
    assert replayed_rise(unrecorded, 1, trainer.cfg.compare) is None  # a history from before per-question rewards


@pytest.mark.parametrize("frozen_roles", ["greedy", "sampled"])
def test_frozen_roles_play_greedily_in_rollouts_when_asked_and_trained_ones_still_sample(
    tiny_backbone, tmp_path, frozen_roles
):
    """`frozen_roles: greedy`: every call of a role the arm does not train is what greedy decoding gives on its
    prompt (as evaluation plays it), while the trained role samples; `sampled`: frozen roles sample too."""
    trainer = _trainer(tiny_backbone, tmp_path, ["central"], {"frozen_roles": frozen_roles})
    calls = [c for e in trainer.rollout() for c in e.calls]
    policy, budgets = trainer.policy, trainer.cfg.harness.max_new_tokens

    def as_greedy(role):
        played = [c for c in calls if c.role == role]
        greedy = policy.generate(role, [list(c.prompt_ids) for c in played], getattr(budgets, role), greedy=True)
        return [c.completion_ids == g.completion_ids for c, g in zip(played, greedy)]

    frozen = as_greedy("conclusion")
    assert all(frozen) if frozen_roles == "greedy" else not all(frozen)
    assert not all(as_greedy("central"))


def test_a_fixed_pool_is_dealt_evenly_over_benchmarks_from_the_seed_and_steps_draw_only_from_it():
    """`train.grpo.pool`: N questions, as many of each benchmark as N allows, the same for every arm of a seed
    and another for another seed; 0 keeps every question; more than there are is an error naming the file."""
    from centralrl.errors import DataError
    from centralrl.rl.trainer import fixed_pool
    from centralrl.schema import Question

    questions = [Question(f"{b}-{i}", "?", ("x",), b, "train") for b in ("one", "two", "three") for i in range(20)]
    pool = fixed_pool(questions, 6, 4, seed=0, source="t.jsonl")
    assert len({q.id for q in pool}) == 6
    assert sorted(q.benchmark for q in pool) == ["one", "one", "three", "three", "two", "two"]
    assert fixed_pool(questions, 6, 4, seed=0, source="t.jsonl") == pool
    assert fixed_pool(questions, 6, 4, seed=1, source="t.jsonl") != pool
    assert fixed_pool(questions, 0, 4, seed=0, source="t.jsonl") == questions
    with pytest.raises(DataError, match=r"t.jsonl: train.grpo.pool is 61 but 60 training questions are left"):
        fixed_pool(questions, 61, 4, seed=0, source="t.jsonl")
    # a file source without `limit` cannot be sized at load: a step drew fewer questions than asked, in silence
    with pytest.raises(DataError, match=r"t.jsonl: 60 training questions are left after the dev split, fewer than"):
        fixed_pool(questions, 0, 61, seed=0, source="t.jsonl")


def test_a_pool_smaller_than_a_step_is_refused_at_load_time(tmp_path):
    from centralrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"pool \(2\) is smaller than train.grpo.questions_per_step \(4\)"):
        load_config(write_params(tmp_path, {"train": {"grpo": {"questions_per_step": 4, "pool": 2}}}))


def test_the_train_stage_draws_every_step_from_its_seeds_pool(smoke_run, tmp_path):
    """The pool reaches the trainer the train stage builds: the arms of a seed share it, steps draw only from
    it, and no dev question is in it."""
    from centralrl.distributed import World
    from centralrl.data.split import split_dev
    from centralrl.rl.run import build_trainer
    from centralrl.schema import read_questions

    folder, _, data = smoke_run
    cfg = load_config(write_params(tmp_path, {**TOY, "train": {"grpo": {**TOY["train"]["grpo"], "pool": 4}}}))
    inputs = [str(folder / "start"), str(folder / "index"), str(data["train"])]

    def pool(arm: str, seed: int) -> list[str]:
        key = StateKey(arm, seed, "main", "key")
        trainer, _ = build_trainer(cfg, arm, seed, "main", *inputs, str(tmp_path / arm / str(seed)), key, World())
        drawn = {q.id for trainer.step in range(6) for draw in trainer.draws() for q in draw}
        assert drawn <= {q.id for q in trainer.questions}
        return [q.id for q in trainer.questions]

    _, dev = split_dev(read_questions(data["train"]), cfg.train.dev)
    assert len(pool("central_only", 0)) == 4 and not set(pool("central_only", 0)) & {q.id for q in dev}
    assert pool("joint", 0) == pool("central_only", 0) != pool("central_only", 1)


def test_an_informative_pool_keeps_only_questions_the_start_sometimes_solves_and_its_first_step_pays(
    tiny_backbone, tmp_path
):
    """`pool_filter: informative` on the toy task, where half the questions can never be solved (their answer
    is no word): the pool is 4 questions whose start groups' rewards differed, none of the unsolvable ones, the
    same on a rebuild; the first step's row carries what choosing it cost, inside its generation FLOPs."""
    import dataclasses

    from centralrl.rl.checkpoint import Progress
    from centralrl.rl.run import PLAIN, run_steps
    from centralrl.tracking import NullTracker

    def sifted():
        trainer = _trainer(tiny_backbone, tmp_path, ["central"], {"pool": 4, "pool_filter": "informative"})
        trainer.questions = [
            q if i % 2 else dataclasses.replace(q, id=f"never/{i}", golden_answers=("qqqzzz",))
            for i, q in enumerate(trainer.questions)
        ]
        trainer.sift_pool("toy.jsonl")
        return trainer

    trainer = sifted()
    assert len(trainer.questions) == 4 and not any(q.id.startswith("never/") for q in trainer.questions)
    assert trainer.pool_flops > 0
    assert [q.id for q in sifted().questions] == [q.id for q in trainer.questions]
    progress = Progress([])
    run_steps(trainer.cfg, trainer, progress, tmp_path / "state", KEY, PLAIN, NullTracker())
    first, second = progress.history[:2]
    assert first["flops.pool"] == trainer.pool_flops and "flops.pool" not in second
    assert first["flops.generation"] > trainer.pool_flops


def test_an_informative_pool_that_cannot_fill_names_the_benchmark_short(tiny_backbone, tmp_path):
    import dataclasses

    from centralrl.errors import DataError

    trainer = _trainer(tiny_backbone, tmp_path, ["central"], {"pool": 4, "pool_filter": "informative"})
    trainer.questions = [dataclasses.replace(q, golden_answers=("qqqzzz",)) for q in trainer.questions]
    with pytest.raises(DataError, match=r"toy.jsonl: .*pool_filter informative found too few .*\(toy: 0 of 4\)"):
        trainer.sift_pool("toy.jsonl")


@pytest.mark.parametrize(
    ("grpo", "says"),
    [
        ({"pool_filter": "informative"}, r"pool_filter informative needs train.grpo.pool"),
        ({"pool": 4, "pool_filter": "informative", "processes": 2}, r"pool_filter with train.processes > 1"),
    ],
)
def test_an_informative_pool_without_a_size_or_with_several_processes_is_refused(tmp_path, grpo, says):
    from centralrl.errors import ConfigError

    processes = grpo.pop("processes", 1)
    with pytest.raises(ConfigError, match=says):
        load_config(write_params(tmp_path, {"train": {"grpo": grpo, "processes": processes}}))


def test_a_pool_larger_than_the_training_questions_left_is_refused_at_load_time(tmp_path):
    from centralrl.errors import ConfigError

    cfg = load_config(write_params(tmp_path, {}, profile="default"))
    most = cfg.data.most_training_questions()
    with pytest.raises(ConfigError, match=rf"or pool \({most}\), the larger, plus train.dev.questions"):
        load_config(write_params(tmp_path, {"train": {"grpo": {"pool": most}}}, profile="default"))
