"""Linear attention (chapter 09): the parallel and recurrent forms against the explicit formula."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.linear_attention import (
    feature_map,
    linear_attention,
    linear_attention_recurrent,
    state_bytes,
)


def explicit(q, k, v, causal):
    """out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j), written as loops."""
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    n_q, n_k = q.shape[-2], k.shape[-2]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for i in range(n_q):
        keys = range(i + 1) if causal else range(n_k)
        score = [(fq[..., i, :] * fk[..., j, :]).sum(-1, keepdim=True) for j in keys]
        num = sum(s * v[..., j, :] for s, j in zip(score, keys))
        den = sum(score)
        out[..., i, :] = num / den
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_parallel_form_is_the_formula(seed, causal):
    g = torch.Generator().manual_seed(seed)
    lead = tuple(int(x) for x in torch.randint(1, 4, (int(torch.randint(0, 3, (1,), generator=g)),),
                                               generator=g))
    n_q = int(torch.randint(1, 12, (1,), generator=g))
    n_k = n_q if causal else int(torch.randint(1, 12, (1,), generator=g))
    d = int(torch.randint(1, 9, (1,), generator=g))
    d_v = int(torch.randint(1, 9, (1,), generator=g))
    q = torch.randn(*lead, n_q, d, generator=g, dtype=torch.float64)
    k = torch.randn(*lead, n_k, d, generator=g, dtype=torch.float64)
    v = torch.randn(*lead, n_k, d_v, generator=g, dtype=torch.float64)
    torch.testing.assert_close(linear_attention(q, k, v, causal=causal), explicit(q, k, v, causal))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_recurrent_form_equals_causal_parallel(dtype, tol):
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 3, 40, 8, generator=g).to(dtype) for _ in range(2))
    v = torch.randn(2, 3, 40, 5, generator=g).to(dtype)
    rec = linear_attention_recurrent(q, k, v)
    torch.testing.assert_close(rec, linear_attention(q, k, v, causal=True), atol=tol, rtol=tol)
    # the causal form really is causal: changing the last token changes only the last output
    k2, v2 = k.clone(), v.clone()
    k2[..., -1, :] += 1
    v2[..., -1, :] -= 1
    rec2 = linear_attention_recurrent(q, k2, v2)
    torch.testing.assert_close(rec2[..., :-1, :], rec[..., :-1, :])
    assert not torch.allclose(rec2[..., -1, :], rec[..., -1, :])


def test_state_has_fixed_size_and_is_the_noncausal_sums():
    g = torch.Generator().manual_seed(4)
    for n in (5, 50):
        q, k = torch.randn(n, 6, generator=g, dtype=torch.float64), torch.randn(n, 6, generator=g,
                                                                                dtype=torch.float64)
        v = torch.randn(n, 3, generator=g, dtype=torch.float64)
        _, (S, z) = linear_attention_recurrent(q, k, v, return_state=True)
        assert S.shape == (6, 3) and z.shape == (6,)
        torch.testing.assert_close(S, feature_map(k).T @ v)
        torch.testing.assert_close(z, feature_map(k).sum(0))
        # the last causal output sees every key: it equals the non-causal output of the last query
        last = linear_attention(q, k, v, causal=True)[-1:]
        torch.testing.assert_close(linear_attention(q[-1:], k, v), last)
    assert state_bytes(64, 64) == (64 * 64 + 64) * 4
    assert state_bytes(64, 64, 2) == (64 * 64 + 64) * 2


def test_feature_map_is_positive_and_elu_plus_one():
    x = torch.linspace(-30, 5, 101)
    assert (feature_map(x) > 0).all()  # elu(x) + 1 would round to 0 below x = -17 in float32
    torch.testing.assert_close(feature_map(x), torch.where(x > 0, x + 1, torch.exp(x)))
    torch.testing.assert_close(feature_map(x.double()), F.elu(x.double()) + 1)


def test_gradients_flow():
    q, k, v = (torch.randn(7, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    causal = lambda a, b, c: linear_attention(a, b, c, causal=True)  # noqa: E731
    assert torch.autograd.gradcheck(causal, (q, k, v))
    assert torch.autograd.gradcheck(linear_attention_recurrent, (q, k, v))


def test_bad_inputs_name_the_argument_and_shape():
    q = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"x must be a floating-point tensor.*"
                                         r"got dtype torch.int64 with shape \(3,\)"):
        feature_map(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"k must be a floating-point tensor.*\(5, 4\)"):
        linear_attention(q, torch.ones(5, 4, dtype=torch.long), q)
    with pytest.raises(ValueError, match=r"q must be a torch.Tensor"):
        linear_attention_recurrent([[1.0]], q, q)
    with pytest.raises(ValueError, match=r"q has d_k=4 but k has d_k=3"):
        linear_attention(q, torch.randn(5, 3), q)
    with pytest.raises(ValueError, match=r"k has n_k=5 keys but v has 6"):
        linear_attention(q, q, torch.randn(6, 4))
    with pytest.raises(ValueError, match=r"causal=True needs as many queries as keys"):
        linear_attention(torch.randn(3, 4), q, q, causal=True)
    with pytest.raises(ValueError, match=r"d must be a positive integer"):
        state_bytes(0, 4)
