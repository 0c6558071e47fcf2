"""Write docs/spec-reference.md (families and sections), docs/spec-reference-components.md (the
attention, position and FFN kinds) and docs/spec-reference-blocks.md (the other parts chosen by ``kind``) from the spec classes in zoo.spec
and the registries.

    python docs/make_spec_reference.py           # rewrite the three pages
    python docs/make_spec_reference.py --check   # exit 1 if a committed page is stale

The reference covers the built-in parts (spec classes defined in zoo.spec), so parts a program
registers at run time never leak into it. Types, defaults and constraints are read from the
pydantic fields; descriptions come from ``Field(description=...)`` where the code gives one and
otherwise from ``GLOSSARY`` below. Class docstrings introduce each section.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from zoo import spec as zs
from zoo.registry import REGISTRIES

OUT = Path(__file__).resolve().parent / "spec-reference.md"
# The reference is one document rendered as three pages, split before its components and before the norm
# kinds, so that no page grows past the docs' length limit; links between them name the other page.
COMPONENTS_OUT = OUT.with_name("spec-reference-components.md")
BLOCKS_OUT = OUT.with_name("spec-reference-blocks.md")
COMMAND = "python docs/make_spec_reference.py"

# Descriptions of fields that carry no ``Field(description=...)`` in zoo.spec, keyed
# "Class.field"; a key applies to the class and its subclasses. The code's own description wins.
GLOSSARY: dict[str, str] = {
    "ComponentSpec.kind": "selects this part in its registry",
    "FamilySpec.family": "the model family; picks the spec class and the builder",
    "FamilySpec.d_model": "model width D: embedding and residual-stream size",
    "FamilySpec.n_layers": "number of blocks (per stack in an encoder-decoder)",
    "FamilySpec.block": "the parts of every layer",
    "FamilySpec.position": "how order information enters the model",
    "FamilySpec.dropout": "dropout rates by site",
    "FamilySpec.init": "weight initialisation",
    "TextSpec.vocab_size": "vocabulary size V (the output vocabulary of an encoder-decoder)",
    "TextSpec.embedding": "token embedding options",
    "EncoderSpec.classifier": "a sequence-classification head (enables `model.classify`); null for none",
    "VitSpec.image_size": "input height and width in pixels",
    "VitSpec.patch_size": "side of the square patches; must divide image_size",
    "VitSpec.in_channels": "image channels C",
    "VitSpec.class_token": "prepend a learned class token",
    "VitSpec.pool": "pooled feature: the class token (`cls`) or the mean of the patch tokens (`mean`)",
    "BlockSpec.attention": "self-attention (and the cross-attention when cross_attention is null)",
    "BlockSpec.ffn": "the position-wise feed-forward network",
    "BlockSpec.norm": "the norm kind of every sub-layer (where it sits is the block's kind)",
    "BlockSpec.kind": "how the layer arranges its norms and residuals: pre, post, post_sublayer, parallel, ...",
    "DropoutSpec.embedding": "on the embedding (+ position) sum",
    "DropoutSpec.residual": "on each sub-layer's output before the residual add",
    "InitSpec.scheme": "initialisation scheme for linear and embedding weights",
    "InitSpec.std": "standard deviation of the normal schemes",
    "InitSpec.scaled_residual": "divide the std of residual output projections by sqrt(2 * n_layers)",
    "EmbeddingSpec.scale": "multiply token embeddings by sqrt(d_model)",
    "EmbeddingSpec.norm": "a norm (the block's norm kind) after the embedding sum",
    "LinearHeadSpec.num_classes": "size of the classification output",
    "LayerPattern.at": "the layers it selects",
    "ClassifierSpec.num_labels": "number of classes",
    "ClassifierSpec.pooler": "a linear layer and its activation (tanh by default) on the pooled token before the classifier",
    "ClassifierSpec.dropout": "dropout before the classifier's linear",
    "AttentionSpec.kind": "mha (n_kv_heads = n_heads), gqa (n_kv_heads divides n_heads) or mqa (one key/value head)",
    "AttentionSpec.n_heads": "query heads H",
    "QKNormSpec.kind": "LayerNorm (with bias) or RMSNorm",
    "QKNormSpec.scope": "head: over each head's K features (weights [K]); all: over the whole q [H*K] and k [G*K]",
    "QKNormSpec.eps": "added to the variance (or mean square) for stability",
    "SinusoidalSpec.base": "wavelength base of the sinusoids",
    "SinusoidalSpec.layout": "interleaved (sin, cos alternate) or concat (all sines, then all cosines)",
    "RopeSpec.base": "rotation frequency base",
    "SinCos2dSpec.base": "wavelength base of the sinusoids",
    "FFNSpec.hidden": "hidden width F; null for the kind's default",
    "FFNSpec.bias": "biases on the linear layers",
    "GeluFFNSpec.approximate": "exact GELU (`none`) or its tanh approximation (`tanh`, GPT-2)",
    "GeGLUSpec.approximate": "exact GELU (`none`) or its tanh approximation (`tanh`)",
    "NormSpec.eps": "added to the variance (or mean square) for stability",
    "LayerNormSpec.bias": "a learned bias (beta)",
}


# catalog sections whose heading is not the kind (a kind that two registries share)
CATALOG_ANCHORS = {("head", "none"): "no-head"}
# The page of the component catalog that explains each registry's kinds.
CATALOG_PAGES = {"attention": "attention", "position": "positions", "ffn": "ffn", "norm": "norms-and-blocks",
                 "block": "norms-and-blocks", "head": "heads-and-pooling", "pool": "heads-and-pooling"}


def anchor(heading: str) -> str:
    """The fragment GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def prose(doc: str | None) -> str:
    """A docstring as one Markdown paragraph (reST ``code`` becomes `code`)."""
    if not doc:
        return ""
    text = " ".join(inspect.cleandoc(doc).split())
    return text.replace("``", "`")


def own_doc(cls: type, stop: tuple[type, ...]) -> str:
    """The first docstring on cls or its bases, not looking past ``stop``."""
    for klass in cls.__mro__:
        if klass in stop:
            break
        doc = klass.__dict__.get("__doc__")
        if doc:
            return prose(doc)
    return ""


def dispatch_of(meta: tuple) -> str | None:
    for m in meta:
        if isinstance(m, zs.Dispatch):
            return m.part
    return None


def constraint(meta: list) -> str:
    """Bounds as `> 0`, `>= 0` or an interval `in [0, 1)`."""
    lo = hi = None
    for m in meta:
        if isinstance(m, annotated_types.Gt):
            lo = ("(", m.gt)
        elif isinstance(m, annotated_types.Ge):
            lo = ("[", m.ge)
        elif isinstance(m, annotated_types.Lt):
            hi = (")", m.lt)
        elif isinstance(m, annotated_types.Le):
            hi = ("]", m.le)
    if lo and hi:
        return f"in {lo[0]}{lo[1]:g}, {hi[1]:g}{hi[0]}"
    if lo:
        return f"{'>' if lo[0] == '(' else '>='} {lo[1]:g}"
    if hi:
        return f"{'<' if hi[0] == ')' else '<='} {hi[1]:g}"
    return ""


def kinds_of(tp: Any, meta: tuple = ()) -> zs.Kinds | None:
    """The closed choice of kinds (:class:`zoo.spec.Kinds`) a field's type holds, if any."""
    for m in (*meta, *getattr(tp, "__metadata__", ())):
        if isinstance(m, zs.Kinds):
            return m
    return next((k for a in typing.get_args(tp) if (k := kinds_of(a)) is not None), None)


def _kind_anchor(kind: str, cls: type) -> str:
    """A closed choice's member: the section of the registered part it is (an moe FFN's expert:
    swiglu), else its class's own section (a RoPE scaling)."""
    from zoo.registry import REGISTRIES

    registered = any(kind in reg and reg.spec(kind) is cls for reg in REGISTRIES.values())
    return anchor(kind) if registered else anchor(cls.__name__)


def type_name(tp: Any, meta: list | tuple = ()) -> str:
    """A readable type: `int > 0`, `one of: a, b`, a link to a section or a registry."""
    part = dispatch_of(tuple(meta))
    if part is not None:
        return f"[{part}](#{anchor(part + ' kinds')}) (by `kind`)"
    kinds = next((m for m in meta if isinstance(m, zs.Kinds)), None)
    if kinds is not None:
        return " or ".join(f"[{k}](#{_kind_anchor(k, c)})" for k, c in kinds.kinds.items()) + " (by `kind`)"
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return type_name(tp.__origin__, list(tp.__metadata__) + list(meta))
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        names = [type_name(a, meta) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is typing.Literal:
        values = ", ".join(f"`{v}`" for v in typing.get_args(tp))
        return values if len(typing.get_args(tp)) == 1 else f"one of {values}"
    if origin is list and typing.get_args(tp):
        return f"list of {type_name(typing.get_args(tp)[0])}"
    if isinstance(tp, type) and issubclass(tp, zs.Spec):
        return f"[{tp.__name__}](#{anchor(tp.__name__)})"
    name = getattr(tp, "__name__", str(tp))
    rule = constraint(list(meta))
    return f"`{name}`" + (f" {rule}" if rule else "")


def scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def flow(data: dict) -> str:
    """A mapping in YAML flow style: {kind: rope, base: 10000.0}."""
    items = []
    for k, v in data.items():
        items.append(f"{k}: {flow(v) if isinstance(v, dict) else scalar(v)}")
    return "{" + ", ".join(items) + "}"


def changed(value: zs.Spec) -> dict:
    """The fields of a spec that differ from its class defaults (always the kind)."""
    base = type(value)().model_dump(mode="json")
    data = value.model_dump(mode="json")
    out = {k: v for k, v in data.items() if k == "kind" or v != base.get(k)}
    return out


def default_of(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, zs.Spec):
        diff = changed(value)
        return f"`{flow(diff)}`" if diff else "defaults"
    return f"`{scalar(value)}`"


def describe(cls: type, name: str, field: FieldInfo) -> str:
    if field.description:
        return field.description
    for klass in cls.__mro__:
        key = f"{klass.__name__}.{name}"
        if key in GLOSSARY:
            return GLOSSARY[key]
    return ""


def field_table(cls: type) -> list[str]:
    lines = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in cls.model_fields.items():
        row = (f"`{name}`", type_name(field.annotation, field.metadata), default_of(field), describe(cls, name, field))
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return lines


def nested_specs(cls: type, seen: list[type]) -> None:
    """Spec classes (not chosen by kind) reachable from cls's fields, in order of appearance."""
    for field in cls.model_fields.values():
        kinds = kinds_of(field.annotation, tuple(field.metadata))
        candidates = [field.annotation, *typing.get_args(field.annotation), *(kinds.kinds.values() if kinds else ())]
        for tp in candidates:
            if isinstance(tp, type) and issubclass(tp, zs.Spec) and not issubclass(tp, zs.ComponentSpec):
                if tp not in seen:
                    seen.append(tp)
                    nested_specs(tp, seen)


def builtin_kinds(part: str) -> list[tuple[list[str], type]]:
    """(kinds, spec class) for the built-in kinds of a registry, grouping kinds that share a class."""
    groups: dict[type, list[str]] = {}
    reg = REGISTRIES[part]
    for kind in reg.names():
        cls = reg.spec(kind)
        if cls.__module__.startswith(zs.__name__ + "."):  # defined in zoo.spec's modules
            groups.setdefault(cls, []).append(kind)
    def literal_order(cls: type, kinds: list[str]) -> list[str]:
        order = list(typing.get_args(cls.model_fields["kind"].annotation)) if "kind" in cls.model_fields else []
        return sorted(kinds, key=lambda k: order.index(k) if k in order else len(order))

    return [(literal_order(cls, kinds), cls) for cls, kinds in groups.items()]


def check_glossary() -> None:
    """Every glossary entry names a real field, so dead entries cannot linger."""
    for key in GLOSSARY:
        cls_name, _, field = key.partition(".")
        cls = getattr(zs, cls_name, None)
        if cls is None or field not in getattr(cls, "model_fields", {}):
            raise SystemExit(f"{__file__}: GLOSSARY entry {key!r} names no field of zoo.spec; remove or rename it")


def render() -> str:
    check_glossary()
    out = [
        "# Spec reference",
        "",
        f"<!-- Generated by docs/make_spec_reference.py; do not edit. Regenerate with: {COMMAND} -->",
        "",
        "Every field of every spec, read from `zoo.spec` and the registries. A spec file is a YAML mapping",
        "whose `family` picks one of the [families](#families); parts chosen by `kind` are listed under",
        "[components](#components). Unknown keys are errors. `null` means \"use the default the description",
        "names\". For the concepts see [the guide](guide.md), for the math of each part",
        "[the component catalog](components.md).",
        "",
        "## Families",
        "",
    ]
    sections: list[type] = []
    for kinds, cls in builtin_kinds("family"):
        nested_specs(cls, sections)
        for kind in kinds:
            out += [f"### {kind}", "", f"`family: {kind}` — `zoo.spec.{cls.__name__}`. {own_doc(cls, (zs.FamilySpec,))}", ""]
            out += field_table(cls) + [""]
    for part in REGISTRIES:  # mappings inside parts (an attention's qk_norm)
        if part != "family":
            for _, cls in builtin_kinds(part):
                nested_specs(cls, sections)
    out += ["## Sections", "", "Nested mappings shared by the families and parts.", ""]
    for cls in sections:
        out += [f"### {cls.__name__}", "", own_doc(cls, (zs.Spec,)), ""] + field_table(cls) + [""]
    out += [
        "## Components",
        "",
        "Each registry maps a `kind` to a spec class and a builder. A part registered with",
        "`zoo.register` is valid in a spec file like these (see [extending](extending.md)).",
        "",
    ]
    for part, reg in REGISTRIES.items():
        if part == "family":
            continue
        base = reg.spec_base
        out += [
            f"### {part} kinds",
            "",
            f"Spec base class: `zoo.spec.{base.__name__}`. {own_doc(base, (zs.ComponentSpec,))}",
            "",
            f"Builders are called as `builder(spec, *, {reg.context}, ...)`.",
            "",
        ]
        for kinds, cls in builtin_kinds(part):
            doc = own_doc(cls, (base,)) if cls is not base else ""
            heading = ", ".join(kinds)
            target = CATALOG_ANCHORS.get((part, heading), anchor(heading))
            catalog = f"Math and use: [component catalog](components/{CATALOG_PAGES[part]}.md#{target})."
            out += [f"#### {heading}", "", f"`zoo.spec.{cls.__name__}`. {doc} {catalog}".replace("  ", " "), ""]
            out += field_table(cls) + [""]
    return "\n".join(line.rstrip() for line in out).rstrip() + "\n"


def _anchors(text: str) -> set[str]:
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def render_pages() -> dict[Path, str]:
    """The reference split into its three pages (families and sections; attention, position and FFN
    kinds; the other kinds), each ``](#x)`` link to another page's heading rewritten to name that page."""
    text = render()
    at, rest = text.index("\n## Components\n"), text.index("\n### norm kinds\n")
    pages = {
        OUT: text[:at + 1] + "\n".join([
            "## Components",
            "",
            "The parts chosen by `kind` are on their own pages: attention, position and FFN kinds in",
            f"[spec reference: components]({COMPONENTS_OUT.name}); norm, pool, block and head kinds in",
            f"[spec reference: blocks]({BLOCKS_OUT.name}).",
            "",
        ]),
        COMPONENTS_OUT: "\n".join([
            "# Spec reference: components",
            "",
            f"<!-- Generated by docs/make_spec_reference.py; do not edit. Regenerate with: {COMMAND} -->",
            "",
            "The attention, position and FFN kinds of a spec; the families and the shared sections are in the",
            f"[spec reference]({OUT.name}), the norm, pool, block and head kinds in [its blocks page]({BLOCKS_OUT.name}).",
            "",
        ]) + text[at:rest + 1].replace("## Components\n", "## Component kinds\n", 1),
        BLOCKS_OUT: "\n".join([
            "# Spec reference: blocks",
            "",
            f"<!-- Generated by docs/make_spec_reference.py; do not edit. Regenerate with: {COMMAND} -->",
            "",
            "The norm, pool, block and head kinds of a spec; the families and the shared sections are in the",
            f"[spec reference]({OUT.name}), the attention, position and FFN kinds in [its components page]"
            f"({COMPONENTS_OUT.name}).",
            "",
            "## Component kinds",
        ]) + text[rest:],
    }
    owned = {path: _anchors(page) for path, page in pages.items()}

    def link(path: Path, m: re.Match) -> str:
        if m[1] in owned[path]:
            return m[0]
        other = next((p for p in pages if m[1] in owned[p]), path)
        return f"]({other.name}#{m[1]})"

    return {path: re.sub(r"\]\(#([\w-]+)\)", lambda m, p=path: link(p, m), page) for path, page in pages.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed page is stale")
    args = parser.parse_args(argv)
    pages = render_pages()
    if args.check:
        stale = [path for path, text in pages.items() if not path.is_file() or path.read_text(encoding="utf-8") != text]
        for path in stale:
            print(f"{path} is stale; run: {COMMAND}", file=sys.stderr)
        return 1 if stale else 0
    for path, text in pages.items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
