"""Llama 4's text model: ``Llama4ForCausalLM`` (and its backbone ``Llama4TextModel``; config
``Llama4TextConfig``, model_type ``llama4_text``) <-> a zoo decoder laid out as LLaMA with interleaved
rope (``position.pairs: interleaved``, llama3 scaling by ``rope_parameters``), whose layers are of
two kinds by ``no_rope_layers`` (1: rope, 0: none):

* rope layers: chunked local attention (``layer_types`` chunked_attention: ``attention.chunk``, the
  ``attention_chunk_size``) and, with ``use_qk_norm``, a weightless RMS norm of each query and key
  head (``qk_norm: {kind: rmsnorm, affine: false}``, eps ``rms_norm_eps``);
* NoPE layers: attention to every earlier token without positions (a layer pattern with
  ``position: {kind: none}``) and, with ``attn_temperature_tuning``, each query scaled by
  ``1 + attn_scale * log(1 + floor((slot + 1) / floor_scale))`` (``attention.temperature``).

The FFN of the layers in ``moe_layers`` (by default every ``interleave_moe_layer_step``-th) is
Llama 4's MoE (``Llama4TextMoe``): a router picking the top ``num_experts_per_tok`` of
``num_local_experts`` experts by their logits, each weighted by the sigmoid of its logit
(``router.sigmoid_after_topk``), the weight multiplying the expert's input (``weight_input``), plus
a shared expert as wide as the experts without a gate; the other layers are dense gated FFNs
``intermediate_size_mlp`` wide::

    block: {attention: {chunk: 8192, qk_norm: {kind: rmsnorm, affine: false, eps: 1.0e-5}, ...},
            ffn: {kind: moe, n_experts: 16, top_k: 1, expert: {kind: swiglu, hidden: 8192},
                  router: {sigmoid_after_topk: true}, shared_hidden: 8192, shared_gate: false,
                  weight_input: true}}
    layers: [{at: "3::4", position: {kind: none},
              block: {attention: {chunk: null, qk_norm: null, temperature: {floor: 8192, scale: 0.1}}}}]

Tensors: ``feed_forward.router.weight`` is the router; ``feed_forward.experts.gate_up_proj``
[E, D, 2F] and ``down_proj`` [E, F, D] are zoo's ``w_gate_up`` and ``w_down`` transposed per expert;
``feed_forward.shared_expert.*`` the shared expert, ``feed_forward.{gate,up,down}_proj`` a dense
layer's FFN. ``router_jitter_noise`` and ``output_router_logits`` are read by no part of HF's
text model: they are neither read nor written. Back to HF, zoo writes ``no_rope_layers``,
``layer_types`` and ``moe_layers`` from the layers, and refuses (naming the field) any layer that
the config's fields would not rebuild exactly.

The Hub's Llama 4 checkpoints (Scout, Maverick) are multimodal: ``Llama4ForConditionalGeneration``
(config ``Llama4Config``, model_type ``llama4``, with ``text_config`` and ``vision_config``) holds
this text model as ``language_model`` (``language_model.model.*``, ``language_model.lm_head.*``)
beside a vision tower (``vision_model.*``) and a projector (``multi_modal_projector.*``), which
zoo does not convert. Such a model or folder is refused unless the text model's class is named:
``from_hf(model, architecture="Llama4ForCausalLM")`` (or ``from_hf(model.language_model)``) and
``convert(folder, dst, architecture="Llama4ForCausalLM")`` (``zoo convert --architecture
Llama4ForCausalLM``) read ``text_config`` and the ``language_model.*`` tensors, and list the vision
tower's and projector's tensors in ``ignored``. The text model computes, on text alone, the logits
the multimodal model computes (it embeds the tokens and runs its ``language_model``). Converted
back, it is a ``Llama4ForCausalLM`` (model_type ``llama4_text``), not the multimodal class.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from zoo.interop.claims import ANY
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import GATED, act_name, ffn_of, fused, require, weights
from zoo.interop.hf.gemma2 import layer_at
from zoo.interop.hf.llama import LLAMA_ACTS, Llama
from zoo.interop.hf.table import Derived, Field, Fixed, Tokens, table
from zoo.interop.hf.traits import decoder, heads, one_bias, rope
from zoo.spec import FamilySpec
from zoo.spec.moe import MoESpec

__all__ = ["Llama4"]

CHUNKED, FULL = "chunked_attention", "full_attention"


def _kinds(c: Any, where: str) -> list[tuple[bool, bool, bool]]:
    """Each layer's (rope, chunked, moe), checked."""
    n = c.num_hidden_layers
    flags = list(c.no_rope_layers)
    if len(flags) < n:
        raise unsupported(where, "no_rope_layers", flags, f"it needs a 1 (rope) or 0 (none) for each of the {n} layers")
    types = list(c.layer_types)
    if len(types) < n or set(types[:n]) - {CHUNKED, FULL}:
        raise unsupported(where, "layer_types", types, f"Llama 4 reads {CHUNKED} and {FULL} for each of the {n} layers")
    if CHUNKED in types[:n] and not c.attention_chunk_size:
        raise unsupported(where, "attention_chunk_size", c.attention_chunk_size, f"{CHUNKED} layers need a chunk size")
    moe = set(c.moe_layers)
    return [(bool(flags[i]), types[i] == CHUNKED, i in moe) for i in range(n)]


def _layer(c: Any, where: str, rope_, chunked: bool, moe: bool) -> tuple[dict, dict]:
    """(attention changes, ffn) of one layer kind."""
    act = ffn_of(GATED, c.hidden_act, where, "hidden_act")
    qk = {"kind": "rmsnorm", "affine": False, "eps": c.rms_norm_eps} if c.use_qk_norm and rope_ else None
    temperature = ({"floor": c.floor_scale, "scale": c.attn_scale} if c.attn_temperature_tuning and not rope_ else None)
    attention = {"qk_norm": qk, "chunk": c.attention_chunk_size if chunked else None, "temperature": temperature}
    if moe:
        require(0 < c.num_experts_per_tok <= c.num_local_experts, where, "num_experts_per_tok", c.num_experts_per_tok,
                f"each token goes to between 1 and num_local_experts ({c.num_local_experts}) experts")
        ffn = {"kind": "moe", "n_experts": c.num_local_experts, "top_k": c.num_experts_per_tok,
               "expert": {**act, "hidden": c.intermediate_size, "bias": False},
               "router": {"sigmoid_after_topk": True, "aux_loss_coef": c.router_aux_loss_coef},
               "shared_hidden": c.intermediate_size, "shared_gate": False, "weight_input": True}
    else:
        ffn = {**act, "hidden": c.intermediate_size_mlp, "bias": False}
    return attention, ffn


def _read(c: Any, where: str) -> dict:
    kinds = _kinds(c, where)
    n = len(kinds)
    pool = [k for k in kinds if k[0]]  # the model's block: the commonest kind of the rope layers
    require(bool(pool), where, "no_rope_layers", list(c.no_rope_layers)[:n], "zoo reads a Llama 4 with at least one "
            "rope layer (a 1), whose rope is the model's position")
    base = max(dict.fromkeys(pool), key=pool.count)
    attention, ffn = _layer(c, where, *base)
    out: dict = {**{f"block.attention.{k}": v for k, v in attention.items()}, "block.ffn": ffn}
    patterns = []
    for kind in dict.fromkeys(kinds):
        if kind == base:
            continue
        at = layer_at([i for i, k in enumerate(kinds) if k == kind], n)
        a, f = _layer(c, where, *kind)
        block = {k: v for k, v in (("attention", {k: v for k, v in a.items() if v != attention[k]}),
                                   ("ffn", f if f != ffn else None)) if v}
        pattern: dict = {"at": at, "block": block} if block else {"at": at}
        if not kind[0]:  # rope is the model's position; a NoPE layer has none
            pattern["position"] = {"kind": "none"}
        patterns.append(pattern)
    if patterns:
        out["layers"] = patterns
    return out


def _step(layers: list[int], n: int) -> int | None:
    """The ``interleave_moe_layer_step`` whose layers are ``layers`` of ``n``, or None."""
    return next((s for s in range(1, n + 1) if list(range(s - 1, n, s)) == layers), None)


def _first_difference(a: Any, b: Any, path: str) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in dict.fromkeys([*a, *b]):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}")
    return path


def _write(s: FamilySpec, where: str) -> dict:
    layers = s.stack_layers()
    n, norm_eps = len(layers), s.block.norm.eps
    rope_flags, chunks, temps, qks, moes, dense = [], set(), set(), set(), [], set()
    for i, layer in enumerate(layers):
        a, position = layer.block.attention, layer.position or s.position
        require(position == s.position or position.kind == "none", where, "layers",
                f"layer {i}'s position {position.model_dump(mode='json')}", "Llama 4's layers have the model's rope or none "
                "(no_rope_layers)")
        rope_flags.append(int(position.kind != "none"))
        chunks.add(a.chunk)
        if a.temperature is not None:
            temps.add((a.temperature.floor, a.temperature.scale))
        if a.qk_norm is not None:
            qks.add(a.qk_norm.eps)
        if isinstance(layer.block.ffn, MoESpec):
            moes.append(i)
        else:
            dense.add(layer.block.ffn.hidden_size(s.d_model))
    sizes = sorted(c for c in chunks if c is not None)
    require(len(sizes) <= 1, where, "block.attention.chunk", sizes, "Llama 4 has one attention_chunk_size")
    require(len(temps) <= 1, where, "block.attention.temperature", sorted(temps),
            "Llama 4 has one floor_scale and attn_scale for its NoPE layers")
    require(bool(moes), where, "block.ffn.kind", s.block.ffn.kind, "Llama 4's layers in moe_layers are mixtures of "
            "experts; at least one is (ffn kind moe)")
    require(len(dense) <= 1, where, "layers", sorted(dense), "Llama 4's dense layers share one intermediate_size_mlp")
    moe = layers[moes[0]].block.ffn
    tuning = bool(temps)
    floor, scale = temps.pop() if temps else (8192, 0.1)
    c = {"hidden_act": act_name(moe.expert, LLAMA_ACTS, where), "num_local_experts": moe.n_experts,
         "num_experts_per_tok": moe.top_k, "intermediate_size": moe.expert.hidden_size(s.d_model),
         "intermediate_size_mlp": dense.pop() if dense else 16384, "router_aux_loss_coef": moe.router.aux_loss_coef,
         "moe_layers": moes, "interleave_moe_layer_step": _step(moes, n) or 1,
         "no_rope_layers": rope_flags, "attention_chunk_size": sizes[0] if sizes else None,
         "layer_types": [CHUNKED if layer.block.attention.chunk else FULL for layer in layers],
         "use_qk_norm": bool(qks), "attn_temperature_tuning": tuning, "floor_scale": floor, "attn_scale": scale}
    # every layer as these fields rebuild it, else refused by the first field that differs
    view = SimpleNamespace(**c, num_hidden_layers=n, rms_norm_eps=norm_eps)
    for i, layer in enumerate(layers):
        a, f = _layer(view, where, bool(rope_flags[i]), layer.block.attention.chunk is not None, i in moes)
        base = s.block.model_dump(mode="json")  # the config's one setting of everything else
        rebuilt = type(s.block).model_validate({**base, "attention": {**base["attention"], **a}, "ffn": f})
        if rebuilt != layer.block:
            got, wanted = layer.block.model_dump(mode="json"), rebuilt.model_dump(mode="json")
            path = _first_difference(got, wanted, "block")
            raise unsupported(where, path, f"layer {i}: {_at(got, path)}", f"Llama 4's layer {i} has {_at(wanted, path)} "
                              "(its config rebuilds each layer from no_rope_layers, layer_types, moe_layers, use_qk_norm, "
                              "attn_temperature_tuning and the expert sizes)")
    return c


def _at(d: Any, path: str) -> Any:
    for part in path.split(".")[1:]:
        d = d.get(part) if isinstance(d, dict) else None
    return d


LLAMA4 = table(
    decoder(), rope(), heads(),
    Fixed("position.pairs", "interleaved", why="rope turning the interleaved pairs (2i, 2i + 1) (pairs: interleaved)"),
    Fixed("block.norm.kind", "rmsnorm", why="RMSNorm (rmsnorm)"), Field("rms_norm_eps", "block.norm.eps"),
    Fixed("block.kind", "pre", why="norms before each sub-layer (pre)"),
    one_bias(),
    Field("attention_dropout", "dropout.attention"),
    Derived("layers", _read, _write, {"block.attention.qk_norm": ANY, "block.attention.chunk": ANY,
                                      "block.attention.temperature": ANY, "block.ffn": ANY, "layers": ANY}),
    Tokens({"bos_token_id": 1, "eos_token_id": 2}),
)


class Llama4(Llama):
    name = "Llama4ForCausalLM"
    config_name = "Llama4TextConfig"
    model_type = "llama4_text"
    base = "Llama4TextModel"
    table = LLAMA4

    @classmethod
    def ffn_rules(cls, ffn, z: str, h: str) -> list[Rule]:
        m = f"{h}.feed_forward"
        if not isinstance(ffn, MoESpec):
            return [*fused(f"{z}.ffn.fc1", [f"{m}.gate_proj", f"{m}.up_proj"], bias=False),
                    *weights(f"{z}.ffn.fc2", f"{m}.down_proj", bias=False)]
        return [rule(f"{z}.ffn.router.weight", f"{m}.router.weight"),
                rule(f"{z}.ffn.w_gate_up", f"{m}.experts.gate_up_proj", transpose=True),
                rule(f"{z}.ffn.w_down", f"{m}.experts.down_proj", transpose=True),
                *fused(f"{z}.ffn.shared.fc1", [f"{m}.shared_expert.gate_proj", f"{m}.shared_expert.up_proj"], bias=False),
                rule(f"{z}.ffn.shared.fc2.weight", f"{m}.shared_expert.down_proj.weight")]
