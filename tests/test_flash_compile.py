"""The flash kernels compiled for an H100/H200 (sm_90) on this CPU, without a GPU.

Every configuration the autotuner may try (forward, dK/dV, dQ; causal and not; fp16, bf16, fp32;
d = 16, 32, 64, 128), each in its two variants (lengths a multiple of the blocks, and ragged
lengths with masked loads), is compiled by `python -m course_lib.flash.compile_check` in a
subprocess (Triton must not be in interpreter mode there): 336 compiles on two threads. Each must
fit sm_90's 227 KB of shared memory and keep its registers without spilling. Triton caches
compiled kernels (~/.triton/cache), so only the first run after a kernel change compiles for real
(about 200 s of CPU time; later runs take seconds).
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
    from course_lib.flash import compile_check

    if compile_check.cuobjdump() is None:
        pytest.skip("no cuobjdump (Triton's NVIDIA backend ships one): cannot read spills")
    code = ("import json; from course_lib.flash import kernel as k, compile_check as c\n"
            "print(json.dumps({'limit': k.SM90_SHARED_BYTES, 'combos': [\n"
            "  [n, t, d, len(k.configs_for(n, d, c.DTYPES[t]))]\n"
            "  for n in c.KERNEL_NAMES for t in c.DTYPES for d in c.HEAD_DIMS]}))")
    done = _run("import os; os.environ['TRITON_INTERPRET'] = '0'\n" + code, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled(kernel_tables):
    """One row per compiled configuration (see course_lib.flash.compile_check.compile_one)."""
    done = subprocess.run([sys.executable, "-m", "course_lib.flash.compile_check", "--json",
                           "--jobs", "2"], capture_output=True, text=True, env=_compiled_env(),
                          cwd=ROOT, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _name(row: dict) -> str:
    return (f"{row['kernel']} {row['dtype']} d={row['d']} causal={row['causal']} "
            f"even={row['even']} {row['BLOCK_M']}x{row['BLOCK_N']} w{row['warps']} "
            f"s{row['stages']}")


def test_every_kernel_dtype_and_head_dim_has_configs(kernel_tables, compiled):
    combos = {(n, t, d) for n, t, d, count in kernel_tables["combos"] if count >= 1}
    assert len(combos) == len(kernel_tables["combos"]) == 3 * 3 * 4
    seen = {(r["kernel"], r["dtype"], r["d"], r["causal"], r["even"]) for r in compiled}
    assert seen == {(n, t, d, c, e) for n, t, d in combos for c in (False, True)
                    for e in (True, False)}
    want = sum(count for *_, count in kernel_tables["combos"]) * 4  # causal or not, ragged or not
    assert len(compiled) == want


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
            "from course_lib.flash import kernel as k, compile_check as c\n"
            "case = ('fwd', 'bf16', 64, True, True, (32, 64, 4, 2))\n"
            "try:\n"
            "    c.compile_one(k, case, tool=None)\n"
            "except Exception as e:\n"
            "    print('FAILED', type(e).__name__, e)\n"
            "else:\n"
            "    print('COMPILED')\n")
    done = _run(code, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" in done.stdout and "causal diagonal" in done.stdout, done.stdout[-2000:]
