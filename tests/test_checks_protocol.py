"""The checker protocol: Check in-process, the kernel-side probe, and the grader's loader."""

import builtins
import collections
import io
import os
import sys
import threading

import numpy as np
import pytest
import torch

import course_lib.attention as attention
from course_lib.checks import Check, CheckFailure, _data, _kernel, get, hint
from course_lib.checks._core import call, expect_close
from course_lib.checks._data import OutcomeError, decode, encode, load_outcomes, to_data
from course_lib.checks._judging import value
from course_lib.checks._probe import load_tampered, probe, tampered_path, tampering
from course_lib.checks._trap import ReferenceCall


def _double_cases(seed, hidden):
    g = torch.Generator().manual_seed(seed)
    cases = [{"x": torch.randn(3, generator=g)}, {"x": np.arange(4.0) + seed}]
    if hidden:
        cases.append({"x": torch.zeros(0)})
    return cases


def _double_run(fn, case):
    return call(fn, case["x"], name="double")


def _double_judge(cases, outcomes):
    for case, outcome in zip(cases, outcomes):
        expect_close(value(outcome), 2 * torch.as_tensor(case["x"]), "double(x)")
    return "double: twice its input."


def make_double(tag: str) -> Check:
    """A fresh check per test, so the once-per-process tier-1 hint starts unused."""
    return Check(id=f"ch99.double_{tag}", cases=_double_cases, run=_double_run, judge=_double_judge,
                 hints=("add the input to itself", "2 * x", "see solutions/99_fake.ipynb"),
                 grade_ids=(f"ch99_double_{tag}_test",))


def _softmax_judge(cases, outcomes):
    for case, outcome in zip(cases, outcomes):
        expect_close(value(outcome), torch.softmax(case, -1), "softmax(x)")
    return "softmax: rows sum to 1."


SOFTMAX = Check(id="ch99.softmax", cases=lambda seed, hidden: [torch.randn(2, 5)],
                run=lambda fn, case: call(fn, case, name="softmax"), judge=_softmax_judge,
                forbid=((attention, "softmax"),), hints=("exponentiate", "see solutions/"))


def double_ok(x):
    return 2 * x


class Opaque:
    pass


@pytest.mark.parametrize("answer,words", [
    (None, "is None"),
    (42, "should be a function"),
    (lambda x: x, "differs"),
    (lambda x: None, "forget to `return`"),
    (lambda x: torch.full((len(x),), float("nan")), "NaN"),
    (lambda x: torch.zeros(len(x) + 1), "shape"),
    (lambda x: {}["missing"], "raised KeyError"),
    (lambda x: Opaque(), "returned a Opaque, which a check cannot read"),
    (lambda x: (lambda: 1), "returned a function"),
    (lambda x: [object()], "returned a object"),
    (lambda x: "text", "should be a tensor"),
])
def test_wrong_answers_become_feedback(answer, words):
    with pytest.raises(CheckFailure, match=words.replace("(", r"\(")):
        make_double("wrong")(answer)


def test_right_answers_pass_in_numpy_and_torch(capsys):
    check = make_double("right")
    check(double_ok)
    check(lambda x: np.asarray(x) * 2)  # NumPy back is fine: the judge sees a tensor either way
    assert capsys.readouterr().out == "✔ double: twice its input.\n" * 2


def test_learner_exceptions_that_misbehave_are_still_feedback():
    class Nasty(Exception):
        def __str__(self):
            raise RuntimeError("no")

    def raises_nasty(x):
        raise Nasty()

    def exits(x):
        raise SystemExit(3)

    with pytest.raises(CheckFailure, match="raised Nasty: <Nasty that cannot be printed>"):
        make_double("nasty")(raises_nasty)
    with pytest.raises(CheckFailure, match="raised SystemExit"):
        make_double("exit")(exits)


def test_a_blank_answer_shows_its_nudge_once():
    def blank(x):
        raise NotImplementedError("add the input to itself")

    check = make_double("blank")
    with pytest.raises(CheckFailure) as first:
        check(blank)
    assert "not written yet. Hint: add the input to itself" in str(first.value)
    assert str(first.value).count("add the input to itself") == 1  # not appended twice
    assert 'check.hint("ch99_double_blank", 2)' in str(first.value)


def test_the_first_failure_carries_the_tier_one_hint_and_only_the_first():
    check = make_double("tiers")
    with pytest.raises(CheckFailure) as first:
        check(lambda x: 3 * x)
    with pytest.raises(CheckFailure) as second:
        check(lambda x: 3 * x)
    assert "Hint: add the input to itself" in str(first.value)
    assert "2 * x" not in str(first.value)  # tier 2 only on request
    assert "Hint" not in str(second.value)


def test_hint_prints_the_requested_tier_and_the_count(capsys):
    make_double("ask")
    hint("ch99_double_ask", 2)
    assert capsys.readouterr().out == ('Hint 2 of 3 for ch99_double_ask: 2 * x\n'
                                       'Next: check.hint("ch99_double_ask", 3)\n')
    get("ch99.double_ask").hint(3)
    out = capsys.readouterr().out
    assert out == "Hint 3 of 3 for ch99_double_ask: see solutions/99_fake.ipynb\n"
    for bad in (0, 4, "2", True):
        with pytest.raises(ValueError, match="tier should be a whole number from 1 to 3"):
            hint("ch99_double_ask", bad)
    with pytest.raises(ValueError, match="names no checker"):
        hint("ch99_nothing_like_it", 1)


def test_get_finds_a_check_by_id_and_grade_id():
    check = make_double("find")
    assert get("ch99.double_find") is check
    assert get("ch99_double_find_test") is check
    assert get("ch99_double_find") is check
    with pytest.raises(ValueError, match="exercise should be a check id"):
        get(None)


def test_calling_the_reference_fails_in_process():
    def cheat(x):
        return attention.softmax(x)

    with pytest.raises(ReferenceCall, match="the course's own `course_lib.attention.softmax`"):
        SOFTMAX(cheat)
    with pytest.raises(ReferenceCall):
        SOFTMAX(attention.softmax)  # the reference handed in as the answer
    SOFTMAX(lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True))


def test_the_judge_sees_the_pristine_cases_whatever_the_answer_does_to_its_inputs():
    def zero_then_double(x):
        x *= 0
        return 2 * x

    with pytest.raises(CheckFailure, match="differs"):
        make_double("mutate")(zero_then_double)


def test_the_judge_never_crashes_on_malformed_outcomes():
    check = make_double("judge")
    cases = check.cases(0, False)
    for outcomes in ([], [{"ok": torch.zeros(3)}], "junk", [{"nothing": 1}, {"ok": 1}],
                     [{"ok": {"a": 1}}, {"ok": [1, [2]]}]):
        with pytest.raises(CheckFailure):
            check.judge(cases, outcomes)


def test_to_data_keeps_data_and_refuses_the_rest():
    p = torch.nn.Parameter(torch.ones(2))
    Point = collections.namedtuple("Point", "x y")
    out = to_data({"p": p, "np": np.arange(3), "f": np.float64(1.5), "pt": Point(1, 2),
                   "t": torch.ones(3, 2).T, "g": torch.ones(2, requires_grad=True) * 2})
    assert type(out["p"]) is torch.Tensor and not out["p"].requires_grad
    assert type(out["np"]) is torch.Tensor and out["np"].tolist() == [0, 1, 2]
    assert type(out["f"]) is float and out["pt"] == (1, 2) and type(out["pt"]) is tuple
    assert out["t"].is_contiguous() and not out["g"].requires_grad
    for bad in (object(), np.array(["a"]), {(1, 2): 3}, torch.zeros(1, device="meta"),
                [[[[[[[[[[[[[[1]]]]]]]]]]]]]], torch.zeros(_data.MAX_NUMEL + 1)):
        with pytest.raises(_data._Unreadable):
            to_data(bad)


def test_cases_travel_as_data_and_come_back_as_numpy():
    cases = [{"a": np.arange(3.0), "n": np.int64(4), "t": torch.ones(2)}, (np.zeros((2, 2)), "s")]
    buffer = io.BytesIO()
    torch.save(encode(cases), buffer)
    buffer.seek(0)
    back = decode(torch.load(buffer, weights_only=True))
    assert isinstance(back[0]["a"], np.ndarray) and back[0]["a"].tolist() == [0, 1, 2]
    assert back[0]["n"] == 4 and isinstance(back[1], tuple) and back[1][0].shape == (2, 2)
    with pytest.raises(ValueError, match="only data"):
        encode([Opaque()])


# ------------------------------------------------------------------------------- the probe

def _grade(check, tmp_path, *learner_objs, seed=7):
    """What the grader does around the probe: cases out, outcomes back, judge at home."""
    cases = check.cases(seed, True)
    inputs, outputs = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(encode(cases), inputs)
    probe(check.id, str(inputs), str(outputs), *learner_objs)
    outcomes = load_outcomes(outputs, n_cases=len(cases))
    return cases, outcomes, load_tampered(outputs)


def test_probe_round_trip_honest_and_wrong(tmp_path, capsys):
    check = make_double("probe")
    cases, outcomes, tampered = _grade(check, tmp_path, double_ok)
    assert len(cases) == 3 and tampered == []
    assert check.judge(cases, outcomes) == "double: twice its input."
    cases, outcomes, _ = _grade(check, tmp_path, lambda x: x + 1)
    with pytest.raises(CheckFailure, match="differs"):
        check.judge(cases, outcomes)
    cases, outcomes, _ = _grade(check, tmp_path, lambda x: Opaque())
    assert all("cannot read" in o["error"] for o in outcomes)
    assert capsys.readouterr().out == ""  # the probe prints nothing


def test_probe_reports_reference_calls(tmp_path):
    cases, outcomes, _ = _grade(SOFTMAX, tmp_path, lambda x: attention.softmax(x))
    assert outcomes[0]["reference_call"] == "course_lib.attention.softmax"
    with pytest.raises(ReferenceCall):
        SOFTMAX.judge(cases, outcomes)


def test_probe_survives_a_bad_id_or_bad_cases(tmp_path):
    torch.save(encode([1]), tmp_path / "in.pt")
    probe("ch99.nothing", str(tmp_path / "in.pt"), str(tmp_path / "out.pt"), double_ok)
    (outcome,) = load_outcomes(tmp_path / "out.pt")
    assert "could not run" in outcome["error"]
    torch.save({"not": "a list"}, tmp_path / "in.pt")
    probe(make_double("badcases").id, str(tmp_path / "in.pt"), str(tmp_path / "out.pt"), double_ok)
    assert "not a list" in load_outcomes(tmp_path / "out.pt")[0]["error"]


def test_probe_reports_replaced_comparisons_builtins_and_threads(tmp_path, monkeypatch):
    check = make_double("tamper")
    assert tampering(check.id) == []
    monkeypatch.setattr(torch, "allclose", lambda *a, **k: True)
    monkeypatch.setattr(np, "allclose", lambda *a, **k: True)
    monkeypatch.setattr(builtins, "abs", lambda x: 0)
    release = threading.Event()

    def lingering():
        release.wait(5)

    thread = threading.Thread(target=lingering, name="lingering")
    thread.start()
    try:
        _, _, tampered = _grade(check, tmp_path, double_ok)
    finally:
        release.set()
        thread.join()
    assert "torch.allclose was replaced" in tampered
    assert "numpy.allclose was replaced" in tampered
    assert "builtins.abs was replaced" in tampered
    assert any("thread the notebook started (lingering)" in t for t in tampered)


def test_probe_reports_a_rebound_checker_and_a_replaced_check_part(tmp_path, monkeypatch):
    import course_lib.checks.ch01 as ch01

    check = make_double("rebound")
    name = "fake_for_this_test"
    planted = Check(id=f"ch01.{name}", cases=_double_cases, run=_double_run, judge=_double_judge)
    monkeypatch.setattr(ch01, name, planted, raising=False)
    assert tampering(check.id) == []
    monkeypatch.setattr(ch01, name, lambda *a, **k: None)  # `check.x = lambda *a, **k: None`
    monkeypatch.setattr(_kernel, "run_cases", lambda *a: [])
    found = tampering(check.id)
    assert f"course_lib.checks.ch01.{name} (a checker) was replaced" in found
    assert any("_kernel.run_cases was replaced" in t for t in found)
    object.__setattr__(check, "run", lambda fn, case: 2 * case["x"])
    assert f"{check.id}.run was replaced" in tampering(check.id)


def test_probe_reports_a_disarmed_forbid_and_profile_hooks(monkeypatch):
    from course_lib.checks import _trap

    check = make_double("disarm")
    monkeypatch.setattr(_trap._Forbid, "__exit__", lambda self, *exc: False)
    monkeypatch.setattr(sys, "setprofile", lambda hook: None)
    found = tampering(check.id)
    assert "course_lib.checks._trap._Forbid.__exit__ was replaced" in found
    assert "sys.setprofile was replaced" in found


def test_a_missing_tamper_report_reads_as_none(tmp_path):
    assert load_tampered(tmp_path / "out.pt") is None
    torch.save(["x", 1], tampered_path(tmp_path / "out.pt"))
    with pytest.raises(OutcomeError):
        load_tampered(tmp_path / "out.pt")


# ------------------------------------------------------------------------- the grader's loader

class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {Payload.marker}",))


def test_loader_refuses_a_pickle_payload_without_running_it(tmp_path):
    Payload.marker = tmp_path / "ran"
    torch.save([{"ok": Payload()}], tmp_path / "out.pt")
    with pytest.raises(OutcomeError, match="not plain data"):
        load_outcomes(tmp_path / "out.pt")
    assert not Payload.marker.exists()


def test_loader_refuses_large_files_and_malformed_outcomes(tmp_path):
    path = tmp_path / "out.pt"
    torch.save([{"ok": torch.zeros(1000)}], path)
    assert len(load_outcomes(path)) == 1
    with pytest.raises(OutcomeError, match="more than the limit"):
        load_outcomes(path, max_bytes=1000)
    with pytest.raises(OutcomeError, match="2 cases"):
        load_outcomes(path, n_cases=2)
    path.write_bytes(b"garbage")
    with pytest.raises(OutcomeError, match="not plain data"):
        load_outcomes(path)
    with pytest.raises(OutcomeError, match="no result file"):
        load_outcomes(tmp_path / "missing.pt")
    for bad in ({"ok": 1}, [{"ok": 1, "error": "x"}], [{"ok": 1, "extra": 2}], [["ok"]],
                [{"error": 3}], [{"ok": torch.zeros(1).expand(10**6)}],
                [{"ok": torch.zeros(_data.MAX_NUMEL + 1, dtype=torch.bool)}],
                [{"ok": {(1,): 2}}], [{"ok": torch.ones(2, requires_grad=True)}]):
        torch.save(bad, path)
        with pytest.raises(OutcomeError):
            load_outcomes(path)


# ------------------------------------------------------------- predictions committed first

def _submitted(record_text, count=5, reveal_count=None):
    cells = [{"cell_type": "code", "execution_count": count, "source": "check.x(prediction)",
              "metadata": {"nbgrader": {"grade_id": "ch01_temperature_test"}},
              "outputs": [{"output_type": "stream", "name": "stdout", "text": record_text}]}]
    if reveal_count is not None:
        cells.append({"cell_type": "code", "execution_count": reveal_count, "source": "",
                      "metadata": {"nbgrader": {"grade_id": "ch01_reveal"}}, "outputs": []})
    return {"cells": cells}


def test_the_grader_judges_the_commit_the_notebook_recorded():
    from types import SimpleNamespace

    from course_lib.checks import ch01, commit_info, parse_records
    from course_lib.checks._predict import record_line
    from course_tools.grader import predictions
    from course_tools.grader.probes import Verdict

    line = record_line("temperature_prediction", 4, {"cold": 40.0, "hot": 10.0})
    assert parse_records(line + "\n✔ ...") == {
        "temperature_prediction": (4, {"cold": 40.0, "hot": 10.0})}
    assert parse_records("📌 Recorded (first run of x, at [1]; later edits do not change it): "
                         "__import__('os')") == {}  # literal_eval only: nothing runs
    assert commit_info("ch01.temperature_prediction") == {"reveals": (), "kind": "commit"}
    assert commit_info("ch01.similarity_scores") is None
    call = SimpleNamespace(check=ch01.temperature_prediction)
    plan = SimpleNamespace(cells=[SimpleNamespace(role="probe", call=call,
                                                  grade_id="ch01_temperature_test")])
    rerun = {0: Verdict(True, "the re-run value", [])}
    got = predictions.review(_submitted(line), plan, rerun)[0]
    assert got.passed and "you predicted 40.00" in got.message   # the record, not the re-run
    got = predictions.review(_submitted("no record here"), plan, rerun)[0]
    assert not got.passed and "holds no committed answer" in got.message
    flagged = {0: Verdict(False, "x", ["a forged result"])}
    assert predictions.review(_submitted(line), plan, flagged)[0].flags == ["a forged result"]
    # a revealing cell that ran before the commit
    info = {"reveals": ("ch01_reveal",), "kind": "commit"}
    cells = predictions.submitted(_submitted(line, reveal_count=3))
    got = predictions.judge_record(ch01.temperature_prediction, "ch01_temperature_test", cells,
                                   info, [])
    assert not got.passed and "ran (at [3]) before your commit (at [4])" in got.message


def test_judges_in_threads_of_one_process_run_one_at_a_time():
    """The grader judges submissions from threads; judges measure with torch's process-wide
    profiler and FLOP counter, so two must never overlap (two chapter 08 submissions at once
    once crashed the grader)."""
    from course_lib.checks._judging import _guarded

    inside, overlaps, start = [], [], threading.Barrier(2)

    def judge(cases, outcomes):
        overlaps.append(bool(inside))
        inside.append(1)
        threading.Event().wait(0.05)
        inside.pop()
        return "ok"

    guarded = _guarded(judge, "judge")
    outcome = [{"ok": 1}]

    def run():
        start.wait()
        for _ in range(3):
            guarded([None], outcome)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert overlaps == [False] * 6
