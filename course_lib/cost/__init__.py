"""Chapter 09: where the quadratic term takes over -- attention's share of one layer's work.

One pre-LayerNorm layer of width d on n tokens, counting 2 FLOPs per multiply-add of its matrix
products (the usual convention; LayerNorm, softmax, GELU and the residual adds are elementwise,
O(n·d), and not counted):

    Q, K, V projections    3 · 2·n·d·d     = 6·n·d²
    output projection          2·n·d·d     = 2·n·d²
    MLP (d -> d_mlp -> d)      2 · 2·n·d·d_mlp  (= 16·n·d² for the usual d_mlp = 4d)
    scores  Q Kᵀ               2·n·n·d     = 2·n²·d   } the quadratic term: the only part
    blend   weights V          2·n·n·d     = 2·n²·d   } that grows faster than n

    attention's share = 4n²d / (4n²d + 8nd² + 4nd·d_mlp) = n / (n + 2d + d_mlp)

so the quadratic term equals the rest of the layer at n = 2d + d_mlp (6d for d_mlp = 4d). The
score grid is counted in full, as a dense kernel computes it; a causal kernel that skips the
masked half (chapter 08's) does half of it, which moves the crossover to twice that length.

`count_flops` checks the formula by running a real layer (chapter 05's MultiHeadAttention and an
MLP) under `torch.utils.flop_counter.FlopCounterMode` on the `meta` device: shapes and FLOPs,
no memory and no arithmetic, so n = 131072 at a 7B model's width costs milliseconds.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from course_lib.attention import scaled_dot_product_attention
from course_lib.masks import causal_mask
from course_lib.measure import Timing, threads, time_call
from course_lib.multihead import MultiHeadAttention, merge_heads, split_heads
from course_lib.validate import check_count

__all__ = ["Layer", "layer_flops", "count_flops", "attention_share", "crossover_length",
           "crossover_from_counts", "time_parts", "WIDTHS"]

# Two widths the essay's figure contrasts: GPT-2 small and a 7B model (LLaMA-7B: d = 4096,
# 32 heads; its SwiGLU MLP of width 11008 has three matrices, 3·11008 = 8.06·d columns, about
# the 8·d of a GELU MLP of width 4d, so d_mlp = 4d stands in for it within 1%).
WIDTHS = {"GPT-2 small (d = 768)": {"d_model": 768, "num_heads": 12},
          "7B (d = 4096)": {"d_model": 4096, "num_heads": 32}}


class Layer(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)): the layer whose work is counted and timed.

    forward(x (B, n, d), mask=None) -> (B, n, d). The MLP is Linear(d, d_mlp), GELU, Linear.
    """

    def __init__(self, d_model: int, num_heads: int, d_mlp: int | None = None):
        super().__init__()
        d_mlp = 4 * d_model if d_mlp is None else check_count(d_mlp, "d_mlp")
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.GELU(), nn.Linear(d_mlp, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask=mask)[0]
        return x + self.mlp(self.ln2(x))


def layer_flops(n: int, d_model: int, d_mlp: int | None = None,
                causal: bool = False) -> dict[str, int]:
    """The closed form above for one sequence of n tokens: FLOPs of each part, and the total.

    causal=True: a causal kernel that skips the masked half does half the score grid and half
    the blend (n²·d each), so the share becomes n / (n + 2·(2d + d_mlp)).
    """
    n, d = check_count(n, "n"), check_count(d_model, "d_model")
    d_mlp = 4 * d if d_mlp is None else check_count(d_mlp, "d_mlp")
    grid = n * n * d if causal else 2 * n * n * d          # per product: half the pairs, or all
    parts = {"qkv": 6 * n * d * d, "out": 2 * n * d * d, "mlp": 4 * n * d * d_mlp,
             "scores": grid, "blend": grid}
    return {**parts, "total": sum(parts.values())}


def count_flops(n: int, d_model: int, num_heads: int, d_mlp: int | None = None,
                causal: bool = True, device: str | torch.device = "meta") -> dict[str, int]:
    """FLOPs of one `Layer` on (1, n, d_model), counted by FlopCounterMode, split into the same
    parts as `layer_flops`: qkv, out, mlp, and "scores+blend" (what runs inside the attention
    module but outside its four projections)."""
    n = check_count(n, "n")
    with torch.device(device):
        layer = Layer(d_model, num_heads, d_mlp)
        x = torch.zeros(1, n, d_model)
        mask = causal_mask(n, device=device) if causal else None
    with FlopCounterMode(display=False) as counter:
        layer(x, mask)
    per_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    qkv = sum(per_module.get(f"Layer.attn.{p}_proj", 0) for p in "qkv")
    out = per_module.get("Layer.attn.out_proj", 0)
    return {"qkv": qkv, "out": out, "mlp": per_module.get("Layer.mlp", 0),
            "scores+blend": per_module.get("Layer.attn", 0) - qkv - out,
            "total": counter.get_total_flops()}


def attention_share(flops: dict[str, int]) -> float:
    """Fraction of the layer's FLOPs spent on the score and blend products."""
    if "scores+blend" in flops:
        return flops["scores+blend"] / flops["total"]
    return (flops["scores"] + flops["blend"]) / flops["total"]


def crossover_length(d_model: int, d_mlp: int | None = None) -> int:
    """The closed form's n at which the score and blend products equal the rest: 2d + d_mlp."""
    d = check_count(d_model, "d_model")
    return 2 * d + (4 * d if d_mlp is None else check_count(d_mlp, "d_mlp"))


def crossover_from_counts(d_model: int, num_heads: int, d_mlp: int | None = None,
                          lo: int = 1, hi: int = 1 << 20) -> int:
    """The smallest n whose COUNTED attention share is >= 1/2, by bisection over n."""
    if attention_share(count_flops(hi, d_model, num_heads, d_mlp)) < 0.5:
        raise ValueError(f"attention's share stays below 1/2 up to n = {hi}")
    while lo < hi:
        mid = (lo + hi) // 2
        if attention_share(count_flops(mid, d_model, num_heads, d_mlp)) >= 0.5:
            hi = mid
        else:
            lo = mid + 1
    return lo


@torch.no_grad()
def time_parts(lengths, d_model: int = 128, num_heads: int = 2, d_mlp: int | None = None,
               repeats: int = 5, seed: int = 0, num_threads: int | None = 1) -> list[dict]:
    """Wall time of a real `Layer`'s parts, per n: the median of `repeats` runs, in seconds.

    projections: the Q, K, V and output maps; mlp: the MLP; attention: scores, mask, softmax and
    blend (chapter 02's scaled_dot_product_attention on the heads). One row per n with those
    three medians, attention's share of their sum, and `timings`: each part's `Timing` (median,
    fastest, slowest). The parts take turns within each repeat, so a busy spell of the machine
    slows all three alike. LayerNorms and residual adds are left out. Runs on `num_threads` CPU
    threads (None: torch's current setting).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    torch.manual_seed(seed)
    layer = Layer(d_model, num_heads, d_mlp).eval()
    rows = []
    with threads(num_threads):
        for n in lengths:
            timings = _time_one(layer, check_count(n, "n"), num_heads, repeats)
            medians = {part: t.median for part, t in timings.items()}
            share = medians["attention"] / sum(medians.values())
            rows.append({"n": int(n), **medians, "share": share, "timings": timings})
    return rows


def _time_one(layer: Layer, n: int, num_heads: int, repeats: int) -> dict[str, Timing]:
    attn = layer.attn
    x = torch.randn(1, n, attn.d_model)                                  # (1, n, d)
    mask = causal_mask(n)
    q, k, v = (split_heads(p(x), num_heads) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    heads = merge_heads(q)                                               # (1, n, d)

    def projections():
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x), attn.out_proj(heads)

    parts = {"projections": projections, "mlp": lambda: layer.mlp(x),
             "attention": lambda: scaled_dot_product_attention(q, k, v, mask)}
    samples = {part: [] for part in parts}
    for fn in parts.values():                                           # warm-up
        fn()
    for _ in range(repeats):
        for part, fn in parts.items():
            samples[part].append(time_call(fn, repeats=1, warmup=0).median)
    return {part: Timing.of(times) for part, times in samples.items()}
