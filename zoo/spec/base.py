"""The base of every spec, and the dispatch that picks a part's spec class by its ``kind`` from
the part's registry (:mod:`zoo.registry`), so a part a user registers is as valid as a built-in;
:class:`Kinds` picks from a fixed set instead (an option of a part, such as a RoPE's scaling)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import core_schema

from zoo.registry import REGISTRIES, RegistryError, registry, suggest

__all__ = ["ComponentSpec", "Dispatch", "Kinds", "Rate", "Spec", "register_specs"]

Rate = Annotated[float, Field(ge=0.0, lt=1.0)]


class Spec(BaseModel):
    """Base of every spec: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


class ComponentSpec(Spec):
    """A part chosen by ``kind`` from its registry."""

    kind: str


class Dispatch:
    """Validate a ``{kind: ...}`` mapping with the spec class its registry has for that kind.
    With ``shorthand``, a bare name stands for ``{kind: name}`` (``pool: mean``); with ``default``, a
    mapping without the key is of that kind (``block: {ffn: ...}`` is a ``pre`` block)."""

    def __init__(self, part: str, key: str = "kind", *, shorthand: bool = False, default: str | None = None) -> None:
        self.part, self.key, self.shorthand, self.default = part, key, shorthand, default

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        reg = registry(self.part)

        def validate(value: Any) -> Any:
            if isinstance(value, ComponentSpec):
                value = value.model_dump()
            if self.shorthand and isinstance(value, str):
                value = {self.key: value}
            if not isinstance(value, Mapping):
                raise ValueError(  # noqa: TRY004  (pydantic reports a ValueError as a validation error)
                    f"expected a mapping such as {{{self.key}: {reg.names()[0]}}}, got {value!r}"
                )
            if self.key not in value and self.default is not None:
                value = {self.key: self.default, **value}
            if self.key not in value:
                raise ValueError(f"missing '{self.key}': one of {', '.join(reg.names())}")
            try:
                cls = reg.spec(value[self.key])
            except RegistryError as e:
                raise ValueError(str(e)) from None
            return cls.model_validate(dict(value))

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: v.model_dump(mode="json"), when_used="always"
            ),
        )

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict:
        # Built when asked, so parts registered later appear too.
        reg = registry(self.part)
        members = []
        seen = set()
        for kind in reg.names():
            cls = reg.spec(kind)
            if cls not in seen:
                seen.add(cls)
                members.append(handler(cls.__pydantic_core_schema__))
        if self.shorthand:
            members.append({"type": "string", "enum": reg.names()})
        return {"oneOf": members, "description": f"a {self.part}, chosen by {self.key}: {', '.join(reg.names())}"}


class Kinds:
    """Validate a ``{kind: ...}`` mapping with the spec class that the fixed set ``kinds`` has for
    its kind: a closed choice within a part (a RoPE's ``scaling``), where :class:`Dispatch` picks a
    part from its registry. Errors name the field inside the chosen kind (``scaling.factor``)."""

    def __init__(self, what: str, kinds: Mapping[str, type[Spec]], key: str = "kind") -> None:
        self.what, self.kinds, self.key = what, dict(kinds), key

    def names(self) -> list[str]:
        return list(self.kinds)

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        names = ", ".join(self.kinds)

        def validate(value: Any) -> Any:
            if isinstance(value, Spec):
                value = value.model_dump()
            if not isinstance(value, Mapping):
                raise ValueError(  # noqa: TRY004  (pydantic reports a ValueError as a validation error)
                    f"expected a mapping such as {{{self.key}: {next(iter(self.kinds))}, ...}}, got {value!r}"
                )
            if self.key not in value:
                raise ValueError(f"missing '{self.key}': one of {names}")
            kind = value[self.key]
            if kind not in self.kinds:
                hint = suggest(kind, list(self.kinds)) if isinstance(kind, str) else ""
                raise ValueError(f"unknown {self.what} kind {kind!r}{hint} (known: {names})")
            return self.kinds[kind].model_validate(dict(value))

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: v.model_dump(mode="json"), when_used="always"
            ),
        )

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict:
        members = [handler(cls.__pydantic_core_schema__) for cls in dict.fromkeys(self.kinds.values())]
        return {"oneOf": members, "description": f"a {self.what}, chosen by {self.key}: {', '.join(self.kinds)}"}


def register_specs(part: str, base: type[Spec], members: Mapping[str, type[Spec]]) -> None:
    """Make ``base`` the spec base of the ``part`` registry and register each ``{kind: spec class}``."""
    REGISTRIES[part].spec_base = base
    for kind, cls in members.items():
        REGISTRIES[part].add_spec(kind, cls)
