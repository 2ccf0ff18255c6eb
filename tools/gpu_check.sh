#!/usr/bin/env bash
# Chapter 08 on a CUDA GPU, in one call that fits a 10-minute command (course_lib/flash/gpu_check.py):
# machine and versions, SDPA's backend choice, the bf16 matmul rate, bf16 correctness at
# n = 2k-8k with autotuning on, forward/backward timings against SDPA (default, FlashAttention-2,
# cuDNN), then the compiled kernel tests last under their own timeout.
#
#   tools/gpu_check.sh                 # writes under $OUT (default ./bench-results/gpu)
#   tools/gpu_check.sh --dry-run       # the same flow on a CPU with tiny sizes (under a minute)
#   PYTHON=/path/to/python BUDGET=300 tools/gpu_check.sh
#
# Writes, each as soon as it is known:
#   $OUT/results.jsonl   one JSON object per result (survives a killed run)
#   $OUT/summary.md      the tables and the targets; written even when the run is stopped
#   $OUT/pytest.log      the compiled kernel tests' output
# Paste summary.md's tables, with its machine line, into docs/benchmarks.md.
set -u -o pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-bench-results/gpu}"
mkdir -p "$OUT"

if [ -z "${PYTHON:-}" ]; then
  for candidate in .venv/bin/python python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" >/dev/null 2>&1; then
      PYTHON="$candidate"; break
    fi
  done
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # course_lib without installing it
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"  # Triton 3.9's default, quietly
case " $* " in
  *" --dry-run "*) ;;
  *) unset TRITON_INTERPRET ;;                       # compiled kernels, not the interpreter
esac

# measurements stop starting new steps after BUDGET s; the tests get PYTEST_TIMEOUT s; the whole
# call is cut at 570 s, inside a 10-minute command (the summary is written on SIGTERM too)
timeout -k 10 570 "$PYTHON" -m course_lib.flash.gpu_check --out "$OUT" \
  --budget "${BUDGET:-300}" --pytest-timeout "${PYTEST_TIMEOUT:-150}" "$@" 2>&1 | tee "$OUT/run.log"
status=${PIPESTATUS[0]}
echo "gpu_check: exit status $status (0 = correctness passed and the kernel tests passed)" \
  | tee -a "$OUT/run.log"
exit "$status"
