"""RoPE in HF configs, both ways: ``rope_parameters`` (transformers 5; ``rope_scaling`` and
``rope_theta`` before, which HF's config classes read into ``rope_parameters``) <-> a zoo rope
position with its ``base``, ``fraction`` and ``scaling``.

Every HF decoder zoo converts computes its frequencies with ``ROPE_INIT_FUNCTIONS[rope_type]`` and
updates them with ``dynamic_rope_update``, so each takes every scaling zoo expresses (``linear``,
``dynamic``, ``llama3``, ``yarn``, ``longrope``); another ``rope_type`` (``proportional``, a
model's own) is refused by name. HF's ``max_position_embeddings`` is zoo's ``max_seq_len``, which
dynamic scaling (and longrope without a ``factor``) reads as HF does.
"""

from __future__ import annotations

from typing import Any

from zoo.interop.common import unsupported
from zoo.spec.rope import SCALINGS

__all__ = ["read_rope", "rope_position", "write_rope"]

# what HF reads when a yarn key is missing (written only where zoo's value differs)
_HF_DEFAULTS = {"yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}}
_KINDS = ", ".join(SCALINGS)


def read_rope(c: Any, where: str, *, partial: bool = False) -> dict:
    """The zoo position mapping of an HF config's rope: ``rope_theta`` as ``base``, with ``partial``
    ``partial_rotary_factor`` as ``fraction``, and a ``rope_type`` other than ``default`` as
    ``scaling``. An unknown type or key is refused by name."""
    rope = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {"rope_type": "default"})
    if not partial and getattr(c, "partial_rotary_factor", None) not in (None, 1.0):
        raise unsupported(where, "partial_rotary_factor", c.partial_rotary_factor, "this architecture's rope rotates every dimension")
    return rope_position(rope, where, partial=partial)


def rope_position(params: dict | None, where: str, *, field: str = "rope_parameters", partial: bool = False) -> dict:
    """The zoo position mapping of one HF rope parameter dict (a config's ``rope_parameters``, or
    one layer type's in a model with a rope per layer type, ``field`` naming it in errors), as
    :func:`read_rope` reads it."""
    rope = dict(params or {"rope_type": "default"})
    rope.pop("type", None)  # the older spelling of rope_type, which HF keeps beside it
    kind = rope.pop("rope_type", "default")
    if kind != "default" and kind not in SCALINGS:
        raise unsupported(where, f"{field}.rope_type", kind, f"zoo's rope has the default frequencies or the "
                          f"scalings {_KINDS}")
    position: dict = {"kind": "rope", "base": rope.pop("rope_theta", 10000.0)}
    if partial:
        position["fraction"] = rope.pop("partial_rotary_factor", 1.0)
    fields = set(SCALINGS[kind].model_fields) - {"kind"} if kind != "default" else set()
    for key in sorted(set(rope) - fields):
        why = ("this architecture's rope rotates every dimension" if key == "partial_rotary_factor"
               else f"rope_type {kind} has no {key} in zoo (its fields: {', '.join(sorted(fields)) or 'none'})")
        raise unsupported(where, f"{field}.{key}", rope[key], why)
    if kind != "default":
        position["scaling"] = {"kind": kind, **{k: v for k, v in rope.items() if v is not None}}
    return position


def write_rope(position: Any, *, partial: bool = False) -> dict:
    """HF's ``rope_parameters`` of a zoo rope position: the fields of its scaling that are set
    (yarn's ``beta_fast``, ``beta_slow`` and ``truncate`` only where they differ from HF's defaults),
    ``rope_theta`` and, with ``partial``, ``partial_rotary_factor``."""
    s = position.scaling
    params: dict = {"rope_type": "default" if s is None else s.kind, "rope_theta": position.base}
    if partial:
        params["partial_rotary_factor"] = position.fraction
    if s is not None:
        defaults = _HF_DEFAULTS.get(s.kind, {})
        params.update({k: v for k, v in s.model_dump(mode="json", exclude={"kind"}).items()
                       if v is not None and not (k in defaults and v == defaults[k])})
    return params
