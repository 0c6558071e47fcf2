"""Phi-3: ``Phi3ForCausalLM`` <-> a zoo decoder laid out as LLaMA with Phi-3's fused projections: one
``qkv_proj`` ([q | k | v] rows, as zoo's ``qkv``) and one ``gate_up_proj`` ([gate | up], as zoo's
gated ``fc1``). No biases; the head size is hidden_size / num_attention_heads; partial rotary where
``rope_parameters`` has a ``partial_rotary_factor`` below 1 (``position.fraction``); a sliding
window on every layer (``sliding_window``); dropout on each sub-layer's output (``resid_pdrop``:
``dropout.residual``). Its rope scalings convert as LLaMA's do (``longrope``: Phi-3's long-context
checkpoints). Phi-3 never applies its ``embd_pdrop``."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import ANY, Claims, one_of, predicate
from zoo.interop.hf.llama import Llama
from zoo.spec import FamilySpec

__all__ = ["Phi3"]


@predicate("Phi3Config takes the default rope or longrope only")
def _longrope(scaling) -> bool:
    return scaling is None or scaling.kind == "longrope"


class Phi3(Llama):
    name = "Phi3ForCausalLM"
    config_name = "Phi3Config"
    model_type = "phi3"
    base = "Phi3Model"
    head_dim_field: ClassVar[bool] = False
    partial_rotary: ClassVar[bool] = True
    qkv: ClassVar[tuple[str, ...]] = ("qkv_proj",)
    gate_up: ClassVar[tuple[str, ...]] = ("gate_up_proj",)
    claims: ClassVar[Claims] = {**Llama.claims, "position.fraction": ANY, "block.attention.window": ANY,
                                "block.attention.bias": one_of(False), "block.attention.out_bias": one_of(None, False),
                                "block.ffn.bias": one_of(False), "dropout.residual": ANY,
                                "position.scaling": _longrope}
    # Phi3Config's, but no pad_token_id: its embedding would then keep the pad row's gradient at zero
    token_defaults: ClassVar[dict[str, int | None]] = {"bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": None}

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        s["block"]["attention"].update(bias=False, window=c.sliding_window)
        s["dropout"]["residual"] = c.resid_pdrop

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        c.update(sliding_window=s.block.attention.window, resid_pdrop=s.dropout.residual)
        original = getattr(s.position.scaling, "original_max_position_embeddings", None)
        if original is not None:  # Phi3Config's own field, which it copies over rope_parameters' (default 4096)
            c["original_max_position_embeddings"] = original
