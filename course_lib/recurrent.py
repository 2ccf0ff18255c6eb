"""A running-summary RNN, and the measurements that compare it with attention (chapter 06).

The RNN reads a sequence one position at a time and keeps one fixed-size vector, the summary:

    h_t = tanh(x_t W_xhᵀ + b_xh + h_{t-1} W_hhᵀ + b_hh)

(the same computation and parameter names as `torch.nn.RNN` with one layer, tanh, batch_first).
Everything position t knows about positions < t has to fit in h_{t-1}.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from course_lib.validate import check_count, wrong_shape


def _check_3d(x: torch.Tensor, name: str, d: int, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != d:
        raise wrong_shape(name, x, f"(batch, n, {what}={d})")


def rnn_step(x_t: torch.Tensor, h: torch.Tensor, W_xh: torch.Tensor, W_hh: torch.Tensor,
             b: torch.Tensor | None = None) -> torch.Tensor:
    """One update of the summary: h_new = tanh(x_t W_xhᵀ + h W_hhᵀ + b).

    x_t: (batch, d_in); h: (batch, d_hidden); W_xh: (d_hidden, d_in); W_hh: (d_hidden, d_hidden).
    """
    if x_t.shape[-1] != W_xh.shape[1]:
        raise ValueError(f"x_t has d_in={x_t.shape[-1]} but W_xh has shape {tuple(W_xh.shape)}, "
                         f"wanted (d_hidden, {x_t.shape[-1]})")
    d_hidden = W_hh.shape[0]
    if h.shape[-1] != d_hidden or W_hh.shape[1] != d_hidden or W_xh.shape[0] != d_hidden:
        raise ValueError(f"h has shape {tuple(h.shape)}, W_hh {tuple(W_hh.shape)}, W_xh "
                         f"{tuple(W_xh.shape)}: wanted h (batch, d_hidden), "
                         "W_hh (d_hidden, d_hidden)")
    pre = x_t @ W_xh.T + h @ W_hh.T  # (batch, d_hidden)
    if b is not None:
        pre = pre + b
    return torch.tanh(pre)


class RunningSummaryRNN(nn.Module):
    """An Elman RNN: one tanh update per position, a state of `d_hidden` numbers whatever n is.

    forward(x) with x (batch, n, d_in) returns (outputs (batch, n, d_hidden),
    h_last (batch, d_hidden)).
    """

    def __init__(self, d_in: int, d_hidden: int):
        super().__init__()
        self.d_in, self.d_hidden = check_count(d_in, "d_in"), check_count(d_hidden, "d_hidden")
        bound = 1 / math.sqrt(d_hidden)  # the initialisation torch.nn.RNN uses
        self.W_xh = nn.Parameter(torch.empty(d_hidden, d_in).uniform_(-bound, bound))
        self.W_hh = nn.Parameter(torch.empty(d_hidden, d_hidden).uniform_(-bound, bound))
        self.b_xh = nn.Parameter(torch.empty(d_hidden).uniform_(-bound, bound))
        self.b_hh = nn.Parameter(torch.empty(d_hidden).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None):
        _check_3d(x, "x", self.d_in, "d_in")
        batch, n, _ = x.shape
        h = x.new_zeros(batch, self.d_hidden) if h0 is None else h0  # (batch, d_hidden)
        if h.shape != (batch, self.d_hidden):
            raise wrong_shape("h0", h, f"({batch}, {self.d_hidden})")
        outputs = []
        for t in range(n):  # serial: step t needs the summary of step t-1
            h = rnn_step(x[:, t], h, self.W_xh, self.W_hh, self.b_xh + self.b_hh)
            outputs.append(h)
        return torch.stack(outputs, dim=1), h  # (batch, n, d_hidden), (batch, d_hidden)

    @torch.no_grad()
    def load_torch_weights(self, rnn: nn.RNN) -> RunningSummaryRNN:
        """Copy the weights of a one-layer, tanh, unidirectional `torch.nn.RNN` with biases."""
        if not isinstance(rnn, nn.RNN):
            raise ValueError(f"rnn must be a torch.nn.RNN, got {type(rnn).__name__}")
        plain = (rnn.num_layers, rnn.nonlinearity, rnn.bidirectional, rnn.bias)
        if plain != (1, "tanh", False, True):
            raise ValueError("rnn must have num_layers=1, nonlinearity='tanh', "
                             "bidirectional=False, bias=True")
        if (rnn.input_size, rnn.hidden_size) != (self.d_in, self.d_hidden):
            raise ValueError(f"rnn has input_size={rnn.input_size}, hidden_size={rnn.hidden_size}; "
                             f"wanted {self.d_in}, {self.d_hidden}")
        self.W_xh.copy_(rnn.weight_ih_l0)
        self.W_hh.copy_(rnn.weight_hh_l0)
        self.b_xh.copy_(rnn.bias_ih_l0)
        self.b_hh.copy_(rnn.bias_hh_l0)
        return self

    def state_numbers(self) -> int:
        """How many numbers the summary holds: d_hidden, whatever the sequence length."""
        return self.d_hidden


def gradient_vs_distance(fn, x: torch.Tensor) -> torch.Tensor:
    """How strongly the last output depends on each input position.

    fn: maps x (1, n, d) to outputs (1, n, d_out). Returns g of shape (n,) with
    g[j] = ‖∂ out[n-1] / ∂ x[j]‖ (Frobenius norm of the Jacobian block), so g[n-1-k] is the
    gradient across a distance of k positions.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[0] != 1:
        raise wrong_shape("x", x, "(1, n, d)")
    n = x.shape[1]
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    last = out[0, -1]  # (d_out,)
    squared = torch.zeros(n, dtype=x.dtype, device=x.device)
    for i in range(last.shape[0]):  # one backward pass per output coordinate
        (g,) = torch.autograd.grad(last[i], x, retain_graph=True)
        squared += g[0].pow(2).sum(-1)
    return squared.sqrt()


def state_memory(n: int, d: int, num_layers: int = 1, bytes_per_number: int = 4) -> dict[str, int]:
    """Numbers (and bytes) kept about the past after n positions: RNN summary vs attention's K
    and V."""
    n, d = check_count(n, "n"), check_count(d, "d")
    num_layers = check_count(num_layers, "num_layers")
    rnn = d * num_layers
    kv = 2 * n * d * num_layers
    return {"n": n, "rnn_numbers": rnn, "attention_numbers": kv,
            "rnn_bytes": rnn * bytes_per_number, "attention_bytes": kv * bytes_per_number}
