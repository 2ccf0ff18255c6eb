"""Attention, from scratch: the tested helpers the course notebooks import.

One module per idea, in the order the chapters meet them:

    lookup      chapter 01  hard and soft dictionary lookup
    attention   chapter 02  softmax and scaled dot-product attention
    masks       chapter 04  causal and padding masks
    multihead   chapter 05  multi-head attention
    recurrent   chapter 06  a running-summary RNN
    position    chapter 07  sinusoidal positions and rotary embeddings
    models      chapters 05-10  small models (TransformerBlock, TinyTransformer with a KV cache)
    flash       chapter 08  tiled attention and a Triton FlashAttention kernel
    cost        chapter 09  where the quadratic term takes over (FLOPs of a layer), benchmarks
    linear_attention  chapter 09  linear attention: parallel and recurrent forms
    stacking    chapter 10  induction, the trophy and the suitcase, real text; shipped models

plus the shared mechanisms every chapter uses, one home each: `validate` (input checks with one
message style), `measure` (the one timer, peak memory, thread counts), `train` (the seeded
training loop), `env` (environment report, Triton detection); and `checks` (exercise checkers),
`widgets` (interactive explorers). `parallel` holds chapter 06's serial-vs-parallel measurement.
The `course` command lives apart, in `course_tools`, which this package never imports.
"""

__version__ = "0.1.0"

# Triton decides interpreted-or-compiled at its first import, which torch's profiler and FLOP
# counter trigger: choose before any course module can (interpreter when there is no CUDA GPU).
from course_lib.env import choose_triton_mode as _choose_triton_mode  # noqa: E402

_choose_triton_mode()
