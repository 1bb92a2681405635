"""Warm start: supervised cold start on oracle traces, merged into the starting checkpoint every arm shares.

A tiny backbone (SmolLM2-135M, let alone the random smoke Qwen2) rarely writes a valid action on its own, so
GRPO would see a group of identical zero rewards and learn nothing. Before RL, this stage teaches every role
the protocol on the calls a perfect harness would make:

- `oracle_traces(question, retriever, top_k, passage_chars, policy)`: for each hop of the gold decomposition,
  a central call (target: `plan</think><subquestion>hop i</subquestion>` after the prefilled `<think>`) and a
  retrieval call on the passages the retriever really returns for that sub-question (target: the sentence of
  those passages that states the hop's answer, `...</note>`); then a central call that concludes and a
  conclusion call (target: `golden_answers[0]</answer>`). Prompts come from the harness's own builders
  (`prompts.*_messages`, `PREFILL`, `RolePolicy.encode_chat`), and notes accumulate as the harness
  accumulates them, so a trace prompt is token for token what the harness shows that role in that state.
  Every target ends with the tokenizer's eos; `parse_trace` reads a trace back with the protocol parsers.
- `supervised_finetune(model, tokenizer, traces, cfg, lora)`: one LoRA adapter shared by all roles, AdamW,
  cross-entropy on target tokens only, `micro_batch_size` right-padded sequences per step, `epochs` passes
  in a seeded shuffled order, grad-norm clip 1.0, the learning rate constant or decayed to 0 over the steps
  (`warmstart.lr_schedule`); then the LoRA is merged into the weights.
- `warmstart(cfg, model_dir, index_dir, train_path, out_dir)`: the stage core. Disabled, it copies the
  backbone folder unchanged, so downstream stages always read one path.

Where it departs from the usual cold start (DeepSeek-R1's curated long chains of thought, Search-R1-style
SFT on sampled and filtered trajectories):
- The traces are templated from gold decompositions, not written or sampled by a model: the plans inside
  <think> are one fixed sentence per situation (`warmstart.plans: fixed`) or count the facts the question needs
  and the notes hold (`counted`, `central_plan`), notes quote the answering sentence of the retrieved passages.
- Only sources with a decomposition give traces: the synthetic world and MuSiQue. HotpotQA (and the other
  realqa benchmarks) carry no decomposition in our schema, so they give none.
- MuSiQue sub-questions are made self-contained as a perfect central agent would write them: `#k` becomes the
  answer of hop k, and the Wikidata form `X >> relation` becomes `What is the relation of X?`.
- A comparison's final step (no passage: it compares the values found) is not delegated; the conclusion's
  answer covers it.
- Questions are taken round-robin over benchmarks (file order within each), not in plain file order: the
  synthetic train file lists all 1-hop questions first, and a warm start on 1-hop questions alone would teach
  the central agent to conclude after one hop.
- With `warmstart.follow_up_notes`, a question of fewer hops than `harness.max_turns` also gets a conclusion
  trace whose notes end with a follow-up on its answer (`follow_up`: another training question's hop that names
  it): a start that asks once more than needed (most do) then still answers from the note that answers the
  question. Without it the conclusion answers from the last note, since every oracle trace's answer is there.
- A question is skipped when some hop's answer is not in the passages the retriever shows for it (as
  rejection sampling keeps only successful trajectories): otherwise the retrieval role would learn to state
  answers it cannot see.
- All roles share one adapter during the warm start (the roles differ by their prompts); RL then trains
  per-role adapters on top of the merged checkpoint.
"""

from __future__ import annotations

import math
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from centralrl.assembly import load_model
from centralrl.config import ROLES, Config, LoraConfig, WarmstartConfig
from centralrl.errors import DataError
from centralrl.hardware import compute_dtype, return_free_memory
from centralrl.harness import prompts as P
from centralrl.harness.engine import RolePolicy
from centralrl.harness.protocol import MAX_SUBQUESTION_CHARS, PREFILL, as_data, parse_answer, parse_central, parse_note
from centralrl.io import atomic_directory
from centralrl.metrics import normalize_answer
from centralrl.models.adapters import SHARED, attach_adapters, frozen_linears_in, set_activation_checkpointing
from centralrl.models.backbone import content_sha256, own_memory, require_prepared
from centralrl.retrieval import open_retriever
from centralrl.retrieval.base import Hit, Retriever
from centralrl.data.split import split_dev
from centralrl.rl.grpo import head_logprobs, lr_multiplier, micro_batches
from centralrl.rl.health import TrainingDiverged
from centralrl.schema import Question, SubQuestion, interleave, read_questions

IGNORE = -100  # label of a position that is not trained (prompt tokens, padding)
MAX_NOTE_CHARS = 300  # a quoted sentence longer than this is replaced by a short templated note

FIXED_PLANS = (
    "No notes yet, so I ask for the first fact.",
    "Note {held} says {last}. Next I need the next fact.",
    "The notes hold what the question needs.",
)


def central_plan(counted: bool, hops: Sequence[tuple[str, SubQuestion]], held: int) -> str:
    """The oracle central agent's <think> when the notes hold the first `held` of the question's delegated `hops`.
    `counted` (`warmstart.plans: counted`) states the count, so the decision to ask again or conclude follows
    from a few tokens that read the question; fixed plans are one sentence per situation.

    >>> hops = [("Which company produced X?", SubQuestion("", "Kullen  Media")), ("Who founded it?", None)]
    >>> central_plan(True, hops, 1)
    'The question needs 2 facts; the notes hold 1 (note 1 says Kullen Media), so I ask for fact 2.'
    >>> central_plan(True, hops[:1], 1)
    'The question needs 1 fact; the notes hold 1, so I conclude.'
    >>> central_plan(False, hops, 1)
    'Note 1 says Kullen Media. Next I need the next fact.'
    """
    needed = len(hops)
    last = as_data(" ".join(hops[held - 1][1].answer.split())) if 0 < held < needed else ""
    if not counted:
        first, next_fact, conclude = FIXED_PLANS
        if held >= needed:
            return conclude
        return next_fact.format(held=held, last=last) if held else first
    facts = f"The question needs {needed} fact{'s' if needed != 1 else ''}; the notes hold {held}"
    said = f" (note {held} says {last})" if 0 < held < needed else ""
    action = "conclude" if held >= needed else f"ask for fact {held + 1}"
    return f"{facts}{said}, so I {action}."


_HOP_REFERENCE = re.compile(r"#(\d+)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Trace:
    """One role call of a perfect harness: the prompt the role sees, and the tokens it should write.

    `action` and `content` are what the protocol parsers must read from PREFILL[role] + the decoded target:
    ("delegate", sub-question), ("conclude", ""), ("note", note) or ("answer", answer).
    """

    role: str
    prompt_ids: tuple[int, ...]
    target_ids: tuple[int, ...]
    action: str
    content: str


# ---------------------------------------------------------------------------------------------- traces


def self_contained(question: str, answers: Sequence[str]) -> str:
    """A hop's sub-question as a perfect central agent would write it: MuSiQue's `#k` replaced by the answer
    of hop k, the Wikidata form `X >> relation` asked as a question, whitespace collapsed.

    >>> self_contained("Who was the first president of #1 ?", ["American Psychological Association"])
    'Who was the first president of American Psychological Association ?'
    >>> self_contained("#1 >> shares border with", ["McDowell County"])
    'What is the shares border with of McDowell County?'
    """

    def answer_of(match: re.Match) -> str:
        hop = int(match.group(1))
        return answers[hop - 1] if 0 < hop <= len(answers) else match.group(0)

    text = _HOP_REFERENCE.sub(answer_of, question)
    if " >> " in text:
        subject, relation = (part.strip() for part in text.split(" >> ", 1))
        text = f"What is the {relation} of {subject}?"
    return " ".join(text.split())


def delegated_hops(question: Question) -> list[tuple[str, SubQuestion]]:
    """(sub-question as the central agent asks it, hop) for every hop the retrieval sub-agent answers.

    Hops with an empty question or answer are dropped; a final step without passages after earlier hops (a
    comparison of the values found) is reasoning, not retrieval, and is left to the conclusion sub-agent.
    """
    steps = [s for s in question.decomposition if s.question.strip() and s.answer.strip()]
    if len(steps) > 1 and not steps[-1].passage_ids:
        steps = steps[:-1]
    answers = [" ".join(s.answer.split()) for s in question.decomposition]
    return [(as_data(self_contained(s.question, answers)), s) for s in steps]


def _contains(text: str, answer: str) -> bool:
    """Whether the normalized answer occurs in the normalized text as whole words.

    >>> _contains("Okosi was born in 1958 in Telmarra.", "1958"), _contains("Born 19580.", "1958")
    (True, False)
    >>> _contains("x", "The")
    False
    """
    wanted = normalize_answer(answer)
    return bool(wanted) and f" {wanted} " in f" {normalize_answer(text)} "


def evidence_note(hop: SubQuestion, hits: Sequence[Hit], passage_chars: int) -> str | None:
    """The note a perfect retrieval sub-agent writes: the first sentence of the shown passages (the hop's own
    passages first) that states the hop's answer; None when no shown passage contains the answer."""
    shown = sorted(hits, key=lambda h: h.id not in hop.passage_ids)  # stable: gold passages first, then rank
    for hit in shown:
        for sentence in _SENTENCE_END.split(as_data(hit.text[:passage_chars])):
            if _contains(sentence, hop.answer):
                note = " ".join(sentence.split())
                return (
                    note if len(note) <= MAX_NOTE_CHARS else f"The answer is {as_data(' '.join(hop.answer.split()))}."
                )
    return None


def _target(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False)) + (tokenizer.eos_token_id,)


def follow_up(question: Question, hops: Sequence[tuple[str, str, SubQuestion]]) -> tuple[str, SubQuestion] | None:
    """The first of `hops` ((question id, sub-question, hop) of the training questions) that another question
    asks about this question's answer, and that answers something else: what an over-asking central agent asks
    once its notes already hold the answer ("Note 1 says Vushsa Group. Next I need the next fact." then "In which
    city is Vushsa Group headquartered?"). None when no hop names the answer (a year, say).

    >>> q = Question("q", "What company produced The Ember?", ("Vushsa Group",), "b", "train")
    >>> follow_up(q, [("q", "Which company produced The Ember?", SubQuestion("", "Vushsa Group")),
    ...               ("r", "In which city is Vushsa Group headquartered?", SubQuestion("", "Femea"))])[0]
    'In which city is Vushsa Group headquartered?'
    """
    answer = question.golden_answers[0]
    for owner, sub, hop in hops:
        if owner != question.id and _contains(sub, answer) and not _contains(hop.answer, answer):
            return sub, hop
    return None


def oracle_traces(
    question: Question,
    retriever: Retriever,
    top_k: int,
    passage_chars: int,
    policy: RolePolicy,
    counted: bool = False,
    after: tuple[str, SubQuestion] | None = None,
) -> list[Trace]:
    """The role calls of a perfect harness on `question`, in episode order (central, retrieval per hop; then
    central concluding, conclusion). `policy` supplies the harness's chat encoding and tokenizer (no model
    call is made). Empty when the question has no usable hop, a sub-question is too long for the protocol,
    or the retriever does not show some hop's answer in its top_k passages. `after` (`follow_up`): one more
    conclusion trace whose notes end with that hop's note too, when its answer is shown, and whose target is
    still the question's answer, so the conclusion answers from the note that answers the question, not the last.
    """
    hops = delegated_hops(question)
    if not hops or any(len(sub) > MAX_SUBQUESTION_CHARS for sub, _ in hops):
        return []
    results = retriever.search([sub for sub, _ in hops], top_k)
    notes = [evidence_note(hop, hits, passage_chars) for (_, hop), hits in zip(hops, results)]
    if any(note is None for note in notes):
        return []
    tok = policy.tokenizer
    traces: list[Trace] = []
    accumulated: list[tuple[str, str]] = []
    for i, ((sub, hop), hits, note) in enumerate(zip(hops, results, notes)):
        central = policy.encode_chat(P.central_messages(question.question, accumulated, None), PREFILL["central"])
        delegate = _target(tok, f"{central_plan(counted, hops, i)}</think><subquestion>{sub}</subquestion>")
        traces.append(Trace("central", tuple(central), delegate, "delegate", sub))
        retrieval = policy.encode_chat(P.retrieval_messages(sub, hits, passage_chars), PREFILL["retrieval"])
        traces.append(Trace("retrieval", tuple(retrieval), _target(tok, f"{note}</note>"), "note", note))
        accumulated.append((sub, note))
    central = policy.encode_chat(P.central_messages(question.question, accumulated, None), PREFILL["central"])
    conclude = _target(tok, f"{central_plan(counted, hops, len(hops))}</think><conclude></conclude>")
    traces.append(Trace("central", tuple(central), conclude, "conclude", ""))
    answer = as_data(" ".join(question.golden_answers[0].split()))
    endings = [accumulated]
    if after is not None:
        note = evidence_note(after[1], retriever.search([after[0]], top_k)[0], passage_chars)
        if note is not None:
            endings.append(accumulated + [(after[0], note)])
    for notes in endings:
        conclusion = policy.encode_chat(P.conclusion_messages(question.question, notes), PREFILL["conclusion"])
        traces.append(Trace("conclusion", tuple(conclusion), _target(tok, f"{answer}</answer>"), "answer", answer))
    for trace in traces:
        if parse_trace(trace, tok) != (trace.action, trace.content):
            raise AssertionError(
                f"question {question.id}: a {trace.role} trace parses to {parse_trace(trace, tok)}, "
                f"not ({trace.action!r}, {trace.content!r})"
            )
    return traces


def parse_trace(trace: Trace, tokenizer: PreTrainedTokenizerBase) -> tuple[str, str]:
    """What the harness reads from this trace's target: the role's parser on PREFILL[role] + decoded target,
    decoded as the engine decodes a generation (special tokens skipped)."""
    text = PREFILL[trace.role] + tokenizer.decode(list(trace.target_ids), skip_special_tokens=True)
    if trace.role == "central":
        action = parse_central(text)
        return action.kind, action.text
    parse, kind = {"retrieval": (parse_note, "note"), "conclusion": (parse_answer, "answer")}[trace.role]
    content, valid = parse(text)
    return (kind, content) if valid else ("invalid", "")


# ---------------------------------------------------------------------------------------------- training


def collate(traces: Sequence[Trace], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, labels), each [B, T]; labels are IGNORE on prompt and padding.

    >>> traces = [Trace("conclusion", (5, 6), (7, 2), "answer", "x"), Trace("central", (5,), (2,), "conclude", "")]
    >>> ids, mask, labels = collate(traces, 0)
    >>> ids.tolist(), mask.tolist(), labels.tolist()
    ([[5, 6, 7, 2], [5, 2, 0, 0]], [[1, 1, 1, 1], [1, 1, 0, 0]], [[-100, -100, 7, 2], [-100, 2, -100, -100]])
    """
    width = max(len(t.prompt_ids) + len(t.target_ids) for t in traces)
    ids, mask, labels = [], [], []
    for t in traces:
        length = len(t.prompt_ids) + len(t.target_ids)
        pad = width - length
        ids.append(list(t.prompt_ids) + list(t.target_ids) + [pad_id] * pad)
        mask.append([1] * length + [0] * pad)
        labels.append([IGNORE] * len(t.prompt_ids) + list(t.target_ids) + [IGNORE] * pad)
    return torch.tensor(ids), torch.tensor(mask), torch.tensor(labels)


def target_loss(hidden: torch.Tensor, head: torch.nn.Module, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the trained tokens: the hidden state [B, T, H] at position t predicts
    labels[:, t + 1] (labels [B, T]) through `head` (H -> V logits); IGNORE labels add nothing. Only positions
    that predict a trained token go through `head`, in chunks and in the head's own dtype (`grpo.head_logprobs`),
    so [B, T, V] logits over long prompts are never built (for SmolLM2's 49k vocabulary they were most of the
    memory). Returns a scalar.

    >>> uniform = torch.nn.Linear(2, 4)
    >>> _ = torch.nn.init.zeros_(uniform.weight), torch.nn.init.zeros_(uniform.bias)  # every token costs log 4
    >>> loss = target_loss(torch.randn(1, 3, 2), uniform, torch.tensor([[IGNORE, 1, IGNORE]]))
    >>> round(loss.item(), 4) == round(torch.tensor(4.0).log().item(), 4)
    True
    """
    predicts = torch.zeros_like(labels, dtype=torch.bool)
    predicts[:, :-1] = labels[:, 1:].ne(IGNORE)
    targets = labels[:, 1:][predicts[:, :-1]]
    return -head_logprobs(hidden[predicts], head, targets).mean()


def _accumulate_step(decoder, head, batch: Sequence[Trace], forward_tokens: int, pad: int, bf16: bool) -> float:
    """One optimizer step's loss over `batch` (the mean over its target tokens), its gradients accumulated: forwards
    of at most `forward_tokens` padded positions, each one's freed activations handed back (`return_free_memory`)."""
    device = next(decoder.parameters()).device
    tokens = sum(len(t.target_ids) for t in batch)
    loss = 0.0
    lengths = [len(t.prompt_ids) + len(t.target_ids) for t in batch]
    for rows in micro_batches(lengths, len(batch), forward_tokens):  # gradients summed: the mean
        group = [batch[i] for i in rows]
        ids, mask, labels = (t.to(device) for t in collate(group, pad))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            part = target_loss(hidden, head, labels) * (sum(len(t.target_ids) for t in group) / tokens)
        part.backward()
        return_free_memory()  # as the GRPO update: the freed activations
        loss += part.item()
    return loss


def supervised_finetune(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    traces: Sequence[Trace],
    cfg: WarmstartConfig,
    lora: LoraConfig,
    log: Callable[[str], None] | None = None,
) -> tuple[PreTrainedModel, dict]:
    """Train one LoRA adapter (shared by every role) on the traces' target tokens, merge it, return the plain
    model and stats (loss per step, first/last loss, traces, trained tokens, seconds). Seeded by cfg.seed:
    the adapter's initialisation and the shuffled order; the global torch RNG is left as it was.

    The loss runs the decoder, then the output head only where a trained token is predicted (`target_loss`);
    this is the causal LM's own computation for models whose logits are head(last hidden state), as in
    Qwen2 and Llama/SmolLM2 (a model with logit scaling or soft-capping would need its own head call).
    A step's `micro_batch_size` traces run as forwards of at most `forward_tokens` padded positions each
    (`grpo.micro_batches`, sorted by length), their gradients summed into the step's mean loss, so peak memory
    follows `forward_tokens`, not the longest traces; in bf16 autocast when `cfg.precision` resolves to it, the
    frozen weights then cast to bf16 once and their float32 originals held in a temporary file until the merge
    (`frozen_linears_in`: the same bytes, less time and memory), the model first copied out of its checkpoint's
    file mapping (`own_memory`), so that those originals leave the resident set.
    `log` receives a progress line every 10 steps."""
    if not traces:
        raise DataError("warm start: no traces to train on")
    started = time.perf_counter()
    device = next(model.parameters()).device
    bf16 = compute_dtype(cfg.precision, device) == torch.bfloat16
    if bf16:
        own_memory(model)  # or the spilled originals stay resident as the mapped checkpoint's pages
    losses: list[float] = []
    trained_tokens = 0
    with torch.random.fork_rng(devices=[model.device] if model.device.type == "cuda" else []):
        torch.manual_seed(cfg.seed)  # seeds CUDA's generator too: forked above so that it is put back as well
        peft_model = attach_adapters(model, {role: SHARED for role in ROLES}, lora)
        if cfg.activation_checkpointing:
            set_activation_checkpointing(peft_model, True)
        trainable = [p for p in peft_model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=0.0)
        order_rng = random.Random(cfg.seed)
        base = peft_model.get_base_model()
        decoder, head = base.base_model, base.get_output_embeddings()  # LoRA layers live inside the decoder
        steps = cfg.epochs * -(-len(traces) // cfg.micro_batch_size)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(cfg.lr_schedule, 0, steps))
        peft_model.train()
        with frozen_linears_in(decoder, torch.bfloat16, spill=True) if bf16 else nullcontext():
            for _ in range(cfg.epochs):
                order = list(range(len(traces)))
                order_rng.shuffle(order)
                for start in range(0, len(order), cfg.micro_batch_size):
                    batch = [traces[i] for i in order[start : start + cfg.micro_batch_size]]
                    tokens = sum(len(t.target_ids) for t in batch)
                    optimizer.zero_grad(set_to_none=True)
                    loss = _accumulate_step(decoder, head, batch, cfg.forward_tokens, tokenizer.pad_token_id, bf16)
                    if not math.isfinite(loss):
                        raise TrainingDiverged(
                            f"warm start step {len(losses) + 1}/{steps}: loss is {loss}; the start is not written "
                            f"(lower warmstart.learning_rate, now {cfg.learning_rate})"
                        )
                    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
                    optimizer.step()
                    scheduler.step()
                    losses.append(loss)
                    trained_tokens += tokens
                    if log and (len(losses) % 10 == 0 or len(losses) == steps):
                        log(
                            f"warmstart step {len(losses)}/{steps}: loss {losses[-1]:.4f} "
                            f"({time.perf_counter() - started:.0f}s)"
                        )
    merged = peft_model.merge_and_unload().eval()
    stats = {
        "losses": losses,
        "steps": len(losses),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "traces": len(traces),
        "trained_tokens": trained_tokens,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return merged, stats


# ---------------------------------------------------------------------------------------------- stage core


def build_traces(
    questions: Sequence[Question],
    wanted: int,
    retriever: Retriever,
    top_k: int,
    passage_chars: int,
    policy: RolePolicy,
    counted: bool = False,
    follow_ups_below: int = 0,
) -> tuple[list[Trace], dict]:
    """Traces of the first `wanted` questions (round-robin over benchmarks) that the harness can answer;
    `counted`: the central plans count facts (`central_plan`); a question of fewer than `follow_ups_below` hops
    also gets a conclusion trace with a follow-up note (`follow_up`; the harness's max_turns: it may ask one more),
    so the conclusion traces beyond one per question are the follow-ups."""
    candidates = [q for q in questions if q.decomposition]
    if not candidates:
        benchmarks = sorted({q.benchmark for q in questions})
        raise DataError(
            f"warm start: none of the {len(questions)} training questions ({', '.join(benchmarks) or 'no benchmark'})"
            " has a decomposition; only the synthetic world and MuSiQue provide one. Add one of those sources to"
            " data.questions (split train), or set warmstart.enabled: false"
        )
    traces: list[Trace] = []
    used, skipped = 0, 0
    tried = tried_questions(candidates, wanted, retriever, top_k, passage_chars, policy, counted, follow_ups_below)
    for _, built in tried:
        traces.extend(built)
        used, skipped = used + bool(built), skipped + (not built)
    if not traces:
        raise DataError(
            f"warm start: none of the {len(candidates)} questions with a decomposition gave a trace: the retriever"
            f" never showed every hop's answer in its top {top_k} passages (or the sub-questions were too long)"
        )
    by_role = {role: sum(t.role == role for t in traces) for role in ROLES}
    return traces, {"questions": used, "skipped_questions": skipped, "traces_by_role": by_role}


def tried_questions(
    candidates: Sequence[Question],
    wanted: int,
    retriever: Retriever,
    top_k: int,
    passage_chars: int,
    policy: RolePolicy,
    counted: bool = False,
    follow_ups_below: int = 0,
) -> Iterator[tuple[Question, list[Trace]]]:
    """Each question `build_traces` tries, round-robin over benchmarks, with its traces ([] when it gives none),
    until `wanted` of them gave traces: the questions the warm start trains on are those with traces."""
    hops = [(q.id, sub, hop) for q in candidates for sub, hop in delegated_hops(q)] if follow_ups_below else []
    used = 0
    for question in interleave(candidates):
        if used == wanted:
            return
        after = follow_up(question, hops) if len(delegated_hops(question)) < follow_ups_below else None
        built = oracle_traces(question, retriever, top_k, passage_chars, policy, counted, after)
        used += bool(built)
        yield question, built


def trace_settings(cfg: Config) -> dict:
    """The arguments of `build_traces` and `tried_questions` that params decide, as the warm start stage reads them."""
    return {
        "wanted": cfg.warmstart.questions,
        "top_k": cfg.retrieval.top_k,
        "passage_chars": cfg.harness.passage_chars,
        "counted": cfg.warmstart.plans == "counted",
        "follow_ups_below": cfg.harness.max_turns if cfg.warmstart.follow_up_notes else 0,
    }


def warmstart(
    cfg: Config,
    backbone: str,
    model_dir: str | Path,
    index_dir: str | Path,
    train_path: str | Path,
    out_dir: str | Path,
    log: Callable[[str], None] | None = None,
) -> dict:
    """The `warmstart` stage: the starting checkpoint in `out_dir` (a backbone folder), and its metrics."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if not cfg.warmstart.enabled:  # a copy, but of a backbone params define and prepare_model made
        cfg.backbone(backbone)
        require_prepared(model_dir)
        with atomic_directory(out_dir) as tmp:
            shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
            content = content_sha256(tmp)
        return {"enabled": False, "content_sha256": content}
    # never warm-start on the dev split
    questions, _ = split_dev(read_questions(train_path, split="train"), cfg.train.dev, str(train_path))
    retriever = open_retriever(cfg.retrieval, index_dir, questions=(questions, str(train_path)))
    model, tokenizer = load_model(cfg, backbone, model_dir)
    policy = RolePolicy(model, tokenizer, {})
    traces, selection = build_traces(questions, retriever=retriever, policy=policy, **trace_settings(cfg))
    if log and selection["questions"] < cfg.warmstart.questions:
        log(
            f"warm start: {selection['questions']} questions gave traces, fewer than warmstart.questions "
            f"({cfg.warmstart.questions}): {len(questions)} training questions outside the dev split, "
            f"{selection['skipped_questions']} of those tried gave no trace"
        )
    merged, stats = supervised_finetune(model, tokenizer, traces, cfg.warmstart, cfg.lora, log)
    with atomic_directory(out_dir) as tmp:
        merged.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        content = content_sha256(tmp)
    return {
        "enabled": True,
        **selection,
        "traces": stats["traces"],
        "steps": stats["steps"],
        "trained_tokens": stats["trained_tokens"],
        "first_loss": round(stats["first_loss"], 6),
        "last_loss": round(stats["last_loss"], 6),
        "seconds": stats["seconds"],
        "content_sha256": content,
    }
