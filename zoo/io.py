"""Weights on disk: safetensors files that carry the spec they were built from.

    zoo.save(model, "m.safetensors")          # weights + the validated spec (JSON) + zoo's version
    model = zoo.load("m.safetensors")         # rebuilt from that file alone, loaded strictly
    zoo.load_weights(model, "m.safetensors")  # weights into a model you built yourself
    zoo.save(model, "big.safetensors", max_shard_size="2GB")  # above 2 GB: shards and an index

The file is a plain safetensors file; its string metadata holds

    zoo.format   the file format version (an integer); a newer format is refused, not guessed at
    zoo.version  the zoo that wrote it
    zoo.spec     the model spec as JSON (``spec.model_dump(mode="json")``)
    zoo.tied     JSON {alias: stored name} of tied tensors, each stored once
    format       "pt" (the convention of other safetensors readers)

and whatever else the writer adds (``save(..., metadata=...)``): ``zoo convert`` stores a
sentence-transformers model's pooling as ``zoo.embedding`` (:mod:`zoo.embed`). Loading ignores it.

Tied weights (a decoder's output projection and token embedding, an encoder-decoder's shared
embeddings) are stored once, under the first name ``state_dict`` gives them; loading puts the one
tensor into the model, whose builder has already tied the names. Derived tables (sinusoids, RoPE
frequencies) are non-persistent buffers: never stored, recomputed on loading.

A model larger than ``max_shard_size`` (default 5GB; None: never) is written as shards, as HF
lays out its checkpoints: ``big-00001-of-00003.safetensors`` ... and ``big.safetensors.index.json``,
whose "metadata" holds the keys above and whose "weight_map" names each tensor's shard (zoo file
format 3; each shard also carries the spec, ``zoo.shard`` "k/n" and the save's ``zoo.save`` id, so
a shard of another save is refused). ``zoo.load("big.safetensors")`` finds the index, as does
passing the index itself. Saving writes the header first and then one tensor at a time
(:mod:`zoo.shards`), so it needs no second copy of the weights.

Loading builds the model on the meta device (no memory), reads each tensor from the file straight
into its parameter, then recomputes derived buffers (``reset_buffers()`` of the modules that have
them), so it needs the model's memory once. Nothing on this path unpickles.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from zoo._version import __version__
from zoo.build import build
from zoo.protocols import DerivedBuffers
from zoo.shards import DEFAULT_MAX_SHARD_SIZE, DTYPES, Entry, Files, ShardError, read_files, tie_groups, write_files
from zoo.spec import FamilySpec, SpecError, parse_spec

__all__ = [
    "FORMAT", "KEY_ADAPTER", "FileHeader", "LoadError", "SaveError", "load", "load_weights", "read_header", "read_lazily",
    "read_spec", "save", "tie_groups", "write_model",
]

# The newest file format this zoo reads; bump when a file changes in a way an older zoo cannot read
# (2: block.kind and head, zoo 0.2; 3: sharded files, an index beside the shards). A single file
# is still written as format 2, its layout unchanged, so that zoo 0.2 reads it; raise both when
# the spec changes.
FORMAT = 3
FORMAT_SINGLE = 2
KEY_FORMAT, KEY_VERSION, KEY_SPEC, KEY_TIED = "zoo.format", "zoo.version", "zoo.spec", "zoo.tied"
KEY_SHARD, KEY_SAVE = "zoo.shard", "zoo.save"  # a shard's "k/n"; one id for an index and its shards
KEY_ADAPTER = "zoo.adapter"  # an adapter file's (zoo.finetune.save_adapters), which holds no model


class LoadError(ValueError):
    """A file that cannot be loaded: unreadable, corrupt, without a spec, from a newer zoo, or holding
    tensors that do not fit the model (missing, unexpected, wrong shape). One line, naming the file."""


class SaveError(ValueError):
    """A model that cannot be saved faithfully (no spec, tensors its spec would not build, meta device)."""


# ------------------------------------------------------------------------------------ tied tensors
def _stored(model: nn.Module, spec_model: nn.Module | None = None) -> tuple[dict[str, Tensor], dict[str, list[str]]]:
    """``model``'s state and its tie groups (:func:`zoo.shards.tie_groups`: names over the same
    bytes). With ``spec_model`` (what the spec builds), a group splits where the spec does not tie
    its names, so that a file of an untied spec holds every name its model loads."""
    state = model.state_dict(keep_vars=True)
    groups = tie_groups(state)
    if spec_model is None:
        return state, groups
    owner = {n: canon for canon, names in tie_groups(spec_model.state_dict(keep_vars=True)).items() for n in names}
    split: dict[str, list[str]] = {}
    for names in groups.values():
        for n in names:
            split.setdefault(names[0] + "\0" + owner.get(n, n), []).append(n)
    return state, {names[0]: names for names in split.values()}


# ------------------------------------------------------------------------------------------- save
def save(model: nn.Module, path: str | os.PathLike, *, dtype: torch.dtype | None = None,
         max_shard_size: int | str | None = DEFAULT_MAX_SHARD_SIZE, metadata: Mapping[str, str] | None = None) -> Path:
    """Write ``model``'s weights and spec to a safetensors file, atomically; returns the path.

    ``dtype`` casts floating-point tensors on the way out (``torch.bfloat16`` halves a float32
    model's file). The model must be what its spec builds (``model.spec``, set by ``zoo.build``).
    Above ``max_shard_size`` bytes (an int, or "5GB", "500MB", "2GiB"; None: no limit) the
    tensors go to shards beside ``path`` and the index ``<path>.index.json``, whose path is returned.
    ``metadata`` adds string entries to the file's metadata (not the keys zoo writes itself).
    """
    spec = getattr(model, "spec", None)
    if not isinstance(spec, FamilySpec):
        raise SaveError(
            f"cannot save a {type(model).__name__} without a zoo spec (model.spec); build it with zoo.build(spec), "
            f"or write its state_dict with safetensors directly"
        )
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise SaveError(f"dtype must be a floating-point torch.dtype such as torch.bfloat16, got {dtype!r}")
    spec_json = spec.model_dump(mode="json")
    try:
        parse_spec(spec_json)
    except SpecError as e:
        raise SaveError(f"the model's spec does not read back from JSON: {one_line(e)}") from None
    spec_model = build(spec, device="meta")
    state, groups = _stored(model, spec_model)
    if any(t.is_meta for t in state.values()):
        raise SaveError("the model is on the meta device and has no weights to save; materialise it first")
    problems = _mismatch(spec_model, {n: tuple(state[n].shape) for n in groups})
    if problems:
        raise SaveError(f"the model does not match its spec ({spec.name or spec.family}): {problems}")

    def cast(t: Tensor) -> Tensor:
        return t.detach().to(dtype) if dtype is not None and t.is_floating_point() else t.detach()

    entries = [Entry(name, dtype if dtype is not None and state[name].is_floating_point() else state[name].dtype,
                     tuple(state[name].shape)) for name in groups]
    aliases = {alias: canon for canon, names in groups.items() for alias in names[1:]}
    return write_model(path, spec_json, entries, ((name, cast(state[name])) for name in groups), aliases,
                       max_shard_size=max_shard_size, metadata=metadata)


def write_model(path: str | os.PathLike, spec_json: dict, entries: list[Entry], tensors: Iterable[tuple[str, Tensor]],
                aliases: dict[str, str], *, max_shard_size: int | str | None = DEFAULT_MAX_SHARD_SIZE,
                metadata: Mapping[str, str] | None = None) -> Path:
    """Write a zoo file (or shards and their index) from tensors made one at a time: ``entries``
    announce each stored tensor (name, dtype, shape), ``tensors`` yields them in that order,
    ``aliases`` maps tied names to the stored one, ``metadata`` adds string entries. What
    :func:`save` and ``zoo convert`` write."""
    extra = dict(metadata or {})
    taken = sorted(set(extra) & {KEY_FORMAT, KEY_VERSION, KEY_SPEC, KEY_TIED, KEY_SHARD, KEY_SAVE, "format"})
    if taken or not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
        raise SaveError(f"metadata: string keys and values other than the ones zoo writes ({', '.join(taken) or 'not strings'})")
    common = {**extra, KEY_VERSION: __version__, KEY_SPEC: json.dumps(spec_json, separators=(",", ":"))}
    tied = {KEY_TIED: json.dumps(aliases, separators=(",", ":"))} if aliases else {}
    save_id = uuid.uuid4().hex[:16]

    def shard(k: int, n: int) -> dict[str, str]:
        return {"format": "pt", KEY_FORMAT: str(FORMAT), **common, KEY_SHARD: f"{k}/{n}", KEY_SAVE: save_id}

    try:
        return write_files(Path(path), entries, tensors, max_shard_size=max_shard_size, shard=shard,
                           single={"format": "pt", KEY_FORMAT: str(FORMAT_SINGLE), **common, **tied},
                           index={KEY_FORMAT: str(FORMAT), **common, **tied, KEY_SAVE: save_id})
    except ShardError as e:
        raise SaveError(str(e)) from None


# ----------------------------------------------------------------------------------------- header
@dataclass(frozen=True)
class FileHeader:
    """What a file says about itself, read without loading any tensor."""

    path: Path  # the file, or the index of a sharded file
    size: int  # bytes on disk (of every shard)
    metadata: dict[str, str]  # a sharded file's: its index's "metadata"
    tensors: dict[str, tuple[str, tuple[int, ...]]] = field(repr=False)  # name -> (safetensors dtype, shape)
    files: Files | None = field(default=None, repr=False, compare=False)  # where each tensor is

    @property
    def shards(self) -> tuple[Path, ...]:
        """The shard files of a sharded file (none for a single file)."""
        return tuple(self.files.shard_metadata) if self.files is not None else ()

    @property
    def n_elements(self) -> int:
        return sum(_numel(shape) for _, shape in self.tensors.values())

    def dtypes(self) -> dict[str, int]:
        """Tensor count per dtype (torch names)."""
        counts: dict[str, int] = {}
        for dt, _ in self.tensors.values():
            name = DTYPES.get(dt, (dt.lower(), 0))[0]
            counts[name] = counts.get(name, 0) + 1
        return counts

    @property
    def tied(self) -> dict[str, str]:
        try:
            tied = json.loads(self.metadata.get(KEY_TIED, "{}"))
        except json.JSONDecodeError:
            return {}
        return tied if isinstance(tied, dict) else {}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def read_header(path: str | os.PathLike) -> FileHeader:
    """The metadata and the tensors' names, dtypes and shapes of a safetensors file, or of the
    shards a ``*.safetensors.index.json`` names (``m.safetensors`` finds ``m.safetensors.index.json``
    when it was saved in shards); no tensor data is read. A missing, truncated or corrupt file, a
    missing shard or a shard of another save raises :class:`LoadError`."""
    try:
        files = read_files(path)
    except ShardError as e:
        raise LoadError(str(e)) from None
    save_id = files.metadata.get(KEY_SAVE)
    for shard, meta in files.shard_metadata.items():
        if save_id is not None and meta.get(KEY_SAVE) != save_id:
            raise LoadError(f"{str(shard)!r} is not from the save its index {files.path.name!r} describes (a mixed copy); "
                            f"copy the index and all its shards from one save")
    return FileHeader(path=files.path, size=files.size, metadata=files.metadata, tensors=files.tensors, files=files)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(c for c in piece if c.isdigit()) if piece else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _spec_of(header: FileHeader) -> FamilySpec:
    name, meta = str(header.path), header.metadata
    if KEY_SHARD in meta:
        index = re.sub(r"-\d{5}-of-\d{5}\.safetensors$", ".safetensors.index.json", header.path.name)
        raise LoadError(f"{name!r} is shard {meta[KEY_SHARD]} of a sharded zoo file; load its index {index!r} "
                        f"(or the name it was saved as), with every shard beside it")
    if KEY_ADAPTER in meta:
        raise LoadError(f"{name!r} holds adapters, not a model; load its base model, then zoo.finetune.load_adapters(model, path)")
    if KEY_SPEC not in meta:
        raise LoadError(
            f"{name!r} has no zoo spec in its metadata (it was not written by zoo.save); "
            f"build the model from its spec and use zoo.load_weights(model, path)"
        )
    written_by = meta.get(KEY_VERSION, "an unknown version")
    try:
        fmt = int(meta.get(KEY_FORMAT, "1"))
    except ValueError:
        raise LoadError(f"{name!r}: unreadable {KEY_FORMAT} {meta[KEY_FORMAT]!r} in its metadata (corrupt?)") from None
    if fmt > FORMAT:
        raise LoadError(
            f"{name!r} is in zoo file format {fmt} (written by zoo {written_by}); this zoo ({__version__}) "
            f"reads format {FORMAT} and older; upgrade zoo"
        )
    newer = _version_tuple(written_by) > _version_tuple(__version__)
    hint = f" (written by zoo {written_by}, newer than this zoo {__version__}; upgrade zoo)" if newer else ""
    try:
        data = json.loads(meta[KEY_SPEC])
    except json.JSONDecodeError as e:
        raise LoadError(f"{name!r}: the spec in its metadata is not valid JSON ({e}){hint}") from None
    try:
        return parse_spec(data, source=f"in {name!r}", notes=False)  # a file cannot be rewritten by hand
    except SpecError as e:
        raise LoadError(f"{name!r}: cannot use the spec in its metadata: {one_line(e)}{hint}") from None


def read_spec(path: str | os.PathLike) -> FamilySpec:
    """The validated spec stored in a file written by :func:`save` (no tensor is read)."""
    return _spec_of(read_header(path))


# ---------------------------------------------------------------------------------------- matching
def _listing(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _plan(model: nn.Module, shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, list[str]], str]:
    """Match stored tensors to the model's: ({stored name: model names it fills}, problems or '').

    Each group of tied names must be stored exactly once, under any of its names; every stored
    tensor must belong to the model and have its shape.
    """
    state, groups = _stored(model)
    plan: dict[str, list[str]] = {}
    missing, twice, wrong = [], [], []
    for canon, names in groups.items():
        present = [n for n in names if n in shapes]
        if not present:
            missing.append(canon + (f" (tied with {', '.join(names[1:])})" if len(names) > 1 else ""))
        elif len(present) > 1:
            twice.append(" and ".join(present))
        else:
            want, got = tuple(state[canon].shape), tuple(shapes[present[0]])
            if want != got:
                wrong.append(f"{present[0]} is {list(got)}, the model needs {list(want)}")
            plan[present[0]] = names
    known = {n for names in groups.values() for n in names}
    unexpected = [n for n in shapes if n not in known]
    problems = []
    if missing:
        problems.append(f"missing tensor{'s' if len(missing) > 1 else ''} {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected tensor{'s' if len(unexpected) > 1 else ''} {_listing(unexpected)}")
    if wrong:
        problems.append(f"wrong shape{'s' if len(wrong) > 1 else ''}: {_listing(wrong, 3)}")
    if twice:
        problems.append(f"tied tensors stored more than once: {_listing(twice, 3)}")
    return plan, "; ".join(problems)


def _mismatch(model: nn.Module, shapes: Mapping[str, tuple[int, ...]]) -> str:
    return _plan(model, shapes)[1]


def _check_kinds(plan: dict[str, list[str]], header: FileHeader, state: Mapping[str, Tensor], label: str) -> None:
    """Floating tensors must be stored as floating point, integer ones as integers."""
    wrong = []
    for stored, names in plan.items():
        dt = header.tensors[stored][0]
        file_float = dt.startswith(("F", "BF"))
        if file_float != state[names[0]].is_floating_point():
            wrong.append(f"{stored} is {DTYPES.get(dt, (dt,))[0]}, the model needs {str(state[names[0]].dtype).removeprefix('torch.')}")
    if wrong:
        raise LoadError(f"{label}: wrong dtype{'s' if len(wrong) > 1 else ''}: {_listing(wrong, 3)}")


# ------------------------------------------------------------------------------------------- load
def _device(device: str | torch.device | int | None) -> torch.device:
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "meta":
        raise ValueError("device 'meta': nothing to load; use zoo.build(zoo.io.read_spec(path), device='meta')")
    return device


def _uniform_float_dtype(header: FileHeader) -> torch.dtype | None:
    names = {header_dt for header_dt, _ in header.tensors.values() if header_dt.startswith(("F", "BF"))}
    if len(names) != 1:
        return None
    return getattr(torch, DTYPES[names.pop()][0], None)


def _rebuild_needed(model: nn.Module) -> list[str]:
    """Modules with non-persistent buffers but no ``reset_buffers()`` to recompute them."""
    out = []
    for name, module in model.named_modules():
        persistent = module.state_dict(keep_vars=True).keys() if any(True for _ in module.buffers(recurse=False)) else ()
        derived = [b for b, _ in module.named_buffers(recurse=False) if b not in persistent]
        if derived and not isinstance(module, DerivedBuffers):
            out.append(name or type(module).__name__)
    return out


def _materialise_buffers(model: nn.Module, device: torch.device) -> None:
    """Give the buffers still on the meta device (the derived, non-persistent ones) memory on
    ``device`` and let their modules recompute them."""
    stale = []
    for module in model.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf.is_meta:
                setattr(module, name, torch.empty_like(buf, device=device))
                if not stale or stale[-1] is not module:
                    stale.append(module)
    with torch.no_grad():
        for module in stale:
            module.reset_buffers()


def load(
    path: str | os.PathLike,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """The model a file written by :func:`save` holds, rebuilt from the file alone.

    ``device`` (default CPU) receives the tensors straight from the file. ``dtype`` casts
    floating-point tensors; by default they keep the dtype they were stored in. The model is in
    training mode, as ``zoo.build`` returns it (call ``.eval()`` for inference). Any mismatch
    between the stored tensors and the spec raises :class:`LoadError`; nothing loads partially.
    """
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point torch.dtype such as torch.bfloat16, got {dtype!r}")
    header = read_header(path)
    device = _device(device)
    target = dtype if dtype is not None else _uniform_float_dtype(header)
    model, plan, state = _checked_meta(header, target)
    spec = model.spec
    rebuild = _rebuild_needed(model)
    if rebuild:  # a part that cannot recompute its derived buffers: build it for real (costs a second copy)
        model = build(spec, device=device, dtype=target)
        state = model.state_dict(keep_vars=True)
    loaded: dict[str, Tensor] = {}
    for f, stored in _by_file(header, plan, device=str(device)):
        ref = state[plan[stored][0]]
        t = f.get_tensor(stored)
        if t.is_floating_point() and t.dtype != ref.dtype:
            t = t.to(ref.dtype)
        if isinstance(ref, nn.Parameter):  # one Parameter object for all tied names keeps them tied
            t = nn.Parameter(t, requires_grad=ref.requires_grad)
        for name in plan[stored]:
            loaded[name] = t
    model.load_state_dict(loaded, strict=True, assign=True)
    if not rebuild:
        _materialise_buffers(model, device)
    return model


def load_weights(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Copy a file's tensors into ``model``'s parameters in place (its device and dtype), strictly:
    every tensor the model has, none it lacks, each with the model's shape. Returns ``model``.
    The file's spec, if any, is not consulted: the tensors decide."""
    header = read_header(path)
    state = model.state_dict(keep_vars=True)
    if any(t.is_meta for t in state.values()):
        raise LoadError("the model is on the meta device (it has no memory to load into); use zoo.load(path)")
    label = f"{str(header.path)!r} does not fit the {type(model).__name__}"
    plan, problems = _plan(model, {n: shape for n, (_, shape) in header.tensors.items()})
    if problems:
        raise LoadError(f"{label}: {problems}")
    _check_kinds(plan, header, state, label)
    with torch.no_grad():
        for f, stored in _by_file(header, plan):
            state[plan[stored][0]].copy_(f.get_tensor(stored))
    return model


def _by_file(header: FileHeader, names: Iterable[str], device: str = "cpu") -> Iterator[tuple[object, str]]:
    """(open file, name) for each of ``names``, each file (a shard) opened once."""
    for path, held in header.files.by_file(names).items():
        with safe_open(str(path), framework="pt", device=device) as f:
            for name in held:
                yield f, name


class _Stored(Mapping):
    """Every name of a model's state dict -> its tensor in a file, read when looked up (one at a time)."""

    def __init__(self, header: FileHeader, stored: dict[str, str], dtypes: dict[str, torch.dtype]):
        self._header, self._stored, self._dtypes = header, stored, dtypes

    def source(self, name: str) -> str:
        """The stored name of the tensor ``name`` (tied names share one)."""
        return self._stored[name]

    def __getitem__(self, name: str) -> Tensor:
        t = self._header.files.read(self._stored[name])
        return t.to(self._dtypes[name]) if t.is_floating_point() and t.dtype != self._dtypes[name] else t

    def __iter__(self) -> Iterator[str]:
        return iter(self._stored)

    def __len__(self) -> int:
        return len(self._stored)


def _checked_meta(header: FileHeader, dtype: torch.dtype | None) -> tuple[nn.Module, dict, dict[str, Tensor]]:
    """The file's model built on the meta device, the plan of which stored tensor fills which names,
    and the model's state dict; a file whose tensors do not fit its spec is a :class:`LoadError`."""
    spec = _spec_of(header)
    model = build(spec, device="meta", dtype=dtype)
    label = f"{str(header.path)!r} does not fit its spec ({spec.name or spec.family})"
    plan, problems = _plan(model, {n: shape for n, (_, shape) in header.tensors.items()})
    if problems:
        raise LoadError(f"{label}: {problems}")
    state = model.state_dict(keep_vars=True)
    _check_kinds(plan, header, state, label)
    return model, plan, state


def read_lazily(path: str | os.PathLike, *, dtype: torch.dtype | None = None) -> tuple[nn.Module, Mapping[str, Tensor]]:
    """The model a zoo file holds, built on the meta device (``model.spec`` is the file's spec), and
    its state dict as a mapping whose tensors are read from the file when looked up, cast to
    ``dtype`` (default: as stored), each name of a tied tensor giving the one stored. The file is
    checked against its spec as :func:`load` checks it. For work on one tensor at a time (``zoo
    convert`` of a model larger than memory)."""
    header = read_header(path)
    model, plan, state = _checked_meta(header, dtype if dtype is not None else _uniform_float_dtype(header))
    stored = {name: s for s, names in plan.items() for name in names}
    return model, _Stored(header, {n: stored[n] for n in state}, {n: t.dtype for n, t in state.items()})


def one_line(error: Exception | str) -> str:
    """A multi-line message (a spec error lists one problem a line) as one line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} {'; '.join(lines[1:])}"
