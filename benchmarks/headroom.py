"""Headroom benchmark: how much each role of the starting harness could add, measured by swapping in a perfect one.

    python benchmarks/headroom.py --model models/main/start --index index --train data/train.jsonl

The central-only arm can only change the central agent's decisions (which sub-questions, when to conclude); its
frozen sub-agents stay as the start made them. So the most it could ever gain is what a perfect central agent
adds to the start's sub-agents. Each variant runs the real harness greedily on the dev split (never the test
split), with some roles replaced by the oracle the warm start learns from (`centralrl.rl.warmstart`):

- `start`: the untrained harness (the `base` reference);
- `central`: a perfect central agent (each hop's gold sub-question in turn, with the warm start's plan text, then
  conclude) beside the start's sub-agents: the central-only arm's ceiling;
- `reader`: the start's central agent beside a perfect retrieval agent (the warm start's evidence note when
  some hop's answer is among the passages its sub-question retrieved, else "nothing relevant was found");
- `central+reader`: both perfect, so what is still lost is the conclusion agent's;
- `oracle`: all three perfect (F1 1 on every question: a check of the swapping itself).

Dev questions without a decomposition (real benchmarks other than MuSiQue) have no oracle and are left out (counted).

Figures per variant: dev F1 and EM (mean over questions, and per benchmark), the share of episodes whose notes hold
a golden answer, and each episode's sub-questions, notes and answer. `headroom` holds each variant's F1 minus the
start's.
"""

from __future__ import annotations

import argparse

import cli
from cli import check_out, count, run_main


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__)
    cli.harness_arguments(parser, start=True)
    parser.add_argument("--train", required=True, help="training questions; the dev split is drawn from them")
    parser.add_argument("--threads", type=count, default=1, help="torch intra-op threads")
    parser.add_argument("--out", default="benchmarks/results/headroom.json", help="figures (JSON)")
    return parser.parse_args(argv)


if __name__ == "__main__":  # the command line before the heavy imports below: --help and usage errors at once
    ARGUMENTS = arguments()

import json
import time
from collections.abc import Sequence

import torch

from centralrl.assembly import run_settings, trained_policy
from centralrl.config import load_config
from centralrl.errors import DataError
from centralrl.harness.engine import Generation, RolePolicy
from centralrl.harness.episodes import Episode, run_central
from centralrl.harness.protocol import PREFILL, as_data, parse_central
from centralrl.io import write_json
from centralrl.metrics import em, f1, normalize_answer
from centralrl.retrieval import open_retriever
from centralrl.retrieval.base import Retriever
from centralrl.data.split import split_dev
from centralrl.rl.warmstart import central_plan, delegated_hops, evidence_note
from centralrl.schema import Question, read_questions

VARIANTS = {"start": (), "central": ("central",), "reader": ("retrieval",)}
VARIANTS |= {"central+reader": ("central", "retrieval"), "oracle": ("central", "retrieval", "conclusion")}
NOTHING_FOUND = "Nothing relevant was found."


class PerfectRoles:
    """A RolePolicy whose `perfect` roles are the oracle's and whose other roles are `policy`'s own. Which question
    a call belongs to is read from its prompt, as the role sees it: the question line (central, conclusion) or
    the sub-question, whose asker this object recorded when the central agent wrote it (retrieval)."""

    def __init__(
        self, policy: RolePolicy, questions: Sequence[Question], retriever: Retriever, perfect, settings, counted=False
    ):
        self.policy, self.retriever, self.perfect, self.settings = policy, retriever, set(perfect), settings
        self.counted = counted  # the perfect central agent's plans as the warm start writes them (warmstart.plans)
        self.questions = {f"Question: {as_data(q.question)}\n": q for q in questions}
        self.asked: dict[str, tuple[Question, str]] = {}  # sub-question as a prompt shows it -> (question, as asked)

    def __getattr__(self, name: str):
        return getattr(self.policy, name)

    def generate(self, role: str, prompts, max_new_tokens: int, greedy: bool, temperature=1.0, seed=0):
        records = (
            role == "central" and "retrieval" in self.perfect
        )  # the perfect reader needs each sub-question's asker
        texts = [self.policy.tokenizer.decode(p) for p in prompts] if role in self.perfect or records else []
        if role in self.perfect:
            generations = [self._written(p, getattr(self, f"_{role}")(text)) for p, text in zip(prompts, texts)]
        else:
            generations = self.policy.generate(role, prompts, max_new_tokens, greedy, temperature, seed)
        for text, generation in zip(texts, generations) if records else ():
            action = parse_central(PREFILL["central"] + generation.text)
            if action.kind == "delegate":
                self.asked[as_data(action.text)] = (self._question(text), action.text)
        return generations

    def _question(self, prompt: str) -> Question:
        return next(q for line, q in self.questions.items() if line in prompt)

    def _written(self, prompt: Sequence[int], text: str) -> Generation:
        tokenizer = self.policy.tokenizer
        ids = tuple(tokenizer.encode(text, add_special_tokens=False)) + (tokenizer.eos_token_id,)
        return Generation(tuple(prompt), ids, (0.0,) * len(ids), tokenizer.decode(ids, skip_special_tokens=True))

    def _central(self, prompt: str) -> str:
        hops = delegated_hops(self._question(prompt))
        done = prompt.count(". Sub-question: ")  # the notes block numbers each delegated sub-question
        plan = central_plan(self.counted, hops, done)
        if done >= len(hops):
            return f"{plan}</think><conclude></conclude>"
        return f"{plan}</think><subquestion>{hops[done][0]}</subquestion>"

    def _retrieval(self, prompt: str) -> str:
        question, asked = self.asked[prompt.split("Sub-question: ", 1)[1].split("\nPassages:", 1)[0]]
        hits = self.retriever.search([asked], self.settings.top_k)[0]  # what the harness retrieved for it
        hops = sorted(delegated_hops(question), key=lambda hop: hop[0] != as_data(asked))  # the hop asked first
        notes = (evidence_note(hop, hits, self.settings.passage_chars) for _, hop in hops)
        return f"{next((n for n in notes if n), NOTHING_FOUND)}</note>"

    def _conclusion(self, prompt: str) -> str:
        return f"{as_data(self._question(prompt).golden_answers[0])}</answer>"


def scores(episodes: Sequence[Episode]) -> dict:
    """Mean F1 and EM, per benchmark too, and the share of episodes whose notes hold a golden answer."""

    def mean(values) -> float:
        return round(sum(values) / len(values), 4)

    def found(e: Episode) -> bool:
        notes = f" {normalize_answer(' '.join(note for _, note in e.notes))} "
        return any(f" {normalize_answer(answer)} " in notes for answer in e.question.golden_answers)

    by_benchmark = sorted({e.question.benchmark for e in episodes})
    transcripts = [
        {"id": e.question.id, "notes": e.notes, "prediction": e.prediction, "golden": e.question.golden_answers}
        for e in episodes
    ]
    return {
        "f1": mean([f1(e.prediction, e.question.golden_answers) for e in episodes]),
        "em": mean([em(e.prediction, e.question.golden_answers) for e in episodes]),
        "answer_in_notes": mean([found(e) for e in episodes]),
        "f1_by_benchmark": {
            b: mean([f1(e.prediction, e.question.golden_answers) for e in episodes if e.question.benchmark == b])
            for b in by_benchmark
        },
        "episodes": transcripts,  # what each question's notes said (sub-question, note) and what was answered
    }


def measure(cfg, policy: RolePolicy, retriever: Retriever, questions: Sequence[Question]) -> dict:
    """Every variant's scores on `questions`, and each perfect role's F1 gain over the start."""
    settings = run_settings(cfg, greedy=True, seed=0)
    figures = {}
    for name, perfect in VARIANTS.items():
        started = time.perf_counter()
        episodes = run_central(
            questions,
            PerfectRoles(policy, questions, retriever, perfect, settings, cfg.warmstart.plans == "counted"),
            retriever,
            settings,
        )
        figures[name] = scores(episodes) | {"seconds": round(time.perf_counter() - started, 1)}
        print(f"{name}: F1 {figures[name]['f1']:.3f} ({figures[name]['seconds']:.0f}s)", flush=True)
    start = figures["start"]["f1"]
    figures["headroom"] = {name: round(figures[name]["f1"] - start, 4) for name in VARIANTS if name != "start"}
    return figures


def main(args: argparse.Namespace) -> None:
    out = check_out(args.out, args)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.params)
    _, dev = split_dev(read_questions(args.train, split="train"), cfg.train.dev, args.train)
    usable = [q for q in dev if delegated_hops(q)]  # the oracle asks a decomposition's hops
    if not usable:
        raise DataError(
            f"{args.train}: none of the {len(dev)} dev questions has a decomposition for the oracle to ask; only "
            "the synthetic world and MuSiQue provide one"
        )
    retriever = open_retriever(cfg.retrieval, args.index, questions=(dev, args.train))
    policy = trained_policy(cfg, args.backbone, args.model, None)
    figures = {"params": args.params, "model": args.model, "dev_questions": len(usable)}
    figures["dev_questions_left_out"] = len(dev) - len(usable)  # without a decomposition
    dev = usable
    figures |= measure(cfg, policy, retriever, dev)
    print(json.dumps(figures["headroom"], indent=2))
    write_json(out, figures)
    print(f"written to {out}")


if __name__ == "__main__":
    run_main(lambda: main(ARGUMENTS))
