"""course_lib.train: loss falls on a fixed seed, and the same seed gives bit-identical weights."""

from functools import partial

import pytest
import torch
import torch.nn as nn

from course_lib.models.small import BracketTask, HeadsModel, RecurrentModel, recall_batch
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


def test_bracket_task_loss_falls_and_heads_learn():
    task = BracketTask()
    torch.manual_seed(0)
    model = HeadsModel(task.vocab_size, task.num_classes)
    history = train(model, task.batch, steps=120, lr=1e-2, seed=0, progress=False)
    assert sum(history.loss[-10:]) / 10 < 0.5 * sum(history.loss[:10]) / 10


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
    with pytest.raises(ValueError, match="model should be a torch.nn.Module"):
        train(lambda x: x, copy_batch, steps=1)
    with pytest.raises(ValueError, match="steps should be a positive int"):
        train(Lookup(), copy_batch, steps=0)
    with pytest.raises(ValueError, match="lr should be positive"):
        train(Lookup(), copy_batch, steps=1, lr=0)
    with pytest.raises(ValueError, match="batch_fn"):
        train(Lookup(), None, steps=1)
    with pytest.raises(ValueError, match=r"targets should have shape \(32, 6\); got \(32,\)"):
        train(Lookup(), lambda g: (copy_batch(g)[0], torch.zeros(32, dtype=torch.long)), steps=1,
              progress=False)
