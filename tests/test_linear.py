"""zoo's Linear: the oneDNN fp32 CPU kernel against float64 F.linear, the dispatch's fallbacks, the backend choice."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo import kernels
from zoo.components import Linear
from zoo.kernels.cpu import choose
from zoo.kernels.cpu import linear as L
from conftest import example_inputs, tiny_model

needs_onednn = pytest.mark.skipif(not L.onednn_available(), reason="this torch build has no oneDNN")


@pytest.fixture
def onednn_everywhere(monkeypatch):
    """Force the oneDNN path for every fp32 CPU linear, however small, and count its calls."""
    zoo.kernels.use(cpu_linear="onednn")
    monkeypatch.setattr(L, "_MIN_MACS", 0)
    monkeypatch.setattr(L, "_MIN_WEIGHT", 0)
    calls = []
    real = L._OneDnnLinear.apply
    monkeypatch.setattr(L._OneDnnLinear, "apply", lambda *a: calls.append(a[0].shape) or real(*a))
    return calls


def _grads_against_float64(x, w, b, out_grad):
    """Outputs and gradients of zoo's linear (fp32) and of F.linear in float64 on the same values."""
    results = []
    for fn, dtype in [(kernels.linear, torch.float32), (F.linear, torch.float64)]:
        xs = x.detach().to(dtype).requires_grad_(x.requires_grad)
        ws = w.detach().to(dtype).requires_grad_(w.requires_grad)
        bs = None if b is None else b.detach().to(dtype).requires_grad_(b.requires_grad)
        y = fn(xs, ws, bs)
        y.backward(out_grad.to(dtype))
        results.append((y, xs.grad, ws.grad, None if bs is None else bs.grad))
    return results


@needs_onednn
@pytest.mark.parametrize("shape", [(5, 24), (3, 7, 24), (2, 3, 4, 24), (1, 1, 24)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("grads", ["all", "input_only", "weight_only"])
def test_onednn_linear_matches_float64_forward_and_backward(onednn_everywhere, shape, bias, grads):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).requires_grad_(grads != "weight_only")
    w = torch.randn(40, 24, generator=g).requires_grad_(grads != "input_only")
    b = torch.randn(40, generator=g).requires_grad_(grads == "all") if bias else None
    out_grad = torch.randn(*shape[:-1], 40, generator=g)
    (y, gx, gw, gb), (y64, gx64, gw64, gb64) = _grads_against_float64(x, w, b, out_grad)
    assert onednn_everywhere, "the oneDNN path was not taken"
    assert y.dtype == torch.float32 and y.shape == y64.shape
    torch.testing.assert_close(y, y64.float(), rtol=1e-5, atol=1e-5)
    for ours, ref in [(gx, gx64), (gw, gw64), (gb, gb64)]:
        assert (ours is None) == (ref is None)
        if ref is not None:
            torch.testing.assert_close(ours, ref.float(), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_onednn_linear_backward_takes_an_expanded_gradient(onednn_everywhere):
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(3, 5, 24, generator=g), torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    ours = [t.clone().requires_grad_() for t in (x, w, b)]
    kernels.linear(*ours).sum().backward()  # the gradient of sum() is a stride-0 expansion
    ref = [t.double().requires_grad_() for t in (x, w, b)]
    F.linear(*ref).sum().backward()
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a.grad, r.grad.float(), rtol=1e-5, atol=1e-5)
    assert onednn_everywhere


@needs_onednn
def test_onednn_linear_takes_strided_inputs(onednn_everywhere):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 48, generator=g)[:, ::2]  # a non-contiguous view
    w = torch.randn(30, 24, generator=g)
    torch.testing.assert_close(kernels.linear(x, w), F.linear(x.double(), w.double()).float(), rtol=1e-5, atol=1e-5)
    wt = torch.randn(24, 30, generator=g).t()  # a transposed weight
    torch.testing.assert_close(kernels.linear(x, wt), F.linear(x.double(), wt.double()).float(), rtol=1e-5, atol=1e-5)
    assert len(onednn_everywhere) == 2


@needs_onednn
@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder", "vit"])
def test_models_train_the_same_on_either_backend(family, monkeypatch):
    """Three AdamW steps of a tiny model give the same losses and weights on oneDNN as on ATen."""
    monkeypatch.setattr(L, "_MIN_MACS", 0)
    monkeypatch.setattr(L, "_MIN_WEIGHT", 0)
    finals = {}
    for backend in ["aten", "onednn"]:
        zoo.kernels.use(cpu_linear=backend)
        model = tiny_model(family, ["dropout.residual=0", "dropout.attention=0", "dropout.embedding=0"]).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        inputs = example_inputs(model)
        losses = []
        for _ in range(3):
            out = model(*inputs)
            loss = out.float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        finals[backend] = (losses, model.state_dict())
    (l0, s0), (l1, s1) = finals["aten"], finals["onednn"]
    assert l0 == pytest.approx(l1, rel=1e-4)
    for k in s0:
        torch.testing.assert_close(s0[k], s1[k], rtol=1e-4, atol=1e-5)


def test_fast_path_leaves_autocast_small_products_and_other_dtypes_to_torch(monkeypatch):
    zoo.kernels.use(cpu_linear="onednn")
    calls = []
    monkeypatch.setattr(L._OneDnnLinear, "apply", lambda *a: calls.append(1))
    big_x, big_w = torch.randn(64, 256), torch.randn(512, 256)  # 8M multiply-adds
    small_x, small_w = torch.randn(2, 16), torch.randn(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert kernels.linear(big_x, big_w).dtype == torch.bfloat16  # autocast still casts
    assert kernels.linear(small_x, small_w).shape == (2, 8)
    assert kernels.linear(big_x.double(), big_w.double()).dtype == torch.float64
    assert kernels.linear(torch.randn(0, 256), big_w).shape == (0, 512)
    assert calls == []
    zoo.kernels.use(cpu_linear="aten")
    kernels.linear(big_x, big_w)
    assert calls == []
    if L.onednn_available():
        zoo.kernels.use(cpu_linear="onednn")
        kernels.linear(big_x, big_w)
        kernels.linear(torch.randn(1, 1024), torch.randn(1024, 1024))  # a decoding step over a 1M weight
        assert len(calls) == 2


def test_backend_choice_is_validated_and_measured_per_shape_class(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"use\(cpu_linear=...\)='mkl': use one of auto, onednn, aten"):
        zoo.kernels.use(cpu_linear="mkl")
    monkeypatch.setenv("ZOO_CPU_LINEAR", "fast")
    with pytest.raises(ValueError, match="ZOO_CPU_LINEAR='fast'"):
        zoo.kernels.use(from_env=True)
    monkeypatch.setenv("ZOO_CPU_LINEAR", "aten")
    zoo.kernels.use(from_env=True)  # the environment is read once: a process that changes it reads it again
    assert L.cpu_linear_backend() == "aten" and not L.prefers_onednn(4096, 1024, 1024, True)
    zoo.kernels.use(cpu_linear="auto")
    assert L.cpu_linear_backend() == ("auto" if L.onednn_available() else "aten")
    if L.onednn_available():
        # auto: each shape class is timed once, both backends, and the faster kept (here a stand-in clock)
        zoo.kernels.use(cache=str(tmp_path / "kernels.json"))
        choose.forget()
        timed = []

        def fake(m, n, k, grad):  # oneDNN "wins" on classes with N = 2048 only
            def kernel(name):
                return lambda: timed.append((name, m, n, k, grad)) or time.sleep(0.02 if (name == "onednn") != (n == 2048) else 0)
            return {"aten": kernel("aten"), "onednn": kernel("onednn")}

        monkeypatch.setattr(L, "_candidates", fake)
        assert L.prefers_onednn(300, 2048, 512, True) and not L.prefers_onednn(300, 1024, 512, True)
        assert L.prefers_onednn(512, 2048, 512, True)  # 300 and 512 rows: one class, not timed again
        assert len(timed) == 2 * 2 * 4 and {t[1:] for t in timed} == {(512, 2048, 512, True), (512, 1024, 512, True)}
        assert L.shape_class(300, 2048, 512, True) == "512x2048x512+grad"
        assert L.shape_class(9000, 3072, 768, False) == "256x3072x768"  # timed at ~2^30 multiply-adds
        assert L.shape_class(9, 50000, 4096, False) == "16x50000x4096"  # at least 256 rows unless fewer run
        # a new process (memory forgotten) reads the cache file and times nothing
        choose.forget()
        assert L.prefers_onednn(257, 2048, 512, True) and len(timed) == 16
        saved = json.loads((tmp_path / "kernels.json").read_text())
        assert saved["machine"] == choose.machine()
        assert saved["choices"]["linear_fp32/512x2048x512+grad"]["pick"] == "onednn"
        assert saved["choices"]["linear_fp32/512x1024x512+grad"]["pick"] == "aten"
    with zoo.kernels.use(cpu_linear="onednn"):
        assert L.cpu_linear_backend() == ("onednn" if L.onednn_available() else "aten")
    assert L.cpu_linear_backend() == ("auto" if L.onednn_available() else "aten")


def test_measured_choice_keeps_the_global_rng_and_the_flop_count(monkeypatch):
    from torch.utils.flop_counter import FlopCounterMode

    zoo.kernels.use(cache="off")
    choose.forget()
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    counter = FlopCounterMode(display=False)
    a = lambda: torch.randn(64, 64, generator=torch.Generator()).mm(torch.ones(64, 64))  # noqa: E731
    with counter:  # the timing's products are not the model's
        name = choose.pick("test_op", "class-a", {"a": a, "b": lambda: None})
    assert name in ("a", "b") and counter.get_total_flops() == 0
    assert torch.equal(torch.rand(4), expected)
    assert choose.pick("test_op", "class-a", {"a": lambda: 1 / 0, "b": lambda: 1 / 0}) == name  # remembered


def test_unreadable_or_foreign_cache_is_measured_afresh(monkeypatch, tmp_path):
    path = tmp_path / "kernels.json"
    zoo.kernels.use(cache=str(path))
    path.write_text("{not json")
    choose.forget()
    with pytest.warns(UserWarning, match="unreadable"):
        assert choose.pick("test_op", "c", {"a": lambda: time.sleep(0.02), "b": lambda: None}) == "b"
    assert json.loads(path.read_text())["choices"]["test_op/c"]["pick"] == "b"
    path.write_text(json.dumps({"machine": "another CPU", "choices": {"test_op/d": {"pick": "a"}}}))
    choose.forget()
    assert choose.pick("test_op", "d", {"a": lambda: time.sleep(0.02), "b": lambda: None}) == "b"


def test_linear_is_an_nn_linear_with_the_same_state():
    ours, ref = Linear(8, 4), nn.Linear(8, 4)
    assert isinstance(ours, nn.Linear)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(3, 8)
    torch.testing.assert_close(ours(x), ref(x))
    model = zoo.build(zoo.load_spec("gpt2-small", ["n_layers=1", "d_model=32", "block.attention.n_heads=4",
                                                   "vocab_size=50"]), seed=0)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, Linear) for m in linears)


@needs_onednn
def test_flop_counter_counts_the_onednn_path(onednn_everywhere):
    from torch.utils.flop_counter import FlopCounterMode

    x, w = torch.randn(4, 6, 24, requires_grad=True), torch.randn(40, 24, requires_grad=True)
    counter = FlopCounterMode(display=False)
    with counter:
        kernels.linear(x, w).sum().backward()
    assert onednn_everywhere
    assert counter.get_total_flops() == 3 * 2 * 4 * 6 * 24 * 40  # forward, input grad, weight grad
