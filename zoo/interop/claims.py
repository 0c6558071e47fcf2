"""What a reference class expresses: claims on spec fields, and the check that refuses the rest.

A converter claims the spec fields its reference class can express, each with the values it takes
(:data:`ANY` where the converter maps or checks the value itself). :func:`check_claims` walks a spec
field by field: a field at its default is the plain arithmetic every reference computes; a field
away from its default must be claimed, with a claimed value. Anything else is refused by name, so a
field added to zoo later can never be exported silently to a class that computes something else.

Paths are dotted spec paths (``block.attention.window``); a claim on a path covers everything under
it. ``name`` and ``init`` never change what a converted model computes (its weights are copied), so
they are free. An optional part (null by default) whose fields the claims name is walked field by
field against its class's defaults (the claims of an encoder's ``classifier.*``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from zoo.interop.common import unsupported
from zoo.spec import FamilySpec, Spec

__all__ = ["ANY", "FREE", "Claims", "check_claims", "claims_family", "claims_value", "one_of", "predicate"]


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()  #: a claim on any value (the converter maps or checks it itself)
FREE = ("name", "init")  #: fields that never change what a converted model computes

Claims = Mapping[str, Any]  # path -> ANY, a collection of allowed values, or a predicate


def one_of(*values: object) -> tuple:
    """A claim on these values only."""
    return tuple(values)


def _dump(value: Any) -> Any:
    if isinstance(value, Spec):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


def _allowed(claim: Any, value: Any) -> bool:
    if claim is ANY:
        return True
    if callable(claim):
        return bool(claim(value))
    return _dump(value) in [_dump(v) for v in claim]


def _describe(claim: Any) -> str:
    if callable(claim):
        return getattr(claim, "__doc__", None) or "another value"
    return " or ".join(repr(_dump(v)) for v in claim)


def _default_of(value: Spec, field: str, default: Any) -> Any:
    """The default of ``value``'s ``field``: the default spec's own value where it has the field
    (a part of another kind keeps the default's kind), else the field's default in value's class."""
    if isinstance(default, Spec) and field in type(default).model_fields:
        return getattr(default, field)
    return type(value).model_fields[field].get_default(call_default_factory=True)


def check_claims(spec: FamilySpec, claims: Claims, where: str, reference: str) -> None:
    """Refuse (ConversionError, naming the field) every field of ``spec`` away from its default that
    ``claims`` does not claim, or claims with other values."""
    if "family" in claims and not _allowed(claims["family"], spec.family):
        raise unsupported(where, "family", spec.family, f"{reference} is a {_describe(claims['family'])} model")
    default = type(spec).model_validate({"family": spec.family})
    for path, value, why in _unclaimed(spec, default, "", claims):
        raise unsupported(where, path, _dump(value), why or f"{reference} does not express it (zoo's default is the "
                          f"arithmetic it computes)")
    for path, claim in claims.items():  # claimed values hold even where a whole part is at its default
        found, value = _lookup(spec, path)
        if found and not _allowed(claim, value):
            raise unsupported(where, path, _dump(value), f"this reference takes {_describe(claim)} only")


def _lookup(spec: Spec, path: str) -> tuple[bool, Any]:
    value: Any = spec
    for part in path.split("."):
        if not isinstance(value, Spec) or part not in type(value).model_fields:
            return False, None
        value = getattr(value, part)
    return True, value


def _unclaimed(value: Any, default: Any, path: str, claims: Claims) -> Iterable[tuple[str, Any, str]]:
    if path in claims:
        if not _allowed(claims[path], value):
            yield path, value, f"this reference takes {_describe(claims[path])} only"
        return
    if path.split(".")[0] in FREE or _dump(value) == _dump(default):
        return
    if isinstance(value, Spec) and default is None and any(k.startswith(path + ".") for k in claims):
        default = _part_default(value)  # an optional part the claims reach into (an encoder's classifier)
    if isinstance(value, Spec) and isinstance(default, Spec):  # a part: the fields that differ
        for field in type(value).model_fields:
            child = f"{path}.{field}" if path else field
            yield from _unclaimed(getattr(value, field), _default_of(value, field, default), child, claims)
        return
    yield path, value, ""


def _part_default(value: Spec) -> Spec | None:
    """The defaults of ``value``'s class, where every field has one: what an optional part's fields
    are compared with once it is set."""
    try:
        return type(value)()
    except ValueError:
        return None


def claims_family(claims: Claims, family: str) -> bool:
    """Whether ``claims`` take a spec of ``family``."""
    return "family" in claims and _allowed(claims["family"], family)


def claims_value(claims: Claims, path: str, value: Any) -> bool:
    """Whether ``claims`` take ``value`` at ``path`` where they claim it (an unclaimed path: True, and
    :func:`check_claims` decides by the default)."""
    return path not in claims or _allowed(claims[path], value)


def predicate(doc: str) -> Callable[[Callable[[Any], bool]], Callable[[Any], bool]]:
    """Decorate a claim's predicate with the words its refusal uses."""

    def decorate(fn: Callable[[Any], bool]) -> Callable[[Any], bool]:
        fn.__doc__ = doc
        return fn

    return decorate
