"""Batched generation for a role, with every generated token's log-probability.

`RolePolicy.generate(role, prompts)` returns for each prompt (token ids) the generated ids up to and including
the token that ends the role's action (a stop string or end-of-sequence), their log-probabilities under the
sampling distribution (logits / temperature in float32; temperature 1 for greedy), and the decoded text.

The decode loop (`decode`) is ours, over the HF model's forward with a KV cache, instead of `model.generate`, so
that no token is computed for nothing: - bucketing: a call's prompts are sorted by length and cut into batches of
`batch_size`, so a batch pads little; the results come back in the input order; - a shared prefix is prefilled
once: the longest token prefix common to a batch's prompts (the role's system prompt at least) is prefilled as one
row and its cache expanded to every row; identical prompts (a group's G samples at the first turn share the system
prompt and the question) are prefilled once; - finished rows leave the batch: when a row ends (end-of-sequence, a
stop string, or `max_new_tokens`), its cache rows are dropped (`index_select`), so decode steps run only the live
rows; - the cache is written in place: a transformers `DynamicCache` whose layers are `RoomyLayer`s, with room for
the batch's prompts and `max_new_tokens` allocated at prefill (transformers' own layer concatenates, copying the
whole cache, at every decode step); - the stop test is `ends_action`, the rule `trim_generation` cuts by, applied
as each token arrives. Sampling draws each prompt's tokens from its own `torch.Generator`, seeded from (call seed,
role, the prompt's index in the call), as the vLLM engine seeds per prompt: a prompt's random stream does not
depend on which batch, bucket or row it lands in, and the same inputs give the same tokens. Its tokens do, in the
last bits: the batch's shapes (its shared prefix, its padding) change the logits' rounding, by about 3e-2 in bf16
between a prompt in a batch of 12 and alone, and a draw flips where that moves a boundary past the uniform
(measured over 20,000 draws per prompt: 32 flips in 1,000 in bf16, 4 in 100,000 in float32), so `batch_size` and
the thread count are inputs too. A token is drawn by inverse CDF (one uniform per token, `_sample`), not
`torch.multinomial` (a random number per vocabulary entry). An exponential race (argmax of p / E, E ~ Exp(1) per
vocabulary entry, as vLLM samples) flipped 1 draw in 1,000 in bf16 but cost 27 ms per decode step of 16 rows
against inverse CDF's 2.8 ms (a third of a step or more: SmolLM2 generates about 88 tokens/s for 8 rows). Greedy takes
the argmax of the raw logits, as `model.generate` does. Departures from `model.generate`: the shared prefix and the
dropped rows change the shapes of the matmuls, so logits can differ from generate's in the last float bits (the
tests check that greedy tokens agree); sampled tokens differ from generate's (another random stream).

Precision: `precision` applies to sampled calls (training rollouts), `eval_precision` to greedy calls
(evaluation); each is resolved by `hardware.compute_dtype` (`auto`: bf16 where the hardware has it). A call runs
on the model itself (through the PEFT wrapper, the role's adapter active or all disabled) when the resolved dtype
is the model's own; otherwise on a copy in that dtype (`MergedCopies`): the backbone copied once, without the
PEFT wrapper, shared by the frozen roles, and for each trained adapter a copy that shares every weight with it
except the adapted ones, which hold backbone + LoRA delta, merged in float32 then cast. The merged weights are
rebuilt lazily after `weights_changed()`, which the trainer calls after every optimizer step and after
restoring a state (the backbone is frozen, so its copy is kept); `release_copies()`, which the trainer calls
before every update, frees them all, so the update's peak memory does not hold them. The recorded log-probs
are those of the copy that sampled (the trainer uses them as the old log-probs, so its clipped ratio corrects
the precision gap).

Not done: keeping the central agent's KV from one turn to the next. Each central turn builds a fresh chat
(harness/episodes.py): the previous turn's completion is not in the next prompt, and the notes block replaces
"Notes so far: none." in the middle of the user message, so the previous KV is valid only up to the question;
the system prompt part of that is prefilled once per batch here anyway, and only the question (tens of
tokens per row) would be saved, at the cost of holding every live episode's cache between `generate` calls.

`trim_generation` is where every engine cuts a completion (after end-of-sequence or after the token that
completes a stop string), so the records mean the same whichever engine made them. End-of-sequence is any id of
`RolePolicy.end_ids` (`end_of_sequence_ids`: the tokenizer's eos and the model's generation config's, found once
when the policy is built), as HF `generate` and vLLM stop. `open_policy` picks the
engine from `harness.engine`: this one (transformers) or `VllmRolePolicy` (vLLM, the optional gpu extra,
imported only when chosen).

Every prompt is cut to fit the model's context before it is generated from (`fit_prompt`): at most the
context (`max_position_embeddings`; the vLLM engine also `harness.vllm.max_model_len`) minus the call's
`max_new_tokens`. What is cut is the middle: the first half of the allowance is kept from the start (the
system prompt and the opening of the user turn), the second half from the end (the latest notes or search
results, the chat template's assistant opening and the prefilled tag). So an over-long question, note or
transcript loses its middle instead of hanging generation in quadratic attention or overrunning the position
table; the records hold the prompt as cut, which is what the model saw and what the trainer scores.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from centralrl.compute import PhaseClock
from centralrl.config import HarnessConfig
from centralrl.errors import BackboneError
from centralrl.hardware import compute_dtype, return_free_memory
from centralrl.harness.protocol import STOP_STRINGS
from centralrl.models.adapters import acting_as
from centralrl.seeding import derive_seed


@dataclass(frozen=True)
class Generation:
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str


def fit_prompt(prompt: Sequence[int], limit: int) -> list[int]:
    """`prompt` cut to at most `limit` tokens by dropping its middle (half of `limit` kept from each end).

    >>> fit_prompt(list(range(10)), 4), fit_prompt([1, 2], 4)
    ([0, 1, 8, 9], [1, 2])
    """
    if len(prompt) <= limit:
        return list(prompt)
    head = limit // 2
    return list(prompt[:head]) + list(prompt[len(prompt) - (limit - head) :])


def shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix common to all prompts, leaving every prompt at least one token of its own.

    >>> shared_prefix([[1, 2, 3, 4], [1, 2, 5]]), shared_prefix([[1, 2], [1, 2]]), shared_prefix([[7], [8, 9]])
    (2, 1, 0)
    """
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for length in range(limit):
        if any(p[length] != first[length] for p in prompts):
            return length
    return max(limit, 0)


def causal_lm(model: PreTrainedModel) -> PreTrainedModel:
    """The HF causal LM inside a PEFT wrapper (its LoRA layers in place), or the model itself."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


@functools.cache
def cache_argument(model_class: type) -> str:
    """transformers 5 names the KV cache argument `cache`; 4.x names it `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def prefixed_states(decoder, ids: torch.Tensor, attention: torch.Tensor, shared: int) -> torch.Tensor:
    """The decoder's last hidden states [B, L - shared, H] at positions `shared`.. of right-padded `ids` [B, L]
    (`attention` [B, L]). The first `shared` positions, the same in every row, run once as one row whose KV is
    expanded to every row (under autograd the rows' gradients sum back through the expansion); the rest of each
    row attends to them through that cache."""
    cache = {}
    if shared:
        cache = {cache_argument(type(decoder)): DynamicCache(config=decoder.config)}
        decoder(input_ids=ids[:1, :shared], use_cache=True, **cache)
        next(iter(cache.values())).batch_repeat_interleave(len(ids))
    out = decoder(input_ids=ids[:, shared:], attention_mask=attention, use_cache=bool(cache), **cache)
    return out.last_hidden_state


def _plain_copy(model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """The backbone of `model` in `dtype`, without LoRA layers and without gradients (buffers keep their dtype)."""
    lm = causal_lm(model)
    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in lm.parameters()}
    plain = copy.deepcopy(lm, memo)
    for name, module in list(plain.named_modules()):
        if isinstance(module, LoraLayer):
            plain.set_submodule(name, module.get_base_layer())
    return plain.eval()


@torch.no_grad()
def _merged_copy(plain: PreTrainedModel, model: PreTrainedModel, adapter: str) -> PreTrainedModel:
    """`plain` with `adapter` merged: every weight shared with `plain` except the adapted ones, which are
    backbone + LoRA delta computed in the adapter's dtype and cast to `plain`'s."""
    merged = copy.deepcopy(plain, {id(p): p for p in plain.parameters()})
    for name, layer in causal_lm(model).named_modules():
        if isinstance(layer, LoraLayer) and adapter in layer.lora_A:
            weight = layer.get_base_layer().weight + layer.get_delta_weight(adapter)
            target = merged.get_submodule(name)
            target.weight = torch.nn.Parameter(weight.to(target.weight.dtype), requires_grad=False)
    return merged


class MergedCopies:
    """Copies of the model to generate from in another dtype: the plain backbone per dtype (kept: the backbone is
    frozen) and one merged copy per (adapter, dtype), dropped by `refresh()` and rebuilt on next use."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.plain: dict[torch.dtype, PreTrainedModel] = {}
        self.merged: dict[tuple[str, torch.dtype], PreTrainedModel] = {}

    def refresh(self) -> None:
        self.merged.clear()

    def release(self) -> None:
        """Drop every copy, the plain ones too (rebuilt at the next generation: under a second each)."""
        self.merged.clear()
        self.plain.clear()

    def get(self, adapter: str | None, dtype: torch.dtype) -> PreTrainedModel:
        if dtype not in self.plain:
            self.plain[dtype] = _plain_copy(self.model, dtype)
        if adapter is None:
            return self.plain[dtype]
        if (adapter, dtype) not in self.merged:
            self.merged[adapter, dtype] = _merged_copy(self.plain[dtype], self.model, adapter)
        return self.merged[adapter, dtype]


def end_of_sequence_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids that end a sequence: the tokenizer's eos and every eos id of the model's generation config (an int,
    a list or None). Qwen2.5-Instruct's lists <|im_end|> and <|endoftext|>, and HF `generate` and vLLM stop at
    either, while its tokenizer names only <|im_end|>."""
    declared = getattr(causal_lm(model).generation_config, "eos_token_id", None)
    declared = [declared] if isinstance(declared, int) else list(declared or [])
    return frozenset(i for i in [tokenizer.eos_token_id, *declared] if i is not None)


def ends_action(
    tokenizer: PreTrainedTokenizerBase, end_ids: frozenset[int], stops: Sequence[str], text: str, token: int
) -> tuple[bool, str]:
    """Whether `token` ends a completion whose decoded text so far is `text` (one of `end_ids`, or the text with
    it contains a stop string), and that text (each token decoded on its own and appended)."""
    if token in end_ids:
        return True, text
    text += tokenizer.decode([token])
    return any(stop in text for stop in stops), text


class RoomyLayer(DynamicLayer):
    """A `DynamicLayer` that writes new keys and values into room allocated ahead instead of concatenating
    (transformers' layer copies the whole cache with `torch.cat` at every decode step). `keys` and `values` are
    views of the first `length` slots of buffers that hold `capacity` slots (doubled if they run out)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.buffers = [s.new_empty(*s.shape[:2], 0, s.shape[-1]) for s in (key_states, value_states)]
        end = self.length + key_states.shape[-2]
        if end > self.buffers[0].shape[-2]:
            slots = max(end, self.capacity, 2 * self.buffers[0].shape[-2])
            self.buffers = [self._grown(b, slots) for b in self.buffers]
        for buffer, states in zip(self.buffers, (key_states, value_states)):
            buffer[:, :, self.length : end] = states
        self.length = end
        return self._view()

    def _grown(self, buffer: torch.Tensor, slots: int) -> torch.Tensor:
        grown = buffer.new_empty(*buffer.shape[:2], slots, buffer.shape[-1])
        grown[:, :, : self.length] = buffer[:, :, : self.length]
        return grown

    def _view(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys, self.values = (b[:, :, : self.length] for b in self.buffers)
        return self.keys, self.values

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.buffers = [b.repeat_interleave(repeats, dim=0) for b in self.buffers]
        self._view()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.buffers = [b[indices] for b in self.buffers]
        self._view()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


def roomy_cache(config, capacity: int) -> DynamicCache:
    """A `DynamicCache` for `config` whose full-attention layers are `RoomyLayer`s of `capacity` slots."""
    cache = DynamicCache(config=config)
    cache.layers = [RoomyLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _forward(lm: PreTrainedModel, ids, mask, positions, cache: DynamicCache) -> torch.Tensor:
    """Logits [B, V] of the last position of each row, the cache extended by `ids`. The last position is kept by
    index (`logits_to_keep` as a tensor gathers a contiguous [B, 1, H]); `logits_to_keep=1` slices a strided
    view, which torch multiplies with the output head as a batched matmul over B copies of its weight."""
    last = torch.tensor([ids.shape[1] - 1], device=ids.device)
    out = lm(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=last,
        **{cache_argument(type(lm)): cache},
    )
    return out.logits[:, -1]


def prefill(
    lm: PreTrainedModel, prompts: Sequence[Sequence[int]], pad: int, room: int
) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
    """Prefill `prompts` -> (cache, last logits [B, V], attention mask [B, cached slots]); the cache has `room` more
    slots per row.

    The shared prefix is run once as one row; each distinct remainder once, left-padded to the longest (the
    padding sits between the prefix and the remainder, masked, positions counted over real tokens only)."""
    device = lm.device
    shared = shared_prefix(prompts)
    distinct = list(dict.fromkeys(tuple(p[shared:]) for p in prompts))
    width = max(len(rest) for rest in distinct)
    cache = roomy_cache(lm.config, shared + width + room)
    if shared:
        head = torch.tensor([list(prompts[0][:shared])], device=device)
        _forward(lm, head, torch.ones_like(head), torch.arange(shared, device=device)[None], cache)
        cache.batch_repeat_interleave(len(distinct))
    pads = [width - len(rest) for rest in distinct]
    ids = torch.tensor([[pad] * n + list(rest) for n, rest in zip(pads, distinct)], device=device)
    mask = torch.tensor([[1] * shared + [0] * n + [1] * (width - n) for n in pads], device=device)
    positions = torch.tensor([[1] * n + list(range(shared, shared + width - n)) for n in pads], device=device)
    logits = _forward(lm, ids, mask, positions, cache)
    if len(distinct) < len(prompts):
        rows = torch.tensor([distinct.index(tuple(p[shared:])) for p in prompts], device=device)
        cache.reorder_cache(rows)
        logits, mask = logits[rows], mask[rows]
    return cache, logits, mask


def _sample(logprobs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row drawn from exp(`logprobs`) [rows, V] by inverse CDF: one uniform from the row's own
    generator against the row's cumulative distribution (float64), instead of `torch.multinomial`, which
    draws a random number per vocabulary entry."""
    cdf = logprobs.double().exp().cumsum(-1)
    uniform = torch.cat([torch.rand(1, generator=g, dtype=torch.float64, device=g.device) for g in generators])
    token = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True)[:, 0]
    return token.clamp_max(cdf.shape[-1] - 1)


@torch.no_grad()
def decode(
    lm: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    end_ids: frozenset[int],
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int] | None,
    max_new_tokens: int,
    temperature: float,
    stops: Sequence[str],
) -> list[tuple[list[int], list[float]]]:
    """Generate for one batch of prompts -> per prompt (ids, log-probs under logits / temperature), each ending
    at its first `ends_action` token or at `max_new_tokens`. `seeds` None: greedy (temperature ignored)."""
    device = lm.device
    cache, logits, mask = prefill(lm, prompts, tokenizer.pad_token_id, max_new_tokens)
    positions = torch.tensor([len(p) for p in prompts], device=device)
    generators = None if seeds is None else [torch.Generator(device).manual_seed(s) for s in seeds]
    scale = 1.0 if seeds is None else temperature
    out: list[tuple[list[int], list[float]]] = [([], []) for _ in prompts]
    texts = [""] * len(prompts)
    live = list(range(len(prompts)))
    while True:
        logprobs = (logits.float() / scale).log_softmax(-1)
        if generators is None:
            tokens = logits.argmax(-1)  # as generate: the argmax of the raw logits
        else:
            tokens = _sample(logprobs, [generators[i] for i in live])
        chosen = logprobs.gather(-1, tokens[:, None])[:, 0]
        keep = []
        for j, (row, token, logprob) in enumerate(zip(live, tokens.tolist(), chosen.tolist())):
            ids, logprobs = out[row]
            ids.append(token)
            logprobs.append(logprob)
            ended, texts[row] = ends_action(tokenizer, end_ids, stops, texts[row], token)
            if not ended and len(ids) < max_new_tokens:
                keep.append(j)
        if not keep:
            return out
        if len(keep) < len(live):
            index = torch.tensor(keep, device=device)
            cache.reorder_cache(index)
            mask, positions, tokens = mask[index], positions[index], tokens[index]
            live = [live[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
        logits = _forward(lm, tokens[:, None], mask, positions[:, None], cache)
        positions = positions + 1


class RolePolicy:
    """The generation side of the harness: one backbone, role adapters, batched sampling or greedy decoding."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        adapters: dict[str, str | None],
        batch_size: int = 16,
        clock: PhaseClock | None = None,
        precision: str = "float32",
        eval_precision: str = "float32",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.end_ids = end_of_sequence_ids(model, tokenizer)  # every engine stops at these, trims after them
        self.adapters = adapters
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self.clock = clock or PhaseClock()  # generation and retrieval time of the episodes run with this policy
        self.context = model.config.max_position_embeddings  # positions a prompt plus its completion may fill
        self.precision = precision  # sampled calls (training rollouts)
        self.eval_precision = eval_precision  # greedy calls (evaluation)
        self.copies = MergedCopies(model)

    def encode_chat(self, messages: list[dict], prefill: str = "") -> list[int]:
        """Token ids of a chat with the assistant's turn opened and `prefill` already written in it."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text + prefill, add_special_tokens=False)

    def fit_prompts(self, role: str, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """Each prompt cut (`fit_prompt`) so that it and `max_new_tokens` new tokens fit the context."""
        limit = self.context - max_new_tokens
        if limit < 1:
            raise BackboneError(
                f"harness.max_new_tokens.{role} ({max_new_tokens}) leaves no room for a prompt in the "
                f"backbone's context of {self.context} positions"
            )
        return [fit_prompt(prompt, limit) for prompt in prompts]

    def weights_changed(self) -> None:
        """The trainer calls this after every optimizer step and after restoring a state: merged copies of the
        adapters are stale and are rebuilt before their next generation."""
        self.copies.refresh()

    def release_copies(self) -> None:
        """Free the generation copies before an update: its activations then reuse their memory instead of
        adding to it (SmolLM2-135M: ~0.9 GB of bf16 copies), and they are rebuilt at the next generation. The freed
        pages go back to the OS (`return_free_memory`), as the update's activations do after each micro-batch."""
        self.copies.release()
        return_free_memory()

    @contextmanager
    def generating_as(self, role: str, dtype: torch.dtype) -> Iterator[PreTrainedModel]:
        """The causal LM that generates as `role` in `dtype`: the model itself with the role's adapter active
        when `dtype` is its own, else the merged copy in `dtype`."""
        adapter = self.adapters.get(role)
        if dtype == self.model.dtype:
            with acting_as(self.model, adapter):
                yield causal_lm(self.model)
        else:
            yield self.copies.get(adapter, dtype)

    def generate(
        self,
        role: str,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        greedy: bool,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> list[Generation]:
        prompts = self.fit_prompts(role, prompts, max_new_tokens)
        dtype = compute_dtype(self.eval_precision if greedy else self.precision, self.device)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: dict[int, Generation] = {}
        with self.clock.phase("generation"), self.generating_as(role, dtype) as lm:
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                seeds = None if greedy else [derive_seed(seed, role, i) for i in rows]
                batch = [prompts[i] for i in rows]
                stops = STOP_STRINGS.get(role, [])
                decoded = decode(lm, self.tokenizer, self.end_ids, batch, seeds, max_new_tokens, temperature, stops)
                for i, (ids, logprobs) in zip(rows, decoded):
                    results[i] = trim_generation(self.tokenizer, self.end_ids, prompts[i], ids, logprobs, role)
        return [results[i] for i in range(len(prompts))]


def trim_generation(
    tokenizer: PreTrainedTokenizerBase,
    end_ids: frozenset[int],
    prompt: Sequence[int],
    ids: list[int],
    logprobs: list[float],
    role: str,
) -> Generation:
    """Cut a row after its first token of `end_ids` or the token that completes a stop string (`ends_action`)."""
    stops = STOP_STRINGS.get(role, [])
    end = len(ids)
    text = ""
    for position, token in enumerate(ids):
        ended, text = ends_action(tokenizer, end_ids, stops, text, token)
        if ended:
            end = position + 1
            break
    kept = ids[:end]
    return Generation(
        tuple(prompt), tuple(kept), tuple(logprobs[:end]), tokenizer.decode(kept, skip_special_tokens=True)
    )


def open_policy(
    harness: HarnessConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    adapters: dict[str, str | None],
    model_dir: str | Path,
    clock: PhaseClock | None = None,
) -> RolePolicy:
    """The generation engine `harness.engine` names, over `model` (already on its device, adapters attached).

    `model_dir` is the saved backbone `model` was loaded from (vLLM loads its own copy of it); the vLLM
    engine takes the LoRA rank from the model's adapters. vLLM is imported only on that branch.
    """
    if harness.engine == "vllm":
        from centralrl.harness.vllm_engine import VllmRolePolicy

        return VllmRolePolicy(model, tokenizer, adapters, model_dir, harness.vllm, harness.batch_size, clock)
    return RolePolicy(model, tokenizer, adapters, harness.batch_size, clock, harness.precision, harness.eval_precision)
