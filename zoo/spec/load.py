"""Spec files: YAML in (strict: duplicate keys are errors) and out, shipped presets, dotted
``a.b.c=value`` overrides, and validation with messages that name each bad field and the fix."""

from __future__ import annotations

import json
import os
import reprlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from zoo.registry import RegistryError, registry, suggest
from zoo.spec.base import Dispatch, Kinds, Spec
from zoo.spec.families import FamilySpec, ModelSpec
from zoo.spec.migrate import LegacyConflict, migrate
from zoo.validation import validation_message

__all__ = [
    "PRESETS_DIR", "SpecError", "apply_overrides", "json_schema", "load_spec", "parse_spec", "preset_names", "preset_path",
    "read_yaml", "to_yaml",
]

PRESETS_DIR = Path(__file__).parents[1] / "presets"  # zoo/presets


class SpecError(ValueError):
    """A spec that cannot be used; the message names each bad field and the fix."""


# ----------------------------------------------------------------------------------- errors, YAML
def _format_errors(err: ValidationError, source: str) -> SpecError:
    return SpecError(validation_message(err, f"spec {source}"))


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def read_yaml(text: str, source: str) -> Any:
    """Parse YAML text with the strict safe loader; errors name the source and line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        raise SpecError(f"cannot parse {source} as YAML: {e}") from None


def preset_names() -> list[str]:
    """The shipped presets, by name."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        names = preset_names()
        raise SpecError(
            f"unknown preset {name!r}{suggest(name, names)} (presets: {', '.join(names)}; "
            f"or give the path of a YAML file)"
        )
    return path


def _read_source(source: str | os.PathLike) -> tuple[dict, str]:
    text_source = str(source)
    path = Path(source)
    looks_like_path = path.suffix in (".yaml", ".yml") or "/" in text_source or path.is_file()
    if not looks_like_path:
        path = preset_path(text_source)
        label = f"preset {text_source!r}"
    else:
        label = f"file {text_source!r}"
        if not path.is_file():
            raise SpecError(f"no spec file at {text_source!r} (and it is not a preset: {', '.join(preset_names())})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read {label}: {e}") from None
    data = read_yaml(text, label)
    if not isinstance(data, dict):
        raise SpecError(f"{label} must hold a mapping of spec fields (family: ..., d_model: ...), got {type(data).__name__}")
    return data, label


# ------------------------------------------------------------------------------------- overrides
def _registry_at(data: dict, path: list[str]) -> str | Kinds | None:
    """The registry whose ``kind`` the mapping at ``path`` chooses (or the fixed :class:`Kinds` it
    chooses from), found by walking the spec classes."""
    try:
        cls: Any = registry("family").spec(data.get("family"))
    except RegistryError:
        return None
    for i, key in enumerate(path):
        field = getattr(cls, "model_fields", {}).get(key)
        if field is None:
            return None
        dispatch = next((m for m in field.metadata if isinstance(m, Dispatch)), None)
        if dispatch is None and field.annotation is not None:
            meta = getattr(field.annotation, "__metadata__", ())
            for arg in getattr(field.annotation, "__args__", ()):
                meta = meta + getattr(arg, "__metadata__", ())
            dispatch = next((m for m in meta if isinstance(m, Dispatch)), None)
        if i == len(path) - 1:
            if dispatch is None:  # a closed choice within a part (a rope's scaling)
                return next((m for m in _metadata(field.annotation) if isinstance(m, Kinds)), None)
            return dispatch.part
        if dispatch is not None:
            sub = _get(data, path[: i + 1])
            try:
                cls = registry(dispatch.part).spec(sub.get("kind") or dispatch.default)
            except (RegistryError, AttributeError):
                return None
        else:
            ann = field.annotation
            cls = next((a for a in (ann, *getattr(ann, "__args__", ())) if isinstance(a, type) and issubclass(a, Spec)), None)
            if cls is None:
                return None
    return None


def _metadata(tp: Any) -> list:
    """The Annotated metadata anywhere in a type (``X | None`` included)."""
    return [*getattr(tp, "__metadata__", ()), *(m for arg in getattr(tp, "__args__", ()) for m in _metadata(arg))]


def _get(data: dict, path: list[str]) -> Any:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def apply_overrides(data: dict, overrides: Iterable[str]) -> dict:
    """Apply ``a.b.c=value`` overrides to a spec mapping (values parsed as YAML: 4, 0.1, true, null).

    Setting a ``kind`` keeps only the sibling keys the new kind's spec knows, so
    ``position.kind=rope`` on a sinusoidal preset drops ``layout`` instead of failing on it.
    """
    data = json.loads(json.dumps(data))  # a deep copy of plain data
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise SpecError(f"override {item!r} must look like key.path=value, e.g. block.attention.n_heads=8")
        key, raw = item.split("=", 1)
        path = [p.strip() for p in key.strip().split(".")]
        if not all(path):
            raise SpecError(f"override {item!r}: empty key in {key!r}")
        value = read_yaml(raw, f"the value of override {item!r}") if raw.strip() else ""
        node = data
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise SpecError(f"override {item!r}: {where} is {child!r}, not a mapping with fields")
            node = child
        node[path[-1]] = value
        if path[-1] == "kind":
            part = _registry_at(data, path[:-1])
            known = None
            if isinstance(part, Kinds) and value in part.kinds:
                known = part.kinds[value].model_fields
            elif isinstance(part, str) and value in registry(part):
                known = registry(part).spec(value).model_fields
            for k in [k for k in node if known is not None and k not in known]:
                del node[k]
    return data


# ------------------------------------------------------------------------------------ public API
def parse_spec(data: Mapping[str, Any] | FamilySpec, *, source: str = "", notes: bool = True) -> FamilySpec:
    """Validate a mapping as a model spec (any registered family). Fields spelled as zoo 0.1 spelled
    them are read as today's (:mod:`zoo.spec.migrate`), each with a ``SpecNote`` where ``notes``."""
    if isinstance(data, FamilySpec):
        return data
    if not isinstance(data, Mapping):
        raise SpecError(f"a spec must be a mapping, got {type(data).__name__}")
    if "family" not in data:
        raise SpecError(f"spec {source}: missing 'family' (one of {', '.join(registry('family').names())})")
    try:
        cls = registry("family").spec(data["family"])
    except RegistryError as e:
        raise SpecError(f"spec {source}: family: {e}") from None
    try:
        return cls.model_validate(migrate(dict(data), source, notes=notes))
    except LegacyConflict as e:
        raise SpecError(f"spec {source}: {e}" if source else str(e)) from None
    except ValidationError as e:
        raise _format_errors(e, source or "") from None


def load_spec(
    source: str | Path | Mapping[str, Any] | FamilySpec, overrides: Iterable[str] = ()
) -> FamilySpec:
    """A validated spec from a preset name, a YAML file path, a mapping or a spec, plus overrides.

    >>> load_spec("gpt2-small", overrides=["position.kind=rope", "block.ffn.kind=swiglu"])
    """
    overrides = list(overrides)
    if isinstance(source, FamilySpec):
        data, label = source.model_dump(mode="json"), f"{source.name or source.family!r}"
    elif isinstance(source, Mapping):
        data, label = dict(source), "mapping"
    elif isinstance(source, (str, os.PathLike)):
        data, label = _read_source(source)
    else:
        raise SpecError(f"a spec comes from a preset name, a YAML file path, a mapping or a FamilySpec, "
                        f"not {type(source).__name__} {reprlib.repr(source)}")
    if overrides:
        data = apply_overrides(data, overrides)
        label = f"{label} with overrides {overrides}"
    return parse_spec(data, source=label)


def to_yaml(spec: FamilySpec) -> str:
    """The spec as YAML, every field spelled out (defaults included), readable by load_spec."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


def json_schema() -> dict:
    """JSON Schema of spec files (any family), for editor completion and validation."""

    class SpecFile(BaseModel):
        spec: ModelSpec

    schema = SpecFile.model_json_schema()
    body = schema["properties"]["spec"]
    body["$defs"] = schema.get("$defs", {})
    body["title"] = "zoo model spec"
    return body
