"""A small, seeded, deterministic training loop: the one every chapter's toy model uses.

    history = train(model, batch_fn, steps=500, lr=3e-3, seed=0)

`batch_fn(generator)` returns `(inputs, targets)` drawn with the `torch.Generator` it is given,
so the data stream depends only on `seed`. The model's logits `(..., classes)` are scored by
cross-entropy against integer `targets` `(...)`; positions whose target is `ignore_index` (-100)
do not count. The same seed gives bit-identical weights on the same machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from course_lib.measure import threads as cpu_threads
from course_lib.validate import check_count, check_number

IGNORE_INDEX = -100


@dataclass
class History:
    """What `train` records: the loss and the accuracy of every step's batch."""

    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)

    def smoothed(self, what: str = "loss", window: int = 20) -> list[float]:
        """Running mean over the last `window` steps (for a readable curve)."""
        values = getattr(self, what)
        out, total = [], 0.0
        for i, v in enumerate(values):
            total += v
            if i >= window:
                total -= values[i - window]
            out.append(total / min(i + 1, window))
        return out


@contextlib.contextmanager
def deterministic(threads: int | None = 1):
    """Within the block, PyTorch refuses nondeterministic kernels and uses `threads` CPU threads.

    One thread makes float sums add up in one fixed order whatever the machine's core count, and
    for models this small it is also the fastest: splitting a 32-wide matmul across threads costs
    more than it saves. Both settings are restored afterwards.
    """
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with cpu_threads(threads):
            yield
    finally:
        torch.use_deterministic_algorithms(was)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits `(..., classes)` against targets `(...)`, ignoring -100."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Fraction of counted positions (target != -100) where the arg-max logit is the target."""
    keep = targets != IGNORE_INDEX
    if not keep.any():
        return float("nan")
    return float((logits.argmax(-1)[keep] == targets[keep]).float().mean())


def _to(x, device):
    # Inputs may be a tensor or a (nested) tuple/list of tensors; move every tensor, keep the rest.
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(item, device) for item in x)
    return x


def _logits(output):
    # Models here return logits, or (logits, extras) such as attention weights.
    return output[0] if isinstance(output, (tuple, list)) else output


def train(model: nn.Module,
          batch_fn: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]],
          steps: int, lr: float = 3e-3, seed: int = 0, *, weight_decay: float = 0.0,
          clip: float | None = 1.0, optimizer: str = "adamw", progress: bool = True,
          desc: str = "training") -> History:
    """Train `model` with AdamW (or plain SGD) for `steps` batches from `batch_fn`.

    model: maps inputs to logits `(..., classes)` (or a tuple whose first item is the logits).
    batch_fn: `batch_fn(generator) -> (inputs, targets)`, drawing randomness only from `generator`.
    seed: seeds the data generator and torch's global generator (dropout, if any).
    clip: gradient-norm clipping threshold (None: no clipping).
    optimizer: "adamw", which divides each gradient by its running size, or "sgd", plain
        gradient descent, whose steps are the gradient itself times lr.
    Returns the `History` of every step's loss and accuracy.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(batch_fn):
        raise ValueError(f"batch_fn must be a function generator -> (inputs, targets), "
                         f"got {type(batch_fn).__name__}")
    steps, lr = check_count(steps, "steps"), check_number(lr, "lr", above=0)

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)  # data is drawn on the CPU, then moved
    device = next(model.parameters(), torch.empty(0)).device
    optimizers = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
    if optimizer not in optimizers:
        raise ValueError(f"optimizer should be one of {sorted(optimizers)}, got {optimizer!r}")
    optimizer = optimizers[optimizer](model.parameters(), lr=lr, weight_decay=weight_decay)
    history = History()
    model.train()
    with deterministic():
        bar = tqdm(range(steps), desc=desc, disable=not progress, leave=False)
        for step in bar:
            inputs, targets = batch_fn(generator)
            inputs, targets = _to(inputs, device), _to(targets, device)
            logits = _logits(model(inputs))
            if logits.shape[:-1] != targets.shape:
                raise ValueError(f"model output has shape {tuple(logits.shape)}, so targets "
                                 f"should have shape {tuple(logits.shape[:-1])}; "
                                 f"got {tuple(targets.shape)}")
            loss = cross_entropy(logits, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            history.loss.append(float(loss.detach()))
            history.accuracy.append(accuracy(logits.detach(), targets))
            if step % 50 == 0 or step == steps - 1:
                bar.set_postfix(loss=f"{history.loss[-1]:.3f}")
    model.eval()
    return history


@torch.no_grad()
def evaluate(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Accuracy of `model` on one fixed batch (eval mode, no gradients)."""
    model.eval()
    device = next(model.parameters(), torch.empty(0)).device
    return accuracy(_logits(model(_to(inputs, device))), _to(targets, device))
