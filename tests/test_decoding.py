"""Tests for course_lib.decoding: temperature, top-k, top-p and sampling, and generate with them.

Each knob is pinned by its defining property: top-k keeps exactly k tokens (ties to the lower
id), top-p keeps the smallest set whose mass reaches p (against every subset of a small
vocabulary), temperature 0 is the argmax, temperature 1 the model's own softmax, checked by the
frequencies of many samples (within 5 standard errors). No reference library is installed
(transformers is not a dependency), so the references are written out here.
"""

import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from course_lib.decoding import (
    apply_temperature,
    next_token_probs,
    sample_from,
    sample_next,
    top_k_filter,
    top_p_filter,
)
from course_lib.measure import threads
from course_lib.models import TinyTransformer

NEG = float("-inf")


@pytest.fixture(autouse=True)
def _one_thread():
    with threads(1):
        yield


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# logits rounded to halves, so ties are common; a small vocabulary keeps subsets countable
small_logits = st.lists(st.integers(-8, 8).map(lambda x: x / 2), min_size=1, max_size=8).map(
    lambda xs: torch.tensor(xs, dtype=torch.float64))


# ---------------------------------------------------------------- top-k

@settings(max_examples=60, deadline=None)
@given(small_logits, st.data())
def test_top_k_keeps_exactly_k_the_largest_ties_to_the_lower_id(logits, data):
    k = data.draw(st.integers(1, len(logits)))
    out = top_k_filter(logits, k)
    kept = torch.isfinite(out)
    assert int(kept.sum()) == k
    assert torch.equal(out[kept], logits[kept])  # survivors are untouched
    if k < len(logits):
        assert logits[kept].min() >= logits[~kept].max()  # every kept >= every dropped
        edge = logits[kept].min()  # the k-th logit: tied tokens kept by id, lowest first
        tied = (logits == edge).nonzero().flatten().tolist()
        kept_tied = [i for i in tied if kept[i]]
        assert kept_tied == tied[:len(kept_tied)]


def test_top_k_tie_rule_spelled_out():
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 2.0, 2.0])
    assert torch.isfinite(top_k_filter(logits, 3)).nonzero().flatten().tolist() == [1, 2, 3]
    assert torch.isfinite(top_k_filter(logits, 1)).nonzero().flatten().tolist() == [1]
    assert torch.equal(top_k_filter(logits, 6), logits)


def test_top_k_one_is_greedy_and_batch_rows_are_independent():
    logits = torch.randn(3, 4, 11, generator=_gen(1))
    out = top_k_filter(logits, 1)
    assert torch.equal(torch.isfinite(out).nonzero()[:, -1].view(3, 4), logits.argmax(-1))
    picks = sample_next(logits, top_k=1, generator=_gen(2))
    assert picks.shape == (3, 4) and torch.equal(picks, logits.argmax(-1))
    rows = top_k_filter(logits, 5)
    for i, j in itertools.product(range(3), range(4)):
        assert torch.equal(rows[i, j], top_k_filter(logits[i, j], 5))


# ---------------------------------------------------------------- top-p

def _smallest_reaching(probs, p):
    """Brute force: the size of the smallest subset of tokens whose mass reaches p, and the
    largest mass a subset of that size holds."""
    n = len(probs)
    for size in range(1, n + 1):
        masses = [sum(probs[i] for i in s) for s in itertools.combinations(range(n), size)]
        if max(masses) >= p:
            return size, max(masses)
    raise AssertionError("the whole vocabulary reaches any p <= 1")


@settings(max_examples=60, deadline=None)
@given(small_logits, st.floats(0.01, 0.99))
def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p(logits, p):
    probs = torch.softmax(logits, -1)
    sorted_probs = probs.sort(descending=True).values
    # keep clear of the boundary, where rounding alone decides whether a prefix reaches p
    assume(((sorted_probs.cumsum(0) - p).abs() > 1e-9).all())
    kept = torch.isfinite(top_p_filter(logits, p))
    size, mass = _smallest_reaching(probs.tolist(), p)
    assert int(kept.sum()) == size
    assert math.isclose(float(probs[kept].sum()), mass, rel_tol=1e-12)
    assert float(probs[kept].sum()) >= p  # reaches p ...
    if size > 1:  # ... and the token that crossed p was needed: without it the set falls short
        assert float(probs[kept].sum() - probs[kept].min()) < p


def test_top_p_keeps_the_token_that_crosses_p_and_p_one_keeps_all():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    logits = probs.log()
    assert torch.isfinite(top_p_filter(logits, 0.5)).tolist() == [True, False, False, False]
    assert torch.isfinite(top_p_filter(logits, 0.51)).tolist() == [True, True, False, False]
    assert torch.isfinite(top_p_filter(logits, 0.9)).tolist() == [True, True, True, False]
    assert torch.isfinite(top_p_filter(logits, 1e-6)).tolist() == [True, False, False, False]
    extreme = torch.tensor([60.0, 0.0, -40.0, NEG])  # probabilities below 1e-26 survive p = 1
    assert torch.equal(top_p_filter(extreme, 1.0), extreme)


def test_top_p_ties_follow_the_lower_id_and_rows_are_independent():
    logits = torch.tensor([[0.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, NEG]])
    out = top_p_filter(logits, 0.5)  # row 0: three tokens of ~0.3 each: the two lower ids reach
    assert torch.isfinite(out).tolist() == [[False, True, True, False],
                                            [True, False, False, False]]


# ---------------------------------------------------------------- temperature

@pytest.mark.parametrize("shape", [(7,), (2, 5), (2, 3, 9)])
def test_temperature_divides_the_scores_before_the_softmax(shape):
    logits = torch.randn(shape, generator=_gen(3)) * 4
    for t in (0.25, 1.0, 3.0):
        assert_close(apply_temperature(logits, t), logits / t)
        assert_close(next_token_probs(logits, temperature=t), torch.softmax(logits / t, -1))
    assert_close(next_token_probs(logits), torch.softmax(logits, -1))  # T = 1: the model's own


def test_temperature_zero_is_greedy_exactly_and_the_limit_of_small_temperatures():
    logits = torch.tensor([[0.3, 2.0, 2.0, -1.0], [NEG, -5.0, 1e4, -1e4], [1.0, 0.0, 0.5, NEG]])
    greedy = logits.argmax(-1)
    probs = next_token_probs(logits, temperature=0)
    assert torch.equal(probs, torch.nn.functional.one_hot(greedy, 4).float())  # ties: lower id
    assert not torch.isnan(apply_temperature(logits, 0)).any()
    assert torch.equal(sample_next(logits, temperature=0), greedy)  # no generator needed
    unique = logits[1:]  # rows with a unique maximum: small T approaches the one-hot
    gaps = [float((next_token_probs(unique, temperature=t) - probs[1:]).abs().max())
            for t in (1.0, 0.3, 0.1, 0.01)]
    assert all(a > b for a, b in zip(gaps, gaps[1:])) and gaps[-1] < 1e-12
    assert torch.equal(sample_next(unique, temperature=0.01, generator=_gen()), greedy[1:])


def test_high_temperature_flattens_towards_uniform():
    logits = torch.tensor([3.0, 1.0, 0.0, -2.0])
    assert_close(next_token_probs(logits, temperature=1e4), torch.full((4,), 0.25), atol=1e-3,
                 rtol=0)


# ---------------------------------------------------------------- sampling frequencies

def _frequencies_match(samples, probs, vocab):
    """Each token's count within 5 standard errors of n p (binomial), dropped tokens never."""
    n = samples.numel()
    counts = torch.bincount(samples.flatten(), minlength=vocab).double()
    expected = n * probs.double()
    se = (n * probs.double() * (1 - probs.double())).sqrt()
    assert ((counts - expected).abs() <= 5 * se + 1e-9).all(), (counts, expected)
    assert (counts[probs == 0] == 0).all()


@pytest.mark.parametrize("knobs", [{}, {"temperature": 0.6}, {"temperature": 2.0},
                                   {"top_k": 3}, {"top_p": 0.8}, {"temperature": 1.5, "top_k": 4,
                                                                   "top_p": 0.9}])
def test_sampling_frequencies_follow_the_distribution(knobs):
    logits = torch.tensor([2.0, 1.5, 0.5, 0.0, -1.0, NEG, 1.0])
    probs = next_token_probs(logits, **knobs)
    samples = sample_next(logits.expand(20000, 7), generator=_gen(4), **knobs)  # (20000,)
    _frequencies_match(samples, probs, 7)
    if "top_k" in knobs:
        assert int((probs > 0).sum()) == knobs["top_k"]


def test_temperature_one_samples_the_models_own_distribution():
    torch.manual_seed(0)
    model = TinyTransformer(9, 16, 2, 1, 16).eval()
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]]))[0, -1]  # (9,)
    samples = sample_next(logits.expand(20000, 9), generator=_gen(5))
    _frequencies_match(samples, torch.softmax(logits, -1), 9)


def test_sample_from_is_the_inverse_cdf_and_never_picks_probability_zero():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    draws = sample_from(probs.expand(4000, 5), _gen(6))
    assert set(draws.tolist()) == {1, 3}
    u = torch.rand(4000, 1, generator=_gen(6), dtype=torch.float64)[:, 0]  # the same uniforms
    assert torch.equal(draws, torch.where(u < 0.25, 1, 3))
    unnormalised = sample_from(probs.expand(4000, 5) * 8, _gen(6))  # rows need not sum to 1
    assert torch.equal(unnormalised, draws)


def test_seeded_sampling_is_reproducible_and_seeds_differ():
    logits = torch.randn(64, 20, generator=_gen(7))
    a = sample_next(logits, temperature=1.2, top_p=0.95, generator=_gen(8))
    assert torch.equal(a, sample_next(logits, temperature=1.2, top_p=0.95, generator=_gen(8)))
    assert not torch.equal(a, sample_next(logits, temperature=1.2, top_p=0.95, generator=_gen(9)))


# ---------------------------------------------------------------- TinyTransformer.generate

def _model(seed=0):
    torch.manual_seed(seed)
    return TinyTransformer(23, 16, 2, 2, 48)


def test_generate_samples_reproducibly_with_and_without_the_cache():
    model = _model()
    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    knobs = {"temperature": 1.0, "top_k": 10, "top_p": 0.95}
    a = model.generate(prompt, 20, generator=_gen(10), **knobs)
    assert torch.equal(a, model.generate(prompt, 20, generator=_gen(10), **knobs))
    assert torch.equal(a, model.generate(prompt, 20, use_cache=False, generator=_gen(10), **knobs))
    assert not torch.equal(a, model.generate(prompt, 20, generator=_gen(11), **knobs))
    greedy = model.generate(prompt, 20)
    assert torch.equal(model.generate(prompt, 20, temperature=1.0, top_k=1, generator=_gen()),
                       greedy)
    assert torch.equal(model.generate(prompt, 20, temperature=0.0), greedy)


def test_generate_sampled_tokens_follow_the_step_logits():
    model = _model(1)
    out, logits = model.generate(torch.tensor([2, 7]), 12, temperature=0.8, top_k=5,
                                 generator=_gen(12), return_logits=True)
    kept = torch.isfinite(top_k_filter(logits, 5))  # (12, vocab): every pick inside its top 5
    assert kept.gather(1, out[2:, None]).all()


# ---------------------------------------------------------------- bad input, refused by name

@pytest.mark.parametrize("call,match", [
    (lambda x: top_k_filter(x, 0), "top_k must be a positive integer, got 0"),
    (lambda x: top_k_filter(x, 6), r"top_k must lie in 1..vocab=5 .*got 6"),
    (lambda x: top_k_filter(x, 2.0), "top_k must be a positive integer"),
    (lambda x: top_p_filter(x, 0.0), r"top_p must be a number in \(0, 1\].*got 0.0"),
    (lambda x: top_p_filter(x, 1.5), r"top_p must be .*got 1.5"),
    (lambda x: top_p_filter(x, float("nan")), "top_p must be"),
    (lambda x: apply_temperature(x, -0.5), "temperature must be a finite number >= 0.*-0.5"),
    (lambda x: apply_temperature(x, float("nan")), "temperature must be"),
    (lambda x: sample_next(x, temperature=True), "temperature must be"),
    (lambda x: sample_next(x), "generator is missing"),
    (lambda x: sample_next(x, generator=0), "generator must be a torch.Generator, got int"),
    (lambda x: sample_next(x.long(), generator=_gen()), "logits must be a floating-point tensor"),
    (lambda x: sample_next(x[0, 0], generator=_gen()), r"logits has shape \(\), wanted"),
    (lambda x: sample_next(x[:, :0], generator=_gen()), r"logits has shape \(2, 0\)"),
    (lambda x: sample_next(x.numpy(), generator=_gen()), "logits must be a torch.Tensor"),
    (lambda x: sample_next(x.index_fill(1, torch.tensor([2]), float("nan")), generator=_gen()),
     r"logits of shape \(2, 5\) holds NaN or \+inf"),
    (lambda x: sample_next(x.index_fill(0, torch.tensor([1]), NEG), generator=_gen()),
     r"every logit -inf \(at index \(1,\)\)"),
    (lambda x: sample_from(-x.abs(), _gen()), r"probs of shape \(2, 5\) must hold"),
])
def test_bad_input_is_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.randn(2, 5, generator=_gen(13)))


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": 1.0}, "generator is missing"),
    ({"top_k": 3}, "change nothing at temperature=0"),
    ({"top_p": 0.9}, "change nothing at temperature=0"),
    ({"temperature": 1.0, "top_k": 24, "generator": _gen()}, "top_k must lie in 1..vocab=23"),
    ({"temperature": -1.0}, "temperature must be"),
])
def test_generate_refuses_bad_decoding_arguments_before_any_work(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _model().generate(torch.tensor([[1, 2]]), 3, **kwargs)
