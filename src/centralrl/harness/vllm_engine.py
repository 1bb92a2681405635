"""The vLLM generation engine (`harness.engine: vllm`): the same `Generation` records as `RolePolicy`, faster.

`VllmRolePolicy` is a `RolePolicy` (same `encode_chat`, `clock`, `adapters`, and the HF `model`, which the
trainer updates and `ModelShape` reads) whose `generate` runs on one `vllm.LLM` built over `model_dir`, the
saved backbone the HF model was loaded from. A role with an adapter generates through a `LoRARequest` for that
adapter saved to disk; a frozen role (adapter None) runs the base model with no LoRA request, as "adapters
disabled" does in the transformers engine. Adapters are synced lazily: the first generation after construction
or after `weights_changed()` saves the HF model's current adapters with `save_adapters` into
<tempdir>/v<version>/ and makes fresh `LoRARequest`s with new int ids and names (vLLM caches an adapter by its
id); the previous version's folder is deleted. The sync is timed as part of the "generation" phase.
One `vllm.LLM` is built per process and engine arguments and shared by every policy opened with them (the
evaluation opens one policy per budget cut; vLLM does not reliably give GPU memory back when an LLM is dropped).

Requests: the prompt ids as `TokensPrompt(prompt_token_ids=...)`, one `SamplingParams` per prompt: seed
`derive_seed(seed, role, index)` (sampling is deterministic per prompt, whatever batch it lands in, up to
the numerics of batching), temperature 0 for greedy, top_k and top_p off (the transformers engine samples
from the full distribution), `max_tokens`, the role's stop strings kept in the output, `stop_token_ids` the
policy's `end_ids` (the transformers engine's end-of-sequence ids, given explicitly rather than left to vLLM's
reading of the generation config), `logprobs=0` (the chosen token's log-prob only). Every output goes through
`completion_to_generation` -> `trim_generation`, so the cut and the records mean what the transformers engine's
mean.

The vLLM interface this relies on (engine args, log-prob mode, sampling params, outputs), and how it was
checked, is in docs/verification.md; it sets the gpu extra's floor, vLLM 0.10.2.

Departures: vLLM matches stop strings on its incremental detokenization, the transformers engine on its
own; `trim_generation` re-cuts both the same way, so the ids agree whenever both stopped at the same token.
A float32 backbone with adapters is served in bfloat16 (`serving_dtype`): vLLM's LoRA kernels refuse float32, so
rollouts and evaluation generate from bf16 weights while the update runs in float32, as with the transformers
engine's `precision: bfloat16` (for rollouts the trainer's clipped ratio corrects the gap, the recorded log-probs
being the sampler's).
vLLM refuses a prompt plus completion longer than `harness.vllm.max_model_len`, so the context prompts are cut
to (`RolePolicy.fit_prompts`) is the smaller of it and the model's positions; it also refuses (recent versions) a
temperature above 2. vLLM's kernels differ from transformers', so log-probs agree to float tolerance, not
bit for bit, and a near-tie may flip a greedy token.
`batch_size` is not used: vLLM schedules all prompts of a call itself. When CUDA is already initialised in the
process, vLLM starts its engine process with `spawn`.
"""

from __future__ import annotations

import importlib.util
import itertools
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from centralrl.compute import PhaseClock
from centralrl.config import VllmConfig
from centralrl.errors import BackboneError
from centralrl.harness.engine import Generation, RolePolicy, trim_generation
from centralrl.harness.protocol import STOP_STRINGS
from centralrl.models.adapters import save_adapters
from centralrl.seeding import derive_seed

MIN_VLLM = "0.10.2"
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values
_ENGINES: dict[tuple, Any] = {}  # one vllm.LLM per engine arguments in this process (see the module docstring)
_LORA_IDS = itertools.count(1)  # LoRA int ids (and names) unique in this process: vLLM caches adapters by id
MISSING = "harness.engine: vllm needs the optional gpu extra: pip install -e '.[gpu]' (vLLM runs on CUDA GPUs only)"


def vllm_problems() -> list[str]:
    """Why the vLLM engine cannot run here (empty when it can): vLLM missing or too old, no CUDA device."""
    import torch

    problems = []
    if importlib.util.find_spec("vllm") is None:
        problems.append(MISSING)
    else:
        from importlib.metadata import version

        from packaging.version import Version

        installed = version("vllm")
        if Version(installed) < Version(MIN_VLLM):
            problems.append(f"harness.engine: vllm needs vllm>={MIN_VLLM}, found {installed}: pip install -e '.[gpu]'")
    if not torch.cuda.is_available():
        build = f"CUDA build {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        problems.append(
            f"harness.engine: vllm needs a CUDA GPU, but torch {torch.__version__} ({build}) sees none; "
            "use harness.engine: transformers on this machine"
        )
    return problems


def completion_to_generation(
    tokenizer: PreTrainedTokenizerBase,
    end_ids: frozenset[int],
    prompt: Sequence[int],
    token_ids: Sequence[int],
    logprobs: Sequence[dict[int, Any]] | None,
    role: str,
) -> Generation:
    """A vLLM completion (its token ids and, per token, a dict token id -> Logprob) as the transformers engine's
    record: the chosen tokens' log-probs, cut by `trim_generation`."""
    ids = list(token_ids)
    if logprobs is None or len(logprobs) != len(ids):
        raise BackboneError(
            f"vLLM returned {len(ids)} tokens but {None if logprobs is None else len(logprobs)} "
            "log-prob entries; the requests ask for logprobs=0"
        )
    chosen = [float(step[token].logprob) for step, token in zip(logprobs, ids)]
    return trim_generation(tokenizer, end_ids, prompt, ids, chosen, role)


def lora_rank(model: PreTrainedModel) -> int:
    """The largest LoRA rank among the model's adapters (0 without adapters)."""
    ranks = [0]
    for config in getattr(model, "peft_config", {}).values():
        ranks += [config.r, *(getattr(config, "rank_pattern", None) or {}).values()]
    return max(ranks)


def serving_dtype(dtype: str, lora: bool) -> str:
    """The dtype vLLM serves a backbone of `dtype` in: its own (vLLM's "auto" would turn float32 into float16),
    except float32 with adapters, served in bfloat16, since vLLM's LoRA kernels take float16 and bfloat16 only.

    >>> serving_dtype("float32", lora=False), serving_dtype("float32", lora=True), serving_dtype("float16", True)
    ('float32', 'bfloat16', 'float16')
    """
    return "bfloat16" if lora and dtype == "float32" else dtype


class VllmRolePolicy(RolePolicy):
    """`RolePolicy` with generation on vLLM; adapters re-synced from the HF model after `weights_changed()`."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        adapters: dict[str, str | None],
        model_dir: str | Path,
        settings: VllmConfig,
        batch_size: int = 16,
        clock: PhaseClock | None = None,
    ) -> None:
        super().__init__(model, tokenizer, adapters, batch_size, clock)
        self.context = min(self.context, settings.max_model_len)
        problems = vllm_problems()
        if problems:
            raise BackboneError("; ".join(problems))
        from vllm import LLM

        names = sorted({name for name in adapters.values() if name})
        lora: dict[str, Any] = {}
        if names:
            rank = lora_rank(model)
            fitting = [r for r in LORA_RANKS if r >= rank]
            if not fitting:
                raise BackboneError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank {LORA_RANKS[-1]}")
            lora = {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": len(names)}
        engine_args = dict(
            model=str(Path(model_dir).resolve()),
            tokenizer=str(Path(model_dir).resolve()),
            dtype=serving_dtype(str(next(model.parameters()).dtype).removeprefix("torch."), bool(lora)),
            seed=0,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            max_model_len=settings.max_model_len,
            enforce_eager=settings.enforce_eager,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            **lora,
        )
        key = tuple(sorted(engine_args.items()))
        if key not in _ENGINES:
            _ENGINES[key] = LLM(**engine_args)
        self.llm = _ENGINES[key]
        self._folder = tempfile.TemporaryDirectory(prefix="centralrl-vllm-adapters-")
        self._version = 0
        self._requests: dict[str, Any] | None = None  # adapter name -> LoRARequest; None: sync before generating

    def weights_changed(self) -> None:
        self._requests = None

    def _sync_adapters(self) -> None:
        from vllm.lora.request import LoRARequest

        previous = Path(self._folder.name) / f"v{self._version}"
        self._version += 1
        folder = Path(self._folder.name) / f"v{self._version}"
        saved = set(save_adapters(self.model, folder))
        shutil.rmtree(previous, ignore_errors=True)
        requests = {}
        for name in sorted({name for name in self.adapters.values() if name}):
            if name not in saved:
                raise BackboneError(f"role adapter {name!r} is not among the model's adapters {sorted(saved)}")
            int_id = next(_LORA_IDS)
            requests[name] = LoRARequest(f"{name}-{int_id}", int_id, str(folder / name))
        self._requests = requests

    def generate(
        self,
        role: str,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        greedy: bool,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> list[Generation]:
        if not prompts:
            return []
        prompts = self.fit_prompts(role, prompts, max_new_tokens)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        with self.clock.phase("generation"):
            if self._requests is None:
                self._sync_adapters()
            adapter = self.adapters.get(role)
            params = [
                SamplingParams(
                    temperature=0.0 if greedy else temperature,
                    top_k=-1,
                    top_p=1.0,
                    max_tokens=max_new_tokens,
                    seed=None if greedy else derive_seed(seed, role, index),
                    stop=STOP_STRINGS.get(role),
                    stop_token_ids=sorted(self.end_ids),
                    include_stop_str_in_output=True,
                    logprobs=0,
                )
                for index in range(len(prompts))
            ]
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(prompt)) for prompt in prompts],
                params,
                use_tqdm=False,
                lora_request=self._requests[adapter] if adapter else None,
            )
        return [
            completion_to_generation(
                self.tokenizer, self.end_ids, prompt, out.outputs[0].token_ids, out.outputs[0].logprobs, role
            )
            for prompt, out in zip(prompts, outputs)
        ]
