"""Compile the flash kernels for a GPU that is not here, and read what they would need there.

Triton compiles for a named target without a driver: `triton.compile(src,
target=GPUTarget("cuda", 90, 32))` gives a cubin for sm_90 (H100/H200) and its metadata, whose
`shared` field is the shared memory one block asks for; the `cuobjdump` Triton ships prints the
cubin's registers and stack frame, and a stack frame in these kernels (they keep no local arrays)
means ptxas spilled registers to memory.

    python -m course_tools.gpu.compile_audit            # every autotune config, a table
    python -m course_tools.gpu.compile_audit --json     # the same rows as JSON lines
    python -m course_tools.gpu.compile_audit --tma all  # also the TMA forward, every config
    python -m course_tools.gpu.compile_audit --write    # the default audit, into sm90_audit.json

The forward is audited in both its variants: pointer loads (cp.async pipelining, the default)
and tensor descriptors (`tma=True`, Hopper's copy engine); `--tma first` (the default) compiles
the TMA one for the first bf16 config of each head dim only, `--tma all` for every config.
It must run in a process that has not imported Triton in interpreter mode: main() sets
TRITON_INTERPRET=0 before importing the kernels.

The compile is deterministic given what goes into it: the kernels (`course_lib/flash/kernel.py`),
their config tables (`configs.py`), this file (what is compiled, with which signature) and
Triton's version. `--write` records the default audit's rows in `sm90_audit.json` beside this
file, keyed by a hash of those three files and the version (`audit_key`);
tests/test_flash_compile.py reads the record while its key is the checkout's and compiles again
only when it is not.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import course_lib.flash.configs as _configs_module
from course_lib.flash.configs import CONFIGS, KERNEL_NAMES, configs_for, shared_bytes_estimate

DTYPES = {"fp16": 2, "bf16": 2, "fp32": 4}   # Triton's name -> bytes per element
HEAD_DIMS = (16, 32, 64, 128)
TMA_DIMS = (64, 128)                          # the TMA forward is audited in bf16 at these
POINTERS = {"fwd": ("Q", "K", "V", "Out"), "dkdv": ("Q", "K", "V", "DO", "DK", "DV"),
            "dq": ("Q", "K", "V", "DO", "DQ")}   # the rest (LSE2, Delta) are fp32


AUDIT = Path(__file__).with_name("sm90_audit.json")
VOLATILE = ("seconds",)  # what a row holds that is not decided by the compile


def audit_key() -> dict:
    """What decides the default audit's rows: a hash of the kernels, their tables and this file,
    and Triton's version (read from its metadata: importing Triton would fix its mode)."""
    configs = Path(_configs_module.__file__)
    h = hashlib.sha256()
    for path in (configs.with_name("kernel.py"), configs, Path(__file__)):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return {"sources": h.hexdigest(), "triton": importlib.metadata.version("triton")}


def read_audit(path: Path = AUDIT) -> dict | None:
    """The recorded audit {"key": ..., "rows": [...]}, or None when there is none."""
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def comparable(rows: list[dict]) -> list[dict]:
    """Rows without what differs between two compiles of the same source (the time taken)."""
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def write_audit(rows: list[dict], path: Path = AUDIT) -> None:
    record = {"key": audit_key(), "rows": comparable(rows)}
    text = "{\n" + f' "key": {json.dumps(record["key"])},\n "rows": [\n'
    text += ",\n".join("  " + json.dumps(r) for r in record["rows"]) + "\n ]\n}\n"
    path.write_text(text, encoding="utf-8")


def cases(every: bool = False, kernels=KERNEL_NAMES, dtypes=tuple(DTYPES), dims=HEAD_DIMS,
          evens=(True, False), tma: str = "first"):
    """(kernel, dtype, d, causal, even, (BLOCK_M, BLOCK_N, warps, stages), tma) for every config
    the autotuner may try on sm_90 (`every=True`: every entry of every table, for exploring).
    even=False is the variant for lengths that are not a multiple of the blocks (masked loads).
    tma: "none", "first" (the TMA forward's first bf16 config at d = 64, 128) or "all"."""
    for name, dtype, d in itertools.product(kernels, dtypes, dims):
        if every:
            configs = list(dict.fromkeys(c for table in CONFIGS[name].values() for c in table))
        else:
            configs = configs_for(name, d, DTYPES[dtype])
        variants = [(c, False) for c in configs]
        if name == "fwd" and dtype == "bf16" and d in TMA_DIMS and tma != "none":
            fit = configs if every else configs_for(name, d, DTYPES[dtype], tma=True)
            variants += [(c, True) for c in (fit if tma == "all" else fit[:1])]
        for causal, even, (config, on) in itertools.product((False, True), evens, variants):
            yield name, dtype, d, causal, even, config, on


def _source(kernel_module, name, dtype, d, causal, even, config, tma=False):
    import triton

    fn = kernel_module.KERNELS[name]
    block_m, block_n, _, _ = config
    constexprs = {"HEAD_DIM": d, "BLOCK_M": block_m, "BLOCK_N": block_n, "CAUSAL": causal,
                  "EVEN": even, "UPCAST": False, "TMA": tma}
    signature, attrs = {}, {}
    for i, arg in enumerate(fn.arg_names):
        if arg in constexprs:
            signature[arg] = "constexpr"
            continue
        if arg in POINTERS[name]:
            signature[arg] = f"*{dtype}"
        elif arg in ("LSE2", "Delta"):
            signature[arg] = "*fp32"
        elif arg in ("sm_scale", "qk_scale"):
            signature[arg] = "fp32"
        else:
            signature[arg] = "i32"
        # what the launcher sees at a real size: 16-byte aligned pointers, strides that are
        # multiples of 16 elements; lengths too when every block is whole (EVEN)
        aligned = (arg not in ("sm_scale", "qk_scale", "TUNE_N_Q", "TUNE_N_KV")
                   and (even or arg not in ("N_Q", "N_KV")))
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
    return triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                                     attrs=attrs)


def cuobjdump() -> str | None:
    """The cuobjdump Triton ships (or one on PATH), None when there is none. Finds Triton's
    folder without importing it (importing fixes interpreted-or-compiled for the process)."""
    import importlib.util
    from shutil import which

    spec = importlib.util.find_spec("triton")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        shipped = Path(folder) / "backends" / "nvidia" / "bin" / "cuobjdump"
        if shipped.exists():
            return str(shipped)
    return which("cuobjdump")


def resource_usage(cubin: bytes, tool: str) -> dict:
    """Registers and stack frame bytes per thread, from `cuobjdump -res-usage`."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                              check=True, timeout=60).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{text}")
    regs, stack, _, local = map(int, found.groups())
    return {"regs": regs, "stack": stack, "local": local}


def compile_one(kernel_module, case, arch: int = 90, tool: str | None = None) -> dict:
    """Compile one case for sm_<arch>; its shared memory, registers and spill bytes."""
    import triton
    from triton.backends.compiler import GPUTarget

    name, dtype, d, causal, even, config, *tma = case
    block_m, block_n, warps, stages = config
    start = time.perf_counter()
    compiled = triton.compile(_source(kernel_module, *case), target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": warps, "num_stages": stages})
    row = {"kernel": name, "dtype": dtype, "d": d, "causal": causal, "even": even,
           "tma": bool(tma and tma[0]),
           "BLOCK_M": block_m, "BLOCK_N": block_n, "warps": warps, "stages": stages,
           "shared": int(compiled.metadata.shared),
           "shared_estimate": shared_bytes_estimate(name, block_m, block_n, stages, d,
                                                    DTYPES[dtype], bool(tma and tma[0])),
           "wgmma": "wgmma" in compiled.asm.get("ptx", ""), "triton": triton.__version__}
    if tool is not None:
        row.update(resource_usage(compiled.asm["cubin"], tool))
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def compile_all(every: bool = False, jobs: int = 2, arch: int = 90, progress=None,
                **which) -> list[dict]:
    """Compile every case (see `cases`); rows in case order. Needs Triton in compiled mode."""
    from course_lib.flash import kernel as kernel_module

    if kernel_module.INTERPRET:
        raise RuntimeError("compile_audit: Triton is in interpreter mode in this process; run "
                           "`python -m course_tools.gpu.compile_audit` (sets TRITON_INTERPRET=0)")
    tool = cuobjdump()
    todo = list(cases(every, **which))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(compile_one, kernel_module, case, arch, tool) for case in todo]
        rows = []
        for future in futures:
            rows.append(future.result())
            if progress is not None:
                progress(rows[-1])
    return rows


def _line(row: dict) -> str:
    spill = row.get("stack", "?")
    kernel = row["kernel"] + (" tma" if row.get("tma") else "")
    return (f"{kernel:8} {row['dtype']} d={row['d']:<3} causal={row['causal']!s:5} "
            f"even={row['even']!s:5} {row['BLOCK_M']:>3}x{row['BLOCK_N']:<3} w{row['warps']} "
            f"s{row['stages']}  shared {row['shared']:>6} (est {row['shared_estimate']:>6})  "
            f"regs {row.get('regs', '?'):>3}  "
            f"spill {spill:>4}  wgmma {'yes' if row['wgmma'] else 'no'}  {row['seconds']:.1f}s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--every", action="store_true",
                        help="every candidate, including those the pruning drops")
    parser.add_argument("--jobs", type=int, default=2, help="compiles at once (threads)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90")
    parser.add_argument("--kernels", nargs="+", default=list(KERNEL_NAMES), choices=KERNEL_NAMES)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--dims", nargs="+", type=int, default=list(HEAD_DIMS))
    parser.add_argument("--tma", choices=("none", "first", "all"), default="first",
                        help="which configs of the TMA forward to compile (bf16, d = 64, 128)")
    parser.add_argument("--even-only", action="store_true",
                        help="skip the variant for lengths that are not a multiple of the blocks")
    parser.add_argument("--write", action="store_true",
                        help=f"record the default audit and its key in {AUDIT.name} (the test "
                             "reads it instead of compiling while the key holds)")
    args = parser.parse_args(argv)
    default = (not args.every and args.arch == 90 and args.tma == "first" and not args.even_only
               and args.kernels == list(KERNEL_NAMES) and args.dtypes == list(DTYPES)
               and args.dims == list(HEAD_DIMS))
    if args.write and not default:
        parser.error("--write records the default audit only (no --every, --tma, --arch, ...)")
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("Triton was already imported in interpreter mode")
    os.environ["TRITON_INTERPRET"] = "0"
    start = time.perf_counter()
    emit = (lambda r: print(json.dumps(r), flush=True)) if args.json else \
        (lambda r: print(_line(r), flush=True))
    rows = compile_all(every=args.every, jobs=args.jobs, arch=args.arch, progress=emit,
                       kernels=args.kernels, dtypes=args.dtypes, dims=args.dims,
                       evens=(True,) if args.even_only else (True, False), tma=args.tma)
    if not args.json:
        print(f"{len(rows)} compiles for sm_{args.arch} in {time.perf_counter() - start:.1f} s")
    if args.write:
        write_audit(rows)
        print(f"recorded in {AUDIT}", file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
