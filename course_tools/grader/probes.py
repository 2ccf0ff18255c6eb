"""Stage 4a/5a, probe and judge: fresh cases in, the learner's outputs back, judged here.

For each check call of a graded cell the grader picks a fresh random seed, makes the cases
(`Check.cases(seed, hidden=True)`: hidden cases are data made here, never code in the kernel),
saves them where the kernel can read them, and has the kernel run ONE generated cell that calls
`course_lib.checks.probe`. After that cell the worker moves the outcome file out of the
kernel's reach; the grader loads it with `torch.load(weights_only=True)` after size checks and
calls `Check.judge` in its own process. Nothing else the kernel says counts. Everything used
here is the public grading protocol of `course_lib.checks` (its docstring lists it).
"""

from __future__ import annotations

import secrets
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from course_tools.grader.calls import CheckCall

BENIGN = {"builtins.input was replaced"}


@dataclass
class Probe:
    call: CheckCall
    seed: int
    cases: list
    name: str          # io/<name>.in.pt -> io/<name>.out.pt (+ .tampered), collected afterwards
    source: str        # the generated cell

    @property
    def out(self) -> str:
        return f"{self.name}.out.pt"

    @property
    def inp(self) -> str:
        return f"{self.name}.in.pt"


@dataclass
class Verdict:
    passed: bool
    message: str
    flags: list[str] = field(default_factory=list)   # tampering found: 0 points and FLAGGED


def prepare(call: CheckCall, io: Path, store: Path | None = None) -> Probe:
    """Make the cases (grader side) and the one cell that runs the learner's code on them.
    The cases are saved in `store` (default `io`); the worker moves them into `io`, where the
    cell reads them, just before the cell runs, and removes them after it."""
    import torch

    from course_lib.checks import encode

    seed = secrets.randbelow(2**31)
    cases = call.check.cases(seed, True)
    name = "p" + secrets.token_hex(8)
    torch.save(encode(cases), (store or io) / f"{name}.in.pt")
    args = "".join(", " + a for a in call.args)
    source = (f'__import__("course_lib.checks", fromlist=["probe"]).probe('
              f'{call.check.id!r}, {str(io / (name + ".in.pt"))!r}, '
              f'{str(io / (name + ".out.pt"))!r}{args})')
    return Probe(call, seed, cases, name, source)


def judge(probe: Probe, collected: Path, cell_ran: bool,
          grew_mb: float | None = None) -> Verdict:
    """The grader's own verdict on one probe, from the files the worker collected. `grew_mb`:
    how much the kernel's memory grew while the probe ran, as the worker read it from outside
    (for a check with `memory_mb`; None where it could not be read)."""
    verdict = _verdict(probe, collected, cell_ran)
    limit = probe.call.check.memory_mb
    if verdict.passed and limit is not None and grew_mb is not None and grew_mb >= limit:
        return Verdict(False, f"{probe.call.check.name}: {probe.call.check.memory_note} (read "
                              f"from outside the kernel: its memory grew by {grew_mb:.0f} MB "
                              f"while your function ran on the check's cases; less than "
                              f"{limit:.0f} MB passes)", verdict.flags)
    return verdict


def _verdict(probe: Probe, collected: Path, cell_ran: bool) -> Verdict:
    out = collected / probe.out
    if not out.exists():
        if cell_ran:  # the cell finished without error, yet the probe wrote nothing
            return Verdict(False, "no result came back from the check", [
                "the check's probe left no result (it was replaced, or its file removed)"])
        return Verdict(False, "")   # the cell's own error explains it (score.py adds it)
    with warnings.catch_warnings():  # a forged file may make torch.load warn before it refuses
        warnings.simplefilter("ignore")
        return _judge(probe, out)


def _judge(probe: Probe, out: Path) -> Verdict:
    from course_lib.checks import (
        CheckFailure,
        OutcomeError,
        ReferenceCall,
        load_outcomes,
        load_tampered,
    )

    flags = []
    try:
        tampered = load_tampered(out)
    except OutcomeError as e:
        tampered = [f"a forged tampering report ({e})"]
    if tampered is None:
        flags.append("the check's probe was replaced (no tampering report came back)")
    else:  # ipykernel itself rebinds builtins.input for every cell (stdin forwarding)
        flags += [t for t in tampered if t not in BENIGN]
    try:
        outcomes = load_outcomes(out)
    except OutcomeError as e:
        return Verdict(False, f"the result file was refused: {e}",
                       flags + [f"a forged result: {e}"])
    n = len(probe.cases)
    if len(outcomes) != n:
        if len(outcomes) == 1 and "error" in outcomes[0]:  # the probe itself could not run
            return Verdict(False, str(outcomes[0]["error"]), flags)
        return Verdict(False, f"{len(outcomes)} results came back for {n} cases",
                       flags + [f"a forged result: {len(outcomes)} results for {n} cases"])
    try:
        message = probe.call.check.judge(probe.cases, outcomes)
    except ReferenceCall as e:
        return Verdict(False, str(e), flags + [str(e)])
    except CheckFailure as e:
        return Verdict(False, str(e), flags)
    except Exception as e:  # noqa: BLE001 - a judge bug must not stop grading
        return Verdict(False, f"the checker failed: {type(e).__name__}: {e}", flags)
    return Verdict(not flags, str(message), flags)
