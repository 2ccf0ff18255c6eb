"""course_lib.train: loss falls on a fixed seed, and the same seed gives bit-identical weights."""

from functools import partial

import pytest
import torch
import torch.nn as nn

from course_lib.models.heads import BracketTask, HeadsModel
from course_lib.models.recall import RecurrentModel, recall_batch
from course_lib.train import History, accuracy, cross_entropy, evaluate, train


def copy_batch(generator, batch=32, n=6, vocab=5):
    """Predict the current token: learnable by any model in a few dozen steps."""
    x = torch.randint(0, vocab, (batch, n), generator=generator)
    return x, x.clone()


class Lookup(nn.Module):
    def __init__(self, vocab=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.out = nn.Linear(8, vocab)

    def forward(self, x):
        return self.out(self.embed(x))


def weights_of(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_loss_falls_on_a_fixed_seed():
    torch.manual_seed(0)
    model = Lookup()
    history = train(model, copy_batch, steps=60, lr=3e-2, seed=0, progress=False)
    assert isinstance(history, History) and len(history.loss) == 60 == len(history.accuracy)
    assert history.loss[-1] < 0.2 * history.loss[0]
    assert history.accuracy[-1] == 1.0
    x, y = copy_batch(torch.Generator().manual_seed(9))
    assert evaluate(model, x, y) == 1.0


def test_sgd_steps_are_the_gradient_times_lr():
    torch.manual_seed(0)
    model = Lookup()
    before = weights_of(model)
    x, y = copy_batch(torch.Generator().manual_seed(0))
    expected = torch.autograd.grad(cross_entropy(model(x), y), model.out.bias)[0]
    train(model, copy_batch, steps=1, lr=0.5, seed=0, clip=None, optimizer="sgd", progress=False)
    torch.testing.assert_close(model.out.bias.detach(), before["out.bias"] - 0.5 * expected)


@pytest.mark.parametrize("make", [
    lambda: HeadsModel(BracketTask().vocab_size, BracketTask().num_classes, d_model=16),
    lambda: RecurrentModel(8 + 16 + 1, 8, d_hidden=16, kind="lstm"),
])
def test_two_runs_give_identical_weights(make):
    task = BracketTask()
    batch_fn = task.batch if isinstance(make(), HeadsModel) else partial(recall_batch, batch=16)
    runs = []
    for _ in range(2):
        torch.manual_seed(1)
        model = make()
        history = train(model, batch_fn, steps=15, lr=1e-2, seed=3, progress=False)
        runs.append((weights_of(model), history.loss))
    (w1, l1), (w2, l2) = runs
    assert l1 == l2
    for name in w1:
        assert torch.equal(w1[name], w2[name]), name


def test_a_different_seed_gives_different_weights():
    results = []
    for seed in (0, 1):
        torch.manual_seed(0)
        model = Lookup()
        train(model, copy_batch, steps=5, lr=1e-2, seed=seed, progress=False)
        results.append(model.out.weight.detach().clone())
    assert not torch.equal(*results)


def test_heads_specialise_on_the_bracket_task():
    """The claim of lecture 05, with its settings: one previous-token head, one bracket head."""
    task = BracketTask()
    torch.manual_seed(2)
    model = HeadsModel(task.vocab_size, task.num_classes, d_model=32, num_heads=2)
    history = train(model, task.batch, steps=200, lr=1e-2, seed=2, progress=False)
    assert sum(history.loss[-10:]) / 10 < 0.05 * sum(history.loss[:10]) / 10
    tokens, targets = task.batch(torch.Generator().manual_seed(123), batch=500)
    assert evaluate(model, tokens, targets) > 0.98
    with torch.no_grad():
        _, weights = model(tokens)
    scores = task.head_scores(weights, tokens)
    prev, bracket = int(scores["previous"].argmax()), int(scores["bracket"].argmax())
    assert prev != bracket
    assert scores["previous"][prev] > 0.8 and scores["bracket"][bracket] > 0.8


def test_bracket_task_data_is_well_formed():
    task = BracketTask(letters=4, kinds=2, n=20)
    tokens, targets = task.batch(torch.Generator().manual_seed(0), batch=50)
    assert tokens.shape == targets.shape == (50, 21)
    assert (tokens[:, 0] == task.bos).all() and (targets[:, 0] == -100).all()
    assert (targets[:, 1:] // (task.kinds + 1) == tokens[:, :-1]).all()  # previous token
    for row, tgt in zip(tokens.tolist(), targets.tolist()):
        inside = 0
        for t in range(1, 21):
            tok = row[t]
            if task.open <= tok < task.close:
                assert inside == 0, "brackets do not nest"
                inside = tok - task.open + 1
            elif task.close <= tok < task.bos:
                assert inside == tok - task.close + 1, "a closing bracket matches its opener"
                inside = 0
            assert tgt[t] % (task.kinds + 1) == inside
    assert task.decode(tokens[0])[0] == "^"


def test_head_scores_of_perfect_heads():
    task = BracketTask()
    tokens, _ = task.batch(torch.Generator().manual_seed(1), batch=20)
    B, n = tokens.shape
    prev = torch.zeros(B, n, n)
    prev[:, 0, 0] = 1
    prev[:, torch.arange(1, n), torch.arange(n - 1)] = 1
    target = task.enclosing_open(tokens)                           # (B, n)
    bracket = torch.zeros(B, n, n)
    bracket.scatter_(2, target.clamp(min=0)[..., None], 1.0)
    scores = task.head_scores(torch.stack([prev, bracket], dim=1), tokens)
    torch.testing.assert_close(scores["previous"][0], torch.tensor(1.0))
    torch.testing.assert_close(scores["bracket"][1], torch.tensor(1.0))
    assert scores["previous"][1] < 0.5 and scores["bracket"][0] < 0.5
    with pytest.raises(ValueError, match="wanted weights"):
        task.head_scores(prev, tokens)


def test_recall_batch_targets_and_distances():
    from course_lib.models.recall import accuracy_by_distance, recall_distances
    tokens, targets = recall_batch(torch.Generator().manual_seed(0), batch=200, n=10, vocab=5)
    k = recall_distances(tokens, 5)
    assert ((1 <= k) & (k <= 10)).all() and len(torch.unique(k)) == 10
    assert (targets[:, :-1] == -100).all()
    assert (targets[:, -1] == tokens[torch.arange(200), 10 - k]).all()

    class Oracle(nn.Module):  # answers by looking k back: perfect at every distance
        def forward(self, x):
            kk = recall_distances(x, 5)
            answer = x[torch.arange(len(x)), x.shape[1] - 1 - kk]
            logits = torch.zeros(*x.shape, 5)
            logits[torch.arange(len(x)), -1, answer] = 1.0
            return logits

    assert set(accuracy_by_distance(Oracle(), tokens, targets, 5).values()) == {1.0}
    with pytest.raises(ValueError, match="max_k"):
        recall_batch(torch.Generator(), n=4, max_k=5)


def test_global_state_is_restored():
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    train(Lookup(), copy_batch, steps=2, progress=False)
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == det


def test_progress_bar_can_be_shown(capsys):
    train(Lookup(), copy_batch, steps=3, progress=True, desc="unit test")
    assert "unit test" in capsys.readouterr().err


def test_accuracy_and_cross_entropy_ignore_minus_100():
    logits = torch.tensor([[[5.0, 0.0], [0.0, 5.0], [5.0, 0.0]]])  # (1, 3, 2)
    targets = torch.tensor([[0, 0, -100]])
    assert accuracy(logits, targets) == 0.5
    want = nn.functional.cross_entropy(logits[0, :2], targets[0, :2])
    torch.testing.assert_close(cross_entropy(logits, targets), want)


def test_bad_arguments():
    with pytest.raises(ValueError, match="model must be a torch.nn.Module"):
        train(lambda x: x, copy_batch, steps=1)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        train(Lookup(), copy_batch, steps=0)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        train(Lookup(), copy_batch, steps=1, lr=0)
    with pytest.raises(ValueError, match="batch_fn"):
        train(Lookup(), None, steps=1)
    with pytest.raises(ValueError, match=r"optimizer should be one of .*, got 'adam'"):
        train(Lookup(), copy_batch, steps=1, optimizer="adam")
    with pytest.raises(ValueError, match=r"targets should have shape \(32, 6\); got \(32,\)"):
        train(Lookup(), lambda g: (copy_batch(g)[0], torch.zeros(32, dtype=torch.long)), steps=1,
              progress=False)


def test_history_smoothed_is_a_running_mean():
    h = History(loss=[4.0, 2.0, 0.0, 2.0], accuracy=[0.0, 1.0, 1.0, 0.0])
    assert h.smoothed("loss", window=2) == [4.0, 3.0, 1.0, 1.0]
    assert h.smoothed("accuracy", window=10) == [0.0, 0.5, 2 / 3, 0.5]


class PairInput(nn.Module):
    """Takes its inputs as a tuple of two tensors (as chapter 02's score model does)."""

    def __init__(self, vocab=5):
        super().__init__()
        self.a, self.b = nn.Embedding(vocab, 8), nn.Embedding(vocab, 8)
        self.out = nn.Linear(8, vocab)

    def forward(self, inputs):
        x, y = inputs
        return self.out(self.a(x) + self.b(y))


def test_inputs_may_be_a_tuple_of_tensors():
    def batch(g):
        x, y = copy_batch(g)
        return (x, torch.zeros_like(x)), y
    torch.manual_seed(0)
    model = PairInput()
    history = train(model, batch, steps=40, lr=3e-2, seed=0, progress=False)
    assert history.loss[-1] < 0.3 * history.loss[0]
    (x, z), y = batch(torch.Generator().manual_seed(1))
    assert evaluate(model, (x, z), y) == 1.0
