"""Chapter 08: attention without the n x n grid.

    tiled_attention(q, k, v, causal=False, scale=None, block_size=64) -> (out, logsumexp)
        plain torch, block by block with an online softmax (tiled.py)
    flash_attention(q, k, v, causal=False, scale=None) -> out
        the Triton FlashAttention-2 kernels, forward and backward (kernel.py)
    naive_attention(q, k, v, causal=False, scale=None) -> out
        the textbook version that builds the whole score grid, for comparison

The kernel's launch configurations (autotune tables, shared-memory estimate) are in configs.py;
exercise_kernel.py is the exercise's kernel, bench.py the chapter's benchmark. The GPU check and
the sm_90 compile audit are authors' tools, in course_tools.gpu.

Triton is imported lazily, on the first call of `flash_attention`. Without a CUDA GPU, importing
this package sets TRITON_INTERPRET=1 (Triton reads it at its own first import, which other
libraries may trigger early), so the same kernels run through Triton's interpreter on the CPU;
the first kernel call says so in one line. Triton ships for Linux only; elsewhere
`flash_attention` raises a clear error and everything else here still works.
"""

from __future__ import annotations

import importlib
import os

import torch

from course_lib.env import choose_triton_mode, triton_available
from course_lib.flash.tiled import naive_attention, tiled_attention
from course_lib.validate import check_attention

__all__ = ["tiled_attention", "flash_attention", "flash_attention_forward", "naive_attention",
           "triton_available", "prepare_triton", "interpreter_ready", "load_kernels",
           "KERNEL_HEAD_DIMS", "TritonUnavailableError"]

KERNEL_HEAD_DIMS = (16, 32, 64, 128)
_NOTICE_SHOWN = False

# Without a CUDA GPU, Triton's interpreter (set when course_lib is imported; see
# course_lib.env.choose_triton_mode, called again here for readers who start from this file).
choose_triton_mode()


class TritonUnavailableError(RuntimeError):
    """Triton is not installed here (it ships wheels for Linux only)."""


def prepare_triton(quiet: bool = False, interpret: bool | None = None) -> bool:
    """Set TRITON_INTERPRET=1 when there is no CUDA GPU (or when `interpret=True`), before Triton
    defines any kernel: Triton reads it when a kernel is decorated.

    Prints a one-line notice the first time it switches to the interpreter. Returns whether
    the interpreter is in use.
    """
    global _NOTICE_SHOWN
    if interpret or not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if interpreting and not _NOTICE_SHOWN and not quiet:
        reason = "no CUDA GPU" if not torch.cuda.is_available() else "asked for"
        print(f"course_lib.flash: {reason}, running the Triton kernels through Triton's "
              "interpreter (TRITON_INTERPRET=1; slow, for small sizes).")
    _NOTICE_SHOWN = _NOTICE_SHOWN or (interpreting and not quiet)
    return interpreting


def interpreter_ready() -> bool:
    """Whether Triton was imported in interpreter mode: its own library functions (tl.sum,
    tl.max, ...) are then interpreted too. Triton decides that once, at its first import."""
    import triton.language as tl

    return type(tl.sum).__name__ == "InterpretedFunction"


def load_kernels():
    """Import the Triton kernel module (compiled on CUDA, interpreted on a CPU)."""
    if not triton_available():
        raise TritonUnavailableError(
            "flash_attention needs Triton, which is not installed here (Triton ships for Linux "
            "only). Use course_lib.flash.tiled_attention, the same algorithm in plain torch.")
    interpreting = prepare_triton()
    if interpreting and not interpreter_ready():
        raise RuntimeError(
            "Triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot run "
            "through the interpreter in this process: restart, and import course_lib.flash "
            "before anything imports triton.")
    return importlib.import_module("course_lib.flash.kernel")


def _check_kernel_inputs(q, k, v, causal, scale):
    """The course's attention checks, then what the kernel adds; returns q, k, v with their
    leading (batch, head) dims broadcast to one shape."""
    *lead, _, _ = check_attention(q, k, v, scale=scale, causal=causal)
    d = q.shape[-1]
    if d not in KERNEL_HEAD_DIMS:
        raise ValueError(f"q has head dim d={d} (q {tuple(q.shape)}), not supported by the "
                         f"flash_attention kernel, which wants d in {KERNEL_HEAD_DIMS} (a power of "
                         "2 from 16 to 128): pad the head dim with zeros, or use tiled_attention")
    if v.shape[-1] != d:
        raise ValueError(f"v has d_v={v.shape[-1]} but q has d={d} (v {tuple(v.shape)}, "
                         f"q {tuple(q.shape)}): the flash_attention kernel wants them equal")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"q's dtype {q.dtype} is not supported by the flash_attention kernel: "
                         "use float32, float16 or bfloat16")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q is on {q.device}, not supported by the flash_attention kernel: use "
                         "cuda (compiled) or cpu (interpreter)")
    return tuple(t.expand(*lead, *t.shape[-2:]) for t in (q, k, v))


def _check_device(q, kernel) -> None:
    if q.device.type == "cuda" and kernel.INTERPRET:
        raise ValueError("flash_attention: TRITON_INTERPRET=1 was set, so the kernels run in the "
                         "interpreter, which needs CPU tensors; got cuda tensors")
    if q.device.type == "cpu" and not kernel.INTERPRET:
        raise ValueError("flash_attention: the kernels are compiled for CUDA here; got CPU tensors "
                         "(move q, k, v to 'cuda', or use tiled_attention on the CPU)")


def flash_attention(q, k, v, causal: bool = False, scale=None) -> torch.Tensor:
    """softmax(q kᵀ · scale + M) v by the Triton FlashAttention-2 kernels, with autograd.

    q, k, v: (..., n, d) (e.g. (B, H, n, d)), d in {16, 32, 64, 128}, float32/float16/bfloat16.
    Any n (the ragged last block is masked). causal=True masks future keys (needs n_q == n_k).
    Compiled on CUDA; on a CPU through Triton's interpreter (slow: keep n small).
    """
    q, k, v = _check_kernel_inputs(q, k, v, causal, scale)
    kernel = load_kernels()
    _check_device(q, kernel)
    sm_scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return kernel.FlashAttention.apply(q, k, v, bool(causal), sm_scale)


def flash_attention_forward(q, k, v, causal: bool = False, scale=None):
    """The forward kernel alone, no autograd: returns (out, logsumexp) like tiled_attention."""
    q, k, v = _check_kernel_inputs(q, k, v, causal, scale)
    kernel = load_kernels()
    _check_device(q, kernel)
    sm_scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    lead, n_q, n_kv, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    with torch.no_grad():
        out, lse2 = kernel.forward(q.reshape(-1, n_q, d).contiguous(),
                                   k.reshape(-1, n_kv, d).contiguous(),
                                   v.reshape(-1, n_kv, d).contiguous(), bool(causal), sm_scale)
    return out.reshape(*lead, n_q, d), kernel.logsumexp_from_lse2(lse2).reshape(*lead, n_q)
