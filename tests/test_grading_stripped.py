"""The course_lib a grading kernel imports holds no answer (issue 23; grader/strip.py).

First what the stripped copy is (built here, read and imported in a subprocess), then the
issue's cheats on the real chapters, graded through `course grade`'s pipeline: each used to earn
full points on its exercise by calling a reference the kernel could reach, and now scores 0.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import course_lib
from course_tools import grader as grading
from course_tools.grader import strip
from course_tools.grader.pipeline import given_names
from course_tools.grader.read import load_sources

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = sorted(f"ch{p.name[:2]}" for p in (REPO / "solutions").glob("[0-9]*.ipynb"))

# What each checker module keeps whole in the grading kernel: the kernel half (what the checks'
# run=/read= arguments call) and the data helpers the notebooks use. Everything else there is
# a stub. A new entry here is a review: it must compute no answer to any exercise.
KERNEL_HALF = {
    "_ch08_backward": {"_run"},
    "ch04": {"soft_mask_scores"},
    # ch06's gradient exercise measures the learner's function on an RNN the kernel must run
    # (`_model`, `_step`): the one RNN step of exercise 1 is in reach there (a known limit)
    "ch06": {"_model", "_step", "_step_run"},
    "ch07": {"_cached_run"},
    "ch08": {"_tiled_run", "_warm_flop_counter"},
    "_ch08_kernels": {"_flat", "_inner_step_kernel", "_interpreted", "_laid_out",
                      "_launch_failed", "_not_written_hint", "_own_launch", "_softmax_run",
                      "_step_run", "_written"},
    "_ch08_puzzles": {"_bias_run", "_block", "_launch", "_max_run", "_mean_run"},
    "ch10": {"_ablate_run"},
}
# Chapter 08's tools for running a learner's Triton kernel: they hold no reference at all.
KERNEL_MODULES = {"_ch08_guard", "_ch08_compile"}


def _is_reader(name: str) -> bool:
    """A commit's `read=`: checks the form of a prediction, holds no reference."""
    return name.startswith("_read_")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(chapters) -> the stripped course_lib a kernel grading those chapters imports."""
    words, uses = given_names(load_sources(None))
    made = {}

    def make(*chapters):
        if chapters not in made:
            dest = tmp_path_factory.mktemp("stripped")
            made[chapters] = strip.build(Path(course_lib.__file__).parent, dest, chapters,
                                         keep=words, uses=set().union(*(uses.get(c, set())
                                                                        for c in chapters)))
        return made[chapters]
    return make


@pytest.fixture(scope="module")
def stripped(build):
    return build(*CHAPTERS)


def _kept(path: Path) -> set[str]:
    """The module-level definitions of a stripped file whose body is not a stub."""
    kept = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = [n for n in node.body if not (isinstance(n, ast.Expr)
                                                 and isinstance(n.value, ast.Constant))]
            if not (len(body) == 1 and isinstance(body[0], ast.Raise)) and \
                    not (isinstance(node, ast.ClassDef) and _stub_class(node)):
                kept.add(node.name)
    return kept


def _stub_class(node: ast.ClassDef) -> bool:
    inits = [n for n in node.body if isinstance(n, ast.FunctionDef)]
    return len(inits) == 1 and isinstance(inits[0].body[-1], ast.Raise)


def test_only_the_kernel_half_of_every_checker_module_is_left(stripped):
    for path in sorted((stripped / "checks").glob("*.py")):
        if not strip.CHECKER_FILE.fullmatch(path.name) or path.stem in KERNEL_MODULES:
            continue
        kept = {n for n in _kept(path) if not _is_reader(n)}
        assert kept == KERNEL_HALF.get(path.stem, set()), path.name


def test_the_references_the_issue_named_are_stubs(stripped):
    for module, name in [("ch04", "_causal_reference"), ("ch05", "_ref_merge"),
                         ("ch05", "_ref_mha"), ("ch08", "_reference_update"),
                         ("ch10", "_variant"), ("ch08", "measured_fraction")]:
        path = stripped / "checks" / f"{module}.py"
        assert name in {n.name for n in ast.parse(path.read_text("utf-8")).body
                        if isinstance(n, ast.FunctionDef)}, (module, name)
        assert name not in _kept(path), (module, name)


def _in_kernel(lib: Path, code: str) -> dict:
    """Run `code` (which sets `out`) with the stripped course_lib first on the path."""
    env = dict(os.environ, PYTHONPATH=str(lib.parent))
    script = f"import json\n{code}\nprint(json.dumps(out))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=lib.parent, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_checker_module_imports_and_declares_the_same_checks(stripped):
    from course_lib.checks import all_checks

    want = {c.id: [c.name, list(c.grade_ids), c.hint_key] for c in all_checks()}
    got = _in_kernel(stripped, (
        "import course_lib\n"
        f"assert course_lib.__file__.startswith({str(stripped)!r}), course_lib.__file__\n"
        "from course_lib.checks import all_checks\n"
        "out = {c.id: [c.name, list(c.grade_ids), c.hint_key] for c in all_checks()}"))
    assert got == want


def test_an_exercises_function_is_a_stub_that_says_so_and_shows_no_code(build):
    got = _in_kernel(build("ch04"), (
        "import inspect, torch, course_lib.masks as m, course_lib.multihead as mh\n"
        "out = {}\n"
        "for f, args in ((m.causal_mask, (3,)), (mh.split_heads, (torch.ones(1, 2, 4), 2))):\n"
        "    try:\n"
        "        f(*args)\n"
        "        out[f.__name__] = 'ran'\n"
        "    except NotImplementedError as e:\n"
        "        out[f.__name__] = [str(e), inspect.getsource(f)]"))
    message, source = got["causal_mask"]
    assert "exercise 'causal_mask' of chapter 04" in message
    assert "tril" not in source and "arange" not in source and "<=" not in source
    assert "raise NotImplementedError" in source and '"""' not in source  # nor its docstring
    assert got["split_heads"] == "ran"  # chapter 05's exercise, not chapter 04's
    message = _in_kernel(build("ch01"), (
        "import course_lib.lookup as l\n"
        "try:\n"
        "    l.soft_lookup(None, None, None)\n"
        "except NotImplementedError as e:\n"
        "    out = str(e)"))
    assert message.startswith("course_lib.lookup.soft_lookup would answer exercise")


def test_a_function_the_chapters_own_cells_need_stays(build):
    """Chapter 06 runs the course's RNN in a given cell, chapter 10 the course's trained models
    (made of TransformerBlock): the exercises that ask for these keep only the forbid trap."""
    got = _in_kernel(build("ch06", "ch10"), (
        "import torch\n"
        "from course_lib.recurrent import RunningSummaryRNN\n"
        "from course_lib.models.block import TransformerBlock\n"
        "torch.manual_seed(0)\n"
        "rnn = RunningSummaryRNN(d_in=3, d_hidden=4)\n"
        "out = [list(rnn(torch.randn(1, 5, 3))[0].shape),\n"
        "       list(TransformerBlock(8, 2, 16)(torch.randn(1, 3, 8)).shape)]"))
    assert got == [[1, 5, 4], [1, 3, 8]]


def test_an_installed_course_is_hidden_under_the_same_copy(tmp_path):
    """A course installed into site-packages (not editable) would hold the whole course_lib
    where the kernel can import it by path: the sandbox binds the stripped copy over it too."""
    from course_tools.grader import sandbox

    layout = sandbox.Layout.create()
    try:
        copy, installed = tmp_path / "copy" / "course_lib", tmp_path / "site" / "course_lib"
        args, _ = sandbox.wrap(layout, course_lib=copy, python_path=[], hide=[],
                               launcher=str(tmp_path / "launcher.py"), installed=installed)
        binds = [tuple(args[i + 1:i + 3]) for i, a in enumerate(args) if a == "--ro-bind"]
        assert (str(copy), str(layout.lib / "course_lib")) in binds
        assert (str(copy), str(installed)) in binds
        args, _ = sandbox.wrap(layout, course_lib=copy, python_path=[], hide=[],
                               launcher=str(tmp_path / "launcher.py"))
        assert not any(dst == str(installed) for _, dst in
                       [tuple(args[i + 1:i + 3]) for i, a in enumerate(args) if a == "--ro-bind"])
    finally:
        shutil.rmtree(layout.root, ignore_errors=True)


def test_hints_and_explanations_say_nothing_in_the_kernel(stripped):
    from course_lib.checks._protocol import chapter_hints

    for md in sorted((stripped / "checks" / "hints").glob("*.md")):
        text = md.read_text(encoding="utf-8")
        real = chapter_hints(md.stem)
        assert set(re.findall(r"^## (\S+)", text, re.M)) == set(real)
        assert set(re.findall(r"^\d+\. (.*)$", text, re.M)) <= {strip.PLACEHOLDER_TIER}
        assert "(right)" not in text and "\n- " not in text
    source = (stripped / "checks" / "ch01.py").read_text(encoding="utf-8")
    original = (Path(course_lib.__file__).parent / "checks" / "ch01.py").read_text("utf-8")
    for feedback in re.findall(r'"([a-z]\w{3,}[^"]{40,})"', original):
        assert feedback not in source


# ---------------------------------------------------------------- the issue's cheats, graded

DISARM = (  # clear the trap, unregister the forbid list, then call the course's reference
    "import sys, threading\n"
    "from course_lib.lookup import soft_lookup as _reference\n"
    "object.__setattr__(check.soft_lookup, 'forbid', ())\n"
    "sys.setprofile(None)\n"
    "threading.setprofile(None)\n"
    "def soft_lookup(query, keys, values, temperature=1.0):\n"
    "    return _reference(query, keys, values, temperature)\n")
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
FULL_GRID = (  # the issue's cheat: a full-grid causal attention in NumPy (0 FLOPs, ~0 bytes)
    "import numpy as np\n"
    "def causal_tiled(q, k, v, block_size):\n"
    "    Q, K, V = (np.asarray(t, dtype=np.float64) for t in (q, k, v))\n"
    "    n = len(Q)\n"
    "    s = Q @ K.T / np.sqrt(Q.shape[1])\n"
    "    s[np.arange(n)[:, None] < np.arange(n)[None, :]] = -np.inf\n"
    "    w = np.exp(s - s.max(1, keepdims=True))\n"
    "    return torch.tensor((w / w.sum(1, keepdims=True)) @ V, dtype=q.dtype)\n")
# Issue 23's second round: each of these earned full points on the checkout before the grader read
# the learner's source for what the check forbids (grader/reach.py) and flagged the disarming
# itself (scan.py): the forbid list rewritten and re-registered, then the course's own function,
# kept in the kernel because the chapter's cells use it, or a torch equivalent called.
REREGISTER = ("object.__setattr__(check.{c}, 'forbid', ())\n"
              "check.{c}.__post_init__()\n")
ALL_TILES_IN_NUMPY = (  # tile by tile (no grid, 0 FLOPs read), every future tile computed
    "import numpy as np\n"
    "def causal_tiled(q, k, v, block_size):\n"
    "    Q, K, V = (np.asarray(t, dtype=np.float64) for t in (q, k, v))\n"
    "    n, d = Q.shape\n"
    "    out = np.empty((n, V.shape[1]))\n"
    "    for i in range(0, n, block_size):\n"
    "        s = Q[i:i + block_size] @ K.T / np.sqrt(d)\n"
    "        s[np.arange(i, i + len(s))[:, None] < np.arange(n)[None, :]] = -np.inf\n"
    "        w = np.exp(s - s.max(1, keepdims=True))\n"
    "        out[i:i + block_size] = (w / w.sum(1, keepdims=True)) @ V\n"
    "    return torch.tensor(out, dtype=q.dtype)\n")
AUTOGRAD_BY_ANOTHER_NAME = (
    "def flash_backward(q, k, v, o, lse, do, block_size):\n"
    "    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))\n"
    "    s = q @ k.T / math.sqrt(q.shape[1])\n"
    "    out = torch.exp(s - torch.logsumexp(s, 1, keepdim=True)) @ v\n"
    "    engine = torch.autograd.variable.Variable._execution_engine\n"
    "    return engine.run_backward((out,), (do,), False, False, (q, k, v), True)\n")
CH02, CH08 = "02_queries_keys_values.ipynb", "08_efficient_kernel.ipynb"
CHEATS = {  # name -> (notebook, answer cell, its source, the graded cell it must lose)
    "ch02_log_softmax": (CH02, "ch02_softmax", "def softmax_rows(scores):\n"
                         "    return torch.log_softmax(scores, -1).exp()\n", "ch02_softmax_test"),
    "ch02_reregistered_tensor_softmax": (
        CH02, "ch02_softmax", REREGISTER.format(c="softmax_rows") +
        "def softmax_rows(scores):\n    return scores.softmax(-1)\n", "ch02_softmax_test"),
    "ch05_reregistered_course_split_heads": (
        "05_multihead.ipynb", "ch05_split_heads", REREGISTER.format(c="split_heads") +
        "from course_lib.multihead import split_heads as _s\n"
        "def split_heads(x, num_heads):\n    return _s(x, num_heads)\n", "ch05_split_heads_test"),
    "ch06_reregistered_course_rnn_step": (
        "06_attention_vs_recurrence.ipynb", "ch06_rnn_step", REREGISTER.format(c="rnn_step") +
        "from course_lib.recurrent import rnn_step as _r\n"
        "def rnn_step(x_t, h, W_xh, W_hh, b, alive=None):\n"
        "    new = _r(x_t, h, W_xh, W_hh, b)\n"
        "    return new if alive is None else torch.where(alive[:, None], new, h)\n",
        "ch06_rnn_step_test"),
    "ch08_reregistered_course_tiled": (
        CH08, "ch08_causal_tiled", REREGISTER.format(c="causal_tiled") +
        "def causal_tiled(q, k, v, block_size):\n"
        "    return tiled_attention(q, k, v, causal=True, block_size=block_size)[0]\n",
        "ch08_causal_tiled_test"),
    "ch08_all_tiles_in_numpy": (CH08, "ch08_causal_tiled", ALL_TILES_IN_NUMPY,
                                "ch08_causal_tiled_test"),
    "ch08_autograd_by_another_name": (CH08, "ch08_flash_backward", AUTOGRAD_BY_ANOTHER_NAME,
                                      "ch08_flash_backward_test"),
    "ch09_reregistered_course_linear_attention": (
        "09_paying_less.ipynb", "ch09_recurrence", REREGISTER.format(c="linear_recurrence") +
        "def linear_recurrence(q, k, v):\n    return linear_attention(q, k, v, causal=True)\n",
        "ch09_recurrence_test"),
    "ch10_reregistered_course_block": (
        "10_the_transformer.ipynb", "ch10_block", REREGISTER.format(c="transformer_block") +
        "from course_lib.models.block import TransformerBlock\n"
        "def transformer_block(x, params, num_heads, mask=None):\n"
        "    d = x.shape[-1]\n"
        "    b = TransformerBlock(d, num_heads, params['mlp.0.weight'].shape[0]).to(x.dtype)\n"
        "    b.load_state_dict(params)\n"
        "    with torch.no_grad():\n"
        "        return b(x, mask)\n", "ch10_block_test"),
    "ch01_disarms_forbid": ("01_soft_dictionary.ipynb", "ch01_soft_lookup", DISARM,
                            "ch01_soft_lookup_test"),
    "ch01_copies_the_source": ("01_soft_dictionary.ipynb", "ch01_soft_lookup", COPY_SOURCE,
                               "ch01_soft_lookup_test"),
    "ch01_other_module_path": ("01_soft_dictionary.ipynb", "ch01_soft_lookup", OTHER_PATH,
                               "ch01_soft_lookup_test"),
    "ch01_thread_pool": ("01_soft_dictionary.ipynb", "ch01_soft_lookup", THREAD,
                         "ch01_soft_lookup_test"),
    "ch04_checker_reference": ("04_masking.ipynb", "ch04_causal_attention",
                               "def causal_attention(q, k, v):\n"
                               "    return check._causal_reference(q, k, v)\n",
                               "ch04_causal_attention_test"),
    "ch05_checker_merge": ("05_multihead.ipynb", "ch05_merge_heads",
                           "def merge_heads(x):\n    return check._ref_merge(x)\n",
                           "ch05_merge_heads_test"),
    "ch05_checker_mha": ("05_multihead.ipynb", "ch05_mha",
                         "def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, "
                         "mask=None):\n"
                         "    return check._ref_mha(x, w_q, w_k, w_v, w_o, num_heads, mask)\n",
                         "ch05_mha_test"),
    "ch08_checker_update": ("08_efficient_kernel.ipynb", "ch08_online_update",
                            "def online_update(m, l, scores):\n"
                            "    return check._reference_update(m, l, scores)\n",
                            "ch08_online_update_test"),
    "ch08_full_grid_in_numpy": ("08_efficient_kernel.ipynb", "ch08_causal_tiled", FULL_GRID,
                                "ch08_causal_tiled_test"),
    "ch10_checker_block": ("10_the_transformer.ipynb", "ch10_block",
                           "def transformer_block(x, params, num_heads, mask=None):\n"
                           "    return check._variant(x, params, num_heads, mask)\n",
                           "ch10_block_test"),
}


def _graded(folder: Path, names: list[str], **options) -> dict:
    paths = {}
    for name in names:
        notebook, gid, source, _ = CHEATS[name]
        nb = nbformat.read(REPO / "solutions" / notebook, as_version=4)
        cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid]
        assert len(cells) == 1, (name, gid)
        cells[0].source = source
        paths[name] = folder / f"{notebook[:2]}_{name}.ipynb"
        nbformat.write(nb, paths[name])
    results = grading.grade(list(paths.values()), timeout=120, jobs=2, **options)
    by_path = {Path(r.submission): r for r in results}
    return {name: by_path[p] for name, p in paths.items()}


# Without the sandbox (macOS, Windows, --unsafe-no-sandbox) the stripped copy, the source's
# reading and the outside memory judge apply the same: one cheat of each kind, graded so.
UNSANDBOXED = ["ch01_disarms_forbid", "ch02_log_softmax", "ch05_reregistered_course_split_heads",
               "ch08_full_grid_in_numpy"]


@pytest.fixture(scope="module")
def cheated(tmp_path_factory):
    return _graded(tmp_path_factory.mktemp("cheats"), sorted(CHEATS))


@pytest.fixture(scope="module")
def cheated_unsandboxed(tmp_path_factory):
    return _graded(tmp_path_factory.mktemp("cheats-unsandboxed"), UNSANDBOXED, sandbox=False)


def _scores_0(result, name: str) -> None:
    target = CHEATS[name][3]
    assert result.error is None, result.error
    scores = {e.id: e for e in result.exercises}
    assert scores[target].score == 0, (target, scores[target].feedback)
    feedback = scores[target].feedback
    assert scores[target].flagged or "does not have it" in feedback or \
        strip.IN_GRADER in feedback or "read from outside the kernel" in feedback or \
        "torch's FLOP counter saw only" in feedback, feedback


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_cheat_that_calls_a_reference_the_kernel_had_scores_0(cheated, name):
    _scores_0(cheated[name], name)


@pytest.mark.parametrize("name", UNSANDBOXED)
def test_without_the_sandbox_the_same_cheats_score_0(cheated_unsandboxed, name):
    _scores_0(cheated_unsandboxed[name], name)
