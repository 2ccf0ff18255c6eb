"""Chapter 06's encoder-decoder: the toy language's rule, cross-attention against PyTorch's own
and against its formula, clear errors, and the shipped sweep against the command that makes it."""

import json

import pytest
import torch
import torch.nn.functional as F

from course_lib import seq2seq
from course_lib.seq2seq import CrossAttention, Seq2Seq, alignment, encode, sentences


def test_the_rule_on_a_sentence_written_by_hand():
    words = "the big red dog sees a cat and the fox".split()
    assert seq2seq.translate_words(words) == "THE DOG BIG RED A CAT AND THE FOX SEES".split()
    assert alignment(words) == [0, 3, 1, 2, 5, 6, 7, 8, 9, 4]  # crossing: not monotone


def test_a_sentence_outside_the_grammar_is_refused():
    with pytest.raises(ValueError, match="'dog the sees'"):
        alignment("dog the sees".split())


def test_the_generator_is_seeded_and_its_targets_follow_the_rule():
    first = sentences(torch.Generator().manual_seed(3), 200)
    assert first == sentences(torch.Generator().manual_seed(3), 200)
    assert first != sentences(torch.Generator().manual_seed(4), 200)
    lengths = {len(s) for s in first}
    assert min(lengths) == 5 and max(lengths) <= 24 and len(lengths) > 12
    assert {s.count("and") for s in first} == {0, 1, 2, 3}          # 1..4 objects
    assert all(len(s) == 5 for s in sentences(torch.Generator(), 20, max_adjectives=0,
                                              objects=1))
    (source, target_in), target_out = encode(first)
    for b, words in enumerate(first):
        ids = [seq2seq.TARGET_VOCAB.index(w) for w in seq2seq.translate_words(words)]
        m = len(ids)
        assert [seq2seq.SOURCE_VOCAB[i] for i in source[b, :len(words)]] == words
        assert (source[b, len(words):] == 0).all()
        assert target_out[b, :m].tolist() == ids and target_out[b, m] == 2        # then <eos>
        assert target_in[b, 0] == 1 and target_in[b, 1:m + 1].tolist() == ids    # <bos> first
        assert (target_out[b, m + 1:] == -100).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_dot_cross_attention_is_scaled_dot_product_attention(seed):
    torch.manual_seed(seed)
    cross = CrossAttention(6, 10, d_attn=4, score="dot")
    query, keys = torch.randn(3, 5, 6), torch.randn(3, 7, 10)
    mask = torch.arange(7) < torch.tensor([7, 4, 1])[:, None]               # (3, 7)
    context, weights = cross(query, keys, mask)
    theirs = F.scaled_dot_product_attention(cross.W_q(query), cross.W_k(keys), keys,
                                            attn_mask=mask[:, None, :])
    torch.testing.assert_close(context, theirs)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 5))
    assert (weights[~mask[:, None, :].expand_as(weights)] == 0).all()


def test_additive_score_is_bahdanaus_formula():
    torch.manual_seed(2)
    cross = CrossAttention(6, 10, d_attn=4, score="additive")
    query, keys = torch.randn(2, 3, 6), torch.randn(2, 5, 10)
    W, U, b, v = (p.detach() for p in (cross.W.weight, cross.U.weight, cross.U.bias,
                                       cross.v.weight[0]))
    direct = torch.tensor([[[float(v @ torch.tanh(W @ query[n, i] + U @ keys[n, j] + b))
                             for j in range(5)] for i in range(3)] for n in range(2)])
    torch.testing.assert_close(cross.scores(query, keys), direct)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    context, weights = cross(query, keys, mask)
    expected = direct.masked_fill(~mask[:, None, :], float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(context, expected @ keys)
    assert (weights[1, :, 2:] == 0).all()


@pytest.mark.parametrize("attention", [None, "dot", "additive"])
def test_the_encoder_decoder_shapes(attention):
    torch.manual_seed(0)
    model = Seq2Seq(d_hidden=8, d_embed=4, attention=attention)
    (source, target_in), target_out = encode(sentences(torch.Generator().manual_seed(0), 4))
    logits, weights = model((source, target_in))
    assert logits.shape == (*target_out.shape, len(seq2seq.TARGET_VOCAB))
    tokens, looked = model.translate(source, 6)
    assert tokens.shape == (4, 6)
    if attention is None:
        assert weights is None and looked is None
    else:
        assert weights.shape == (4, target_in.shape[1], source.shape[1])
        assert looked.shape == (4, 6, source.shape[1])
        padding = (source == 0)[:, None, :].expand_as(looked)
        assert (looked[padding] == 0).all()
        torch.testing.assert_close(looked.sum(-1), torch.ones(4, 6))


def test_training_is_seeded():
    _, first = seq2seq.train_translator("dot", seed=0, steps=3)
    _, again = seq2seq.train_translator("dot", seed=0, steps=3)
    assert first == again


def test_bad_input_is_refused_with_the_argument_and_its_shape():
    cross = CrossAttention(6, 10)
    with pytest.raises(ValueError, match=r"query has shape \(2, 3, 5\), wanted .*d_query=6"):
        cross(torch.randn(2, 3, 5), torch.randn(2, 4, 10))
    with pytest.raises(ValueError, match=r"keys has shape \(3, 4, 10\), wanted \(batch=2"):
        cross(torch.randn(2, 3, 6), torch.randn(3, 4, 10))
    with pytest.raises(ValueError, match=r"key_mask must be a bool tensor of shape \(2, 4\)"):
        cross(torch.randn(2, 3, 6), torch.randn(2, 4, 10), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="score must be one of"):
        CrossAttention(6, 10, score="bilinear")
    with pytest.raises(ValueError, match="attention must be one of"):
        Seq2Seq(attention="bahdanau")
    model = Seq2Seq(d_hidden=8, d_embed=4)
    gap = torch.tensor([[3, 0, 5]])
    with pytest.raises(ValueError, match=r"source of shape \(1, 3\) must hold right-padded"):
        model.translate(gap, 2)
    with pytest.raises(ValueError, match=r"target_in has \(2,\)"):
        model((torch.tensor([[3, 5]]), torch.tensor([[1], [1]])))
    with pytest.raises(ValueError, match="objects must lie in 1..max_objects=4"):
        sentences(torch.Generator(), 3, objects=5)


# ---------------------------------------------------------------- the shipped record
def test_the_shipped_record_is_the_sweep_its_command_makes():
    record = seq2seq.record()
    assert record["command"] == seq2seq.COMMAND == "python -m course_lib.seq2seq"
    assert record["spec"] == seq2seq.SPEC
    assert record["steps"] == list(seq2seq.STEPS) and record["seeds"] == list(seq2seq.SEEDS)
    assert record["test_size"] == seq2seq.TEST_SIZE and record["made_with"]["threads"] == 1
    grid = [(s, a or "none", seed) for s in seq2seq.STEPS for a in seq2seq.ATTENTIONS
            for seed in seq2seq.SEEDS]
    assert [(r["steps"], r["attention"], r["seed"]) for r in record["runs"]] == grid
    bins = [list(b) for b in seq2seq.LENGTH_BINS]
    assert all(r["bins"] == bins and sum(r["count"]) == seq2seq.TEST_SIZE for r in record["runs"])


def test_the_shipped_record_shows_what_the_lecture_says():
    runs = seq2seq.record()["runs"]
    for r in runs:
        acc = r["word_accuracy"]
        if r["attention"] == "none":   # the bottleneck: every seed and budget falls with length
            assert acc[0] > acc[-1] + 0.15 and r["on_source_word"] is None
        else:                          # attention holds at every length
            assert min(acc) > 0.9


def test_the_command_writes_the_record(tmp_path):
    out = tmp_path / "record.json"
    seq2seq.main(["--steps", "2", "--seeds", "0", "--test-size", "30", "--out", str(out)])
    record = json.loads(out.read_text())
    assert [(r["attention"], r["steps"]) for r in record["runs"]] == [
        ("none", 2), ("additive", 2), ("dot", 2)]
    assert record["command"] == seq2seq.COMMAND and record["spec"] == seq2seq.SPEC
    with pytest.raises(FileNotFoundError, match="python -m course_lib.seq2seq"):
        seq2seq.record(tmp_path / "missing.json")
