"""GPT-NeoX (Pythia): ``GPTNeoXForCausalLM`` <-> a zoo decoder with LayerNorm, a two-layer FFN, partial
rotary positions (``position.fraction``, NeoX's ``rotary_pct``) and, by default, a parallel block
with a norm each for attention and FFN (``block.parallel``, NeoX's ``use_parallel_residual``).
``GPTNeoXModel``, its backbone, converts to the same without a head.

NeoX fuses q, k and v head by head (rows [q_0 k_0 v_0 q_1 k_1 v_1 ...]); zoo's fused ``qkv`` is
[q | k | v], so the converter reorders those rows both ways.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule
from zoo.interop.hf.base import (
    BUILTIN_ATTENTION,
    TEXT_CLAIMS,
    TWO_LAYER,
    Architecture,
    act_name,
    ffn_of,
    layernorm,
    require,
    token_ids,
    weights,
)
from zoo.interop.hf.rope import read_rope, write_rope
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
    acts: ClassVar[dict[tuple[str, str], str]] = {  # (zoo FFN kind, approximate) -> HF activation
        ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("relu", "none"): "relu", ("silu", "none"): "silu",
    }
    claims: ClassVar[Claims] = {
        **TEXT_CLAIMS, "position.kind": one_of("rope"), "position.base": ANY, "position.fraction": ANY,
        "position.scaling": ANY,
        "block.kind": one_of("pre", "parallel"), "block.shared_norm": one_of(False), "block.norm.kind": one_of("layernorm"),
        "block.norm.bias": one_of(True), "block.attention.out_bias": ANY, "dropout.embedding": ANY,
        "dropout.residual": ANY, "dropout.attention": ANY,
    }

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        where = f"{cls.name} -> zoo"
        tied = c.tie_word_embeddings if hf is None else hf.lm_head.weight is hf.gpt_neox.embed_in.weight
        return {
            "family": "decoder", "vocab_size": c.vocab_size, "max_seq_len": c.max_position_embeddings,
            "d_model": c.hidden_size, "n_layers": c.num_hidden_layers, "head": {"kind": "lm", "bias": False, "tied": tied},
            "embedding": {"scale": False, "norm": False},
            "position": read_rope(c, where, partial=True),
            "block": {
                "attention": {"kind": "mha", "n_heads": c.num_attention_heads, "bias": c.attention_bias},
                "ffn": {**ffn_of(TWO_LAYER, c.hidden_act, where, "hidden_act"), "hidden": c.intermediate_size, "bias": True},
                "norm": {"kind": "layernorm", "eps": c.layer_norm_eps},
                "kind": "parallel" if c.use_parallel_residual else "pre",
            },
            "dropout": {"embedding": c.hidden_dropout, "residual": c.hidden_dropout, "attention": c.attention_dropout},
            "init": {"scheme": "normal", "std": c.initializer_range},
        }

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = f"zoo -> {cls.name}"
        att, d = s.block.attention, s.d_model
        require(s.position.kind == "rope", where, "position.kind", s.position.kind, "GPT-NeoX has rotary positions")
        layernorm(s, where, s.block.kind)
        require(att.kind in BUILTIN_ATTENTION, where, "block.attention.kind", att.kind, "only zoo's built-in attention converts")
        require(att.n_kv_heads == att.n_heads, where, "block.attention.n_kv_heads", att.n_kv_heads,
                "GPT-NeoX has multi-head attention only (n_kv_heads == n_heads)")
        sizes = (att.qk_size(d), att.v_size(d))
        require(d % att.n_heads == 0 and sizes == (d // att.n_heads,) * 2, where, "block.attention.head_dim", sizes,
                "GPT-NeoX's head size is hidden_size / num_attention_heads for queries, keys and values")
        require(att.has_out_bias == att.bias, where, "block.attention.out_bias", att.out_bias,
                "GPT-NeoX has one bias setting (attention_bias) for its attention projections")
        require(s.block.ffn.bias, where, "block.ffn.bias", False, "GPT-NeoX's MLP has biases")
        require(s.dropout.embedding == s.dropout.residual, where, "dropout.embedding", s.dropout.embedding,
                f"GPT-NeoX's hidden_dropout is one rate for embeddings and residuals (dropout.residual is {s.dropout.residual})")
        c = {
            "vocab_size": s.vocab_size, "hidden_size": d, "num_hidden_layers": s.n_layers, "num_attention_heads": att.n_heads,
            "intermediate_size": s.block.ffn.hidden_size(d), "hidden_act": act_name(s.block.ffn, cls.acts, where),
            "rope_parameters": write_rope(s.position, partial=True),
            "max_position_embeddings": s.max_seq_len, "layer_norm_eps": s.block.norm.eps,
            "use_parallel_residual": s.block.kind == "parallel", "attention_bias": att.bias,
            "hidden_dropout": s.dropout.residual, "attention_dropout": s.dropout.attention,
            "initializer_range": s.init.std, "tie_word_embeddings": s.head.tied,
        }
        token_ids(c, s.vocab_size, {"bos_token_id": 0, "eos_token_id": 2}, given)
        return c

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
