"""Checkers for exercises/10_the_transformer.ipynb: a pre-LN block from its parameters (build),
a head ablation that removes too little (debug), what zeroing ONE induction head of layer 1 does
to the two-layer model (predict), and the same for each layer-1 head in turn (experiment).
"""

from __future__ import annotations

import functools
import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

import course_lib.models.block as block_module
import course_lib.multihead as multihead
import course_lib.stacking.induction as induction
from course_lib.checks._core import call, expect_close, expect_shape, fail, to_tensor
from course_lib.checks._declare import function_check, value_check
from course_lib.checks._hints import hint
from course_lib.checks._judging import each, value
from course_lib.checks._mistakes import Mistake, expected, named_mistake
from course_lib.checks._predict import choice_check, commit_check
from course_lib.checks._values import read_number

__all__ = ["transformer_block", "ablate_head", "one_head_accuracy", "head_why",
           "single_head_ablations", "hint"]

SOLUTION = "solutions/10_the_transformer.ipynb"

# What the grading kernel keeps of this module (course_tools/grader/strip.py; pinned by
# tests/test_grading_stripped.py): what the checks' run= needs, and no answer to any
# exercise. A new name here is a review.
KERNEL_HALF = ("_ablate_run",)

# The induction test set of exercises 3 and 4 (the notebook builds the same one).
INDUCTION_SEED, INDUCTION_BATCH = 2024, 512

# ------------------------------------------------------------------------------------------------
# exercise 1 (build): a pre-LN block from its parameters
# ------------------------------------------------------------------------------------------------


def _block_params(g: torch.Generator, d: int, d_mlp: int) -> dict:
    def r(*shape, scale=1.0, mean=0.0):
        return mean + scale * torch.randn(*shape, generator=g, dtype=torch.float64)

    p = {"ln1.weight": r(d, scale=0.3, mean=1.0), "ln1.bias": r(d, scale=0.3)}
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        p[f"attn.{name}.weight"] = r(d, d, scale=d ** -0.5)
        p[f"attn.{name}.bias"] = r(d, scale=0.1)
    p |= {"ln2.weight": r(d, scale=0.3, mean=1.0), "ln2.bias": r(d, scale=0.3),
          "mlp.0.weight": r(d_mlp, d, scale=d ** -0.5), "mlp.0.bias": r(d_mlp, scale=0.1),
          "mlp.2.weight": r(d, d_mlp, scale=d_mlp ** -0.5), "mlp.2.bias": r(d, scale=0.1)}
    return p


def _block_cases(seed: int, hidden: bool) -> list:
    g = torch.Generator().manual_seed(1000 + seed)
    sizes = [(2, 6, 8, 2, 32, True), (1, 5, 12, 3, 24, False), (3, 4, 16, 4, 64, True)]
    if hidden:
        sizes += [(1, 1, 8, 1, 8, True), (2, 9, 20, 5, 40, False)]
    cases = []
    for batch, n, d, heads, d_mlp, causal in sizes:
        cases.append({"x": torch.randn(batch, n, d, generator=g, dtype=torch.float64),
                      "params": _block_params(g, d, d_mlp), "num_heads": heads,
                      "mask": torch.tril(torch.ones(n, n, dtype=torch.bool)) if causal else None})
    return cases


def _variant(x, p, heads, mask, *, kind="right"):
    """The block (the check's reference: it equals course_lib's TransformerBlock, which the
    exercise forbids, and so its reference), or one of the usual wrong versions of it."""
    d = x.shape[-1]

    def ln(t, i):
        return F.layer_norm(t, (d,), p[f"ln{i}.weight"], p[f"ln{i}.bias"])

    def attn(t):
        def proj(name, u):
            return F.linear(u, p[f"attn.{name}.weight"], p[f"attn.{name}.bias"])
        batch, n = t.shape[:2]

        def split(u):  # "no_transpose": (B, n, d) reshaped straight to (B, h, n, d_head)
            return u.reshape(batch, heads, n, d // heads) if kind == "no_transpose" \
                else multihead.split_heads(u, heads)
        q, k, v = (split(proj(name, t)) for name in ("q_proj", "k_proj", "v_proj"))
        scale = 1 / math.sqrt(d if kind == "scale_d_model" else d // heads)
        scores = q @ k.transpose(-2, -1) * scale
        if mask is not None and kind != "no_mask":
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-2 if kind == "query_axis" else -1)
        out = (weights.nan_to_num(0.0) if kind == "query_axis" else weights) @ v
        merged = out.reshape(batch, n, d) if kind == "no_transpose" \
            else multihead.merge_heads(out)
        return proj("out_proj", merged)

    def mlp(t):
        act = F.relu if kind == "relu" else F.gelu
        if kind == "tanh_gelu":
            def act(u):
                return F.gelu(u, approximate="tanh")
        return F.linear(act(F.linear(t, p["mlp.0.weight"], p["mlp.0.bias"])),
                        p["mlp.2.weight"], p["mlp.2.bias"])

    if kind == "post_ln":
        x = ln(x + attn(x), 1)
        return ln(x + mlp(x), 2)
    if kind == "no_residual":
        return mlp(ln(attn(ln(x, 1)), 2))
    if kind == "normed_residual":
        h = ln(x, 1)
        x = h + attn(h)
        h = ln(x, 2)
        return h + mlp(h)
    x = x + attn(ln(x, 1))
    return x + mlp(ln(x, 2))


def _block_mistake(kind: str, message: str) -> Mistake:
    """One of the block's named mistakes: `_variant`'s `kind` of the block."""
    return Mistake(f"transformer_block(x, params, num_heads, mask): {message}",
                   partial(_variant, kind=kind), atol=1e-8)


@function_check(1, args=("x", "params", "num_heads", "mask"), grade="block", cases=_block_cases,
                forbid=((block_module, "TransformerBlock"), (multihead, "MultiHeadAttention"),
                        (nn, "TransformerEncoderLayer"), (nn, "MultiheadAttention"),
                        (F, "multi_head_attention_forward")),
                reference=_variant, mistakes=(
    _block_mistake("post_ln", "this is the POST-LN block (x = ln(x + attn(x))). Chapter 10's "
                   "block normalises first and adds to the raw stream: x = x + attn(ln1(x))."),
    _block_mistake("no_residual", "the residual connections are missing: each sub-layer's "
                   "output must be ADDED to x, not replace it."),
    _block_mistake("normed_residual", "the residual adds the sub-layer to the NORMALISED "
                   "stream (h + attn(h) with h = ln1(x)); it must be added to x itself: "
                   "x + attn(ln1(x))."),
    _block_mistake("relu", "the MLP uses ReLU; the block's MLP is Linear, GELU, Linear."),
    _block_mistake("tanh_gelu", "the MLP uses the tanh approximation of GELU "
                   "(approximate='tanh'); the block (like torch's TransformerEncoderLayer with "
                   "activation='gelu') uses the exact GELU, x·Φ(x). The two differ by up to "
                   "about 1e-3."),
    _block_mistake("query_axis", "the attention weights are normalised over the QUERY axis "
                   "(softmax over dim -2): each query's weights over the keys must sum to 1, "
                   "so the softmax runs over the last axis, the keys."),
    _block_mistake("no_transpose", "the heads are cut by reshaping (batch, n, d_model) "
                   "straight to (batch, heads, n, d_head): that mixes positions into heads. "
                   "Split the last axis into (heads, d_head) and then swap the n and heads axes "
                   "(view, then transpose(1, 2)); merge back the same way in reverse."),
    _block_mistake("scale_d_model", "the scores are divided by √d_model; each head scores "
                   "with its own width, so divide by √(d_model / num_heads)."),
    _block_mistake("no_mask", "the mask is ignored: where mask is False the weight must be "
                   "exactly 0."),
))
def transformer_block(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        x, heads, mask = case["x"], case["num_heads"], case["mask"]
        want = expected(case)
        what = "transformer_block(x, params, num_heads, mask)"
        out = to_tensor(got, what, dtype=torch.float64)
        expect_shape(out, want.shape, what, "a block maps (batch, n, d_model) to the same shape.")
        if torch.allclose(out, want, atol=1e-8, rtol=1e-6):
            continue
        named_mistake(case, out)
        expect_close(out, want, what, atol=1e-8, rtol=1e-6,
                     hint=f"(case batch={x.shape[0]}, n={x.shape[1]}, d_model={x.shape[2]}, "
                          f"num_heads={heads}, mask {'causal' if mask is not None else 'None'})")
    return (f"transformer_block: equals course_lib's TransformerBlock (and so torch's pre-LN "
            f"TransformerEncoderLayer) on {len(cases)} cases, with and without a causal mask.")


# ------------------------------------------------------------------------------------------------
# exercise 2 (debug): remove one head's contribution
# ------------------------------------------------------------------------------------------------


def _ablate_cases(seed: int, hidden: bool) -> list:
    g = torch.Generator().manual_seed(1010 + seed)
    sizes = [(8, 2, 1), (12, 3, 0), (16, 4, 2)] + ([(6, 6, 5), (10, 1, 0)] if hidden else [])
    return [{"out_weight": torch.randn(d, d, generator=g, dtype=torch.float64), "head": head,
             "num_heads": heads} for d, heads, head in sizes]


def _ablate_run(fn, case):
    w = case["out_weight"]
    before = w.clone()
    got = call(fn, w, case["head"], case["num_heads"], name="ablate_head")
    return {"weight": got, "input_unchanged": bool(torch.equal(w, before))}


def _zeroed(w, head, num_heads, axis=1):
    """W_O with head `head`'s d_head columns zeroed (axis=1; axis=0: its rows, the planted bug)."""
    d_head = w.shape[0] // num_heads
    w = w.clone()
    w.narrow(axis, head * d_head, d_head).zero_()
    return w


def _weight(result):
    return result["weight"]


@function_check(2, run=_ablate_run, grade="ablate", cases=_ablate_cases,
                forbid=((induction, "ablate_head"),), reference=_zeroed, mistakes=(
    Mistake("the ROWS of W_O were zeroed: row i of W_O makes output feature i, which mixes every "
            "head. Head h enters W_O through its d_head COLUMNS (out = W_O @ concat), so those "
            "are the ones to zero.", partial(_zeroed, axis=0), atol=1e-8, rtol=1e-5, on=_weight),
    Mistake("the returned W_O is unchanged: head h still reaches the residual stream.",
            lambda w, head, num_heads: w.clone(), atol=1e-8, rtol=1e-5, on=_weight),
))
def ablate_head(cases: list, outcomes: list) -> str:
    for case, got in each(cases, outcomes):
        head, heads = case["head"], case["num_heads"]
        d_head = case["out_weight"].shape[0] // heads
        want = expected(case)["weight"]
        if not isinstance(got, dict) or "weight" not in got:
            fail("ablate_head should return the new W_O (a tensor).")
        out = to_tensor(got["weight"], "ablate_head(out_weight, head, num_heads)",
                        dtype=torch.float64)
        expect_shape(out, want.shape, "the returned W_O", "same shape as out_weight.")
        named_mistake(case, got)
        expect_close(out, want, "the returned W_O", atol=0, rtol=0,
                     hint=f"only the columns of head {head} (d_head = {d_head} of them) become 0.")
        if not got.get("input_unchanged", True):
            fail("ablate_head changed the out_weight it was given: work on a copy (clone), so "
                 "that the model can be restored.")
    return ("ablate_head: zeroes exactly the head's d_head columns of W_O and leaves the input "
            "as it was.")


# ------------------------------------------------------------------------------------------------
# exercises 3 and 4: the shipped induction models (measured here, in the judge's process)
# ------------------------------------------------------------------------------------------------


def induction_test_set():
    """The fixed test batch both exercises measure on."""
    from course_lib.stacking import pretrained
    from course_lib.stacking.induction import induction_batch

    task = pretrained.SPECS["induction_2layer"]["task_args"]
    return induction_batch(torch.Generator().manual_seed(INDUCTION_SEED), INDUCTION_BATCH, **task)


@functools.cache
def _measured_single_heads() -> tuple[float, tuple[float, ...], tuple[float, ...]]:
    """(accuracy with every head, accuracy with each layer-1 head zeroed alone, each layer-0
    head zeroed alone) of the two-layer model on the test batch."""
    from course_lib.stacking import pretrained
    from course_lib.stacking.induction import ablate_head as ablate
    from course_lib.train import evaluate

    model = pretrained.load("induction_2layer")
    tokens, targets = induction_test_set()
    before = evaluate(model, tokens, targets)
    heads = model.blocks[0].attn.num_heads
    found = []
    for layer in (1, 0):
        accuracies = []
        for h in range(heads):
            with ablate(model, layer, [h]):
                accuracies.append(evaluate(model, tokens, targets))
        found.append(accuracies)
    return before, tuple(found[0]), tuple(found[1])


def _strongest_induction_head() -> int:
    from course_lib.stacking import pretrained
    from course_lib.stacking.induction import head_scores

    scores = head_scores(pretrained.load("induction_2layer"), induction_test_set()[0])
    row = list(scores["induction"][1])
    return row.index(max(row))


@commit_check(3, read=partial(read_number, what="predicted_accuracy", low=0.0, high=1.0,
                              kind="an accuracy between 0 and 1"), grade="predict")
def one_head_accuracy(got: float) -> str:
    _, layer1, _ = _measured_single_heads()
    head = _strongest_induction_head()
    return (f"prediction committed. The run: with head {head} of layer 1 zeroed the model scores "
            f"{layer1[head]:.2f} (1.00 with every head); you predicted {got:.2f}.")


head_why = choice_check(3, "head_why", "abc", module=__name__)


def _layer1_accuracies() -> list[float]:
    return list(_measured_single_heads()[1])


@value_check(4, grade="ablation", reference=_layer1_accuracies, mistakes=(
    Mistake("these are the accuracies with the heads of layer 0 (the first layer) zeroed one at "
            "a time: the exercise asks for layer 1, ablate_head(model, 1, [h]).",
            lambda: list(_measured_single_heads()[2]), atol=0.01, rtol=0),
    Mistake("every accuracy equals the model's accuracy with all its heads: measure inside the "
            "`with course_ablate_head(model, 1, [h]):` block, one head at a time.",
            lambda: [_measured_single_heads()[0]] * len(_measured_single_heads()[1]),
            atol=0.01, rtol=0),
))
def single_head_ablations(cases: list, outcomes: list) -> str:
    got = value(outcomes[0], "layer1_accuracies")
    if isinstance(got, torch.Tensor):
        got = got.tolist()
    if got is None:
        fail("layer1_accuracies is None: measure one accuracy per head of layer 1.")
    layer1 = expected(cases[0])
    if not isinstance(got, (list, tuple)) or len(got) != len(layer1):
        fail(f"layer1_accuracies should be a list of {len(layer1)} accuracies, one per head of "
             f"layer 1 (head 0 first), got {got!r}.")
    got = [read_number(a, f"layer1_accuracies[{h}]", 0.0, 1.0, kind="an accuracy")
           for h, a in enumerate(got)]
    close = [abs(a - w) <= 0.01 for a, w in zip(got, layer1)]
    if all(close):
        worst = min(range(len(got)), key=got.__getitem__)
        return (f"single_head_ablations: zeroing one layer-1 head at a time costs between "
                f"{1 - max(got):.2f} and {1 - min(got):.2f} of the accuracy; head {worst} "
                "matters most, and no single head is the whole circuit.")
    named_mistake(cases[0], got)
    wrong = [h for h, ok in enumerate(close) if not ok]
    directions = ", ".join(f"head {h} {'too high' if got[h] > layer1[h] else 'too low'}"
                           for h in wrong)
    fail(f"layer1_accuracies differs from the check's measurement ({directions}, by more than "
         "0.01). Zero ONE head at a time (ablate_head(model, 1, [h])) and evaluate on the "
         f"exercise's test batch (seed {INDUCTION_SEED}, {INDUCTION_BATCH} sequences).")
