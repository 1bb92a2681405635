"""GRPO over the harness: roll out G episodes per question, reward the final answer, update trainable roles.

One step: sample `questions_per_step` training questions (seeded by step; by default stratified over the
benchmarks, `question_sampling`), run G sampled episodes each with the current adapters, reward each episode
(`rewards.outcome_reward`), compute group-normalised advantages, and turn every call of a trainable role into a
training sequence: its prompt ids (masked) and its completion ids (trained), all carrying the episode's advantage.
Frozen roles' calls, prompts and retrieved passages never enter the loss; they sample like the trained roles, or
decode greedily, as evaluation plays them, under `frozen_roles: greedy`. The loss per token is the clipped ratio
objective plus beta * KL(k3) to the starting policy, whose log-probs come from the same model with adapters
disabled (no second copy in memory); tokens are normalised over the whole batch (or per sequence), gradients
clipped, AdamW with a LambdaLR schedule.

Only informative groups (rewards not all equal) enter the update, as DAPO's dynamic sampling filters them
(without its resampling): a group of equal rewards has zero advantage everywhere and would only add KL and
dilute the token mean. A step with no informative group in any process skips the update, the optimizer and the
schedule (Adam's momentum would otherwise move weights on a zero gradient): it is logged as skipped with its
rollout cost, and trains no tokens. Its draws still advance with the step, so the next step samples anew.

Departures from DeepSeekMath's GRPO: one update per rollout batch by default (`updates_per_rollout`, its mu,
is 1 as in TRL): the old policy's log-probs are the ones the rollout recorded, so the ratio is 1 up to the
numerical gap between the sampling engine (bf16, merged weights) and the update, and the clip bounds that gap
(clip_fraction logs how often). With mu > 1 the later passes over the same batch see the ratio move, and the
clip bounds how far one batch takes the policy; the lr schedule still steps once per rollout batch;
a multi-agent episode contributes one sequence per trainable role call rather than one completion; the reward
is token F1 (Search-R1 uses EM).

The update (`update`) runs the decoder, then the output head only at the positions that predict a trained token
(`grpo.head_logprobs`), in the precision of `train.grpo.precision` (bf16 autocast where the hardware has bf16
arithmetic; the head and the log-probs in float32), on micro-batches cut from each adapter's samples sorted by
length (less padding) and capped in padded positions (`forward_tokens`, which bounds peak memory). The
head-only-where-trained shortcut is the causal LM's own computation for models whose logits are head(last hidden
state), as Qwen2 and Llama/SmolLM2. With `shared_prefix`, each micro-batch's common token prefix (a role's system
prompt at least; a group's question too where its rows share it) runs once and its KV is expanded to every row,
as the rollout engine prefills it; the FLOPs counted stay the model's per-sequence figure (`compute`), as for the
rollout's shared prefill, so a budget does not depend on this choice.

Processes (`train.processes`, see `centralrl.distributed`): each process rolls out its contiguous share of the
step's questions with its own sampling stream, the loss is normalised by the trained tokens of every process,
the gradients are summed over processes, and every process takes the same optimizer step; the step's metrics
count every process's episodes. One process is the default and makes exactly the single-process run.

The run around these pieces (the step loop, budget cuts, resume) is `centralrl.rl.run`; the saved state is
`centralrl.rl.checkpoint`. Every draw of a step derives from (seed, step), so a resumed run ends
byte-identical to an uninterrupted one.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn.utils import clip_grad_norm_

from centralrl.assembly import run_settings
from centralrl.compute import ModelShape, update_flops
from centralrl.config import TOPOLOGY_ROLES, Config, GrpoConfig, adapter_names
from centralrl.distributed import World
from centralrl.errors import DataError
from centralrl.harness.engine import RolePolicy, prefixed_states, shared_prefix
from centralrl.hardware import compute_dtype, return_free_memory
from centralrl.harness.episodes import TOPOLOGIES, Episode, RunSettings
from centralrl.models.adapters import frozen_linears_in, set_activation_checkpointing
from centralrl.retrieval.base import Retriever
from centralrl.rl.grpo import (
    group_advantages,
    grpo_loss,
    head_logprobs,
    groups_with_signal,
    lr_multiplier,
    micro_batches,
)
from centralrl.rl.rewards import QUESTION_REWARDS, outcome_reward
from centralrl.schema import Question, interleave
from centralrl.seeding import derive_seed


UPDATE_SUMS = ("loss", "clipped", "kl", "drift", "tokens")  # what an update sums over its trained tokens


@dataclass(frozen=True)
class Sample:
    """One trainable role call: the sequence, where its completion starts, its adapter and advantage, and the
    log-prob the rollout recorded for each completion token (the sampling policy's, at its temperature)."""

    adapter: str
    ids: tuple[int, ...]
    completion_start: int
    advantage: float
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.logprobs) != self.trained_tokens:
            raise ValueError(
                f"a {self.adapter} sample has {self.trained_tokens} completion tokens but {len(self.logprobs)} "
                "recorded log-probs; the engine must record one per completion token"
            )

    @property
    def trained_tokens(self) -> int:
        return len(self.ids) - self.completion_start


def episode_rewards(episodes: Sequence[Episode], cfg: Config) -> list[float]:
    r = cfg.train.reward
    return [
        outcome_reward(
            e.prediction, e.question.golden_answers, r.metric, all(c.valid for c in e.calls), r.format_weight
        )
        for e in episodes
    ]


def informative_episodes(informative: Sequence[bool], group_size: int) -> list[int]:
    """Indices of the episodes of the informative groups; episodes are laid out group by group, G each.

    >>> informative_episodes([False, True, False, True], 2)
    [2, 3, 6, 7]
    """
    return [group * group_size + j for group, flag in enumerate(informative) if flag for j in range(group_size)]


def informative_samples(
    episodes: Sequence[Episode], rewards: torch.Tensor, g: GrpoConfig
) -> tuple[list[bool], list[Sample]]:
    """One flag per group (question) whose rewards differ, and the training samples of those groups' episodes,
    each with its own episode's group-normalised advantage."""
    advantages = group_advantages(rewards, g.normalize_std, g.eps).flatten().tolist()
    informative = groups_with_signal(rewards).tolist()
    kept = informative_episodes(informative, g.group_size)
    return informative, training_samples([episodes[i] for i in kept], [advantages[i] for i in kept])


def training_samples(episodes: Sequence[Episode], advantages: Sequence[float]) -> list[Sample]:
    """Every call made with an adapter (a trainable role), carrying its episode's advantage."""
    return [
        Sample(call.adapter, call.prompt_ids + call.completion_ids, len(call.prompt_ids), advantage, call.logprobs)
        for episode, advantage in zip(episodes, advantages)
        for call in episode.calls
        if call.adapter is not None and call.completion_ids
    ]


def _padded(samples: Sequence[Sample], pad: int, device) -> tuple[torch.Tensor, ...]:
    """Right-padded ids [B, L], attention mask [B, L], the loss mask over predicted tokens [B, L-1] (bool), and
    the recorded log-probs of the rollout at those positions [B, L-1] (0 elsewhere)."""
    width = max(len(s.ids) for s in samples)
    ids = torch.full((len(samples), width), pad, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(samples), width - 1), dtype=torch.bool)
    recorded = torch.zeros((len(samples), width - 1))
    for row, sample in enumerate(samples):
        completion = slice(sample.completion_start - 1, len(sample.ids) - 1)  # position t predicts token t+1
        ids[row, : len(sample.ids)] = torch.tensor(sample.ids)
        attention[row, : len(sample.ids)] = 1
        loss_mask[row, completion] = True
        recorded[row, completion] = torch.tensor(sample.logprobs)
    return ids.to(device), attention.to(device), loss_mask.to(device), recorded.to(device)


def _logprobs(
    decoder, head, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor, temperature: float, shared: int = 0
):
    """Log-probs [B, L-1] of the tokens `mask` marks (0 elsewhere): the decoder over every position (the first
    `shared`, predicting no trained token, once: `prefixed_states`), the output head only where a trained token is
    predicted."""
    hidden = prefixed_states(decoder, ids, attention, shared)
    keep = mask[:, shared:]
    trained = head_logprobs(hidden[:, :-1][keep], head, ids[:, shared + 1 :][keep], temperature)
    return torch.zeros(mask.shape, device=trained.device).masked_scatter(mask, trained)


def prefix_positions(samples: Sequence[Sample]) -> int:
    """The leading positions every sample's ids share and none of them trains on (the last prompt position
    predicts the first trained token, so it stays each row's own).

    >>> prefix_positions([Sample("a", (1, 2, 3, 4, 5), 3, 1.0, (0.0, 0.0)), Sample("a", (1, 2, 3, 6), 3, 1.0, (0.0,))])
    2
    """
    return min(shared_prefix([s.ids for s in samples]), min(s.completion_start for s in samples) - 1)


def forward_batches(group: Sequence[Sample], g: GrpoConfig) -> list[tuple[list[int], int]]:
    """The micro-batches `update` runs over one adapter's samples, each with the prefix positions it runs once:
    sorted by length and capped (`grpo.micro_batches`); with `shared_prefix` the caps count the positions after
    the prefix all of them share, and a micro-batch of several rows runs its own common prefix once (one row
    runs whole: nothing to save)."""
    common = prefix_positions(group) if g.shared_prefix else 0
    batches = micro_batches([len(s.ids) - common for s in group], g.micro_batch_size, g.forward_tokens)
    sharing = g.shared_prefix
    return [(rows, prefix_positions([group[i] for i in rows]) if sharing and len(rows) > 1 else 0) for rows in batches]


def loss_denominator(samples: Sequence[Sample], mode: str) -> float:
    """The loss's normaliser over `samples`: trained tokens ("token") or sequences ("sequence")."""
    return float(sum(s.trained_tokens for s in samples)) if mode == "token" else float(len(samples))


def update(
    model,
    samples: Sequence[Sample],
    g: GrpoConfig,
    temperature: float,
    pad: int,
    denominator: float,
    measure_kl: bool = False,
) -> dict[str, float]:
    """Accumulate the GRPO loss over micro-batches, grouped by adapter, normalised by `denominator` (that of the
    whole step's batch, over every process); return the sums over trained tokens of the loss, clipped tokens, KL
    and drift (|update log-prob - recorded log-prob|), and the token count. The KL to the start needs the reference
    forward (the adapters disabled, no grad): it runs when `kl_coef` > 0 or `measure_kl` (the KL monitor of a run
    without a KL term); else the KL sum is 0. Each adapter's samples are sorted by length and cut into
    micro-batches of at most `micro_batch_size` sequences and `forward_tokens` padded positions
    (`forward_batches`, which also says what prefix each runs once under `shared_prefix`); the forwards run in bf16
    autocast when `g.precision` resolves to bfloat16 on the model's device. After each micro-batch's backward its freed
    activations go back to the OS when the process is above `return_memory_above_gb` (`hardware.return_free_memory`):
    the next micro-batch's have other shapes, glibc could not fit them in the holes, and the heap grew (a joint step's
    update peaked at 3.5-3.8 GB RSS without, measured). In bf16 the frozen weights are cast once for the whole
    update (`frozen_linears_in`), the same values autocast would cast at every forward."""
    bf16 = compute_dtype(g.precision, next(model.parameters()).device) == torch.bfloat16
    with frozen_linears_in(model.get_base_model().base_model, torch.bfloat16) if bf16 else nullcontext():
        return _accumulate(model, samples, g, temperature, pad, denominator, measure_kl, bf16)


def _accumulate(model, samples, g: GrpoConfig, temperature, pad, denominator, measure_kl, bf16) -> dict[str, float]:
    """`update`'s loop over adapters and micro-batches."""
    device = next(model.parameters()).device
    base = model.get_base_model()
    decoder, head = base.base_model, base.get_output_embeddings()  # the LoRA layers live inside both
    totals = dict.fromkeys(UPDATE_SUMS, 0.0)
    for adapter in sorted({s.adapter for s in samples}):
        group = [s for s in samples if s.adapter == adapter]
        model.set_adapter(adapter)
        for rows, shared in forward_batches(group, g):
            batch = [group[i] for i in rows]
            ids, attention, mask, recorded = _padded(batch, pad, device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                reference = None
                if g.kl_coef or measure_kl:  # the starting policy: this model with its adapters off, no second copy
                    with torch.no_grad(), model.disable_adapter():
                        reference = _logprobs(decoder, head, ids, attention, mask, temperature, shared)
                logp = _logprobs(decoder, head, ids, attention, mask, temperature, shared)
            advantages = torch.tensor([s.advantage for s in batch], device=device)
            loss, stats = grpo_loss(
                logp, recorded, reference, advantages, mask, g.clip_eps, g.kl_coef, g.loss_normalization, denominator
            )
            loss.backward()
            return_free_memory()
            tokens = float(mask.sum())
            totals["loss"] += float(loss.detach())
            totals["clipped"] += stats["clip_fraction"] * tokens
            totals["kl"] += stats["kl"] * tokens
            totals["drift"] += float((logp.detach() - recorded)[mask].abs().sum())
            totals["tokens"] += tokens
    return totals


def deal(questions: Sequence[Question], seed: int) -> list[Question]:
    """The training seed's deal of the questions: shuffled, then round-robin over their benchmarks, so every
    prefix holds each benchmark's share (arms of one seed get the same deal)."""
    return interleave(random.Random(derive_seed(seed, "pool")).sample(list(questions), len(questions)))


def fixed_pool(questions: Sequence[Question], size: int, per_step: int, seed: int, source: str) -> list[Question]:
    """The training questions a run's steps draw from (`train.grpo.pool`): all of them when `size` is 0, else
    the first `size` of the seed's deal. `source` names the training file in the errors for too few questions
    (fewer than a step's `per_step` were drawn in silence, or were a traceback under uniform sampling)."""
    if len(questions) < per_step:
        raise DataError(
            f"{source}: {len(questions)} training questions are left after the dev split, fewer than "
            f"train.grpo.questions_per_step ({per_step})"
        )
    if not size:
        return list(questions)
    if size > len(questions):
        raise DataError(f"{source}: train.grpo.pool is {size} but {len(questions)} training questions are left")
    return deal(questions, seed)[:size]


def sift_shortfall(source: str, kept: Counter[str], quota: Counter[str]) -> str:
    """What `Trainer.sift_pool` says when a benchmark has too few questions the start sometimes solves."""
    short = ", ".join(f"{b}: {kept[b]} of {n}" for b, n in sorted(quota.items()) if kept[b] < n)
    return (
        f"{source}: train.grpo.pool_filter informative found too few questions whose sampled groups' rewards "
        f"differ ({short}) among all the training questions; lower train.grpo.pool or set pool_filter none"
    )


@dataclass
class Trainer:
    """Everything one arm's GRPO run holds, and its step: `rollout`, `rewards`, then `learn` (or `train_step`)."""

    cfg: Config
    policy: RolePolicy
    retriever: Retriever
    questions: list[Question]
    topology: str
    seed: int
    step: int = 0
    world: World = field(default_factory=World)  # the data-parallel processes (one by default)
    dev: list[Question] = field(default_factory=list)  # held-out training questions scored during the run
    pool_flops: float = 0.0  # spent choosing the pool (`sift_pool`); the first step's row pays for it

    def __post_init__(self) -> None:
        g = self.cfg.train.grpo
        self.shape = ModelShape.of(self.policy.model)
        self.parameters = [p for name, p in sorted(self.policy.model.named_parameters()) if "lora_" in name]
        if g.activation_checkpointing:
            set_activation_checkpointing(self.policy.model, True)
        self.optimizer = torch.optim.AdamW(self.parameters, lr=g.learning_rate, weight_decay=g.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_multiplier(g.lr_schedule, g.warmup_steps, g.steps)
        )

    def settings(self, draw: int = 0) -> RunSettings:
        # each process samples with its own stream; one process keeps the seeds it always had
        where = (("rank", self.world.rank) if self.world.size > 1 else ()) + (("draw", draw) if draw else ())
        seed = derive_seed(self.seed, "rollout", self.draw_step(), *where)
        return run_settings(self.cfg, False, seed, self.greedy_roles())

    def draw_step(self) -> int:
        """The step whose questions and sampling streams this step draws: its own, or under `revisit` k the last k
        of the `steps` batches those of the first k (step n - k draws as step 0)."""
        g = self.cfg.train.grpo
        repeat_from = g.steps - g.revisit
        return self.step - repeat_from if g.revisit and self.step >= repeat_from else self.step

    def greedy_roles(self) -> list[str]:
        """The roles a rollout decodes greedily: the frozen ones (no adapter) under `frozen_roles: greedy`."""
        if self.cfg.train.grpo.frozen_roles == "sampled":
            return []
        return [role for role in TOPOLOGY_ROLES[self.topology] if self.policy.adapters.get(role) is None]

    def sift_pool(self, source: str) -> None:
        """`train.grpo.pool_filter: informative`: the pool becomes the first questions of the seed's deal on which
        the current policy's group of sampled episodes had rewards that differ, as many of each benchmark as the
        plain pool holds. Candidates are rolled out `pool` at a time, only of benchmarks still short; their FLOPs
        go to `pool_flops`. `source` names the training file in the error when a benchmark runs out."""
        g = self.cfg.train.grpo
        candidates = deal(self.questions, self.seed)
        quota = Counter(q.benchmark for q in candidates[: g.pool])
        kept: Counter[str] = Counter()
        pool: list[Question] = []
        waiting = iter(candidates)
        self.policy.model.eval()
        for round_ in itertools.count():
            short = {b for b in quota if kept[b] < quota[b]}
            if not short:
                break
            chunk = list(itertools.islice((q for q in waiting if q.benchmark in short), g.pool))
            if not chunk:
                raise DataError(sift_shortfall(source, kept, quota))
            settings = run_settings(self.cfg, False, derive_seed(self.seed, "pool", round_), self.greedy_roles())
            episodes = self.play_groups(chunk, settings)
            self.pool_flops += float(sum(e.flops(self.shape) for e in episodes))
            for question, differs in zip(chunk, groups_with_signal(self.rewards(episodes)).tolist()):
                if differs and kept[question.benchmark] < quota[question.benchmark]:
                    kept[question.benchmark] += 1
                    pool.append(question)
        self.questions = pool

    def draws(self) -> list[list[Question]]:
        """The step's question draws (the same in every process): questions_per_step questions, then as many
        for each of `extra_draws`, no question twice in a step. The first draw is the one a run without extra
        draws takes. `stratified`: the pool shuffled, then dealt round-robin over its benchmarks (in shuffled
        order, so which benchmark gets the odd question varies), so every draw holds each benchmark's share."""
        g = self.cfg.train.grpo
        rng = random.Random(derive_seed(self.seed, "questions", self.draw_step()))
        if g.question_sampling == "stratified":
            wanted = (1 + g.extra_draws) * g.questions_per_step
            drawn = interleave(rng.sample(self.questions, len(self.questions)))[:wanted]
        else:
            drawn = self._uniform(rng)
        size = g.questions_per_step
        return [drawn[i : i + size] for i in range(0, len(drawn), size)]

    def _uniform(self, rng: random.Random) -> list[Question]:
        """At random from the pool, the extra draws from a stream of their own: as every run drew before
        `question_sampling` existed, so that those runs reproduce."""
        g = self.cfg.train.grpo
        first = rng.sample(self.questions, g.questions_per_step)
        rest = [q for q in self.questions if q not in first]
        rest = random.Random(derive_seed(self.seed, "questions", self.draw_step(), "extra")).sample(
            rest, min(len(rest), g.extra_draws * g.questions_per_step)
        )
        return first + rest

    def rollout(self) -> list[Episode]:
        """The step's episodes, group by group (G per question, this process's share). With `extra_draws`, the
        next draw is rolled out and appended while fewer than questions_per_step groups over every process have
        reward variance (DAPO's dynamic sampling; DAPO keeps drawing until the batch is full, here the number of
        draws is capped so a step's cost is bounded)."""
        g = self.cfg.train.grpo
        self.policy.model.eval()
        episodes: list[Episode] = []
        for draw, questions in enumerate(self.draws()):
            if draw and self.informative_groups(episodes) >= g.questions_per_step:
                break
            episodes += self.play_groups(self.world.shard(questions), self.settings(draw))
        return episodes

    def play_groups(self, questions: Sequence[Question], settings: RunSettings) -> list[Episode]:
        """G episodes of each question, group by group, with the current adapters."""
        batch = [q for q in questions for _ in range(self.cfg.train.grpo.group_size)]
        return TOPOLOGIES[self.topology](batch, self.policy, self.retriever, settings)

    def informative_groups(self, episodes: Sequence[Episode]) -> float:
        """Groups with reward variance among `episodes`, summed over every process."""
        return self.world.total([float(groups_with_signal(self.rewards(episodes)).sum())])[0]

    def rewards(self, episodes: Sequence[Episode]) -> torch.Tensor:
        """Rewards as [questions, G], the layout `group_advantages` normalises over."""
        g = self.cfg.train.grpo
        return torch.tensor(episode_rewards(episodes, self.cfg)).view(-1, g.group_size)

    @contextmanager
    def _update_draws(self) -> Iterator[None]:
        """The update's random draws (LoRA dropout's masks) from a generator seeded by (seed, step, process) and
        the global one put back after: a resumed run draws the same masks with nothing to restore, on any device
        and in every process."""
        devices = [self.world.device] if self.world.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(derive_seed(self.seed, "update", self.step, self.world.rank))
            yield

    def learn(self, episodes: Sequence[Episode], rewards: torch.Tensor) -> dict:
        """Advantages, then one accumulated update of every trainable adapter over the informative groups only
        (gradients summed over processes), optimizer and schedule step; the step's metrics over every process.

        A step in which no group of any process has reward variance carries no signal: it runs no forward or
        backward, and neither the optimizer (whose momentum would still move the weights) nor the schedule
        steps. It is logged with `skipped` 1 and its rollout cost, and trains no tokens.

        The logged `learning_rate` is the rate this step's update used: the optimizer's, read before the schedule
        steps (after it, the schedule holds the next update's). A skipped step logs the rate it would have used,
        which is the one the next update uses, as the schedule did not step."""
        g = self.cfg.train.grpo
        informative, samples = informative_samples(episodes, rewards, g)
        informative_groups, denominator = self.world.total(
            [float(sum(informative)), loss_denominator(samples, g.loss_normalization)]
        )
        local = dict.fromkeys(UPDATE_SUMS, 0.0)
        grad_norm = 0.0
        measured = bool(informative_groups) and self.measures_kl()
        rate = self.optimizer.param_groups[0]["lr"]  # before `_optimize` steps the schedule
        if informative_groups:
            with self._update_draws():
                local, grad_norm = self._optimize(samples, denominator, measured)
        self.step += 1
        metrics = self.gathered_metrics(episodes, rewards, samples, local, grad_norm, measured, rate)
        # sorted: a set of adapter names iterates in an order that changes with PYTHONHASHSEED (the history bytes)
        untrained = {f"trained_tokens.{a}": 0.0 for a in adapter_names(self.policy.adapters)}
        return (
            untrained
            | metrics
            | {
                "skipped": float(not informative_groups),
                "informative_groups": informative_groups,
                "informative_share": informative_groups / (metrics["episodes"] / g.group_size),
            }
        )

    def measures_kl(self) -> bool:
        """Whether the coming step's update runs the reference forward: every step with a KL term, else every
        `train.health.kl_every` steps and the last (the monitor that lets `max_kl` stop a run without a KL term;
        a run shorter than kl_every was never measured)."""
        every, last = self.cfg.train.health.kl_every, self.step + 1 == self.cfg.train.grpo.steps
        return self.cfg.train.grpo.kl_coef > 0 or (every > 0 and ((self.step + 1) % every == 0 or last))

    def _optimize(
        self, samples: Sequence[Sample], denominator: float, measure_kl: bool
    ) -> tuple[dict[str, float], float]:
        """`updates_per_rollout` times: the update, the summed gradients clipped, one optimizer step; then one
        schedule step (its horizon is rollout steps). Returns the update sums over every pass (the loss as their
        mean) and the mean grad norm."""
        g = self.cfg.train.grpo
        self.policy.release_copies()
        totals: dict[str, float] = {}
        norms = []
        with self.policy.clock.phase("update"):
            self.policy.model.train()
            for _ in range(g.updates_per_rollout):
                local = update(
                    self.policy.model,
                    samples,
                    g,
                    self.cfg.harness.temperature,
                    self.policy.tokenizer.pad_token_id,
                    denominator,
                    measure_kl,
                )
                totals = {k: totals.get(k, 0.0) + v for k, v in local.items()}
                self.world.sum_gradients(self.parameters)
                norms.append(float(clip_grad_norm_(self.parameters, g.max_grad_norm)))
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
            self.policy.model.eval()
        self.policy.weights_changed()
        totals["loss"] /= g.updates_per_rollout
        return totals, sum(norms) / len(norms)

    def gathered_metrics(
        self,
        episodes: Sequence[Episode],
        rewards: torch.Tensor,
        samples: Sequence[Sample],
        local: dict[str, float],
        grad_norm: float,
        measured_kl: bool,
        learning_rate: float,
    ) -> dict:
        """The step's metrics over every process's episodes, samples and update sums; `measured_kl`: whether the
        update ran the reference forward (its FLOPs count); `learning_rate`: the rate the update used (`learn`).
        Without a KL term, "kl" is there only for the steps that measured it (`measures_kl`): a 0 would read as a
        policy that had not moved."""
        g = self.cfg.train.grpo
        totals = dict(zip(local, self.world.total(list(local.values()))))
        episodes, samples = self.world.gather(episodes), self.world.gather(samples)
        rewards = torch.tensor(self.world.gather(rewards.flatten().tolist())).view(-1, g.group_size)
        stats = {
            "loss": totals["loss"],
            "clip_fraction": totals["clipped"] / max(totals["tokens"], 1.0),
            "kl": totals["kl"] / max(totals["tokens"], 1.0),
            # mean |update log-prob - rollout log-prob| per trained token: the precision gap (bf16 rollouts, a float32
            # update) the clip absorbs, which clip_fraction alone mixes with the policy's movement (mu > 1)
            "logprob_drift": totals["drift"] / max(totals["tokens"], 1.0),
            "grad_norm": grad_norm,
            "learning_rate": learning_rate,
            "flops.generation": float(sum(e.flops(self.shape) for e in episodes)),
            "flops.update": g.updates_per_rollout
            * float(
                sum(
                    update_flops(self.shape, s.completion_start, s.trained_tokens, reference_forward=measured_kl)
                    for s in samples
                )
            ),
        }
        if not (g.kl_coef > 0 or measured_kl):
            del stats["kl"]
        return step_metrics(episodes, rewards, samples, stats)

    def train_step(self) -> dict:
        episodes = self.rollout()
        return self.learn(episodes, self.rewards(episodes))


def subquestions(episode: Episode) -> int:
    """The sub-questions the central agent delegated in `episode` (its retrieval calls)."""
    return sum(call.role == "retrieval" for call in episode.calls)


def step_metrics(episodes, rewards, samples, stats) -> dict:
    """What a step logs: reward, F1, the update's statistics, tokens per role, and each role's health: its
    calls' mean response length, share of invalid actions and one-sample entropy estimate (the mean negative
    log-prob of its sampled tokens); and the sub-questions the central agent delegated per episode. Reward and
    sub-questions also per benchmark (`<key>.<benchmark>`): a central agent that learns asks one sub-question
    for a 1-hop question and two for a 2-hop one, where one that drifts moves both the same way. Every value
    is a float but `QUESTION_REWARDS`, each question's mean reward (sorted by id)."""
    metrics = {
        "episodes": float(len(episodes)),
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "f1": sum(outcome_reward(e.prediction, e.question.golden_answers) for e in episodes) / len(episodes),
        "entropy": -float(np.mean([lp for e in episodes for c in e.calls if c.adapter for lp in c.logprobs] or [0.0])),
        "subquestions_per_episode": sum(map(subquestions, episodes)) / len(episodes),
        **{k: float(v) for k, v in stats.items()},
    }
    flat_rewards = rewards.flatten().tolist()  # episodes are laid out group by group, as the rewards
    for benchmark in sorted({e.question.benchmark for e in episodes}):
        mine = [i for i, e in enumerate(episodes) if e.question.benchmark == benchmark]
        metrics[f"reward_mean.{benchmark}"] = sum(flat_rewards[i] for i in mine) / len(mine)
        metrics[f"subquestions_per_episode.{benchmark}"] = sum(subquestions(episodes[i]) for i in mine) / len(mine)
    metrics[QUESTION_REWARDS] = {
        qid: float(np.mean([r for e, r in zip(episodes, flat_rewards) if e.question.id == qid]))
        for qid in sorted({e.question.id for e in episodes})
    }
    for role in sorted({c.role for e in episodes for c in e.calls}):
        calls = [c for e in episodes for c in e.calls if c.role == role]
        metrics[f"prompt_tokens.{role}"] = float(sum(len(c.prompt_ids) for c in calls))
        metrics[f"generated_tokens.{role}"] = float(sum(len(c.completion_ids) for c in calls))
        metrics[f"response_tokens.{role}"] = metrics[f"generated_tokens.{role}"] / len(calls)
        metrics[f"invalid_rate.{role}"] = sum(not c.valid for c in calls) / len(calls)
        metrics[f"entropy.{role}"] = -float(np.mean([lp for c in calls for lp in c.logprobs] or [0.0]))
    for adapter in sorted({s.adapter for s in samples}):
        metrics[f"trained_tokens.{adapter}"] = float(sum(s.trained_tokens for s in samples if s.adapter == adapter))
    return metrics
