"""The flash kernels' launch configurations and the shared-memory estimate that prunes them.

Plain Python (no Triton): `course_tools.gpu` reads the tables to precompile and audit them.

In Triton's interpreter the kernels use one fixed config (autotuning needs a GPU driver). On
CUDA each kernel has a table per (bytes per element, head dim), pruned before autotuning to the
entries whose estimated shared memory fits the device. BLOCK_M must be a multiple of BLOCK_N
(forward, dQ) and BLOCK_N of BLOCK_M (dK/dV) so the causal diagonal splits into whole blocks
(the kernels static_assert it).

Entries are (BLOCK_M, BLOCK_N, num_warps, num_stages), best guess first. Chosen by compiling for
sm_90 (`python -m course_tools.gpu.compile_audit --every`): each fits 227 KB of shared memory
and keeps its tiles in registers without spilling, causal or not, and tests/test_flash_compile.py
checks that for every entry. float32 needs smaller tiles: its TF32 dot operands take twice the
registers of bf16 ones; d = 128 backward tiles need 8 warps. The 16-bit forward tables span
the Hopper space of Triton's fused-attention tutorial: BLOCK_N 32 to 128, 2 to 4 stages. The
16-bit d = 64 dK/dV leads with 64x128 at 2 stages: at 3 it spilled 16 bytes under Triton 3.6
(causal, ragged lengths), none at 2 under 3.6 or 3.9.
"""

from __future__ import annotations

import os

SM90_SHARED_BYTES = 232448  # shared memory one block may use on sm_90 (H100/H200): 227 KB
KERNEL_NAMES = ("fwd", "dkdv", "dq")

_SMALL_D = {  # d = 16 and 32
    "fwd": [(128, 64, 4, 3), (64, 64, 4, 3)],
    "dkdv": [(32, 128, 8, 3), (32, 64, 4, 3)],
    "dq": [(128, 32, 4, 3), (64, 32, 4, 3)],
}
CONFIGS = {
    "fwd": {(2, 128): [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 8, 4),
                       (128, 64, 8, 2), (128, 32, 8, 3)],
            (2, 64): [(128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 64, 4, 4),
                      (128, 64, 4, 2), (128, 32, 4, 3)],
            (4, 128): [(128, 64, 8, 2), (64, 32, 4, 2)],
            (4, 64): [(128, 64, 8, 3), (64, 64, 4, 3)]},
    "dkdv": {(2, 128): [(32, 128, 8, 3), (64, 64, 8, 2), (32, 64, 8, 3)],
             (2, 64): [(64, 128, 8, 2), (32, 128, 8, 3), (32, 64, 4, 3)],
             (4, 128): [(32, 32, 4, 2), (16, 32, 4, 2)],
             (4, 64): [(32, 64, 4, 3), (32, 128, 8, 3)]},
    "dq": {(2, 128): [(128, 64, 8, 3), (128, 32, 8, 3), (64, 32, 4, 3)],
           (2, 64): [(128, 32, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3)],
           (4, 128): [(32, 32, 4, 2), (32, 16, 4, 2)],
           (4, 64): [(128, 32, 8, 3), (64, 32, 4, 3)]},
}
for _kernel, _small in _SMALL_D.items():
    for _elem in (2, 4):
        for _d in (16, 32):
            CONFIGS[_kernel][(_elem, _d)] = _small


def shared_bytes_estimate(kernel: str, block_m: int, block_n: int, num_stages: int,
                          head_dim: int, elem_bytes: int, tma: bool = False) -> int:
    """Shared memory Triton gives one block (at least; measured on sm_90): the tiles held for
    the whole loop plus `num_stages` copies of the tiles the loop streams (software pipelining);
    the TMA forward adds 1 KB (its barriers).
    """
    tile_m, tile_n = block_m * head_dim * elem_bytes, block_n * head_dim * elem_bytes
    if kernel == "fwd":   # Q kept; K and V streamed
        return tile_m + num_stages * 2 * tile_n + (1024 if tma else 0)
    if kernel == "dkdv":  # K and V kept; Q, dO, LSE2 and Delta streamed; 1 KB for the masks
        return 2 * tile_n + num_stages * (2 * tile_m + 8 * block_m) + 1024
    if kernel == "dq":    # Q and dO kept; K and V streamed
        return 2 * tile_m + num_stages * 2 * tile_n
    raise ValueError(f"kernel must be 'fwd', 'dkdv' or 'dq', got {kernel!r}")


def configs_for(kernel: str, head_dim: int, elem_bytes: int,
                shared_limit: int = SM90_SHARED_BYTES, tma: bool = False) -> list[tuple]:
    """The table's entries for one head dim and element size whose shared memory fits
    `shared_limit`. On a GPU with less than sm_90's (none fits): the first entry that fits with
    fewer pipeline stages, else the smallest one (Triton then reports the shortfall).
    COURSE_FLASH_AUTOTUNE=0 keeps only the first (the tests: fewer compiles)."""
    table = CONFIGS[kernel][(elem_bytes, head_dim)]

    def fits(c):
        need = shared_bytes_estimate(kernel, c[0], c[1], c[3], head_dim, elem_bytes, tma)
        return need <= shared_limit

    kept = [c for c in table if fits(c)]
    if not kept:
        fewer = sorted(((*c[:3], s) for c in table for s in range(c[3] - 1, 0, -1)),
                       key=lambda c: -c[3])  # as many stages as fit, then the table's order
        kept = [c for c in fewer if fits(c)][:1] or [min(table, key=lambda c: c[0] * c[1])]
    if os.environ.get("COURSE_FLASH_AUTOTUNE", "1") == "0":
        kept = kept[:1]
    return kept


def every_config(kernel: str) -> list[tuple]:
    """Every entry of the kernel's tables once: the autotuner's list, which the pruning narrows."""
    return list(dict.fromkeys(c for table in CONFIGS[kernel].values() for c in table))
