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
import sys

import torch
from torch import nn

from course_lib.models import TinyTransformer, TransformerBlock
from course_lib.train import IGNORE_INDEX, accuracy, train
from course_lib.validate import check_count, wrong_shape


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


# ------------------------------------------------------------------ attention only

class AttentionOnlyBlock(TransformerBlock):
    """A block without its MLP: x + attn(ln1(x)). In a stack of these every change to the
    residual stream is some head's output, the setting where Olsson et al. (2022) found
    induction heads forming."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__(d_model, num_heads, d_mlp=1)
        del self.ln2, self.mlp  # attention is the only sub-layer
        self.d_mlp = 0

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
                positions: torch.Tensor | None = None, cache=None, layer: int = 0) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            raise wrong_shape("x", x, f"(batch, n, d_model={self.d_model})")
        attended, weights = self.attn(self.ln1(x), mask=mask, positions=positions, cache=cache,
                                      layer=layer)  # (B, n, d), (B, heads, n, n_k)
        self.weights = weights.detach()
        return x + attended  # (B, n, d): the only addition this block makes


class AttentionOnlyTransformer(TinyTransformer):
    """`TinyTransformer` whose blocks are `AttentionOnlyBlock`s: embedding, attention-only
    blocks, final LayerNorm, logits. Same forward, cache and `generate`."""

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int,
                 max_len: int):
        super().__init__(vocab_size, d_model, num_heads, num_layers, max_len, d_mlp=1)
        self.blocks = nn.ModuleList(AttentionOnlyBlock(self.d_model, self.num_heads)
                                    for _ in range(self.num_layers))
        self.d_mlp = 0


# ------------------------------------------------------------------ watching a model train

class Watch:
    """A batch function that also measures the model every `every` steps, for `train`.

    `train(model, Watch(model, batch_fn, measure, every), steps)` trains as `batch_fn` would;
    before steps 0, every, 2 * every, ... it calls `measure(model)` (no gradients, eval mode,
    training mode restored) and keeps `(step, result)` in `.curve`; `finish()` adds the last
    measurement. `bar`, if given, is a tqdm-style bar moved on by one per step.
    """

    def __init__(self, model: nn.Module, batch_fn, measure, every: int, bar=None):
        self.model, self.batch_fn, self.measure = model, batch_fn, measure
        self.every = check_count(every, "every")
        self.bar, self.step, self.curve = bar, 0, []

    def __call__(self, generator: torch.Generator):
        if self.step % self.every == 0:
            self._take()
        self.step += 1
        if self.bar is not None:
            self.bar.update(1)
        return self.batch_fn(generator)

    def _take(self) -> None:
        was = self.model.training
        with torch.no_grad():
            result = self.measure(self.model)
        self.model.train(was)
        self.curve.append((self.step, result))
        if self.bar is not None and isinstance(result, dict):
            self.bar.set_postfix({k: f"{v:.2f}" for k, v in result.items()}, refresh=False)

    def finish(self) -> list:
        """Measure the trained model (step = steps done) unless that was the last taken."""
        if not self.curve or self.curve[-1][0] != self.step:
            self._take()
        return self.curve


# ------------------------------------------------------------------ the jump, live

LIVE = {"task": {"segment": 8, "gap": 8, "vocab": 32},  # chapter 10's induction task
        "model": {"vocab_size": 32, "d_model": 64, "num_heads": 4, "num_layers": 2,
                  "max_len": 24},
        "steps": 300, "batch": 32, "lr": 5e-3, "every": 10, "test_batch": 256}
# Seeds 0-7 crossed half the answers right between steps 120 and 180 (0-2 in both numeric
# settings, ATEN_CPU_CAPABILITY=default and native), about 20 ms of one CPU thread a step.


def watch_induction(steps: int = LIVE["steps"], seed: int = 0, *, every: int = LIVE["every"],
                    progress: bool = True, **overrides) -> dict:
    """Train a two-layer attention-only model on the induction task from scratch and measure
    its accuracy on a fixed test batch every `every` steps: the plateau, then the jump.

    `overrides` replace entries of `LIVE` ("task", "model", "batch", "lr", "test_batch").
    Returns {"steps": [...], "accuracy": [...], "model": the trained model, "loss": every
    step's training loss}. In a notebook the progress bar is one line that is blanked when
    training ends, so the saved notebook keeps no frozen bar.
    """
    unknown = sorted(set(overrides) - set(LIVE))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; choose from {sorted(LIVE)}")
    cfg = {**LIVE, **overrides, "steps": check_count(steps, "steps")}
    tokens, targets = induction_batch(torch.Generator().manual_seed(10_000 + seed),
                                      cfg["test_batch"], **cfg["task"])

    def measure(model):
        return {"accuracy": accuracy(model(tokens), targets)}

    torch.manual_seed(seed)
    model = AttentionOnlyTransformer(**cfg["model"])
    bar = _bar(cfg["steps"], "training the two-layer model", progress)
    watch = Watch(model, lambda g: induction_batch(g, cfg["batch"], **cfg["task"]), measure,
                  every, bar)
    try:
        history = train(model, watch, steps=cfg["steps"], lr=cfg["lr"], seed=seed,
                        progress=False)
    finally:
        bar.close()
    curve = watch.finish()
    return {"steps": [s for s, _ in curve], "accuracy": [r["accuracy"] for _, r in curve],
            "model": model,
            "loss": history.loss}


def jump_step(curve: dict, level: float = 0.5) -> int | None:
    """The first measured step at which the accuracy reached `level` (None: never)."""
    return next((s for s, a in zip(curve["steps"], curve["accuracy"]) if a >= level), None)


class _DisplayLine:
    """A file for tqdm in a notebook: its latest line shown in one output, blank when closed.

    The output is updated in place (a display id), so what a saved notebook keeps is that
    output's last state, an empty line, whatever the bar showed while it ran."""

    def __init__(self):
        from IPython.display import display

        self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    def write(self, text: str) -> None:
        line = text.replace("\n", "").split("\r")[-1]
        if line.strip():
            self.handle.update({"text/plain": line}, raw=True)

    def flush(self) -> None:
        pass

    def blank(self) -> None:
        self.handle.update({"text/plain": ""}, raw=True)


class _bar:
    """tqdm's text bar: in a notebook on a `_DisplayLine`, elsewhere on stderr."""

    def __init__(self, total: int, desc: str, enabled: bool):
        from tqdm.std import tqdm

        self.line = _DisplayLine() if enabled and _in_notebook() else None
        self.tqdm = tqdm(total=total, desc=desc, disable=not enabled, leave=False,
                         file=self.line or sys.stderr, mininterval=0.2, ascii=False)

    def update(self, n: int = 1) -> None:
        self.tqdm.update(n)

    def set_postfix(self, *args, **kwargs) -> None:
        self.tqdm.set_postfix(*args, **kwargs)

    def close(self) -> None:
        self.tqdm.close()
        if self.line is not None:
            self.line.blank()


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
