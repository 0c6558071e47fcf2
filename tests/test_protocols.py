"""The protocols of zoo.protocols, held to the parts that implement them.

Every module a registered builder makes (every kind of every registry, built directly and inside
the tiny presets), and every zoo module inside those models, is checked both ways: a module that has
a protocol's member declares a protocol with it (subclasses it; an attribute of a protocol of
several counts where the module has them all: a RoPE's ``head_dim`` alone is not HeadSizes), and a module that declares a
protocol has all of its members, methods with the protocol's signature (``inspect.signature``:
the same parameters, kinds, defaults and return annotation; an implementation may add keyword-only
parameters that have defaults) and attributes of the annotated type.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from torch import nn

import zoo
from zoo.protocols import PROTOCOLS, members
from zoo.registry import REGISTRIES
from zoo.spec import DropoutSpec, LayerNormSpec, PreBlockSpec

MEMBERS = {m: [p for p in PROTOCOLS if m in members(p)] for p in PROTOCOLS for m in members(p)}
TYPES = {"tuple": tuple, "str": str, "dict": dict, "int": int, "bool": bool}

# the context each registry's builders receive (docs/extending.md), for parts built on their own
CONTEXT = {
    "attention": dict(dim=32, kv_dim=32, d_model=32, dropout=0.0, cross=False),
    "position": dict(dim=32, max_len=16, n_heads=4, head_dim=8, grid=(4, 4), causal=False),
    "ffn": dict(dim=32, dropout=0.0, norm=LayerNormSpec()),
    "norm": dict(dim=32),
    "pool": dict(dim=32, block=PreBlockSpec(attention={"kind": "mha", "n_heads": 4})),
    "block": dict(dim=32, dropout=DropoutSpec(), cross=False),
    "head": dict(dim=32, vocab_size=61, norm=LayerNormSpec(), embedding=None),
}
SPEC_FIELDS = {"attention": {"n_heads": 4, "n_kv_heads": 1}, "block": {"attention": {"kind": "mha", "n_heads": 4}},
               "ffn": {"n_experts": 4, "top_k": 2}, "head": {"tied": False}}


def _parts() -> dict[str, list[nn.Module]]:
    """Label -> modules: each registered kind built on its own where its default spec allows, each
    kind's module as the presets build it, and every zoo module inside the presets' models."""
    found: dict[str, list[nn.Module]] = {}
    for name, reg in REGISTRIES.items():
        for kind in reg.names():
            original = reg.builder(kind)

            def record(spec, *args, _label=f"{name} {kind}", _original=original, **context):
                module = _original(spec, *args, **context)
                found.setdefault(_label, []).append(module)
                return module

            reg.register(kind, replace=True)(record)
    presets = Path(zoo.__file__).parent / "presets"
    specs = [zoo.load_spec(str(p)) for p in sorted(presets.glob("*-tiny*.yaml")) + sorted(presets.glob("*-mini.yaml"))]
    specs += [zoo.load_spec("deit3-small-16"), zoo.load_spec("vit-so150m-16-reg4-map-256"),  # layer scale, MAP pool
              zoo.load_spec("bert-mini", ["classifier.num_labels=3", "pooler=true"])]  # classifier, pooler
    for spec in specs:
        model = zoo.build(spec, device="meta")  # no weights
        for m in model.modules():
            if type(m).__module__.startswith("zoo."):
                found.setdefault(f"{type(m).__module__}.{type(m).__name__}", []).append(m)
    for name, context in CONTEXT.items():
        reg = REGISTRIES[name]
        for kind in reg.names():
            cls = reg.spec(kind)
            fields = {k: v for k, v in SPEC_FIELDS.get(name, {}).items() if k in cls.model_fields}
            try:
                reg.builder(kind)(cls.model_validate({"kind": kind, **fields}), **context)
            except ValueError:
                continue  # a kind that needs more than its defaults and this context: the presets build it
    return found


@pytest.fixture(scope="module")
def parts():
    saved = {name: dict(r._builders) for name, r in REGISTRIES.items()}
    try:
        yield _parts()
    finally:
        for name, builders in saved.items():
            for kind, builder in builders.items():
                REGISTRIES[name].register(kind, replace=True)(builder)


def _same_signature(impl, proto) -> str | None:
    """Why ``impl`` does not have the signature of the protocol's method ``proto``, or None."""
    got, want = inspect.signature(impl), inspect.signature(proto)
    extra = [p for n, p in got.parameters.items() if n not in want.parameters]
    if [(p.name, p.kind, p.default) for n, p in got.parameters.items() if n in want.parameters] != \
            [(p.name, p.kind, p.default) for p in want.parameters.values()]:
        return f"parameters {got} where the protocol has {want}"
    if any(p.kind is not p.KEYWORD_ONLY or p.default is p.empty for p in extra):
        return f"adds parameters without defaults or not keyword-only: {got}"
    if str(got.return_annotation) != str(want.return_annotation):
        return f"returns {got.return_annotation}, the protocol {want.return_annotation}"
    return None


def _attribute_type(protocol: type, member: str) -> tuple[type, ...]:
    """The types an attribute's annotation allows (``ClassVar[str | None]``: str and None)."""
    text = re.sub(r"^ClassVar\[(.*)\]$", r"\1", str(protocol.__annotations__[member]))
    names = [t.split("[")[0].strip() for t in text.split("|")]
    return tuple(type(None) if n == "None" else TYPES[n] for n in names)


def problems(module: nn.Module) -> list[str]:
    """What ``module``'s class gets wrong about the protocols; [] when nothing."""
    cls, out = type(module), []
    declared = [p for p in PROTOCOLS if p in cls.__mro__]
    for member, protocols in MEMBERS.items():
        # an attribute of a protocol of several (``head_dim`` of HeadSizes) counts where the module has them all
        has = hasattr(module, member) and any(callable(vars(p).get(member)) or isinstance(module, p) for p in protocols)
        if has and not any(p in declared for p in protocols):
            out.append(f"has {member} but declares none of {[p.__name__ for p in protocols]}")
    for protocol in declared:
        for member in members(protocol):
            want = vars(protocol).get(member)
            if callable(want):
                impl = getattr(cls, member, None)
                if impl is None or any(vars(p).get(member) is impl for p in PROTOCOLS):
                    out.append(f"declares {protocol.__name__} but does not implement {member}")
                elif (why := _same_signature(impl, want)) is not None:
                    out.append(f"{member}: {why}")
            elif not isinstance(getattr(module, member, None), _attribute_type(protocol, member)):
                out.append(f"declares {protocol.__name__} but its {member} is {getattr(module, member, None)!r}, "
                           f"not {protocol.__annotations__[member]}")
    return [f"{cls.__module__}.{cls.__qualname__}: {p}" for p in out]


def test_every_registered_kind_was_built(parts):
    built = {label for label in parts if " " in label}
    assert built == {f"{name} {kind}" for name, reg in REGISTRIES.items() for kind in reg.names()}


def test_parts_declare_the_protocols_they_implement_and_implement_those_they_declare(parts):
    found = sorted({p for modules in parts.values() for m in modules for p in problems(m)})
    assert not found, "\n".join(found)


def test_the_check_sees_a_part_that_breaks_a_protocol():
    from zoo.protocols import CountsFlops, SummaryPart

    class Undeclared(nn.Module):
        summary_part = "ffn"

    class WrongSignature(nn.Module, CountsFlops):
        def flops(self, tokens: int) -> int:
            return tokens

    class Unimplemented(nn.Module, SummaryPart, CountsFlops):
        summary_part = 3

    class Extended(nn.Module, CountsFlops):
        def flops(self, tokens: int, memory: int | None = None, *, exact: bool = False) -> int:
            return tokens

    assert problems(Undeclared()) == [f"{__name__}.test_the_check_sees_a_part_that_breaks_a_protocol.<locals>."
                                      "Undeclared: has summary_part but declares none of ['SummaryPart']"]
    assert "flops: parameters" in problems(WrongSignature())[0]
    assert {p.split(": ", 1)[1] for p in problems(Unimplemented())} == {
        "declares CountsFlops but does not implement flops",
        "declares SummaryPart but its summary_part is 3, not ClassVar[str]"}
    assert problems(Extended()) == []


def test_isinstance_checks_are_structural():
    """A user's part answers by having the member, without subclassing (zoo.components.parts)."""
    from zoo.components import parts as part_rules
    from zoo.protocols import CountsFlops

    class Mine(nn.Module):
        def flops(self, tokens: int, memory: int | None = None) -> int:
            return 7 * tokens

    assert isinstance(Mine(), CountsFlops) and part_rules.flops(Mine(), 3) == 21
