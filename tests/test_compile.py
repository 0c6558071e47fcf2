"""Every family's training step compiles as one graph (``fullgraph=True``), forward and backward,
and computes what the eager model computes; a second batch of the same shape compiles nothing new,
and token buckets of new lengths recompile once (then as dynamic shapes)."""

from __future__ import annotations

import pytest
import torch
from conftest import example_inputs, tiny_spec

import zoo
from zoo.components.attention import Attention
from zoo.train import router_losses

T = 12
TWO = ["n_layers=2"]
DOCS = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [0] * 7 + [1] * 5, [3] * 12])

CASES = {  # name: (spec, forward keywords)
    "gpt2": (lambda: tiny_spec("decoder"), {}),
    "llama-rope-gqa": (lambda: zoo.load_spec("llama-tiny", TWO), {}),
    "mistral-window": (lambda: zoo.load_spec("mistral-tiny", TWO + ["block.attention.window=4"]), {}),
    "gemma2-softcap-pattern": (lambda: zoo.load_spec("gemma-2-tiny", TWO + ["block.attention.window=4"]), {}),
    "mixtral-moe": (lambda: zoo.load_spec("mixtral-tiny", TWO), {}),
    "qwen-moe-shared": (lambda: zoo.load_spec("qwen1.5-moe-tiny", TWO), {}),
    "deepseek-mla-router": (lambda: zoo.load_spec("deepseek-tiny", TWO + ["layers=[]"]), {}),
    "llama-packed": (lambda: zoo.load_spec("llama-tiny", TWO), {"documents": DOCS}),
    "mistral-packed-window": (lambda: zoo.load_spec("mistral-tiny", TWO + ["block.attention.window=4"]),
                              {"documents": DOCS}),
    "alibi-padded": (lambda: tiny_spec("decoder", ["position.kind=alibi"]), {"padding": True}),
    "bert": (lambda: tiny_spec("encoder"), {"padding": True}),
    "modernbert-local-global": (lambda: zoo.load_spec("modernbert-tiny"), {}),
    "transformer": (lambda: tiny_spec("encoder_decoder"), {}),
    "t5-relative-bias": (lambda: zoo.load_spec("t5-tiny", TWO), {}),
    "deberta-disentangled": (lambda: zoo.load_spec("deberta-tiny", TWO + ["position.dropout=0.0"]), {"padding": True}),
    "vit": (lambda: tiny_spec("vit"), {}),
    "eva02-rope2d": (lambda: zoo.load_spec("eva02-mini"), {}),
}


class Graphs:
    """A compile backend that counts the graphs it is given and runs them through AOT autograd
    (forward and backward traced, as inductor gets them) without generating code."""

    def __init__(self):
        from torch._dynamo.backends.debugging import aot_eager

        self.count, self.inner = 0, aot_eager

    def __call__(self, gm, example_inputs):
        self.count += 1
        return self.inner(gm, example_inputs)


def _inputs(model, kw, seed):
    ins = example_inputs(model, batch=3, length=T, seed=seed)
    kw = dict(kw)
    if kw.pop("padding", False):
        mask = torch.ones(3, T, dtype=torch.bool)
        mask[0, :3] = False  # left padding
        key = "src_padding_mask" if model.spec.family == "encoder_decoder" else "padding_mask"
        kw[key] = mask
    return ins, kw


def _step(model, ins, kw):
    out = model(*ins, **kw)
    return out.float().pow(2).mean()


FAST = ("gpt2", "mixtral-moe", "transformer")  # the fast lane's: a decoder, the MoE operator, cross-attention


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c in FAST else pytest.mark.slow) for c in CASES])
def test_training_step_compiles_as_one_graph_and_equals_eager(case):
    make, kw = CASES[case]
    model = zoo.build(make(), seed=0).train()
    for m in model.modules():  # dropout draws differ between eager and compiled: compare without it
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(m, Attention) or isinstance(getattr(m, "dropout", None), float):  # any attention's weights
            m.dropout = 0.0
    torch._dynamo.reset()
    graphs = Graphs()
    compiled = torch.compile(model, fullgraph=True, backend=graphs)
    ins, kwargs = _inputs(model, kw, seed=0)
    loss = _step(compiled, ins, kwargs)
    routing = router_losses(model).total  # what a compiled pass's MoE layers routed (the loop's aux loss)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    ref = _step(model, ins, kwargs)
    assert torch.allclose(routing, router_losses(model).total, rtol=1e-4, atol=1e-7)
    ref.backward()
    assert graphs.count == 1
    assert torch.allclose(loss, ref, rtol=1e-4, atol=1e-6), (float(loss), float(ref))
    assert got.keys() == {n for n, p in model.named_parameters() if p.grad is not None} and got
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(got[n], p.grad, rtol=1e-3, atol=1e-5), n
    # another batch of the same shape: the same graph, nothing compiled again
    with torch._dynamo.config.patch(error_on_recompile=True):
        _step(compiled, *_inputs(model, kw, seed=1)).backward()
    assert graphs.count == 1


@pytest.mark.slow
def test_token_buckets_of_new_lengths_compile_once_more_then_as_dynamic_shapes():
    model = zoo.build(zoo.load_spec("llama-tiny", TWO), seed=0).train()
    torch._dynamo.reset()
    graphs = Graphs()
    compiled = torch.compile(model, fullgraph=True, backend=graphs)
    for length in (8, 12, 16, 20):  # a bucketed epoch's lengths: the second marks the length dynamic
        tokens = torch.randint(0, model.spec.vocab_size, (2, length))
        _step(compiled, (tokens,), {}).backward()
        ref = _step(model, (tokens,), {})
        assert torch.allclose(_step(compiled, (tokens,), {}), ref, rtol=1e-4, atol=1e-6)
    assert graphs.count == 2
