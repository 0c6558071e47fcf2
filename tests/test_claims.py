"""Every converter claims every spec field, generated from the spec classes themselves.

For each converter (every HF architecture and timm class), the small reference of
tests/conformance_table.py gives a base spec. Each field reachable in it (and in each part of
another kind, and in each optional section switched on) is set to values other than its own; every
resulting valid spec must either convert and read back to a spec that computes the same (compared
by :func:`canonical`), or be refused with a ``ConversionError`` that names the field. A field added
to zoo later is generated here too, so it is refused until a converter claims it; the last test
checks that the generation reaches every field of every built-in spec class.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conformance_table import BACKBONE_OF, CLASSES, TIMM_CONFIGS, V, build_reference, timm_class
from conformance_table import hf_config as table_config
from conftest import randomize

import zoo
from zoo.interop import ConversionError
from zoo.interop.claims import FREE
from zoo.registry import REGISTRIES, registry
from zoo.spec import ComponentSpec, Dispatch, FamilySpec, Kinds, LayerPattern, Spec, SpecError, parse_spec

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.reference

# ------------------------------------------------------------------------------- base specs
# the base specs: the references of the conformance table (one small config per class, sizes no preset has)
# more base specs where one cannot reach a field alone (a field valid only with another changed)
MORE = {
    "MarianMTModel": [dict(share_encoder_decoder_embeddings=False, tie_word_embeddings=False, decoder_vocab_size=V + 4)],
    "VisionTransformer": [dict(class_token=False, global_pool="avg", reg_tokens=2)],
}
# a valid mapping of each kind of a closed choice (Kinds) whose fields have no defaults; the lists fit
# the base specs' 6-wide heads (3 rotated pairs)
KIND_EXAMPLES = {
    "linear": {"factor": 2.0}, "dynamic": {"factor": 2.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 0.5},
    "longrope": {"short_factor": [1.0, 1.5, 2.0], "long_factor": [1.0, 3.0, 6.0], "original_max_position_embeddings": 16},
}
# (converter, path) that convert to a spec computing the same function of permuted weights
EQUIVALENT = {("MarianMTModel", "position.layout"): "the paper's interleaved sinusoids reach Marian's concat layout by "
              "permuting the model dimension (test_interop compares the logits)"}


def base_specs(name: str) -> list[FamilySpec]:
    from zoo.interop import hf_spec, timm_spec

    if name in TIMM_CONFIGS:
        return [timm_spec(build_reference(name, **kw)) for kw in [{}, *MORE.get(name, [])]]
    return [hf_spec(table_config(name, **kw)) for kw in [{}, *MORE.get(name, [])]]


def convert_back(name: str, spec: FamilySpec) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A random-init zoo model of ``spec`` and the zoo model read back from what it converts to (a
    ConversionError if it does not)."""
    from zoo.interop import from_hf, from_timm, hf_config, to_hf, to_timm
    from zoo.interop.hf.convert import arch_for_spec
    from zoo.interop.timm import timm_kwargs

    # the spec-level checks the converters make first, in their order, before a model is built (most
    # mutations are refused here: building each one's model would be most of this test's time)
    if name in TIMM_CONFIGS:
        timm_kwargs(spec, timm_class(name))
    else:
        hf_config(spec, arch_for_spec(spec, name).name)
    model = randomize(zoo.build(spec, seed=0))
    if name in TIMM_CONFIGS:
        back = from_timm(to_timm(model, timm_class(name)))
    else:
        back = from_hf(to_hf(model, name))
    return model, back


CONVERTERS = CLASSES
# A backbone claims its LM's fields less the head, made mechanically (zoo.interop.hf.base's _headless), so
# sweeping every backbone repeats its LM's sweep: five are swept (a decoder with learned positions, BERT
# with its pooler, a rotary decoder, an encoder-decoder, MLA with a MoE), three of them in the fast lane.
# test_conformance checks every backbone's tensors, logits and config both ways.
SWEPT_BACKBONES = ("GPT2Model", "BertModel", "Qwen3Model", "M2M100Model", "DeepseekV3Model")
SWEPT = [n for n in CONVERTERS if n not in BACKBONE_OF or n in SWEPT_BACKBONES]
SLOW = ["M2M100Model", "DeepseekV3Model"]


# ------------------------------------------------------------------------------- what computes the same
def canonical(spec: FamilySpec) -> dict:
    """What a spec computes, in one spelling: each layer resolved, head counts and sizes resolved
    (mha with n_kv_heads null is gqa with n_kv_heads = n_heads; scale_dim null is the head size),
    the free fields left out."""
    sizes = {"n_layers", "n_encoder_layers", "n_decoder_layers", "src_vocab_size"}  # the stacks and vocabularies say
    data = spec.model_dump(mode="json", exclude=set(FREE) | {"block", "layers", "pool"} | sizes)
    if hasattr(spec, "src_vocab_size"):
        data["src_vocab_size"] = spec.src_vocab_size
    if getattr(spec, "pool", None) is not None:
        data["pool"] = {"kind": spec.pool.kind, "bias": getattr(spec.pool, "bias", None),
                        "token": getattr(spec.pool, "token", None)}
    for name in spec.stacks():
        data[f"layers:{name}"] = [_layer(spec, layer) for layer in spec.stack_layers(name)]
    return data


def _layer(spec: FamilySpec, layer) -> dict:
    b = layer.block.model_dump(mode="json")
    for field in ("attention", "cross_attention"):
        att = getattr(layer.block, field)
        if att is None and field == "cross_attention":
            att = layer.block.cross
        if hasattr(att, "n_kv_heads"):
            d = spec.d_model
            b[field] = {**att.model_dump(mode="json"), "kind": "-", "n_kv_heads": att.n_kv_heads, "head_dim": att.qk_size(d),
                        "v_head_dim": att.v_size(d), "out_bias": att.has_out_bias, "scale_dim": att.scale_size(d)}
    if hasattr(layer.block.ffn, "hidden_size"):
        b["ffn"] = {**b["ffn"], "hidden": layer.block.ffn.hidden_size(spec.d_model)}
    if hasattr(layer.block.ffn, "expert"):  # a mixture of experts: each expert's width
        b["ffn"]["expert"] = {**b["ffn"]["expert"], "hidden": layer.block.ffn.expert.hidden_size(spec.d_model)}
    pool = getattr(spec, "pool", None)
    if getattr(pool, "kind", None) == "map":  # its heads and width default to the blocks'
        b["pool"] = {"n_heads": pool.n_heads or spec.block.attention.n_heads,
                     "hidden": pool.hidden or spec.block.ffn.hidden_size(spec.d_model)}
    return {"block": b, "position": None if layer.position is None else layer.position.model_dump(mode="json")}


# ------------------------------------------------------------------------------- mutations
def _annotation_parts(cls: type, field: str) -> tuple[Any, tuple]:
    info = cls.model_fields[field]
    return info.annotation, tuple(info.metadata)


def _dispatch(tp: Any, meta: tuple) -> Dispatch | None:
    for m in (*meta, *getattr(tp, "__metadata__", ())):
        if isinstance(m, Dispatch):
            return m
    for arg in typing.get_args(tp):
        found = _dispatch(arg, ())
        if found:
            return found
    return None


def _kinds(tp: Any, meta: tuple) -> Kinds | None:
    for m in (*meta, *getattr(tp, "__metadata__", ())):
        if isinstance(m, Kinds):
            return m
    for arg in typing.get_args(tp):
        found = _kinds(arg, ())
        if found:
            return found
    return None


def _types(tp: Any) -> list[Any]:
    if typing.get_origin(tp) is typing.Annotated:
        return _types(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType):
        return [t for a in typing.get_args(tp) for t in _types(a)]
    return [tp]


def candidates(cls: type, field: str, value: Any) -> list[Any]:
    """Values other than ``value`` for ``cls.field`` (plain data, as a spec file holds)."""
    tp, meta = _annotation_parts(cls, field)
    dispatch = _dispatch(tp, meta)
    types = _types(tp)
    out: list[Any] = []
    if dispatch is not None:
        current = getattr(value, "kind", None)
        out += [{"kind": k} for k in registry(dispatch.part).names() if k != current]
    kinds = _kinds(tp, meta)
    if kinds is not None:
        current = getattr(value, "kind", None)
        out += [{"kind": k, **KIND_EXAMPLES.get(k, {})} for k in kinds.names() if k != current]
        types = [t for t in types if t is type(None)]
    for t in types:
        origin = typing.get_origin(t)
        if t is bool:
            out.append(not value)
        elif origin is typing.Literal:
            out += [v for v in typing.get_args(t) if v != value]
        elif t is int:
            out += [v for v in ((value or 1) + 1, (value or 1) * 2, 1, 3) if v != value]
        elif t is float:
            out += [v for v in ((value or 1.0) * 0.5, (value or 1.0) * 2, 0.1) if v != value]
        elif origin is list and typing.get_args(t) and typing.get_args(t)[0] is LayerPattern:
            out += [[{"at": 0, "block": {"attention": {"window": 2}}}], [{"at": 0, "position": {"kind": "none"}}],
                    [{"at": -1, "block": {"ffn": {"hidden": 16}}}],
                    [{"at": 0, "block": {"ffn": {"kind": "swiglu", "hidden": 16, "bias": False}}}],  # a dense layer
                    [{"at": -1, "block": {"ffn": {"kind": "moe", "n_experts": 3, "top_k": 2, "expert": {"kind": "swiglu", "hidden": 8}}}}]]
        elif origin is list:
            out += [[8], [8, 8]] + ([[2 * v for v in value]] if value else [])
        elif origin is dict:  # a mapping of names to numbers (a classifier's label ids)
            out.append({"x": 0})
        elif isinstance(t, type) and issubclass(t, Spec) and value is None:
            out.append({"channels": [8]} if "channels" in t.model_fields else {})
    if type(None) in types and value is not None:
        out.append(None)
    return out


def _set(data: dict, path: list[str], value: Any) -> dict:
    import copy

    data = copy.deepcopy(data)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def mutations(spec: FamilySpec, depth: int = 2) -> Iterator[tuple[list[str], type, str, FamilySpec]]:
    """(the dotted paths changed, the field's class, field name, a valid spec with that field
    changed), reaching into parts switched to another kind and sections switched on (whose own
    path comes first), ``depth`` levels deep."""
    yield from _walk(spec, spec, [], depth, [])


def _walk(root: FamilySpec, node: Spec, path: list[str], depth: int,
          origin: list[str]) -> Iterator[tuple[list[str], type, str, FamilySpec]]:
    cls = type(node)
    for field in cls.model_fields:
        value = getattr(node, field)
        here = [*path, field]
        if field in FREE and not path or field == "family":
            continue
        if isinstance(value, Spec):
            yield from _walk(root, value, here, depth, origin)
        for candidate in candidates(cls, field, value):
            try:
                changed = parse_spec(_set(root.model_dump(mode="json"), here, candidate))
            except (SpecError, KeyError, TypeError):
                continue
            yield [*origin, ".".join(here)], cls, field, changed
            if depth > 1 and isinstance(candidate, dict):
                new = changed
                for part in here:
                    new = getattr(new, part)
                if isinstance(new, Spec) and type(new) is not type(value):
                    yield from _walk(changed, new, here, depth - 1, [*origin, ".".join(here)])


# ------------------------------------------------------------------------------- the tests
def _names_field(message: str, path: str) -> bool:
    """The refusal names the field: its path, or a field of its section below the top (mqa as
    ``block.attention.kind`` is refused as ``block.attention.n_kv_heads=1``), or its own name."""
    parts = path.split(".")
    shortest = 1 if len(parts) == 1 else 2
    return any(".".join(parts[:i]) + sep in message for sep in "=:." for i in range(shortest, len(parts) + 1)) \
        or parts[-1] in message


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in SWEPT])
def test_every_field_round_trips_or_is_refused_by_name(name):
    tried = refused = 0
    for base in base_specs(name):
        assert canonical(convert_back(name, base)[1].spec) == canonical(base)
        for paths, _, _, spec in mutations(base):
            tried += 1
            path = paths[-1]
            try:
                model, back = convert_back(name, spec)
            except ConversionError as e:
                refused += 1
                assert any(_names_field(str(e), p) for p in paths), f"{name}: {paths} refused without naming it: {e}"
                continue
            if (name, path) in EQUIVALENT:
                continue
            assert canonical(back.spec) == canonical(spec), f"{name}: {path} converts but reads back otherwise"
            theirs = back.state_dict()
            assert all(torch.equal(t, theirs[k]) for k, t in model.state_dict().items()), f"{name}: {path}: weights differ"
    assert tried > 40 and 0 < refused < tried


def test_generation_reaches_every_field_of_every_builtin_spec():
    """Every field of every built-in spec class (families, each registry's kinds, their sections) is
    changed in some converter's base spec, so no field escapes the test above."""
    reached = {(cls, field) for name in CONVERTERS for base in base_specs(name) for _, cls, field, _ in mutations(base)}
    classes: list[type] = []
    for part, reg in REGISTRIES.items():
        for kind in reg.names():
            cls = reg.spec(kind)
            if cls.__module__.startswith("zoo.spec") and cls not in classes:
                classes.append(cls)
    for cls in classes:  # grows as sections are found
        for field, info in cls.model_fields.items():
            kinds = _kinds(info.annotation, tuple(info.metadata))
            for inner in kinds.kinds.values() if kinds is not None else ():
                if inner not in classes:
                    classes.append(inner)
            for t in [info.annotation, *typing.get_args(info.annotation)]:
                for inner in [t, *typing.get_args(t)]:
                    if isinstance(inner, type) and issubclass(inner, Spec) and not issubclass(inner, ComponentSpec) \
                            and inner not in classes:
                        classes.append(inner)
    from zoo.spec import InitSpec

    free = {(FamilySpec, f) for f in (*FREE, "family")} | {(LayerPattern, f) for f in LayerPattern.model_fields}
    free |= {(InitSpec, f) for f in InitSpec.model_fields}  # never changes what a converted model computes
    from zoo.spec import ParallelBlockSpec

    free.add((ParallelBlockSpec, "cross_attention"))  # no valid spec has one: decoders have no cross-attention
    from zoo.spec import MLASpec

    free |= {(MLASpec, f) for f in ("key_bias", "qk_norm", "sinks", "gate", "temperature")}  # no valid mla spec changes them: its own validator refuses
    from zoo.spec import DisentangledSpec

    free |= {(DisentangledSpec, f) for f in ("chunk", "gate", "key_bias", "qk_norm", "scale", "scale_dim", "sinks",
                                             "softcap", "temperature", "window")}  # no valid disentangled spec changes them: its validator refuses

    from zoo.spec import GatedDeltaNetSpec

    free |= {(GatedDeltaNetSpec, f) for f in ("bias", "chunk", "gate", "key_bias", "out_bias", "qk_norm", "scale",
                                              "scale_dim", "sinks", "softcap", "temperature", "window")}  # the mixer has none of them: its validator refuses

    def container(cls: type, field: str) -> bool:  # a section always present: its own fields are what changes
        tp = cls.model_fields[field].annotation
        return isinstance(tp, type) and issubclass(tp, Spec) and not issubclass(tp, ComponentSpec)

    missing = sorted(f"{cls.__name__}.{field}" for cls in classes for field in cls.model_fields
                     if field != "kind" and not container(cls, field)
                     and not any(issubclass(cls, c) and f == field for c, f in free)
                     and not any(issubclass(c, cls) and f == field for c, f in reached))
    assert not missing, f"fields no converter's base spec exercises: {missing}"
