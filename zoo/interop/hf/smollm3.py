"""SmolLM3: ``SmolLM3ForCausalLM`` <-> a zoo decoder laid out as LLaMA whose layers without rotary
positions (NoPE: a 0 in ``no_rope_layers``, by default every ``no_rope_layer_interval``-th layer)
are a layer pattern with no position, and whose sliding layers (``use_sliding_window`` with
``layer_types``) have the block's window or a pattern's::

    position: {kind: rope, base: 5.0e6}
    layers: [{at: "3::4", position: {kind: none}}]       # no_rope_layers [1, 1, 1, 0, 1, 1, 1, 0, ...]

The head size is hidden_size / heads. Back to HF, zoo writes ``no_rope_layers`` from each layer's
position (the model's rope, or none) and ``layer_types`` from each layer's window; layers that differ
otherwise, or two window sizes, are refused (SmolLM3 has one ``sliding_window``).
"""

from __future__ import annotations

from typing import Any

from zoo.interop.claims import ANY
from zoo.interop.common import unsupported
from zoo.interop.hf.base import require
from zoo.interop.hf.gemma2 import layer_at
from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Derived, Tokens, table
from zoo.interop.hf.traits import FULL, SLIDING, heads
from zoo.spec import FamilySpec

__all__ = ["SmolLM3"]


def _read_layers(c: Any, where: str) -> dict:
    n = c.num_hidden_layers
    flags = list(c.no_rope_layers)
    if len(flags) < n:
        raise unsupported(where, "no_rope_layers", flags, f"it needs a 1 (rope) or 0 (none) for each of the {n} layers")
    nope = [i for i, f in enumerate(flags[:n]) if not f]
    out: dict = {}
    if c.use_sliding_window:
        types = list(c.layer_types)
        unknown = sorted(set(types) - {FULL, SLIDING})
        if unknown:
            raise unsupported(where, "layer_types", unknown[0], f"zoo reads {FULL} and {SLIDING} layers")
        sliding = [i for i, t in enumerate(types[:n]) if t == SLIDING]
        if sliding and not c.sliding_window:
            raise unsupported(where, "sliding_window", c.sliding_window, "sliding_attention layers need a window")
        if len(sliding) == n:
            out["block.attention.window"] = c.sliding_window
        elif sliding:
            out["layers"] = [{"at": layer_at(sliding, n), "block": {"attention": {"window": c.sliding_window}}}]
    if nope:
        out["layers"] = [*out.get("layers", []), {"at": layer_at(nope, n), "position": {"kind": "none"}}]
    return out


def _write_layers(s: FamilySpec, where: str) -> dict:
    windows, rope = [], []
    for i, layer in enumerate(s.stack_layers()):
        b = layer.block
        plain = b.model_copy(update={"attention": b.attention.model_copy(update={"window": s.block.attention.window})})
        if plain != s.block:
            raise unsupported(where, "layers", f"layer {i}'s block", "SmolLM3's layers differ in their attention window "
                              "(layer_types) and rotary positions (no_rope_layers) only")
        position = layer.position or s.position
        if position != s.position and position.kind != "none":
            raise unsupported(where, "layers", f"layer {i}'s position {position.model_dump(mode='json')}",
                              "SmolLM3's layers have the model's rope or none (no_rope_layers)")
        windows.append(b.attention.window)
        rope.append(int(position.kind != "none"))
    sizes = sorted({w for w in windows if w is not None})
    require(len(sizes) <= 1, where, "block.attention.window", sizes, "SmolLM3 has one sliding_window for its sliding layers")
    return {"no_rope_layers": rope, "use_sliding_window": bool(sizes), "sliding_window": sizes[0] if sizes else None,
            "layer_types": [FULL if w is None else SLIDING for w in windows]}


class SmolLM3(Llama):
    name = "SmolLM3ForCausalLM"
    config_name = "SmolLM3Config"
    model_type = "smollm3"
    base = "SmolLM3Model"
    table = table(LLAMA, heads(head_dim_field=False),
                  Derived("layers", _read_layers, _write_layers, {"block.attention.window": ANY, "layers": ANY}),
                  Tokens({"bos_token_id": 128000, "eos_token_id": 128001, "pad_token_id": 128004}))
