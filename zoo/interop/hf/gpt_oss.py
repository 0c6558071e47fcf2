"""gpt-oss: ``GptOssForCausalLM`` <-> a zoo decoder laid out as LLaMA (:class:`~zoo.interop.hf.moe.MoEDecoder`)
with gpt-oss's own parts:

- attention sinks: a learned logit per head that joins each query's softmax denominator
  (``block.attention.sinks: true``; ``self_attn.sinks`` [H] <-> ``attn.sinks``), biases on the four
  projections, its own ``head_dim``;
- local and global layers by ``layer_types`` (the sliding layers the model's block with
  ``sliding_window``, the full ones a layer pattern: :func:`~zoo.interop.hf.gemma2.layer_types`), a
  yarn rope (``truncate: false``);
- every FFN a mixture of ``num_local_experts`` experts, ``num_experts_per_tok`` per token, the
  router's top k of its logits then a softmax over those (``router.softmax_before_topk: false``), a
  bias on the router (``router.bias``), biases on the experts (``expert.bias``) and the clamped
  SwiGLU ``(up + 1) * g * sigmoid(swiglu_alpha * g)`` with the gate clamped above at ``swiglu_limit``
  and up into [-limit, limit] (``expert.limit``, ``alpha``, ``up_offset: 1``)::

    mlp.router.{weight, bias}           [E, D], [E]      <-> ffn.router.{weight, bias}
    mlp.experts.gate_up_proj            [E, D, 2F]       <-> ffn.w_gate_up [E, 2F, D]
    mlp.experts.gate_up_proj_bias       [E, 2F]          <-> ffn.b_gate_up
    mlp.experts.down_proj               [E, F, D]        <-> ffn.w_down [E, D, F]
    mlp.experts.down_proj_bias          [E, D]           <-> ffn.b_down

HF's [gate, up] columns alternate (gate = ``[..., ::2]``, up = ``[..., 1::2]``) and its expert
weights are stored input-major; zoo's are stacked [gate | up] rows of linear weights, so the
experts' tensors are regrouped and transposed both ways (exact permutations). ``hidden_act`` is not
read by HF's experts: zoo writes silu and reads no other value.

The released checkpoints (gpt-oss-20b, -120b) store the experts' two matrices in MXFP4
(``gate_up_proj_blocks`` / ``_scales``, ``down_proj_blocks`` / ``_scales``; ``quantization_config:
{quant_method: mxfp4}``): a folder so converts (:func:`zoo.interop.convert`, streamed) by
dequantizing them to the load dtype as transformers does, bit for bit (:mod:`zoo.interop.hf.mxfp4`);
an HF model loaded from it converts when loaded dequantized (``Mxfp4Config(dequantize=True)``), not
while its experts are packed in memory. Converted back, zoo writes the ordinary dequantized
tensors, and ``config.json`` has no ``quantization_config``: the folder is gpt-oss's checkpoint
unquantized (about four times the experts' size in bf16), not the release's layout.

Exactness: in fp32 the logits equal HF's to 1e-4. In bf16 (the release's dtype) the dequantized
weights are HF's bit for bit and each token takes the experts HF's router picks from the same
logits (the top k of the logits, compared in fp32 without rounding), but the logits agree only to
bf16's rounding: HF weighs the experts in the model dtype (the softmax over the top k rounded to
bf16, each weighted output rounded before the sum), zoo in fp32.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from zoo.interop.claims import ANY, one_of
from zoo.interop.common import Rule, rule
from zoo.interop.hf.base import require
from zoo.interop.hf.gemma2 import layer_types
from zoo.interop.hf.llama import LLAMA
from zoo.interop.hf.moe import MoEDecoder, MoEFields, moe_ffn
from zoo.interop.hf.table import Claim, Derived, Fixed, Tensors, Tokens, table
from zoo.spec import FamilySpec
from zoo.spec.moe import MoESpec

__all__ = ["GptOss"]


def _read_experts(c: Any, where: str) -> dict:
    require(c.hidden_act == "silu", where, "hidden_act", c.hidden_act,
            "gpt-oss's experts compute their clamped SwiGLU whatever hidden_act says; zoo reads silu only")
    return {"block.ffn.expert.bias": True, "block.ffn.expert.limit": c.swiglu_limit,
            "block.ffn.expert.alpha": c.swiglu_alpha, "block.ffn.expert.up_offset": 1.0}


def _write_experts(s: FamilySpec, where: str) -> dict:
    expert = next(x.block.ffn for x in s.stack_layers() if isinstance(x.block.ffn, MoESpec)).expert
    require(expert.kind == "swiglu" and expert.limit is not None, where, "block.ffn.expert.limit", getattr(expert, "limit", None),
            "gpt-oss's experts clamp their SwiGLU (swiglu_limit)")
    return {"swiglu_limit": expert.limit, "swiglu_alpha": expert.alpha}


_EXPERTS = Derived("experts", _read_experts, _write_experts,
                   {"block.ffn.expert.bias": one_of(True), "block.ffn.expert.limit": ANY, "block.ffn.expert.alpha": ANY,
                    "block.ffn.expert.up_offset": one_of(1.0), "block.ffn.expert.kind": one_of("swiglu")})


def _sinks(s: FamilySpec, z: str, h: str) -> list[Rule]:
    return [rule(f"{z}.attn.sinks", f"{h}.self_attn.sinks")]


# HF's interleaved [gate, up] columns <-> zoo's [gate | up] rows; the experts' weights transposed
def _from_hf(name: str, t: Tensor) -> Tensor:
    if name.endswith("mlp.experts.gate_up_proj"):  # [E, D, 2F] -> zoo's [E, 2F, D], in HF's shape
        return torch.cat([t[..., ::2], t[..., 1::2]], dim=-1).transpose(1, 2).contiguous().reshape(t.shape)
    if name.endswith("mlp.experts.gate_up_proj_bias"):  # [E, 2F]
        return torch.cat([t[..., ::2], t[..., 1::2]], dim=-1)
    if name.endswith("mlp.experts.down_proj"):  # [E, F, D] -> zoo's [E, D, F], in HF's shape
        return t.transpose(1, 2).contiguous().reshape(t.shape)
    return t


def _to_hf(name: str, t: Tensor) -> Tensor:
    if name.endswith("ffn.w_gate_up"):  # [E, 2F, D] -> HF's [E, D, 2F], in zoo's shape
        e, f2, d = t.shape
        inter = torch.stack(t.chunk(2, dim=1), dim=2).reshape(e, f2, d)  # rows gate0, up0, gate1, up1, ...
        return inter.transpose(1, 2).contiguous().reshape(t.shape)
    if name.endswith("ffn.b_gate_up"):  # [E, 2F]
        return torch.stack(t.chunk(2, dim=-1), dim=-1).reshape(t.shape)
    if name.endswith("ffn.w_down"):  # [E, D, F] -> HF's [E, F, D], in zoo's shape
        return t.transpose(1, 2).contiguous().reshape(t.shape)
    return t


class GptOss(MoEDecoder):
    name = "GptOssForCausalLM"
    config_name = "GptOssConfig"
    model_type = "gpt_oss"
    base = "GptOssModel"
    moe = MoEFields(n_experts="num_local_experts", router={}, fixed_router={"softmax_before_topk": False, "bias": True})
    table = table(LLAMA, layer_types(), Fixed("block.attention.sinks", True, why="attention sinks (sinks: true)"),
                  Tensors("sinks", _sinks), Tokens({}), moe_ffn(moe), _EXPERTS,
                  Claim("block.ffn.router.norm_topk_prob", one_of(True)))

    @classmethod
    def ffn_rules(cls, ffn, z: str, h: str) -> list[Rule]:
        m = f"{h}.mlp"
        return [rule(f"{z}.ffn.router.weight", f"{m}.router.weight"), rule(f"{z}.ffn.router.bias", f"{m}.router.bias"),
                rule(f"{z}.ffn.w_gate_up", f"{m}.experts.gate_up_proj"),
                rule(f"{z}.ffn.b_gate_up", f"{m}.experts.gate_up_proj_bias"),
                rule(f"{z}.ffn.w_down", f"{m}.experts.down_proj"), rule(f"{z}.ffn.b_down", f"{m}.experts.down_proj_bias")]

    @staticmethod
    def prepare_from(ref: dict[str, Tensor], s: FamilySpec) -> dict[str, Tensor]:
        return {name: _from_hf(name, t) for name, t in ref.items()}

    @staticmethod
    def prepare_to(state: dict[str, Tensor], s: FamilySpec) -> dict[str, Tensor]:
        return {name: _to_hf(name, t) for name, t in state.items()}

    @classmethod
    def stored_in_parts(cls, config: Any) -> dict[str, tuple[str, ...]]:
        return {}  # checkpoints hold each layer's experts stacked, as the module does
