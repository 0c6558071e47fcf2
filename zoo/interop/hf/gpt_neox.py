"""GPT-NeoX (Pythia): ``GPTNeoXForCausalLM`` <-> a zoo decoder with LayerNorm, a two-layer FFN, partial
rotary positions (``position.fraction``, NeoX's ``rotary_pct``) and, by default, a parallel block
with a norm each for attention and FFN (``block.parallel``, NeoX's ``use_parallel_residual``).
``GPTNeoXModel``, its backbone, converts to the same without a head.

NeoX fuses q, k and v head by head (rows [q_0 k_0 v_0 q_1 k_1 v_1 ...]); zoo's fused ``qkv`` is
[q | k | v], so the converter reorders those rows both ways.
"""

from __future__ import annotations

from torch import Tensor

from zoo.interop.claims import one_of
from zoo.interop.common import Rule, rule
from zoo.interop.hf.base import Architecture, weights
from zoo.interop.hf.table import Derived, Field, Fixed, Tokens, table
from zoo.interop.hf.traits import decoder, hidden_dropout, layernorm, mha, one_bias, rope, two_layer_ffn
from zoo.spec import FamilySpec

__all__ = ["GPTNeoX"]


def _qkv(i: int, p: str) -> tuple[str, str]:
    return f"stack.blocks.{i}.attn.qkv.{p}", f"gpt_neox.layers.{i}.attention.query_key_value.{p}"


def _regroup(t: Tensor, first: int, second: int) -> Tensor:
    """Rows grouped [first, second, K] -> [second, first, K] (the rest of the dimensions kept)."""
    return t.reshape(first, second, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


class GPTNeoX(Architecture):
    name = "GPTNeoXForCausalLM"
    base = "GPTNeoXModel"
    prefix = "gpt_neox"
    config_name = "GPTNeoXConfig"
    model_type = "gpt_neox"
    tie = ("lm_head", "gpt_neox.embed_in")
    table = table(
        decoder(), rope(partial=True), mha(), one_bias(),
        two_layer_ffn({("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("relu", "none"): "relu", ("silu", "none"): "silu"}),
        Fixed("block.ffn.bias", True), layernorm(),
        Derived("block", lambda c, where: {"block.kind": "parallel" if c.use_parallel_residual else "pre"},
                lambda s, where: {"use_parallel_residual": s.block.kind == "parallel"},
                {"block.kind": one_of("pre", "parallel"), "block.shared_norm": one_of(False)}),
        hidden_dropout(),
        Field("attention_dropout", "dropout.attention"),
        Tokens({"bos_token_id": 0, "eos_token_id": 2}),
    )

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        ab = s.block.attention.bias
        rules = [rule("tok_emb.weight", "gpt_neox.embed_in.weight")]
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"gpt_neox.layers.{i}"
            rules += [
                *weights(f"{z}.attn_norm", f"{h}.input_layernorm"),
                *weights(f"{z}.attn.qkv", f"{h}.attention.query_key_value", bias=ab),  # rows regrouped by prepare_*
                *weights(f"{z}.attn.out", f"{h}.attention.dense", bias=ab),
                *weights(f"{z}.ffn_norm", f"{h}.post_attention_layernorm"),
                *weights(f"{z}.ffn.fc1", f"{h}.mlp.dense_h_to_4h"),
                *weights(f"{z}.ffn.fc2", f"{h}.mlp.dense_4h_to_h"),
            ]
        return rules + [*weights("stack.norm", "gpt_neox.final_layer_norm"), rule("head.weight", "lm_head.weight")]

    @staticmethod
    def prepare_from(ref: dict[str, Tensor], s: FamilySpec) -> dict[str, Tensor]:
        """NeoX's head-by-head [q_h k_h v_h] rows as zoo's [q | k | v]."""
        out, H = dict(ref), s.block.attention.n_heads
        for i in range(s.n_layers):
            for p in ("weight", "bias"):
                _, name = _qkv(i, p)
                if name in out:
                    out[name] = _regroup(out[name], H, 3)
        return out

    @staticmethod
    def prepare_to(state: dict[str, Tensor], s: FamilySpec) -> dict[str, Tensor]:
        """zoo's [q | k | v] rows as NeoX's head-by-head [q_h k_h v_h]."""
        out, H = dict(state), s.block.attention.n_heads
        for i in range(s.n_layers):
            for p in ("weight", "bias"):
                name, _ = _qkv(i, p)
                if name in out:
                    out[name] = _regroup(out[name], 3, H)
        return out
