"""The mixture-of-experts FFN (ffn.kind: moe) against HF's own sparse MoE blocks at random init,
its grouped product against a plain loop, its load-balancing loss against HF's, and the spec's
checks, building, training, saving and summary."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.components.moe import load_balancing_loss
from zoo.kernels import grouped
from zoo.kernels.cpu import linear as cpu_linear
from zoo.spec import SpecError
from zoo.summary import summarize

D, F, E, K = 21, 13, 5, 2  # odd sizes


def _zoo_moe(**ffn):
    spec = zoo.spec.MoESpec.model_validate({"n_experts": E, "top_k": K, "expert": {"kind": "swiglu", "hidden": F}, **ffn})
    return zoo.registry("ffn").builder("moe")(spec, dim=D, dropout=0.0)


def _copy(moe, hf):
    with torch.no_grad():
        moe.router.weight.copy_(hf.gate.weight)
        moe.w_gate_up.copy_(hf.experts.gate_up_proj)
        moe.w_down.copy_(hf.experts.down_proj)
        if getattr(hf, "shared_expert", None) is not None:
            s = hf.shared_expert
            moe.shared.fc1.weight.copy_(torch.cat([s.gate_proj.weight, s.up_proj.weight]))
            moe.shared.fc2.weight.copy_(s.down_proj.weight)
            moe.shared_gate.weight.copy_(hf.shared_expert_gate.weight)


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return module


def _compare(moe, hf):
    x = torch.randn(3, 7, D, generator=torch.Generator().manual_seed(1))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = moe(xa), hf(xb)
    assert (ya - yb).abs().max() < 1e-5
    g = torch.randn(ya.shape, generator=torch.Generator().manual_seed(2))
    ya.backward(g)
    yb.backward(g)
    assert (xa.grad - xb.grad).abs().max() < 1e-5
    assert (moe.router.weight.grad - hf.gate.weight.grad).abs().max() < 1e-5
    assert (moe.w_gate_up.grad - hf.experts.gate_up_proj.grad).abs().max() < 1e-5
    assert (moe.w_down.grad - hf.experts.down_proj.grad).abs().max() < 1e-5
    assert moe.router_logits.shape == (21, E)


def test_moe_equals_hf_mixtral_sparse_block_forward_and_gradients():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(hidden_size=D, intermediate_size=F, num_local_experts=E, num_experts_per_tok=K)
    hf = _randomize(MixtralSparseMoeBlock(config))
    moe = _zoo_moe()
    _copy(moe, hf)
    _compare(moe, hf)


@pytest.mark.parametrize("norm", [True, False])
def test_moe_equals_hf_qwen2_moe_block_with_shared_expert(norm):
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    config = Qwen2MoeConfig(hidden_size=D, moe_intermediate_size=F, num_experts=E, num_experts_per_tok=K,
                            shared_expert_intermediate_size=17, norm_topk_prob=norm)
    hf = _randomize(Qwen2MoeSparseMoeBlock(config))
    moe = _zoo_moe(router={"norm_topk_prob": norm}, shared_hidden=17)
    _copy(moe, hf)
    _compare(moe, hf)
    assert (moe.shared_gate.weight.grad - hf.shared_expert_gate.weight.grad).abs().max() < 1e-5


def _per_row(x, w, counts):
    """x [N, K] @ w[group of each row].T, one row at a time (the truth for both paths)."""
    groups = torch.repeat_interleave(torch.arange(len(counts)), counts)
    return torch.einsum("nk,nmk->nm", x, w[groups])


@pytest.mark.parametrize("k,m", [(8, 12), (7, 13)])  # aligned, odd (padded for grouped_mm)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_grouped_mm_and_its_loop_fallback_equal_a_per_row_product(k, m, precision):
    g = torch.Generator().manual_seed(0)
    counts = torch.tensor([3, 0, 9, 4])  # an expert without rows
    x = torch.randn(16, k, generator=g)
    w = torch.randn(4, m, k, generator=g)
    up = torch.randn(16, m, generator=g)
    bf16 = precision == "bf16"
    paths = {"grouped": lambda x, w: grouped.grouped_mm(x, w, counts, counts.cumsum(0, dtype=torch.int32)),
             "loop": lambda x, w: grouped._loop(x.to(grouped.compute_dtype(x, w)), w.to(grouped.compute_dtype(x, w)), counts)}
    if not bf16 and cpu_linear.onednn_available():  # fp32 experts where zoo's linears take oneDNN (AMD, AVX-512)
        paths["onednn loop"] = lambda x, w: grouped._loop(x, w, counts, cpu_linear.linear)
    results = {}
    for path, fn in [*paths.items(), ("truth", _per_row)]:
        xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
        if path == "truth":  # bf16 inputs, fp32 products
            y = _per_row(xa.bfloat16().float() if bf16 else xa, wa.bfloat16().float() if bf16 else wa, counts)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                y = fn(xa, wa)
            assert y.dtype == (torch.bfloat16 if bf16 else torch.float32)
        assert y.shape == (16, m)
        (y.float() * up).sum().backward()
        results[path] = (y.float(), xa.grad, wa.grad)
    assert grouped.applies(x.to(torch.bfloat16 if bf16 else torch.float32), w.to(torch.bfloat16 if bf16 else torch.float32))
    tol = 2e-2 if bf16 else 1e-5
    for path in paths:
        for a, b in zip(results[path], results["truth"]):
            assert (a - b).abs().max() <= tol * max(1.0, b.abs().max().item()), path


@pytest.mark.parametrize("backend,takes", [("onednn", "_loop"), ("aten", "_grouped")])
def test_fp32_experts_take_onednn_where_zoos_linears_do(backend, takes, monkeypatch):
    if backend == "onednn" and not cpu_linear.onednn_available():
        pytest.skip("this torch has no oneDNN linear")
    taken = []
    for name in ("_loop", "_grouped"):
        real = getattr(grouped, name)
        monkeypatch.setattr(grouped, name, lambda *a, real=real, name=name: taken.append(name) or real(*a))
    with zoo.kernels.use(cpu_linear=backend):
        counts = torch.tensor([40, 24])
        x, w = torch.randn(64, 256), torch.randn(2, 512, 256)  # large enough for oneDNN (cpu_linear.applies)
        y = grouped.grouped_mm(x, w, counts, counts.cumsum(0, dtype=torch.int32))
    assert taken == [takes] and (y - _per_row(x, w, counts)).abs().max() < 1e-3


@pytest.mark.parametrize("block", [1, 4])  # rows per expert as they are; padded to multiples of 4
@pytest.mark.parametrize("kept", [16, 11])  # every (token, slot) pair; some dropped
def test_expert_rows_gather_scatter_and_gated_activation_equal_plain_autograd(kept, block):
    g = torch.Generator().manual_seed(0)
    n, top_k, d, e = 8, 2, 5, 3
    experts = torch.randint(0, e, (n * top_k,), generator=g)
    order = torch.argsort(experts, stable=True)
    order = order[torch.randperm(n * top_k, generator=g)[:kept].sort().values]  # still by expert
    counts = torch.bincount(experts[order], minlength=e)
    rows = grouped.expert_rows(order, counts, block)
    # the layout by hand: each expert's pairs from its padded start, the buffer R + E * (block - 1) rows
    padded = [-(-int(c) // block) * block for c in counts]
    assert rows.counts.tolist() == padded and rows.size == kept + e * (block - 1)
    assert rows.offsets.tolist() == torch.tensor(padded).cumsum(0).tolist()
    place = [sum(padded[:int(experts[p])]) + int((experts[order[:r]] == experts[p]).sum()) for r, p in enumerate(order)]
    x = torch.randn(n, d, generator=g)
    h = torch.randn(rows.size, d, generator=g)
    xa, xb, ha, hb = (t.clone().requires_grad_() for t in (x, x, h, h))
    ya = grouped.gather_rows(xa, rows, top_k)
    yb = torch.zeros(rows.size, d).index_put((torch.tensor(place),), xb[order // top_k])
    za = grouped.scatter_rows(ha, rows, n * top_k)
    zb = torch.zeros(n * top_k, d).index_put((order,), hb[torch.tensor(place)])
    assert torch.equal(ya, yb) and torch.equal(za, zb)
    u, v = torch.randn(ya.shape, generator=g), torch.randn(za.shape, generator=g)
    ((ya * u).sum() + (za * v).sum()).backward()
    ((yb * u).sum() + (zb * v).sum()).backward()
    assert (xa.grad - xb.grad).abs().max() < 1e-6 and torch.equal(ha.grad, hb.grad)
    for act in (torch.nn.SiLU(), torch.nn.GELU(approximate="tanh"), torch.nn.ReLU()):
        gu = torch.randn(kept, 2 * 3, generator=g)
        a, b = gu.clone().requires_grad_(), gu.clone().requires_grad_()
        out = grouped.gated(a, act)
        gate, up = b.chunk(2, dim=-1)
        assert (out - act(gate) * up).abs().max() < 1e-6
        w = torch.randn(out.shape, generator=g)
        (out * w).sum().backward()
        (act(gate) * up * w).sum().backward()
        assert (a.grad - b.grad).abs().max() < 1e-6


def test_padded_rows_only_where_onednn_computes_and_the_moe_output_is_unchanged(aten_linears):
    x, w = torch.randn(4096, 8), torch.randn(8, 16, 8)
    assert grouped.row_block(x, w, 8192, 8) == 1  # fp32 on ATen (MKL)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert grouped.row_block(x, w, 8192, 8) == 64  # 1024 rows an expert: padded to multiples of 64
        assert grouped.row_block(x, w, 16, 8) == 1  # decoding: 2 rows an expert
    moe = _randomize(_zoo_moe())
    x = torch.randn(4, 60, D, generator=torch.Generator().manual_seed(1))  # 240 pairs, 48 an expert: block 2
    outs = []
    for block in (None, 1):
        xa = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if block is None:
                assert grouped.row_block(xa, moe.w_gate_up, 240, E) == 2
                y = moe(xa)
            else:
                with pytest.MonkeyPatch.context() as m:
                    m.setattr("zoo.components.moe.row_block", lambda *a: 1)
                    y = moe(xa)
        y.float().pow(2).sum().backward()
        outs.append((y.float(), xa.grad, moe.w_gate_up.grad.clone()))
        moe.zero_grad()
    for a, b in zip(*outs):
        assert (a - b).abs().max() <= 1e-2 * b.abs().max()


def test_inference_keeps_the_experts_cast_only_while_their_weights_are_unchanged():
    import copy

    moe = _randomize(_zoo_moe()).eval()
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert grouped.cast_weight(moe.w_down, torch.bfloat16) is grouped.cast_weight(moe.w_down, torch.bfloat16)
        before = moe(x)
        moe.w_gate_up.mul_(-1)  # an in-place change (an optimizer step, a load_state_dict)
        after = moe(x)
        fresh = copy.deepcopy(moe)(x)  # new parameters, nothing cached
    assert torch.equal(after, fresh) and not torch.allclose(before, after)
    assert grouped.cast_weight(moe.w_down, torch.bfloat16).grad_fn is not None  # with autograd: cast anew


@pytest.mark.parametrize("padded", [False, True])
def test_load_balancing_loss_equals_hf(padded):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    g = torch.Generator().manual_seed(0)
    logits = tuple(torch.randn(2 * 6, E, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]) if padded else None
    ours = load_balancing_loss(logits, K, E, mask)
    theirs = load_balancing_loss_func(logits, E, K, mask)
    assert abs(float(ours) - float(theirs)) < 1e-6


def test_top_k_beyond_the_experts_is_a_spec_error():
    with pytest.raises(SpecError, match=r"top_k.*n_experts"):
        zoo.parse_spec({**_decoder(), "block": {"ffn": {"kind": "moe", "n_experts": 2, "top_k": 3}}})


def _decoder(**ffn) -> dict:
    return {"family": "decoder", "vocab_size": 61, "max_seq_len": 16, "d_model": 24, "n_layers": 2,
            "position": {"kind": "rope"},
            "block": {"attention": {"kind": "gqa", "n_heads": 4, "n_kv_heads": 2, "bias": False},
                      "norm": {"kind": "rmsnorm"},
                      "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"kind": "swiglu", "hidden": 20},
                              **ffn}}}


def test_moe_decoder_builds_trains_saves_loads_and_summarises(tmp_path):
    spec = zoo.parse_spec(_decoder(shared_hidden=12))
    model = zoo.build(spec, seed=0)
    tokens = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    model.train()
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    ffn = model.stack.blocks[0].ffn if hasattr(model, "stack") else next(m for m in model.modules()
                                                                          if isinstance(m, zoo.components.MoE))
    assert ffn.w_gate_up.grad is not None and ffn.w_gate_up.grad.abs().sum() > 0
    model.eval()
    path = zoo.save(model, tmp_path / "moe.safetensors")
    back = zoo.load(path)
    assert back.spec == spec
    with torch.no_grad():
        assert torch.equal(model(tokens), back(tokens))
    s = summarize(spec)
    assert s.parameters == sum(p.numel() for p in model.parameters())
    assert s.parts["ffn"] == sum(p.numel() for n, p in model.named_parameters() if ".ffn." in n)
    active = 24 * 4 + 2 * 3 * 24 * 20 + 3 * 24 * 12 + 24  # router, top_k experts, shared expert and its gate
    assert ffn.flops(9) == 2 * 9 * active
    spec_file = tmp_path / "moe.yaml"
    spec_file.write_text(zoo.to_yaml(spec))
    assert main(["summary", str(spec_file)]) == 0


@pytest.mark.reference
def test_every_converter_refuses_an_moe_ffn_by_name():
    from test_claims import CONVERTERS, base_specs, convert_back

    from zoo.interop import ConversionError
    from zoo.interop.claims import claims_value
    from zoo.interop.hf import ARCHS

    moe = {"kind": "moe", "n_experts": 3, "top_k": 2, "expert": {"kind": "swiglu", "hidden": 10}}
    dense = [n for n in CONVERTERS if n not in ARCHS or not claims_value(ARCHS[n].claims, "block.ffn.kind", "moe")]
    assert len(dense) < len(CONVERTERS)  # the mixture-of-experts decoders convert it (tests/test_hf_moe.py)
    for name in dense:
        data = base_specs(name)[0].model_dump(mode="json")
        data["block"] = {**data["block"], "ffn": moe}
        with pytest.raises(ConversionError, match=r"block\.ffn\.(kind|n_experts|top_k|expert|router)"):
            convert_back(name, zoo.parse_spec(data))
