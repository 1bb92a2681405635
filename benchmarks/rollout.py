"""Rollout benchmark: the batched episode runner against a one-episode-at-a-time loop and against raw
`model.generate` on the same token counts, side by side in one run on the same questions; or the two
generation engines (transformers, vLLM) side by side; or today's transformers engine against the one before
issue 12 (--old-vs-new).

    python benchmarks/rollout.py --model models/main/backbone --index index --questions data/test.jsonl --n 16
    python benchmarks/rollout.py ... --engine vllm          # the same figures with vLLM generating
    python benchmarks/rollout.py ... --compare-engines      # transformers and vLLM, same questions, one process
    python benchmarks/rollout.py --old-vs-new --model models/main/backbone --questions data/train.jsonl \\
        --eval-questions data/test.jsonl --steps 4 --threads 1   # -> benchmarks/results/rollout_speed.json

Figures: episodes/s and generated tokens/s of (a) the batched runner, (b) the same runner called with one
question at a time, and (c) plain `model.generate` replaying the batched run's generation batches (same
prompts, forced to the same number of new tokens per batch, no stop strings, no parsing, no retrieval).
(a)/(c) is the harness's overhead (with --engine vllm it compares vLLM's runner against transformers'
raw generate); (a)/(b) what batching buys. --compare-engines runs (a) once untimed on one question per
engine (warm-up: CUDA kernels, vLLM's first adapter sync), then timed on every question, and reports each
engine's figures and vllm/transformers ratios. Sampling (not greedy) so every question runs the same kind of
work as in training. The model goes to `harness.device` (CPU on a machine without CUDA). Roles run frozen
(no adapters), or with --adapters on fresh LoRA adapters for central, retrieval and conclusion (the joint arm as
training starts it; lora_B is zero, so the tokens are the frozen model's), so that the vLLM engine runs its LoRA
path: `enable_lora`, the adapter sync, a `LoRARequest` per role. Writes the figures to --out as JSON.

--old-vs-new: the joint arm's policy as training starts it (fresh LoRA adapters on central, retrieval and
conclusion), and three engines over that one model: `old` (`OldRolePolicy`, kept in this file only: the engine
before issue 12, `model.generate` through the PEFT wrapper in fp32), `new_fp32` and `new_bf16` (`RolePolicy`
with the new decode loop, on the model itself in fp32 or on bf16 merged copies). Rollouts as a GRPO step runs
them (`--questions-per-step` training questions x `--group-size` samples, temperature sampling, a seed per step),
`--steps` steps, the three engines interleaved (their order rotates each step) in one process with `--threads`
torch threads; `weights_changed()` before each new-engine step, so the merged copies are rebuilt as after an
optimizer step. Then greedy evaluation of `--n-eval` test questions by each engine: answers side by side
(share identical, F1). Every forward of the causal LM is timed and counted (`ForwardMeter`): prefill (more than
one token per row) and decode time, padded share of prefilled positions, finished-row share of decode row-steps
(row-steps that no kept token needed). Also the machine's matmul GFLOPS (fp32, bf16) and each rate as a fraction
of it. The sampled tokens differ between engines (another random stream, another precision), so each engine's
rates are over its own tokens; `*speedup*` keys are new/old ratios.
"""

from __future__ import annotations

import argparse

import cli
from cli import check_out, count, run_main

OLD_VS_NEW = {  # the options only --old-vs-new reads, and their defaults
    "steps": 4,
    "questions_per_step": 2,
    "group_size": 4,
    "eval_questions": "data/test.jsonl",
    "n_eval": 16,
    "seed": 0,
}
OTHER_MODES = {"n": 16, "engine": "transformers", "adapters": False}  # the options only the runner modes read


def with_mode_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Refuse an option the chosen mode would ignore (it was dropped silently); then fill in the defaults."""
    given = [name for name in (*OLD_VS_NEW, *OTHER_MODES) if getattr(args, name) is not None]
    ignored = [name for name in given if name in (OTHER_MODES if args.old_vs_new else OLD_VS_NEW)]
    ignored += ["compare_engines"] if args.old_vs_new and args.compare_engines else []
    ignored += ["engine"] if args.compare_engines and args.engine is not None else []
    if ignored:
        mode = "--old-vs-new" if args.old_vs_new else "--compare-engines" if args.compare_engines else "this mode"
        options = ", ".join(f"--{name.replace('_', '-')}" for name in ignored)
        parser.error(f"{options}: not read by {mode} (see --help)")
    for name, default in (OLD_VS_NEW | OTHER_MODES).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__)
    cli.harness_arguments(parser, start=False)
    parser.add_argument("--questions", default="data/test.jsonl", help="questions (JSONL); --old-vs-new samples them")
    parser.add_argument("--n", type=count, help="questions (taken evenly across the file; default 16)")
    parser.add_argument("--threads", type=count, default=1, help="torch intra-op threads of this process")
    parser.add_argument(
        "--engine",
        choices=("transformers", "vllm"),
        help="generation engine of the runner (default transformers; vllm: the gpu extra, a CUDA GPU; "
        "harness.vllm settings)",
    )
    parser.add_argument(
        "--compare-engines",
        action="store_true",
        help="run the batched runner on both engines, same questions, and report their ratio",
    )
    parser.add_argument(
        "--adapters",
        action="store_true",
        default=None,  # None: not given (with_mode_defaults)
        help="fresh LoRA adapters on central, retrieval and conclusion (vLLM: its LoRA path; see above)",
    )
    parser.add_argument(
        "--old-vs-new", action="store_true", help="the engine before issue 12 against today's (see above)"
    )
    parser.add_argument("--steps", type=count, help="--old-vs-new: rollout batches per engine (default 4)")
    parser.add_argument("--questions-per-step", type=count, help="--old-vs-new: questions per batch (default 2)")
    parser.add_argument("--group-size", type=count, help="--old-vs-new: samples per question (default 4)")
    parser.add_argument(
        "--eval-questions", help="--old-vs-new: the file of the greedy evaluation questions (default data/test.jsonl)"
    )
    parser.add_argument(
        "--n-eval", type=count, help="--old-vs-new: how many of them to evaluate (taken evenly; default 16)"
    )
    parser.add_argument("--seed", type=int, help="--old-vs-new: questions, LoRA init and sampling (default 0)")
    parser.add_argument(
        "--out", default=None, help="default benchmarks/results/rollout.json (rollout_speed.json with --old-vs-new)"
    )
    return with_mode_defaults(parser, parser.parse_args(argv))


def require_inputs(args: argparse.Namespace) -> None:
    """The question files the mode reads exist (DataError naming one that does not), before the model loads."""
    from centralrl.io import require_file

    for path in (args.questions, args.eval_questions) if args.old_vs_new else (args.questions,):
        require_file(path)


if __name__ == "__main__":  # the command line and the input files before the heavy imports below: --help, usage
    ARGUMENTS = arguments()  # errors and a missing input at once
    run_main(lambda: require_inputs(ARGUMENTS))

import functools
import json
import os
import platform
import random
import resource
import time
from collections import Counter

import torch
from transformers import GenerationConfig

from centralrl.assembly import load_model, run_settings
from centralrl.compute import ModelShape, generation_flops
from centralrl.config import load_config
from centralrl.errors import DataError
from centralrl.hardware import compute_dtype
from centralrl.harness.engine import RolePolicy, causal_lm, open_policy, shared_prefix, trim_generation
from centralrl.harness.episodes import run_central
from centralrl.harness.protocol import STOP_STRINGS
from centralrl.io import write_json
from centralrl.metrics import f1
from centralrl.config import role_adapters
from centralrl.models.adapters import acting_as, adapters_of, attach_adapters
from centralrl.retrieval import open_retriever
from centralrl.schema import read_questions
from centralrl.seeding import derive_seed


def generated_tokens(episodes) -> int:
    return sum(len(call.completion_ids) for episode in episodes for call in episode.calls)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


@torch.no_grad()
def raw_generate(policy: RolePolicy, episodes, batch_size: int) -> tuple[int, float]:
    """Replay every generation batch of the batched run with plain model.generate; return (tokens, seconds)."""
    groups: dict[tuple[str, int], list] = {}
    for episode in episodes:
        for call in episode.calls:
            groups.setdefault((call.role, call.turn), []).append(call)
    tokens, seconds = 0, 0.0
    pad = policy.tokenizer.pad_token_id
    for calls in groups.values():
        for start in range(0, len(calls), batch_size):
            batch = calls[start : start + batch_size]
            width = max(len(c.prompt_ids) for c in batch)
            new = max(len(c.completion_ids) for c in batch)
            ids = torch.tensor(
                [[pad] * (width - len(c.prompt_ids)) + list(c.prompt_ids) for c in batch], device=policy.device
            )
            mask = (
                torch.arange(width)[None, :] >= torch.tensor([width - len(c.prompt_ids) for c in batch])[:, None]
            ).long()
            mask = mask.to(policy.device)
            _, took = timed(
                lambda: policy.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=True,
                    top_k=0,
                    pad_token_id=pad,
                )
            )
            tokens += new * len(batch)
            seconds += took
    return tokens, seconds


def rates(episodes, n: int, seconds: float) -> dict:
    tokens = generated_tokens(episodes)
    return {
        "seconds": round(seconds, 2),
        "episodes_per_s": round(n / seconds, 4),
        "generated_tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 2),
    }


def one_engine(policy: RolePolicy, questions, retriever, settings, batch_size: int) -> dict:
    """(a) batched, (b) one at a time, (c) raw model.generate replaying (a)'s batches."""
    batched, batched_s = timed(lambda: run_central(questions, policy, retriever, settings))
    single, single_s = timed(lambda: [e for q in questions for e in run_central([q], policy, retriever, settings)])
    raw_tokens, raw_s = raw_generate(policy, batched, batch_size)
    figures = {
        "batched": rates(batched, len(questions), batched_s),
        "one_at_a_time": rates(single, len(questions), single_s),
        "raw_generate": {
            "seconds": round(raw_s, 2),
            "generated_tokens": raw_tokens,
            "tokens_per_s": round(raw_tokens / raw_s, 2),
        },
    }
    figures["batching_speedup_episodes"] = round(
        figures["batched"]["episodes_per_s"] / figures["one_at_a_time"]["episodes_per_s"], 2
    )
    figures["harness_overhead"] = round(batched_s / raw_s, 2)
    return figures


def compare_engines(policies: dict[str, RolePolicy], questions, retriever, settings) -> dict:
    """The batched runner on each engine, warmed up on one question first; vllm/transformers ratios."""
    figures: dict = {}
    for name, policy in policies.items():
        run_central(questions[:1], policy, retriever, settings)  # warm-up, untimed
        episodes, seconds = timed(lambda: run_central(questions, policy, retriever, settings))
        figures[name] = rates(episodes, len(questions), seconds)
    for what in ("episodes_per_s", "tokens_per_s"):
        figures[f"vllm_over_transformers_{what}"] = round(figures["vllm"][what] / figures["transformers"][what], 2)
    return figures


class OldRolePolicy(RolePolicy):
    """The transformers engine before issue 12, to measure against: left-padded batches of `batch_size` in input
    order, `model.generate` through the PEFT wrapper in the model's dtype, torch's global RNG seeded per batch,
    generate's own stop strings, then `trim_generation`. It ends at today's `end_ids` (every end-of-sequence id
    the model declares), so both engines stop at the same tokens."""

    def generate(self, role, prompts, max_new_tokens, greedy, temperature=1.0, seed=0):
        results = []
        prompts = self.fit_prompts(role, prompts, max_new_tokens)
        with self.clock.phase("generation"):
            for start in range(0, len(prompts), self.batch_size):
                batch = prompts[start : start + self.batch_size]
                torch.manual_seed(derive_seed(seed, role, start))
                results.extend(self._generate_batch(role, batch, max_new_tokens, greedy, temperature))
        return results

    @torch.no_grad()
    def _generate_batch(self, role, prompts, max_new_tokens, greedy, temperature):
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            temperature=1.0 if greedy else temperature,
            top_k=None if greedy else 0,
            top_p=1.0,
            pad_token_id=pad,
            eos_token_id=sorted(self.end_ids),  # every end id the model declares, as today's engine stops
            stop_strings=STOP_STRINGS.get(role),
            output_scores=True,
            return_dict_in_generate=True,
        )
        with acting_as(self.model, self.adapters.get(role)):
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attention, generation_config=config, tokenizer=self.tokenizer
            )
        generated = out.sequences[:, width:]
        logprobs = torch.stack(out.scores, dim=1).float().log_softmax(-1)
        chosen = logprobs.gather(-1, generated.unsqueeze(-1)).squeeze(-1)
        return [
            trim_generation(self.tokenizer, self.end_ids, prompt, generated[i].tolist(), chosen[i].tolist(), role)
            for i, prompt in enumerate(prompts)
        ]


class ForwardMeter:
    """Times and counts every forward of one causal LM class (installed on the class, so the PEFT-wrapped model
    under `model.generate`, the model itself and its bf16 copies are all measured). A forward over more than
    one token per row is a prefill, over one a decode step."""

    def __init__(self, lm_class: type) -> None:
        self.counts: Counter = Counter()
        original = lm_class.forward
        meter = self

        @functools.wraps(original)
        def forward(module, *args, **kwargs):
            start = time.perf_counter()
            out = original(module, *args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            meter.record(kwargs["input_ids"], kwargs.get("attention_mask"), time.perf_counter() - start)
            return out

        lm_class.forward = forward

    def record(self, ids: torch.Tensor, mask: torch.Tensor | None, seconds: float) -> None:
        rows, width = ids.shape
        kind = "prefill" if width > 1 else "decode"
        self.counts[f"{kind}_seconds"] += seconds
        self.counts[f"{kind}_positions"] += rows * width
        self.counts[f"{kind}_forwards"] += 1
        if mask is not None:
            self.counts[f"{kind}_padded"] += int((mask[:, -width:] == 0).sum())

    def take(self) -> Counter:
        counts, self.counts = self.counts, Counter()
        return counts


def matmul_gflops(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    """Best of `repeats` timings of a size x size matmul in `dtype` on this process's torch threads, in GFLOPS."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b  # warm-up
    best = min(timed(lambda: a @ b)[1] for _ in range(repeats))
    return round(2 * size**3 / best / 1e9, 1)


def memory_gb_per_s(megabytes: int = 256, repeats: int = 3) -> float:
    """Best of `repeats` copies of a `megabytes` buffer, bytes read plus written per second, in GB/s."""
    source = torch.ones(megabytes * 2**18)
    target = torch.empty_like(source)
    best = min(timed(lambda: target.copy_(source))[1] for _ in range(repeats))
    return round(2 * source.numel() * 4 / best / 1e9, 2)


def cpu_timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def prefix_shares(episodes) -> dict:
    """Share of the engines' prompt tokens that are a prefix shared by a whole call (role and turn) - prefilled
    once per batch by the new engine, so what halving the system prompts could still save is about half of it -
    and share that keeping the central agent's KV between turns would save on top (prefix shared with the
    same episode's previous central prompt, beyond the call's shared prefix)."""
    calls: dict[tuple, list] = {}
    for episode in episodes:
        for call in episode.calls:
            calls.setdefault((call.role, call.turn), []).append(call)
    prompt_tokens = sum(len(c.prompt_ids) for group in calls.values() for c in group)
    shared = {key: shared_prefix([c.prompt_ids for c in group]) for key, group in calls.items()}
    cross_turn = 0
    for episode in episodes:
        central = [c for c in episode.calls if c.role == "central"]
        for before, after in zip(central, central[1:]):
            common = shared_prefix([before.prompt_ids, after.prompt_ids])
            cross_turn += max(0, common - shared["central", after.turn])
    return {
        "call_shared_prefix_share_of_prompt_tokens": round(
            sum(shared[key] * len(group) for key, group in calls.items()) / prompt_tokens, 4
        ),
        "cross_turn_kv_share_of_prompt_tokens": round(cross_turn / prompt_tokens, 4),
    }


def usage(episodes, counts: Counter, wall: float, cpu: float, shape: ModelShape, machine: dict, dtype: str) -> dict:
    """One engine's rates and where its forwards went, from its episodes and its `ForwardMeter` counts. A decode
    step reads every weight once: its floor is the weights' bytes over the measured memory bandwidth."""
    calls = [call for episode in episodes for call in episode.calls]
    tokens = sum(len(c.completion_ids) for c in calls)
    needed_steps = sum(max(0, len(c.completion_ids) - 1) for c in calls)  # each kept token after the first
    flops = sum(generation_flops(shape, len(c.prompt_ids), len(c.completion_ids)) for c in calls)
    gflops, weight_bytes = machine["matmul_gflops"][dtype], shape.matmul_params * getattr(torch, dtype).itemsize
    decode_peak = gflops * 1e9 / (2 * shape.matmul_params)  # tokens/s if a token cost only its matmuls
    return {
        "episodes": len(episodes),
        "seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 2),
        "episodes_per_s": round(len(episodes) / wall, 4),
        "generated_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2),
        "tokens_per_cpu_s": round(tokens / cpu, 2),
        "prefill_seconds": round(counts["prefill_seconds"], 2),
        "decode_seconds": round(counts["decode_seconds"], 2),
        "decode_step_ms": round(1000 * counts["decode_seconds"] / max(1, counts["decode_forwards"]), 1),
        "decode_step_bandwidth_floor_ms": round(1000 * weight_bytes / machine["memory_gb_per_s"] / 1e9, 1),
        "rows_per_decode_step": round(counts["decode_positions"] / max(1, counts["decode_forwards"]), 2),
        "other_seconds": round(wall - counts["prefill_seconds"] - counts["decode_seconds"], 2),
        "prompt_tokens": sum(len(c.prompt_ids) for c in calls),
        "prefilled_positions": counts["prefill_positions"],
        "padding_share_of_prefilled": round(counts["prefill_padded"] / max(1, counts["prefill_positions"]), 4),
        "decode_row_steps": counts["decode_positions"],
        "finished_row_share_of_decode_row_steps": round(1 - needed_steps / max(1, counts["decode_positions"]), 4),
        "useful_gflops": round(flops / wall / 1e9, 2),
        "useful_gflops_fraction_of_matmul_peak": round(flops / wall / 1e9 / gflops, 4),
        "tokens_per_s_fraction_of_decode_peak": round(tokens / wall / decode_peak, 4),
    }


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def copies_mb(policy: RolePolicy) -> float:
    """Memory of the policy's generation copies (distinct storages of the plain and merged copies)."""
    models = [*policy.copies.plain.values(), *policy.copies.merged.values()]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for m in models for t in m.parameters()}
    return round(sum(storages.values()) / 2**20, 1)


def sampled_rollouts(policies: dict[str, RolePolicy], questions, retriever, cfg, args, meter, shape, machine) -> dict:
    """`args.steps` GRPO-like rollout batches per engine, engines interleaved (order rotating per step)."""
    names = list(policies)
    episodes = {name: [] for name in names}
    counts = {name: Counter() for name in names}
    wall = dict.fromkeys(names, 0.0)
    cpu = dict.fromkeys(names, 0.0)
    pool = random.Random(args.seed)
    for step in range(args.steps):
        batch = [q for q in pool.sample(questions, args.questions_per_step) for _ in range(args.group_size)]
        settings = run_settings(cfg, greedy=False, seed=derive_seed(args.seed, "rollout", step))
        for name in names[step % len(names) :] + names[: step % len(names)]:
            policies[name].weights_changed()
            meter.take()
            done, w, c = cpu_timed(lambda: run_central(batch, policies[name], retriever, settings))
            episodes[name] += done
            counts[name] += meter.take()
            wall[name] += w
            cpu[name] += c
    figures = {
        name: usage(episodes[name], counts[name], wall[name], cpu[name], shape, machine, dtype_of(name))
        | prefix_shares(episodes[name])
        for name in names
    }
    for name in names[1:]:
        for what in ("tokens_per_s", "tokens_per_cpu_s", "episodes_per_s"):
            figures[f"{name}_over_old_speedup_{what}"] = round(figures[name][what] / figures["old"][what], 2)
    return figures


def dtype_of(name: str) -> str:
    return "bfloat16" if name.endswith("bf16") else "float32"


def greedy_side_by_side(policies: dict[str, RolePolicy], questions, retriever, cfg, meter, shape, machine) -> dict:
    """Each engine's greedy evaluation of the same questions: rates, F1, answers identical to the fp32 ones."""
    settings = run_settings(cfg, greedy=True, seed=0)
    figures: dict = {}
    answers = {}
    for name, policy in policies.items():
        meter.take()
        done, w, c = cpu_timed(lambda: run_central(questions, policy, retriever, settings))
        answers[name] = [e.prediction for e in done]
        figures[name] = usage(done, meter.take(), w, c, shape, machine, dtype_of(name)) | {
            "f1": round(sum(f1(e.prediction, e.question.golden_answers) for e in done) / len(done), 4)
        }
    for name in ("new_fp32", "new_bf16"):
        against = "old" if name == "new_fp32" else "new_fp32"
        same = sum(a == b for a, b in zip(answers[name], answers[against])) / len(questions)
        figures[f"{name}_answers_identical_to_{against}"] = round(same, 4)
    figures["answers"] = [
        {"id": q.id, **{name: answers[name][i] for name in policies}} for i, q in enumerate(questions)
    ]
    return figures


def old_vs_new(cfg, args) -> dict:
    training = read_questions(args.questions)  # the inputs first: a missing file fails before the model loads
    evaluation = read_questions(args.eval_questions)
    evaluation = evaluation[:: max(1, len(evaluation) // args.n_eval)][: args.n_eval]
    if args.questions_per_step > len(training):
        raise DataError(
            f"--questions-per-step {args.questions_per_step}: {args.questions} has {len(training)} questions"
        )
    retriever = open_retriever(cfg.retrieval, args.index)
    torch.manual_seed(derive_seed(args.seed, "lora-init"))
    model, tokenizer = load_model(cfg, args.backbone, args.model)
    adapters = role_adapters(["central", "retrieval", "conclusion"], "per_role")
    model = attach_adapters(model, adapters, cfg.lora).eval()
    batch = cfg.harness.batch_size
    policies = {
        "old": OldRolePolicy(model, tokenizer, adapters, batch),
        "new_fp32": RolePolicy(model, tokenizer, adapters, batch, precision="float32", eval_precision="float32"),
        "new_bf16": RolePolicy(model, tokenizer, adapters, batch, precision="bfloat16", eval_precision="bfloat16"),
    }
    meter = ForwardMeter(type(causal_lm(model)))
    shape = ModelShape.of(model)
    machine = {
        "matmul_gflops": {name: matmul_gflops(getattr(torch, name)) for name in ("float32", "bfloat16")},
        "matmul_size": 2048,
        "memory_gb_per_s": memory_gb_per_s(),
    }
    start_rss = rss_mb()
    figures = {
        "threads": torch.get_num_threads(),
        **machine,
        "precision_auto_resolves_to": str(compute_dtype("auto", policies["old"].device)).removeprefix("torch."),
        "steps": args.steps,
        "questions_per_step": args.questions_per_step,
        "group_size": args.group_size,
        "temperature": cfg.harness.temperature,
        "sampled": sampled_rollouts(policies, training, retriever, cfg, args, meter, shape, machine),
        "greedy": greedy_side_by_side(policies, evaluation, retriever, cfg, meter, shape, machine),
    }
    new = policies["new_bf16"]
    new.weights_changed()
    merge = [timed(lambda: new.copies.get(adapter, torch.bfloat16))[1] for adapter in ("central", "retrieval")]
    figures["memory"] = {
        "peak_rss_before_rollouts_mb": round(start_rss, 1),
        "peak_rss_mb": round(rss_mb(), 1),
        "bf16_copies_mb": copies_mb(new),
        "merge_seconds_per_adapter": round(sum(merge) / len(merge), 3),
    }
    return figures


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    default = f"benchmarks/results/{'rollout_speed' if args.old_vs_new else 'rollout'}.json"
    out = check_out(default if args.out is None else args.out, args)  # '' is refused, not the default

    cfg = load_config(args.params)
    h = cfg.harness
    figures = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""),
        "model": args.model,
        "batch_size": h.batch_size,
        "max_turns": h.max_turns,
    }
    if args.old_vs_new:
        figures |= old_vs_new(cfg, args)
    else:
        figures |= other_modes(cfg, args)
    print(json.dumps(figures, indent=2))
    write_json(out, figures)
    print(f"written to {out}")


def other_modes(cfg, args) -> dict:
    """The batched runner against one-at-a-time and raw generate, or the two engines side by side."""
    questions = read_questions(args.questions)
    questions = questions[:: max(1, len(questions) // args.n)][: args.n]
    retriever = open_retriever(cfg.retrieval, args.index)
    model, tokenizer = load_model(cfg, args.backbone, args.model)
    if args.adapters:
        adapters = role_adapters(["central", "retrieval", "conclusion"], "per_role")
        model = attach_adapters(model, adapters, cfg.lora).eval()
    engines = ("transformers", "vllm") if args.compare_engines else (args.engine,)
    policies = {
        name: open_policy(
            cfg.harness.model_copy(update={"engine": name}), model, tokenizer, adapters_of(model), args.model
        )
        for name in engines
    }
    settings = run_settings(cfg, greedy=False, seed=cfg.seeds[0])
    figures = {
        "questions": len(questions),
        "engine": "both" if args.compare_engines else args.engine,
        "adapters": sorted(model.peft_config) if args.adapters else [],
    }
    if args.compare_engines:
        return figures | compare_engines(policies, questions, retriever, settings)
    return figures | one_engine(policies[args.engine], questions, retriever, settings, cfg.harness.batch_size)


if __name__ == "__main__":
    run_main(lambda: main(ARGUMENTS))
