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
    monkeypatch.setattr(cpu.linear, "_choice", "onednn")
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
