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

Each class states its MoE fields in a :class:`MoEFields`, whose :func:`moe_ffn` entries replace
LLaMA's MLP in its table (:mod:`zoo.interop.hf.table`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from math import gcd
from typing import Any, ClassVar

from zoo.interop.claims import ANY, check_claims, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import GATED, MOE_CLAIMS, act_name, ffn_of, fused, require
from zoo.interop.hf.llama import LLAMA_ACTS, Llama
from zoo.interop.hf.table import Claim, Derived, Drop
from zoo.interop.hf.traits import who
from zoo.spec import FamilySpec
from zoo.spec.moe import MoESpec

__all__ = ["MoEDecoder", "MoEFields", "at_of", "moe_ffn", "moe_layers", "sparse_fields"]


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


@dataclass(frozen=True)
class MoEFields:
    """What a reference's MoE config names: the expert count ``n_experts``, each expert's width
    ``expert``, the router's fields {router spec field: config field} and those it always has
    (``fixed_router``), a shared expert with its sigmoid gate (Qwen2-MoE), dense layers by
    ``decoder_sparse_step`` and ``mlp_only_layers`` (Qwen), and the checkpoints' names of each
    expert's module and [gate, up, down] projections (``on_disk``)."""

    n_experts: str = "num_experts"
    expert: str = "intermediate_size"
    router: Mapping[str, str] = field(default_factory=lambda: {"norm_topk_prob": "norm_topk_prob"})
    fixed_router: Mapping[str, Any] = field(default_factory=dict)
    shared: bool = False
    dense_layers: bool = False
    on_disk: tuple[str, tuple[str, str, str]] = ("mlp", ("gate_proj", "up_proj", "down_proj"))

    def layers(self, c: Any, where: str) -> list[int]:
        """The config's MoE layers (every layer, or Qwen's rule), checked."""
        n, n_experts = c.num_hidden_layers, getattr(c, self.n_experts)
        require(n_experts > 0, where, self.n_experts, n_experts,
                "a mixture of experts has at least one expert (a dense decoder converts to the dense class)")
        if not self.dense_layers:
            return list(range(n))
        step, only = c.decoder_sparse_step, list(c.mlp_only_layers or ())
        require(isinstance(step, int) and step > 0, where, "decoder_sparse_step", step, "a layer step is a positive integer")
        layers = moe_layers(n, step, only)
        require(bool(layers), where, "mlp_only_layers" if only else "decoder_sparse_step", only or step,
                f"{who(where)} converts with at least one mixture-of-experts layer (a dense decoder converts to the dense class)")
        return layers


def moe_ffn(f: MoEFields) -> tuple:
    """The table entries of an MoE decoder's FFN: the MoE block (LLaMA's MLP entry replaced), with
    the dense layers a pattern over it (read last, after the other layer patterns)."""

    def read(c: Any, where: str) -> dict:
        f.layers(c, where)  # the expert count and the MoE layers, checked first
        n_experts, top_k = getattr(c, f.n_experts), c.num_experts_per_tok
        require(0 < top_k <= n_experts, where, "num_experts_per_tok", top_k,
                f"each token goes to between 1 and {f.n_experts} ({n_experts}) experts")
        expert = {**ffn_of(GATED, c.hidden_act, where, "hidden_act"), "hidden": getattr(c, f.expert), "bias": False}
        router = {"aux_loss_coef": c.router_aux_loss_coef, **{k: getattr(c, cfg) for k, cfg in f.router.items()}, **f.fixed_router}
        moe = {"kind": "moe", "n_experts": n_experts, "top_k": top_k, "expert": expert, "router": router}
        if f.shared:
            moe["shared_hidden"] = c.shared_expert_intermediate_size
        return {"block.ffn": moe}

    def read_dense(c: Any, where: str) -> dict:
        n, moe = c.num_hidden_layers, f.layers(c, where)
        dense = [i for i in range(n) if i not in moe]
        if not dense:
            return {}
        ffn = {**ffn_of(GATED, c.hidden_act, where, "hidden_act"), "hidden": c.intermediate_size, "bias": False}
        return {"layers": [{"at": at_of(dense, n), "block": {"ffn": ffn}}]}

    def write(s: FamilySpec, where: str) -> dict:
        d, layers = s.d_model, [layer.block.ffn for layer in s.stack_layers()]
        moe = next(x for x in layers if isinstance(x, MoESpec))  # MoEDecoder.config refused a model without
        c = {"hidden_act": act_name(moe.expert, LLAMA_ACTS, where), f.n_experts: moe.n_experts,
             "num_experts_per_tok": moe.top_k, f.expert: moe.expert.hidden_size(d),
             "router_aux_loss_coef": moe.router.aux_loss_coef, **{cfg: getattr(moe.router, k) for k, cfg in f.router.items()}}
        if f.shared:
            require(moe.shared_hidden is not None, where, "block.ffn.shared_hidden", None,
                    f"{who(where)}'s MoE blocks have a shared expert (shared_expert_intermediate_size)")
            c["shared_expert_intermediate_size"] = moe.shared_hidden
        dense = _dense(f, layers, moe, d, where)
        if f.dense_layers:
            step, only = sparse_fields([i for i, x in enumerate(layers) if x == moe], len(layers))
            c.update(decoder_sparse_step=step, mlp_only_layers=only)
            if dense is not None:
                c["intermediate_size"] = dense
        return c

    claims: dict = {**MOE_CLAIMS, **{f"block.ffn.router.{k}": ANY for k in f.router},
                    **{f"block.ffn.router.{k}": one_of(v) for k, v in f.fixed_router.items()}}
    if f.shared:
        claims |= {"block.ffn.shared_hidden": ANY, "block.ffn.shared_gate": one_of(True)}
    if f.dense_layers:  # the model's block may be dense with MoE layers in a pattern, or the other way round
        claims |= {"block.ffn.kind": one_of("moe", "swiglu", "geglu"), "block.ffn.hidden": ANY, "block.ffn.approximate": ANY,
                   "layers": ANY}
    dense_bias = (Claim("block.ffn.bias", one_of(False)),) if f.dense_layers else ()
    return (Derived("ffn", read, write, claims), Drop("block.ffn.bias"), *dense_bias,
            Derived("dense layers", read_dense, lambda s, where: {}))


def _dense(f: MoEFields, layers: list, moe: MoESpec, d: int, where: str) -> int | None:
    """The width of the dense layers (None: none), each checked to be what the config writes."""
    name, widths = who(where), set()
    for i, x in enumerate(layers):
        if isinstance(x, MoESpec):
            require(x == moe, where, "layers", f"layer {i}'s ffn", f"{name} has one setting for all its MoE layers")
            continue
        if not f.dense_layers:
            raise unsupported(where, "layers", f"layer {i}'s ffn", f"every {name} layer is a mixture of experts")
        width = x.hidden_size(d)
        require(x.model_copy(update={"hidden": width}) == moe.expert.model_copy(update={"hidden": width}), where, "layers",
                f"layer {i}'s ffn", f"{name}'s dense layers are gated FFNs with its experts' activation "
                f"({moe.expert.kind}) and no biases")
        widths.add(width)
    require(len(widths) <= 1, where, "layers", sorted(widths), f"{name}'s dense layers share one intermediate_size")
    return widths.pop() if widths else None


class MoEDecoder(Llama):
    """A LLaMA-like decoder whose layers' ``mlp`` is a sparse MoE block (see the module docstring),
    its fields named by ``moe`` (a :class:`MoEFields`, whose :func:`moe_ffn` its table holds)."""

    moe: ClassVar[MoEFields] = MoEFields()

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = f"zoo -> {cls.name}"
        moe = next((x.block.ffn for x in s.stack_layers() if isinstance(x.block.ffn, MoESpec)), None)
        if moe is None:
            raise unsupported(where, "layers" if s.layers else "block.ffn.kind", "no moe layer" if s.layers else s.block.ffn.kind,
                              f"none of the n_layers ({s.n_layers}) layers is a mixture of experts (ffn kind moe), which "
                              f"{cls.name} has; a dense decoder converts to a dense class")
        if moe != s.block.ffn:  # the MoE of a layer pattern: the same claims as the model's block
            check_claims(s.model_copy(update={"block": s.block.model_copy(update={"ffn": moe}), "layers": []}),
                         cls.claims, where, cls.name)
        return super().config(s, given)

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
        module, (gate, up, down) = cls.moe.on_disk
        n_experts, out = getattr(config, cls.moe.n_experts), {}
        for i in cls.moe.layers(config, f"{cls.name} -> zoo"):
            h = f"model.layers.{i}"
            experts = [f"{h}.{module}.experts.{e}" for e in range(n_experts)]
            out[f"{h}.mlp.experts.gate_up_proj"] = tuple(f"{x}.{p}.weight" for x in experts for p in (gate, up))
            out[f"{h}.mlp.experts.down_proj"] = tuple(f"{x}.{down}.weight" for x in experts)
        return out
