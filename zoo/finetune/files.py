"""Adapter files: what an adapter trained, tied to the base model it was trained on.

    save_adapters(model, "adapters.safetensors", base="llama-tiny.safetensors")
    model = zoo.load("llama-tiny.safetensors")
    load_adapters(model, "adapters.safetensors")   # adapts the model as the file says, then loads

The file is a plain safetensors file of the adapted model's tensors that its spec does not build
(the adapters: ``stack.blocks.0.attn.qkv.lora_a.q``, ...) and of its ``trainable`` parameters (a new
head), under their state-dict names, with string metadata

    zoo.adapter     the adapter's spec as JSON (kind, rank, targets, trainable, ...)
    zoo.base_spec   the model's spec as JSON (``model.spec``)
    zoo.base_hash   :func:`base_hash` of the base weights, "sha256:<64 hex digits>"
    zoo.base        where the base weights came from, as the writer said (``base=``); optional
    zoo.version     the zoo that wrote it
    format          "pt"

Adapters mean nothing on weights other than those they were trained on, so :func:`load_adapters`
refuses a model of another spec (naming the fields that differ) or with other base weights (naming
both hashes). ``zoo.load`` refuses an adapter file, saying what reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from zoo._version import __version__
from zoo.atomic import atomic_path
from zoo.build import build
from zoo.finetune.spec import ADAPTER_ATTR, ADAPTERS, AdapterSpec, adapter_of, adapter_spec
from zoo.io import KEY_ADAPTER, KEY_SPEC, KEY_VERSION, LoadError, SaveError, one_line, read_header
from zoo.spec import FamilySpec

__all__ = ["KEY_BASE", "KEY_BASE_HASH", "KEY_BASE_SPEC", "adapt", "base_hash", "load_adapters", "save_adapters"]

KEY_BASE_SPEC, KEY_BASE_HASH, KEY_BASE = "zoo.base_spec", "zoo.base_hash", "zoo.base"


def adapt(model: nn.Module, spec: AdapterSpec | Mapping[str, Any]) -> nn.Module:
    """Adapt ``model`` in place with the adapter ``spec`` (a spec, or a ``{kind: lora, ...}``
    mapping) by its kind's builder in :data:`zoo.finetune.ADAPTERS`; returns ``model``."""
    spec = adapter_spec(spec)
    model = ADAPTERS.builder(spec.kind)(spec, model=model)
    setattr(model, ADAPTER_ATTR, spec)
    return model


def _spec_of(model: nn.Module) -> FamilySpec:
    spec = getattr(model, "spec", None)
    if not isinstance(spec, FamilySpec):
        raise ValueError(f"a {type(model).__name__} without a zoo spec (model.spec): adapters are saved for and "
                         f"loaded into models made by zoo.build or zoo.load")
    return spec


def _trained(name: str, trainable: tuple[str, ...]) -> bool:
    return any(name == t or name.startswith(t + ".") for t in trainable)


def _parts(model: nn.Module, trainable: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(base, own): the names of ``model``'s state dict that its spec builds, less the trainable ones
    (and less any tensor shared with one: a tied head), and the names the file holds: the adapters'
    (what the spec does not build) and the trainable ones."""
    built = set(build(_spec_of(model), device="meta").state_dict())
    state = model.state_dict(keep_vars=True)
    trained = {id(t) for n, t in state.items() if n in built and _trained(n, trainable)}
    base = [n for n, t in state.items() if n in built and id(t) not in trained]
    own = [n for n, t in state.items() if n not in built] + [n for n, t in state.items() if n in built and id(t) in trained]
    return base, own


def base_hash(model: nn.Module, trainable: tuple[str, ...] = ()) -> str:
    """SHA-256 of ``model``'s base weights: in sorted name order, each tensor's name, dtype, shape and
    raw bytes (a tensor shared by several names hashed once, the later names pointing at the first),
    over every tensor its spec builds but the ``trainable`` ones and those tied to them. Adapters
    are not part of it, so an adapted model hashes as its base does. "sha256:<hex>"."""
    state = model.state_dict(keep_vars=True)
    digest = hashlib.sha256()
    first: dict[int, str] = {}
    for name in sorted(_parts(model, trainable)[0]):
        t = state[name].detach()
        if t.is_meta:
            raise ValueError("base_hash: the model is on the meta device and has no weights; load them first")
        digest.update(f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0".encode())
        if id(state[name]) in first:
            digest.update(f"={first[id(state[name])]}\0".encode())
            continue
        first[id(state[name])] = name
        digest.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return "sha256:" + digest.hexdigest()


def save_adapters(model: nn.Module, path: str | os.PathLike, *, base: str | None = None) -> Path:
    """Write ``model``'s adapters and trainable parameters to a safetensors file, atomically, with
    the metadata of the module's docstring; returns the path. ``base`` records where the base weights
    came from (a file, a preset, a hub id), shown when a load is refused."""
    spec = adapter_of(model)
    if spec is None:
        raise SaveError("save_adapters: the model has no adapter; adapt it first (zoo.finetune.apply_lora)")
    state = model.state_dict(keep_vars=True)
    tensors, seen = {}, set()
    for name in _parts(model, spec.trainable)[1]:
        if id(state[name]) not in seen:  # a tied tensor once, under its first name
            seen.add(id(state[name]))
            tensors[name] = state[name].detach().cpu().contiguous()
    meta = {"format": "pt", KEY_ADAPTER: json.dumps(spec.model_dump(mode="json"), separators=(",", ":")),
            KEY_BASE_SPEC: json.dumps(_spec_of(model).model_dump(mode="json"), separators=(",", ":")),
            KEY_BASE_HASH: base_hash(model, spec.trainable), KEY_VERSION: __version__}
    if base is not None:
        meta[KEY_BASE] = str(base)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return Path(path)


def _differences(theirs: Any, mine: Any, path: str = "") -> list[str]:
    """The dotted fields where two specs' JSON differ, each with both values."""
    if isinstance(theirs, dict) and isinstance(mine, dict):
        out = []
        for key in sorted(set(theirs) | set(mine), key=str):
            out += _differences(theirs.get(key), mine.get(key), f"{path}.{key}" if path else str(key))
        return out
    return [] if theirs == mine else [f"{path or 'spec'}: the file's {json.dumps(theirs)}, the model's {json.dumps(mine)}"]


def load_adapters(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Adapt ``model`` (a zoo model holding the base weights) as the file says, unless it already
    is so, and load the file's tensors into it; returns ``model``. Refuses, as :class:`zoo.io.LoadError`,
    a file made for another spec or other base weights, and tensors that do not fit."""
    header = read_header(path)
    label, meta = repr(str(header.path)), header.metadata
    if KEY_ADAPTER not in meta:
        also = "; it is a model file, which zoo.load reads" if KEY_SPEC in meta else ""
        raise LoadError(f"{label} holds no adapters (no {KEY_ADAPTER} in its metadata){also}")
    try:
        spec = adapter_spec(json.loads(meta[KEY_ADAPTER]))
        theirs = json.loads(meta.get(KEY_BASE_SPEC, "null"))
    except ValueError as e:  # JSON or validation errors
        raise LoadError(f"{label}: cannot read its adapter metadata: {one_line(e)}") from None
    mine = _spec_of(model).model_dump(mode="json")
    if theirs != mine:
        differ = _differences(theirs, mine)
        shown = "; ".join(differ[:3]) + (f"; and {len(differ) - 3} more" if len(differ) > 3 else "")
        raise LoadError(f"{label} was made for another model spec ({shown}); build the model it was trained on")
    want, got = meta.get(KEY_BASE_HASH), base_hash(model, spec.trainable)
    if want != got:
        where = f" ({meta[KEY_BASE]})" if KEY_BASE in meta else ""
        raise LoadError(f"{label} was made for other base weights: the file's base hash is {want}, this model's {got}; "
                        f"load the weights it was trained on{where} into the model first")
    current = adapter_of(model)
    if current is None:
        adapt(model, spec)
    elif current != spec:
        raise LoadError(f"{label}: the model already has another adapter ({current!r}); load into the base model")
    state = model.state_dict(keep_vars=True)
    own = _parts(model, spec.trainable)[1]
    stored = {n: shape for n, (_, shape) in header.tensors.items()}
    unexpected = [n for n in stored if n not in state]
    wrong = [f"{n} is {list(s)}, the model needs {list(state[n].shape)}" for n, s in stored.items()
             if n in state and tuple(s) != tuple(state[n].shape)]
    covered = {id(state[n]) for n in stored if n in state}
    missing = [n for n in own if id(state[n]) not in covered]
    problems = [f"{what}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                for what, names in (("unexpected tensors", unexpected), ("wrong shapes", wrong), ("missing tensors", missing))
                if names]
    if problems:
        raise LoadError(f"{label} does not fit the adapted model: {'; '.join(problems)}")
    with torch.no_grad(), safe_open(str(header.path), framework="pt", device="cpu") as f:
        for n in stored:
            state[n].copy_(f.get_tensor(n))
    return model
