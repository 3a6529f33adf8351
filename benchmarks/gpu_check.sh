#!/usr/bin/env bash
# The one GPU check: unattended, at most 8 minutes on one GPU. Run it whenever a GPU is at hand.
#
#   benchmarks/gpu_check.sh            # JSON under $OUT when set, else benchmarks/results/
#
# Steps (each under its own time limit; a missing piece fails loudly, never silently):
#   1. pytest -m gpu                                  (the CUDA target on the GPU, GPU metrics)
#   2. quickstart on the GPU: ingest, train with bf16 autocast, eval, promote, infer; then DDP
#      training with nccl on 2 ranks when 2 GPUs exist; then `lumos compile --target cuda` of
#      the promoted model
#   3. benchmarks/compile.py --target cuda at batch 256 on both models (eager vs torch.compile vs
#      Lumos CUDA) and one attention at sequences 512 and 2048 against SDPA
# Writes gpu_check.json (every step: status, exit code, seconds, log file) beside the step logs
# and benchmark JSON; exits 1 when any step failed, naming it.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RESULTS="${OUT:-$ROOT/benchmarks/results}"
mkdir -p "$RESULTS"
SUMMARY="$RESULTS/gpu_check.json"
export MLFLOW_DISABLE_TELEMETRY=true
FAILED=()

fail_now() {  # a prerequisite is missing: nothing else can run
  echo "gpu_check: $1" >&2
  printf '{"ok": false, "error": "%s", "steps": []}\n' "$1" > "$SUMMARY"
  exit 1
}

step() {  # step NAME SECONDS COMMAND...: run it with a time limit, log it, record it
  local name="$1" limit="$2"
  shift 2
  local log="$RESULTS/gpu_check_$name.log" started ended code
  echo "== $name (limit ${limit}s): $*"
  started=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  code=$?
  ended=$(date +%s)
  tail -n 15 "$log"
  local status=passed
  if [ "$code" -ne 0 ]; then
    status=failed
    [ "$code" -eq 124 ] && status=timed_out
    FAILED+=("$name")
    echo "!! $name $status (exit $code); full log: $log" >&2
  fi
  printf '{"name": "%s", "status": "%s", "exit_code": %d, "seconds": %d, "log": "%s"}\n' \
    "$name" "$status" "$code" "$((ended - started))" "$log" >>"$STEPS"
}

cd "$ROOT" || fail_now "cannot enter $ROOT"
command -v python >/dev/null || fail_now "python not found"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || fail_now "no CUDA GPU visible to torch (check the driver: nvidia-smi)"
python -c "import cuda.bindings.nvrtc, cuda.bindings.driver" \
  || fail_now "cuda-bindings missing: pip install -e '.[cuda]'"
command -v lumos >/dev/null || fail_now "the lumos command is missing: pip install -e '.[cuda]'"
command -v java >/dev/null || fail_now "java missing: the quickstart's ingest runs Spark (install a Java 17 runtime)"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
WORK="$(mktemp -d -t lumos-gpu-check-XXXXXX)"
STEPS="$WORK/steps.jsonl"
: >"$STEPS"
echo "gpu_check: $GPUS GPU(s); results in $RESULTS; scratch in $WORK"
lumos doctor --json >"$RESULTS/gpu_check_doctor.json" 2>&1 || true  # for the record: NVRTC, driver, launcher, arch

step pytest_gpu 150 python -m pytest -m gpu -q -p no:cacheprovider --junitxml="$RESULTS/gpu_check_pytest.xml"

# The quickstart's own recipes with the GPU and bf16 autocast asked for explicitly (device "auto"
# would quietly fall back to the CPU).
mkdir -p "$WORK/qs"
cp "$ROOT/lumos/quickstart/ingest.toml" "$WORK/qs/"
cp -r "$ROOT/lumos/quickstart/tasks" "$WORK/qs/"
sed 's/^\[run\]$/[run]\ndevice = "cuda"\nprecision = "bf16"/' "$ROOT/lumos/quickstart/train.toml" >"$WORK/qs/train.toml"
grep -q 'precision = "bf16"' "$WORK/qs/train.toml" || fail_now "could not set bf16 in the quickstart's train.toml"
step quickstart_bf16 150 lumos quickstart --dir "$WORK/qs" --steps 300
if [ "$GPUS" -ge 2 ]; then
  step train_nccl_2_ranks 90 bash -c "cd '$WORK/qs' && lumos train --config train.toml --nproc 2 --set run.max_steps=100 --json"
else
  echo "== train_nccl_2_ranks: skipped (one GPU)"
  printf '{"name": "train_nccl_2_ranks", "status": "skipped", "reason": "one GPU"}\n' >>"$STEPS"
fi
step compile_cuda_cli 60 bash -c "cd '$WORK/qs' && lumos compile --model quickstart@production --target cuda --batch 256 --json"

step compile_benchmark 180 python benchmarks/compile.py --target cuda --batch 256 --repeats 20 \
  --out "$RESULTS/compile_cuda.json"

python - "$STEPS" "$SUMMARY" "$GPUS" "$RESULTS/compile_cuda.json" <<'PY' || echo "gpu_check: could not write the summary" >&2
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
failed = [step["name"] for step in steps if step["status"] not in ("passed", "skipped")]
summary = {"ok": not failed, "gpus": int(sys.argv[3]), "failed": failed, "steps": steps, "benchmark": sys.argv[4]}
try:
    summary["compile_cuda"] = json.load(open(sys.argv[4]))
except (OSError, ValueError):
    summary["compile_cuda"] = None
json.dump(summary, open(sys.argv[2], "w"), indent=1)
PY
rm -rf "$WORK"
if [ ${#FAILED[@]} -ne 0 ]; then
  echo "gpu_check: FAILED: ${FAILED[*]} (see $SUMMARY)" >&2
  exit 1
fi
echo "gpu_check: all steps passed; $SUMMARY"
