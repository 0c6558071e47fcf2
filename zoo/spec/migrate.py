"""Spec mappings written by zoo 0.1 read as today's, each renamed field with a one-line note.

0.1 spelled the block arrangement as the norm's ``placement`` (and a ``parallel`` field), and the
head's options as family fields (``tie_embeddings``, ``head_bias``, ``mlm_head``, a ViT's
``num_classes``). :func:`migrate` rewrites a mapping that uses them to the ``block.kind`` and
``head`` of today, warning once per field with a :class:`SpecNote`; a mapping without them is
returned as it is. Files (``zoo.load``) and spec YAML both pass through it.
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from typing import Any

__all__ = ["LegacyConflict", "SpecNote", "migrate"]


class SpecNote(UserWarning):
    """A spec field read under its new name (see :func:`migrate`)."""


_ZOO = str(Path(__file__).parents[1])


def _caller_level() -> int:
    """The stack level of the first frame outside zoo, so the note names the user's line."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_ZOO):
        frame, level = frame.f_back, level + 1
    return level


def _note(source: str | None, old: str, new: str) -> None:
    if source is None:  # notes off
        return
    where = f"{source}: " if source else ""
    warnings.warn(f"{where}{old} is {new} since zoo 0.2; write the new field", SpecNote, stacklevel=_caller_level())


class LegacyConflict(ValueError):
    """0.1 fields that ask for different things, or for something today's fields say otherwise: read
    as one of them, the other would be dropped without a word, so the spec is refused."""


def _block(block: dict, source: str) -> None:
    norm = block.get("norm") if isinstance(block.get("norm"), dict) else {}
    parallel = block.pop("parallel", None) if "parallel" in block else None
    placement = norm.pop("placement", None) if isinstance(norm, dict) and "placement" in norm else None
    if parallel is not None and parallel is not False and not isinstance(parallel, dict):
        raise LegacyConflict(f"block.parallel: {parallel!r} is not the 0.1 field's mapping {{shared_norm: ...}}; "
                             f"write block.kind: parallel (and block.shared_norm)")
    kind = "parallel" if isinstance(parallel, dict) else placement
    if isinstance(parallel, dict) and placement not in (None, "pre"):
        raise LegacyConflict(f"block.parallel and block.norm.placement: {placement} conflict: a parallel block normalizes "
                             f"before its branches (pre), and the 0.1 fields cannot ask for both; write block.kind: "
                             f"parallel or block.kind: {placement}")
    if kind is not None and block.get("kind") not in (None, kind):
        old = "block.parallel" if isinstance(parallel, dict) else f"block.norm.placement: {placement}"
        raise LegacyConflict(f"block.kind: {block['kind']} conflicts with the 0.1 field {old} (block.kind: {kind}); "
                             f"keep block.kind alone")
    if placement is not None and not isinstance(parallel, dict):
        _note(source, f"block.norm.placement: {placement}", f"block.kind: {placement}")
        block["kind"] = placement
    if isinstance(parallel, dict):
        _note(source, "block.parallel", "block.kind: parallel (with its shared_norm)")
        block["kind"] = "parallel"
        block["shared_norm"] = bool(parallel.get("shared_norm", False))


def migrate(data: dict[str, Any], source: str = "", *, notes: bool = True) -> dict[str, Any]:
    """``data`` with 0.1's field names rewritten (a copy), or ``data`` itself when it has none; a
    note per field unless ``notes`` is off (a file written by zoo 0.1, which nobody edits)."""
    source = source if notes else None
    old_block = isinstance(data.get("block"), dict) and (
        "parallel" in data["block"] or "placement" in (data["block"].get("norm") or {})
    )
    old_head = any(k in data for k in ("tie_embeddings", "head_bias", "mlm_head")) or (
        data.get("family") == "vit" and "num_classes" in data
    )
    if not (old_block or old_head):
        return data
    data = copy.deepcopy(data)
    if old_block:
        _block(data["block"], source)
    if old_head:
        head = dict(data.get("head") or {}) if isinstance(data.get("head"), dict) else {}
        if data.get("family") == "vit":
            head = {"kind": "linear", **head, "num_classes": data.pop("num_classes")}
            _note(source, "num_classes", "head.num_classes (head: {kind: linear, num_classes: N})")
        else:
            mlm = data.pop("mlm_head", None)
            kind = head.get("kind") or ("mlm" if data.get("family") == "encoder" else "lm")
            head["kind"] = kind
            if mlm is not None:
                head["transform"] = bool(mlm.get("transform", True)) if isinstance(mlm, dict) else mlm
                _note(source, "mlm_head", "head (head: {kind: mlm, transform: ...})")
            for old, new in (("tie_embeddings", "tied"), ("head_bias", "bias")):
                if old in data:
                    head[new] = data.pop(old)
                    _note(source, old, f"head.{new}")
        data["head"] = head
    return data
