"""DeepSeek-V3: ``DeepseekV3ForCausalLM`` (DeepSeek-V3, R1, Kimi-K2 layouts; ``DeepseekV3Model``
without the head) <-> a zoo decoder with multi-head latent attention (``attention.kind: mla``,
:class:`~zoo.spec.MLASpec`), rope pairs interleaved by ``rope_interleave``, pre-norm RMSNorm, the
first ``first_k_dense_replace`` layers a dense gated FFN ``intermediate_size`` wide (a layer pattern)
and the others a mixture of experts with DeepSeek-V3's router::

    self_attn.q_proj | q_a_proj, q_a_layernorm, q_b_proj  <-> attn.q | attn.q_a, attn.q_norm, attn.q_b
    self_attn.kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj <-> attn.kv_a, attn.kv_norm, attn.kv_b
    self_attn.o_proj                                      <-> attn.out
    mlp.gate.weight, mlp.gate.e_score_correction_bias     <-> ffn.router.weight, ffn.expert_bias
    mlp.experts.gate_up_proj, mlp.experts.down_proj       <-> ffn.w_gate_up, ffn.w_down
    mlp.shared_experts.{gate,up,down}_proj                <-> ffn.shared.fc1 ([gate | up]), ffn.shared.fc2

The router (``router``): each expert's sigmoid (``scoring: sigmoid``), ``n_group`` groups of which a
token takes the ``topk_group`` best (``n_groups``, ``topk_groups``), the correction bias held as
a loaded buffer (``score_bias: true``), ``norm_topk_prob`` and ``routed_scaling_factor``
(``routed_scale``); the shared experts, ``n_shared_experts * moe_intermediate_size`` wide, have no
gate. The scores' scale is 1/sqrt(qk_nope_head_dim + qk_rope_head_dim), times yarn's
``mscale(factor, mscale_all_dim)`` squared where the rope is scaled and ``mscale_all_dim`` is set
(``attention.scale``, as HF computes it). HF's class has no multi-token-prediction layer, nor
has zoo: a checkpoint's layers past the last (``num_nextn_predict_layers`` of them, the release's
``model.layers.61.*``) are refused by name unless the caller passes ``skip_mtp``
(:meth:`DeepseekV3.mtp_names`), and the configs zoo writes say ``num_nextn_predict_layers: 0``.
HF trains without a load-balancing loss and without moving the correction bias, so ``aux_loss_coef``
and ``bias_update`` other than 0 are refused by name.

DeepSeek-V2: ``DeepseekV2ForCausalLM`` (DeepSeek-V2, V2-Lite, V2.5; ``DeepseekV2Model`` without the
head) has the same tensors but the correction bias, rope always on interleaved pairs (HF turns
them as complex numbers), and its own router (HF's ``DeepseekV2TopkRouter``): a softmax over the
experts of logits computed in fp32 (``scoring: softmax``, ``fp32_logits``), the top k of all of
them (``topk_method: greedy``) or of the best ``topk_group`` of ``n_group`` groups, each group
ranked by its best expert alone (``group_limited_greedy``: ``n_groups``, ``topk_groups``,
``group_top: 1``), the weights times ``routed_scaling_factor`` and never renormalised. What HF's
class does not read is refused but for the value it computes: ``norm_topk_prob`` true, ``mlp_bias``
true (zoo's shared experts have no biases), the original code's ``moe_layer_freq`` other than 1
and ``scoring_func`` other than softmax; DeepseekV2Config also wants ``hidden_size`` a multiple of
``num_attention_heads``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from typing import Any

from zoo.interop.claims import ANY, one_of
from zoo.interop.common import Rule, rule
from zoo.interop.hf.base import GATED, act_name, ffn_of, fused, require, same_layers, weights
from zoo.interop.hf.llama import LLAMA_ACTS
from zoo.interop.hf.moe import MoEDecoder, MoEFields, at_of
from zoo.interop.hf.table import Check, Derived, Drop, Field, Fixed, Refuse, Tokens, table, table_rules
from zoo.interop.hf.traits import decoder, rope, who
from zoo.spec import FamilySpec
from zoo.spec.moe import MoESpec

__all__ = ["DeepseekV2", "DeepseekV3"]

_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


def mla_scale(head: int, rope_parameters: dict | None) -> float | None:
    """The scores' factor HF's DeepSeek-V3 computes (``yarn_apply_mscale``), or None where it is
    1/sqrt(``head``), zoo's default."""
    scaling, params = head ** -0.5, dict(rope_parameters or {})
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        factor = params["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * params["mscale_all_dim"] * math.log(factor) + 1.0
        scaling = scaling * mscale * mscale
    return None if scaling == head ** -0.5 else scaling


def _read_attention(c: Any, where: str) -> dict:
    require(c.num_key_value_heads == c.num_attention_heads, where, "num_key_value_heads", c.num_key_value_heads,
            f"{who(where)} expands every head's keys and values from one latent (num_key_value_heads = "
            f"num_attention_heads, {c.num_attention_heads})")
    head = c.qk_nope_head_dim + c.qk_rope_head_dim
    return {"block.attention": {
        "kind": "mla", "n_heads": c.num_attention_heads, "q_lora_rank": c.q_lora_rank, "kv_lora_rank": c.kv_lora_rank,
        "qk_nope_head_dim": c.qk_nope_head_dim, "qk_rope_head_dim": c.qk_rope_head_dim, "v_head_dim": c.v_head_dim,
        "bias": c.attention_bias, "scale": mla_scale(head, getattr(c, "rope_parameters", None))}}


def _write_attention(s: FamilySpec, where: str) -> dict:
    att, d = s.block.attention, s.d_model
    same_layers(s, where, parts=("ffn",))
    want = mla_scale(att.qk_size(d), {"rope_type": "default"} if s.position.scaling is None
                     else {"rope_type": s.position.scaling.kind, **s.position.scaling.model_dump()})
    require(att.scale == want, where, "block.attention.scale", att.scale,
            f"{who(where)}'s scores are scaled by 1/sqrt(qk_nope_head_dim + qk_rope_head_dim), times yarn's "
            f"mscale(factor, mscale_all_dim)^2 where set, which for this position.scaling is {want} (null: the "
            f"plain 1/sqrt)")
    require(att.has_out_bias == att.bias, where, "block.attention.out_bias", att.out_bias,
            f"{who(where)} has one attention_bias for the down and output projections")
    return {"num_attention_heads": att.n_heads, "num_key_value_heads": att.n_heads, "q_lora_rank": att.q_lora_rank,
            "kv_lora_rank": att.kv_lora_rank, "qk_nope_head_dim": att.qk_nope_head_dim,
            "qk_rope_head_dim": att.qk_rope_head_dim, "v_head_dim": att.v_size(d), "attention_bias": att.bias}


ATTENTION = Derived("attention", _read_attention, _write_attention, {
    "block.attention.kind": one_of("mla"), "block.attention.n_heads": ANY, "block.attention.n_kv_heads": ANY,
    "block.attention.head_dim": ANY, "block.attention.v_head_dim": ANY, "block.attention.q_lora_rank": ANY,
    "block.attention.kv_lora_rank": ANY, "block.attention.qk_nope_head_dim": ANY, "block.attention.qk_rope_head_dim": ANY,
    "block.attention.bias": ANY, "block.attention.out_bias": ANY, "block.attention.scale": ANY})


def _dense_count(c: Any, where: str) -> int:
    k, n = c.first_k_dense_replace or 0, c.num_hidden_layers
    require(0 <= k < n, where, "first_k_dense_replace", k,
            f"{who(where)} converts with at least one mixture-of-experts layer after its {n} layers' dense ones")
    return k


def _read_moe(c: Any, where: str, router: dict) -> dict:
    """The MoE block both classes read, with the ``router`` each builds."""
    _dense_count(c, where)
    n_experts, top_k = c.n_routed_experts, c.num_experts_per_tok
    require(isinstance(top_k, int) and 0 < top_k <= n_experts, where, "num_experts_per_tok", top_k,
            f"each token goes to between 1 and n_routed_experts ({n_experts}) experts")
    require(c.n_shared_experts and c.n_shared_experts > 0, where, "n_shared_experts", c.n_shared_experts,
            f"{who(where)}'s MoE layers have shared experts (a zero-wide MLP zoo does not build)")
    expert = {**ffn_of(GATED, c.hidden_act, where, "hidden_act"), "hidden": c.moe_intermediate_size, "bias": False}
    return {"block.ffn": {"kind": "moe", "n_experts": n_experts, "top_k": top_k, "expert": expert, "router": router,
                          "shared_hidden": c.n_shared_experts * c.moe_intermediate_size, "shared_gate": False}}


def _read_ffn(c: Any, where: str) -> dict:
    groups = c.n_group
    require(isinstance(groups, int) and groups > 0, where, "n_group", groups, "the experts fall into a positive number of groups")
    return _read_moe(c, where, {"scoring": "sigmoid", "n_groups": groups, "topk_groups": c.topk_group,
                                "norm_topk_prob": c.norm_topk_prob, "routed_scale": c.routed_scaling_factor, "score_bias": True,
                                "aux_loss_coef": 0.0})


def _read_dense(c: Any, where: str) -> dict:
    k, n = _dense_count(c, where), c.num_hidden_layers
    if not k:
        return {}
    ffn = {**ffn_of(GATED, c.hidden_act, where, "hidden_act"), "hidden": c.intermediate_size, "bias": False}
    return {"layers": [{"at": at_of(list(range(k)), n), "block": {"ffn": ffn}}]}


def _write_ffn(s: FamilySpec, where: str) -> dict:
    d, layers = s.d_model, [layer.block.ffn for layer in s.stack_layers()]
    moe = next(x for x in layers if isinstance(x, MoESpec))  # MoEDecoder.config refused a model without
    name, r = who(where), moe.router
    dense = [i for i, x in enumerate(layers) if not isinstance(x, MoESpec)]
    require(dense == list(range(len(dense))), where, "layers", dense,
            f"{name}'s dense layers are its first ones (first_k_dense_replace)")
    widths = set()
    for i, x in enumerate(layers):
        if isinstance(x, MoESpec):
            require(x == moe, where, "layers", f"layer {i}'s ffn", f"{name} has one setting for all its MoE layers")
            continue
        width = x.hidden_size(d)
        require(x.model_copy(update={"hidden": width}) == moe.expert.model_copy(update={"hidden": width}), where, "layers",
                f"layer {i}'s ffn", f"{name}'s dense layers are gated FFNs with its experts' activation ({moe.expert.kind}) "
                f"and no biases")
        widths.add(width)
    hidden = moe.expert.hidden_size(d)
    shared = moe.shared_hidden
    require(shared is not None and shared % hidden == 0, where, "block.ffn.shared_hidden", shared,
            f"{name}'s shared experts are n_shared_experts * moe_intermediate_size ({hidden}) wide")
    c = {"hidden_act": act_name(moe.expert, LLAMA_ACTS, where), "n_routed_experts": moe.n_experts,
         "num_experts_per_tok": moe.top_k, "moe_intermediate_size": hidden, "n_shared_experts": shared // hidden,
         "n_group": r.n_groups, "topk_group": r.topk_groups, "norm_topk_prob": r.norm_topk_prob,
         "routed_scaling_factor": r.routed_scale, "first_k_dense_replace": len(dense)}
    if widths:
        c["intermediate_size"] = widths.pop()
    return c


FFN_CLAIMS = {
    "block.ffn.kind": one_of("moe", "swiglu", "geglu"), "block.ffn.hidden": ANY, "block.ffn.approximate": ANY,
    "block.ffn.bias": one_of(False), "layers": ANY, "block.ffn.n_experts": ANY, "block.ffn.top_k": ANY,
    "block.ffn.expert.kind": ANY, "block.ffn.expert.hidden": ANY, "block.ffn.expert.approximate": ANY,  # no biases, no clamp
    "block.ffn.shared_hidden": ANY, "block.ffn.shared_gate": one_of(False),
    "block.ffn.router.softmax_before_topk": one_of(True), "block.ffn.router.scoring": one_of("sigmoid"),
    "block.ffn.router.n_groups": ANY, "block.ffn.router.topk_groups": ANY, "block.ffn.router.norm_topk_prob": ANY,
    "block.ffn.router.routed_scale": ANY, "block.ffn.router.score_bias": one_of(True),
    "block.ffn.router.aux_loss_coef": one_of(0.0), "block.ffn.router.bias_update": one_of(0.0),
}

DEEPSEEK_V3 = table(
    decoder(),
    rope(),
    Field("rope_interleave", "position.pairs", read=lambda v: "interleaved" if v else "half",
          write=lambda pairs: pairs == "interleaved", default=True),
    ATTENTION,
    Derived("ffn", _read_ffn, _write_ffn, FFN_CLAIMS),
    Fixed("block.norm.kind", "rmsnorm", why="RMSNorm (rmsnorm)"), Field("rms_norm_eps", "block.norm.eps"),
    Fixed("block.kind", "pre", why="norms before each sub-layer (pre)"),
    Field("attention_dropout", "dropout.attention"),
    Tokens({"bos_token_id": 0, "eos_token_id": 1}),
    Derived("dense layers", _read_dense, lambda s, where: {}),
    # zoo holds no multi-token-prediction module, so the checkpoints it writes have none
    Derived("mtp", lambda c, where: {}, lambda s, where: {"num_nextn_predict_layers": 0}),
)


class DeepseekV3(MoEDecoder):
    name = "DeepseekV3ForCausalLM"
    config_name = "DeepseekV3Config"
    model_type = "deepseek_v3"
    base = "DeepseekV3Model"
    moe = MoEFields(n_experts="n_routed_experts", expert="moe_intermediate_size")
    table = DEEPSEEK_V3

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        att = s.block.attention
        rules = [rule("tok_emb.weight", "model.embed_tokens.weight")]
        for i, layer in enumerate(s.stack_layers()):
            z, h = f"stack.blocks.{i}", f"model.layers.{i}"
            a, m = f"{z}.attn", f"{h}.self_attn"
            if att.q_lora_rank is None:
                query = weights(f"{a}.q", f"{m}.q_proj", bias=False)
            else:
                query = [*weights(f"{a}.q_a", f"{m}.q_a_proj", bias=att.bias), rule(f"{a}.q_norm.weight", f"{m}.q_a_layernorm.weight"),
                         *weights(f"{a}.q_b", f"{m}.q_b_proj", bias=False)]
            rules += [
                rule(f"{z}.attn_norm.weight", f"{h}.input_layernorm.weight"), *query,
                *weights(f"{a}.kv_a", f"{m}.kv_a_proj_with_mqa", bias=att.bias),
                rule(f"{a}.kv_norm.weight", f"{m}.kv_a_layernorm.weight"),
                *weights(f"{a}.kv_b", f"{m}.kv_b_proj", bias=False),
                *weights(f"{a}.out", f"{m}.o_proj", bias=att.has_out_bias),
                rule(f"{z}.ffn_norm.weight", f"{h}.post_attention_layernorm.weight"),
                *cls.ffn_rules(layer.block.ffn, z, h),
                *table_rules(cls.table, s, z, h),
            ]
        return rules + [rule("stack.norm.weight", "model.norm.weight"), rule("head.weight", "lm_head.weight")]

    @classmethod
    def ffn_rules(cls, ffn, z: str, h: str) -> list[Rule]:
        if not isinstance(ffn, MoESpec):
            return super().ffn_rules(ffn, z, h)
        m = f"{h}.mlp"
        bias = [rule(f"{z}.ffn.expert_bias", f"{m}.gate.e_score_correction_bias")] if ffn.router.has_bias else []
        return [rule(f"{z}.ffn.router.weight", f"{m}.gate.weight"), *bias,
                rule(f"{z}.ffn.w_gate_up", f"{m}.experts.gate_up_proj"), rule(f"{z}.ffn.w_down", f"{m}.experts.down_proj"),
                *fused(f"{z}.ffn.shared.fc1", [f"{m}.shared_experts.gate_proj", f"{m}.shared_experts.up_proj"], bias=False),
                rule(f"{z}.ffn.shared.fc2.weight", f"{m}.shared_experts.down_proj.weight")]

    @classmethod
    def mtp_names(cls, config: Any, names: Collection[str]) -> list[str]:
        """The layers ``num_hidden_layers`` .. + ``num_nextn_predict_layers`` - 1 of a checkpoint (the
        release's ``model.layers.61.*``: ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head``,
        ``embed_tokens`` and a decoder layer), which HF's class does not hold."""
        n, m = config.num_hidden_layers, getattr(config, "num_mtp_layers", 0) or 0
        layer = [_LAYER.match(k) for k in names]
        return [k for k, x in zip(names, layer) if x is not None and n <= int(x.group(1)) < n + m]

    @classmethod
    def stored_in_parts(cls, config: Any) -> dict[str, tuple[str, ...]]:
        k, out = _dense_count(config, f"{cls.name} -> zoo"), {}
        for i in range(k, config.num_hidden_layers):
            h = f"model.layers.{i}"
            experts = [f"{h}.mlp.experts.{e}" for e in range(config.n_routed_experts)]
            out[f"{h}.mlp.experts.gate_up_proj"] = tuple(f"{x}.{p}.weight" for x in experts for p in ("gate_proj", "up_proj"))
            out[f"{h}.mlp.experts.down_proj"] = tuple(f"{x}.down_proj.weight" for x in experts)
        return out




# ----------------------------------------------------------------------------------- DeepSeek-V2
def _read_ffn_v2(c: Any, where: str) -> dict:
    method, n = c.topk_method, c.n_routed_experts
    require(method in ("greedy", "group_limited_greedy"), where, "topk_method", method,
            f"{who(where)}'s router picks the top experts of all (greedy) or of the best topk_group of n_group groups "
            f"(group_limited_greedy)")
    require(not c.norm_topk_prob, where, "norm_topk_prob", c.norm_topk_prob,
            f"{who(where)}'s router never renormalises the picked experts' weights (it does not read norm_topk_prob); "
            f"set it false, which is what the class computes")
    router = {"scoring": "softmax", "norm_topk_prob": False, "routed_scale": c.routed_scaling_factor, "aux_loss_coef": 0.0,
              "fp32_logits": True}
    if method == "group_limited_greedy":
        groups, top = c.n_group, c.topk_group
        require(isinstance(groups, int) and groups > 0 and n % groups == 0, where, "n_group", groups,
                f"group_limited_greedy splits the {n} experts (n_routed_experts) into n_group equal groups")
        require(isinstance(top, int) and 0 < top <= groups, where, "topk_group", top,
                f"a token picks from between 1 and n_group ({groups}) groups")
        router |= {"n_groups": groups, "topk_groups": top, "group_top": 1} if groups > 1 else {}
    return _read_moe(c, where, router)


def _write_ffn_v2(s: FamilySpec, where: str) -> dict:
    c = _write_ffn(s, where)
    r = next(x.block.ffn for x in s.stack_layers() if isinstance(x.block.ffn, MoESpec)).router
    require(r.n_groups == 1 or r.group_top == 1, where, "block.ffn.router.group_top", r.group_top,
            f"{who(where)}'s group_limited_greedy ranks each group by its best score alone (group_top: 1)")
    return c | {"topk_method": "greedy" if r.n_groups == 1 else "group_limited_greedy"}


FFN_CLAIMS_V2 = FFN_CLAIMS | {
    "block.ffn.router.scoring": one_of("softmax"), "block.ffn.router.score_bias": one_of(False),
    "block.ffn.router.norm_topk_prob": one_of(False), "block.ffn.router.group_top": ANY,
    "block.ffn.router.fp32_logits": one_of(True)}

DEEPSEEK_V2 = table(
    DEEPSEEK_V3,
    Fixed("position.pairs", "interleaved", why="rope on interleaved pairs (pairs: interleaved; DeepSeek-V2's complex rotation)"),
    Derived("ffn", _read_ffn_v2, _write_ffn_v2, FFN_CLAIMS_V2),
    Refuse("mlp_bias", False, "zoo's shared experts have no biases; DeepSeek-V2's are bias-free (mlp_bias: false)", falsy=True),
    Refuse("moe_layer_freq", 1, "HF's DeepseekV2 makes every layer from first_k_dense_replace on a mixture of experts "
           "(it does not read moe_layer_freq); only 1 describes it", write=False),
    Refuse("scoring_func", "softmax", "HF's DeepseekV2 scores experts by a softmax (it does not read scoring_func)", write=False),
    Check("block.attention.n_heads", lambda s: s.d_model % s.block.attention.n_heads == 0,
          lambda s: f"DeepseekV2Config requires hidden_size (d_model: {s.d_model}) to be a multiple of num_attention_heads",
          claim=None),
    Tokens({"bos_token_id": 1, "eos_token_id": 2}),
    Drop("mtp"),  # DeepseekV2Config has no num_nextn_predict_layers
)


class DeepseekV2(DeepseekV3):
    name = "DeepseekV2ForCausalLM"
    config_name = "DeepseekV2Config"
    model_type = "deepseek_v2"
    base = "DeepseekV2Model"
    table = DEEPSEEK_V2
