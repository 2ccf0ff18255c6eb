"""Checkers for exercises/11_reading_a_transformer.ipynb: a block run with its queries, keys OR
values taken from another stream (build), a weight-on-the-answer measure that counts queries it
should skip (debug), what patching only layer 1's values does to induction (predict), and the
patching measurement as a function the check calls on models and batches the lecture never
showed (experiment).
"""

from __future__ import annotations

import functools
import inspect
import math
import types
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

import course_lib.multihead as multihead
import course_lib.stacking.composition as composition
from course_lib.checks._core import (
    call,
    expect_close,
    expect_pair,
    expect_shape,
    fail,
    matches,
    to_tensor,
)
from course_lib.checks._declare import function_check
from course_lib.checks._hints import hint
from course_lib.checks._judging import each
from course_lib.checks._mistakes import Mistake, expected, named_mistake
from course_lib.checks._predict import choice_check, commit_check
from course_lib.checks._values import read_number
from course_lib.checks.ch10 import _block_params
from course_lib.models.block import TransformerBlock

__all__ = ["patched_block", "answer_weight", "values_accuracy", "values_why",
           "patched_accuracy", "hint"]

SOLUTION = "solutions/11_reading_a_transformer.ipynb"

# What the grading kernel keeps of this module (course_tools/grader/strip.py; pinned by
# tests/test_grading_stripped.py): what the checks' run= needs, and no answer to any
# exercise. A new name here is a review.
KERNEL_HALF = ("_block_run", "_answer_run", "_accuracy_run", "_load_model", "_undecorated")

SIDES = ("none", "queries", "keys", "values")

def _undecorated(module, *names: str) -> types.ModuleType:
    """A stand-in for `module` holding the functions `names` as written, without their
    `@torch.no_grad()` wrapper. The trap watches the code a forbidden function runs, and a
    no_grad wrapper's code is torch's, shared by every function so decorated (the allowed
    `composition.stream_before` too): the undecorated function's code is this one's own."""
    stand_in = types.ModuleType(module.__name__)
    for name in names:
        setattr(stand_in, name, inspect.unwrap(getattr(module, name)))
    return stand_in

# The course's own routes to a patched block: the lecture's patch, and the attention modules
# whose forward would do the exercise's work (torch's too).
_COMPOSITION = _undecorated(composition, "patch_queries_keys", "patching_table")
PATCH_ROUTES = ((_COMPOSITION, "patch_queries_keys"), (_COMPOSITION, "patching_table"))
BLOCK_ROUTES = PATCH_ROUTES + (
    (TransformerBlock, "forward"), (multihead.MultiHeadAttention, "forward"),
    (nn.MultiheadAttention, "forward"), (F, "multi_head_attention_forward"),
    (nn.TransformerEncoderLayer, "forward"))

# The induction test set of exercise 3 (the notebook builds the same one, as chapter 10 does);
# exercise 4's batches (fresh seeds for grading), and how close a wrong measurement must come to
# a named mistake's to be named.
INDUCTION_SEED, INDUCTION_BATCH = 2024, 512
ACCURACY_BATCH, MISTAKE_ATOL = 64, 0.025

# ------------------------------------------------------------------------------------------------
# exercise 1 (build): block 1 with one side from the ablated stream
# ------------------------------------------------------------------------------------------------

def _block_cases(seed: int, hidden: bool) -> list:
    g = torch.Generator().manual_seed(1100 + seed)
    sizes = [(2, 6, 8, 2, 16), (1, 7, 12, 3, 24)]
    if hidden:
        sizes += [(1, 1, 8, 1, 8), (3, 9, 20, 5, 40)]
    cases = []
    for batch, n, d, heads, d_mlp in sizes:
        params = _block_params(g, d, d_mlp)
        clean = torch.randn(batch, n, d, generator=g, dtype=torch.float64)
        ablated = clean + torch.randn(batch, n, d, generator=g, dtype=torch.float64)
        for side in SIDES:
            cases.append({"params": params, "num_heads": heads, "clean": clean,
                          "ablated": ablated, "side": side})
    return cases

def _block_run(fn, case):
    d, d_mlp = case["clean"].shape[-1], case["params"]["mlp.0.weight"].shape[0]
    block = TransformerBlock(d, case["num_heads"], d_mlp).double()
    block.load_state_dict(case["params"])
    block.eval()
    with torch.no_grad():
        return call(fn, block, case["clean"].clone(), case["ablated"].clone(), case["side"],
                    name="patched_block")

def _patched(block, clean, ablated, side, *, kind="right"):
    """Block `block` run on `clean` with its `side` computed from `ablated` (the check's
    reference, from the block's parameters: its forward is what the exercise rules out), or one
    of the usual wrong versions of it. -> (out (B, n, d), weights (B, heads, n, n))."""
    if kind == "swapped":
        side = {"queries": "keys", "keys": "queries"}.get(side, side)
    part_side = {"queries": "queries", "keys": "keys", "values": "values"}
    if kind == "values_for_keys" and side == "keys":
        part_side = {"queries": "queries", "keys": "none", "values": "keys"}
    if kind == "keys_and_values" and side == "keys":
        part_side["values"] = "keys"
    attn, n = block.attn, clean.shape[1]

    def stream(part):
        if part_side[part] != side or side == "none":
            return block.ln1(clean)
        return ablated if kind == "raw" else block.ln1(ablated)

    def heads(name, part, count):
        proj = getattr(attn, name)
        return multihead.split_heads(F.linear(stream(part), proj.weight, proj.bias), count)

    q = heads("q_proj", "queries", attn.num_heads)     # (B, h, n, d_head)
    k = heads("k_proj", "keys", attn.num_kv_heads)
    v = heads("v_proj", "values", attn.num_kv_heads)
    if kind != "no_rope":
        q, k = _rope(q), _rope(k)
    scores = q @ k.transpose(-2, -1)                   # (B, h, n, n)
    if kind != "no_scale":
        scores = scores / math.sqrt(q.shape[-1])
    if kind != "no_mask":
        scores = scores.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)),
                                    float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    attended = F.linear(multihead.merge_heads(weights @ v), attn.out_proj.weight,
                        attn.out_proj.bias)
    base = ablated if kind == "residual" and side != "none" else clean
    x = base + attended
    return x + block.mlp(block.ln2(x)), weights

def _rope(x):
    from course_lib.position import apply_rope
    return apply_rope(x)

def _block_mistake(kind: str, message: str, when=None) -> Mistake:
    return Mistake(f"patched_block(block, clean, ablated, side={{side!r}}): {message}",
                   partial(_patched, kind=kind), atol=1e-8, rtol=1e-6,
                   detail=lambda case, got: {"side": case["side"]}, when=when)

@function_check(1, run=_block_run, grade="patch", cases=_block_cases, forbid=BLOCK_ROUTES,
                reference=_patched, mistakes=(
    _block_mistake("residual", "the attention's output is added to the ABLATED stream. The patch "
                   "changes one input of the attention only: the residual addition, and the "
                   "MLP after it, read the clean stream whatever the side."),
    _block_mistake("swapped", "this is the OTHER side's patch: side='queries' takes the "
                   "queries (q_proj's input) from the ablated stream and the keys from the clean "
                   "one; side='keys' the other way round."),
    _block_mistake("values_for_keys", "the VALUES came from the ablated stream where the keys "
                   "were asked for: the keys are what k_proj makes, and the values, from v_proj, "
                   "stay clean.", when=lambda case: case["side"] == "keys"),
    _block_mistake("keys_and_values", "the keys AND the values came from the ablated stream: "
                   "side='keys' patches k_proj's input only; the values stay clean.",
                   when=lambda case: case["side"] == "keys"),
    _block_mistake("raw", "the ablated stream went into the projection without ln1: both "
                   "streams are normalised by the block's ln1 before q_proj, k_proj or v_proj "
                   "reads them."),
    _block_mistake("no_rope", "the queries and keys are not rotated by their positions: the "
                   "course's models apply RoPE (apply_rope, positions 0..n-1) to q and k after "
                   "the heads are split."),
    _block_mistake("no_scale", "the scores are not divided by √d_head."),
    _block_mistake("no_mask", "the causal mask is missing: query i may attend to keys 0..i "
                   "only."),
))
def patched_block(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        what = f"patched_block(block, clean, ablated, side={case['side']!r})"
        out, weights = expect_pair(got, what, "(out, weights)")
        want_out, want_weights = expected(case)
        batch, n, d = case["clean"].shape
        out = to_tensor(out, f"{what}'s out", dtype=torch.float64)
        expect_shape(out, want_out.shape, f"{what}'s out",
                     "the block's output has the stream's shape (batch, n, d_model).")
        weights = to_tensor(weights, f"{what}'s weights", dtype=torch.float64)
        expect_shape(weights, want_weights.shape, f"{what}'s weights",
                     "one (n, n) map per head: (batch, heads, n, n).")
        if matches(out, want_out) and matches(weights, want_weights):
            continue
        named_mistake(case, (out, weights))
        where = (f"(case batch={batch}, n={n}, d_model={d}, num_heads={case['num_heads']}, "
                 f"side={case['side']!r})")
        expect_close(weights, want_weights, f"{what}'s weights", atol=1e-8, rtol=1e-6,
                     hint=where)
        expect_close(out, want_out, f"{what}'s out", atol=1e-8, rtol=1e-6,
                     hint=f"the weights are right: look at the values, the output projection, "
                          f"the residual and the MLP {where}")
    return (f"patched_block: the block's output and weights with nothing, its queries, its keys "
            f"or its values from the ablated stream, on {len(cases) // len(SIDES)} random "
            "blocks.")

# ------------------------------------------------------------------------------------------------
# exercise 2 (debug): the weight on the answer, over the scored queries only
# ------------------------------------------------------------------------------------------------

def _answer_cases(seed: int, hidden: bool) -> list:
    g = torch.Generator().manual_seed(1110 + seed)
    sizes = [(2, 3, 6, 0.5), (4, 2, 10, 0.3), (1, 4, 8, 0.7)]
    if hidden:
        sizes += [(1, 1, 1, 1.0), (3, 5, 12, 0.1)]
    cases = []
    for batch, heads, n, p_scored in sizes:
        scores = torch.randn(batch, heads, n, n, generator=g, dtype=torch.float64) * 2
        scores = scores.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), -math.inf)
        at = (torch.rand(batch, n, generator=g) * (torch.arange(n) + 1)).long()  # 0..i
        scored = torch.rand(batch, n, generator=g) < p_scored
        scored[0, -1] = True                                   # at least one scored query
        cases.append({"weights": torch.softmax(scores, dim=-1),
                      "answer_at": torch.where(scored, at, -1)})
    return cases

def _answer_weight(weights, answer_at, *, kind="right"):
    """(heads,): each head's mean weight on the answer over the scored queries (the reference),
    or a wrong version: "wrap", the planted bug (answer_at = -1 indexes the LAST key and the
    unscored queries are averaged in); "clamp" (unscored queries read key 0 and count);
    (under a causal mask the last key's weight is 0 for every query but the last, so the bug
    comes out as the scored weights divided by the number of ALL queries)."""
    batch, heads, n, _ = weights.shape
    b = torch.arange(batch)[:, None].expand(batch, n)
    i = torch.arange(n).expand(batch, n)
    key = answer_at.clamp(min=0) if kind == "clamp" else answer_at
    on = weights[b, :, i, key]                                  # (B, n, heads)
    if kind in ("wrap", "clamp"):
        return on.mean(dim=(0, 1))
    scored = answer_at >= 0
    return on[scored].mean(dim=0)

def _answer_run(fn, case):
    return call(fn, case["weights"].clone(), case["answer_at"].clone(), name="answer_weight")

@function_check(2, run=_answer_run, grade="answer_weight", cases=_answer_cases,
                reference=_answer_weight, mistakes=(
    Mistake("this is the colleague's function again: the queries with answer_at = -1 are "
            "averaged in (index -1 picks the LAST key for them, whose weight the causal mask "
            "makes 0 for all but the last query), so the mean is diluted. Only the scored "
            "queries (answer_at >= 0) may count.", partial(_answer_weight, kind="wrap"), atol=1e-9),
    Mistake("the unscored queries still count: answer_at = -1 clamped to 0 reads their weight "
            "on key 0, and the mean runs over every query. Leave them out of the mean.",
            partial(_answer_weight, kind="clamp"), atol=1e-9),
))
def answer_weight(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        batch, heads, n, _ = case["weights"].shape
        what = "answer_weight(weights, answer_at)"
        out = to_tensor(got, what, dtype=torch.float64)
        expect_shape(out, (heads,), what, "one mean weight per head.")
        want = expected(case)
        if matches(out, want, atol=1e-9):
            continue
        named_mistake(case, out)
        expect_close(out, want, what, atol=1e-9, rtol=1e-6,
                     hint=f"(case batch={batch}, heads={heads}, n={n}, "
                          f"{int((case['answer_at'] >= 0).sum())} scored queries)")
    return ("answer_weight: each head's mean weight on the answer, over the scored queries "
            "only.")

# ------------------------------------------------------------------------------------------------
# exercises 3 and 4: the shipped models patched (measured here, in the judge's process)
# ------------------------------------------------------------------------------------------------

_MODELS = {"induction": ("pretrained", "induction_2layer"),
           "question first": ("composition", "2layer"),
           "question in the middle": ("composition", "middle_2layer"),
           "pairs": ("pretrained", "pairs_transformer")}

def _load_model(name):
    from course_lib.stacking import pretrained

    where, file = _MODELS[name]
    model = (pretrained if where == "pretrained" else composition).load(file)
    model.eval()
    return model

@functools.cache
def _judge_model(name):
    return _load_model(name)

def _task_batch(name: str, seed: int, size: int):
    from course_lib.stacking import pretrained
    from course_lib.stacking.induction import induction_batch
    from course_lib.stacking.pronoun import PairsTask

    g = torch.Generator().manual_seed(seed)
    if name == "induction":
        return induction_batch(g, size, **pretrained.SPECS["induction_2layer"]["task_args"])
    if name == "pairs":
        return PairsTask(**pretrained.SPECS["pairs_transformer"]["task_args"]).batch(g, size)
    return composition.BATCHES["first" if name == "question first" else "middle"](g, size)

def _accuracy(logits, targets):
    keep = targets >= 0
    return float((logits.argmax(-1)[keep] == targets[keep]).float().mean())

@torch.no_grad()
def _streams(model, tokens):
    """The stream entering block 1 as trained, and with every head of block 0 zeroed."""
    from course_lib.stacking.induction import ablate_head

    clean = composition.stream_before(model, tokens, 1)
    with ablate_head(model, 0, list(range(model.blocks[0].attn.num_heads))):
        return clean, composition.stream_before(model, tokens, 1)

@torch.no_grad()
def _logits_after(model, x):
    """The logits from block 1's output x: the later blocks, ln_f, lm_head."""
    n = x.shape[1]
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    for later in model.blocks[2:]:
        x = later(x, mask, positions=torch.arange(n))
    return model.lm_head(model.ln_f(x))

@torch.no_grad()
def _patched_accuracy(model, tokens, targets, side, *, kind="right"):
    """The model's accuracy with block 1's `side` from the stream where every head of block 0
    is zeroed (the reference), or a wrong measurement: "outright" (block 0's heads zeroed in the
    whole model), "no_ablation" (the 'ablated' stream is the clean one), "every_position" (the
    unscored positions counted too)."""
    from course_lib.stacking.induction import ablate_head

    if kind == "outright":
        with ablate_head(model, 0, list(range(model.blocks[0].attn.num_heads))):
            return _accuracy(model(tokens), targets)
    clean, ablated = _streams(model, tokens)
    x, _ = _patched(model.blocks[1], clean, clean if kind == "no_ablation" else ablated, side)
    logits = _logits_after(model, x)
    if kind == "every_position":
        return float((logits.argmax(-1) == targets).float().mean())
    return _accuracy(logits, targets)

@functools.cache
def _values_patched() -> tuple[float, float]:
    """(accuracy as trained, accuracy with block 1's values from the ablated stream) of the
    induction model on exercise 3's test batch."""
    model = _judge_model("induction")
    tokens, targets = _task_batch("induction", INDUCTION_SEED, INDUCTION_BATCH)
    clean, ablated = _streams(model, tokens)
    with torch.no_grad():
        return tuple(_accuracy(_logits_after(model, _patched(model.blocks[1], clean, ablated,
                                                                side)[0]), targets)
                     for side in ("none", "values"))

@commit_check(3, read=partial(read_number, what="predicted_accuracy", low=0.0, high=1.0,
                              kind="an accuracy between 0 and 1"), grade="predict")
def values_accuracy(got: float) -> str:
    clean, values = _values_patched()
    return (f"prediction committed. The run: with layer 1's values from the ablated stream the "
            f"model scores {values:.2f} ({clean:.2f} as trained; 0.10 with its keys patched, in "
            f"the lecture); you predicted {got:.2f}.")

values_why = choice_check(3, "values_why", "abc", module=__name__)

def _accuracy_cases(seed: int, hidden: bool) -> list:
    plan = [("induction", 101, ("queries", "keys", "values")),
            ("question in the middle", 102, ("values",)), ("pairs", 103, ("values",))]
    if hidden:
        fresh = [(seed * 7919 + 31 * k) % 100_000 + 1000 for k in range(3)]
        plan += [("question first", fresh[0], ("values",)),
                 ("question in the middle", fresh[1], ("queries",)),
                 ("pairs", fresh[2], ("keys",))]
    cases = []
    for name, batch_seed, sides in plan:
        tokens, targets = _task_batch(name, batch_seed, ACCURACY_BATCH)
        cases += [{"model": name, "tokens": tokens, "targets": targets, "side": side}
                  for side in sides]
    return cases

def _tolerance(case: dict) -> float:
    """An accuracy agrees to within one or two scored positions (rounding can flip a near tie)."""
    return max(0.01, 1.5 / int((case["targets"] >= 0).sum()))

def _accuracy_run(fn, case):
    model = _load_model(case["model"])
    return call(fn, model, case["tokens"].clone(), case["targets"].clone(), case["side"],
                name="patched_accuracy")

def _measure(kind):
    """A measurement with the learner's signature, run on the judge's own copy of the model."""
    def measure(model, tokens, targets, side):
        return _patched_accuracy(model, tokens, targets, side, kind=kind)
    return measure

def _where(case: dict, got) -> dict:
    return {"model": case["model"], "side": case["side"]}

@function_check(4, run=_accuracy_run, grade="patching", cases=_accuracy_cases,
                forbid=PATCH_ROUTES, reference=_measure("right"), mistakes=(
    Mistake("patched_accuracy on the {model} model (side={side!r}) is the accuracy with layer "
            "0's heads zeroed in the WHOLE model: the ablated stream is only one input of block "
            "1's attention; everything else reads the clean stream.",
            _measure("outright"), atol=MISTAKE_ATOL, rtol=0, detail=_where),
    Mistake("patched_accuracy on the {model} model (side={side!r}) is the accuracy as trained: "
            "the 'ablated' stream must be computed with every head of layer 0 zeroed "
            "(course_ablate_head(model, 0, heads) around stream_before).",
            _measure("no_ablation"), atol=MISTAKE_ATOL, rtol=0, detail=_where),
    Mistake("patched_accuracy on the {model} model (side={side!r}) counts every position: only "
            "the positions with a target (targets >= 0) are scored.",
            _measure("every_position"), atol=MISTAKE_ATOL, rtol=0, detail=_where),
))
def patched_accuracy(cases: list, outcomes: list) -> str:
    found = {}
    for case, got in each(cases, outcomes):
        what = f"patched_accuracy on the {case['model']} model (side={case['side']!r})"
        if isinstance(got, (str, bytes)):
            fail(f"{what} returned text, which could not be read as an accuracy: return one "
                 "number between 0 and 1.")
        x = read_number(got, what, 0.0, 1.0, kind="an accuracy between 0 and 1")
        want = expected(case)
        if abs(x - want) <= _tolerance(case):
            found[(case["model"], case["side"])] = x
            continue
        named_mistake(case, x)
        scored = int((case["targets"] >= 0).sum())
        fail(f"{what} is too {'high' if x > want else 'low'} (by more than one or two of its "
             f"{scored} scored positions). Block 1 with that side computed from the stream "
             "where every head of layer 0 is zeroed, everything else from the clean stream; "
             "the accuracy over the positions with a target.")
    shown = "; ".join(f"{model}, {side}: {x:.2f}" for (model, side), x in found.items())
    return (f"patched_accuracy agrees with the check's measurement on {len(cases)} patched "
            f"runs of {len({c['model'] for c in cases})} models ({shown}).")
