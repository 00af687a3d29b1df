#!/usr/bin/env bash
# The GPU measurements behind docs/benchmarks.md, in parts that each fit a 10-minute slot:
#   bash benchmarks/gpu_suite.sh env      OUTDIR   # versions, nvidia-smi
#   bash benchmarks/gpu_suite.sh train    OUTDIR   # a real training run + `trainpilot-cli probe --record`
#   bash benchmarks/gpu_suite.sh memory   OUTDIR [ROWS] [NAME]   # memory_accuracy.py (ROWS e.g. 0-8)
#   bash benchmarks/gpu_suite.sh speed    OUTDIR   # speed_stack.py --stack (seed 001's cumulative stack)
#   bash benchmarks/gpu_suite.sh realpath OUTDIR [ROWS] [NAME]  # speed_stack.py: trainpilot-cli run per loss kernel
#                                                               # (ROWS e.g. 0-3, then 4-7: ~4 rows per 10 minutes)
#   bash benchmarks/gpu_suite.sh overhead OUTDIR   # overhead.py on the GPU
# Several parts: bash benchmarks/gpu_suite.sh "env train memory" OUTDIR
# Where the machine lacks TrainPilot's Python dependencies and has no index, wheels in ./.whl are
# installed into /tmp/site first (see /work/.library/device/README.md for how they were fetched).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
parts="$1"; out="$(mkdir -p "$2" && cd "$2" && pwd)"; rows="${3:-}"; name="${4:-memory_accuracy}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ! "$PY" -c "import pydantic, datasets" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

for part in $parts; do
  echo "=== $part $(date -u +%FT%TZ)"
  case "$part" in
    env)
      nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv
      "$PY" - <<'EOF'
import importlib, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no cuda")
for m in ("transformers", "accelerate", "peft", "datasets", "deepspeed", "pydantic", "pynvml"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(m, "MISSING", type(e).__name__, e)
EOF
      ;;
    train)
      run="/tmp/tp_gpu_run"; rm -rf "$run"
      "$PY" -m trainer probe --record "$out/h100_training.jsonl" --seconds 100 --interval 0.5 &
      rec=$!
      sleep 3
      timeout 240 "$PY" -m trainer run benchmarks/configs/gpu_telemetry_run.yaml --run-dir "$run"
      echo "trainer exit $?"
      wait $rec
      cp "$run/events.jsonl" "$out/h100_run_events.jsonl"; cp "$run/plan.json" "$out/h100_run_plan.json"
      tail -n 40 "$run/train.log"
      ;;
    memory)
      timeout "${MEM_TIMEOUT:-560}" "$PY" benchmarks/memory_accuracy.py --out "$out/$name.json" ${rows:+--only "$rows"}
      echo "memory_accuracy exit $?"
      ;;
    speed)
      timeout "${SPEED_TIMEOUT:-560}" "$PY" benchmarks/speed_stack.py --stack --out "$out/speed_stack.json" ${SPEED_STEPS:+--steps "$SPEED_STEPS"}
      echo "speed_stack exit $?"
      ;;
    realpath)
      timeout "${SPEED_TIMEOUT:-580}" "$PY" benchmarks/speed_stack.py --out "$out/${4:-speed_real_path}${rows:+_$rows}.json" \
        ${rows:+--rows "$rows"} ${SPEED_STEPS:+--steps "$SPEED_STEPS"}
      echo "speed_stack (real path) exit $?"
      ;;
    overhead)
      timeout 560 "$PY" benchmarks/overhead.py --model llama-3.2-1b --device cuda --seq-len 2048 --micro-batch 4 \
        --accumulation 1 --steps 30 --warmup 5 --pairs 2 --json "$out/overhead_gpu.json"
      echo "overhead exit $?"
      ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
