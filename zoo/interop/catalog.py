"""The reference classes zoo converts, read from the converters' registries (``ARCHS`` of
:mod:`zoo.interop.hf` and of :mod:`zoo.interop.timm`) and never listed by hand: the package
docstrings, ``zoo convert --help`` and the table of classes in docs/interop.md (written by
``docs/make_docs.py``) all show these, so a class registered is a class listed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zoo.interop.common import name_list
from zoo.interop.hf.convert import ARCHS as HF_ARCHS
from zoo.interop.timm.convert import ARCHS as TIMM_ARCHS

__all__ = ["LIBRARIES", "Reference", "listing", "references"]

# library -> (its converters' module, its registry: class name -> converter, in the order a spec tries them)
LIBRARIES: dict[str, tuple[str, Mapping[str, Any]]] = {
    "HF transformers": ("zoo.interop.hf", HF_ARCHS),
    "timm": ("zoo.interop.timm", TIMM_ARCHS),
}


@dataclass(frozen=True)
class Reference:
    """One registered reference class: its ``library`` (a key of :data:`LIBRARIES`), its ``name``,
    the zoo ``families`` it claims, and for a backbone without a head (HF's ``*Model``) the class
    with the head it is the backbone of (``backbone_of``)."""

    library: str
    name: str
    families: tuple[str, ...]
    backbone_of: str | None = None


def _families(claims: Mapping[str, Any]) -> tuple[str, ...]:
    claim = claims.get("family")
    return tuple(claim) if isinstance(claim, tuple) else ()


def references() -> list[Reference]:
    """Every registered class, library by library, each in its registry's order."""
    out = []
    for library, (_, archs) in LIBRARIES.items():
        heads = {a.base: a.name for a in archs.values() if getattr(a, "base", None)}
        out += [Reference(library, a.name, _families(a.claims), heads.get(a.name)) for a in archs.values()]
    return out


def listing(indent: str = "    ") -> str:
    """Each library's classes, a wrapped paragraph under its name (for docstrings and help texts)."""
    return "\n".join(f"{indent}{library} ({module}):\n{name_list(archs, indent + '    ')}"
                     for library, (module, archs) in LIBRARIES.items())
