"""Induction: after `... A B ... A`, predict `B`. One layer cannot; two can.

A sequence holds distinct random tokens, then a segment x_0..x_{L-1} seen before comes again:

    [prefix: a tokens] [x_0 .. x_{L-1}] [middle: b tokens] [x_0 .. x_{L-1}]      a + b = gap

At the second x_j the answer is x_{j+1}, which stands right after the FIRST x_j. The gap b is
random, so no fixed offset finds it. A head must find "the token after the earlier occurrence of
me": its query is "I am x_j", so the key it matches must say "the token before me was x_j". In
one layer a key knows only its own token; in two, a layer-1 head can copy each token's
predecessor into the residual stream (a previous-token head) and a layer-2 head can match on it
(an induction head). `head_scores` finds both from attention weights; `ablate_head` zeroes one.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from course_lib.train import IGNORE_INDEX


def induction_batch(generator: torch.Generator, batch: int = 64, segment: int = 8, gap: int = 8,
                    vocab: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (batch, n) and targets (batch, n), n = gap + 2 * segment.

    The first gap + segment tokens are distinct; the last segment repeats x. Targets are -100
    except at the repeat's positions 0..segment-2, whose target is the next token of x.
    """
    if segment < 2 or gap < 0 or gap + segment > vocab:
        raise ValueError(f"want segment >= 2, gap >= 0 and gap + segment <= vocab (distinct "
                         f"tokens); got segment={segment}, gap={gap}, vocab={vocab}")
    distinct = torch.rand(batch, vocab, generator=generator).argsort(dim=1)[:, :gap + segment]
    b = torch.randint(0, gap + 1, (batch,), generator=generator)  # middle length per sequence
    pos = torch.arange(gap + segment)  # (gap + L,)
    start = (gap - b)[:, None]  # (B, 1): where the first copy of x begins
    # prefix = distinct[:, L:L+a], x = distinct[:, :L], middle = distinct[:, L+a:]: one gather
    order = torch.where(pos < start, pos + segment,
                        torch.where(pos < start + segment, pos - start, pos))  # (B, gap + L)
    first = distinct.gather(1, order)  # (B, gap + L): prefix, x, middle
    x = distinct[:, :segment]  # (B, L)
    tokens = torch.cat([first, x], dim=1)  # (B, n)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, gap + segment:-1] = x[:, 1:]  # at the second x_j: x_{j+1}
    return tokens, targets


def previous_token_score(weights: torch.Tensor) -> torch.Tensor:
    """Mean weight a query puts on the position just before it: (B, heads, n, n) -> (heads,)."""
    _check_weights(weights)
    return torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))  # (heads,)


def induction_targets(tokens: torch.Tensor) -> torch.Tensor:
    """(B, n): for each position i, the position right after the latest earlier j with
    tokens[j] == tokens[i] (the token an induction head should look at), or -1 if none."""
    n = tokens.shape[1]
    pos = torch.arange(n, device=tokens.device)
    earlier = pos[None, :] < pos[:, None]  # (n_q, n_k): j < i
    same = (tokens[:, :, None] == tokens[:, None, :]) & earlier  # (B, n, n)
    latest = torch.where(same, pos, torch.full_like(pos, -1)).max(dim=-1).values  # (B, n)
    return torch.where(latest >= 0, latest + 1, latest)


def induction_score(weights: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean weight on "the token after the earlier occurrence of me", over the queries whose
    token occurred before: weights (B, heads, n, n), tokens (B, n) -> (heads,)."""
    _check_weights(weights, tokens)
    target = induction_targets(tokens)  # (B, n)
    has = target >= 0
    index = target.clamp(min=0)[:, None, :, None].expand(-1, weights.shape[1], -1, 1)
    on_target = weights.gather(3, index)[..., 0]  # (B, heads, n)
    return on_target.transpose(0, 1)[:, has].mean(dim=-1)  # (heads,)


def head_scores(model: nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run `model` on tokens (B, n); for every layer and head, its previous-token and induction
    scores: {"previous": (layers, heads), "induction": (layers, heads)}."""
    weights = attention_weights(model, tokens)  # (layers, B, heads, n, n)
    return {"previous": torch.stack([previous_token_score(w) for w in weights]),
            "induction": torch.stack([induction_score(w, tokens) for w in weights])}


@torch.no_grad()
def attention_weights(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Every block's attention weights for tokens (B, n): (layers, B, heads, n, n)."""
    model.eval()
    model(tokens)
    return torch.stack([block.weights for block in model.blocks])


@contextlib.contextmanager
def ablate_head(model: nn.Module, layer: int, head):
    """Within the block, head `head` (an int, or a list of heads) of block `layer` adds nothing
    to the residual stream.

    A head's output reaches the stream only through its d_head COLUMNS of W_O (out = W_O @
    concat(heads)): zeroing those columns removes exactly that head. Restored afterwards.
    """
    if not 0 <= layer < len(model.blocks):
        raise ValueError(f"layer should be in 0..{len(model.blocks) - 1}, got {layer!r}")
    attn = model.blocks[layer].attn
    heads = [head] if isinstance(head, int) else list(head)
    for h in heads:
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < attn.num_heads:
            raise ValueError(f"head should be in 0..{attn.num_heads - 1}, got {head!r}")
    weight = attn.out_proj.weight
    saved = weight.detach().clone()
    with torch.no_grad():
        for h in heads:
            weight[:, h * attn.d_head:(h + 1) * attn.d_head] = 0.0
    try:
        yield model
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def _check_weights(weights: torch.Tensor, tokens: torch.Tensor | None = None) -> None:
    if not isinstance(weights, torch.Tensor) or weights.dim() != 4 or \
            weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights has shape {tuple(getattr(weights, 'shape', ()))}, "
                         "wanted (batch, heads, n, n)")
    if tokens is not None and tuple(tokens.shape) != (weights.shape[0], weights.shape[2]):
        raise ValueError(f"tokens has shape {tuple(tokens.shape)} but weights "
                         f"{tuple(weights.shape)}: wanted tokens (batch, n)")
