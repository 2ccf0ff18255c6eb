"""The flash kernels compiled for an H100/H200 (sm_90) on this CPU, without a GPU.

Every configuration the autotuner may try (forward, dK/dV, dQ; causal and not; fp16, bf16, fp32;
d = 16, 32, 64, 128), each in its two variants (lengths a multiple of the blocks, and ragged
lengths with masked loads), plus the TMA forward's first bf16 config at d = 64 and 128, is
compiled by `python -m course_tools.gpu.compile_audit` in a subprocess (Triton must not be in
interpreter mode there): 392 compiles on two threads. Each must fit sm_90's 227 KB of shared
memory, keep its registers without spilling and use Hopper's wgmma. Triton caches compiled
kernels (~/.triton/cache), so only the first run after a kernel change compiles for real
(about 250 s of CPU time; later runs take seconds).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed (it ships for Linux only)")

ROOT = Path(__file__).resolve().parents[1]


def _compiled_env() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="0", COURSE_FLASH_AUTOTUNE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    return env


def _run(code: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_compiled_env(), cwd=ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def kernel_tables():
    """configs_for and the limit, read in a compiled-mode process (pure Python, no compiling)."""
    from course_tools.gpu import compile_audit

    if compile_audit.cuobjdump() is None:
        pytest.skip("no cuobjdump (Triton's NVIDIA backend ships one): cannot read spills")
    code = ("import json; from course_tools.gpu import compile_audit as c\n"
            "from course_lib.flash import configs as k\n"
            "print(json.dumps({'limit': k.SM90_SHARED_BYTES, 'combos': [\n"
            "  [n, t, d, len(k.configs_for(n, d, c.DTYPES[t]))]\n"
            "  for n in c.KERNEL_NAMES for t in c.DTYPES for d in c.HEAD_DIMS],\n"
            "  'tma': len(c.TMA_DIMS)}))")
    done = _run("import os; os.environ['TRITON_INTERPRET'] = '0'\n" + code, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled(kernel_tables):
    """One row per compiled configuration (see course_tools.gpu.compile_audit.compile_one)."""
    done = subprocess.run([sys.executable, "-m", "course_tools.gpu.compile_audit", "--json",
                           "--jobs", "2"], capture_output=True, text=True, env=_compiled_env(),
                          cwd=ROOT, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _name(row: dict) -> str:
    return (f"{row['kernel']}{' tma' if row['tma'] else ''} {row['dtype']} d={row['d']} "
            f"causal={row['causal']} "
            f"even={row['even']} {row['BLOCK_M']}x{row['BLOCK_N']} w{row['warps']} "
            f"s{row['stages']}")


def test_every_kernel_dtype_and_head_dim_has_configs(kernel_tables, compiled):
    combos = {(n, t, d) for n, t, d, count in kernel_tables["combos"] if count >= 1}
    assert len(combos) == len(kernel_tables["combos"]) == 3 * 3 * 4
    seen = {(r["kernel"], r["dtype"], r["d"], r["causal"], r["even"]) for r in compiled}
    assert seen == {(n, t, d, c, e) for n, t, d in combos for c in (False, True)
                    for e in (True, False)}
    tma = kernel_tables["tma"] * 4  # the TMA forward's first config per head dim, 4 variants
    want = sum(count for *_, count in kernel_tables["combos"]) * 4 + tma
    assert len(compiled) == want
    assert sum(r["tma"] for r in compiled) == tma


def test_every_16_bit_config_uses_hoppers_wgmma(compiled):
    """The fp16/bf16 dots compile to wgmma (warpgroup MMA), not Ampere's mma.sync. (fp32 at
    d = 128 has dK/dV and dQ tiles of 16 or 32 rows, fewer than a warpgroup's 64: mma.sync.)"""
    without = [_name(r) for r in compiled if not r["wgmma"] and r["dtype"] != "fp32"]
    assert not without, "no wgmma in the PTX of:\n" + "\n".join(without)


def test_every_config_fits_sm90_shared_memory(kernel_tables, compiled):
    limit = kernel_tables["limit"]
    too_big = [f"{_name(r)}: {r['shared']} bytes" for r in compiled if r["shared"] > limit]
    assert not too_big, f"over sm_90's {limit} bytes of shared memory:\n" + "\n".join(too_big)


def test_no_config_spills_registers(compiled):
    spills = [f"{_name(r)}: {r['regs']} registers, {r['stack']} bytes of stack"
              for r in compiled if r["stack"] > 0 or r["local"] > 0]
    assert not spills, "ptxas spilled registers (cuobjdump shows a stack frame):\n" + \
        "\n".join(spills)


def test_shared_memory_estimate_is_never_below_the_compiled_figure(compiled):
    """The pruning trusts the estimate: it must not promise a config fits when it does not."""
    under = [f"{_name(r)}: estimate {r['shared_estimate']} < {r['shared']}"
             for r in compiled if r["shared_estimate"] < r["shared"]]
    assert not under, "\n".join(under)


def test_block_size_assumptions_are_static_asserts(kernel_tables):
    """A forward with BLOCK_M not a multiple of BLOCK_N fails to compile, naming the reason."""
    code = ("import os; os.environ['TRITON_INTERPRET'] = '0'\n"
            "from course_lib.flash import kernel as k\n"
            "from course_tools.gpu import compile_audit as c\n"
            "case = ('fwd', 'bf16', 64, True, True, (32, 64, 4, 2), False)\n"
            "try:\n"
            "    c.compile_one(k, case, tool=None)\n"
            "except Exception as e:\n"
            "    print('FAILED', type(e).__name__, e)\n"
            "else:\n"
            "    print('COMPILED')\n")
    done = _run(code, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" in done.stdout and "causal diagonal" in done.stdout, done.stdout[-2000:]
