"""MXFP4 checkpoints: gpt-oss's release weights, read by dequantizing them as transformers does.

gpt-oss is released with its experts' two matrices in MXFP4 (``config.json``'s
``quantization_config: {quant_method: mxfp4, modules_to_not_convert: [...]}``): each is stored as
two uint8 tensors in place of the model's one, in the layout transformers' MXFP4 quantizer reads::

    mlp.experts.gate_up_proj_blocks  [E, 2F, D / 32, 16]   two fp4 (e2m1) codes a byte, low nibble first
    mlp.experts.gate_up_proj_scales  [E, 2F, D / 32]       an e8m0 exponent (biased by 127) per 32 values
    mlp.experts.down_proj_blocks     [E, D, F / 32, 16]
    mlp.experts.down_proj_scales     [E, D, F / 32]

for the model's ``mlp.experts.gate_up_proj`` [E, D, 2F] and ``down_proj`` [E, F, D] (the biases,
the router, attention and embeddings are stored as they are). :func:`dequantize` gives the model's
tensor in a floating dtype as transformers' ``convert_moe_packed_tensors`` does, bit for bit: each
code's value from the e2m1 table in that dtype, times 2 ** (scale - 127) by ``torch.ldexp`` in that
dtype, the rows transposed to the model's [E, in, out]. Every value of the table times a power of
two is a float32 and a bfloat16 exactly (within their exponent range), so in those dtypes the
dequantized tensor is the checkpoint's exact value; float16 rounds below 2 ** -24 and overflows
above 65504, as transformers' does.

:func:`quantization` reads a config's ``quantization_config``: None, or ``mxfp4`` for a class that
transformers dequantizes so (gpt-oss); any other method (fp8, bitsandbytes, gptq, ...) is refused by
name, as zoo reads no other packed format. :func:`packed` finds the model tensors a checkpoint holds
packed, :func:`packed_shapes` the blocks' and scales' shapes of a model tensor's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from zoo.interop.common import ConversionError

__all__ = ["BLOCK", "FP4_VALUES", "METHOD", "Packed", "dequantize", "packed", "packed_shapes", "quantization"]

METHOD = "mxfp4"
MODEL_TYPES = ("gpt_oss",)  # the classes whose experts transformers' MXFP4 quantizer (de)quantizes
BLOCK = 32  # values sharing one scale
# the e2m1 code -> its value (sign bit 3, two exponent bits, one mantissa bit), as transformers' table
FP4_VALUES = (+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@dataclass(frozen=True)
class Packed:
    """Where a checkpoint holds one model tensor in MXFP4: its blocks' and its scales' names."""

    blocks: str
    scales: str


def dequantize(blocks: Tensor, scales: Tensor, dtype: torch.dtype) -> Tensor:
    """The tensor [E, G * 32, R] that ``blocks`` [E, R, G, 16] (uint8) and ``scales`` [E, R, G] (uint8)
    pack, in ``dtype``, as transformers' ``convert_moe_packed_tensors``."""
    if blocks.dim() != 4 or blocks.shape[-1] != BLOCK // 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ConversionError(f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not pair: "
                              f"blocks are [experts, rows, groups, {BLOCK // 2}] and scales [experts, rows, groups]")
    e, r, g, b = blocks.shape
    table = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    out = torch.empty(e, r * g, 2 * b, dtype=dtype, device=blocks.device)
    for i in range(e):  # an expert at a time: the codes' indices take 4 bytes a value
        codes, rows = blocks[i].to(torch.uint8).reshape(-1, b), out[i]
        rows[:, 0::2] = table[(codes & 0x0F).to(torch.int)]  # the low nibble is the first of the two values
        rows[:, 1::2] = table[(codes >> 4).to(torch.int)]
        torch.ldexp(rows, (scales[i].to(torch.int32) - 127).reshape(-1, 1), out=rows)
    return out.reshape(e, r, g * 2 * b).transpose(1, 2).contiguous()


def packed_shapes(shape: Collection[int], name: str, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The blocks' and scales' shapes of a model tensor ``name`` of ``shape`` [E, in, out]."""
    e, n_in, n_out = shape
    if n_in % BLOCK:
        raise ConversionError(f"{where}: {name} [{e}, {n_in}, {n_out}] cannot be MXFP4: its input size {n_in} is not a "
                              f"multiple of {BLOCK}")
    return (e, n_out, n_in // BLOCK, BLOCK // 2), (e, n_out, n_in // BLOCK)


def packed(keys: Collection[str], names: Collection[str], prefix: str) -> dict[str, Packed]:
    """{model tensor name: its :class:`Packed` names} of the 3-D model tensors ``names`` whose
    ``_blocks`` and ``_scales`` are among the checkpoint's ``keys`` (taken with or without the base
    model's ``prefix``, as transformers reads them)."""
    known = set(names)
    found: dict[str, dict[str, str]] = {}
    for key in keys:
        for suffix in ("_blocks", "_scales"):
            if not key.endswith(suffix):
                continue
            stem = key.removesuffix(suffix)
            for name in (stem, stem.removeprefix(f"{prefix}."), f"{prefix}.{stem}") if prefix else (stem,):
                if name in known:
                    found.setdefault(name, {})[suffix] = key
                    break
    return {name: Packed(got["_blocks"], got["_scales"]) for name, got in found.items() if len(got) == 2}


def quantization(config: Any, model_type: str | None, where: str) -> str | None:
    """The quantization method of a config (``quantization_config.quant_method``): None without one,
    ``mxfp4`` for gpt-oss; any other is refused, naming it."""
    q = config.get("quantization_config") if isinstance(config, Mapping) else getattr(config, "quantization_config", None)
    if not q:
        return None
    method = q.get("quant_method") if isinstance(q, Mapping) else getattr(q, "quant_method", None)
    method = getattr(method, "value", method)  # transformers' QuantizationMethod enum
    if method != METHOD:
        raise ConversionError(f"{where}: quantization_config.quant_method={method!r} is not supported: zoo reads no "
                              f"packed weights but {METHOD} (gpt-oss's release); convert a checkpoint saved dequantized")
    if model_type not in MODEL_TYPES:
        raise ConversionError(f"{where}: quantization_config.quant_method={method!r} is not supported for model_type "
                              f"{model_type!r}: transformers packs only {', '.join(MODEL_TYPES)}'s experts so")
    return method
