"""Chapter 08's kernel on a real GPU, in one call that fits a short machine loan.

    python -m course_lib.flash.gpu_check --out DIR            # a CUDA machine (tools/gpu_check.sh)
    python -m course_lib.flash.gpu_check --dry-run --out DIR  # the same flow on a CPU, tiny sizes

In order, most useful first, each result appended to DIR/results.jsonl the moment it exists:
the machine (device, driver, torch / CUDA / cuDNN / Triton versions) and which backend SDPA picks
for each shape; the bf16 matmul rate; bf16 correctness of `flash_attention` with autotuning on
(its max error against an fp32 reference must be at most twice that of SDPA in bf16, for the
output and the three gradients); forward and backward times, largest n first, for the kernel,
SDPA's default choice, and SDPA pinned to FlashAttention-2 and to cuDNN; then the correctness
check for every config table entry forced in turn, at one even and one ragged length. The first
call of the kernel at each shape (compiling and autotuning) is timed apart from the steady ones.
No new step starts after `--budget` seconds; DIR/summary.md is written whatever happens (also on
SIGTERM), then the compiled kernel tests run last under their own timeout and the summary gains
their result.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

try:  # the course's one timer (it moved out of course_lib.flash.measure)
    from course_lib.measure import best_time
except ImportError:  # pragma: no cover - an older checkout
    from course_lib.flash.measure import best_time

from course_lib.flash.gpu_report import PROVIDERS, Recorder, summary

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Plan:
    device: str
    batch: int
    heads: int
    dims: tuple
    correct_ns: tuple            # correctness sizes (autotuned)
    config_ns: tuple             # sizes at which every table entry is checked (even, ragged)
    time_ns: tuple               # timing sizes, largest first
    matmul_n: int
    ref_heads: int               # heads per chunk of the fp32 reference (bounds its memory)
    pytest_args: list = field(default_factory=list)
    batch_seconds: float = 0.05  # a timing batch lasts about this long; 0: one call, once

    @classmethod
    def gpu(cls):
        return cls("cuda", batch=2, heads=16, dims=(128, 64), correct_ns=(8192, 4096, 2048),
                   config_ns=(1024, 1000),
                   time_ns=(16384, 8192, 4096, 2048), matmul_n=8192, ref_heads=4,
                   pytest_args=["tests/test_flash_triton.py", "tests/test_flash_tiled.py"])

    @classmethod
    def dry(cls):  # the interpreter on a CPU: tiny, but every step and every provider
        return cls("cpu", batch=1, heads=2, dims=(16,), correct_ns=(64,), config_ns=(40,),
                   time_ns=(64,),
                   matmul_n=256, ref_heads=1, batch_seconds=0.0,
                   pytest_args=["tests/test_flash_triton.py::test_clear_error_without_triton"])


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def seconds_per_call(fn, device: str, target: float = 0.05) -> float:
    """Best time of one call, from `best_time` over batches of calls lasting about `target` s
    (a GPU call is asynchronous: each batch ends with a synchronize). target=0: one call."""
    def once():
        fn()
        _sync(device)

    first = best_time(once, repeats=1, warmup=0 if target == 0 else 1)
    if target == 0:
        return first
    calls = max(1, min(100, int(target / max(first, 1e-6))))

    def batch():
        for _ in range(calls):
            fn()
        _sync(device)

    return best_time(batch, repeats=3, warmup=0) / calls


def attention_flops(batch: int, heads: int, n: int, d: int, causal: bool, mode: str) -> float:
    """4·B·H·n²·d forward, half when causal, ×2.5 for the backward (as bench.py counts)."""
    from course_lib.flash.bench import attention_flops as flops

    return flops(batch, heads, n, d, causal, mode)


# ------------------------------------------------------------------------------------------------
# the steps
# ------------------------------------------------------------------------------------------------

def machine(rec: Recorder, plan: Plan) -> None:
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if plan.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, capability=f"{props.major}.{props.minor}",
                    sms=props.multi_processor_count,
                    memory_gib=round(props.total_memory / 2**30, 1),
                    shared_per_block=getattr(props, "shared_memory_per_block_optin", None))
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    else:
        info.update(device=f"cpu ({platform.machine()}, {os.cpu_count()} cores), dry run")
    rec.add("machine", **info)


def sdpa_choice(rec: Recorder, plan: Plan) -> None:
    """Which backend SDPA's dispatcher picks for bf16 inputs of each timed shape."""
    from torch.nn.attention import SDPBackend

    for d in plan.dims:
        for causal in (False, True):
            q = torch.empty(plan.batch, plan.heads, plan.time_ns[-1], d, device=plan.device,
                            dtype=torch.bfloat16)
            choice = torch._fused_sdp_choice(q, q, q, is_causal=causal)
            rec.add("sdpa_choice", d=d, causal=causal, backend=SDPBackend(choice).name)


def matmul_rate(rec: Recorder, plan: Plan) -> None:
    n = plan.matmul_n
    a = torch.randn(n, n, device=plan.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=plan.device, dtype=torch.bfloat16)
    t = seconds_per_call(lambda: a @ b, plan.device, plan.batch_seconds)
    rec.add("matmul", n=n, dtype="bf16", ms=t * 1e3, tflops=2 * n**3 / t / 1e12)


def _provider(name: str):
    """fn(q, k, v, causal) for one provider, and a context its calls run in."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from course_lib.flash import flash_attention

    if name == "flash":
        return lambda q, k, v, c: flash_attention(q, k, v, causal=c), contextlib.nullcontext
    sdpa = lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c)  # noqa: E731
    if name == "sdpa":
        return sdpa, contextlib.nullcontext
    backend = getattr(SDPBackend, name.split()[1])
    return sdpa, lambda: sdpa_kernel(backend)


def _inputs(plan: Plan, n: int, d: int, seed: int):
    g = torch.Generator(device=plan.device).manual_seed(seed)
    shape = (plan.batch, plan.heads, n, d)
    q, k, v, do = (torch.randn(shape, generator=g, device=plan.device, dtype=torch.bfloat16)
                   for _ in range(4))
    return q, k, v, do


def _reference(q, k, v, do, causal, chunk):
    """fp32 output and gradients, a few heads at a time (the math is exact-ish fp32: no TF32)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    outs, grads = [], [[], [], []]
    for h in range(0, q.shape[1], chunk):
        part = [t[:, h:h + chunk].float().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(*part, is_causal=causal)
        for g, got in zip(grads, torch.autograd.grad(out, part, do[:, h:h + chunk].float())):
            g.append(got)
        outs.append(out.detach())
        del out, part
    return torch.cat(outs, 1), [torch.cat(g, 1) for g in grads]


def _forward_backward(fn, ctx, q, k, v, do, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with ctx():
        out = fn(q, k, v, causal)
        grads = torch.autograd.grad(out, (q, k, v), do)
    return out.detach(), grads


def correctness(rec: Recorder, plan: Plan, d: int, causal: bool, n: int) -> None:
    q, k, v, do = _inputs(plan, n, d, seed=n + d + causal)
    ref_out, ref_grads = _reference(q, k, v, do, causal, plan.ref_heads)
    errors = {}
    for name in ("sdpa", "flash"):
        fn, ctx = _provider(name)
        start = time.perf_counter()
        out, grads = _forward_backward(fn, ctx, q, k, v, do, causal)
        _sync(plan.device)
        took = time.perf_counter() - start
        errors[name] = {key: (got.float() - want).abs().max().item() for key, got, want in
                        zip(("out", "dq", "dk", "dv"), (out, *grads), (ref_out, *ref_grads))}
        errors[name]["seconds"] = took
        del out, grads
    verdict = {key: errors["flash"][key] <= 2 * errors["sdpa"][key] + 1e-5
               for key in ("out", "dq", "dk", "dv")}
    rec.add("correctness", d=d, causal=causal, n=n, batch=plan.batch, heads=plan.heads,
            flash_err=errors["flash"], sdpa_err=errors["sdpa"], within_2x=verdict,
            passed=all(verdict.values()), flash_first_call_s=errors["flash"]["seconds"])


def every_config(rec: Recorder, plan: Plan, d: int, causal: bool, n: int) -> None:
    """Each table entry of each kernel forced in turn (the autotuner times them all but checks
    none): its bf16 error against the fp32 reference must also stay within 2x SDPA's."""
    from course_lib.flash import load_kernels

    kernel = load_kernels()
    q, k, v, do = _inputs(plan, n, d, seed=n + 2 * d + causal)
    ref_out, (ref_dq, ref_dk, ref_dv) = _reference(q, k, v, do, causal, plan.ref_heads)
    fn, ctx = _provider("sdpa")
    out, grads = _forward_backward(fn, ctx, q, k, v, do, causal)
    base = {key: (got.float() - want).abs().max().item() for key, got, want in
            zip(("out", "dq", "dk", "dv"), (out, *grads), (ref_out, ref_dq, ref_dk, ref_dv))}
    q3, k3, v3, do3 = (t.reshape(-1, n, d).contiguous() for t in (q, k, v, do))
    scale = d ** -0.5

    def err(got, want):
        return (got.reshape(want.shape).float() - want).abs().max().item()

    out3, lse2 = kernel.forward(q3, k3, v3, causal, scale)
    checks = []
    for config in kernel.configs_for("fwd", d, 2):
        got, _ = kernel.forward(q3, k3, v3, causal, scale, config=config)
        checks.append(("fwd", config, {"out": err(got, ref_out)}))
    for config in kernel.configs_for("dkdv", d, 2):
        _, dk, dv = kernel.backward(do3, q3, k3, v3, out3, lse2, causal, scale, (config, None))
        checks.append(("dkdv", config, {"dk": err(dk, ref_dk), "dv": err(dv, ref_dv)}))
    for config in kernel.configs_for("dq", d, 2):
        dq, _, _ = kernel.backward(do3, q3, k3, v3, out3, lse2, causal, scale, (None, config))
        checks.append(("dq", config, {"dq": err(dq, ref_dq)}))
    for name, config, errors in checks:
        passed = all(e <= 2 * base[key] + 1e-5 for key, e in errors.items())
        rec.add("config_check", kernel=name, config=list(config), d=d, causal=causal, n=n,
                flash_err=errors, sdpa_err={key: base[key] for key in errors}, passed=passed)


def timing(rec: Recorder, plan: Plan, d: int, causal: bool, n: int, provider: str) -> None:
    q, k, v, do = _inputs(plan, n, d, seed=0)
    fn, ctx = _provider(provider)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with ctx():
        start = time.perf_counter()  # the first calls: compiling and autotuning for the kernel
        out = fn(q, k, v, causal)
        _sync(plan.device)
        first_fwd = time.perf_counter() - start
        start = time.perf_counter()
        out.backward(do, retain_graph=True)
        _sync(plan.device)
        first_bwd = time.perf_counter() - start
        fwd = seconds_per_call(lambda: fn(q, k, v, causal), plan.device, plan.batch_seconds)

        def backward():
            q.grad = k.grad = v.grad = None
            out.backward(do, retain_graph=True)

        bwd = seconds_per_call(backward, plan.device, plan.batch_seconds)
    for mode, t, first in (("fwd", fwd, first_fwd), ("bwd", bwd, first_bwd)):
        flops = attention_flops(plan.batch, plan.heads, n, d, causal, mode)
        rec.add("time", provider=provider, d=d, causal=causal, n=n, mode=mode, ms=t * 1e3,
                tflops=flops / t / 1e12, first_call_s=first, batch=plan.batch, heads=plan.heads)


def chosen_configs(rec: Recorder, plan: Plan) -> None:
    """The autotuner's picks (key -> config), to improve the tables with."""
    from course_lib.flash import load_kernels

    kernel = load_kernels()
    for name, tuner in (("fwd", kernel._fwd), ("dkdv", kernel._bwd_dkdv), ("dq", kernel._bwd_dq)):
        for key, config in getattr(tuner, "cache", {}).items():
            rec.add("autotune", kernel=name, key=list(map(str, key)), config=str(config))


def run_pytest(plan: Plan, timeout: float) -> dict:
    env = dict(os.environ, COURSE_FLASH_AUTOTUNE="0")  # one config per kernel: fewer compiles
    if plan.device == "cuda":
        env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plan.pytest_args]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=ROOT)
        tail, rc = (done.stdout + done.stderr)[-4000:], done.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        tail, rc = out[-4000:] + f"\n(timed out after {timeout:.0f} s)", None
    last = tail.strip().splitlines()[-1] if tail.strip() else ""
    return {"cmd": " ".join(cmd[2:]), "returncode": rc, "last_line": last, "tail": tail,
            "seconds": time.perf_counter() - start}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results/gpu"))
    parser.add_argument("--budget", type=float, default=300.0,
                        help="seconds after which no new step starts (default 300)")
    parser.add_argument("--pytest-timeout", type=float, default=150.0)
    parser.add_argument("--dry-run", action="store_true", help="the whole flow on a CPU, tiny")
    args = parser.parse_args(argv)
    plan = Plan.dry() if args.dry_run else Plan.gpu()
    if plan.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA GPU visible to torch (use --dry-run on a CPU)")
    if plan.device == "cpu":
        from course_lib.flash import prepare_triton
        prepare_triton(quiet=True, interpret=True)  # CPU tensors: the interpreter, GPU or not

    def stop(signum, _frame):  # `timeout` sends SIGTERM: leave through the finally below
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    out = Path(args.out)
    rec = Recorder(out)
    start = time.perf_counter()
    notes = [f"budget {args.budget:.0f} s for the measurements"]

    def step(what: str, fn, *a) -> bool:
        """Run one step unless the budget is spent; an error is recorded, not raised."""
        if time.perf_counter() - start > args.budget:
            notes.append(f"not started (budget spent): {what}")
            return False
        try:
            fn(rec, plan, *a)
        except Exception as e:  # noqa: BLE001 - record the failure and go on
            rec.add("error", what=what, error=f"{type(e).__name__}: {str(e)[:500]}")
            if plan.device == "cuda":
                torch.cuda.empty_cache()
        return True

    try:
        step("machine", machine)
        step("sdpa choice", sdpa_choice)
        step("matmul", matmul_rate)
        for d in plan.dims:
            for causal in (False, True):
                for n in plan.correct_ns:
                    step(f"correctness d={d} causal={causal} n={n}", correctness, d, causal, n)
        for n in plan.time_ns:
            for d in plan.dims:
                for causal in (False, True):
                    for provider in PROVIDERS:
                        step(f"time {provider} d={d} causal={causal} n={n}", timing, d, causal,
                             n, provider)
        for d in plan.dims:  # last: the ragged length compiles every config once more
            for causal in (False, True):
                for n in plan.config_ns:
                    step(f"every config d={d} causal={causal} n={n}", every_config, d, causal, n)
    finally:
        with contextlib.suppress(Exception):  # whatever was tuned before a stop, too
            chosen_configs(rec, plan)
        notes.append(f"measurements took {time.perf_counter() - start:.0f} s")
        (out / "summary.md").write_text(summary(rec.rows, plan, notes))
    result = run_pytest(plan, args.pytest_timeout)
    rec.add("pytest", **{k: v for k, v in result.items() if k != "tail"})
    (out / "pytest.log").write_text(result["tail"])
    notes.append(f"kernel tests (`{result['cmd']}`, COURSE_FLASH_AUTOTUNE=0): "
                 f"{result['last_line']} (exit {result['returncode']}, {result['seconds']:.0f} s)")
    (out / "summary.md").write_text(summary(rec.rows, plan, notes))
    rec.file.close()
    print(f"gpu_check: wrote {out / 'summary.md'}", flush=True)
    failed = [r for r in rec.rows
              if r["step"] in ("correctness", "config_check") and not r["passed"]]
    if args.dry_run:  # the flow is what a dry run checks; a CPU's numbers decide nothing
        return 0 if result["returncode"] == 0 else 1
    return 0 if result["returncode"] == 0 and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
