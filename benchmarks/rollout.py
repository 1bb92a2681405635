"""Rollout benchmark: the batched episode runner against a one-episode-at-a-time loop and against raw
`model.generate` on the same token counts, side by side in one run on the same questions; or the two
generation engines (transformers, vLLM) side by side.

    python benchmarks/rollout.py --model models/backbone --index index --questions data/test.jsonl --n 16
    python benchmarks/rollout.py ... --engine vllm          # the same figures with vLLM generating
    python benchmarks/rollout.py ... --compare-engines      # transformers and vLLM, same questions, one process

Figures: episodes/s and generated tokens/s of (a) the batched runner, (b) the same runner called with one
question at a time, and (c) plain `model.generate` replaying the batched run's generation batches (same
prompts, forced to the same number of new tokens per batch, no stop strings, no parsing, no retrieval).
(a)/(c) is the harness's overhead (with --engine vllm it compares vLLM's runner against transformers'
raw generate); (a)/(b) what batching buys. --compare-engines runs (a) once untimed on one question per
engine (warm-up: CUDA kernels, vLLM's first adapter sync), then timed on every question, and reports each
engine's figures and vllm/transformers ratios. Sampling (not greedy) so every question runs the same kind of
work as in training. The model goes to `harness.device` (CPU on a machine without CUDA). Roles run frozen
(no adapters). Writes the figures to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

from centralrl.assembly import load_model, run_settings
from centralrl.config import load_config
from centralrl.harness.engine import RolePolicy, open_policy
from centralrl.harness.episodes import run_central
from centralrl.io import write_json
from centralrl.models.adapters import adapters_of
from centralrl.retrieval import open_retriever
from centralrl.schema import read_questions


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--backbone", default="main", help="a key of `models` in params (its dtype)")
    parser.add_argument("--model", default="models/main/backbone")
    parser.add_argument("--index", default="index")
    parser.add_argument("--questions", default="data/test.jsonl")
    parser.add_argument("--n", type=int, default=16, help="questions (taken evenly across the file)")
    parser.add_argument(
        "--engine",
        choices=("transformers", "vllm"),
        default="transformers",
        help="generation engine of the runner (vllm: the gpu extra, a CUDA GPU; harness.vllm settings)",
    )
    parser.add_argument(
        "--compare-engines",
        action="store_true",
        help="run the batched runner on both engines, same questions, and report their ratio",
    )
    parser.add_argument("--out", default="benchmarks/results/rollout.json")
    args = parser.parse_args()

    cfg = load_config(args.params)
    questions = read_questions(args.questions)
    questions = questions[:: max(1, len(questions) // args.n)][: args.n]
    model, tokenizer = load_model(cfg, args.backbone, args.model)
    engines = ("transformers", "vllm") if args.compare_engines else (args.engine,)
    policies = {
        name: open_policy(
            cfg.harness.model_copy(update={"engine": name}), model, tokenizer, adapters_of(model), args.model
        )
        for name in engines
    }
    retriever = open_retriever(cfg.retrieval, args.index)
    h = cfg.harness
    settings = run_settings(cfg, greedy=False, seed=cfg.seeds[0])
    torch.set_num_threads(os.cpu_count() or 1)

    figures = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""),
        "model": args.model,
        "questions": len(questions),
        "batch_size": h.batch_size,
        "max_turns": h.max_turns,
        "engine": "both" if args.compare_engines else args.engine,
    }
    if args.compare_engines:
        figures |= compare_engines(policies, questions, retriever, settings)
    else:
        figures |= one_engine(policies[args.engine], questions, retriever, settings, h.batch_size)
    print(json.dumps(figures, indent=2))
    write_json(args.out, figures)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
