"""What the GPU check runs: the sizes (a GPU plan and a tiny dry-run one), the stages in order
with their time limits, and the check's own estimate of how long each takes on an H200 machine.

Plain Python, no CUDA: the orchestrator (`course_tools.gpu.check`) reads it without touching
the GPU, and each stage's child process (`course_tools.gpu.stages`) rebuilds the same plan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from course_lib.flash.configs import configs_for

PROVIDERS = ("flash", "flash tma", "sdpa", "sdpa FLASH_ATTENTION", "sdpa CUDNN_ATTENTION")
FORWARD_ONLY = ("flash tma",)   # the TMA forward is timed against the cp.async one; one backward


@dataclass(frozen=True)
class Plan:
    device: str
    batch: int
    heads: int
    dims: tuple
    small_ns: tuple          # correctness first: one even length, one ragged (one tuning key)
    large_ns: tuple          # correctness at 2k-8k
    time_ns: tuple           # timing sizes, largest first
    config_ns: tuple         # every table entry forced: (even, ragged); also what precompile uses
    matmul_n: int
    ref_heads: int           # heads per chunk of the fp32 reference (bounds its memory)
    workers: int             # precompile processes, pytest-xdist workers
    pytest_args: tuple = ()
    bench_ms: tuple = (25, 100)  # do_bench's warmup and repetition time
    tma_dims: tuple = field(default=(64, 128))

    @classmethod
    def gpu(cls, cores: int | None = None) -> Plan:
        """The H200 plan; `cores` (default: this machine's) sets the parallel workers."""
        return cls("cuda", batch=2, heads=16, dims=(128, 64), small_ns=(1024, 1000),
                   large_ns=(2048, 4096, 8192), time_ns=(16384, 8192, 4096),
                   config_ns=(1024, 1000), matmul_n=8192, ref_heads=4,
                   workers=min(16, cores or os.cpu_count() or 1),
                   pytest_args=("tests/test_flash_triton.py", "tests/test_flash_tiled.py"))

    @classmethod
    def dry(cls) -> Plan:  # the interpreter on a CPU: tiny, but every stage and every provider
        return cls("cpu", batch=1, heads=2, dims=(16,), small_ns=(64, 40), large_ns=(96,),
                   time_ns=(64,), config_ns=(64, 40), matmul_n=128, ref_heads=1, workers=2,
                   pytest_args=("tests/test_flash_triton.py::test_clear_error_without_triton",),
                   bench_ms=(0, 0), tma_dims=(16,))

    def configs(self, kernel: str, d: int, tma: bool = False) -> list[tuple]:
        """The bf16 table entries the autotuner may try for this head dim (what every-config and
        precompile force one by one)."""
        return configs_for(kernel, d, 2, tma=tma)

    def variants(self) -> list[tuple]:
        """(kernel, d, causal, n, config, tma) for every launch the check's kernels make: each
        config at an even and a ragged length, causal and not (Triton compiles each apart)."""
        out = []
        for d in self.dims:
            for causal in (False, True):
                for n in self.config_ns:
                    for kernel in ("fwd", "dkdv", "dq"):
                        out += [(kernel, d, causal, n, c, False) for c in self.configs(kernel, d)]
                    if d in self.tma_dims:
                        out += [("fwd", d, causal, n, c, True)
                                for c in self.configs("fwd", d, tma=True)]
        return out


# ------------------------------------------------------------------------------------------------
# the stages, and the check's estimate of each on an H200 machine (16 cores), from these costs:
# ------------------------------------------------------------------------------------------------

START_S = 8.0        # a child process: python, torch, Triton, the CUDA context
COMPILE_S = 3.0      # one Triton compile for sm_90 on one core (2-4 s measured on a slow CPU)
MEASURE_S = 0.3      # one do_bench (25 ms warm-up, 100 ms of repetitions, set-up)
TUNE_S = 0.2         # one config benchmarked by the autotuner at a new key
CHECK_S = 1.0        # one correctness case: fp32 reference, SDPA and the kernel, forward+backward

STAGES = ("machine", "matmul", "precompile", "correct-small", "correct-large", "timing",
          "every-config", "pytest")

WHAT = {
    "machine": "device, driver, torch / CUDA / cuDNN / Triton versions, SDPA's backend choice",
    "matmul": "the bf16 rate of one matmul, for scale",
    "precompile": "every config of every kernel, compiled in parallel into Triton's cache",
    "correct-small": "bf16 correctness, autotuned, at a short and a ragged length",
    "correct-large": "bf16 correctness, autotuned, at n = 2k-8k",
    "timing": "forward and backward TFLOP/s: the kernel (cp.async and TMA forward) against SDPA "
              "(default, FLASH_ATTENTION, CUDNN_ATTENTION)",
    "every-config": "each table entry forced in turn, held to the correctness bound",
    "pytest": "the kernel tests compiled on the GPU (pytest-xdist, one config per kernel)",
}


def _tune_keys(plan: Plan, ns) -> int:
    """Autotuner keys met: lengths rounded up to powers of two, per head dim and causal."""
    return len({1 << (n - 1).bit_length() for n in ns}) * len(plan.dims) * 2


def _configs_per_key(plan: Plan) -> int:
    d = plan.dims[0]
    return (len(plan.configs("fwd", d)) + len(plan.configs("fwd", d, tma=True))
            + len(plan.configs("dkdv", d)) + len(plan.configs("dq", d)))


def estimate(plan: Plan, stage: str) -> float:
    """Seconds the stage should take on the GPU machine (a model, printed before the run and
    compared with the measured time in the summary). Autotuning results are cached on disk
    across stages (TRITON_CACHE_AUTOTUNING=1), so each key is tuned once."""
    cases = len(plan.dims) * 2
    if stage == "machine":
        return START_S + 4
    if stage == "matmul":
        return START_S + 2 * MEASURE_S
    if stage == "precompile":   # + the backward's preprocess kernel, once per head dim
        compiles = len(plan.variants()) + len(plan.dims)
        return START_S + START_S + compiles * COMPILE_S / plan.workers
    if stage == "correct-small":
        tune = _tune_keys(plan, plan.small_ns) * _configs_per_key(plan) * TUNE_S
        return START_S + cases * len(plan.small_ns) * CHECK_S + tune
    if stage == "correct-large":
        tune = _tune_keys(plan, plan.large_ns) * _configs_per_key(plan) * TUNE_S
        return START_S + cases * len(plan.large_ns) * 3 * CHECK_S + tune
    if stage == "timing":
        new = {n for n in plan.time_ns if n not in plan.large_ns}
        tune = _tune_keys(plan, new) * _configs_per_key(plan) * TUNE_S if new else 0.0
        runs = cases * len(plan.time_ns) * (2 * len(PROVIDERS) - len(FORWARD_ONLY))
        return START_S + runs * MEASURE_S + tune
    if stage == "every-config":
        return START_S + len(plan.variants()) * 0.05 + cases * len(plan.config_ns) * CHECK_S
    if stage == "pytest":       # ~50 compiles over the workers, each worker starting torch
        return START_S + START_S + 50 * COMPILE_S / plan.workers + 10
    raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")


# about twice each estimate, 560 s in all: the whole check fits a 10-minute command
LIMITS = {"machine": 40, "matmul": 30, "precompile": 90, "correct-small": 50,
          "correct-large": 110, "timing": 110, "every-config": 50, "pytest": 80}
# The dry run's stages take 4-30 s on two idle cores (the kernel tests the longest); the limit
# only stops a hang, and leaves room for a test suite running beside it on a slow machine.
DRY_LIMITS = {name: 180 for name in STAGES}
