"""DeepSeek-V3's router in zoo's MoE (``router.scoring: sigmoid``, ``n_groups``/``topk_groups``,
``score_bias``, ``routed_scale``) against HF's ``DeepseekV3MoE`` with the weights and the score
correction bias copied: the experts each token picks, the output and the gradients; and the spec's
rules for groups."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.spec import MoESpec

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("aten_linears")
D, F, E, K = 21, 13, 8, 3


def hf_moe(norm: bool, groups: int, topk_groups: int, shared: int):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    config = transformers.DeepseekV3Config(hidden_size=D, moe_intermediate_size=F, n_routed_experts=E, num_experts_per_tok=K,
                                           n_group=groups, topk_group=topk_groups, n_shared_experts=shared,
                                           routed_scaling_factor=2.5, norm_topk_prob=norm)
    hf = DeepseekV3MoE(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        hf.gate.e_score_correction_bias.copy_(0.2 * torch.randn(E, generator=g))
    return hf


def moe_of(hf, router: dict, shared: int):
    """A zoo MoE layer with ``router``'s settings and ``shared`` shared experts, holding the weights of
    HF's DeepSeek MoE layer ``hf`` (V3's correction bias where it has one)."""
    spec = MoESpec.model_validate({"n_experts": E, "top_k": K, "expert": {"kind": "swiglu", "hidden": F}, "router": router,
                                   "shared_hidden": F * shared, "shared_gate": False})
    moe = zoo.registry("ffn").builder("moe")(spec, dim=D, dropout=0.0)
    s = hf.shared_experts
    with torch.no_grad():
        moe.router.weight.copy_(hf.gate.weight)
        if hasattr(hf.gate, "e_score_correction_bias"):
            moe.expert_bias.copy_(hf.gate.e_score_correction_bias)
        moe.w_gate_up.copy_(hf.experts.gate_up_proj)
        moe.w_down.copy_(hf.experts.down_proj)
        moe.shared.fc1.weight.copy_(torch.cat([s.gate_proj.weight, s.up_proj.weight]))
        moe.shared.fc2.weight.copy_(s.down_proj.weight)
    return moe


def zoo_moe(hf, norm: bool, groups: int, topk_groups: int, shared: int):
    return moe_of(hf, {"scoring": "sigmoid", "n_groups": groups, "topk_groups": topk_groups, "score_bias": True,
                       "routed_scale": 2.5, "norm_topk_prob": norm}, shared)


@pytest.mark.parametrize("norm,groups,topk_groups,shared", [(True, 4, 2, 1), (False, 2, 1, 2), (True, 1, 1, 1)])
def test_sigmoid_group_router_equals_hf_deepseek_v3_moe(norm, groups, topk_groups, shared):
    hf = hf_moe(norm, groups, topk_groups, shared)
    moe = zoo_moe(hf, norm, groups, topk_groups, shared)
    x = torch.randn(3, 7, D, generator=torch.Generator().manual_seed(1))
    _, hf_weights, hf_experts = hf.gate(x)
    _, weights, experts = moe.route(x.reshape(-1, D))
    order, hf_order = experts.sort(dim=-1), hf_experts.sort(dim=-1)
    assert torch.equal(order.values, hf_order.values)
    assert (weights.gather(1, order.indices) - hf_weights.gather(1, hf_order.indices)).abs().max() < 1e-6
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = moe(xa), hf(xb)
    assert (ya - yb).abs().max() < 1e-5
    g = torch.randn(ya.shape, generator=torch.Generator().manual_seed(2))
    ya.backward(g)
    yb.backward(g)
    assert (xa.grad - xb.grad).abs().max() < 1e-4
    assert (moe.router.weight.grad - hf.gate.weight.grad).abs().max() < 1e-4
    assert (moe.w_down.grad - hf.experts.down_proj.grad).abs().max() < 1e-4


def test_groups_limit_the_experts_a_token_takes():
    moe = zoo_moe(hf_moe(True, 2, 1, 1), True, 2, 1, 1)
    _, _, experts = moe.route(torch.randn(50, D, generator=torch.Generator().manual_seed(3)))
    group = experts // (E // 2)
    assert (group == group[:, :1]).all() and len(group[:, 0].unique()) == 2  # one group per token, both used
    assert "expert_bias" in moe.state_dict()


@pytest.mark.parametrize("router,field", [({"n_groups": 3}, "n_groups"), ({"n_groups": 4, "topk_groups": 5}, "topk_groups"),
                                          ({"n_groups": 8}, "n_groups"), ({"n_groups": 4, "topk_groups": 1}, "top_k"),
                                          ({"scoring": "sigmoid", "softmax_before_topk": False}, "scoring")])
def test_group_rules_name_the_field(router, field):
    with pytest.raises(ValueError, match=field):
        MoESpec.model_validate({"n_experts": E, "top_k": K, "router": router})


@pytest.mark.parametrize("rate", [0.0, 0.01])
def test_deepseek_tiny_trains_and_its_held_bias_moves_only_with_bias_update(rate):
    from zoo.train import Dist
    from zoo.train.router import RouterTraining

    shrink = ["d_model=32", "vocab_size=61", "max_seq_len=32", "block.attention.q_lora_rank=12",
              "block.attention.kv_lora_rank=10", "block.attention.qk_nope_head_dim=6", "block.attention.qk_rope_head_dim=4",
              "block.attention.v_head_dim=8", "block.ffn.expert.hidden=16", "block.ffn.shared_hidden=16",
              f"block.ffn.router.bias_update={rate}"]
    model = zoo.build(zoo.load_spec("deepseek-tiny", shrink), seed=0).train()
    moe = model.stack.blocks[3].ffn
    with torch.no_grad():
        moe.expert_bias.copy_(0.1 * torch.randn(16, generator=torch.Generator().manual_seed(0)))  # a loaded bias
    held = moe.expert_bias.clone()
    x = torch.randint(0, 61, (4, 17), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    helper, losses = RouterTraining.of(model), []
    for _ in range(12):
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        helper.micro_batch()
        opt.step()
        opt.zero_grad()
        helper.after_step(Dist())
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    assert torch.equal(moe.expert_bias, held) == (rate == 0.0)


def hf_v2_moe(method: str, groups: int | None, topk_groups: int | None):
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe

    config = transformers.DeepseekV2Config(hidden_size=D, moe_intermediate_size=F, n_routed_experts=E, num_experts_per_tok=K,
                                           n_group=groups, topk_group=topk_groups, topk_method=method, n_shared_experts=2,
                                           routed_scaling_factor=1.6, num_attention_heads=3)
    hf = DeepseekV2Moe(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return hf


def zoo_v2_moe(hf, groups: int, topk_groups: int, group_top: int = 1, fp32_logits: bool = True):
    return moe_of(hf, {"n_groups": groups, "topk_groups": topk_groups, "group_top": group_top, "routed_scale": 1.6,
                       "norm_topk_prob": False, "fp32_logits": fp32_logits}, 2)


@pytest.mark.parametrize("method,groups,topk_groups", [("greedy", None, None), ("group_limited_greedy", 4, 2),
                                                       ("group_limited_greedy", 2, 1)])
def test_softmax_group_router_equals_hf_deepseek_v2_moe(method, groups, topk_groups):
    """DeepSeek-V2's router: softmax scores, groups ranked by their best expert alone (group_top 1), the
    picked weights times routed_scaling_factor and never renormalised; the experts, weights and output."""
    hf = hf_v2_moe(method, groups, topk_groups)
    moe = zoo_v2_moe(hf, groups or 1, topk_groups or 1)
    x = torch.randn(4, 9, D, generator=torch.Generator().manual_seed(1))
    _, hf_weights, hf_experts = hf.gate(x)
    _, weights, experts = moe.route(x.reshape(-1, D))
    order, hf_order = experts.sort(dim=-1), hf_experts.sort(dim=-1)
    assert torch.equal(order.values, hf_order.values)
    assert (weights.gather(1, order.indices) - hf_weights.gather(1, hf_order.indices)).abs().max() < 1e-6
    assert (moe(x) - hf(x)).abs().max() < 1e-5
    if groups:  # ranking the groups by their two best (DeepSeek-V3's rule) picks other experts for some token
        assert not torch.equal(zoo_v2_moe(hf, groups, topk_groups, group_top=2).route(x.reshape(-1, D))[2].sort(-1).values,
                               order.values)


def test_v2_router_logits_in_fp32_pick_hf_s_experts_in_bf16():
    """HF's DeepSeek-V2 router computes its logits in fp32 whatever the model's dtype (fp32_logits): in
    bf16 zoo picks its experts for every token, and would not for some with bf16 logits."""
    hf = hf_v2_moe("group_limited_greedy", 4, 2).to(torch.bfloat16)
    x = torch.randn(4000, D, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    want = hf.gate(x)[2].sort(dim=-1).values
    picked = [zoo_v2_moe(hf, 4, 2, fp32_logits=f).to(torch.bfloat16).route(x)[2].sort(dim=-1).values for f in (True, False)]
    assert torch.equal(picked[0], want) and not torch.equal(picked[1], want)
