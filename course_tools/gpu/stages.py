"""The GPU check's stages, one per child process: `python -m course_tools.gpu.stages NAME --out
DIR [--dry-run]` (the orchestrator, `course_tools.gpu.check`, starts them with time limits).

Each stage appends its rows to DIR/results.jsonl as it goes. A Python error in one item is
recorded and the stage goes on; a CUDA error that leaves the context unusable (an illegal
address, a launch failure: every later CUDA call fails) is recorded and ends the stage with
exit status 3, and the next stage starts in a fresh process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from course_tools.gpu.plan import FORWARD_ONLY, PROVIDERS, STAGES, Plan
from course_tools.gpu.report import Recorder, verdict

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("out", "dq", "dk", "dv")


class ContextLost(RuntimeError):
    """The CUDA context is unusable after a fault."""


def _sync(plan: Plan) -> None:
    if plan.device == "cuda":
        torch.cuda.synchronize()


def _context_alive() -> bool:
    try:
        torch.cuda.synchronize()
        (torch.ones(1, device="cuda") + 1).item()
        return True
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return False


def item(rec: Recorder, plan: Plan, what: str, fn, *args) -> None:
    """Run one item; record an error and go on, unless the CUDA context is lost."""
    try:
        fn(rec, plan, *args)
    except Exception as e:  # noqa: BLE001 - record the failure and go on
        rec.add("error", what=what, error=f"{type(e).__name__}: {str(e)[:500]}")
        if plan.device == "cuda":
            if not _context_alive():
                raise ContextLost(f"{what}: {type(e).__name__}") from e
            torch.cuda.empty_cache()


def seconds_per_call(fn, plan: Plan, grad_to_none=None) -> tuple[float, str]:
    """Median seconds of one call: triton.testing.do_bench (CUDA events, L2 flushed between
    calls) on a GPU; the median of 3 wall-clock calls in the dry run (no driver there)."""
    if plan.device == "cuda":
        from triton.testing import do_bench

        warmup, rep = plan.bench_ms
        ms = do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median")
        return ms / 1e3, "triton.testing.do_bench median, CUDA events"
    from course_lib.measure import time_call

    return time_call(fn, repeats=3, warmup=0).median, "wall-clock median of 3 (dry run, CPU)"


# ------------------------------------------------------------------------------------------------
# inputs, references, providers
# ------------------------------------------------------------------------------------------------

def _inputs(plan: Plan, n: int, d: int, seed: int, bh=None):
    g = torch.Generator(device=plan.device).manual_seed(seed)
    shape = (plan.batch, plan.heads, n, d) if bh is None else (bh, n, d)
    return [torch.randn(shape, generator=g, device=plan.device, dtype=torch.bfloat16)
            for _ in range(4)]


def _reference(q, k, v, do, causal, chunk):
    """fp32 output and gradients, a few heads at a time (SDPA's math backend: no TF32)."""
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
    return [torch.cat(outs, 1)] + [torch.cat(g, 1) for g in grads]


def _truncated(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 by dropping the low 16 bits (what Triton's interpreter does), back to fp32."""
    return (x.float().contiguous().view(torch.int32) & -65536).view(torch.float32)


def _truncation(plan: Plan, refs) -> dict | None:
    """Per output, the error truncating the fp32 reference to bf16 makes (interpreter only)."""
    if plan.device == "cuda":
        return None
    return {key: (ref - _truncated(ref)).abs().max().item() for key, ref in zip(KEYS, refs)}


def _provider(name: str):
    """fn(q, k, v, causal) for one provider, and a context its calls run in."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from course_lib.flash import flash_attention

    if name == "flash":
        return lambda q, k, v, c: flash_attention(q, k, v, causal=c), contextlib.nullcontext
    if name == "flash tma":
        return _tma_forward, contextlib.nullcontext
    sdpa = lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c)  # noqa: E731
    if name == "sdpa":
        return sdpa, contextlib.nullcontext
    backend = getattr(SDPBackend, name.split()[1])
    return sdpa, lambda: sdpa_kernel(backend)


def _tma_forward(q, k, v, causal):
    """The TMA-descriptor forward (no autograd), autotuned like the default one."""
    from course_lib.flash import load_kernels

    kernel = load_kernels()
    n, d = q.shape[-2], q.shape[-1]
    out, _ = kernel.forward(*(t.reshape(-1, t.shape[-2], d).contiguous() for t in (q, k, v)),
                            causal, d ** -0.5, tma=True)
    return out.reshape(*q.shape[:-2], n, d)


def _errors(got, refs, keys=KEYS) -> dict:
    return {key: (g.reshape(r.shape).float() - r).abs().max().item()
            for key, g, r in zip(keys, got, refs)}


def _forward_backward(name, q, k, v, do, causal):
    fn, ctx = _provider(name)
    q, k, v = (t.detach().requires_grad_(name not in FORWARD_ONLY) for t in (q, k, v))
    with ctx():
        out = fn(q, k, v, causal)
        if name in FORWARD_ONLY:
            return [out.detach()]
        return [out.detach(), *torch.autograd.grad(out, (q, k, v), do)]


# ------------------------------------------------------------------------------------------------
# the stages
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
                    sms=props.multi_processor_count, gpus=torch.cuda.device_count(),
                    memory_gib=round(props.total_memory / 2**30, 1),
                    shared_per_block=getattr(props, "shared_memory_per_block_optin", None))
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    else:
        info["device"] = f"cpu ({platform.machine()}), dry run through Triton's interpreter"
    info["cores"] = os.cpu_count()
    rec.add("machine", **info)
    rec.add("plan", batch=plan.batch, heads=plan.heads, dims=plan.dims, workers=plan.workers)
    from torch.nn.attention import SDPBackend

    for d in plan.dims:
        for causal in (False, True):
            q = torch.empty(plan.batch, plan.heads, plan.time_ns[-1], d, device=plan.device,
                            dtype=torch.bfloat16)
            choice = torch._fused_sdp_choice(q, q, q, is_causal=causal)
            rec.add("sdpa_choice", d=d, causal=causal, backend=SDPBackend(choice).name)


def matmul(rec: Recorder, plan: Plan) -> None:
    n = plan.matmul_n
    a, b = (torch.randn(n, n, device=plan.device, dtype=torch.bfloat16) for _ in range(2))
    t, timer = seconds_per_call(lambda: a @ b, plan)
    rec.add("matmul", n=n, dtype="bf16", ms=t * 1e3, tflops=2 * n**3 / t / 1e12, timer=timer)


def compile_variants(todo: list, device: str) -> list[dict]:
    """Launch each (kernel, d, causal, n, config, tma) once at one (batch, head): Triton compiles
    it into its cache (on a CPU: the interpreter runs it). Runs in a precompile worker."""
    from course_lib.flash import load_kernels
    from course_lib.flash.configs import configs_for

    kernel = load_kernels()
    done = []
    for name, d, causal, n, config, tma in todo:
        start = time.perf_counter()
        q, k, v, do = (torch.randn(1, n, d, device=device, dtype=torch.bfloat16) for _ in range(4))
        lse2 = torch.zeros(1, n, device=device)
        try:
            if name == "fwd":
                kernel.forward(q, k, v, causal, d ** -0.5, config=tuple(config), tma=tma)
            else:  # the other backward kernel at its first config: no autotuning here
                other = configs_for("dq" if name == "dkdv" else "dkdv", d, 2)[0]
                pair = (config, other) if name == "dkdv" else (other, config)
                kernel.backward(do, q, k, v, q, lse2, causal, d ** -0.5, configs=pair)
            if device == "cuda":
                torch.cuda.synchronize()
            error = None
        except Exception as e:  # noqa: BLE001 - reported by the stage
            error = f"{type(e).__name__}: {str(e)[:300]}"
        done.append({"kernel": name, "d": d, "causal": causal, "n": n, "config": list(config),
                     "tma": tma, "seconds": round(time.perf_counter() - start, 2), "error": error})
    return done


def precompile(rec: Recorder, plan: Plan) -> None:
    """Every variant the later stages launch, spread over `plan.workers` fresh processes (spawned:
    each gets its own CUDA context); Triton's on-disk cache is shared between processes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    todo = plan.variants()
    todo.sort(key=lambda v: (v[0] != "fwd", v[1]))  # fwd first: the next stages need it first
    chunks = [todo[i::plan.workers] for i in range(plan.workers)]
    start = time.perf_counter()
    failed = 0
    with ProcessPoolExecutor(plan.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for future in as_completed([pool.submit(compile_variants, c, plan.device)
                                    for c in chunks if c]):
            for row in future.result():
                failed += row["error"] is not None
                rec.add("compiled", **row)
    rec.add("precompiled", compiles=len(todo), workers=plan.workers, failed=failed,
            seconds=time.perf_counter() - start)


def _correct(rec: Recorder, plan: Plan, d: int, causal: bool, n: int) -> None:
    q, k, v, do = _inputs(plan, n, d, seed=n + d + causal)
    refs = _reference(q, k, v, do, causal, plan.ref_heads)
    truncation = _truncation(plan, refs)
    sdpa = _errors(_forward_backward("sdpa", q, k, v, do, causal), refs)
    for name in ("flash", "flash tma"):
        start = time.perf_counter()
        got = _forward_backward(name, q, k, v, do, causal)
        _sync(plan)
        took = time.perf_counter() - start
        errors = _errors(got, refs)
        rec.add("correctness", kernel=name, d=d, causal=causal, n=n, flash_err=errors,
                sdpa_err={key: sdpa[key] for key in errors}, truncation=truncation,
                verdict=verdict(errors, sdpa, truncation), first_call_s=took)


def correctness(rec: Recorder, plan: Plan, ns) -> None:
    for n in ns:
        for d in plan.dims:
            for causal in (False, True):
                item(rec, plan, f"correctness d={d} causal={causal} n={n}", _correct, d, causal, n)


def _time(rec: Recorder, plan: Plan, d: int, causal: bool, n: int, provider: str) -> None:
    q, k, v, do = _inputs(plan, n, d, seed=0)
    fn, ctx = _provider(provider)
    backward = provider not in FORWARD_ONLY
    q, k, v = (t.requires_grad_(backward) for t in (q, k, v))
    with ctx():
        start = time.perf_counter()  # the first call: compiling (if not cached) and autotuning
        out = fn(q, k, v, causal)
        _sync(plan)
        first = {"fwd": time.perf_counter() - start}
        times = {"fwd": seconds_per_call(lambda: fn(q, k, v, causal), plan)}
        if backward:
            start = time.perf_counter()
            out.backward(do, retain_graph=True)
            _sync(plan)
            first["bwd"] = time.perf_counter() - start
            times["bwd"] = seconds_per_call(lambda: out.backward(do, retain_graph=True), plan,
                                            grad_to_none=[q, k, v])
    from course_lib.flash.bench import attention_flops

    for mode, (t, timer) in times.items():
        flops = attention_flops(plan.batch, plan.heads, n, d, causal, mode)
        rec.add("time", provider=provider, d=d, causal=causal, n=n, mode=mode, ms=t * 1e3,
                tflops=flops / t / 1e12, first_call_s=first[mode], timer=timer)


def timing(rec: Recorder, plan: Plan) -> None:
    for n in plan.time_ns:
        for d in plan.dims:
            for causal in (False, True):
                for provider in PROVIDERS:
                    item(rec, plan, f"time {provider} d={d} causal={causal} n={n}", _time, d,
                         causal, n, provider)
    _chosen(rec)


def _every(rec: Recorder, plan: Plan, d: int, causal: bool, n: int) -> None:
    """Each table entry forced in turn (the autotuner times them all but checks none)."""
    from course_lib.flash import load_kernels

    kernel = load_kernels()
    q, k, v, do = _inputs(plan, n, d, seed=n + 2 * d + causal)
    refs = _reference(q, k, v, do, causal, plan.ref_heads)
    truncation = _truncation(plan, refs)
    sdpa = _errors(_forward_backward("sdpa", q, k, v, do, causal), refs)
    q3, k3, v3, do3 = (t.reshape(-1, n, d).contiguous() for t in (q, k, v, do))
    scale, first = d ** -0.5, {name: plan.configs(name, d)[0] for name in ("dkdv", "dq")}
    out3, lse2 = kernel.forward(q3, k3, v3, causal, scale)
    checks = []
    for name, config, tma in [(kn, c, t) for (kn, dd, cc, nn, c, t) in plan.variants()
                              if (dd, cc, nn) == (d, causal, n)]:
        if name == "fwd":
            got, _ = kernel.forward(q3, k3, v3, causal, scale, config=config, tma=tma)
            checks.append((name, config, tma, _errors([got], refs[:1], ("out",))))
        elif name == "dkdv":
            _, dk, dv = kernel.backward(do3, q3, k3, v3, out3, lse2, causal, scale,
                                        (config, first["dq"]))
            checks.append((name, config, tma, _errors([dk, dv], refs[2:], ("dk", "dv"))))
        else:
            dq, _, _ = kernel.backward(do3, q3, k3, v3, out3, lse2, causal, scale,
                                       (first["dkdv"], config))
            checks.append((name, config, tma, _errors([dq], refs[1:2], ("dq",))))
    for name, config, tma, errors in checks:
        rec.add("config_check", kernel=name, config=list(config), tma=tma, d=d, causal=causal,
                n=n, flash_err=errors, sdpa_err={key: sdpa[key] for key in errors},
                verdict=verdict(errors, sdpa, truncation))


def every_config(rec: Recorder, plan: Plan) -> None:
    for d in plan.dims:
        for causal in (False, True):
            for n in plan.config_ns:
                item(rec, plan, f"every config d={d} causal={causal} n={n}", _every, d, causal, n)


def _chosen(rec: Recorder) -> None:
    """The autotuner's picks in this process (key -> config), to improve the tables with."""
    from course_lib.flash import load_kernels

    kernel = load_kernels()
    for name, tuner in (("fwd", kernel._fwd), ("dkdv", kernel._bwd_dkdv), ("dq", kernel._bwd_dq)):
        for key, config in getattr(tuner, "cache", {}).items():
            rec.add("autotune", kernel=name, key=list(map(str, key)), config=str(config))


def run_pytest(rec: Recorder, plan: Plan, timeout: float) -> None:
    """The kernel tests, compiled, one config per kernel, on `plan.workers` xdist workers."""
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        rec.add("pytest", cmd="-", returncode=None, seconds=0.0, skipped=True,
                last_line="not run: pytest is not installed here (see docs/benchmarks.md)")
        return
    xdist = importlib.util.find_spec("xdist") is not None
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           *(["-n", str(plan.workers)] if xdist else []), *plan.pytest_args]
    env = dict(os.environ, COURSE_FLASH_AUTOTUNE="0")
    if plan.device == "cuda":
        env.pop("TRITON_INTERPRET", None)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=ROOT)
        tail, rc = (done.stdout + done.stderr)[-4000:], done.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        tail, rc = out[-4000:] + f"\n(timed out after {timeout:.0f} s)", None
    (rec.out / "pytest.log").write_text(tail)
    last = tail.strip().splitlines()[-1] if tail.strip() else ""
    rec.add("pytest", cmd=" ".join(cmd[2:]), returncode=rc, last_line=last, xdist=xdist,
            seconds=time.perf_counter() - start)


def run(name: str, plan: Plan, out: Path, limit: float) -> int:
    rec = Recorder(out, name)
    if plan.device == "cpu":
        from course_lib.flash import prepare_triton
        prepare_triton(quiet=True, interpret=True)
    bodies = {"machine": lambda: machine(rec, plan), "matmul": lambda: matmul(rec, plan),
              "precompile": lambda: precompile(rec, plan),
              "correct-small": lambda: correctness(rec, plan, plan.small_ns),
              "correct-large": lambda: correctness(rec, plan, plan.large_ns),
              "timing": lambda: timing(rec, plan), "every-config": lambda: every_config(rec, plan),
              "pytest": lambda: run_pytest(rec, plan, max(10.0, limit - 15))}
    try:
        bodies[name]()
    except ContextLost as e:
        rec.add("error", what="CUDA context lost; the rest of this stage is skipped",
                error=str(e))
        return 3
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="one stage of the GPU check")
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--limit", type=float, default=600.0, help="the stage's time limit")
    args = parser.parse_args(argv)
    plan = Plan.dry() if args.dry_run else Plan.gpu()
    return run(args.stage, plan, Path(args.out), args.limit)


if __name__ == "__main__":
    sys.exit(main())
