"""What the learner's code a check runs names, read on the grader's side (grader/reach.py), and
what the scan leaves alone (grader/scan.py; the cheats it names are in test_grading_attacks.py),
on the real chapters' notebooks with one answer replaced: no kernel runs here."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_tools.grader.assemble import assemble
from course_tools.grader.calls import checker_names, imported_names, setup_sources
from course_tools.grader.reach import match, reach_plan
from course_tools.grader.read import load_sources
from course_tools.grader.scan import scan_plan, suspicious

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sources():
    return load_sources(None)


def _flags(sources, notebook: str, gid: str, answer: str, added: str | None = None):
    """(flags on the exercise answered by `gid` from reach, flags from the scan) of the solution
    notebook with that answer replaced and, optionally, a cell the learner added before it."""
    source = sources[notebook]
    nb = nbformat.read(source.path, as_version=4)
    at = next(i for i, c in enumerate(nb.cells)
              if c.metadata.get("nbgrader", {}).get("grade_id") == gid)
    nb.cells[at].source = answer
    if added is not None:
        nb.cells.insert(at, nbformat.v4.new_code_cell(added))
    plan = assemble(source, nb, hidden=True)
    reached = reach_plan(plan.cells, imported_names(setup_sources(source)))
    exercise = next(c.exercise for c in plan.cells if c.role == "answer" and c.grade_id == gid)
    mine = [f for i, found in reached.items() if plan.cells[i].grade_id == exercise
            for f in found]
    others = [f for i, found in reached.items() if plan.cells[i].grade_id != exercise
              for f in found]
    assert others == [], others  # a flag costs only the exercise that forbids the name
    scanned = [f for found in scan_plan(plan.cells, checker_names(source)).values() for f in found]
    return mine, scanned


CH02, CH05, CH08 = "02_queries_keys_values.ipynb", "05_multihead.ipynb", "08_efficient_kernel.ipynb"
CH09, CH10 = "09_paying_less.ipynb", "10_the_transformer.ipynb"
CH11 = "11_reading_a_transformer.ipynb"
SOFTMAX_ROWS = "def softmax_rows(scores):\n    return {}\n"


@pytest.mark.parametrize("body", [
    "torch.softmax(scores, -1)",
    "scores.softmax(-1)",
    "torch.log_softmax(scores, -1).exp()",
    "torch.nn.functional.gumbel_softmax(scores, hard=False)",
    "torch.special.softmax(scores, -1)",
    "torch.nn.Softmax(-1)(scores)",
    "torch._C._nn.softmax(scores, -1)",
    "getattr(torch, 'softmax')(scores, -1)",
    "torch.__dict__['softmax'](scores, -1)",
])
def test_a_forbidden_function_by_any_of_its_names_is_flagged(sources, body):
    mine, _ = _flags(sources, CH02, "ch02_softmax", SOFTMAX_ROWS.format(body))
    assert mine and all("oftmax`" in f.split("rules out")[1] for f in mine), mine


def test_a_helper_elsewhere_is_followed(sources):
    """The check runs softmax_rows, which calls a helper of an added cell, which aliases an
    import of a third."""
    added = ("import torch.nn.functional as G\n_h = G.softmax\n"
             "def helper(t):\n    return _h(t, -1)\n")
    mine, _ = _flags(sources, CH02, "ch02_softmax", SOFTMAX_ROWS.format("helper(scores)"), added)
    assert any("`.softmax`" in f for f in mine), mine
    mine, _ = _flags(sources, CH02, "ch02_softmax", SOFTMAX_ROWS.format("helper(scores)"),
                     "from torch import softmax as s\ndef helper(t):\n    return s(t, -1)\n")
    assert any("an import of `softmax`" in f for f in mine), mine


def test_code_inside_a_timing_magic_is_read(sources):
    mine, _ = _flags(sources, CH02, "ch02_softmax",
                     "%time softmax_rows = lambda scores: torch.softmax(scores, -1)\n")
    assert mine, mine


def test_the_learners_own_names_and_a_same_named_allowed_function_are_not_flagged(sources):
    mine, _ = _flags(sources, CH02, "ch02_softmax", (
        "class Softmaxer:\n"
        "    def softmax(self, s):\n"
        "        e = torch.exp(s - s.amax(-1, keepdim=True))\n"
        "        return e / e.sum(-1, keepdim=True)\n"
        "    def __call__(self, s):\n"
        "        return self.softmax(s)\n"
        "softmax_rows = Softmaxer()\n"))
    assert mine == []
    # chapter 09 rules out torch's SDPA (enable_gqa) but builds on the course's, same name
    source = next(c.source for c in nbformat.read(sources[CH09].path, as_version=4).cells
                  if c.metadata.get("nbgrader", {}).get("grade_id") == "ch09_gqa")
    assert _flags(sources, CH09, "ch09_gqa", source)[0] == []
    mine, _ = _flags(sources, CH09, "ch09_gqa", source.replace(
        "out, _ = scaled_dot_product_attention(q_groups, k[:, :, None], v[:, :, None])",
        "out = torch.nn.functional.scaled_dot_product_attention(q_groups, k[:, :, None], "
        "v[:, :, None])"))
    assert any("scaled_dot_product_attention" in f for f in mine), mine


@pytest.mark.parametrize("notebook, gid, answer, name", [
    (CH05, "ch05_split_heads", "from course_lib.multihead import split_heads as s\n"
                               "def split_heads(x, num_heads):\n    return s(x, num_heads)\n",
     "split_heads"),
    (CH05, "ch05_mha", "def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):\n"
                       "    m = MultiHeadAttention(x.shape[-1], num_heads)\n"
                       "    return m(x)\n", "MultiHeadAttention"),
    (CH08, "ch08_causal_tiled", "def causal_tiled(q, k, v, block_size):\n"
                                "    return tiled_attention(q, k, v, causal=True, "
                                "block_size=block_size)[0]\n", "tiled_attention"),
    (CH09, "ch09_recurrence", "def linear_recurrence(q, k, v):\n"
                              "    return linear_attention(q, k, v, causal=True)\n",
     "linear_attention"),
    (CH10, "ch10_block", "from course_lib.models.block import TransformerBlock as B\n"
                         "def transformer_block(x, params, num_heads, mask=None):\n"
                         "    return B(x.shape[-1], num_heads, 4 * x.shape[-1])(x, mask)\n",
     "TransformerBlock"),
    (CH10, "ch10_block", "class transformer_block(torch.nn.TransformerEncoderLayer):\n"
                         "    pass\n", "TransformerEncoderLayer"),
    (CH11, "ch11_patch", "from course_lib.multihead import MultiHeadAttention as M\n"
                         "def patched_block(block, clean, ablated, side):\n"
                         "    return M.forward(block.attn, block.ln1(clean))\n",
     "MultiHeadAttention"),
    (CH08, "ch08_flash_backward", (
        "def flash_backward(q, k, v, o, lse, do, block_size):\n"
        "    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))\n"
        "    out = torch.exp(q @ k.T / math.sqrt(q.shape[1]) - lse[:, None]) @ v\n"
        "    engine = torch.autograd.variable.Variable._execution_engine\n"
        "    return engine.run_backward((out,), (do,), False, False, (q, k, v), True)\n"),
     "backward"),
])
def test_a_function_the_chapter_keeps_working_is_flagged_when_an_answer_uses_it(
        sources, notebook, gid, answer, name):
    mine, _ = _flags(sources, notebook, gid, answer)
    assert any(f"rules out `{name}`" in f for f in mine), mine


def test_a_timing_magic_and_ordinary_dunders_are_not_suspicious():
    for honest in ("%timeit softmax_rows(torch.randn(4, 4))", "%matplotlib inline",
                   "class A(torch.nn.Module):\n    def __init__(self):\n"
                   "        super().__init__()\n"
                   "    def __repr__(self):\n        return type(self).__name__\n",
                   "x = getattr(config, 'd_model')",
                   "import inspect\nprint(inspect.signature(softmax_rows))",
                   "import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n"
                   "    traceback.print_exc()",
                   "class B:\n    def __init__(self):\n        for c in 'qkv':\n"
                   "            setattr(self, 'w_' + c, None)\n"
                   "    def w(self, c):\n        return getattr(self, 'w_' + c)\n"):
        assert suspicious(honest, {"check"}) == [], honest


def test_a_name_matches_whole_when_short_and_inside_longer_names_when_long():
    assert match("grad", {"grad"}) == "grad" and match("no_grad", {"grad"}) is None
    assert match("RNN", {"RNN"}) == "RNN" and match("GRU", {"RNN"}) is None
    assert match("log_softmax", {"softmax"}) == "softmax"
    assert match("MultiheadAttention", {"MultiHeadAttention"}) == "MultiHeadAttention"
    assert match("run_backward", {"backward"}) == "backward"


def test_no_set_up_cell_binds_a_name_an_answer_could_keep_by_a_dead_assignment(sources):
    """A learner's own binding of a name exempts it (`def softmax_rows`); a set-up cell's name
    bound to a forbidden function is flagged even then (`if False: tiled_attention = 0` must not
    hide the course's tiled_attention). Every solution passes that rule (reach finds nothing)."""
    for name, source in sorted(sources.items()):
        nb = nbformat.read(source.path, as_version=4)
        plan = assemble(source, nb, hidden=True)
        assert reach_plan(plan.cells, imported_names(setup_sources(source))) == {}, name
    mine, _ = _flags(sources, CH08, "ch08_causal_tiled",
                     "if False:\n    tiled_attention = None\n"
                     "def causal_tiled(q, k, v, block_size):\n"
                     "    return tiled_attention(q, k, v, causal=True, block_size=block_size)[0]\n")
    assert any("rules out `tiled_attention`" in f for f in mine), mine


def test_nbgraders_preprocessor_flags_what_course_grade_would(sources):
    """for_nbgrader.source_flags: the same flags per graded cell as `course grade` scores them
    (a reach flag on its exercise only; a scan flag on every exercise from its cell on)."""
    from course_tools.grader.for_nbgrader import source_flags

    nb = nbformat.read(sources[CH02].path, as_version=4)
    assert source_flags(nb, CH02, sources) == {}
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                  == "ch02_softmax")
    answer.source = SOFTMAX_ROWS.format("torch.softmax(scores, -1)")
    assert set(source_flags(nb, CH02, sources)) == {"ch02_softmax_test"}
    answer.source = "import threading\n" + answer.source
    flagged = source_flags(nb, CH02, sources)
    assert "ch02_scores_test" not in flagged  # judged before the cell
    assert {"ch02_softmax_test", "ch02_self_attention_test"} <= set(flagged)


# Issue 23's cheats that earned full points before the grader read the learner's source: once
# graded whole in a kernel each, they are judged here, where their defence lives. A flag from
# reach costs the exercise its check forbids, one from the scan every exercise judged from its
# cell on (tests/test_grader_stages.py: a flagged exercise scores 0). The cheats only a kernel
# shows are graded in the test run's shared batch (tests/graded_batch.py).
REREGISTER = "object.__setattr__(check.{c}, 'forbid', ())\ncheck.{c}.__post_init__()\n"
COPY_SOURCE = (  # the reference's source, one line lower, as a new function of the notebook
    "import inspect, course_lib.lookup as _L\n"
    "_ns = dict(vars(_L))\n"
    "exec('\\n' + inspect.getsource(_L.soft_lookup).replace('def soft_lookup', 'def _mine'), _ns)\n"
    "def soft_lookup(query, keys, values, temperature=1.0):\n"
    "    return _ns['_mine'](query, keys, values, temperature)\n")
OTHER_PATH = (  # the same file under another module name
    "import importlib.util, course_lib.lookup as _L\n"
    "_spec = importlib.util.spec_from_file_location('my_lookup', _L.__file__)\n"
    "_mod = importlib.util.module_from_spec(_spec)\n"
    "_spec.loader.exec_module(_mod)\n"
    "soft_lookup = _mod.soft_lookup\n")
THREAD = (  # a pool warmed before the check runs the reference where no trap looks
    "from concurrent.futures import ThreadPoolExecutor\n"
    "from course_lib.lookup import soft_lookup as _reference\n"
    "_pool = ThreadPoolExecutor(1)\n"
    "_pool.submit(int).result()\n"
    "def soft_lookup(query, keys, values, temperature=1.0):\n"
    "    return _pool.submit(_reference, query, keys, values, temperature).result()\n")
AUTOGRAD_BY_ANOTHER_NAME = (
    "def flash_backward(q, k, v, o, lse, do, block_size):\n"
    "    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))\n"
    "    s = q @ k.T / math.sqrt(q.shape[1])\n"
    "    out = torch.exp(s - torch.logsumexp(s, 1, keepdim=True)) @ v\n"
    "    engine = torch.autograd.variable.Variable._execution_engine\n"
    "    return engine.run_backward((out,), (do,), False, False, (q, k, v), True)\n")
CH01, CH06 = "01_soft_dictionary.ipynb", "06_attention_vs_recurrence.ipynb"
INTERNALS = "reaches into the interpreter's internals (`.__setattr__`)"
# name -> (notebook, answer cell, its source, words of a reach flag, words of a scan flag)
SOURCE_CHEATS = {
    "ch02_log_softmax": (CH02, "ch02_softmax", SOFTMAX_ROWS.format(
        "torch.log_softmax(scores, -1).exp()"), "rules out `log_softmax`", None),
    "ch02_reregistered_tensor_softmax": (
        CH02, "ch02_softmax", REREGISTER.format(c="softmax_rows") +
        SOFTMAX_ROWS.format("scores.softmax(-1)"), "rules out `softmax`", INTERNALS),
    "ch05_reregistered_course_split_heads": (
        CH05, "ch05_split_heads", REREGISTER.format(c="split_heads") +
        "from course_lib.multihead import split_heads as _s\n"
        "def split_heads(x, num_heads):\n    return _s(x, num_heads)\n",
        "rules out `split_heads`", INTERNALS),
    "ch06_reregistered_course_rnn_step": (
        CH06, "ch06_rnn_step", REREGISTER.format(c="rnn_step") +
        "from course_lib.recurrent import rnn_step as _r\n"
        "def rnn_step(x_t, h, W_xh, W_hh, b, alive=None):\n"
        "    new = _r(x_t, h, W_xh, W_hh, b)\n"
        "    return new if alive is None else torch.where(alive[:, None], new, h)\n",
        "rules out `rnn_step`", INTERNALS),
    "ch08_reregistered_course_tiled": (
        CH08, "ch08_causal_tiled", REREGISTER.format(c="causal_tiled") +
        "def causal_tiled(q, k, v, block_size):\n"
        "    return tiled_attention(q, k, v, causal=True, block_size=block_size)[0]\n",
        "rules out `tiled_attention`", INTERNALS),
    "ch08_autograd_by_another_name": (CH08, "ch08_flash_backward", AUTOGRAD_BY_ANOTHER_NAME,
                                      "rules out `backward`", None),
    "ch09_reregistered_course_linear_attention": (
        CH09, "ch09_recurrence", REREGISTER.format(c="linear_recurrence") +
        "def linear_recurrence(q, k, v):\n    return linear_attention(q, k, v, causal=True)\n",
        "rules out `linear_attention`", INTERNALS),
    "ch10_reregistered_course_block": (
        CH10, "ch10_block", REREGISTER.format(c="transformer_block") +
        "from course_lib.models.block import TransformerBlock\n"
        "def transformer_block(x, params, num_heads, mask=None):\n"
        "    d = x.shape[-1]\n"
        "    b = TransformerBlock(d, num_heads, params['mlp.0.weight'].shape[0]).to(x.dtype)\n"
        "    b.load_state_dict(params)\n"
        "    with torch.no_grad():\n"
        "        return b(x, mask)\n", "rules out `TransformerBlock`", INTERNALS),
    "ch01_copies_the_source": (CH01, "ch01_soft_lookup", COPY_SOURCE, "rules out `soft_lookup`",
                               "runs code made from a string (exec)"),
    "ch01_other_module_path": (CH01, "ch01_soft_lookup", OTHER_PATH, "rules out `soft_lookup`",
                               "imports by a computed name (importlib)"),
    "ch01_thread_pool": (CH01, "ch01_soft_lookup", THREAD, "rules out `soft_lookup`",
                         "runs code in another thread or process (concurrent.futures)"),
}


@pytest.mark.parametrize("name", sorted(SOURCE_CHEATS))
def test_the_issues_cheats_are_caught_by_reading_the_source(sources, name):
    notebook, gid, answer, reach_words, scan_words = SOURCE_CHEATS[name]
    mine, scanned = _flags(sources, notebook, gid, answer)
    assert any(reach_words in f for f in mine), mine
    if scan_words is None:
        assert scanned == [], scanned
    else:
        assert any(scan_words in f and f"`{gid}`" in f for f in scanned), scanned
