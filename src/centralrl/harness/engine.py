"""Batched generation for a role, with every generated token's log-probability.

`RolePolicy.generate(role, prompts)` runs the prompts (token ids) through `model.generate` in batches of
`batch_size`, left-padded, with the role's adapter active (or all adapters disabled for a frozen role), and
returns for each prompt the generated ids up to and including the token that ends the role's action (a stop
string or end-of-sequence), their log-probabilities under the sampling distribution (logits / temperature;
temperature 1 for greedy), and the decoded text. Sampling seeds derive from the call's seed and batch index.

`trim_generation` is where every engine cuts a completion (after end-of-sequence or after the token that
completes a stop string), so the records mean the same whichever engine made them. `open_policy` picks the
engine from `harness.engine`: this one (transformers) or `VllmRolePolicy` (vLLM, the optional gpu extra,
imported only when chosen). The trainer calls `weights_changed()` after every optimizer step and after
restoring a state; this engine generates with the model itself, so for it that is a no-op.

Every prompt is cut to fit the model's context before it is generated from (`fit_prompt`): at most the
context (`max_position_embeddings`; the vLLM engine also `harness.vllm.max_model_len`) minus the call's
`max_new_tokens`. What is cut is the middle: the first half of the allowance is kept from the start (the
system prompt and the opening of the user turn), the second half from the end (the latest notes or search
results, the chat template's assistant opening and the prefilled tag). So an over-long question, note or
transcript loses its middle instead of hanging generation in quadratic attention or overrunning the position
table; the records hold the prompt as cut, which is what the model saw and what the trainer scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from centralrl.compute import PhaseClock
from centralrl.config import HarnessConfig
from centralrl.errors import BackboneError
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


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


class RolePolicy:
    """The generation side of the harness: one backbone, role adapters, batched sampling or greedy decoding."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        adapters: dict[str, str | None],
        batch_size: int = 16,
        clock: PhaseClock | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.adapters = adapters
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self.clock = clock or PhaseClock()  # generation and retrieval time of the episodes run with this policy
        self.context = model.config.max_position_embeddings  # positions a prompt plus its completion may fill

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
        """The trainer calls this after every optimizer step and after restoring a state; an engine that holds
        its own copy of the adapters re-syncs them before its next generation. Here the model is used directly."""

    def generate(
        self,
        role: str,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        greedy: bool,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> list[Generation]:
        results: list[Generation] = []
        prompts = self.fit_prompts(role, prompts, max_new_tokens)
        with self.clock.phase("generation"):
            for start in range(0, len(prompts), self.batch_size):
                batch = prompts[start : start + self.batch_size]
                torch.manual_seed(derive_seed(seed, role, start))
                results.extend(self._generate_batch(role, batch, max_new_tokens, greedy, temperature))
        return results

    @torch.no_grad()
    def _generate_batch(
        self, role: str, prompts: Sequence[Sequence[int]], max_new_tokens: int, greedy: bool, temperature: float
    ) -> list[Generation]:
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        # An explicit config, so a checkpoint's own defaults (SmolLM2 ships top_p/temperature) never leak in.
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            temperature=1.0 if greedy else temperature,
            top_k=None if greedy else 0,
            top_p=1.0,
            pad_token_id=pad,
            eos_token_id=self.tokenizer.eos_token_id,
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
            trim_generation(self.tokenizer, prompt, generated[i].tolist(), chosen[i].tolist(), role)
            for i, prompt in enumerate(prompts)
        ]


def trim_generation(
    tokenizer: PreTrainedTokenizerBase, prompt: Sequence[int], ids: list[int], logprobs: list[float], role: str
) -> Generation:
    """Cut a row after its end-of-sequence token or the token that completes a stop string."""
    stops = STOP_STRINGS.get(role, [])
    end = len(ids)
    text = ""
    for position, token in enumerate(ids):
        if token == tokenizer.eos_token_id:
            end = position + 1
            break
        text += tokenizer.decode([token])
        if any(stop in text for stop in stops):
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
    return RolePolicy(model, tokenizer, adapters, harness.batch_size, clock)
