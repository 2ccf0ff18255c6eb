"""Chapter 08's kernel on a GPU, and compiled for one without it (authors' tools; no notebook and
no `course_lib` module imports this).

* `course_tools.gpu.check`: the staged GPU check (`python -m course_tools.gpu`,
  tools/gpu_check.sh): the orchestrator, which runs each stage in a child process with its own
  time limit and makes no CUDA call itself;
* `course_tools.gpu.plan`: the sizes, the stages, their time limits and the check's estimate;
* `course_tools.gpu.stages`: the stages themselves (machine, matmul, precompile, correctness,
  timing, every config, the compiled tests), one child process each;
* `course_tools.gpu.report`: results.jsonl and summary.md;
* `course_tools.gpu.compile_audit`: every kernel config compiled for sm_90 on a CPU, with its
  shared memory, registers and spills (tests/test_flash_compile.py).
"""
