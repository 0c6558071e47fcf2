"""What each timm reference class fills in: the :class:`Architecture` of a timm model class (its
name, the spec fields it claims, :mod:`zoo.interop.claims`), the timm counterpart of
:class:`zoo.interop.hf.base.Architecture`. timm keeps few options in a config, so a class reads
its spec from the model's modules and writes the constructor's arguments instead of a config."""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from torch import nn

from zoo.interop.claims import Claims, check_claims
from zoo.interop.common import Rule
from zoo.spec import FamilySpec

__all__ = ["Architecture"]


class Architecture:
    """One timm model class. ``spec(timm_model)`` reads a zoo spec (a mapping) from the model's
    modules, refusing by name what zoo has no counterpart for; ``kwargs(spec)`` writes the class's
    constructor arguments, refusing what the claims let through but the class still cannot
    express (a value that depends on another field); ``rules(spec, timm_model)`` maps tensors by
    name, for the model read (to zoo) or the one just built (from zoo), whose layout it may read.

    ``base_model`` is the timm model name a timm directory written from zoo names: its
    ``model_args`` set every size, so any model of the class will do."""

    name: ClassVar[str]  # the timm model class
    module: ClassVar[str]  # the timm module that defines it
    base_model: ClassVar[str]  # the timm model name written for it in a timm directory's config.json
    first_conv: ClassVar[str] = "patch_embed.proj"  # its patch projection, as its pretrained_cfg names it
    claims: ClassVar[Claims] = {}  # the spec fields it expresses (zoo.interop.claims); any other is refused

    @classmethod
    def reference(cls) -> type[nn.Module]:
        """The timm class itself (timm is imported here, when a converter runs)."""
        return getattr(importlib.import_module(cls.module), cls.name)

    @classmethod
    def where_from(cls) -> str:
        return f"timm {cls.name} -> zoo"

    @classmethod
    def where_to(cls) -> str:
        return f"zoo -> timm {cls.name}"

    @classmethod
    def check_claims(cls, s: FamilySpec, where: str) -> None:
        """Refuse every field of ``s`` this class does not claim (before its own finer checks)."""
        check_claims(s, cls.claims, where, f"timm's {cls.name}")

    @classmethod
    def express(cls, s: FamilySpec) -> dict[str, Any]:
        """The constructor arguments of ``s``: its claims checked, then :meth:`kwargs`."""
        cls.check_claims(s, cls.where_to())
        return cls.kwargs(s)

    @staticmethod
    def spec(m: nn.Module) -> dict:
        raise NotImplementedError

    @staticmethod
    def kwargs(s: FamilySpec) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def rules(s: FamilySpec, m: nn.Module) -> list[Rule]:
        raise NotImplementedError
