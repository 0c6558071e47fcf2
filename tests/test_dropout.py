"""zoo's CPU dropout (masks from 16-bit random lanes) and the training attention built on it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import zoo
import zoo.kernels.cpu.attention as A
import zoo.kernels.cpu.dropout as D
from zoo import kernels
from zoo.components import Dropout
from conftest import example_inputs, tiny_model


def test_drop_rate_is_p_in_every_lane_and_the_expectation_is_kept():
    torch.manual_seed(0)
    n, p = 1 << 22, 0.1
    y = kernels.dropout(torch.ones(n), p)
    dropped = y == 0
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(dropped.float().mean().item() - p) < 5 * sigma
    # the four int16 lanes of each int64 draw: a lane with a constant bit would drop at 0 or 2p
    for lane in range(4):
        rate = dropped[lane::4].float().mean().item()
        assert abs(rate - p) < 5 * 2 * sigma, (lane, rate)
    kept = y[~dropped]
    assert torch.all(kept == kept[0]) and kept[0].item() == pytest.approx(1 / (1 - D.quantized_p(p)), rel=1e-6)
    assert y.mean().item() == pytest.approx(1.0, abs=5 * sigma * 1.2)


def test_quantized_p():
    assert D.quantized_p(0.1) == 6554 / 65536
    assert abs(D.quantized_p(0.3) - 0.3) <= 0.5 / 65536
    assert D.quantized_p(0.5) == 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_uses_the_forward_mask(dtype):
    torch.manual_seed(1)
    x = torch.randn(4, 33, 17, dtype=dtype, requires_grad=True)
    y = kernels.dropout(x, 0.3)
    g = torch.randn_like(y)
    y.backward(g)
    scale = 1 / (1 - D.quantized_p(0.3))
    keep = y != 0
    torch.testing.assert_close(y, (x * keep * scale).detach().to(dtype))
    torch.testing.assert_close(x.grad, (g * keep * scale).to(dtype))
    assert y.dtype == dtype


def test_same_seed_same_mask_and_fallbacks():
    x = torch.randn(1000)
    torch.manual_seed(3)
    a = kernels.dropout(x, 0.5)
    torch.manual_seed(3)
    b = kernels.dropout(x, 0.5)
    c = kernels.dropout(x, 0.5)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert kernels.dropout(x, 0.5, training=False) is x and kernels.dropout(x, 0.0) is x
    assert torch.equal(kernels.dropout(x, 1.0), torch.zeros_like(x))  # p = 1 goes to F.dropout
    m = Dropout(0.2).eval()
    assert m(x) is x
    assert not D.applies(torch.arange(4), 0.5)  # integer tensors are torch's business


# ------------------------------------------------------------------------ attention with dropout
def _reference(q, k, v, mask, causal, keep, p):
    """float64 attention with a given dropout mask."""
    q, k, v = (t.double() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    T, S = s.shape[-2:]
    if causal:
        s = s.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
    elif mask is not None and mask.dtype == torch.bool:
        s = s.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        s = s + mask.double()
    w = s.softmax(-1).nan_to_num(0.0)
    return (w * keep / (1 - D.quantized_p(p))) @ v


CASES = ["causal", "bool", "additive", "none", "gqa", "empty-row"]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("p", [0.25, 0.0])
def test_cpu_attention_matches_float64(case, dtype, tol, p, monkeypatch):
    g = torch.Generator().manual_seed(CASES.index(case))
    B, H, T, S, K = 2, 4, 6, 6 if case == "causal" else 9, 8
    G = 2 if case == "gqa" else H
    q = torch.randn(B, H, T, K, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, G, S, K, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, G, S, K, generator=g).to(dtype).requires_grad_()
    mask = None
    if case in ("bool", "empty-row"):
        mask = torch.rand(B, 1, T, S, generator=g) > 0.4
        mask[..., 0] = case == "bool"
        if case == "empty-row":
            mask[0, 0, 1] = False  # query 1 of sentence 0 may attend to nothing
    elif case == "additive":
        mask = torch.randn(1, H, T, S, generator=g)
    keep = torch.rand(B, H, T, S, generator=g) > p
    monkeypatch.setattr(A, "keep_mask", lambda shape, p, dtype: keep.to(dtype))
    y = A.attention(q, k, v, mask, case == "causal", p)
    out_grad = torch.randn(y.shape, generator=g).to(dtype)
    grads = torch.autograd.grad(y, (q, k, v), out_grad)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = _reference(*leaves, mask, case == "causal", keep, p)
    ref_grads = torch.autograd.grad(ref, leaves, out_grad.double())
    assert y.dtype == dtype and all(gr.dtype == dtype for gr in grads)
    for ours, theirs in [(y, ref), *zip(grads, ref_grads)]:
        err = (ours.double() - theirs).abs().max() / theirs.abs().max()
        assert err < tol
    if case == "empty-row":
        assert torch.all(y[0, :, 1] == 0)


def test_cpu_attention_is_used_for_dropout_and_short_training_sequences(monkeypatch):
    calls = []
    real = A._CpuAttention.apply
    monkeypatch.setattr(A._CpuAttention, "apply", lambda *a: calls.append(1) or real(*a))
    for dropout, limit, training, grad, expected in [
        (0.1, 224, True, True, True),  # dropout: always (SDPA would take its math path, bernoulli_ masks)
        (0.1, 0, True, True, True),
        (0.1, 0, True, False, True),
        (0.0, 224, True, True, True),  # no dropout: sequences up to the limit
        (0.0, 224, False, False, True),
        (0.0, 0, True, True, False),
        (0.0, 0, False, False, False),
        (0.1, 0, False, False, False),  # eval: no dropout
    ]:
        monkeypatch.setattr(A, "_ZOO_KEYS", {torch.float32: (limit, limit)})
        model = tiny_model("decoder", [f"dropout.attention={dropout}"]).train(training)
        calls.clear()
        with torch.set_grad_enabled(grad):
            out = model(*example_inputs(model))
        if grad:
            out.sum().backward()
        assert len(calls) == (model.spec.n_layers if expected else 0), (dropout, limit, training, grad)
    # generation: the prompt (9 tokens) may take it, decoding steps (one query) keep SDPA's flash kernel
    monkeypatch.setattr(A, "_ZOO_KEYS", {torch.float32: (224, 224)})
    calls.clear()
    zoo.generate(model, example_inputs(model)[0], max_new_tokens=4)
    assert len(calls) == model.spec.n_layers


@pytest.mark.slow
def test_attention_dropout_keeps_the_expected_output():
    """Averaged over many masks, attention with dropout equals attention without it."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    plain = F.scaled_dot_product_attention(q, k, v)
    mean = torch.stack([A.attention(q, k, v, None, False, 0.5) for _ in range(4000)]).mean(0)
    torch.testing.assert_close(mean, plain, atol=0.08, rtol=0)


def test_a_forced_sdpa_kernel_covers_zoos_attention_too(monkeypatch):
    from zoo.train import attention_kernels

    calls = []
    real = A._CpuAttention.apply
    monkeypatch.setattr(A._CpuAttention, "apply", lambda *a: calls.append(1) or real(*a))
    model = tiny_model("decoder", ["dropout.attention=0.1"]).train()
    with attention_kernels("math"):
        model(*example_inputs(model)).sum().backward()
    assert calls == []
    with attention_kernels("default"):
        model(*example_inputs(model)).sum().backward()
    assert len(calls) == model.spec.n_layers
    with pytest.raises(ValueError, match="use default, dense, blocked, flex, math"):
        attention_kernels("fastest")
