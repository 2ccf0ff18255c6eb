"""course_lib.recurrent against torch.nn.RNN, and the chapter 06 measurements."""

import pytest
import torch
import torch.nn as nn

from course_lib.recurrent import (
    RunningSummaryRNN,
    gradient_vs_distance,
    rnn_step,
    state_memory,
)

TOL = {torch.float32: dict(atol=1e-6, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def pair(d_in, d_hidden, dtype, seed=0):
    torch.manual_seed(seed)
    ref = nn.RNN(d_in, d_hidden, batch_first=True).to(dtype)
    return RunningSummaryRNN(d_in, d_hidden).to(dtype).load_torch_weights(ref), ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,n,d_in,d_hidden", [(1, 1, 3, 4), (2, 7, 5, 8), (3, 20, 4, 16)])
def test_matches_torch_rnn(batch, n, d_in, d_hidden, dtype):
    ours, ref = pair(d_in, d_hidden, dtype, seed=n)
    x = torch.randn(batch, n, d_in, dtype=dtype, generator=torch.Generator().manual_seed(1))
    h0 = torch.randn(batch, d_hidden, dtype=dtype, generator=torch.Generator().manual_seed(2))
    out, h = ours(x, h0)
    ref_out, ref_h = ref(x, h0[None])
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    torch.testing.assert_close(h, ref_h[0], **TOL[dtype])
    out0, _ = ours(x)  # h0 defaults to zeros, as in torch
    torch.testing.assert_close(out0, ref(x)[0], **TOL[dtype])


def test_state_is_fixed_size_whatever_n():
    rnn = RunningSummaryRNN(3, 6)
    for n in (1, 10, 100):
        _, h = rnn(torch.randn(2, n, 3))
        assert h.shape == (2, 6)
    assert rnn.state_numbers() == 6


def test_rnn_step_formula():
    g = torch.Generator().manual_seed(0)
    x, h = torch.randn(2, 3, generator=g), torch.randn(2, 4, generator=g)
    W_xh, W_hh = torch.randn(4, 3, generator=g), torch.randn(4, 4, generator=g)
    b = torch.randn(4, generator=g)
    torch.testing.assert_close(rnn_step(x, h, W_xh, W_hh, b),
                               torch.tanh(x @ W_xh.T + h @ W_hh.T + b))
    cell = nn.RNNCell(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(rnn_step(x, h, cell.weight_ih, cell.weight_hh,
                                            cell.bias_ih + cell.bias_hh), cell(x, h))


def test_gradient_vs_distance_matches_autograd_jacobian():
    torch.manual_seed(0)
    rnn = RunningSummaryRNN(3, 5).double()
    x = torch.randn(1, 6, 3, dtype=torch.float64)
    g = gradient_vs_distance(lambda t: rnn(t)[0], x)
    J = torch.autograd.functional.jacobian(lambda t: rnn(t)[0][0, -1], x)  # (5, 1, 6, 3)
    torch.testing.assert_close(g, J.pow(2).sum(dim=(0, 1, 3)).sqrt())
    assert g.shape == (6,)


def test_rnn_gradient_decays_with_distance_attention_does_not():
    from course_lib.attention import scaled_dot_product_attention
    torch.manual_seed(0)
    n, d = 40, 16
    rnn = RunningSummaryRNN(d, d).double()
    x = torch.randn(1, n, d, dtype=torch.float64)
    g_rnn = gradient_vs_distance(lambda t: rnn(t)[0], x)
    W = torch.randn(3, d, d, dtype=torch.float64) / d ** 0.5
    g_att = gradient_vs_distance(
        lambda t: scaled_dot_product_attention(t @ W[0], t @ W[1], t @ W[2])[0], x)
    assert g_rnn[0] < 1e-3 * g_rnn[-2]          # 38 steps back: orders of magnitude weaker
    assert g_att[0] > 1e-2 * g_att[-2]          # attention: the same order of magnitude


def test_state_memory_numbers():
    m = state_memory(n=1000, d=64, num_layers=2)
    assert m["rnn_numbers"] == 128 and m["attention_numbers"] == 2 * 1000 * 64 * 2
    assert m["attention_bytes"] == 4 * m["attention_numbers"]
    with pytest.raises(ValueError, match="n must be a positive integer, got 0"):
        state_memory(0, 4)


def test_bad_input():
    rnn = RunningSummaryRNN(3, 4)
    with pytest.raises(ValueError, match=r"x has shape \(5, 3\), wanted \(batch, n, d_in=3\)"):
        rnn(torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"h0 has shape \(1, 4\), wanted \(2, 4\)"):
        rnn(torch.randn(2, 5, 3), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="x_t has d_in=2"):
        rnn_step(torch.randn(1, 2), torch.zeros(1, 4), torch.randn(4, 3), torch.randn(4, 4))
    with pytest.raises(ValueError, match="num_layers=1"):
        rnn.load_torch_weights(nn.RNN(3, 4, num_layers=2))
    with pytest.raises(ValueError, match="hidden_size=5"):
        rnn.load_torch_weights(nn.RNN(3, 5))
    with pytest.raises(ValueError, match=r"wanted \(1, n, d\)"):
        gradient_vs_distance(lambda t: t, torch.randn(2, 3, 4))
