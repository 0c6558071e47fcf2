"""The timm converters' entry points: the classes by name, and the two directions."""

from __future__ import annotations

from torch import nn

from zoo.build import build
from zoo.interop.claims import claims_family
from zoo.interop.common import ConversionError, check_covered, first_expressing, check_used, device_dtype, load_exact, reference_state, unsupported, zoo_state
from zoo.interop.timm.base import Architecture
from zoo.interop.timm.beit import Beit
from zoo.interop.timm.eva import Eva
from zoo.interop.timm.naflex import NaFlex
from zoo.interop.timm.vit import ViT
from zoo.spec import FamilySpec, parse_spec

__all__ = ["ARCHITECTURES", "ARCHS", "arch_for_spec", "from_timm", "timm_architecture", "timm_kwargs", "timm_spec", "to_timm"]

# A spec converts by default to the first of these that expresses it: timm's plain ViT, then Eva, then Beit, then NaFlexVit
_ALL = (ViT, Eva, Beit, NaFlex)
ARCHS: dict[str, type[Architecture]] = {a.name: a for a in _ALL}
ARCHITECTURES = tuple(ARCHS)
if len(ARCHS) != len(_ALL):  # a converter bug: each entry names its own timm class
    raise TypeError(f"two converters name one timm class among {[a.name for a in _ALL]}")


def _arch_of_model(m: nn.Module) -> type[Architecture]:
    arch = ARCHS.get(type(m).__name__)
    if arch is None or type(m) is not arch.reference():  # a class of that name elsewhere computes something else
        raise ConversionError(f"from_timm: {type(m).__module__}.{type(m).__name__} does not convert; "
                              f"supported: timm's {', '.join(ARCHITECTURES)}")
    return arch


def arch_for_spec(spec: FamilySpec, architecture: str | None = None) -> type[Architecture]:
    """The timm class ``architecture`` names, or (None) the first that expresses ``spec``; a
    ConversionError listing each class's reason where none does."""
    if architecture is not None:
        if architecture not in ARCHS:
            raise ConversionError(f"to_timm: unknown architecture {architecture!r}; choose from {', '.join(ARCHITECTURES)}")
        return ARCHS[architecture]
    family = [a for a in ARCHS.values() if claims_family(a.claims, spec.family)] or list(ARCHS.values())  # else the reasons
    return first_expressing(family, lambda arch: arch.express(spec),
                            f"to_timm: no timm class expresses this {spec.family} (pass architecture= to pick one)")


def timm_architecture(spec: FamilySpec) -> str:
    """The name of the timm class :func:`to_timm` writes for ``spec`` by default (the first of
    ``ARCHITECTURES`` that expresses it), else a ConversionError with each class's refusal."""
    return arch_for_spec(spec).name


def timm_kwargs(spec: FamilySpec, architecture: str | None = None) -> dict:
    """The constructor arguments of the timm class ``architecture`` names (default: timm's
    VisionTransformer) for ``spec``, refusing what that class cannot express."""
    return arch_for_spec(spec, architecture or ViT.name).express(spec)


def timm_spec(m: nn.Module) -> FamilySpec:
    """The zoo spec of a timm model of one of ``ARCHITECTURES`` (refusing what zoo cannot express)."""
    arch = _arch_of_model(m)
    return parse_spec(arch.spec(m), source=f"from timm {arch.name}")


def from_timm(timm_model: nn.Module) -> nn.Module:
    """A zoo ViT computing what ``timm_model`` (a model of one of ``ARCHITECTURES``) computes: spec
    from its modules, tensors copied."""
    arch = _arch_of_model(timm_model)
    where = arch.where_from()
    spec = timm_spec(timm_model)
    arch.check_claims(spec, where)  # what it reads it can write back
    device, dtype = device_dtype(timm_model)
    model = build(spec, device=device, dtype=dtype)
    ref, rules = timm_model.state_dict(), arch.rules(spec, timm_model)
    check_covered(ref, rules, where)
    shapes = {name: t.shape for name, t in model.state_dict().items()}
    load_exact(model, zoo_state(ref, rules, shapes, where), where)
    return model.train(timm_model.training)


def to_timm(zoo_model: nn.Module, architecture: str | None = None) -> nn.Module:
    """The timm model computing what the zoo ViT ``zoo_model`` computes: of the class ``architecture``
    names (one of ``ARCHITECTURES``), or (None) of the first that expresses the spec."""
    spec = zoo_model.spec
    arch = arch_for_spec(spec, architecture)
    where = arch.where_to()
    device, dtype = device_dtype(zoo_model)
    timm_model = arch.reference()(**arch.express(spec), device=device, dtype=dtype)
    hidden = spec.block.ffn.hidden_size(spec.d_model)
    if timm_model.blocks[0].mlp.fc2.in_features != hidden:
        raise unsupported(where, "block.ffn.hidden", hidden, f"timm sizes the MLP as int(d_model * mlp_ratio); no ratio gives {hidden}")
    shapes = {name: t.shape for name, t in timm_model.state_dict().items()}
    rules = arch.rules(spec, timm_model)
    check_used(zoo_model.state_dict(), rules, where)
    load_exact(timm_model, reference_state(zoo_model.state_dict(), rules, shapes, where), where)
    return timm_model.train(zoo_model.training)
