"""Update benchmark: the GRPO update as it was before issue 12 against `trainer.update`, side by side in one
process, interleaved, on the same samples from one real rollout; the same for the warm start's steps; and how far
the update's log-probs drift from the ones the rollout recorded.

    python benchmarks/update.py --model models/main/backbone --index index --questions data/train.jsonl

Samples: one GRPO rollout of the joint arm (every role has an adapter, so every role call is trained) at step 0,
seed `--seed`, sampled in float32 (the model itself), with advantages from its real rewards (a group of equal
rewards gives zeros: the cost of a sample does not depend on its advantage). Paths, each run `--rounds` times in
turn on those samples, gradients zeroed before each run, no optimizer step:
- `old`: the update before issue 12 (`old_update` below): full [B, L, V] logits, each adapter's samples in rollout
  order, micro-batches of 8, float32, old log-probs = the update's own (ratio 1), KL term 0.02 (a reference
  forward);
- `new`: `trainer.update` with params.yaml's `train.grpo` (completion-only head, length-sorted micro-batches,
  `precision`, the rollout's recorded log-probs);
- `new_ft<n>`: the new path with `--forward-tokens` n padded positions per forward (what bounds peak memory);
- `new_checkpointed`: the new path with activation checkpointing (recomputed in the backward: memory for time),
  without `shared_prefix` (the two cannot be combined);
- `new_heap_kept`: the new path with freed memory left in glibc's heap, as before the update and the warm start
  returned it to the OS after each micro-batch (`hardware.return_free_memory`): what that costs and saves;
  `new_trim_always`: freed memory returned after every micro-batch, as before `return_memory_above_gb` let the heap
  keep it below a ceiling; `new_recast` (warm start only): the frozen weights cast to bf16 by autocast at every
  forward, as before `frozen_linears_in` cast them once;
- `new_unshared`: the new path without `shared_prefix` (each micro-batch's common prefix run once, its KV
  expanded to the rows; on by default); `new_kl` with the old `kl_coef` 0.02 (a reference forward; 0 by default);
  `new_kl_unshared` both: the update of the committed results before they were regenerated with today's defaults;
- `new_<other>`: the same in the other precision (float32 when `precision` resolves to bf16: what the head slicing
  and sorting alone buy; else bfloat16: what bf16 autocast would add), and `new_mb<n>`: the new path with
  `--micro-batches` sequences per forward (the measurement behind the `micro_batch_size` default).
`--paths` runs only the named paths (e.g. `--paths new new_heap_kept --rounds 3`: one trade-off, measured with more
rounds in the same time); speedup keys whose two paths did not both run are left out. Timed in CPU seconds of this
process (`time.process_time`, every thread) and wall seconds; rounds alternate the order of the paths (ABBA), so no
path always runs first; the figures are each path's fastest round. Peak RSS is per path: freed heap is returned to
the system and the kernel's high-water mark reset before each run (Linux; elsewhere it is the process's peak so
far), so it is the whole process's peak during that run, loaded model included (`rss_at_start_gb`: what the run
starts from). Drift: the update's log-probs (float32 and bfloat16) against the rollout's recorded ones over every
trained token, for a float32 rollout and a rollout in `harness.precision`.

Warm start: `supervised_finetune` on the same `--warmstart-steps` x micro_batch_size oracle traces (from
`warmstart.questions` questions of --questions), with the old settings (float32, one forward per step) and with
params.yaml's `warmstart` (`precision`, `forward_tokens`), a fresh model each run (the rollout's is freed first),
and `new_ft<n>` and `new_checkpointed` as above; plus the full default warm start's cost projected from the
per-token cost (core and wall seconds). `--threads` torch threads (default 1, stable on a shared machine).
Writes every figure to --out as JSON; keys named `*speedup*` are old / new.
"""

from __future__ import annotations

import argparse
import cli
from cli import check_out, count, count_or_zero, counts, run_main

OLD_KL_COEF = 0.02  # train.grpo.kl_coef before the regeneration of the committed results
VARIANTS = {  # path -> train.grpo changes measured against `new` (params.yaml's defaults)
    "new_unshared": {"shared_prefix": False},
    "new_kl": {"kl_coef": OLD_KL_COEF},
    "new_kl_unshared": {"shared_prefix": False, "kl_coef": OLD_KL_COEF},
}


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__)
    cli.harness_arguments(parser, start=False)
    parser.add_argument("--questions", default="data/train.jsonl", help="training questions (JSONL) to roll out")
    parser.add_argument("--seed", type=int, default=0, help="rollout questions, LoRA init and sampling")
    parser.add_argument("--threads", type=count, default=1, help="torch intra-op threads")
    parser.add_argument("--rounds", type=count, default=2, help="runs of each path, interleaved")
    parser.add_argument(
        "--micro-batches",
        type=counts,
        default=[1, 2, 4, 8],
        help="also run the new path at these sequences per forward",
    )
    parser.add_argument(
        "--forward-tokens",
        type=counts,
        default=[],
        help="also run the new update and warm start with these padded positions per forward (peak memory)",
    )
    parser.add_argument(
        "--paths", nargs="+", metavar="PATH", help="run only these paths (default: all; names as in the figures)"
    )
    parser.add_argument("--warmstart-steps", type=count_or_zero, default=4, help="0 skips the warm-start section")
    parser.add_argument("--out", default="benchmarks/results/update.json", help="figures (JSON)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.paths or ()) - set(path_names(args)))
    if unknown:
        parser.error(f"--paths: unknown {', '.join(unknown)}; known: {', '.join(path_names(args))}")
    return args


def path_names(args: argparse.Namespace) -> list[str]:
    """Every path the update or the warm start section can run with these arguments."""
    fixed = ["old", "new", "new_float32", "new_bfloat16", "new_checkpointed", "new_heap_kept", "new_trim_always"]
    fixed += [*VARIANTS, "new_recast"]
    return fixed + [f"new_mb{n}" for n in args.micro_batches] + [f"new_ft{n}" for n in args.forward_tokens]


if __name__ == "__main__":  # the command line before the heavy imports below: --help and usage errors at once
    ARGUMENTS = arguments()

import contextlib
import gc
import json
import platform
import random
import resource
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch

from centralrl.assembly import fresh_policy, load_model
from centralrl.config import Config, GrpoConfig, load_config
from centralrl.hardware import compute_dtype, return_free_memory, set_memory_return
from centralrl.harness.engine import open_policy
from centralrl.io import write_json
from centralrl.models.adapters import set_activation_checkpointing
from centralrl.retrieval import open_retriever
from centralrl.rl.grpo import group_advantages, grpo_loss, token_logprobs
from centralrl.rl.trainer import (
    Sample,
    Trainer,
    _logprobs,
    _padded,
    forward_batches,
    loss_denominator,
    training_samples,
    update,
)
from centralrl.rl import warmstart
from centralrl.rl.warmstart import build_traces, supervised_finetune
from centralrl.schema import read_questions

OLD_SETTINGS = {"micro_batch_size": 8, "precision": "float32", "kl_coef": OLD_KL_COEF}  # train.grpo before issue 12


def full_logprobs(model, ids: torch.Tensor, attention: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    return token_logprobs(logits, ids[:, 1:], temperature)


def old_update(model, samples, g: GrpoConfig, temperature: float, pad: int, denominator: float) -> dict:
    """The update before issue 12: full logits, rollout order, float32, ratio 1; returns the trained tokens."""
    device = next(model.parameters()).device
    tokens = 0.0
    for adapter in sorted({s.adapter for s in samples}):
        group = [s for s in samples if s.adapter == adapter]
        model.set_adapter(adapter)
        for start in range(0, len(group), g.micro_batch_size):
            batch = group[start : start + g.micro_batch_size]
            ids, attention, mask, _ = _padded(batch, pad, device)
            reference = None
            if g.kl_coef:
                with torch.no_grad(), model.disable_adapter():
                    reference = full_logprobs(model, ids, attention, temperature)
            logp = full_logprobs(model, ids, attention, temperature)
            advantages = torch.tensor([s.advantage for s in batch], device=device)
            loss, _ = grpo_loss(
                logp, logp.detach(), reference, advantages, mask, g.clip_eps, g.kl_coef, g.loss_normalization,
                denominator,
            )  # fmt: skip
            loss.backward()
            tokens += float(mask.sum())
    return {"tokens": tokens}


def memory_returned(fn: Callable, cfg: Config, enabled: bool, above_gb: float = 0.0) -> Callable:
    """`fn` with `return_memory` and `return_memory_above_gb` set as given (params.yaml's put back after it):
    `enabled` False leaves freed memory in the heap, as before the update and the warm start returned it;
    `above_gb` 0 returns it after every micro-batch, as before the ceiling."""

    def run(*args):
        set_memory_return(enabled, above_gb)
        try:
            return fn(*args)
        finally:
            set_memory_return(cfg.return_memory, cfg.return_memory_above_gb)

    return run


def recasting(fn: Callable) -> Callable:
    """`fn` with the warm start's frozen weights left in float32 for autocast to cast at every forward, as before
    `frozen_linears_in` cast them once."""

    def run(*args):
        with mock.patch.object(warmstart, "frozen_linears_in", lambda *_, **__: contextlib.nullcontext(0)):
            return fn(*args)

    return run


def checkpointed(fn: Callable) -> Callable:
    """`fn(model, ...)` with activation checkpointing on (as `train.grpo.activation_checkpointing: true` sets it)."""

    def run(model, *args):
        set_activation_checkpointing(model, True)
        try:
            return fn(model, *args)
        finally:
            set_activation_checkpointing(model, False)

    return run


def forward_positions(samples: list[Sample], g: GrpoConfig, new: bool) -> dict:
    """The positions a path's forwards run over the micro-batches it cuts, per adapter: the new path's
    (`trainer.forward_batches`: sorted, capped in rows and positions; with `shared_prefix`, each micro-batch's
    common prefix once) or the old one's (rollout order, rows only); and the share of them that is padding."""
    real = run = 0
    for adapter in sorted({s.adapter for s in samples}):
        group = [s for s in samples if s.adapter == adapter]
        lengths = [len(s.ids) for s in group]
        if new:
            batches = forward_batches(group, g)
        else:
            step = g.micro_batch_size
            batches = [(range(i, min(i + step, len(lengths))), 0) for i in range(0, len(lengths), step)]
        for rows, shared in batches:
            real += sum(lengths[i] - shared for i in rows) + shared
            run += len(rows) * (max(lengths[i] for i in rows) - shared) + shared
    return {"forward_positions": run, "padding_share": round(1 - real / run, 4)}


def reset_peak() -> None:
    """Return freed heap to the system and reset the RSS high-water mark, so the next ru_maxrss is the next
    run's own peak (Linux; elsewhere both steps are skipped and ru_maxrss is the process's peak so far)."""
    gc.collect()
    return_free_memory(always=True)
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_gb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3)  # kB on Linux


def measured(run: Callable[[], object]) -> dict:
    """One run's CPU and wall seconds and peak RSS; on a GPU also its peak allocated GPU memory (the clocks stop
    after the GPU's queued work has finished)."""
    reset_peak()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = peak_rss_gb()  # right after the reset: the resident memory the path starts from
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    if cuda:
        torch.cuda.synchronize()
    return {
        "core_seconds": time.process_time() - cpu,
        "wall_seconds": time.perf_counter() - wall,
        "rss": peak_rss_gb(),
        "rss_before": before,
        **({"gpu": round(torch.cuda.max_memory_allocated() / 1e9, 3)} if cuda else {}),
    }


def interleaved(paths: dict[str, Callable[[], object]], rounds: int) -> dict[str, dict]:
    """Every path once per round, in turn, the order reversed every other round; per path its fastest round's
    seconds and its highest peak RSS."""
    runs: dict[str, list[dict]] = {name: [] for name in paths}
    for round_ in range(rounds):
        for name, run in list(paths.items())[:: 1 if round_ % 2 == 0 else -1]:
            runs[name].append(measured(run))
            print(f"  {name}: {runs[name][-1]}", flush=True)
    return {
        name: {
            "core_seconds": round(min(r["core_seconds"] for r in rs), 2),
            "wall_seconds": round(min(r["wall_seconds"] for r in rs), 2),
            "core_seconds_rounds": [round(r["core_seconds"], 2) for r in rs],
            "peak_rss_gb": max(r["rss"] for r in rs),
            "rss_at_start_gb": min(r["rss_before"] for r in rs),
            **({"peak_gpu_allocated_gb": max(r["gpu"] for r in rs)} if "gpu" in rs[0] else {}),
        }
        for name, rs in runs.items()
    }


def rollout_samples(cfg: Config, trainer: Trainer) -> list[Sample]:
    episodes = trainer.rollout()
    g = cfg.train.grpo
    advantages = group_advantages(trainer.rewards(episodes), g.normalize_std, g.eps).flatten().tolist()
    return training_samples(episodes, advantages)


@torch.no_grad()
def drift(model, samples: list[Sample], precision: str, temperature: float, pad: int) -> dict:
    """The update's log-probs (one sample per forward, no padding) against the recorded ones: mean and max |delta|
    and the share of token ratios exp(delta) outside [0.8, 1.2]."""
    device = next(model.parameters()).device
    bf16 = compute_dtype(precision, device) == torch.bfloat16
    base = model.get_base_model()
    deltas = []
    for sample in samples:
        model.set_adapter(sample.adapter)
        ids, attention, mask, recorded = _padded([sample], pad, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logp = _logprobs(base.base_model, base.get_output_embeddings(), ids, attention, mask, temperature)
        deltas.append((logp - recorded)[mask])
    delta = torch.cat(deltas)
    ratio = delta.exp()
    return {
        "mean_abs_logp_diff": round(float(delta.abs().mean()), 6),
        "max_abs_logp_diff": round(float(delta.abs().max()), 6),
        "ratio_outside_0.8_1.2": round(float(((ratio < 0.8) | (ratio > 1.2)).float().mean()), 6),
        "tokens": int(delta.numel()),
    }


def update_figures(cfg: Config, args, policy, samples: list[Sample]) -> dict:
    g = cfg.train.grpo
    model, pad, temperature = policy.model, policy.tokenizer.pad_token_id, cfg.harness.temperature
    denominator = loss_denominator(samples, g.loss_normalization)
    other = "float32" if compute_dtype(g.precision, policy.device) == torch.bfloat16 else "bfloat16"
    settings = {
        "old": (old_update, g.model_copy(update=OLD_SETTINGS), False),
        "new": (update, g, True),
        f"new_{other}": (update, g.model_copy(update={"precision": other}), True),
    }
    for n in args.micro_batches:
        settings[f"new_mb{n}"] = (update, g.model_copy(update={"micro_batch_size": n}), True)
    for n in args.forward_tokens:
        settings[f"new_ft{n}"] = (update, g.model_copy(update={"forward_tokens": n}), True)
    settings |= {name: (update, g.model_copy(update=changes), True) for name, changes in VARIANTS.items()}
    unshared = g.model_copy(update={"shared_prefix": False})  # a checkpointed layer drops the shared prefix's KV
    settings["new_checkpointed"] = (checkpointed(update), unshared, True)
    settings["new_heap_kept"] = (memory_returned(update, cfg, False), g, True)
    settings["new_trim_always"] = (memory_returned(update, cfg, True), g, True)
    settings = selected(settings, args.paths, "update")

    def path(fn, gc_):
        return lambda: (model.zero_grad(set_to_none=True), fn(model, samples, gc_, temperature, pad, denominator))

    model.train()
    figures = interleaved({name: path(fn, gc_) for name, (fn, gc_, _) in settings.items()}, args.rounds)
    model.zero_grad(set_to_none=True)
    model.eval()
    trained = sum(s.trained_tokens for s in samples)
    sequence = sum(len(s.ids) for s in samples)
    for name, (_, gc_, by_length) in settings.items():
        f = figures[name]
        f |= {
            "micro_batch_size": gc_.micro_batch_size,
            "forward_tokens": gc_.forward_tokens if by_length else None,
            "precision": str(compute_dtype(gc_.precision, policy.device)).removeprefix("torch."),
            **forward_positions(samples, gc_, by_length),
            "trained_tokens_per_s": round(trained / f["wall_seconds"], 2),
            "trained_tokens_per_core_s": round(trained / f["core_seconds"], 2),
            "sequence_tokens_per_s": round(sequence / f["wall_seconds"], 2),
        }
    return {
        "samples": len(samples),
        "sequence_tokens": sequence,
        "trained_tokens": trained,
        "kl_coef": g.kl_coef,
        "paths": figures,
        **speedups(
            figures,
            {
                "update_speedup_core_seconds": ("old", "new", "core_seconds"),
                "update_speedup_wall": ("old", "new", "wall_seconds"),
                "update_speedup_trained_tokens_per_s": ("old", "new", "wall_seconds"),  # same trained tokens
                "update_speedup_trained_tokens_per_core_s": ("old", "new", "core_seconds"),
                f"{other}_speedup_core_seconds": ("old", f"new_{other}", "core_seconds"),
                "shared_prefix_speedup_core_seconds": ("new_unshared", "new", "core_seconds"),
                "no_kl_speedup_core_seconds": ("new_kl", "new", "core_seconds"),
                "shared_prefix_no_kl_speedup_core_seconds": ("new_kl_unshared", "new", "core_seconds"),
                "update_speedup_core_seconds_kl_unshared": ("old", "new_kl_unshared", "core_seconds"),
                "heap_ceiling_speedup_core_seconds": ("new_trim_always", "new", "core_seconds"),
            },
        ),
    }


def selected(settings: dict, names: list[str] | None, section: str) -> dict:
    """The settings named by `--paths` (all when None), in their own order; says so when none is in `section`."""
    chosen = {name: setting for name, setting in settings.items() if names is None or name in names}
    if not chosen:
        print(f"{section}: no path of --paths runs here (its paths: {', '.join(settings)})", flush=True)
    return chosen


def speedups(figures: dict, ratios: dict[str, tuple[str, str, str]]) -> dict[str, float]:
    """key -> slow path's seconds / fast path's, for each (slow, fast, seconds key) whose two paths both ran."""
    return {
        key: round(figures[slow][seconds] / figures[fast][seconds], 3)
        for key, (slow, fast, seconds) in ratios.items()
        if slow in figures and fast in figures
    }


def warmstart_figures(cfg: Config, args, traces) -> dict:
    w = cfg.warmstart
    chosen = random.Random(0).sample(traces, min(len(traces), args.warmstart_steps * w.micro_batch_size))
    settings = {"old": w.model_copy(update={"precision": "float32", "forward_tokens": 10**9}), "new": w}
    settings |= {f"new_ft{n}": w.model_copy(update={"forward_tokens": n}) for n in args.forward_tokens}
    settings["new_checkpointed"] = w.model_copy(update={"activation_checkpointing": True})

    def path(wcfg, finetune=supervised_finetune):
        def run():
            model, tokenizer = load_model(cfg, args.backbone, args.model)
            finetune(model, tokenizer, chosen, wcfg, cfg.lora)

        return run

    paths = {name: path(wcfg) for name, wcfg in settings.items()}
    paths["new_heap_kept"] = path(w, memory_returned(supervised_finetune, cfg, False))
    paths["new_trim_always"] = path(w, memory_returned(supervised_finetune, cfg, True))
    paths["new_recast"] = path(w, recasting(supervised_finetune))
    figures = interleaved(selected(paths, args.paths, "warm start"), args.rounds)
    tokens = sum(len(t.prompt_ids) + len(t.target_ids) for t in chosen)
    all_tokens = sum(len(t.prompt_ids) + len(t.target_ids) for t in traces)
    for name, f in figures.items():
        f["sequence_tokens_per_core_s"] = round(tokens / f["core_seconds"], 2)
        f["projected_full_core_seconds"] = round(all_tokens / f["sequence_tokens_per_core_s"], 1)
        f["projected_full_wall_seconds"] = round(all_tokens / tokens * f["wall_seconds"], 1)
    return {
        "traces": len(chosen),
        "steps": -(-len(chosen) // w.micro_batch_size),
        "sequence_tokens": tokens,
        "full_warmstart_traces": len(traces),
        "full_warmstart_sequence_tokens": all_tokens,
        "paths": figures,
        **speedups(
            figures,
            {
                "warmstart_speedup_core_seconds": ("old", "new", "core_seconds"),
                "warmstart_speedup_wall": ("old", "new", "wall_seconds"),
                "heap_ceiling_speedup_core_seconds": ("new_trim_always", "new", "core_seconds"),
                "cast_once_speedup_core_seconds": ("new_recast", "new", "core_seconds"),
            },
        ),
    }


def main(args: argparse.Namespace) -> None:
    check_out(args.out, args)

    torch.set_num_threads(args.threads)
    cfg = load_config(args.params)
    set_memory_return(cfg.return_memory, cfg.return_memory_above_gb)
    fp32 = cfg.model_copy(update={"harness": cfg.harness.model_copy(update={"precision": "float32"})})
    retriever = open_retriever(cfg.retrieval, args.index)
    questions = read_questions(args.questions)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy = fresh_policy(fp32, "joint", args.seed, args.backbone, args.model, device)
    samples = rollout_samples(fp32, Trainer(fp32, policy, retriever, questions, "central", args.seed))
    figures: dict = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""),
        "model": args.model,
        "update": update_figures(cfg, args, policy, samples),
    }
    configured = open_policy(cfg.harness, policy.model, policy.tokenizer, policy.adapters, args.model)
    configured_samples = rollout_samples(cfg, Trainer(cfg, configured, retriever, questions, "central", args.seed))
    pad, temperature = policy.tokenizer.pad_token_id, cfg.harness.temperature
    rollouts = {"float32": samples, cfg.harness.precision: configured_samples}
    updates = ("float32", "bfloat16")
    figures["drift"] = {
        f"update_{u}_vs_rollout_{r}": drift(policy.model, s, u, temperature, pad)
        for r, s in rollouts.items()
        for u in updates
    }
    figures["drift"]["resolved"] = {p: str(compute_dtype(p, device)) for p in sorted({*rollouts, *updates})}
    del configured, configured_samples
    if args.warmstart_steps:
        traces, _ = build_traces(
            questions, cfg.warmstart.questions, retriever, cfg.retrieval.top_k, cfg.harness.passage_chars, policy
        )
        del policy, samples  # each warm-start run loads its own model: the peak is the warm start's alone
        figures["warmstart"] = warmstart_figures(cfg, args, traces)
    print(json.dumps(figures, indent=2))
    write_json(args.out, figures)
    print(f"written to {args.out}")


if __name__ == "__main__":
    run_main(lambda: main(ARGUMENTS))
