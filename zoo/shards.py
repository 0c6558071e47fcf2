"""Safetensors files written and read one tensor at a time, in one file or in shards.

    write_files(base, entries, tensors, max_shard_size=..., single=..., shard=..., index=...)
    read_files(path) -> Files            # names -> (file, dtype, shape), read without any tensor data
    Files.read(name) -> Tensor           # one tensor, from its file

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype,
shape and byte range, and string ``__metadata__``), then the tensors' bytes. Knowing every
tensor's name, dtype and shape beforehand (from a model built on the meta device) is enough to
write the header first and then each tensor as it is made, so a writer holds one tensor at a
time, never the whole state dict (safetensors' own ``save_file`` takes them all at once).

Above ``max_shard_size`` bytes the tensors go to several files, as HF's ``save_pretrained`` lays
them out: for a base path ``dir/model.safetensors``, the shards ``dir/model-00001-of-00003.safetensors``
... and the index ``dir/model.safetensors.index.json`` ({"metadata": {...}, "weight_map": {tensor
name: shard file name}}). A tensor larger than the limit gets a shard of its own.

Reading opens the tensor's file for that one tensor and closes it again: safetensors maps the file
into memory, and pages of a mapping that stays open count towards the process's resident memory
for as long as it does, so reading a whole checkpoint through one open file would end with all of
it resident. Each file is written beside its target and renamed into place (zoo.atomic).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from zoo.atomic import atomic_path, atomic_write_text

__all__ = [
    "DEFAULT_MAX_SHARD_SIZE", "DTYPES", "Entry", "Files", "ShardError", "index_path", "parse_size", "read_files",
    "resolve", "shard_paths", "tie_groups", "write_files",
]

# safetensors dtype names -> torch names and sizes in bytes
DTYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1), "I64": ("int64", 8), "I32": ("int32", 4),
    "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1), "BOOL": ("bool", 1),
}
_ST_NAME = {getattr(torch, name): st for st, (name, _) in DTYPES.items() if hasattr(torch, name)}
DEFAULT_MAX_SHARD_SIZE = "5GB"  # as the Hugging Face Hub's checkpoints
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class ShardError(ValueError):
    """A set of files that cannot be read (a missing or unreadable shard, an index naming tensors its
    shards lack) or a size that cannot be parsed. One line, naming the file."""


def parse_size(size: int | str | None) -> int | None:
    """Bytes of ``size``: an int, or a string with a unit as HF writes it ("5GB" = 5 * 10**9,
    "500MiB" = 500 * 2**20, "20KB"); None means no limit."""
    if size is None or (isinstance(size, int) and not isinstance(size, bool)):
        if isinstance(size, int) and size <= 0:
            raise ShardError(f"max_shard_size must be positive, got {size}")
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise ShardError(f"max_shard_size {size!r} is not a size; write bytes or a number with a unit "
                         f"such as '5GB', '500MB', '20KB' or '2GiB'")
    return int(float(m.group(1)) * _UNITS[unit])


def index_path(base: Path) -> Path:
    """``dir/model.safetensors`` -> ``dir/model.safetensors.index.json``."""
    return base.with_name(base.name + ".index.json")


def shard_paths(base: Path, n: int) -> list[Path]:
    """``dir/model.safetensors`` -> ``dir/model-00001-of-0000n.safetensors``, ..."""
    stem = base.name.removesuffix(".safetensors")
    return [base.with_name(f"{stem}-{k:05d}-of-{n:05d}.safetensors") for k in range(1, n + 1)]


# ------------------------------------------------------------------------------------------ writing
@dataclass(frozen=True)
class Entry:
    """One tensor to write: its name, dtype and shape, known before its data is."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = torch.empty((), dtype=self.dtype).element_size()
        for s in self.shape:
            n *= s
        return n


def _plan(entries: list[Entry], limit: int | None) -> list[list[Entry]]:
    """Entries split in order into shards of at most ``limit`` bytes (one alone where it is larger)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        if limit is not None and shards[-1] and size + e.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


def _header(entries: list[Entry], metadata: dict[str, str]) -> bytes:
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for e in entries:
        if e.dtype not in _ST_NAME:
            raise ShardError(f"cannot write {e.name!r}: safetensors has no dtype {e.dtype}")
        header[e.name] = {"dtype": _ST_NAME[e.dtype], "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    data = json.dumps(header, separators=(",", ":")).encode("utf-8")
    data += b" " * (-len(data) % 8)  # the tensors' data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(data)) + data


def _write_tensor(f, entry: Entry, tensor: Tensor) -> None:
    if tensor.dtype != entry.dtype or tuple(tensor.shape) != entry.shape:
        raise ShardError(f"internal: {entry.name!r} came as {tensor.dtype} {list(tensor.shape)}, "
                         f"announced as {entry.dtype} {list(entry.shape)}")
    data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    f.write(memoryview(data.numpy()))


def write_files(
    base: str | os.PathLike,
    entries: list[Entry],
    tensors: Iterable[tuple[str, Tensor]],
    *,
    max_shard_size: int | str | None = DEFAULT_MAX_SHARD_SIZE,
    single: dict[str, str],
    shard: Callable[[int, int], dict[str, str]] | None = None,
    index: dict[str, str] | None = None,
) -> Path:
    """Write ``tensors`` (pairs in ``entries``' order, each as announced) to ``base``, or above
    ``max_shard_size`` to shards beside it and their index. ``single`` is the metadata of a single
    file, ``shard(k, n)`` that of shard k of n, ``index`` the index's "metadata". Returns ``base``
    or the index's path. Files of an earlier save at ``base`` that the new one does not overwrite
    (a single file, or shards and an index) are removed once it is complete."""
    base = Path(base)
    if not base.parent.is_dir():
        raise ShardError(f"cannot write {str(base)!r}: no directory {str(base.parent)!r}")
    shards = _plan(entries, parse_size(max_shard_size))
    paths = [base] if len(shards) == 1 else shard_paths(base, len(shards))
    stream: Iterator[tuple[str, Tensor]] = iter(tensors)
    with ExitStack() as written:  # every file renamed into place once all are written; none on an error
        for k, (group, path) in enumerate(zip(shards, paths), start=1):
            meta = single if len(shards) == 1 else (shard(k, len(shards)) if shard else {"format": "pt"})
            tmp = written.enter_context(atomic_path(path))
            with open(tmp, "wb") as f:
                f.write(_header(group, meta))
                for entry in group:
                    name, tensor = next(stream, (None, None))
                    if name != entry.name:
                        raise ShardError(f"internal: expected tensor {entry.name!r}, got {name!r}")
                    _write_tensor(f, entry, tensor)
                    del tensor
        if next(stream, None) is not None:
            raise ShardError(f"internal: more tensors than the {len(entries)} announced")
    if len(shards) > 1:
        weight_map = {e.name: p.name for group, p in zip(shards, paths) for e in group}
        body = {"metadata": {**(index or {}), "total_size": sum(e.nbytes for e in entries)}, "weight_map": weight_map}
        atomic_write_text(index_path(base), json.dumps(body, indent=2) + "\n")
    _remove_stale(base, set(paths))
    return base if len(shards) == 1 else index_path(base)


def _remove_stale(base: Path, kept: set[Path]) -> None:
    """An earlier save's files at ``base`` that this one replaced: the single file, the index, shards."""
    shard = re.compile(re.escape(base.name.removesuffix(".safetensors")) + r"-\d{5}-of-\d{5}\.safetensors")
    stale = [] if base in kept else [base]
    if len(kept) == 1:
        stale.append(index_path(base))
    stale += [p for p in base.parent.iterdir() if shard.fullmatch(p.name) and p not in kept]
    for p in stale:
        p.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class Files:
    """Tensors in one safetensors file or in the shards an index names, without their data.

    ``path`` is the file or the index; ``metadata`` the file's ``__metadata__`` or the index's
    "metadata" (values as strings); ``tensors`` name -> (safetensors dtype, shape); ``where`` name
    -> the file holding it; ``shard_metadata`` each shard's own metadata (empty for a single file).
    """

    path: Path
    size: int
    metadata: dict[str, str]
    tensors: dict[str, tuple[str, tuple[int, ...]]]
    where: dict[str, Path]
    shard_metadata: dict[Path, dict[str, str]]

    @property
    def sharded(self) -> bool:
        return bool(self.shard_metadata)

    def read(self, name: str) -> Tensor:
        """The tensor ``name``, its file opened for it alone (the mapping closes with the tensor)."""
        with safe_open(str(self.where[name]), framework="pt") as f:
            return f.get_tensor(name)

    def by_file(self, names: Iterable[str]) -> dict[Path, list[str]]:
        out: dict[Path, list[str]] = {}
        for name in names:
            out.setdefault(self.where[name], []).append(name)
        return out


def _read_one(path: Path) -> tuple[dict[str, str], dict[str, tuple[str, tuple[int, ...]]]]:
    if not path.is_file():
        raise ShardError(f"no file at {str(path)!r}" if not path.exists() else f"{str(path)!r} is not a file")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = dict(f.metadata() or {})
            tensors = {}
            for name in f.keys():  # noqa: SIM118 (a safetensors file, not a dict)
                sl = f.get_slice(name)
                tensors[name] = (sl.get_dtype(), tuple(sl.get_shape()))
    except SafetensorError as e:
        raise ShardError(f"{str(path)!r} is not a readable safetensors file (truncated or corrupt?): {e}") from None
    except OSError as e:
        raise ShardError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
    return metadata, tensors


def resolve(path: str | os.PathLike) -> Path:
    """``path``, or the index of a sharded save at ``path`` (``m.safetensors`` written as shards has
    no file of that name, only ``m.safetensors.index.json`` and its shards)."""
    path = Path(path)
    if not path.exists() and index_path(path).is_file():
        return index_path(path)
    return path


class _Pairs(dict):
    """A JSON object that remembers its first key given twice (json keeps the last without a word)."""

    twice: tuple[str, object, object] | None = None


def _pairs(pairs: list[tuple[str, object]]) -> _Pairs:
    out = _Pairs()
    for key, value in pairs:
        if key in out and out.twice is None and out[key] != value:
            out.twice = (key, out[key], value)
        out[key] = value
    return out


def read_files(path: str | os.PathLike) -> Files:
    """The tensors of a safetensors file, or of an index (``*.safetensors.index.json``) and every
    shard it names (a missing shard is a :class:`ShardError` naming it). No tensor data is read."""
    path = resolve(path)
    if not path.name.endswith(".index.json"):
        metadata, tensors = _read_one(path)
        return Files(path, path.stat().st_size, metadata, tensors, dict.fromkeys(tensors, path), {})
    if not path.is_file():
        raise ShardError(f"no file at {str(path)!r}" if not path.exists() else f"{str(path)!r} is not a file")
    try:
        body = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_pairs)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardError(f"{str(path)!r} is not a valid index (not JSON: {e})") from None
    weight_map = body.get("weight_map") if isinstance(body, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ShardError(f"{str(path)!r} is not a valid index: it has no weight_map of tensor names to shard files")
    twice = getattr(weight_map, "twice", None)
    if twice:
        name, first, second = twice
        raise ShardError(f"{str(path)!r}: weight_map names the tensor {name!r} twice, in {first!r} and in {second!r}; "
                         f"an index names each tensor once: keep the entry of the shard that holds it")
    files = list(dict.fromkeys(weight_map.values()))
    outside = [f for f in files if Path(f).name != f or f in ("", ".", "..")]
    if outside:
        raise ShardError(f"{str(path)!r}: weight_map names the shard {outside[0]!r}, which is not a file beside the "
                         f"index; an index names its shards by file name, in its own directory")
    missing = [f for f in files if not (path.parent / f).is_file()]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ShardError(f"{str(path)!r} names {len(files)} shards, but {shown} {'is' if len(missing) == 1 else 'are'} "
                         f"missing from {str(path.parent)!r}; copy every shard beside the index")
    tensors, where, shard_meta, size = {}, {}, {}, 0
    for name in files:
        shard = path.parent / name
        meta, held = _read_one(shard)
        shard_meta[shard] = meta
        size += shard.stat().st_size
        for t, info in held.items():
            if weight_map.get(t) == name:
                tensors[t], where[t] = info, shard
    lacking = [t for t in weight_map if t not in tensors]
    if lacking:
        raise ShardError(f"{str(path)!r}: the shard {weight_map[lacking[0]]!r} has no tensor {lacking[0]!r} "
                         f"({len(lacking)} tensors the index names are missing; a shard from another save?)")
    raw = body.get("metadata") or {}
    metadata = {k: v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    ordered = {t: tensors[t] for t in weight_map}
    return Files(path, size, metadata, ordered, {t: where[t] for t in weight_map}, shard_meta)


def tie_groups(state: Mapping[str, Tensor]) -> dict[str, list[str]]:
    """Names that hold one tensor: {first name: [first name, aliases...]}, in ``state`` order.

    ``state`` is ``module.state_dict(keep_vars=True)``. Two names hold one tensor when they view
    the same bytes the same way: one storage, the same offset, shape, strides and dtype. That covers
    a tied parameter (one object under several names, ``head.weight = tok_emb.weight``) and two
    parameter objects over one storage; both are what safetensors refuses to write twice, and what
    is stored once. Different views of one storage (slices of a fused weight) are stored apart.
    A tensor without storage (the meta device, or empty) is one with itself only.
    """
    groups: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        ptr = 0 if tensor.is_meta else tensor.untyped_storage().data_ptr()
        key = (("object", id(tensor)) if ptr == 0 else
               (str(tensor.device), ptr, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype))
        groups.setdefault(key, []).append(name)
    return {names[0]: names for names in groups.values()}
