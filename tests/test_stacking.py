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
from course_lib.stacking.pronoun import (
    PairsTask,
    accuracy_by_pairs,
)
from course_lib.stacking.text import (
    JOB_TESTS,
    JOBS,
    CharTokenizer,
    ablation_costs,
    baseline_weights,
    bracket_score,
    corpus_text,
    current_token_score,
    delimiter_score,
    head_jobs,
    job_ablations,
    job_positions,
    nats_per_character,
    repeat_score,
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
    text = repeated_text(torch.arange(100), torch.Generator().manual_seed(0), 4, 6)
    assert text.shape == (4, 12) and torch.equal(text[:, :6], text[:, 6:])
    assert (text[:, 1:6] - text[:, :5]).eq(1).all()  # one contiguous stretch
    induction = torch.zeros(2, 1, 12, 12)
    for i in range(6, 11):
        induction[:, 0, i, i - 5] = 1.0  # second copy's j -> first copy's j + 1
    assert float(repeat_score(induction, 6)[0]) == 1.0
    assert float(repeat_score(torch.eye(12).expand(2, 1, 12, 12), 6)[0]) == 0.0


def test_head_jobs_names_a_head_above_its_baseline_that_costs_most_where_its_job_matters():
    torch.manual_seed(2)
    tok = CharTokenizer("abcdefgh ,.()")
    model = TinyTransformer(tok.vocab_size, 16, 2, 2, 32)
    ids = tok.encode("abc (def, gh). abc (def, gh). ab")
    text, targets = ids[None, :-1], ids[None, 1:]
    rep = repeated_text(tok.encode("abc def, gh. abc def, gh. abc" * 2), torch.Generator(), 2, 8)
    rows = head_jobs(model, tok, text, rep, targets)
    assert [(r["layer"], r["head"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    costs = ablation_costs(model, text, targets)
    local = job_ablations(model, tok, text, targets)
    for r in rows:
        assert r["job"] in (*JOBS, "no clear job")
        assert r["cost"] == round(float(costs[r["layer"], r["head"]]), 3)  # what is printed
        for j, job in enumerate(JOB_TESTS):
            want = local[r["layer"], r["head"], j]
            assert r["tests"][job] == tuple(round(float(c), 3) for c in want)
        best = max(JOBS, key=lambda job: r[job] - max(r["baselines"][job]))
        base = max(r["baselines"][best])
        failed = []
        if not (r[best] >= 1.5 * base and r[best] - base >= 0.1):
            failed.append("score")
        if not r["cost"] >= 0.01:
            failed.append("zeroing")
        if best in JOB_TESTS and not r["tests"][best][0] >= 1.5 * r["tests"][best][1]:
            failed.append("job")
        assert (r["candidate"], r["fails"]) == (best, failed)
        assert r["job"] == ("no clear job" if failed else best)
    # without targets there is no ablation, so no head is named
    assert {r["job"] for r in head_jobs(model, tok, text, rep)} == {"no clear job"}


def test_job_positions_are_where_each_jobs_information_should_help():
    tok = CharTokenizer('ab (")')
    ids = tok.encode('ab (ab "a") ba')
    masks = job_positions(ids[None, :-1], ids[None, 1:], tok)
    assert set(masks) == set(JOB_TESTS)
    text = tok.decode(ids[:-1])
    def at(mask):
        return "".join(c if m else "_" for c, m in zip(text, mask[0].tolist()))
    assert text == 'ab (ab "a") b'
    where, against = masks["previous token"]  # a letter after a letter, against the rest
    assert (at(where), at(against)) == ("_b___b_______", 'a_ (a_ "a") b')
    where, against = masks["delimiter"]  # queries before a letter: inside a word, or a delimiter
    assert (at(where), at(against)) == ("a___a_______b", '___(___"___ _')
    where, against = masks["bracket"]  # something open before the query, against nothing open
    assert (at(where), at(against)) == ('____ab "a")__', "ab (_______ b")
    with pytest.raises(ValueError, match="same shape"):
        job_positions(ids[None, :-1], ids[None, :-2], tok)


def test_job_ablations_split_each_heads_ablation_cost_by_where_its_job_matters():
    torch.manual_seed(0)
    tok = CharTokenizer("abc (),")
    model = TinyTransformer(tok.vocab_size, 16, 2, 2, 32)
    ids = tok.encode("ab (ca, b) cab (a) bc, (abc) ca")
    x, y = ids[None, :-1], ids[None, 1:]
    local = job_ablations(model, tok, x, y)
    costs = ablation_costs(model, x, y)
    where, against = job_positions(x, y, tok)["bracket"]  # together: every query, once
    share = where.float().mean()
    b = list(JOB_TESTS).index("bracket")
    torch.testing.assert_close(share * local[..., b, 0] + (1 - share) * local[..., b, 1], costs,
                               atol=1e-5, rtol=0)
def test_baselines_are_attention_that_does_no_job():
    w = baseline_weights(2, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 1, 6))
    assert float(w[0, 0, 3, 0]) == 0.25 and float(w[0, 0, 3, 4]) == 0.0  # causal, even
    w3 = baseline_weights(1, 6, window=3)
    assert w3[0, 0, 5].tolist() == pytest.approx([0, 0, 0, 1 / 3, 1 / 3, 1 / 3])
    # queries 1..5 have a previous token: 1/2 of query 1's weight, 1/3 of the others'
    assert float(previous_token_score(w3)[0]) == pytest.approx((1 / 2 + 4 / 3) / 5)


def test_bracket_score_looks_at_the_innermost_open_bracket_or_quote():
    tok = CharTokenizer('ab()"')
    tokens = tok.encode('a(b"a"b)a')[None]  # opens: ( at 1, " at 3 (closed at 5), ) at 7
    n = tokens.shape[1]
    want = [-1, -1, 1, 1, 3, 3, 1, 1, -1]  # what is open before each query
    on = torch.zeros(1, 1, n, n)
    for i, j in enumerate(want):
        if j >= 0:
            on[0, 0, i, j] = 1.0
    w = torch.cat([on, torch.eye(n)[None, None]], dim=1)
    torch.testing.assert_close(bracket_score(w, tokens, tok), torch.tensor([1.0, 0.0]))


def test_ablation_costs_is_the_loss_change_of_zeroing_each_head():
    torch.manual_seed(0)
    model = TinyTransformer(8, 16, 2, 2, 16)
    x = torch.randint(0, 8, (3, 12), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 8, (3, 12), generator=torch.Generator().manual_seed(1))
    costs = ablation_costs(model, x, y)
    base = nats_per_character(model, x, y)
    with ablate_head(model, 1, 0):
        assert float(costs[1, 0]) == pytest.approx(nats_per_character(model, x, y) - base)
    assert nats_per_character(model, x, y) == base  # restored


# ---------------------------------------------------------------- m pairs

@pytest.mark.parametrize("question_first", [False, True])
def test_pairs_sentences_follow_the_rule_and_the_positions_find_the_pair(question_first):
    task = PairsTask(max_pairs=4, question_first=question_first)
    tokens, targets = task.batch(torch.Generator().manual_seed(3), 300)
    assert tokens.shape == targets.shape == (300, task.n) and task.n == 5 * 4 + 9
    assert targets[:, :-1].eq(IGNORE_INDEX).all()
    pos = task.positions(tokens)
    rows = torch.arange(300)
    assert torch.equal(tokens[rows, pos["answer"]], targets[:, -1])
    assert torch.equal(tokens[rows, pos["container"]], tokens[rows, pos["selector"]])
    seen = set()
    for b in range(300):
        words = task.decode(tokens[b])
        m = int(task.pairs_in(tokens[b:b + 1]))
        i = words.index("held") - 1
        pairs = [(words[i + 5 * p + 3], words[i + 5 * p]) for p in range(m)]
        pick = [box for _, box in pairs].index(words[int(pos["selector"][b])])
        adj = words[int(pos["adjective"][b])]
        assert task.words[targets[b, -1]] == task.answer(pairs, pick, adj)
        assert len({w for pair in pairs for w in pair}) == 2 * m  # distinct nouns
        assert (words[-4:] == ["so", "it", "is", "the"]) == question_first
        seen.add((m, adj))
    assert seen == {(m, adj) for m in range(1, 5) for adj in ("big", "small")}
    assert task.pairs_in(task.batch(torch.Generator(), 5, pairs=2)[0]).eq(2).all()
    with pytest.raises(ValueError, match="pairs should lie in 1..max_pairs=4"):
        task.batch(torch.Generator(), 2, pairs=5)
    with pytest.raises(ValueError, match="max_pairs should be an int in 1..8"):
        PairsTask(9)


def test_pairs_sentence_reads_as_the_trophy_and_the_suitcase():
    task = PairsTask(2)
    pairs = [("trophy", "suitcase"), ("ball", "box")]
    words = task.sentence(pairs, 0, "big")
    assert " ".join(words) == ("suitcase held no trophy , box held no ball , "
                               "too big at the suitcase")
    assert task.answer(pairs, 0, "big") == "trophy" and task.answer(pairs, 1, "small") == "box"
    assert task.decode(task.encode(" ".join(words))) == words


def test_accuracy_by_pairs_scores_an_oracle_at_one_and_a_copier_at_the_small_half():
    task = PairsTask(3)

    class Copier(torch.nn.Module):  # answers the container named last: right when "too small"
        def __init__(self, oracle=False):
            super().__init__()
            self.oracle = oracle

        def forward(self, tokens):
            pos = task.positions(tokens)["answer" if self.oracle else "selector"]
            logits = torch.zeros(*tokens.shape, task.vocab_size)
            logits[:, -1].scatter_(1, tokens.gather(1, pos[:, None]), 1.0)
            return logits

    assert accuracy_by_pairs(Copier(True), task, 20) == {1: 1.0, 2: 1.0, 3: 1.0}
    assert accuracy_by_pairs(Copier(), task, 20, adj="small") == {1: 1.0, 2: 1.0, 3: 1.0}
    assert accuracy_by_pairs(Copier(), task, 20, adj="big") == {1: 0.0, 2: 0.0, 3: 0.0}
