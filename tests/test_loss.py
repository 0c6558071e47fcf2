"""zoo.kernels.linear_cross_entropy, the heads' ``loss`` and the families' ``forward(..., targets=...)``
against ``F.cross_entropy`` on the materialised fp32 logits: the loss and its gradients with respect to
the hidden rows, the weight (tied or not) and the bias, in fp32 and under bf16 autocast, and the LM
recipe's loss and a few training steps against the loss it computed before."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.data import text as T
from zoo.kernels import linear_cross_entropy
from zoo.kernels.loss import chunk_rows_for

from conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
N, D, V = 37, 24, 101  # neither the rows nor the vocabulary a multiple of the chunk


def reference(h, w, t, b=None, *, reduction="sum", label_smoothing=0.0, softcap=None, scale=None, logit_scale=None):
    """The loss as computed before: the logits as the head makes them, then fp32 and F.cross_entropy."""
    z = F.linear(h if scale is None else h * scale, w, b)
    if logit_scale is not None:
        z = z * logit_scale
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    return F.cross_entropy(z.float(), t, ignore_index=-100, reduction=reduction, label_smoothing=label_smoothing)


def inputs(bias: bool, seed: int = 0, n: int = N, v: int = V):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, D, generator=g).requires_grad_()
    w = (torch.randn(v, D, generator=g) * 0.3).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).requires_grad_() if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    t[::4] = -100  # ignored rows
    return h, w, b, t


def grads(loss, *xs):
    return torch.autograd.grad(loss, [x for x in xs if x is not None])


EXTRAS = {"plain": {}, "softcap": {"softcap": 2.5}, "scale": {"scale": 0.3}, "logit_scale": {"logit_scale": 3.0},
          "all": {"softcap": 4.0, "scale": 0.7, "logit_scale": 0.4}}


@pytest.mark.parametrize("reduction,label_smoothing,extra,bias,chunk",
                         [(r, s, e, b, c) for (r, s), e, b, c in itertools.product(
                             [("sum", 0.0), ("mean", 0.0), ("sum", 0.1), ("mean", 0.2)], EXTRAS, [False, True],
                             [8, None])])
def test_fp32_loss_and_gradients_equal_cross_entropy_of_the_logits(reduction, label_smoothing, extra, bias, chunk):
    h, w, b, t = inputs(bias)
    kw = {"reduction": reduction, "label_smoothing": label_smoothing, **EXTRAS[extra]}
    got = linear_cross_entropy(h, w, t, b, chunk_rows=chunk, **kw)
    want = reference(h, w, t, b, **kw)
    assert got.dtype == torch.float32 and got.shape == ()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads(got, h, w, b), grads(want, h, w, b)):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["onednn", "aten"])
def test_fp32_cpu_products_on_either_backend_of_zoos_linear(backend):
    """The chunks' fp32 products run where zoo's linear layers would run them (oneDNN or ATen)."""
    from zoo.kernels.cpu import linear as cpu_linear

    if backend == "onednn" and not cpu_linear.onednn_available():
        pytest.skip("this torch has no oneDNN linear")
    h, w, b, t = inputs(bias=True)
    with zoo.kernels.use(cpu_linear=backend):
        got = linear_cross_entropy(h, w, t, b, chunk_rows=8, label_smoothing=0.1)
        got_grads = grads(got, h, w, b)
    want = reference(h, w, t, b, label_smoothing=0.1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, r in zip(got_grads, grads(want, h, w, b)):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction,label_smoothing,extra", [("sum", 0.0, "plain"), ("mean", 0.1, "all")])
def test_bf16_autocast_equals_cross_entropy_of_the_autocast_logits(reduction, label_smoothing, extra):
    h, w, b, t = inputs(bias=True, seed=1, n=70, v=300)
    kw = {"reduction": reduction, "label_smoothing": label_smoothing, **EXTRAS[extra]}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_cross_entropy(h, w, t, b, chunk_rows=16, **kw)
        want = reference(h, w, t, b, **kw)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    for g, r in zip(grads(got, h, w, b), grads(want, h, w, b)):
        assert g.dtype == r.dtype
        torch.testing.assert_close(g, r, rtol=3e-2, atol=3e-2 * float(r.abs().max()))


def test_bf16_hidden_rows_take_bf16_gradients():
    """Hidden states that arrive in bf16 (a bf16 model) get bf16 gradients, the weight fp32 ones."""
    h, w, b, t = inputs(bias=False, seed=2)
    hb = h.detach().bfloat16().requires_grad_()
    got = linear_cross_entropy(hb, w, t, chunk_rows=8)
    gh, gw = grads(got, hb, w)
    assert gh.dtype == torch.bfloat16 and gw.dtype == torch.float32
    want = reference(hb.float(), w.bfloat16().float(), t)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_rows_of_any_shape_and_tied_weights_take_the_gradient_of_both_uses():
    """[B, T, D] rows with [B, T] targets; a weight that is also an embedding (tied) gets the sum of
    the embedding's and the projection's gradients."""
    g = torch.Generator().manual_seed(3)
    emb = torch.nn.Embedding(V, D)
    tokens = torch.randint(0, V, (3, 11), generator=g)
    targets = torch.randint(0, V, (3, 11), generator=g)
    targets[0, :4] = -100
    for fused in (True, False):
        emb.zero_grad()
        h = torch.tanh(emb(tokens))
        loss = (linear_cross_entropy(h, emb.weight, targets, chunk_rows=5) if fused
                else reference(h.flatten(0, 1), emb.weight, targets.flatten()))
        loss.backward()
        if fused:
            got, got_grad = loss.detach(), emb.weight.grad.clone()
    torch.testing.assert_close(got, loss.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad, emb.weight.grad, rtol=1e-5, atol=1e-5)


def test_all_rows_ignored_sum_to_zero_and_mean_is_nan_as_cross_entropy():
    h, w, b, t = inputs(bias=True)
    t = torch.full_like(t, -100)
    s = linear_cross_entropy(h, w, t, b)
    assert float(s.detach()) == 0.0 and all(float(g.abs().max()) == 0.0 for g in grads(s, h, w, b))
    assert torch.isnan(linear_cross_entropy(h, w, t, b, reduction="mean")) and torch.isnan(reference(h, w, t, b, reduction="mean"))


def test_without_gradients_it_only_computes_the_loss():
    h, w, b, t = inputs(bias=True)
    with torch.no_grad():
        got = linear_cross_entropy(h, w, t, b, label_smoothing=0.1, chunk_rows=7)
        want = reference(h, w, t, b, label_smoothing=0.1)
    assert got.grad_fn is None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_only_the_gradients_asked_for():
    """A frozen weight (or hidden rows without a gradient) still gives the others' gradients exactly."""
    h, w, b, t = inputs(bias=True)
    w.requires_grad_(False)
    got = linear_cross_entropy(h, w, t, b, chunk_rows=8)
    for g, r in zip(grads(got, h, b), grads(reference(h, w, t, b), h, b)):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("reduction,label_smoothing", [("sum", 0.1), ("mean", 0.1), ("sum", 0.0)])
def test_return_nll_is_the_unsmoothed_loss_of_the_same_logits(grad, reduction, label_smoothing):
    h, w, b, t = inputs(bias=True)
    with torch.set_grad_enabled(grad):
        loss, nll = linear_cross_entropy(h, w, t, b, chunk_rows=8, reduction=reduction, label_smoothing=label_smoothing,
                                         softcap=3.0, return_nll=True)
        want = reference(h, w, t, b, reduction=reduction, label_smoothing=label_smoothing, softcap=3.0)
    torch.testing.assert_close(nll, reference(h, w, t, b, reduction=reduction, softcap=3.0).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    assert not nll.requires_grad and loss.requires_grad == grad
    if grad:
        for g, r in zip(grads(loss, h, w, b), grads(want, h, w, b)):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_default_chunk_holds_about_64_mib_of_logits():
    assert chunk_rows_for(50_257, 8192) == 328  # 333 rows of 50,257 fp32 logits, down to a multiple of 8
    assert chunk_rows_for(50_257, 100) == 100 and chunk_rows_for(10**9, 5) == 1


def test_compiles_with_no_graph_break():
    h, w, b, t = inputs(bias=True)

    def step(h, w, t, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return linear_cross_entropy(h, w, t, b, chunk_rows=8, label_smoothing=0.1, softcap=3.0, scale=0.5,
                                        reduction="mean", return_nll=True)

    explained = torch._dynamo.explain(step)(h, w, t, b)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    (got, got_nll), (want, want_nll) = compiled(h, w, t, b), step(h, w, t, b)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_nll, want_nll, rtol=1e-6, atol=1e-6)
    for g, r in zip(grads(got, h, w, b), grads(want, h, w, b)):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call,message", [
    (lambda h, w, b, t: linear_cross_entropy(h, w, t, b, reduction="none"), "reduction: expected one of sum, mean"),
    (lambda h, w, b, t: linear_cross_entropy(h, w, t[:-1], b), r"targets: expected integer class ids of shape \(37,\)"),
    (lambda h, w, b, t: linear_cross_entropy(h, w, t.float(), b), "targets: expected integer class ids"),
    (lambda h, w, b, t: linear_cross_entropy(h, w.t(), t, b), r"weight: expected the projection \[V, 24\]"),
    (lambda h, w, b, t: linear_cross_entropy(h, w, t, b[:-1]), r"bias: expected \[101\]"),
    (lambda h, w, b, t: linear_cross_entropy(h, w, t, b, label_smoothing=1.5), "label_smoothing: expected a number in"),
    (lambda h, w, b, t: linear_cross_entropy(h, w, t, b, softcap=0.0), "softcap: expected a positive number"),
    (lambda h, w, b, t: linear_cross_entropy(h, w, t, b, chunk_rows=0), "chunk_rows: expected a positive number"),
    (lambda h, w, b, t: linear_cross_entropy(h, w, t.clamp(min=0) + 100, b), r"targets: class ids must be in \[0, 101\)"),
])
def test_bad_arguments_are_refused_by_name(call, message):
    h, w, b, t = inputs(bias=True)
    with pytest.raises(ValueError, match=message):
        call(h, w, b, t)


# ------------------------------------------------------------------------------ heads and families
def model_case(name: str):
    """(model, positional inputs, targets [B, T]) of a tiny model whose head has ``name``'s feature."""
    g = torch.Generator().manual_seed(0)
    if name == "encoder_decoder":
        model = tiny_model("encoder_decoder")  # the paper's: one matrix for both embeddings and the head
    elif name == "t5 (scale_input)":
        model = zoo.build(zoo.load_spec("t5-tiny", ["vocab_size=61", "d_model=32", "n_layers=2", "block.attention.n_heads=2",
                                                    "block.attention.head_dim=16", "block.ffn.hidden=48"]), seed=0)
    elif name == "gemma-2 (softcap)":
        model = zoo.build(zoo.load_spec("gemma-2-tiny", ["vocab_size=61", "d_model=32", "n_layers=2", "block.attention.n_heads=2",
                                                         "block.attention.n_kv_heads=1", "block.attention.head_dim=16",
                                                         "block.attention.v_head_dim=16", "block.ffn.hidden=48"]), seed=0)
    elif name in ("granite (divisor)", "cohere (scale)"):
        preset = {"granite (divisor)": "granite-tiny", "cohere (scale)": "command-r-tiny"}[name]
        model = zoo.build(zoo.load_spec(preset, ["vocab_size=61", "d_model=32", "n_layers=2", "block.attention.n_heads=2",
                                                 "block.ffn.hidden=48"]), seed=0)
    elif name == "mlm (transform, bias)":
        model = tiny_model("encoder")
    else:  # gpt2: a tied head
        model = tiny_model("decoder")
    spec = model.spec
    tokens = torch.randint(0, spec.vocab_size, (2, 9), generator=g)
    args = (torch.randint(0, spec.src_vocab_size or spec.vocab_size, (2, 7), generator=g), tokens) \
        if spec.family == "encoder_decoder" else (tokens,)
    targets = torch.randint(0, spec.vocab_size, (2, 9), generator=g)
    targets[1, 5:] = -100
    return model.eval(), args, targets


@pytest.mark.parametrize("name", ["gpt2 (tied)", "gemma-2 (softcap)", "mlm (transform, bias)", "encoder_decoder",
                                  "t5 (scale_input)", "granite (divisor)", "cohere (scale)"])
@pytest.mark.parametrize("reduction,label_smoothing", [("sum", 0.0), ("mean", 0.1)])
def test_model_loss_and_its_gradients_equal_cross_entropy_of_its_logits(name, reduction, label_smoothing):
    model, args, targets = model_case(name)
    params = [p for p in model.parameters() if p.requires_grad]
    got = model(*args, targets=targets, reduction=reduction, label_smoothing=label_smoothing)
    got_grads = torch.autograd.grad(got, params, allow_unused=True)
    logits = model(*args)  # still the logits without targets
    assert logits.shape == (*targets.shape, model.spec.vocab_size)
    want = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction=reduction,
                           label_smoothing=label_smoothing)
    want_grads = torch.autograd.grad(want, params, allow_unused=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for p, g, r in zip(params, got_grads, want_grads):
        assert (g is None) == (r is None)
        if g is not None:
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_translation_loss_with_its_nll_equals_the_recipes_old_loss():
    """recipes/translate.py's call: the smoothed loss to train on and the unsmoothed NLL it logs, from
    one pass, equal to F.cross_entropy with and without smoothing on the materialised logits."""
    model, args, targets = model_case("encoder_decoder")
    model.train()  # dropout on: both numbers must come from the same pass
    torch.manual_seed(5)
    loss, nll = model(*args, targets=targets, label_smoothing=0.1, return_nll=True)
    torch.manual_seed(5)
    flat = model(*args).float().flatten(0, 1)
    torch.testing.assert_close(loss, F.cross_entropy(flat, targets.flatten(), label_smoothing=0.1, reduction="sum"),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, F.cross_entropy(flat, targets.flatten(), reduction="sum").detach(), rtol=1e-5, atol=1e-5)


def test_model_loss_under_bf16_autocast_is_close_to_the_old_loss():
    model, args, targets = model_case("gpt2 (tied)")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(*args, targets=targets)
        want = F.cross_entropy(model(*args).float().flatten(0, 1), targets.flatten(), reduction="sum")
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_targets_are_refused_where_there_is_no_loss_to_compute():
    model, args, targets = model_case("gpt2 (tied)")
    with pytest.raises(ValueError, match="targets: a loss scores every position"):
        model(*args, last_only=True, targets=targets)
    headless = tiny_model("decoder", ["head.kind=none"])
    with pytest.raises(ValueError, match=r"targets: this model's head \(NoHead\) has no vocabulary projection"):
        headless(*args, targets=targets)


def test_decoder_training_step_compiles_with_no_graph_break():
    model, (tokens,), targets = model_case("gpt2 (tied)")
    model.train()

    def step(tokens, targets):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(tokens, targets=targets, reduction="mean")

    explained = torch._dynamo.explain(step)(tokens, targets)
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.slow
def test_compiled_decoder_training_step_equals_eager():
    """torch.compile(fullgraph=True) of a training step's loss and backward: the same loss and gradients."""
    model, (tokens,), targets = model_case("gpt2 (tied)")
    params = list(model.parameters())

    def step(tokens, targets):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(tokens, targets=targets, reduction="mean")

    eager = step(tokens, targets)
    want = torch.autograd.grad(eager, params)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(tokens, targets)
    got = torch.autograd.grad(compiled, params)
    torch.testing.assert_close(compiled, eager, rtol=1e-3, atol=1e-3)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=2e-2, atol=2e-2 * float(r.abs().max()))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available (the GPU path runs where it is: tools/gpu-check)")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_on_the_gpu_equals_cross_entropy_of_the_logits(precision):
    h, w, b, t = (x if x is None else x.detach().cuda().requires_grad_(x.requires_grad) for x in inputs(bias=True, n=300, v=1001))
    kw = {"reduction": "mean", "label_smoothing": 0.1, "softcap": 5.0}
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
        got = linear_cross_entropy(h, w, t, b, chunk_rows=64, **kw)
        want = reference(h, w, t, b, **kw)
        compiled = torch.compile(lambda *a: linear_cross_entropy(*a, chunk_rows=64, **kw), fullgraph=True)(h, w, t, b)
    tol = 1e-5 if precision == "fp32" else 2e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(compiled, got, rtol=tol, atol=tol)
    for g, r in zip(grads(got, h, w, b), grads(want, h, w, b)):
        torch.testing.assert_close(g, r, rtol=tol * 3, atol=tol * 3 * float(r.abs().max()))


# --------------------------------------------------------------------------------- recipes/lm.py
def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_recipe", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def old_lm_loss(model, rows: T.Rows):
    """recipes/lm.py's loss before the head computed it: the [B, L, V] logits, in fp32, F.cross_entropy."""
    extra = {} if rows.documents is None else {"documents": rows.documents[:, :-1], "positions": rows.positions[:, :-1]}
    padding = None if rows.padding is None else rows.padding[:, :-1]
    logits = model(rows.tokens[:, :-1], padding, **extra)
    targets = rows.tokens[:, 1:]
    if rows.padding is not None:
        targets = targets.masked_fill(~rows.padding[:, 1:], -100)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum", ignore_index=-100)


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["documents", "pad"])
def test_a_short_lm_run_trains_as_with_the_old_loss(packing):
    """Three SGD steps of recipes/lm.py's loss from one init follow the old loss's steps: the same
    loss at each step, the same weights after."""
    lm = _recipe("lm")
    spec = zoo.load_spec("llama-tiny", ["vocab_size=97", "d_model=32", "n_layers=2", "block.attention.n_heads=4",
                                        "block.attention.n_kv_heads=2", "block.ffn.hidden=48"])
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(4, 97, (n,), generator=g).tolist() for n in (5, 9, 3, 6, 11, 4, 8)]
    rows = T.pack_documents(docs, 15, eos_id=1) if packing == "documents" else T.pad_documents(docs, 12, eos_id=1, pad_id=0)
    runs = []
    for loss_fn in (lambda m, r: lm.lm_loss(m, r)[0], old_lm_loss):
        model = zoo.build(spec, seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses = []
        for _ in range(3):
            loss = loss_fn(model, rows) / rows.targets
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        runs.append((losses, model.state_dict()))
    (new, new_state), (old, old_state) = runs
    assert new == pytest.approx(old, rel=1e-5) and new[-1] < new[0]
    for k in old_state:
        torch.testing.assert_close(new_state[k], old_state[k], rtol=1e-4, atol=1e-5)
