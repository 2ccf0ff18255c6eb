"""The flash kernels compiled for an H100/H200 (sm_90) on this CPU, without a GPU.

Every configuration the autotuner may try (forward, dK/dV, dQ; causal and not; fp16, bf16, fp32;
d = 16, 32, 64, 128), each in its two variants (lengths a multiple of the blocks, and ragged
lengths with masked loads), plus the TMA forward's first bf16 config at d = 64 and 128, compiled
by `python -m course_tools.gpu.compile_audit`: 392 compiles. Each must fit sm_90's 227 KB of
shared memory, keep its registers without spilling and use Hopper's wgmma.

The compile is deterministic given the kernels, their config tables, the audit's own code and
Triton's version, so its rows are recorded in course_tools/gpu/sm90_audit.json under a hash of
those (`compile_audit.audit_key`). While the key is the checkout's, the tests read the record (a
fresh clone checks in seconds); when it is not, they compile again in a subprocess (Triton must
not be in interpreter mode there; about 250 s of CPU time with a cold Triton cache) and the
fresh rows must be the recorded ones. After changing a kernel or a table:
`python -m course_tools.gpu.compile_audit --write`, then commit the record.
"""

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed (it ships for Linux only)")

ROOT = Path(__file__).resolve().parents[1]
REFRESH = "python -m course_tools.gpu.compile_audit --write"


def _compiled_env() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="0", COURSE_FLASH_AUTOTUNE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    return env


def _run(code: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_compiled_env(), cwd=ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def kernel_tables(monkeypatch_module):
    """configs_for and the limit (pure Python: configs.py and the audit's case list import no
    Triton)."""
    from course_lib.flash import configs as k
    from course_tools.gpu import compile_audit as c

    monkeypatch_module.setenv("COURSE_FLASH_AUTOTUNE", "1")  # every config, as on a GPU
    return {"limit": k.SM90_SHARED_BYTES,
            "combos": [[n, t, d, len(k.configs_for(n, d, c.DTYPES[t]))]
                       for n in c.KERNEL_NAMES for t in c.DTYPES for d in c.HEAD_DIMS],
            "tma": len(c.TMA_DIMS),
            "cases": [_case_key(*case) for case in c.cases()]}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _case_key(kernel, dtype, d, causal, even, config, tma) -> tuple:
    return (kernel, dtype, d, causal, even, *config, tma)


def _row_key(row: dict) -> tuple:
    return (row["kernel"], row["dtype"], row["d"], row["causal"], row["even"], row["BLOCK_M"],
            row["BLOCK_N"], row["warps"], row["stages"], row["tma"])


@pytest.fixture(scope="module")
def audit():
    """(the rows the tests judge, the recorded audit, whether the rows were compiled now)."""
    from course_tools.gpu import compile_audit

    recorded = compile_audit.read_audit()
    if recorded is not None and recorded["key"] == compile_audit.audit_key():
        return recorded["rows"], recorded, False
    if compile_audit.cuobjdump() is None:
        pytest.skip("no cuobjdump (Triton's NVIDIA backend ships one): cannot read spills")
    done = subprocess.run([sys.executable, "-m", "course_tools.gpu.compile_audit", "--json",
                           "--jobs", "2"], capture_output=True, text=True, env=_compiled_env(),
                          cwd=ROOT, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return rows, recorded, True


@pytest.fixture(scope="module")
def compiled(audit):
    """One row per compiled configuration (see course_tools.gpu.compile_audit.compile_one)."""
    return audit[0]


def test_the_rows_are_this_checkouts_compile(kernel_tables, audit):
    """The rows judged below are one per case the audit compiles today. Compiled now under the
    recorded Triton (the key's sources changed), they must be the recorded rows: a kernel that
    compiles differently gets its record renewed and reviewed in the same commit."""
    from course_tools.gpu import compile_audit

    rows, recorded, fresh = audit
    assert [_row_key(r) for r in rows] == kernel_tables["cases"]
    if not fresh:
        return
    key = compile_audit.audit_key()
    assert recorded is not None, f"no recorded audit: run `{REFRESH}` and commit it"
    if recorded["key"]["triton"] != key["triton"]:
        pytest.skip(f"the record is Triton {recorded['key']['triton']}'s, this is "
                    f"{key['triton']}'s: the rows compiled now were judged by the other tests")
    now, then = compile_audit.comparable(rows), recorded["rows"]
    changed = [f"{_name(a)}\n  recorded {b}\n  now      {a}" for a, b in zip(now, then)
               if a != b]
    assert now == then, (f"the kernels compile differently from the record ({len(changed)} "
                         f"rows): review, then `{REFRESH}` and commit\n" + "\n".join(changed[:8]))
    warnings.warn(f"sm90_audit.json's key is stale (same rows): `{REFRESH}` so that the next "
                  "run reads it instead of compiling", stacklevel=1)


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
