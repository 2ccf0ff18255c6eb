"""Chapter 10's tasks and measurements: induction, the trophy-and-suitcase language, real text."""

import pytest
import torch

from course_lib.measure import threads
from course_lib.models import TinyTransformer
from course_lib.stacking.induction import (
    ablate_head,
    attention_weights,
    head_scores,
    induction_batch,
    induction_score,
    induction_targets,
    previous_token_score,
)
from course_lib.stacking.pronoun import PronounTask, accuracy_by_filler
from course_lib.stacking.text import (
    CharTokenizer,
    corpus_text,
    current_token_score,
    delimiter_score,
    head_jobs,
    repeat_score,
    repeated_random,
    repeated_text,
    split,
    text_batch,
)
from course_lib.train import IGNORE_INDEX


@pytest.fixture(autouse=True)
def _one_thread():
    with threads(1):
        yield


# ---------------------------------------------------------------- induction

@pytest.mark.parametrize("segment,gap,vocab,seed", [(8, 8, 32, 0), (4, 0, 4, 1), (5, 10, 20, 2)])
def test_induction_batch_repeats_a_segment_after_a_random_gap(segment, gap, vocab, seed):
    tokens, targets = induction_batch(torch.Generator().manual_seed(seed), 50, segment, gap, vocab)
    n = gap + 2 * segment
    assert tokens.shape == targets.shape == (50, n)
    first = tokens[:, :gap + segment]
    assert all(len(set(row.tolist())) == gap + segment for row in first)  # distinct tokens
    x = tokens[:, gap + segment:]  # the repeat
    starts = set()
    for b in range(50):
        start = first[b].tolist().index(int(x[b, 0]))
        starts.add(start)
        assert torch.equal(first[b, start:start + segment], x[b])  # the earlier copy
    if gap:
        assert len(starts) > 1  # the offset varies: no fixed distance finds the answer
    counted = targets != IGNORE_INDEX
    assert counted.sum(1).eq(segment - 1).all()
    assert torch.equal(targets[:, gap + segment:-1], x[:, 1:])


def test_induction_targets_point_after_the_latest_earlier_occurrence():
    tokens = torch.tensor([[5, 1, 2, 5, 2, 5]])
    assert induction_targets(tokens).tolist() == [[-1, -1, -1, 1, 3, 4]]


def test_scores_on_weights_built_to_do_one_job():
    tokens, _ = induction_batch(torch.Generator().manual_seed(3), 4, 6, 4, 16)
    n = tokens.shape[1]
    prev = torch.zeros(4, 1, n, n)
    prev[:, 0, 0, 0] = 1
    prev[:, 0, torch.arange(1, n), torch.arange(n - 1)] = 1
    target = induction_targets(tokens)
    ind = prev.clone()  # an induction head: on the token after the earlier occurrence
    for b in range(4):
        for i in range(n):
            if target[b, i] >= 0:
                ind[b, 0, i] = 0
                ind[b, 0, i, target[b, i]] = 1
    w = torch.cat([prev, ind], dim=1)  # (B, 2 heads, n, n)
    torch.testing.assert_close(previous_token_score(w)[0], torch.tensor(1.0))
    assert float(previous_token_score(w)[1]) < 0.8
    scores = induction_score(w, tokens)
    assert float(scores[0]) < 0.2 and float(scores[1]) == 1.0
    with pytest.raises(ValueError, match=r"weights has shape \(4, 2, 5\)"):
        previous_token_score(torch.zeros(4, 2, 5))
    with pytest.raises(ValueError, match="tokens has shape"):
        induction_score(w, tokens[:, :3])


def test_ablate_head_removes_exactly_that_heads_output_and_restores_it():
    torch.manual_seed(0)
    model = TinyTransformer(11, 16, 4, 2, 12).eval()
    tokens = torch.randint(0, 11, (3, 12))
    with torch.no_grad():
        before = model(tokens)
    attn = model.blocks[0].attn
    # the head's contribution, by hand: its slice of the merged heads, before W_O
    hook = attn.out_proj.register_forward_pre_hook(
        lambda mod, args: (args[0].index_fill(-1, torch.arange(4, 8), 0.0),))
    with torch.no_grad():
        by_hand = model(tokens)
    hook.remove()
    with ablate_head(model, 0, 1), torch.no_grad():
        ablated = model(tokens)
    torch.testing.assert_close(ablated, by_hand, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(ablated, before)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), before, atol=0, rtol=0)  # restored exactly
    with ablate_head(model, 1, [0, 3]):
        w_o = model.blocks[1].attn.out_proj.weight.detach()
        assert float(w_o[:, :4].abs().sum()) == 0.0 and float(w_o[:, 12:].abs().sum()) == 0.0
        assert float(w_o[:, 4:12].abs().sum()) > 0.0
    with pytest.raises(ValueError, match="head should be in 0..3"):
        with ablate_head(model, 0, 4):
            pass
    with pytest.raises(ValueError, match="layer should be in 0..1"):
        with ablate_head(model, 2, 0):
            pass


def test_head_scores_and_attention_weights_have_one_row_per_layer():
    torch.manual_seed(1)
    model = TinyTransformer(32, 16, 2, 3, 24)
    tokens, _ = induction_batch(torch.Generator().manual_seed(0), 5, 8, 8, 32)
    w = attention_weights(model, tokens)
    assert w.shape == (3, 5, 2, 24, 24)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 5, 2, 24))
    scores = head_scores(model, tokens)
    assert scores["previous"].shape == scores["induction"].shape == (3, 2)


# ---------------------------------------------------------------- the trophy and the suitcase

def test_pronoun_sentences_follow_the_rule_and_have_one_length():
    task = PronounTask(max_filler=6)
    tokens, targets = task.batch(torch.Generator().manual_seed(0), 200)
    assert tokens.shape == (200, task.n) and task.n == 6 + 8 + 10
    cand = task.candidates(tokens)
    for b in range(200):
        words = task.decode(tokens[b])
        verb = "fit" if "fit" in words else "hold"
        adj = words[-6]
        n1, n2 = words[cand[b, 0]], words[cand[b, 1]]
        assert n1 != n2 and adj in ("big", "small") and words[-1] == "the"
        assert task.words[targets[b, -1]] == task.answer(verb, adj, n1, n2)
        assert targets[b, :-1].eq(IGNORE_INDEX).all()
    assert task.answer("fit", "big", "trophy", "suitcase") == "trophy"
    assert task.answer("fit", "small", "trophy", "suitcase") == "suitcase"
    assert task.answer("hold", "small", "trophy", "suitcase") == "trophy"
    assert task.answer("hold", "big", "trophy", "suitcase") == "suitcase"
    # all four (verb, property) combinations occur, and the answer is the first or second noun
    answers = tokens.gather(1, task.answer_position(tokens)[:, None])[:, 0]
    assert torch.equal(answers, targets[:, -1])


@pytest.mark.parametrize("k", [0, 3, 6])
def test_filler_moves_the_candidates_away_from_the_answer(k):
    task = PronounTask(max_filler=6)
    tokens, _ = task.batch(torch.Generator().manual_seed(k), 20, filler=k)
    assert task.filler_between(tokens).eq(k).all()
    with pytest.raises(ValueError, match="filler should lie in 0..max_filler=6"):
        task.batch(torch.Generator(), 2, filler=7)


def test_sentence_and_encode_round_trip():
    task = PronounTask(0)
    words = task.sentence("trophy", "suitcase", "fit", "big")
    assert " ".join(words) == ("the trophy did not fit in the suitcase because it was too big . "
                               "so it is the")
    assert task.decode(task.encode(" ".join(words))) == words


def test_accuracy_by_filler_scores_a_perfect_oracle_at_one():
    task = PronounTask(4)

    class Oracle(torch.nn.Module):
        def forward(self, tokens):
            logits = torch.zeros(*tokens.shape, task.vocab_size)
            logits[:, -1].scatter_(1, task._target(tokens)[:, None], 1.0)
            return logits

    assert accuracy_by_filler(Oracle(), task, per_distance=10) == {k: 1.0 for k in range(5)}


# ---------------------------------------------------------------- real text

def test_the_corpus_is_cpythons_reference_manual_and_tokenizes():
    text = corpus_text()
    assert len(text) > 100_000 and 'The "if" statement' in text
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text[:500])
    assert tok.decode(ids) == text[:500]
    with pytest.raises(ValueError, match="outside this model's alphabet"):
        CharTokenizer("abc").encode("abd")
    with pytest.raises(ValueError, match="distinct"):
        CharTokenizer("aa")
    train_ids, held = split(tok.encode(text), 0.1)
    assert len(held) == pytest.approx(0.1 * len(text), abs=2)
    x, y = text_batch(held, torch.Generator().manual_seed(0), 4, 32)
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])


def test_text_scores_on_weights_built_to_do_one_job():
    tok = CharTokenizer("ab ,")
    tokens = tok.encode("ab ab,ba ")[None]  # (1, 9): delimiters at 2, 5, 8
    n = tokens.shape[1]
    own = torch.eye(n)[None, None]
    word_start = torch.zeros(1, 1, n, n)
    for i, latest in enumerate([0, 0, 0, 2, 2, 2, 5, 5, 5]):  # the latest delimiter before i
        word_start[0, 0, i, latest] = 1.0
    w = torch.cat([own, word_start], dim=1)
    torch.testing.assert_close(current_token_score(w), torch.tensor([1.0, 1 / n]))
    scores = delimiter_score(w, tokens, tok.delimiter_ids())  # queries 3..8 have one before them
    assert float(scores[1]) == 1.0 and float(scores[0]) == 0.0
    rep = repeated_random(torch.Generator().manual_seed(0), torch.arange(4), 3, 5)
    assert rep.shape == (3, 10) and torch.equal(rep[:, :5], rep[:, 5:])
    text = repeated_text(torch.arange(100), torch.Generator().manual_seed(0), 4, 6)
    assert text.shape == (4, 12) and torch.equal(text[:, :6], text[:, 6:])
    assert (text[:, 1:6] - text[:, :5]).eq(1).all()  # one contiguous stretch
    induction = torch.zeros(2, 1, 12, 12)
    for i in range(6, 11):
        induction[:, 0, i, i - 5] = 1.0  # second copy's j -> first copy's j + 1
    assert float(repeat_score(induction, 6)[0]) == 1.0
    assert float(repeat_score(torch.eye(12).expand(2, 1, 12, 12), 6)[0]) == 0.0


def test_head_jobs_names_every_head_of_a_model():
    torch.manual_seed(2)
    tok = CharTokenizer("abcdefgh ,.")
    model = TinyTransformer(tok.vocab_size, 16, 2, 2, 32)
    text = tok.encode("abc def, gh. abc def, gh. abc")[None]
    rep = repeated_text(tok.encode("abc def, gh. abc def, gh. abc" * 2), torch.Generator(), 2, 8)
    rows = head_jobs(model, tok, text, rep)
    assert [(r["layer"], r["head"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in rows:
        assert r["job"] in ("previous token", "current token", "delimiter", "induction",
                            "no clear job")
        best = max(("previous token", "current token", "delimiter", "induction"), key=r.get)
        assert r["job"] == (best if r[best] >= 0.4 else "no clear job")


def test_both_verbs_make_the_answer_depend_on_verb_and_property_together():
    task = PronounTask(max_filler=3, verbs=("fit", "hold"))
    tokens, targets = task.batch(torch.Generator().manual_seed(4), 200)
    seen = set()
    for b in range(200):
        words = task.decode(tokens[b])
        verb = "fit" if "fit" in words else "hold"
        adj = words[-6]
        n1, n2 = (words[i] for i in task.candidates(tokens[b:b + 1])[0])
        assert task.words[targets[b, -1]] == task.answer(verb, adj, n1, n2)
        seen.add((verb, adj))
    assert seen == {("fit", "big"), ("fit", "small"), ("hold", "big"), ("hold", "small")}
    with pytest.raises(ValueError, match="verbs must be|verbs should be"):
        PronounTask(verbs=("carry",))
