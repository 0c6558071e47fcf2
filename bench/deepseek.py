"""DeepSeek-V3 rows: multi-head latent attention's decoding cache against grouped-query attention,
and a DeepSeek-shaped MoE layer against HF's ``DeepseekV3MoE``.

``decode``: two zoo decoders of one width, depth, head count and FFN, one with ``attention.kind:
mla`` (DeepSeek-V3's proportions: a query latent 3/14 of d_model, a kv latent 1/14, per head 128 +
64 query/key dimensions and 128 value ones, scaled to the width) and one with GQA at 4 query heads
per key/value head (Llama 3's ratio); greedy decoding through zoo's KV cache timed side by side, with
each side's cache bytes per token and parameters (``zoo summary``'s counts) in the row (MLA is the
``zoo`` side, GQA the peer). MLA caches
kv_lora_rank + qk_rope_head_dim elements per token and layer for every head together, GQA
2 x n_kv_heads x head_dim. The zoo side decodes folded (``attention.fold: auto``: each step scores
the absorbed queries against the cached latents themselves); a second peer, ``MLA unfolded``
(``fold: never``, the same weights, checked to decode the same tokens before timing), expands the
cached latents into every head's keys and values at each step.

``moe``: one MoE layer shaped as DeepSeek-V3's (256 experts scaled down, top 8 of the best 4 of 8
groups, a sigmoid router with its correction bias, routed scale 2.5, one ungated shared expert):
zoo's ``ffn.kind: moe`` and HF's ``DeepseekV3MoE`` with the same weights (checked equal before
timing), forward and forward + backward over a batch of tokens.
"""

from __future__ import annotations

import torch

import zoo
import zoo.train as T
from bench.common import Row, Side, compare, here
from zoo.summary import summarize

Timing = dict


def decoders(tiny: bool = False) -> dict[str, zoo.spec.FamilySpec]:
    """The MLA (folded and unfolded decoding) and GQA decoders' specs, equal but for the attention."""
    d, layers, heads, vocab = (64, 2, 4, 96) if tiny else (1024, 8, 8, 32000)
    head = d // heads
    base = {"family": "decoder", "vocab_size": vocab, "max_seq_len": 512, "d_model": d, "n_layers": layers,
            "head": {"kind": "lm", "bias": False, "tied": False}, "position": {"kind": "rope", "pairs": "interleaved"},
            "block": {"kind": "pre", "norm": {"kind": "rmsnorm", "eps": 1e-6},
                      "ffn": {"kind": "swiglu", "hidden": 8 * d // 3, "bias": False}}}
    mla = {"kind": "mla", "n_heads": heads, "q_lora_rank": 3 * d // 14, "kv_lora_rank": d // 14,
           "qk_nope_head_dim": head, "qk_rope_head_dim": head // 2, "v_head_dim": head, "bias": False}
    gqa = {"kind": "gqa", "n_heads": heads, "n_kv_heads": heads // 4, "bias": False}
    return {name: zoo.spec.parse_spec({**base, "block": {**base["block"], "attention": att}})
            for name, att in (("mla", mla), ("gqa", gqa), ("mla_unfolded", {**mla, "fold": "never"}))}


def decode(precision: str, timing: Timing, *, batch: int = 4, prompt: int = 64, new_tokens: int = 64,
           tiny: bool = False) -> Row:
    """Greedy decoding of ``new_tokens`` after ``prompt`` tokens, MLA (folded) against GQA and MLA
    unfolded."""
    if tiny:
        batch, prompt, new_tokens = 2, 8, 4
    specs = decoders(tiny)
    models = {name: zoo.build(s, seed=0, device=here()).eval() for name, s in specs.items()}
    ids = torch.randint(0, specs["mla"].vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0),
                        device="cpu").to(here())

    def step(model):
        def run():
            with T.autocast(here(), precision):
                return zoo.generate(model, ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_id=None)
        return run

    assert same_steps(models["mla"], models["mla_unfolded"], ids), "folded decoding differs from unfolded"
    spec = specs["mla"]
    row = Row(workload=f"MLA folded (zoo side) vs GQA decode {spec.n_layers}L/{spec.d_model} b{batch}",
              precision=precision, unit="tokens", work=batch * new_tokens)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    sizes = {name: summarize(specs[name], seq=prompt + new_tokens, dtype=dtype) for name in ("mla", "gqa")}
    row.extra = {"kv_cache_bytes_per_token": {name.upper(): x.kv_cache_bytes_per_token for name, x in sizes.items()},
                 "parameters": {name.upper(): zoo.count_parameters(models[name]) for name in ("mla", "gqa")}}
    row.seconds, row.spread = compare([Side("zoo", step(models["mla"])), Side("GQA", step(models["gqa"])),
                                       Side("MLA unfolded", step(models["mla_unfolded"]))], **timing)
    return row


@torch.no_grad()
def same_steps(folded, unfolded, ids: torch.Tensor, steps: int = 3) -> bool:
    """Whether two decoders' logits agree (fp32 tolerance) over the prompt ``ids`` and ``steps``
    cached steps fed the same tokens (the first model's greedy choices)."""
    caches = [m.new_cache(ids.shape[1] + steps) for m in (folded, unfolded)]
    tokens = ids
    for _ in range(steps):
        a, b = (m(tokens, None, cache=c, last_only=True)[:, -1] for m, c in zip((folded, unfolded), caches))
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-4):
            return False
        tokens = a.argmax(-1, keepdim=True)
    return True


def moe_pair(tiny: bool = False):
    """zoo's MoE layer and HF's DeepseekV3MoE with the same weights, DeepSeek-V3's routing."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    d, experts, hidden = (32, 16, 16) if tiny else (1024, 64, 256)
    config = DeepseekV3Config(hidden_size=d, moe_intermediate_size=hidden, n_routed_experts=experts, num_experts_per_tok=8 if not tiny else 4,
                              n_group=8, topk_group=4, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True)
    hf = DeepseekV3MoE(config).to(here())
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_((torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5).to(p))
        hf.gate.e_score_correction_bias.copy_(0.01 * torch.randn(experts, generator=g))
    spec = zoo.spec.MoESpec.model_validate({
        "n_experts": experts, "top_k": config.num_experts_per_tok, "expert": {"kind": "swiglu", "hidden": hidden},
        "router": {"scoring": "sigmoid", "n_groups": 8, "topk_groups": 4, "score_bias": True, "routed_scale": 2.5,
                   "aux_loss_coef": 0.0}, "shared_hidden": hidden, "shared_gate": False})
    ours = zoo.registry("ffn").builder("moe")(spec, dim=d, dropout=0.0).to(here())
    s = hf.shared_experts
    with torch.no_grad():
        ours.router.weight.copy_(hf.gate.weight)
        ours.expert_bias.copy_(hf.gate.e_score_correction_bias)
        ours.w_gate_up.copy_(hf.experts.gate_up_proj)
        ours.w_down.copy_(hf.experts.down_proj)
        ours.shared.fc1.weight.copy_(torch.cat([s.gate_proj.weight, s.up_proj.weight]))
        ours.shared.fc2.weight.copy_(s.down_proj.weight)
    return ours, hf


def moe(precision: str, timing: Timing, *, tokens: int = 2048, train: bool = False, tiny: bool = False) -> Row:
    """A DeepSeek-shaped MoE layer, zoo against HF, forward (or forward + backward) over ``tokens``."""
    if tiny:
        tokens = 32
    ours, hf = moe_pair(tiny)
    x = torch.randn(1, tokens, ours.router.in_features, generator=torch.Generator().manual_seed(1)).to(here())
    with torch.no_grad():
        assert (ours(x) - hf(x)).abs().max() < 1e-4, "zoo's MoE and HF's DeepseekV3MoE differ"

    def step(m):
        def run():
            with T.autocast(here(), precision):
                if train:
                    m(x.detach().requires_grad_()).float().square().mean().backward()
                else:
                    with torch.inference_mode():
                        m(x)
        return run

    what = "train" if train else "forward"
    row = Row(workload=f"DeepSeek MoE layer {ours.n_experts} experts top-{ours.top_k} {what}", precision=precision,
              unit="tokens", work=tokens)
    row.flops = (3 if train else 1) * ours.flops(tokens)
    row.seconds, row.spread = compare([Side("zoo", step(ours)), Side("HF", step(hf))], **timing)
    return row


def rows(precision: str, timing: Timing, tiny: bool = False) -> list[Row]:
    """MLA's decoding against GQA's, and the MoE layer forward and training."""
    return [decode(precision, timing, tiny=tiny), moe(precision, timing, tiny=tiny),
            moe(precision, timing, train=True, tiny=tiny)]
