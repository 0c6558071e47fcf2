"""What HF's mixture-of-experts decoders share: :class:`MoEDecoder`, the base of Mixtral, Qwen2-MoE,
Qwen3-MoE and OLMoE. Each is laid out as LLaMA (:class:`~zoo.interop.hf.llama.Llama`) with a sparse
MoE block as the layer's ``mlp`` (zoo's ``ffn.kind: moe``, :class:`~zoo.components.moe.MoE`)::

    mlp.gate.weight                    [E, D]       <-> ffn.router.weight
    mlp.experts.gate_up_proj           [E, 2F, D]   <-> ffn.w_gate_up   ([gate | up] per expert)
    mlp.experts.down_proj              [E, D, F]    <-> ffn.w_down
    mlp.shared_expert.{gate,up,down}_proj           <-> ffn.shared.fc1 ([gate | up]), ffn.shared.fc2
    mlp.shared_expert_gate.weight      [1, D]       <-> ffn.shared_gate.weight      (Qwen2-MoE)

The config's fields: ``num_experts`` (Mixtral: ``num_local_experts``) is ``n_experts``,
``num_experts_per_tok`` is ``top_k``, ``hidden_act`` the experts' gated FFN (silu: swiglu, gelu:
geglu) and the experts' width ``intermediate_size`` (Qwen: ``moe_intermediate_size``),
``router_aux_loss_coef`` is ``router.aux_loss_coef``, ``norm_topk_prob`` (Mixtral: always) is
``router.norm_topk_prob``, Mixtral's ``router_jitter_noise`` is ``router.jitter``, Qwen2-MoE's
``shared_expert_intermediate_size`` is ``shared_hidden`` (its gate always there). Every router takes
a softmax over the experts in fp32 and then the top k, as zoo's does. ``output_router_logits`` is a
run-time flag of HF's forward, no part of the model: it is neither read nor written. The router's
z-loss, DeepSeek-V3's ``bias_update`` and a ``capacity_factor`` none of these classes has: a spec
with them is refused by name (:data:`~zoo.interop.hf.base.MOE_CLAIMS`).

Qwen2-MoE and Qwen3-MoE may have dense layers: layer i is MoE when it is not in ``mlp_only_layers``
and (i + 1) % ``decoder_sparse_step`` == 0; a dense layer is a gated FFN of the experts' activation,
``intermediate_size`` wide. zoo reads them as a layer pattern over the MoE block::

    block: {ffn: {kind: moe, ...}}
    layers: [{at: "0::2", block: {ffn: {kind: swiglu, hidden: 5632, bias: false}}}]

and writes any arrangement back as the largest ``decoder_sparse_step`` whose layers hold every MoE
layer, the rest of its layers in ``mlp_only_layers``.

On disk, checkpoints hold each expert apart (``mlp.experts.{e}.gate_proj.weight``, Mixtral's
``block_sparse_moe.experts.{e}.w1.weight``): :meth:`MoEDecoder.stored_in_parts` names them, so
``zoo convert`` reads and writes that layout one layer's experts at a time.
"""

from __future__ import annotations

from math import gcd
from typing import Any, ClassVar

from torch import nn

from zoo.interop.claims import check_claims
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import GATED, act_name, ffn_of, fused, require
from zoo.interop.hf.llama import Llama
from zoo.spec import FamilySpec
from zoo.spec.moe import MoESpec

__all__ = ["MoEDecoder", "at_of", "moe_layers", "sparse_fields"]


def moe_layers(n: int, step: int, mlp_only: list[int]) -> list[int]:
    """The MoE layers of ``n`` by Qwen-MoE's rule: not in ``mlp_only``, and (i + 1) % ``step`` == 0."""
    return [i for i in range(n) if i not in mlp_only and (i + 1) % step == 0]


def sparse_fields(moe: list[int], n: int) -> tuple[int, list[int]]:
    """(decoder_sparse_step, mlp_only_layers) that give the MoE layers ``moe`` of ``n``: the largest
    step whose layers hold them all, and that step's other layers."""
    step = 0
    for i in moe:
        step = gcd(step, i + 1)
    return step, [i for i in moe_layers(n, step, []) if i not in moe]


def at_of(layers: list[int], n: int) -> int | list[int] | str:
    """A layer pattern's ``at`` for ``layers`` of ``n``: a slice ("0::2", "3:") where they are one, else the list."""
    if len(layers) > 1:
        start, step = layers[0], layers[1] - layers[0]
        if layers == list(range(n))[start::step]:
            return f"{start}:" if step == 1 else f"{start}::{step}"
    return layers


class MoEDecoder(Llama):
    """A LLaMA-like decoder whose layers' ``mlp`` is a sparse MoE block (see the module docstring).
    The class attributes name what differs between the references; ``read`` and ``write`` (as
    :class:`Llama`'s) map their attention's own fields."""

    n_experts_field: ClassVar[str] = "num_experts"  # the config field of the expert count
    expert_field: ClassVar[str] = "intermediate_size"  # the config field of each expert's width
    router_fields: ClassVar[dict[str, str]] = {"norm_topk_prob": "norm_topk_prob"}  # router spec field -> config field
    shared: ClassVar[bool] = False  # a shared expert with its sigmoid gate (Qwen2-MoE)
    dense_layers: ClassVar[bool] = False  # decoder_sparse_step and mlp_only_layers pick dense layers (Qwen)
    on_disk: ClassVar[tuple[str, tuple[str, str, str]]] = ("mlp", ("gate_proj", "up_proj", "down_proj"))  # module, [gate, up, down]

    # ------------------------------------------------------------------ reference -> zoo
    @classmethod
    def moe_layers(cls, c: Any, where: str) -> list[int]:
        """The config's MoE layers (every layer, or Qwen's rule), checked."""
        n, n_experts = c.num_hidden_layers, getattr(c, cls.n_experts_field)
        require(n_experts > 0, where, cls.n_experts_field, n_experts,
                "a mixture of experts has at least one expert (a dense decoder converts to the dense class)")
        if not cls.dense_layers:
            return list(range(n))
        step, only = c.decoder_sparse_step, list(c.mlp_only_layers or ())
        require(isinstance(step, int) and step > 0, where, "decoder_sparse_step", step, "a layer step is a positive integer")
        layers = moe_layers(n, step, only)
        require(bool(layers), where, "mlp_only_layers" if only else "decoder_sparse_step", only or step,
                f"{cls.name} converts with at least one mixture-of-experts layer (a dense decoder converts to the dense class)")
        return layers

    @classmethod
    def ffn(cls, c: Any, where: str) -> dict:
        n_experts, top_k = getattr(c, cls.n_experts_field), c.num_experts_per_tok
        require(0 < top_k <= n_experts, where, "num_experts_per_tok", top_k,
                f"each token goes to between 1 and {cls.n_experts_field} ({n_experts}) experts")
        expert = {**ffn_of(GATED, getattr(c, cls.act_field), where, cls.act_field), "hidden": getattr(c, cls.expert_field), "bias": False}
        router = {"aux_loss_coef": c.router_aux_loss_coef, **{f: getattr(c, cfg) for f, cfg in cls.router_fields.items()}}
        moe = {"kind": "moe", "n_experts": n_experts, "top_k": top_k, "expert": expert, "router": router}
        if cls.shared:
            moe["shared_hidden"] = c.shared_expert_intermediate_size
        return moe

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        where = f"{cls.name} -> zoo"
        n, moe = c.num_hidden_layers, cls.moe_layers(c, where)
        s = super().spec(c, hf)
        dense = [i for i in range(n) if i not in moe]
        if dense:  # a gated FFN of the experts' activation, intermediate_size wide
            ffn = {**ffn_of(GATED, getattr(c, cls.act_field), where, cls.act_field), "hidden": c.intermediate_size, "bias": False}
            s["layers"] = [*s.get("layers", []), {"at": at_of(dense, n), "block": {"ffn": ffn}}]
        return s

    # ------------------------------------------------------------------ zoo -> reference
    @classmethod
    def ffn_config(cls, s: FamilySpec, where: str) -> dict:
        d, layers = s.d_model, [layer.block.ffn for layer in s.stack_layers()]
        moe = next((f for f in layers if isinstance(f, MoESpec)), None)
        if moe is None:
            raise unsupported(where, "layers" if s.layers else "block.ffn.kind", "no moe layer" if s.layers else s.block.ffn.kind,
                              f"none of the n_layers ({s.n_layers}) layers is a mixture of experts (ffn kind moe), which "
                              f"{cls.name} has; a dense decoder converts to a dense class")
        if moe != s.block.ffn:  # the MoE of a layer pattern: the same claims as the model's block
            check_claims(s.model_copy(update={"block": s.block.model_copy(update={"ffn": moe}), "layers": []}),
                         cls.claims, where, cls.name)
        c = {
            cls.act_field: act_name(moe.expert, cls.acts, where), cls.n_experts_field: moe.n_experts,
            "num_experts_per_tok": moe.top_k, cls.expert_field: moe.expert.hidden_size(d),
            "router_aux_loss_coef": moe.router.aux_loss_coef, **{cfg: getattr(moe.router, f) for f, cfg in cls.router_fields.items()},
        }
        if cls.shared:
            require(moe.shared_hidden is not None, where, "block.ffn.shared_hidden", None,
                    f"{cls.name}'s MoE blocks have a shared expert (shared_expert_intermediate_size)")
            c["shared_expert_intermediate_size"] = moe.shared_hidden
        dense = cls._dense(layers, moe, d, where)
        if cls.dense_layers:
            step, only = sparse_fields([i for i, f in enumerate(layers) if f == moe], len(layers))
            c.update(decoder_sparse_step=step, mlp_only_layers=only)
            if dense is not None:
                c["intermediate_size"] = dense
        return c

    @classmethod
    def _dense(cls, layers: list, moe: MoESpec, d: int, where: str) -> int | None:
        """The width of the dense layers (None: none), each checked to be what the config writes."""
        widths = set()
        for i, f in enumerate(layers):
            if isinstance(f, MoESpec):
                require(f == moe, where, "layers", f"layer {i}'s ffn", f"{cls.name} has one setting for all its MoE layers")
                continue
            if not cls.dense_layers:
                raise unsupported(where, "layers", f"layer {i}'s ffn", f"every {cls.name} layer is a mixture of experts")
            width = f.hidden_size(d)
            require(f.model_copy(update={"hidden": width}) == moe.expert.model_copy(update={"hidden": width}), where, "layers",
                    f"layer {i}'s ffn", f"{cls.name}'s dense layers are gated FFNs with its experts' activation "
                    f"({moe.expert.kind}) and no biases")
            widths.add(width)
        require(len(widths) <= 1, where, "layers", sorted(widths), f"{cls.name}'s dense layers share one intermediate_size")
        return widths.pop() if widths else None

    # ---------------------------------------------------------------------------- tensors
    @classmethod
    def ffn_rules(cls, ffn, z: str, h: str) -> list[Rule]:
        if not isinstance(ffn, MoESpec):
            return super().ffn_rules(ffn, z, h)
        m = f"{h}.mlp"
        rules = [rule(f"{z}.ffn.router.weight", f"{m}.gate.weight"), rule(f"{z}.ffn.w_gate_up", f"{m}.experts.gate_up_proj"),
                 rule(f"{z}.ffn.w_down", f"{m}.experts.down_proj")]
        if ffn.shared_hidden is not None:
            rules += [*fused(f"{z}.ffn.shared.fc1", [f"{m}.shared_expert.gate_proj", f"{m}.shared_expert.up_proj"], bias=False),
                      rule(f"{z}.ffn.shared.fc2.weight", f"{m}.shared_expert.down_proj.weight")]
            if ffn.shared_gate:
                rules.append(rule(f"{z}.ffn.shared_gate.weight", f"{m}.shared_expert_gate.weight"))
        return rules

    @classmethod
    def stored_in_parts(cls, config: Any) -> dict[str, tuple[str, ...]]:
        module, (gate, up, down) = cls.on_disk
        n_experts, out = getattr(config, cls.n_experts_field), {}
        for i in cls.moe_layers(config, f"{cls.name} -> zoo"):
            h = f"model.layers.{i}"
            experts = [f"{h}.{module}.experts.{e}" for e in range(n_experts)]
            out[f"{h}.mlp.experts.gate_up_proj"] = tuple(f"{x}.{p}.weight" for x in experts for p in (gate, up))
            out[f"{h}.mlp.experts.down_proj"] = tuple(f"{x}.{down}.weight" for x in experts)
        return out
