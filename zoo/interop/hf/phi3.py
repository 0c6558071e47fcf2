"""Phi-3: ``Phi3ForCausalLM`` <-> a zoo decoder laid out as LLaMA with Phi-3's fused projections: one
``qkv_proj`` ([q | k | v] rows, as zoo's ``qkv``) and one ``gate_up_proj`` ([gate | up], as zoo's
gated ``fc1``). No biases; the head size is hidden_size / num_attention_heads; partial rotary where
``rope_parameters`` has a ``partial_rotary_factor`` below 1 (``position.fraction``); a sliding
window on every layer (``sliding_window``); dropout on each sub-layer's output (``resid_pdrop``:
``dropout.residual``). Its rope scalings convert as LLaMA's do (``longrope``: Phi-3's long-context
checkpoints). Phi-3 never applies its ``embd_pdrop``."""

from __future__ import annotations

from zoo.interop.claims import predicate
from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Claim, Derived, Tokens, table
from zoo.interop.hf.traits import heads, no_bias, residual_dropout, rope, sliding_window
from zoo.spec import FamilySpec

__all__ = ["Phi3"]


@predicate("Phi3Config takes the default rope or longrope only")
def _longrope(scaling) -> bool:
    return scaling is None or scaling.kind == "longrope"


def _original(s: FamilySpec, where: str) -> dict:
    """Phi3Config's own original_max_position_embeddings, which it copies over rope_parameters' (default 4096)."""
    original = getattr(s.position.scaling, "original_max_position_embeddings", None)
    return {} if original is None else {"original_max_position_embeddings": original}


class Phi3(Llama):
    name = "Phi3ForCausalLM"
    config_name = "Phi3Config"
    model_type = "phi3"
    base = "Phi3Model"
    qkv = ("qkv_proj",)
    gate_up = ("gate_up_proj",)
    table = table(LLAMA, rope(partial=True), Claim("position.scaling", _longrope), heads(head_dim_field=False), no_bias(),
                  sliding_window(), residual_dropout(), Derived("original", lambda c, where: {}, _original),
                  # Phi3Config's, but no pad_token_id: its embedding would then keep the pad row's gradient at zero
                  Tokens({"bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": None}))
