#!/usr/bin/env bash
# Chapter 08 on a CUDA GPU, in one call: the kernel tests compiled, then the GPU benchmark.
#
#   tools/gpu_check.sh                 # writes under $OUT (default ./bench-results/gpu)
#   PYTHON=/path/to/python tools/gpu_check.sh
#
# Needs a Python with a CUDA build of torch and Triton (no network is used). Writes:
#   $OUT/env.txt          device, driver, versions, date
#   $OUT/tests.log        pytest of tests/test_flash_triton.py (compiled kernels vs SDPA)
#   $OUT/bench.log        the benchmark table (also as markdown) and the targets summary
#   $OUT/flash_gpu.csv    one row per (dtype, d, causal, n, fwd/bwd, provider)
# Paste bench.log's markdown table, with env.txt's line, into docs/benchmarks.md.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench-results/gpu}"
mkdir -p "$OUT"

if [ -z "${PYTHON:-}" ]; then
  for candidate in .venv/bin/python python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" >/dev/null 2>&1; then
      PYTHON="$candidate"; break
    fi
  done
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # course_lib without installing it
unset TRITON_INTERPRET                                 # compiled kernels, not the interpreter

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  "$PYTHON" - <<'PY'
import platform, torch
print("python:", platform.python_version(), "| torch:", torch.__version__, "| cuda:", torch.version.cuda)
try:
    import triton; print("triton:", triton.__version__)
except ImportError:
    print("triton: not installed")
print("cuda available:", torch.cuda.is_available(),
      "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PY
} 2>&1 | tee "$OUT/env.txt"

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA GPU visible to $PYTHON: nothing to check" | tee -a "$OUT/env.txt"
  exit 2
fi

status=0
echo "== kernel tests (compiled) ==" | tee "$OUT/tests.log"
COURSE_FLASH_AUTOTUNE=0 timeout 170 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_flash_triton.py tests/test_flash_tiled.py \
  2>&1 | tee -a "$OUT/tests.log" || status=1

echo "== benchmark ==" | tee "$OUT/bench.log"
timeout 380 "$PYTHON" -m course_lib.flash.bench --device cuda --markdown --no-progress \
  --csv "$OUT/flash_gpu.csv" 2>&1 | tee -a "$OUT/bench.log" || status=1

echo "gpu_check: exit status $status (0 = tests passed and the benchmark finished)" | tee -a "$OUT/bench.log"
exit $status
