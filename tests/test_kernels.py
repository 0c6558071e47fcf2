"""zoo.kernels' dispatch: CPU kernels only for CPU tensors; torch's ops everywhere else."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_spec

import zoo
from zoo import kernels
from zoo.kernels import cpu


@pytest.fixture
def cpu_kernels_everywhere(monkeypatch):
    """Every CPU kernel's thresholds at their most permissive: only the device can rule them out."""
    zoo.kernels.use(cpu_linear="onednn")
    monkeypatch.setattr(cpu.linear, "_MIN_MACS", 0)
    monkeypatch.setattr(cpu.linear, "_MIN_WEIGHT", 0)
    monkeypatch.setattr(cpu.attention, "_ZOO_KEYS", {t: (1 << 30, 1 << 30) for t in (torch.float32, torch.bfloat16)})
    monkeypatch.setattr(cpu.attention, "_MIN_QUERIES", 0)


def _inputs(device: str, dtype: torch.dtype):
    x = torch.randn(2, 8, 16, device=device, dtype=dtype, requires_grad=True)
    w, b = torch.randn(24, 16, device=device, dtype=dtype), torch.randn(24, device=device, dtype=dtype)
    q, k = torch.randn(2, 4, 8, 6, device=device, dtype=dtype), torch.randn(2, 2, 8, 6, device=device, dtype=dtype)
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool, device=device)
    return x, w, b, q, k, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_kernels_are_never_chosen_for_other_devices(cpu_kernels_everywhere, dtype):
    x, w, b, q, k, mask = _inputs("meta", dtype)
    assert not cpu.linear.applies(x, w, b)
    assert not cpu.dropout.applies(x, 0.1)
    for p in (0.0, 0.1):
        for m in (None, mask):
            with torch.set_grad_enabled(True):
                assert not cpu.attention.applies(q.requires_grad_(), k, p, m)
            with torch.no_grad():
                assert not cpu.attention.applies(q, k, p, m)
    # the same decisions on CPU tensors: the device, not the thresholds, ruled the kernels out above
    x, w, b, q, k, mask = _inputs("cpu", dtype)
    assert cpu.linear.applies(x, w, b) == (dtype == torch.float32 and cpu.linear.onednn_available())
    assert cpu.dropout.applies(x, 0.1)
    assert cpu.attention.applies(q, k, 0.1, mask) and cpu.attention.applies(q, k, 0.0, None)


def test_dispatch_takes_torchs_ops_for_other_devices(cpu_kernels_everywhere, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a CPU kernel was called for a meta tensor")

    for module, name in [(cpu.linear, "linear"), (cpu.dropout, "dropout"), (cpu.attention, "attention")]:
        monkeypatch.setattr(module, name, refuse)
    x, w, b, q, k, mask = _inputs("meta", torch.float32)
    assert kernels.linear(x, w, b).shape == (2, 8, 24)
    assert kernels.dropout(x, 0.1).device.type == "meta"
    out = kernels.attention(q, k, k, mask=mask, dropout_p=0.1, enable_gqa=True)
    assert out.shape == (2, 4, 8, 6) and out.device.type == "meta"
    # a whole model, trained on the meta device, never reaches them either
    for family in ("decoder", "encoder_decoder", "vit"):
        model = zoo.build(tiny_spec(family, ["dropout.attention=0.1"]), device="meta").train()
        if family == "vit":
            s = model.spec
            inputs = (torch.randn(2, s.in_channels, s.image_size, s.image_size, device="meta"),)
        elif family == "decoder":
            inputs = (torch.zeros(2, 9, dtype=torch.long, device="meta"),)
        else:
            inputs = tuple(torch.zeros(2, n, dtype=torch.long, device="meta") for n in (7, 9))
        model(*inputs).sum().backward()


def test_cpu_attention_choice_is_measured_per_shape_class(monkeypatch):
    import time

    from zoo.kernels.cpu import choose

    A = cpu.attention
    real_timing_calls = A._timing_calls
    zoo.kernels.use(cpu_attention="measure")
    zoo.kernels.use(cache="off")
    choose.forget()
    timed = []

    def fake(cls):  # SDPA "wins" where the keys are 512 or more, zoo's kernel below
        def kernel(name):
            return lambda: timed.append((name, cls)) or time.sleep(0.02 if (name == "zoo") == (cls[4] >= 512) else 0)
        return {"zoo": kernel("zoo"), "sdpa": kernel("sdpa")}

    monkeypatch.setattr(A, "_timing_calls", fake)
    q = torch.randn(2, 4, 200, 16, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 4, 600, 16, dtype=torch.bfloat16)
    assert not A.applies(q, k, 0.0, None)  # 600 keys: the rule (512 in bf16) says SDPA, measured SDPA
    assert A.applies(q, q.detach()[:, :, :100], 0.0, None)  # 100 keys: zoo's, as measured
    q32 = q.detach().float()
    assert A.applies(q32, q32[:, :, :100], 0.0, None, True)  # inference at 100 keys in fp32: the rule says SDPA (64)
    assert len(timed) == 3 * 2 * 4  # three classes, two kernels, warm-up + best of 3
    assert A.applies(q32, q32[:, :, :120], 0.0, None, True) and len(timed) == 24  # 100 and 120 keys: one class
    assert A.applies(q32, q32[:, :, :120], 0.0, None, True, v_dim=8) and len(timed) == 32  # values' head size: a class
    assert A.attention_class(torch.bfloat16, True, 8, 200, 600, 16, "none") == ("bfloat16", "train", 8, 256, 1024, 16,
                                                                                 "none", 16)
    assert A.attention_class(torch.float32, False, 4096, 1024, 1024, 64, "bool")[2] == 2  # timed at ~2^27 multiply-adds
    assert A.applies(q, k, 0.1, None)  # dropout: zoo's kernel whatever the timing
    # timed for real inside a model's bf16 autocast region, training: as the kernels run in the model
    monkeypatch.setattr(A, "_timing_calls", real_timing_calls)
    with torch.autocast("cpu", torch.bfloat16):
        qb = torch.randn(1, 2, 24, 8, dtype=torch.bfloat16, requires_grad=True)
        assert A.applies(qb, qb, 0.0, None, True) in (True, False)
    assert len(choose.choices()) == 5
    monkeypatch.setenv("ZOO_CPU_ATTENTION", "fastest")
    with pytest.raises(ValueError, match="ZOO_CPU_ATTENTION='fastest': use one of measure, rule, sdpa"):
        zoo.kernels.use(from_env=True)


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "bias"])
def test_cpu_attention_timing_calls_run_both_kernels_without_touching_the_global_rng(kind):
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    for training in (True, False):
        calls = cpu.attention._timing_calls(("float32", "train" if training else "infer", 2, 8, 8, 4, kind, 6))
        assert set(calls) == {"zoo", "sdpa"}
        for call in calls.values():
            call()
    assert torch.equal(torch.rand(3), expected)


def test_cpu_attention_backward_called_inside_autocast_computes_what_it_does_outside():
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grads = []
    for inside in (False, True):
        out = cpu.attention.attention(q, k, v, None, True, 0.0)
        with torch.autocast("cpu", torch.bfloat16, enabled=inside):  # a backward inside the region
            out.float().pow(2).sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    assert all(torch.equal(a, b) for a, b in zip(*grads))
