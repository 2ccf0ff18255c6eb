"""The one-layer models and tasks of chapters 02 (keys vs values) and 03 (the scale in training)."""

import math

import pytest
import torch

from course_lib.models.one_layer import (
    Aligner,
    CopyPrevious,
    KindLookup,
    PredecessorScores,
    copy_previous_batch,
    kind_lookup_batch,
    predecessor_batch,
    reverse_translate_batch,
)
from course_lib.train import evaluate, train


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kind_lookup_targets_are_the_content_of_the_asked_kind(seed):
    (kind_ids, content_ids, asked), target = kind_lookup_batch(torch.Generator().manual_seed(seed),
                                                               size=50, kinds=5, contents=7)
    assert kind_ids.shape == content_ids.shape == (50, 5) and asked.shape == target.shape == (50,)
    each_kind_once = torch.arange(5).expand(50, 5)
    assert torch.equal(kind_ids.sort(dim=-1).values, each_kind_once)
    for b in range(50):
        position = int((kind_ids[b] == asked[b]).nonzero())
        assert target[b] == content_ids[b, position]


def test_kind_lookup_model_ties_the_key_and_value_maps_only_when_asked():
    tied, separate = KindLookup(width=3, tie_kv=True), KindLookup(width=3, tie_kv=False)
    assert tied.W_V is tied.W_K and separate.W_V is not separate.W_K
    n_tied, n_separate = (sum(p.numel() for p in m.parameters()) for m in (tied, separate))
    assert n_separate - n_tied == 16 * 3
    batch, _ = kind_lookup_batch(torch.Generator().manual_seed(0), size=4, kinds=8, contents=8)
    logits, weights = separate(batch)
    assert logits.shape == (4, 8) and weights.shape == (4, 8)
    torch.testing.assert_close(weights.sum(-1), torch.ones(4))
    # the same seed gives the same model
    torch.testing.assert_close(KindLookup(width=3)(batch)[0], KindLookup(width=3)(batch)[0])


def test_kind_lookup_matches_a_plain_attention_computation():
    model = KindLookup(width=4, kinds=6, contents=5)
    batch, _ = kind_lookup_batch(torch.Generator().manual_seed(3), size=7, kinds=6, contents=5)
    kind_ids, content_ids, asked = batch
    x = model.kind_emb[kind_ids] + model.content_emb[content_ids]
    q = (model.ask_emb[asked] @ model.W_Q)[:, None, :]                      # (B, 1, width)
    out = torch.nn.functional.scaled_dot_product_attention(q, x @ model.W_K, x @ model.W_V)
    torch.testing.assert_close(model(batch)[0], out[:, 0] @ model.W_O + model.b_O)


def test_separate_maps_learn_the_lookup_where_tied_ones_cannot_at_width_2():
    test = kind_lookup_batch(torch.Generator().manual_seed(9), size=500)
    accuracy = {}
    for tie in (False, True):
        model = KindLookup(width=2, tie_kv=tie)
        train(model, kind_lookup_batch, steps=300, lr=1e-2, seed=0, progress=False)
        accuracy[tie] = evaluate(model, *test)
    assert accuracy[False] > 0.95 and accuracy[True] < 0.6


@pytest.mark.parametrize("n", [3, 6])
def test_copy_previous_targets_wrap_around_the_circle(n):
    (word_ids, places), target = copy_previous_batch(torch.Generator().manual_seed(0), size=9,
                                                     vocab=20, n=n)
    assert word_ids.shape == places.shape == target.shape == (9, n)
    assert torch.equal(target[:, 1:], word_ids[:, :-1])
    assert torch.equal(target[:, 0], word_ids[:, -1])
    assert torch.equal((places[:, 1:] - places[:, :-1]) % n, torch.ones(9, n - 1, dtype=torch.long))


@pytest.mark.parametrize("d_k", [4, 64])
def test_copy_previous_scale_is_one_over_root_d_k_or_nothing(d_k):
    batch, _ = copy_previous_batch(torch.Generator().manual_seed(1), size=3)
    scaled, raw = CopyPrevious(d_k, scaled=True), CopyPrevious(d_k, scaled=False)
    x = scaled.word_emb[batch[0]] + scaled.place_emb[batch[1]]
    reference = torch.nn.functional.scaled_dot_product_attention(
        x @ scaled.W_Q, x @ scaled.W_K, x @ scaled.W_V)              # default scale 1/sqrt(d_k)
    torch.testing.assert_close(scaled(batch)[0], reference @ scaled.W_O + scaled.b_O)
    unscaled = torch.nn.functional.scaled_dot_product_attention(
        x @ raw.W_Q, x @ raw.W_K, x @ raw.W_V, scale=1.0)
    torch.testing.assert_close(raw(batch)[0], unscaled @ raw.W_O + raw.b_O)
    assert scaled.scale == pytest.approx(1 / math.sqrt(d_k)) and raw.scale == 1.0


def test_unscaled_scores_start_saturated_at_large_d_k():
    batch, _ = copy_previous_batch(torch.Generator().manual_seed(2), size=200)
    with torch.no_grad():
        largest = {s: CopyPrevious(512, scaled=s)(batch)[1].amax(-1).mean().item() for s in (1, 0)}
    assert largest[0] > 0.9 > 0.6 > largest[1]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_sizes_raise_value_errors_naming_the_argument(bad):
    with pytest.raises(ValueError, match="width must be a positive integer"):
        KindLookup(width=bad)
    with pytest.raises(ValueError, match="d_k must be a positive integer"):
        CopyPrevious(d_k=bad)
    with pytest.raises(ValueError, match="size must be a positive integer"):
        kind_lookup_batch(torch.Generator(), size=bad)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        copy_previous_batch(torch.Generator(), n=bad)


def test_reverse_translate_targets_are_the_reversed_translation():
    source, target = reverse_translate_batch(torch.Generator().manual_seed(0), size=5, vocab=7,
                                             n=4)
    assert source.shape == target.shape == (5, 4)
    for t in range(4):
        assert torch.equal(target[:, t], (source[:, 3 - t] + 1) % 7)


@pytest.mark.parametrize("score", ["dot", "additive"])
def test_aligner_scores_follow_their_formulas(score):
    model = Aligner(score, vocab=9, n=5, d=8)
    q, k = torch.randn(5, 8), torch.randn(3, 5, 8)
    got = model.scores(q, k)                                               # (3, 5, 5)
    expected = torch.empty(3, 5, 5)
    for b in range(3):
        for t in range(5):
            for j in range(5):
                if score == "dot":
                    expected[b, t, j] = q[t] @ k[b, j] / math.sqrt(8)
                else:
                    hidden = torch.tanh(q[t] @ model.W_a + k[b, j] @ model.U_a)
                    expected[b, t, j] = model.w_a @ hidden
    torch.testing.assert_close(got, expected)
    source, _ = reverse_translate_batch(torch.Generator().manual_seed(1), size=3, vocab=9, n=5)
    logits, weights = model(source)
    assert logits.shape == (3, 5, 9) and weights.shape == (3, 5, 5)


@pytest.mark.parametrize("score", ["dot", "additive"])
def test_both_scores_learn_the_alignment(score):
    model = Aligner(score)
    train(model, reverse_translate_batch, steps=150, lr=1e-2, seed=0, progress=False)
    test = reverse_translate_batch(torch.Generator().manual_seed(7), size=300)
    assert evaluate(model, *test) > 0.9
    with torch.no_grad():
        weights = model(test[0])[1].mean(0)                                # (n_t, n_s)
    assert weights.flip(-1).diagonal().min() > 0.8               # target t -> source n-1-t


def test_aligner_rejects_an_unknown_score():
    with pytest.raises(ValueError, match=r"score must be one of \('dot', 'additive'\)"):
        Aligner("cosine")


@pytest.mark.parametrize("n", [3, 6])
def test_predecessor_targets_point_one_back_around_the_circle(n):
    (word_ids, places), target = predecessor_batch(torch.Generator().manual_seed(0), size=20,
                                                   vocab=9, n=n)
    assert word_ids.shape == places.shape == target.shape == (20, n)
    assert torch.equal(target[0], (torch.arange(n) - 1) % n)
    assert torch.equal((places - places[:, :1]) % n, torch.arange(n).expand(20, n))


def test_predecessor_model_is_chapter_02s_inline_model():
    # chapter 02 draws, from one generator seeded 1: emb, pos, W_Q, then W_K (unless tied)
    g = torch.Generator().manual_seed(1)
    emb, pos = torch.randn(50, 16, generator=g) * 0.5, torch.randn(6, 16, generator=g) * 0.5
    W_Q, W_K = (torch.randn(16, 16, generator=g) / 4 for _ in range(2))
    batch, _ = predecessor_batch(torch.Generator().manual_seed(2), size=4)
    x = emb[batch[0]] + pos[batch[1]]
    want = (x @ W_Q) @ (x @ W_K).transpose(-2, -1) / 4
    torch.testing.assert_close(PredecessorScores()(batch), want, rtol=0, atol=0)
    tied = PredecessorScores(tied=True)
    assert tied.W_K is tied.W_Q
    scores = tied(batch)
    torch.testing.assert_close(scores, scores.transpose(-2, -1))          # symmetric


def test_without_places_the_scores_only_see_words():
    model = PredecessorScores(places=False)
    assert model.pos is None
    assert sum(p.numel() for p in model.parameters()) == 50 * 16 + 2 * 16 * 16
    (word_ids, places), _ = predecessor_batch(torch.Generator().manual_seed(0), size=3)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    moved = model((word_ids, (places + 2) % 6))                          # other places: no change
    torch.testing.assert_close(moved, model((word_ids, places)))
    shuffled = model((word_ids[:, perm], places))                        # permutation-equivariant
    torch.testing.assert_close(shuffled, model((word_ids, places))[:, perm][:, :, perm])


def test_places_are_what_make_the_predecessor_learnable():
    test = predecessor_batch(torch.Generator().manual_seed(3), size=500)
    accuracy = {}
    for places in (True, False):
        model = PredecessorScores(places=places)
        train(model, predecessor_batch, steps=150, lr=1e-2, seed=2, clip=None, progress=False)
        accuracy[places] = evaluate(model, *test)
    assert accuracy[True] > 0.95 and accuracy[False] < 0.3


def test_predecessor_bad_sizes_name_the_argument():
    with pytest.raises(ValueError, match="d_k must be a positive integer"):
        PredecessorScores(d_k=0)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        predecessor_batch(torch.Generator(), n=-1)
