"""The explorers work in a real JupyterLab: run a lecture notebook's explorers in headless
Chromium, check no cell errored and every explorer's controls rendered, move a control and see
the figure redraw.

Each lecture notebook that shows an explorer is copied (outputs cleared, the committed file is
never touched) into a fresh lab of its own (see conftest.py), keeping the cells its explorers
need (`explorer_slice`: the set-up cell, each explorer's cell, and every earlier cell that binds
a name one of those reads). That every cell of a lecture runs without an error is nbval's test
of the same notebook in the same environment; what only a browser shows is tested here.
Screenshots land in tests/browser/screenshots/ (git-ignored). Needs /usr/bin/chromium; skips
without it.

    .venv/bin/pytest tests/browser            # every lecture that shows an explorer
    .venv/bin/pytest tests/browser -k 01      # one chapter; add -s for per-phase times
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from course_lib.widgets import _WHERE as EXPLORER_FACTORIES

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"

LAB_READY_TIMEOUT_MS = 180_000  # page load, extension loading, kernel start on a busy machine
RUN_ALL_TIMEOUT_MS = 300_000    # the whole notebook (lecture budget: 60 s alone on 2 cores)
REDRAW_TIMEOUT_MS = 60_000

# A `.show()` on something other than pyplot/a figure: how a lecture displays an explorer.
SHOW_CALL = re.compile(r"(?<!plt)(?<!fig)\.show\(\s*\)")
EXPLORER_NAME = re.compile(r"\b(?:Explorer|" + "|".join(EXPLORER_FACTORIES) + r")\b")


def explorer_notebooks() -> list[Path]:
    """Lecture notebooks with a cell that calls `.show()` on an explorer."""
    return [path for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
            if any(cell.cell_type == "code" and is_explorer(cell.source)
                   for cell in nbformat.read(path, as_version=4).cells)]


def is_explorer(source: str) -> bool:
    """A cell that shows an explorer: it names one and calls `.show()`."""
    return bool(EXPLORER_NAME.search(source) and SHOW_CALL.search(source))


class _Binds(ast.NodeVisitor):
    """The names a cell binds for the cells after it: assignments, imports, defs and loop
    targets, but not the locals of its functions, lambdas or comprehensions."""

    def __init__(self):
        self.names: set[str] = set()

    def visit_FunctionDef(self, node):
        self.names.add(node.name)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Import(self, node):
        self.names.update((a.asname or a.name).split(".")[0] for a in node.names)

    visit_ImportFrom = visit_Import

    def visit_Name(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.names.add(node.id)

    def visit_Lambda(self, node):
        pass

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_Lambda


class _Reads(ast.NodeVisitor):
    """The names a cell reads before it binds them itself, in the order Python runs it (an
    assignment's value before its targets, a loop's iterable before its target, a
    comprehension's generators before its element); a lambda's arguments and a comprehension's
    targets are its own. Only these can come from an earlier cell."""

    def __init__(self):
        self.bound: set[str] = set()
        self.names: set[str] = set()

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            if node.id not in self.bound:
                self.names.add(node.id)
        else:
            self.bound.add(node.id)

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_AugAssign(self, node):
        self.visit(node.value)
        if isinstance(node.target, ast.Name) and node.target.id not in self.bound:
            self.names.add(node.target.id)  # x += 1 reads x first
        self.visit(node.target)

    def visit_For(self, node):
        self.visit(node.iter)
        self.visit(node.target)
        for child in node.body + node.orelse:
            self.visit(child)

    def _scope(self, visit):
        """Run `visit` in a scope of its own: what it binds stays inside."""
        outer = set(self.bound)
        visit()
        self.bound = outer

    def _arguments(self, args, body):
        """A function's or lambda's body, in its own scope, with its arguments bound there."""
        def run():
            for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if a is not None:
                    self.bound.add(a.arg)
            for child in body:
                self.visit(child)

        self._scope(run)

    def visit_FunctionDef(self, node):
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(default)
        for decorator in node.decorator_list:
            self.visit(decorator)
        self._arguments(node.args, node.body)
        self.bound.add(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        for base in node.bases + node.decorator_list:
            self.visit(base)
        self._scope(lambda: [self.visit(child) for child in node.body])
        self.bound.add(node.name)

    def _comprehension(self, node, *parts):
        self._scope(lambda: self._generators(node, parts))

    def _generators(self, node, parts):
        for gen in node.generators:
            self.visit(gen.iter)
            self.visit(gen.target)
            for test in gen.ifs:
                self.visit(test)
        for part in parts:
            self.visit(part)

    def visit_ListComp(self, node):
        self._comprehension(node, node.elt)

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node):
        self._comprehension(node, node.key, node.value)

    def visit_Lambda(self, node):
        self._arguments(node.args, [node.body])


def explorer_slice(sources: list[str]) -> list[int]:
    """The code cells (indices into `sources`) an explorer needs: the first (the set-up), each
    explorer's, and, transitively, the last cell before a needed one that binds a name it reads
    (magics are read as IPython runs them)."""
    binds, reads = [], []
    for source in sources:
        tree = ast.parse(TransformerManager().transform_cell(source))
        found = _Binds()
        found.visit(tree)
        binds.append(found.names)
        read = _Reads()
        read.visit(tree)
        reads.append(read.names)
    needed = {0} | {i for i, source in enumerate(sources) if is_explorer(source)}
    todo = sorted(needed)
    while todo:
        i = todo.pop()
        for name in reads[i]:
            binder = next((j for j in range(i - 1, -1, -1) if name in binds[j]), None)
            if binder is not None and binder not in needed:
                needed.add(binder)
                todo.append(binder)
    return sorted(needed)


# ---------------------------------------------------------------- JavaScript run in the page

# Finds the notebook panel for `path` among the lab's main-area widgets; remembers it on window.
FIND_PANEL = """
(path) => {
  const app = window.jupyterapp;
  if (!app || !app.shell) return null;
  for (const widget of app.shell.widgets('main')) {
    if (widget.context && widget.context.path === path && widget.sessionContext && widget.content) {
      window.__coursePanel = widget;
      return widget;
    }
  }
  return null;
}
"""

KERNEL_READY = """
(path) => {
  const find = %s;
  const panel = find(path);
  if (!panel || !panel.context.isReady) return false;
  const session = panel.sessionContext;
  const kernel = session.session && session.session.kernel;
  return session.isReady && !!kernel && kernel.connectionStatus === 'connected'
         && kernel.status === 'idle';
}
""" % FIND_PANEL

RUN_ALL = """
() => {
  const app = window.jupyterapp;
  const panel = window.__coursePanel;
  window.__courseRun = {done: false, error: null};
  app.shell.activateById(panel.id);
  app.commands.execute('notebook:run-all-cells').then(
    () => { window.__courseRun.done = true; },
    (e) => { window.__courseRun.done = true; window.__courseRun.error = String(e); });
}
"""

KERNEL_IDLE = """
() => {
  const session = window.__coursePanel.sessionContext;
  const kernel = session.session && session.session.kernel;
  return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}
"""

RUN_FINISHED = f"() => window.__courseRun.done && ({KERNEL_IDLE})()"

# One record per code cell: execution count, output types and mime types, error text. Also tags
# each cell's node with data-course-cell=<index> so Playwright can find it.
CELL_REPORT = """
() => {
  const cells = window.__coursePanel.content.widgets;
  const report = [];
  cells.forEach((cell, index) => {
    cell.node.setAttribute('data-course-cell', String(index));
    if (cell.model.type !== 'code') return;
    const source = cell.model.sharedModel.getSource();
    const outputs = [];
    const area = cell.model.outputs;
    for (let i = 0; i < area.length; i++) {
      const out = area.get(i).toJSON();
      let text = '';
      if (out.output_type === 'error') text = out.ename + ': ' + out.evalue;
      if (out.output_type === 'stream') text = [].concat(out.text).join('');
      outputs.push({type: out.output_type, name: out.name || null,
                    mimes: Object.keys(out.data || {}), text: text});
    }
    const stderr = Array.from(cell.node.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
      .map(node => node.innerText);
    report.push({index: index, source: source, empty: source.trim() === '',
                 count: cell.model.executionCount, outputs: outputs, stderr: stderr});
  });
  return report;
}
"""

IMAGES_IN_CELL = """
(index) => Array.from(document.querySelectorAll(
    `[data-course-cell="${index}"] .jp-OutputArea-output img`)).map(img => img.src).join('|')
"""

IMAGES_CHANGED = """
([index, before]) => Array.from(document.querySelectorAll(
    `[data-course-cell="${index}"] .jp-OutputArea-output img`)).map(img => img.src).join('|')
  !== before
"""

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def problems_in(report: list[dict]) -> list[str]:
    """Error outputs, tracebacks on stderr, and code cells that never ran."""
    problems = []
    for cell in report:
        first = cell["source"].strip().splitlines()[0][:60] if not cell["empty"] else "empty"
        where = f"cell {cell['index']} ({first})"
        for out in cell["outputs"]:
            if out["type"] == "error":
                problems.append(f"{where} raised {out['text']}")
            elif out["type"] == "stream" and out["name"] == "stderr" and "Traceback" in out["text"]:
                problems.append(f"{where} printed a traceback: {out['text'][-300:]}")
        raised = any(out["type"] == "error" for out in cell["outputs"])
        for text in cell["stderr"] if not raised else []:  # what the page shows, if not said above
            if "Traceback" in text:
                problems.append(f"{where} shows a traceback: {text[-300:]}")
        if not cell["empty"] and cell["count"] is None:
            problems.append(f"{where} did not run (no execution count)")
    return problems


def explorer_cells(report: list[dict]) -> list[int]:
    """Cells whose outputs hold a widget view followed by an image: an explorer's `.show()`."""
    found = []
    for cell in report:
        kinds = [("widget" if WIDGET_MIME in out["mimes"]
                  else "image" if "image/png" in out["mimes"] else "other")
                 for out in cell["outputs"]]
        if "widget" in kinds and "image" in kinds[kinds.index("widget"):]:
            found.append(cell["index"])
    return found


def nudge_control(page, cell) -> str:
    """Move the explorer's first control once, the way a learner would; say what was done.

    One move is one value change, so one redraw: once the figure has changed it is final.
    """
    handle = cell.locator(".widget-slider .noUi-handle").first
    if handle.count():
        readout = cell.locator(".widget-slider .widget-readout").first
        before = readout.inner_text() if readout.count() else None
        # noUiSlider: PageUp/PageDown jump 5 steps (or to the end); go where there is room.
        at_max = handle.evaluate("h => Number(h.getAttribute('aria-valuenow')) >= "
                                 "Number(h.getAttribute('aria-valuemax'))")
        key = "PageDown" if at_max else "PageUp"
        handle.scroll_into_view_if_needed()
        handle.focus()
        page.keyboard.press(key)
        if before is not None:
            page.wait_for_function("([el, text]) => el.innerText !== text",
                                   arg=[readout.element_handle(), before],
                                   timeout=REDRAW_TIMEOUT_MS)
            return f"moved the slider from {before} to {readout.inner_text()} ({key})"
        return f"moved the slider ({key})"
    select = cell.locator(".widget-dropdown select").first
    if select.count():
        options = select.locator("option").all_inner_texts()
        current = select.evaluate("s => s.options[s.selectedIndex].text")
        target = next(o for o in options if o != current)
        select.select_option(label=target)
        target, current = (text.replace("\xa0", " ") for text in (target, current))
        return f"chose {target!r} instead of {current!r} in the dropdown"
    toggles = cell.locator(".widget-toggle-buttons button:not(.mod-active)").first
    if toggles.count():
        label = toggles.inner_text()
        toggles.click()
        return f"clicked the toggle button {label!r}"
    button = cell.locator(".widget-button").first
    if button.count():
        label = button.inner_text()
        button.click()
        return f"clicked the button {label!r}"
    pytest.fail("the explorer shows no slider, dropdown, toggle buttons or button to move")


def run_notebook_in_lab(lab, page, source: Path, shot_name: str, cells=None) -> None:
    """Run the notebook at `source` in the lab (only its code cells numbered in `cells`, when
    given, with every markdown cell), check that nothing failed, and move every explorer."""
    # A scratch copy: outputs, counts and saved widget state cleared, this env's kernel named.
    nb = nbformat.read(source, as_version=4)
    if cells is not None:
        code = [c for c in nb.cells if c.cell_type == "code"]
        keep = {id(code[i]) for i in cells}
        nb.cells = [c for c in nb.cells if c.cell_type != "code" or id(c) in keep]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    SCREENSHOTS.mkdir(exist_ok=True)
    for old in SCREENSHOTS.glob(f"{shot_name}*.png"):  # no stale pictures from an earlier run
        old.unlink()
    rel = f"notebooks/{source.name}"
    (lab.root / "notebooks").mkdir(exist_ok=True)
    nbformat.write(nb, lab.root / rel)
    lecture_dir = REPO / "notebooks"
    extras = lecture_dir.iterdir() if source.parent == lecture_dir else []
    for extra in extras:  # anything a lecture reads from its own folder (data, pictures)
        hidden = extra.name.startswith(".") or extra.name == "__pycache__"
        if extra.suffix != ".ipynb" and not hidden:
            copy = shutil.copytree if extra.is_dir() else shutil.copyfile
            copy(extra, lab.root / "notebooks" / extra.name)

    console = []
    page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}")
            if msg.type == "error" else None)
    page.on("pageerror", lambda err: console.append(f"pageerror: {err}"))

    def context() -> str:
        return ("\n--- browser console errors ---\n" + "\n".join(console[-20:])
                + "\n--- server log ---\n" + lab.log_tail(40))

    clock = [time.monotonic()]

    def lap() -> str:
        clock.append(time.monotonic())
        return f"{clock[-1] - clock[-2]:.1f} s"

    page.goto(f"{lab.url}lab/tree/{rel}", wait_until="domcontentloaded")
    try:
        page.wait_for_function(KERNEL_READY, arg=rel, timeout=LAB_READY_TIMEOUT_MS, polling=250)
    except Exception as e:  # playwright TimeoutError: say what the page was doing
        page.screenshot(path=str(SCREENSHOTS / f"{shot_name}_not_ready.png"))
        pytest.fail(f"notebook {rel} never got a connected, idle kernel: {e}{context()}")

    timings = [f"lab open with an idle kernel: {lap()}"]
    page.evaluate(RUN_ALL)
    try:
        page.wait_for_function(RUN_FINISHED, timeout=RUN_ALL_TIMEOUT_MS, polling=250)
    except Exception as e:
        page.screenshot(path=str(SCREENSHOTS / f"{shot_name}_unfinished.png"))
        pending = [c["index"] for c in page.evaluate(CELL_REPORT)
                   if c["count"] is None and not c["empty"]]
        pytest.fail(f"run-all did not finish in {RUN_ALL_TIMEOUT_MS // 1000} s (cells not run: "
                    f"{pending}): {e}{context()}")
    run = page.evaluate("() => window.__courseRun")
    timings.append(f"run all cells: {lap()}")
    report = page.evaluate(CELL_REPORT)
    problems = problems_in(report)
    if run["error"]:
        problems.append(f"run-all failed: {run['error']}")
    if problems:
        page.screenshot(path=str(SCREENSHOTS / f"{shot_name}_failed.png"))
    assert not problems, "\n".join(problems) + context()

    explorers = explorer_cells(report)
    assert explorers, f"{rel} ran, but no cell shows an explorer (widget view + image)"
    moves = []
    for k, index in enumerate(explorers):
        cell = page.locator(f'[data-course-cell="{index}"]')
        controls = cell.locator(".jp-OutputArea-output .jupyter-widgets.widget-hbox")
        try:
            controls.first.wait_for(state="visible", timeout=REDRAW_TIMEOUT_MS)
        except Exception:
            page.screenshot(path=str(SCREENSHOTS / f"{shot_name}_no_widgets.png"))
            pytest.fail(f"cell {index}: the explorer's controls did not render (is the "
                        "jupyterlab_widgets extension found?):\n"
                        f"{cell.inner_text()[:500]}{context()}")
        cell.scroll_into_view_if_needed()
        before = page.evaluate(IMAGES_IN_CELL, index)
        assert before.startswith("data:image/png"), f"cell {index}: no figure under the controls"
        action = nudge_control(page, cell)
        try:
            page.wait_for_function(IMAGES_CHANGED, arg=[index, before],
                                   timeout=REDRAW_TIMEOUT_MS, polling=100)
        except Exception:
            page.screenshot(path=str(SCREENSHOTS / f"{shot_name}_no_redraw.png"))
            pytest.fail(f"cell {index}: {action}, but the figure did not change{context()}")
        page.wait_for_function(KERNEL_IDLE, timeout=REDRAW_TIMEOUT_MS, polling=100)
        moves.append(f"cell {index}: {action}; the figure redrew ({lap()})")
        cell.scroll_into_view_if_needed()
        suffix = "" if k == 0 else f"_{k + 1}"
        page.screenshot(path=str(SCREENSHOTS / f"{shot_name}{suffix}_lab.png"))
        # the cell alone: code, controls, figure
        cell.screenshot(path=str(SCREENSHOTS / f"{shot_name}{suffix}.png"))

    # After the learner's moves: still no errors anywhere.
    report = page.evaluate(CELL_REPORT)
    problems = problems_in(report)
    assert not problems, "\n".join(problems) + context()
    kernels = lab.kernel_commands()
    env_bin = Path(sys.executable).absolute().parent  # .venv/bin: python, python3, ... live here
    assert kernels and all(Path(cmd[0]).absolute().parent == env_bin for cmd in kernels), (
        f"the notebook ran in {kernels}, not in this environment's python ({env_bin})")
    print(f"\n{source.name}: " + "; ".join(timings + moves))


def test_an_explorer_slice_keeps_what_the_explorer_reads():
    """Without a browser: the cells kept are the set-up, the explorer's, and the last binder
    of each name a kept cell reads (a later rebinding, a function's local, a magic)."""
    sources = ["from course_lib.env import setup_notebook\nsetup_notebook()",
               "import torch\nw = torch.ones(3)",          # 1: binds w, read by 4
               "w = torch.zeros(3)\nunused = 1",            # 2: rebinds w: the one 4 sees
               "%time heavy = sum(range(10**6))",             # 3: nobody reads heavy
               "def f(x):\n    w = x\n    return w\nlabels = [f(i) for i in w]",  # 4
               "explorer = Explorer(draw, labels)\nexplorer.show()",  # 5: reads labels
               "plt.show()"]
    assert explorer_slice(sources) == [0, 1, 2, 4, 5]


# ---------------------------------------------------------------- the tests

SCRATCH_CELLS = [
    ("code", "import torch\nfrom course_lib.widgets import Explorer\nimport ipywidgets as widgets"),
    ("code",
     "scores = torch.tensor([2.0, 1.0, 0.5, -1.0])\n"
     "\n"
     "def draw(fig, temperature):\n"
     "    weights = torch.softmax(scores / temperature, dim=0)\n"
     "    ax = fig.add_subplot()\n"
     "    ax.bar(['k0', 'k1', 'k2', 'k3'], weights.numpy())\n"
     "    ax.set_ylim(0, 1)\n"
     "    ax.set_xlabel('key')\n"
     "    ax.set_ylabel('weight')\n"
     "    ax.set_title(f'softmax(scores / T), T = {temperature:.2f}')\n"
     "\n"
     "explorer = Explorer(draw, {'temperature': widgets.FloatSlider(value=1.0, min=0.1, max=5.0, "
     "step=0.1, description='T')})\n"
     "explorer.show()"),
]


@pytest.mark.skipif(bool(explorer_notebooks()), reason="the lecture notebooks' explorers cover "
                    "the same machinery (test_lecture_explorers_work_in_lab)")
def test_scratch_explorer_redraws_in_lab(page, lab, tmp_path):  # page first: see conftest
    """The Explorer machinery alone, on a two-cell notebook: controls render, a move redraws.

    Runs only while no lecture shows an explorer; then the lecture tests cover the same ground.
    """
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for _, src in SCRATCH_CELLS]
    source = tmp_path / "scratch_explorer.ipynb"
    nbformat.write(nb, source)
    run_notebook_in_lab(lab, page, source, "scratch_explorer")


@pytest.mark.parametrize("notebook", explorer_notebooks(), ids=lambda p: p.stem)
def test_lecture_explorers_work_in_lab(page, lab, notebook):  # page first: see conftest
    """A lecture notebook's explorers run cleanly in the lab and each redraws when moved."""
    code = [c.source for c in nbformat.read(notebook, as_version=4).cells
            if c.cell_type == "code"]
    run_notebook_in_lab(lab, page, notebook, notebook.stem, cells=explorer_slice(code))
    if notebook.stem.startswith("01_") and os.environ.get("COURSE_UPDATE_DOCS_IMG") == "1":
        # Refresh the README's picture of an explorer in the lab (on request only: it is committed).
        docs_img = REPO / "docs" / "img"
        docs_img.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SCREENSHOTS / f"{notebook.stem}.png", docs_img / "explorer_ch01.png")
