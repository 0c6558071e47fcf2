"""Qwen2: ``Qwen2ForCausalLM`` <-> a zoo decoder laid out as LLaMA, with biases on the q, k and v
projections but none on the output projection (``bias: true, out_bias: false``), and sliding-window
attention on every layer, none, or some (``layer_types``; Qwen2's ``max_window_layers``: the layers
from that index on slide), which zoo writes as a layer pattern::

    block: {attention: {window: null, ...}}
    layers: [{at: "2:", block: {attention: {window: 4096}}}]     # max_window_layers 2

:func:`read_windows` and :func:`write_windows` map those per-layer windows (Qwen3 has the same fields).
"""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import unsupported
from zoo.interop.hf.base import require, same_layers
from zoo.interop.hf.llama import Llama
from zoo.spec import FamilySpec

__all__ = ["Qwen2", "read_windows", "write_windows"]

FULL, SLIDING = "full_attention", "sliding_attention"


def read_windows(c: Any, s: dict, where: str) -> None:
    """The config's ``layer_types`` and ``sliding_window`` into the spec mapping ``s``: the block's
    window where every layer slides, a layer pattern where some do."""
    types = list(c.layer_types)
    unknown = sorted(set(types) - {FULL, SLIDING})
    if unknown:
        raise unsupported(where, "layer_types", unknown[0], f"zoo reads {FULL} and {SLIDING} layers")
    if SLIDING in types and not c.sliding_window:
        raise unsupported(where, "sliding_window", c.sliding_window, "sliding_attention layers need a window")
    sliding = [i for i, t in enumerate(types) if t == SLIDING]
    if len(sliding) == len(types):
        s["block"]["attention"]["window"] = c.sliding_window
    elif sliding:
        n = len(types)
        at = f"{sliding[0]}:" if sliding == list(range(sliding[0], n)) else sliding
        s["layers"] = [{"at": at, "block": {"attention": {"window": c.sliding_window}}}]


def write_windows(s: FamilySpec, c: dict, where: str, name: str, *, parts: tuple[str, ...] = ()) -> None:
    """The spec's windows as ``use_sliding_window``, ``sliding_window``, ``layer_types`` and the
    ``max_window_layers`` that gives them; layers that differ otherwise (but for the block ``parts``
    the caller checks), or two sizes, are refused."""
    same_layers(s, where, but=("window",), parts=parts)
    windows = [layer.block.attention.window for layer in s.stack_layers()]
    sizes = sorted({w for w in windows if w is not None})
    require(len(sizes) <= 1, where, "block.attention.window", sizes, f"{name} has one sliding_window for its sliding layers")
    types = [FULL if w is None else SLIDING for w in windows]
    c.update(use_sliding_window=bool(sizes), sliding_window=sizes[0] if sizes else None, layer_types=types)
    if sizes:
        first = types.index(SLIDING)
        c["max_window_layers"] = first if types[first:] == [SLIDING] * (len(types) - first) else len(types)


class Qwen2(Llama):
    name = "Qwen2ForCausalLM"
    config_name = "Qwen2Config"
    model_type = "qwen2"
    base = "Qwen2Model"
    head_dim_field: ClassVar[bool] = False
    one_bias: ClassVar[bool] = False
    claims: ClassVar[Claims] = {**Llama.claims, "block.attention.window": ANY, "block.attention.out_bias": one_of(False),
                                "block.attention.bias": one_of(True), "block.ffn.bias": one_of(False), "layers": ANY}
    token_defaults: ClassVar[dict[str, int | None]] = {}

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        s["block"]["attention"].update(bias=True, out_bias=False)
        read_windows(c, s, where)

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        write_windows(s, c, where, "Qwen2")
