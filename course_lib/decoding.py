"""Chapter 11: decoding beyond greedy. Turning a model's next-token logits into a choice.

Greedy decoding takes the argmax every step. Sampling draws the next token from a distribution
built from the logits, shaped by three knobs, applied in this order:

    temperature T   logits / T before the softmax: chapter 01's temperature, the same division
                    of scores. T = 1 is the model's own distribution, T -> 0 the argmax
                    (T = 0 is taken as greedy exactly), large T flattens towards uniform
    top-k           keep the k largest logits, set the rest to -inf
    top-p (nucleus) keep the smallest set of most likely tokens whose probability reaches p
                    (the token that crosses p is kept), set the rest to -inf

Ties follow one rule everywhere: among equal logits the LOWER token id ranks first (a stable
sort, and torch.argmax's own rule), so top-k keeps exactly k tokens, top_k=1 is greedy, and
T = 0 picks what argmax picks. logits: (..., vocab); every function works on any leading dims.

This module sits below `course_lib.models` (TinyTransformer.generate samples with it) and
imports only `validate` and `attention.softmax`.
"""

from __future__ import annotations

import numbers

import torch

from course_lib.attention import softmax
from course_lib.validate import check_count, check_float_tensor, shape_of, wrong_shape

__all__ = ["apply_temperature", "top_k_filter", "top_p_filter", "next_token_probs",
           "sample_from", "sample_next", "check_decoding",
           "check_generator"]


# ---------------------------------------------------------------------- input checks

def _check_logits(logits, name: str = "logits") -> None:
    """A float tensor (..., vocab) with vocab >= 1, no NaN or +inf, and a finite entry per row."""
    check_float_tensor(logits, name, "(..., vocab)", min_ndim=1)
    if logits.shape[-1] == 0:
        raise wrong_shape(name, logits, "(..., vocab) with vocab >= 1")
    if torch.isnan(logits).any() or (logits == float("inf")).any():
        raise ValueError(f"{name} of shape {shape_of(logits)} holds NaN or +inf; logits may be "
                         "finite or -inf (a token that can never be chosen)")
    dead = ~torch.isfinite(logits).any(dim=-1)
    if dead.any():
        where = tuple(int(i) for i in dead.nonzero()[0])
        raise ValueError(f"{name} of shape {shape_of(logits)} has a row with every logit -inf (at "
                         f"index {where}): no token can be chosen there")


def _check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) \
            or not temperature >= 0 or temperature == float("inf"):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy, 1 = the model's "
                         f"own distribution), got {temperature!r}")
    return float(temperature)


def _check_k(k, vocab: int) -> int:
    k = check_count(k, "top_k")
    if k > vocab:
        raise ValueError(f"top_k must lie in 1..vocab={vocab} (the logits' last dim), got {k}")
    return k


def _check_p(p) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p <= 1:
        raise ValueError(f"top_p must be a number in (0, 1] (the probability mass to keep; 1 keeps "
                         f"every token), got {p!r}")
    return float(p)


def check_generator(generator) -> None:
    """A torch.Generator, which sampling needs: without one the samples could not be repeated."""
    if generator is None:
        raise ValueError("generator is missing: sampling (temperature > 0) needs a seeded "
                         "torch.Generator, e.g. generator=torch.Generator().manual_seed(0), "
                         "so that the samples can be reproduced")
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")


def check_decoding(temperature=1.0, top_k=None, top_p=None, vocab: int | None = None):
    """The three knobs checked once (TinyTransformer.generate calls this before any work):
    returns (temperature, top_k, top_p) as float, int or None, float or None."""
    temperature = _check_temperature(temperature)
    if top_k is not None:
        top_k = check_count(top_k, "top_k") if vocab is None else _check_k(top_k, vocab)
    if top_p is not None:
        top_p = _check_p(top_p)
    return temperature, top_k, top_p


# ---------------------------------------------------------------------- the three knobs

def _ranked(logits: torch.Tensor) -> torch.Tensor:
    """Token ids from most to least likely, ties in favour of the lower id: (..., vocab)."""
    return torch.sort(logits, dim=-1, descending=True, stable=True).indices


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T (..., vocab): what the softmax then turns into probabilities.

    T = 1 leaves the logits alone; T < 1 stretches their differences (sharper), T > 1 squashes
    them (flatter). T = 0 has no division to do: it returns the limit's greedy choice, 0 at the
    argmax (the lowest id among ties) and -inf everywhere else.
    """
    _check_logits(logits)
    temperature = _check_temperature(temperature)
    if temperature == 0:
        best = logits.argmax(dim=-1, keepdim=True)  # (..., 1)
        out = torch.full_like(logits, float("-inf"))
        return out.scatter(-1, best, 0.0)  # (..., vocab): one finite logit per row
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep exactly the k largest logits of each row, set the others to -inf: (..., vocab).

    Ties at the k-th logit go to the lower token ids, so exactly k survive.
    """
    _check_logits(logits)
    k = _check_k(k, logits.shape[-1])
    drop = _ranked(logits)[..., k:]  # (..., vocab - k): every id ranked after the k-th
    return logits.scatter(-1, drop, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches p: (..., vocab).

    Rank the tokens by probability; keep a token if the mass of the tokens ranked before it is
    still below p. So the token that crosses p is kept, the set's mass is >= p, and p = 1 keeps
    every token of nonzero probability. The most likely token is always kept.
    """
    _check_logits(logits)
    p = _check_p(p)
    if p == 1:
        return logits.clone()  # every token; no rounding in a cumulative sum can drop one
    order = _ranked(logits)  # (..., vocab)
    probs = softmax(logits.double(), dim=-1).gather(-1, order)  # (..., vocab), sorted, float64
    before = probs.cumsum(dim=-1) - probs  # (..., vocab): mass ranked strictly before each token
    drop_sorted = before >= p  # the set already reached p without this token
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to token order
    return logits.masked_fill(drop, float("-inf"))


def next_token_probs(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None) -> torch.Tensor:
    """The distribution a sample is drawn from: (..., vocab), each row summing to 1.

    temperature first, then top-k, then top-p (measured on the tempered distribution), then the
    softmax. Greedy (temperature 0) is a one-hot row at the argmax.
    """
    _check_logits(logits)
    temperature, top_k, top_p = check_decoding(temperature, top_k, top_p, logits.shape[-1])
    scores = apply_temperature(logits, temperature)
    if top_k is not None:
        scores = top_k_filter(scores, top_k)
    if top_p is not None:
        scores = top_p_filter(scores, top_p)
    return softmax(scores, dim=-1)


# ---------------------------------------------------------------------- drawing a token

def sample_from(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token id per row of probs (..., vocab) -> (...), by the inverse of the CDF.

    Draw u uniform in [0, 1) and return the first token whose cumulative probability exceeds
    u x (the row's total): token j is chosen for a stretch of u as long as its probability, and
    a token of probability 0 never. A row's choice moves only if u falls within rounding of a
    boundary, so two CPUs whose probabilities differ in the last bits draw the same tokens.
    """
    check_float_tensor(probs, "probs", "(..., vocab)", min_ndim=1)
    check_generator(generator)
    if probs.shape[-1] == 0 or (probs < 0).any() or not torch.isfinite(probs).all() \
            or (probs.sum(-1) <= 0).any():
        raise ValueError(f"probs of shape {shape_of(probs)} must hold finite numbers >= 0 with a "
                         "positive sum in every row (..., vocab)")
    cdf = probs.double().cumsum(dim=-1)  # (..., vocab)
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, dtype=torch.float64,
                   device=probs.device)  # (..., 1)
    chosen = (cdf <= u * cdf[..., -1:]).sum(dim=-1)  # (...): boundaries passed
    return chosen.clamp(max=probs.shape[-1] - 1)


def sample_next(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None,
                ) -> torch.Tensor:
    """The next token id for each row of logits (..., vocab) -> (...), int64.

    temperature=0 is greedy (logits.argmax, no generator needed); otherwise a seeded
    `generator` is required and the token is drawn from next_token_probs(...).
    """
    _check_logits(logits)
    temperature, top_k, top_p = check_decoding(temperature, top_k, top_p, logits.shape[-1])
    if temperature == 0:
        return logits.argmax(dim=-1)  # greedy: top-k and top-p always keep the argmax
    check_generator(generator)
    probs = next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return sample_from(probs, generator)
