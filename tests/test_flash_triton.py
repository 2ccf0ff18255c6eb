"""The Triton FlashAttention kernels against torch's scaled_dot_product_attention.

On a machine without a GPU they run through Triton's interpreter (slow), so the sizes stay at
n <= 256 with a few parametrisations chosen to cover: causal and not, ragged n (1, 17, 100, 256),
head dims 16, 64, 128, float32 / float16 / bfloat16, outputs and gradients. With a CUDA GPU the
same tests run compiled (tools/gpu_check.sh); tests/test_flash_compile.py compiles every GPU
configuration for sm_90 on a CPU.
"""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import course_lib.flash as flash

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed (it ships for Linux only)")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# compiled fp32 dots use TF32 on a GPU (10 mantissa bits, errors near 1e-3); the interpreter
# computes them in full fp32
TOL = {torch.float32: (2e-5, 1e-4) if DEVICE == "cpu" else (1e-2, 1e-2),
       torch.float16: (1e-2, 1e-2), torch.bfloat16: (6e-2, 6e-2)}


def make(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(DEVICE, dtype).requires_grad_() for _ in range(3)]


def sdpa_fp32(q, k, v, causal):
    """The truth: SDPA on the same (rounded) inputs, computed in float32."""
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    return F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal), (q32, k32, v32)


CASES = [  # (B, H, n, d), causal, dtype
    ((1, 1, 1, 16), False, torch.float32),
    ((2, 1, 17, 16), True, torch.float32),
    ((1, 2, 100, 64), False, torch.float32),
    ((1, 2, 100, 64), True, torch.float16),
    ((1, 1, 256, 64), True, torch.float32),
    ((1, 1, 256, 128), False, torch.float16),
    ((1, 1, 100, 128), True, torch.float32),
]


@pytest.mark.parametrize("shape, causal, dtype", CASES)
def test_flash_forward_and_backward_match_sdpa(shape, causal, dtype):
    q, k, v = make(shape, dtype, seed=sum(shape))
    out = flash.flash_attention(q, k, v, causal=causal)
    want, wide = sdpa_fp32(q, k, v, causal)
    atol, rtol = TOL[dtype]
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), want, atol=atol, rtol=rtol)

    dout = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    want_grads = torch.autograd.grad(want, wide, dout.float())
    for name, got, exp in zip("qkv", grads, want_grads):
        assert got.dtype == dtype, name
        torch.testing.assert_close(got.float(), exp, atol=atol * 2, rtol=rtol * 2,
                                   msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("causal", [False, True])
def test_flash_bfloat16(causal):
    q, k, v = make((1, 2, 100, 64), torch.bfloat16, seed=11)
    out = flash.flash_attention(q, k, v, causal=causal)
    want, wide = sdpa_fp32(q, k, v, causal)
    atol, rtol = TOL[torch.bfloat16]
    torch.testing.assert_close(out.float(), want, atol=atol, rtol=rtol)
    if causal:  # one bf16 backward: the gradients come out in bf16 and close to fp32's
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        for got, exp in zip(grads, torch.autograd.grad(want, wide, dout.float())):
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got.float(), exp, atol=2 * atol, rtol=2 * rtol)


def test_flash_logsumexp_and_custom_scale_match_tiled():
    q, k, v = (t.detach() for t in make((2, 70, 32), torch.float32, seed=5))
    out, lse = flash.flash_attention_forward(q, k, v, causal=True, scale=0.2)
    t_out, t_lse = flash.tiled_attention(q.cpu(), k.cpu(), v.cpu(), causal=True, scale=0.2)
    # full fp32 in the interpreter; TF32 dots on a GPU (see the kernel module's docstring)
    tol = dict(atol=1e-4, rtol=1e-4) if DEVICE == "cpu" else dict(atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(out.cpu(), t_out, **tol)
    torch.testing.assert_close(lse.cpu(), t_lse, **tol)


def test_flash_cross_attention_lengths():
    g = torch.Generator().manual_seed(8)
    q = torch.randn(1, 1, 40, 32, generator=g).to(DEVICE)
    k, v = (torch.randn(1, 1, 90, 32, generator=g).to(DEVICE) for _ in range(2))
    out = flash.flash_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **dict(zip(
        ("atol", "rtol"), TOL[torch.float32])))


@pytest.mark.parametrize("bad, match", [
    (dict(d=48), r"head dim d=48 .* not supported"),
    (dict(d=256), r"head dim d=256"),
    (dict(d=8), r"head dim d=8"),
    (dict(dtype=torch.float64), r"dtype torch.float64 is not supported"),
    (dict(dv=32), r"v has d_v=32 but q has d=64"),
    (dict(nk=7, causal=True), r"causal=True needs as many queries as keys"),
])
def test_flash_rejects_bad_inputs(bad, match):
    d, dtype = bad.get("d", 64), bad.get("dtype", torch.float32)
    q = torch.randn(1, 5, d, dtype=dtype)
    k = torch.randn(1, bad.get("nk", 5), d, dtype=dtype)
    v = torch.randn(1, bad.get("nk", 5), bad.get("dv", d), dtype=dtype)
    with pytest.raises(ValueError, match=match):
        flash.flash_attention(q, k, v, causal=bad.get("causal", False))


@pytest.mark.parametrize("n_q, n_kv, causal, scale, match", [
    (8, 16, True, 0.5, r"causal=True needs n_q == n_kv"),
    (16, 8, True, 0.5, r"causal=True needs n_q == n_kv"),
    (8, 8, False, -0.5, r"sm_scale must be positive"),
])
def test_kernel_wrapper_guards_what_the_kernels_assume(n_q, n_kv, causal, scale, match):
    """kernel.forward/backward called directly (not through flash_attention) check too: a causal
    launch with fewer keys than queries would read past the end of K and V."""
    kernel = flash.load_kernels()
    q = torch.randn(2, n_q, 16, device=DEVICE)
    k = torch.randn(2, n_kv, 16, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        kernel.forward(q, k, k, causal, scale)
    with pytest.raises(ValueError, match=match):
        kernel.backward(q, q, k, k, q, q[..., 0], causal, scale)


def test_kernel_runs_a_forced_config_like_the_autotuned_one():
    """forward/backward with an explicit config (how the GPU check tries every table entry)."""
    kernel = flash.load_kernels()
    q, k, v, do = (torch.randn(2, 40, 16, generator=torch.Generator().manual_seed(i))
                   .to(DEVICE) for i in range(4))
    out, lse2 = kernel.forward(q, k, v, True, 0.25)
    out2, lse2b = kernel.forward(q, k, v, True, 0.25, config=(32, 16, 4, 2))
    tol = dict(atol=1e-5, rtol=1e-5) if DEVICE == "cpu" else dict(atol=1e-3, rtol=1e-3)  # TF32
    torch.testing.assert_close(out2, out, **tol)
    torch.testing.assert_close(lse2b, lse2, **tol)
    grads = kernel.backward(do, q, k, v, out, lse2, True, 0.25)
    forced = kernel.backward(do, q, k, v, out, lse2, True, 0.25,
                             configs=((16, 32, 4, 2), (32, 16, 4, 2)))
    for got, want in zip(forced, grads):
        torch.testing.assert_close(got, want, **tol)


def test_config_tables_are_pruned_by_shared_memory(monkeypatch):
    """The autotuner's candidates: the table's entries that fit the device's shared memory."""
    from course_lib.flash import configs

    sm90 = configs.configs_for("fwd", 128, 2)
    assert sm90 == configs.CONFIGS["fwd"][(2, 128)] and (128, 128, 8, 3) in sm90
    # the forward spans the tutorial's Hopper space: 2, 3 and 4 stages, BLOCK_N 32 to 128
    for d in (64, 128):
        table = configs.CONFIGS["fwd"][(2, d)]
        assert {c[3] for c in table} == {2, 3, 4} and {c[1] for c in table} == {32, 64, 128}
    small = configs.configs_for("fwd", 64, 2, shared_limit=99 * 1024)  # an sm_86 GPU
    assert small == [(128, 64, 4, 3), (64, 64, 4, 3), (128, 64, 4, 4), (128, 64, 4, 2),
                     (128, 32, 4, 3)]
    # nothing in the table fits: the first entry that fits with fewer stages
    assert configs.configs_for("fwd", 128, 4, shared_limit=64 * 1024) == [(64, 32, 4, 1)]
    assert configs.configs_for("dkdv", 128, 4, shared_limit=1024) == [(16, 32, 4, 2)]  # smallest
    # the TMA forward's barriers: 1 KB more
    assert configs.shared_bytes_estimate("fwd", 128, 128, 3, 128, 2, tma=True) == \
        configs.shared_bytes_estimate("fwd", 128, 128, 3, 128, 2) + 1024
    monkeypatch.setenv("COURSE_FLASH_AUTOTUNE", "0")
    assert configs.configs_for("dq", 64, 2) == [configs.CONFIGS["dq"][(2, 64)][0]]
    for name, tables in configs.CONFIGS.items():
        for (elem, d), table in tables.items():
            for bm, bn, _, _ in table:  # the diagonal split the kernels static_assert
                assert (bn % bm if name == "dkdv" else bm % bn) == 0, (name, elem, d, bm, bn)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tma_forward_matches_the_pointer_forward(dtype):
    """The tensor-descriptor forward (tma=True) computes what the default one does, ragged and
    causal included (rows past the end load as zeros and are masked like the pointer loads)."""
    kernel = flash.load_kernels()
    for n, causal in ((100, True), (40, False)):
        q, k, v = (torch.randn(2, n, 32, generator=torch.Generator().manual_seed(i))
                   .to(DEVICE, dtype) for i in range(3))
        out, lse2 = kernel.forward(q, k, v, causal, 0.3)
        out_tma, lse2_tma = kernel.forward(q, k, v, causal, 0.3, tma=True)
        torch.testing.assert_close(out_tma, out, atol=0, rtol=0)
        torch.testing.assert_close(lse2_tma, lse2, atol=0, rtol=0)
    with pytest.raises(ValueError, match="tma=True needs 16-byte aligned rows"):
        wide = torch.randn(2, 40, 33, device=DEVICE)[..., :32]  # rows of 33 floats: 132 bytes
        kernel.forward(wide, wide, wide, False, 0.3, tma=True)


def test_kernel_wants_unit_stride_along_d_and_takes_any_other_strides():
    """The kernels index d with no stride: stride(-1) != 1 is refused with a clear message;
    other strides (a slice of a wider tensor) are used as they are, forward and backward."""
    kernel = flash.load_kernels()
    g = torch.Generator().manual_seed(3)
    wide = [torch.randn(2, 48, 40, generator=g).to(DEVICE) for _ in range(4)]
    q, k, v, do = (t[:, :40, :16] for t in wide)            # strides (1920, 40, 1)
    dense = [t.contiguous() for t in (q, k, v, do)]
    out, lse2 = kernel.forward(q, k, v, True, 0.25)
    want, want_lse2 = kernel.forward(*dense[:3], True, 0.25)
    tol = dict(atol=1e-6, rtol=1e-6) if DEVICE == "cpu" else dict(atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(out, want, **tol)
    for got, exp in zip(kernel.backward(do, q, k, v, out, lse2, True, 0.25),
                        kernel.backward(dense[3], *dense[:3], want, want_lse2, True, 0.25)):
        torch.testing.assert_close(got, exp, **tol)
    transposed = torch.randn(2, 16, 40, device=DEVICE).transpose(1, 2)  # (2, 40, 16), stride 40
    with pytest.raises(ValueError, match="k3 must have stride 1 along its last dim"):
        kernel.forward(q, transposed, v, False, 0.25)
    with pytest.raises(ValueError, match="out must have stride 1 along its last dim"):
        kernel.backward(do, q, k, v, transposed, lse2, False, 0.25)
    # dO comes from autograd, which may hand over any strides (an expanded one from out.sum()):
    # the backward makes it dense itself
    for got, exp in zip(kernel.backward(transposed, q, k, v, out, lse2, True, 0.25),
                        kernel.backward(transposed.contiguous(), q, k, v, out, lse2, True, 0.25)):
        torch.testing.assert_close(got, exp, atol=0, rtol=0)


def test_launches_run_on_the_tensors_gpu_not_the_current_one(monkeypatch):
    """Triton launches on the current CUDA device; the wrappers switch to q's for the launch."""
    kernel = flash.load_kernels()
    entered = []

    class Recording:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "device", Recording)

    class OnSecondGpu:
        is_cuda, device = True, torch.device("cuda", 1)

    with kernel.on_device(OnSecondGpu()):
        pass
    assert entered == [torch.device("cuda", 1)]
    with kernel.on_device(torch.zeros(1)):  # a CPU tensor (the interpreter): nothing to switch
        pass
    assert entered == [torch.device("cuda", 1)]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_flash_on_the_second_gpu_while_the_first_is_current():
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda:1", dtype=torch.float16) for _ in range(3))
    with torch.cuda.device(0):
        out = flash.flash_attention(q, k, v, causal=True)
    assert out.device == q.device
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=1e-2, rtol=1e-2)


def test_clear_error_without_triton(monkeypatch):
    monkeypatch.setattr(flash, "triton_available", lambda: False)
    q = torch.randn(1, 4, 16)
    with pytest.raises(flash.TritonUnavailableError, match="not installed.*tiled_attention"):
        flash.flash_attention(q, q, q)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="the interpreter notice is for CPU-only machines")
def test_interpreter_notice_is_one_line_once(monkeypatch, capsys):
    monkeypatch.setattr(flash, "_NOTICE_SHOWN", False)
    # prepare_triton sets TRITON_INTERPRET; monkeypatch puts the variable back as it was after
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert flash.prepare_triton() is True
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert flash.prepare_triton() is True
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "interpreter" in lines[0]


def test_importing_course_lib_flash_does_not_import_triton():
    code = ("import sys, course_lib.flash as f; f.tiled_attention; "
            "assert 'triton' not in sys.modules, 'triton imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
