"""The spec of a mixture-of-experts FFN (``ffn.kind: moe``): a router picks ``top_k`` of
``n_experts`` gated FFNs for each token and sums their outputs weighted by the router's
probabilities (Shazeer et al. 2017; Switch Transformer; Mixtral; Qwen2-MoE; OLMoE)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator

from zoo.spec.base import Kinds, Spec, register_specs
from zoo.spec.parts import FFNBaseSpec, GatedFFNSpec, GeGLUSpec, SwiGLUSpec

__all__ = ["MoERouterSpec", "MoESpec"]


class MoERouterSpec(Spec):
    """How the router turns its logits (a bias-free linear D -> n_experts) into each token's experts
    and their weights. ``softmax_before_topk``: softmax over all experts, then the top-k
    probabilities (Mixtral, Qwen2/3-MoE, OLMoE), renormalised to sum to one with ``norm_topk_prob``
    (Mixtral always; Qwen's and OLMoE's ``norm_topk_prob``). ``softmax_before_topk: false``: the
    top-k logits, then a softmax over those (equal to softmax-then-renormalise)."""

    softmax_before_topk: bool = Field(True, description="softmax over all experts before picking the top k; "
                                      "false: top k of the logits, softmax over those")
    norm_topk_prob: bool = Field(True, description="renormalise the top-k probabilities to sum to one (Mixtral: "
                                 "always; Qwen2-MoE/OLMoE: their norm_topk_prob)")
    jitter: NonNegativeFloat = Field(0.0, description="training only: the FFN's input multiplied by uniform noise "
                                     "in [1 - jitter, 1 + jitter] (Mixtral's router_jitter_noise); 0: none")
    aux_loss_coef: NonNegativeFloat = Field(
        0.01, description="weight of the Switch Transformer load-balancing loss the training loop adds (HF's "
        "router_aux_loss_coef, computed as HF's load_balancing_loss_func over all MoE layers of a stack, padding "
        "left out); 0: not added (still logged)")
    z_loss_coef: NonNegativeFloat = Field(
        0.0, description="weight of the router z-loss (ST-MoE: the mean over tokens of logsumexp(router logits)^2) "
        "the training loop adds; 0: not added (still logged)")
    bias_update: NonNegativeFloat = Field(
        0.0, description="auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias (buffer expert_bias) is "
        "added to the scores that pick the top k, not to the weights, and after each optimizer step moves by "
        "this rate times sign(mean load - the expert's load) over the step's tokens; 0: no bias")
    bias: bool = Field(False, description="a bias on the router's linear (gpt-oss); false: none")
    scoring: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="what scores the experts: a softmax over them, or each one's sigmoid (DeepSeek-V3's "
        "scoring_func, computed in fp32 from fp32 logits); the weights are the picked experts' scores")
    n_groups: PositiveInt = Field(
        1, description="group-limited routing (DeepSeek-V3's n_group): the experts fall into this many equal groups "
        "in order, each group ranked by the sum of its group_top best scores (with the score bias), and a token picks "
        "its top k from the best topk_groups groups only; 1: no groups")
    topk_groups: PositiveInt = Field(1, description="with n_groups: how many of the best groups a token picks from "
                                     "(DeepSeek-V3's topk_group); n_groups: every group")
    score_bias: bool = Field(
        False, description="a per-expert bias (buffer expert_bias, saved with the weights) added to the scores that "
        "pick the experts, never to the weights (HF's e_score_correction_bias), held fixed unless bias_update moves "
        "it; bias_update > 0 always has it")
    routed_scale: PositiveFloat = Field(1.0, description="the routed experts' weights multiplied by this number, after "
                                        "norm_topk_prob (DeepSeek-V3's routed_scaling_factor, 2.5); 1: none")
    sigmoid_after_topk: bool = Field(
        False, description="the top k of the logits, each weighted by the sigmoid of its logit and never "
        "renormalised (Llama 4's router); replaces the softmax, so softmax_before_topk and norm_topk_prob stay true")
    group_top: PositiveInt = Field(
        2, description="with n_groups: how many of a group's best scores sum to its rank (DeepSeek-V3: its two best; "
        "DeepSeek-V2's group_limited_greedy: 1, its best alone)")
    fp32_logits: bool = Field(
        False, description="the logits computed in fp32 from the input and the weight cast to fp32, whatever the model's "
        "dtype (HF's DeepSeek-V2 router; a sigmoid scoring always is); false: in the model's dtype (Mixtral, Qwen)")

    @model_validator(mode="after")
    def _check(self) -> MoERouterSpec:
        if not self.softmax_before_topk and not self.norm_topk_prob:
            raise ValueError("router.norm_topk_prob: with softmax_before_topk false the softmax over the top k "
                             "already sums to one; set norm_topk_prob: true (or softmax_before_topk: true)")
        if self.sigmoid_after_topk and not (self.softmax_before_topk and self.norm_topk_prob):
            raise ValueError("router.sigmoid_after_topk: the sigmoid replaces the softmax, which softmax_before_topk "
                             "and norm_topk_prob describe; leave both true")
        if self.sigmoid_after_topk and (self.scoring != "softmax" or self.n_groups > 1 or self.routed_scale != 1.0):
            raise ValueError("router.sigmoid_after_topk: Llama 4's router weighs the top k of the logits itself; "
                             "leave scoring: softmax, n_groups: 1 and routed_scale: 1 (DeepSeek-V3's router)")
        if not self.softmax_before_topk and (self.scoring != "softmax" or self.n_groups > 1):
            field = "scoring" if self.scoring != "softmax" else "n_groups"
            raise ValueError(f"router.{field}: a sigmoid scoring or groups score every expert before the top k; set "
                             f"softmax_before_topk: true")
        if self.fp32_logits and self.bias:
            raise ValueError("router.fp32_logits: the fp32 logits are computed without the router's bias; set bias: false")
        if self.topk_groups > self.n_groups:
            raise ValueError(f"router.topk_groups ({self.topk_groups}) picks more groups than there are (n_groups: "
                             f"{self.n_groups}); set topk_groups <= n_groups")
        return self

    @property
    def has_bias(self) -> bool:
        """Whether the router holds the per-expert bias that picks experts (``score_bias`` or ``bias_update``)."""
        return self.score_bias or self.bias_update > 0


ExpertFFN = Annotated[GatedFFNSpec, Kinds("expert FFN", {"swiglu": SwiGLUSpec, "geglu": GeGLUSpec})]


class MoESpec(FFNBaseSpec):
    """A sparse mixture of gated-FFN experts. Each token goes to its ``top_k`` experts of
    ``n_experts`` (router: :class:`MoERouterSpec`), whose outputs are summed with the router's
    weights; ``shared_hidden`` adds an expert every token takes (Qwen2-MoE).

    Routing is dropless by default: every expert takes every token routed to it, however many;
    a ``capacity_factor`` caps each expert in training (Switch Transformer) and drops the tokens
    beyond it, keeping the first by position (one field, so a capacity cannot contradict a dropless
    setting). The router's losses (``router.aux_loss_coef``, ``router.z_loss_coef``)
    are added by the training loop; ``router.bias_update`` balances without a loss (DeepSeek-V3).

    ``expert`` is the experts' FFN, a gated kind (swiglu, geglu) whose ``hidden`` is each expert's
    hidden size; ``expert.bias`` defaults to false here (gpt-oss's experts have biases: ``b_gate_up``
    [E, 2F], ``b_down`` [E, D]), and a swiglu expert may clamp (``expert.limit``, gpt-oss). The experts'
    weights are stacked per expert (``w_gate_up`` [E, 2F, D], ``w_down`` [E, D, F]: HF Mixtral's
    ``gate_up_proj``/``down_proj`` layout)."""

    kind: Literal["moe"] = "moe"
    n_experts: PositiveInt = Field(8, description="experts per layer (Mixtral's num_local_experts, Qwen's num_experts)")
    top_k: PositiveInt = Field(2, description="experts each token is routed to (num_experts_per_tok)")
    expert: ExpertFFN = Field(default_factory=lambda: SwiGLUSpec(bias=False),
                              description="each expert's gated FFN (swiglu or geglu); its hidden is the per-expert "
                              "hidden size (Mixtral's intermediate_size, Qwen's moe_intermediate_size)")
    router: MoERouterSpec = Field(default_factory=MoERouterSpec, description="how tokens pick their experts")
    shared_hidden: PositiveInt | None = Field(
        None, description="hidden size of a shared expert every token takes besides its routed ones, a gated FFN of "
        "the experts' kind (Qwen2-MoE's shared_expert_intermediate_size); null: no shared expert")
    shared_gate: bool = Field(True, description="with a shared expert: its output scaled by sigmoid of a bias-free "
                              "linear D -> 1 (Qwen2-MoE's shared_expert_gate)")
    capacity_factor: PositiveFloat | None = Field(
        None, description="null: dropless (every expert computes every token routed to it); a number: in training "
        "each expert takes at most ceil(capacity_factor * tokens * top_k / n_experts) of a batch's tokens, the first "
        "by position, and drops the rest (the residual carries them), which the training loop logs; evaluation "
        "and decoding stay dropless (Switch Transformer: 1.0-1.25)")
    weight_input: bool = Field(
        False, description="the router's weight multiplies each routed expert's input, not its output (Llama 4's "
        "Llama4TextMoe); false: its output")

    @model_validator(mode="before")
    @classmethod
    def _experts_without_bias(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "hidden" in data:
                raise ValueError("hidden: an moe FFN's hidden size is each expert's; set expert.hidden instead")
            expert = data.get("expert")
            if isinstance(expert, dict) and "bias" not in expert:
                data = {**data, "expert": {**expert, "bias": False}}
        return data

    @field_validator("expert")
    @classmethod
    def _check_expert(cls, expert: GatedFFNSpec) -> GatedFFNSpec:
        if expert.norm:
            raise ValueError("expert.norm: experts have no norm on their hidden activation; set expert.norm: false")
        return expert

    @model_validator(mode="after")
    def _check_top_k(self) -> MoESpec:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) routes each token to more experts than there are "
                             f"(n_experts: {self.n_experts}); set top_k <= n_experts")
        g = self.router.n_groups
        top = self.router.group_top
        if g > 1 and (self.n_experts % g or self.n_experts // g < top):
            raise ValueError(f"router.n_groups: {self.n_experts} experts (n_experts) split into {g} equal groups of at "
                             f"least {top} (a group ranks by its router.group_top best scores); choose n_groups dividing "
                             f"n_experts")
        if g > 1 and self.top_k > self.router.topk_groups * (self.n_experts // g):
            raise ValueError(f"top_k ({self.top_k}) routes each token to more experts than its router.topk_groups "
                             f"groups hold; raise topk_groups or lower top_k")
        return self

    def hidden_size(self, d_model: int) -> int:
        """Each expert's hidden size."""
        return self.expert.hidden_size(d_model)


register_specs("ffn", FFNBaseSpec, {"moe": MoESpec})
