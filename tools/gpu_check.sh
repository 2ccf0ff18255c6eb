#!/usr/bin/env bash
# Chapter 08 on a CUDA GPU, in stages that fit one 10-minute command (course_tools/gpu/check.py):
# machine and versions, the bf16 matmul rate, every kernel config precompiled in parallel,
# bf16 correctness (short and ragged, then 2k-8k), timing against SDPA (default,
# FlashAttention-2, cuDNN), every config forced, then the compiled kernel tests (pytest-xdist).
# Each stage is a child process with its own time limit; a fault in one does not stop the next.
#
#   tools/gpu_check.sh                          # writes under $OUT (default ./bench-results/gpu)
#   tools/gpu_check.sh --dry-run                # every stage on a CPU, tiny sizes (about a minute)
#   tools/gpu_check.sh --stages timing,pytest   # re-run some stages (the other rows are kept)
#   tools/gpu_check.sh --estimate               # the stages, their estimates and limits
#   PYTHON=/path/to/python tools/gpu_check.sh
#
# Uses the machine's own torch and Triton and imports the course from this working tree (no
# install step). If the machine has no pytest, put a pure-Python copy in .gpu-pydeps/
# (`pip install --target .gpu-pydeps pytest pytest-xdist`; git ignores it, so name it in the
# device tool's carry list); it goes last on PYTHONPATH, after the machine's own packages.
# Writes, each as soon as it is known:
#   $OUT/results.jsonl   one JSON object per result, every row naming its stage
#   $OUT/summary.md      the tables and the targets; rewritten after every stage
#   $OUT/logs/STAGE.log  each stage's own output;  $OUT/pytest.log  the kernel tests' tail
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
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # course_lib and course_tools, not installed
if [ -d .gpu-pydeps ]; then export PYTHONPATH="$PYTHONPATH:$PWD/.gpu-pydeps"; fi

# every stage has its own limit and the check stops starting stages at 560 s; `timeout` is the
# last resort inside a 10-minute command (the check writes its summary on SIGTERM too)
timeout -k 10 580 "$PYTHON" -m course_tools.gpu --out "$OUT" --python "$PYTHON" "$@" 2>&1 \
  | tee "$OUT/run.log"
status=${PIPESTATUS[0]}
echo "gpu_check: exit status $status (0 = every stage finished, every bound and test passed)" \
  | tee -a "$OUT/run.log"
exit "$status"
