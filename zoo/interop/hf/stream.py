"""HF checkpoints on disk converted one tensor at a time: ``zoo convert`` of models larger than memory.

    hf_dir_to_zoo(src, dst, arch, dtype=None, max_shard_size="5GB", metadata=None) -> Streamed
    zoo_to_hf_dir(src, dst, architecture=None, dtype=None, max_shard_size="5GB") -> Streamed

No model with weights is built. The HF model is built on the meta device from ``config.json`` (for
its tensors' names and shapes and what it ties), the zoo model on the meta device from the spec;
each output tensor is made by the converter's rule (:func:`zoo.interop.common.zoo_tensor`, or
:func:`~zoo.interop.common.reference_tensors` the other way) from the input tensors it names, read
from their file just then, and written at once (:mod:`zoo.shards`). Memory holds one rule's inputs
and outputs (the largest: the embedding, or one layer's fused q/k/v) besides the libraries,
whatever the size of the checkpoint; the output is sharded above ``max_shard_size``.

Names are read as ``from_pretrained`` reads them (transformers' renamings, such as GPT-NeoX's
``embed_out`` or Mixtral's ``block_sparse_moe``, and the base model's prefix), and written as
``save_pretrained`` writes them (each tied tensor once, under the name HF keeps). A tensor the
checkpoint holds in parts (:meth:`~zoo.interop.hf.base.Architecture.stored_in_parts`: the
mixture-of-experts decoders' fused experts, stored one expert's matrix at a time) is read from its
parts and written as them; memory then holds one layer's experts twice (e.g. 1.9 GB in bf16 for
Mixtral-8x7B's [gate | up]). Floating-point tensors are cast to ``dtype``, by default to the dtype
``from_pretrained`` would give the model (config.json's ``dtype``, else the checkpoint's). gpt-oss's
release (``quantization_config`` mxfp4: the experts' matrices stored as ``*_blocks`` and
``*_scales``) is read by dequantizing each matrix to that dtype as transformers does
(:mod:`zoo.interop.hf.mxfp4`); any other ``quant_method`` is refused by name. A checkpoint that
needs transformers to transform tensors in another way while loading (none of the classes here
do), or holds only ``pytorch_model.bin``, raises :class:`NotStreamable`: the caller reads it whole
with ``from_pretrained`` instead. Written back, a model's tensors are plain (dequantized) and
``config.json`` has no ``quantization_config``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from zoo.build import build, count_parameters
from zoo.interop.common import ConversionError, Rule, check_counted, check_covered, check_mtp, check_used, reference_tensors, zoo_tensor
from zoo.interop.hf.base import Architecture
from zoo.interop.hf.convert import arch_for_spec, hf_config
from zoo.interop.hf.mxfp4 import Packed, dequantize, packed, packed_shapes, quantization
from zoo.io import read_lazily, tie_groups, write_model
from zoo.shards import DEFAULT_MAX_SHARD_SIZE, DTYPES, Entry, Files, ShardError, read_files, write_files
from zoo.spec import parse_spec

__all__ = ["HF_WEIGHTS", "NotStreamable", "Streamed", "hf_dir_to_zoo", "zoo_to_hf_dir"]

HF_WEIGHTS = "model.safetensors"  # and model.safetensors.index.json with model-0000k-of-0000n.safetensors


Stored = str | tuple[str, ...] | Packed  # where a checkpoint holds a model tensor: one name, its parts', or MXFP4


class NotStreamable(Exception):
    """A checkpoint this module does not read tensor by tensor; read it whole instead."""


@dataclass(frozen=True)
class Streamed:
    reference: str  # the HF class
    path: Path  # the zoo file (or its index), or the HF directory
    parameters: int
    ignored: tuple[str, ...] = ()  # checkpoint tensors the class does not read


class _Lazy(Mapping):
    """A state dict whose tensors are made when looked up (read from disk, one at a time)."""

    def __init__(self, names: Iterable[str], get: Callable[[str], Tensor]):
        self._names, self._get = list(names), get
        self._known = set(self._names)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._known:
            raise KeyError(name)
        return self._get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _listing(items: list[str], limit: int = 3) -> str:
    return ", ".join(items[:limit]) + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def _meta_model(arch: type[Architecture], config: Any, kwargs: dict[str, Any]) -> nn.Module:
    import transformers

    with torch.device("meta"):
        return getattr(transformers, arch.name)(config, **kwargs).eval()


def _floating(dtype: Any) -> torch.dtype | None:
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


# ------------------------------------------------------------------------------------ HF names
def _renamer(hf: nn.Module, meta: Mapping[str, Tensor]) -> Callable[[str], str]:
    """Checkpoint name -> model name, as from_pretrained renames them."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:  # an older transformers: names as they are, with or without the base model's prefix
        prefix = getattr(hf, "base_model_prefix", "")

        def plain(key: str) -> str:
            if key in meta or not prefix:
                return key
            return key.removeprefix(prefix + ".") if key.removeprefix(prefix + ".") in meta else f"{prefix}.{key}"
        return plain

    transforms = get_model_conversion_mapping(hf)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    prefix = hf.base_model_prefix

    def rename(key: str) -> str:
        new, pattern = rename_source_key(key, renamings, converters, prefix, meta)
        if new not in meta and key in meta:
            new, pattern = rename_source_key(key, [], [], base_model_prefix=prefix, meta_state_dict=meta)
        if pattern is not None:
            raise NotStreamable(f"{key} needs transformers' conversion {pattern!r}")
        return new
    return rename


def _saved_names(hf: nn.Module) -> dict[str, str]:
    """Model name -> checkpoint name of the tensors save_pretrained writes (each tied tensor once)."""
    state = dict(hf.state_dict())
    try:
        from transformers.modeling_utils import remove_tied_weights_from_state_dict

        state = remove_tied_weights_from_state_dict(state, hf)
    except ImportError:
        state = {names[0]: state[names[0]] for names in tie_groups(hf.state_dict(keep_vars=True)).values()}
    ignore = set(getattr(hf, "_keys_to_ignore_on_save", None) or ())
    names = [n for n in state if n not in ignore]
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange, WeightRenaming, apply_renamings
    except ImportError:
        return {n: n for n in names}
    transforms = [t for t in get_model_conversion_mapping(hf, add_legacy=False) if not isinstance(t, PrefixChange)]
    reverse = [t.reverse_transform() for t in transforms[::-1]]
    renamings = [t for t in reverse if isinstance(t, WeightRenaming)]
    return {n: apply_renamings(n, renamings) for n in names}


# --------------------------------------------------------------------------------- HF -> zoo
def _checkpoint(src: Path) -> Files:
    for name in (HF_WEIGHTS + ".index.json", HF_WEIGHTS):
        if (src / name).is_file():
            try:
                return read_files(src / name)
            except ShardError as e:
                raise ConversionError(str(e)) from None
    raise NotStreamable(f"{src} has no {HF_WEIGHTS}")


def _load_dtype(config: Any, files: Files) -> torch.dtype:
    """The dtype from_pretrained gives the model: config.json's, else the checkpoint's first floating tensor's."""
    found = _floating(getattr(config, "dtype", None)) or _floating(getattr(config, "torch_dtype", None))
    if found is not None:
        return found
    for st, _ in files.tensors.values():
        if st.startswith(("F", "BF")) and _floating(DTYPES.get(st, ("",))[0]) is not None:
            return _floating(DTYPES[st][0])
    return torch.float32


def _part_shape(shape: torch.Size, n: int) -> tuple[int, int]:
    """The shape of each of the ``n`` parts of a tensor of ``shape`` (Architecture.stored_in_parts)."""
    return shape.numel() // shape[-1] // n, shape[-1]


def _read(files: Files, stored: Stored, shape: torch.Size, dtype: torch.dtype = torch.float32) -> Tensor:
    """The tensor of ``shape`` stored under one checkpoint name, or in parts under several, or packed
    in MXFP4 (dequantized to ``dtype``)."""
    if isinstance(stored, str):
        return files.read(stored)
    if isinstance(stored, Packed):
        return dequantize(files.read(stored.blocks), files.read(stored.scales), dtype)
    return torch.cat([files.read(key) for key in stored]).reshape(shape)


def _parts_of(files: Files, parts: dict[str, tuple[str, ...]], prefix: str) -> dict[str, list[str | None]]:
    """{model name: the checkpoint names of its parts (None: not in the checkpoint)} of the tensors
    stored in ``parts``, the checkpoint's names taken with or without the base model's ``prefix``."""
    part_of = {p: (name, j) for name, names in parts.items() for j, p in enumerate(names)}
    found: dict[str, list[str | None]] = {name: [None] * len(names) for name, names in parts.items()}
    for key in files.tensors:
        for name in (key, key.removeprefix(f"{prefix}."), f"{prefix}.{key}") if prefix else (key,):
            if name in part_of:
                tensor, j = part_of[name]
                found[tensor][j] = key
                break
    return found


def _match(src: Path, arch: type[Architecture], config: Any, hf: nn.Module, files: Files,
           mxfp4: bool = False, skip_mtp: bool = False) -> tuple[dict[str, Stored], list[str]]:
    """({model name: checkpoint name, or its parts' names} for every model name the checkpoint fills,
    checkpoint names the class does not read), refusing a checkpoint that lacks a tensor, or whose
    tensors do not fit, or that holds a multi-token-prediction module unless ``skip_mtp``."""
    mtp = arch.mtp_names(config, list(files.tensors))
    check_mtp(mtp, skip_mtp, arch.name, str(src))
    left_out = set(mtp)
    meta = hf.state_dict(keep_vars=True)
    rename = _renamer(hf, meta)
    parts = arch.stored_in_parts(config)
    found = _parts_of(files, parts, getattr(hf, "base_model_prefix", ""))
    in_parts = {key for keys in found.values() for key in keys if key is not None}
    mapped: dict[str, Stored] = {}
    if mxfp4:  # gpt-oss's release: the experts' matrices in MXFP4
        mapped.update(packed(files.tensors, meta, getattr(hf, "base_model_prefix", "")))
        in_parts |= {key for p in mapped.values() for key in (p.blocks, p.scales)}
    ignored, unconvertible = [], {}
    for key in files.tensors:
        if key in in_parts or key in left_out:
            continue
        try:
            new = rename(key)
        except NotStreamable as e:  # beyond config.json's layers or experts (refused below), or truly so
            unconvertible[key] = e
            continue
        if new in meta and new not in mapped:
            mapped[new] = key
        else:
            ignored.append(key)
    for name, keys in found.items():
        held = [k for k in keys if k is not None]
        if not held or name in mapped:  # none (the tensor itself may be there) or both: the parts unread
            ignored += held
            continue
        lost = [part for part, k in zip(parts[name], keys) if k is None]
        if lost:
            raise ConversionError(f"{src}: the checkpoint holds some parts of {name} but not {_listing(lost)}")
        mapped[name] = tuple(held)
    unread = list(getattr(hf, "_keys_to_ignore_on_load_unexpected", None) or ()) + [r"rotary_emb\.inv_freq", r"(^|\.)position_ids$"]
    ignored = [k for k in ignored if not re.search("|".join(f"({p})" for p in unread), k)]  # as from_pretrained reports them
    read = [key for stored in mapped.values() for key in _keys(stored)]
    check_counted(read, [*ignored, *unconvertible], config.to_dict(), str(src))  # what the class leaves unread aside
    if unconvertible:
        raise next(iter(unconvertible.values()))
    ignored += mtp  # skipped by the caller's choice: listed, whatever the class's own list of unread names
    patterns = list(getattr(hf, "_keys_to_ignore_on_load_missing", None) or ())
    optional = re.compile("|".join(f"({p})" for p in patterns)) if patterns else None
    file_of, missing, twice = {}, [], []
    for names in tie_groups(meta).values():
        present = [n for n in names if n in mapped]
        if present:
            file_of.update(dict.fromkeys(names, mapped[present[0]]))
            twice += [(present[0], other) for other in present[1:] if mapped[other] != mapped[present[0]]]
        elif optional is None or not any(optional.search(n) for n in names):
            missing.append(names[0])
    if missing:  # from_pretrained would fill these with random values; never convert those
        holds = ", ".join(getattr(config, "architectures", None) or ["another model"])
        raise ConversionError(f"{src}: the weights do not fit {arch.name}: it has no {_listing(missing, 4)} "
                              f"(the directory holds {holds})")
    def want(name: str, stored: Stored) -> list[tuple[str, tuple[int, ...]]]:
        if isinstance(stored, str):
            return [(stored, tuple(meta[name].shape))]
        if isinstance(stored, Packed):
            return list(zip(_keys(stored), packed_shapes(meta[name].shape, name, str(src))))
        return [(key, _part_shape(meta[name].shape, len(stored))) for key in stored]

    wrong = [f"{key} is {list(files.tensors[key][1])}, config.json makes {list(shape)}"
             for name, stored in mapped.items() for key, shape in want(name, stored) if tuple(files.tensors[key][1]) != shape]
    if wrong:
        raise ConversionError(f"{src}: the checkpoint's tensors do not fit its config.json ({arch.name}): "
                              f"{_listing(wrong)}; is config.json the one these weights were saved with?")
    for first, other in twice:  # one tied tensor stored under two names must hold one value
        if not torch.equal(_read(files, mapped[first], meta[first].shape), _read(files, mapped[other], meta[other].shape)):
            raise ConversionError(f"{src}: config.json ties {first} and {other}, but the checkpoint holds different "
                                  f"values for them; untie them in config.json (tie_word_embeddings: false)")
    return file_of, ignored


def _keys(stored: Stored) -> tuple[str, ...]:
    """The checkpoint names a model tensor is read from."""
    return (stored,) if isinstance(stored, str) else (stored.blocks, stored.scales) if isinstance(stored, Packed) else stored


def hf_dir_to_zoo(src: Path, dst: Path, arch: type[Architecture], *, dtype: torch.dtype | None = None,
                  max_shard_size: int | str | None = DEFAULT_MAX_SHARD_SIZE, metadata: dict[str, str] | None = None,
                  skip_mtp: bool = False) -> Streamed:
    """The HF directory ``src`` (class ``arch``; safetensors weights, single or sharded) as the zoo
    file ``dst``, one tensor at a time; ``metadata`` goes into the zoo file's (:func:`zoo.io.save`).
    A multi-token-prediction module the class does not hold is refused, or with ``skip_mtp`` left
    out and listed in ``ignored``."""
    import transformers

    files = _checkpoint(src)
    try:
        config = getattr(transformers, arch.config_name).from_pretrained(str(src), local_files_only=True)
        raw = json.loads((src / "config.json").read_text(encoding="utf-8"))  # a multimodal one's text_config aside
    except (OSError, ValueError) as e:
        raise ConversionError(f"{src}: cannot read config.json: {str(e).splitlines()[0]}") from None
    mxfp4 = quantization(raw, raw.get("model_type") if isinstance(raw, dict) else None, str(src)) is not None
    hf = _meta_model(arch, config, arch.saved_init_kwargs(files.tensors))  # as saved (BertModel's pooler or none)
    if arch.made.__func__ is not Architecture.made.__func__:  # as the config reads (T5: a v1.1 config's head untied)
        arch.made(hf, parse_spec(arch.spec(config, None), source=f"from {arch.name} config"))
    file_of, ignored = _match(src, arch, config, hf, files, mxfp4, skip_mtp)
    target = dtype or _load_dtype(config, files)

    def cast(t: Tensor) -> Tensor:
        return t.to(target) if t.is_floating_point() and t.dtype != target else t

    buffers = {n: cast(_read(files, file_of[n], b.shape)) for n, b in hf.named_buffers() if n in file_of}
    if buffers:  # the spec may read them (Marian's final_logits_bias); parameters stay on the meta device
        hf.load_state_dict(buffers, strict=False, assign=True)
    where = f"{arch.name} -> zoo"
    spec = parse_spec(arch.spec(hf.config, hf), source=f"from {arch.name}")
    arch.check_claims(spec, where)
    meta = hf.state_dict(keep_vars=True)

    def read(name: str) -> Tensor:
        if name not in file_of:
            return meta[name]  # one HF computes itself (Marian's position tables): on the meta device
        return arch.prepare_from({name: cast(_read(files, file_of[name], meta[name].shape, target))}, spec)[name]

    ref = _Lazy(meta, read)
    rules = arch.rules(spec)
    check_covered(ref, rules, where, handled=arch.check_from(hf, spec, ref))
    model = build(spec, device="meta", dtype=target)
    state = model.state_dict(keep_vars=True)
    groups = tie_groups(state)
    by_zoo: dict[str, list[Rule]] = {}
    for r in rules:
        by_zoo.setdefault(r.zoo, []).append(r)
    for canon, names in groups.items():
        if not any(n in by_zoo for n in names):
            raise ConversionError(f"{where}: internal name map incomplete: no rule makes zoo's {canon!r}")

    def tensors() -> Iterator[tuple[str, Tensor]]:
        for canon, names in groups.items():
            made = [r for n in names for r in by_zoo.get(n, [])]
            first = zoo_tensor(made[0], ref, state[canon].shape, where)
            if first.is_meta:
                raise ConversionError(f"{where}: the checkpoint has no {', '.join(made[0].ref)} (for zoo's {canon!r})")
            for other in made[1:]:  # zoo holds one tensor the reference names twice: the same one, or equal
                if [file_of.get(n) for n in other.ref] != [file_of.get(n) for n in made[0].ref] and \
                        not torch.equal(first, zoo_tensor(other, ref, state[canon].shape, where)):
                    raise ConversionError(f"{where}: zoo holds {canon!r} once, but the reference's {', '.join(other.ref)} "
                                          f"differs from its {', '.join(made[0].ref)}; the source does not tie them")
            yield canon, first.to(state[canon].dtype)
            del first

    entries = [Entry(canon, state[canon].dtype, tuple(state[canon].shape)) for canon in groups]
    aliases = {alias: canon for canon, names in groups.items() for alias in names[1:]}
    path = write_model(dst, spec.model_dump(mode="json"), entries, tensors(), aliases, max_shard_size=max_shard_size,
                       metadata=metadata)
    return Streamed(arch.name, path, count_parameters(model), tuple(ignored))


# --------------------------------------------------------------------------------- zoo -> HF
def zoo_to_hf_dir(src: Path, dst: Path, *, architecture: str | None = None, dtype: torch.dtype | None = None,
                  max_shard_size: int | str | None = DEFAULT_MAX_SHARD_SIZE) -> Streamed:
    """The zoo file ``src`` (single or sharded) as the new HF directory ``dst`` (``config.json``,
    ``model.safetensors`` or shards and their index, ``generation_config.json``), one tensor at a time."""
    zoo_model, stored = read_lazily(src, dtype=dtype)
    spec = zoo_model.spec
    arch = arch_for_spec(spec, architecture)
    where = f"zoo -> {arch.name}"
    config = hf_config(spec, arch.name)
    hf = _meta_model(arch, config, arch.init_kwargs(spec))
    arch.made(hf, spec)
    meta = hf.state_dict(keep_vars=True)
    shapes = {n: t.shape for n, t in meta.items()}
    rules = arch.rules(spec)
    check_used(stored, rules, where)
    state = _Lazy(stored, lambda name: arch.prepare_to({name: stored[name]}, spec)[name])
    floats = {t.dtype for t in zoo_model.parameters() if t.is_floating_point()}
    target = dtype or (floats.pop() if len(floats) == 1 else torch.float32)
    extras = {n: t for n, t in arch.extra_to(state, spec, shapes).items()}

    saved = _saved_names(hf)  # model name -> checkpoint name
    parts = arch.stored_in_parts(config)  # model name -> the checkpoint names of its parts
    group_of = {n: names for names in tie_groups(meta).values() for n in names}
    producer: dict[str, tuple[int, str]] = {}  # saved model name -> (rule index, the rule's reference name)
    sources: dict[str, set] = {}  # a tied group's first name -> the zoo tensors that make its members
    for i, r in enumerate(rules):
        for j, n in enumerate(r.ref):
            sources.setdefault(group_of[n][0], set()).add((stored.source(r.zoo), j, r.transpose))
            for member in group_of[n]:
                if member in saved and member not in producer:
                    producer[member] = (i, n)
    split = [names[0] for names in tie_groups(meta).values() if len(sources.get(names[0], ())) > 1]
    if split:
        raise ConversionError(f"{where}: {', '.join(group_of[split[0]])} are one tied tensor in {arch.name}, but zoo "
                              f"holds them apart; set the target's tying option off")
    from_extras = {m: n for n in extras for m in group_of.get(n, [n]) if m in saved and m not in producer}
    left = [m for m in saved if m not in producer and m not in from_extras]
    if left:
        raise ConversionError(f"{where}: internal name map incomplete: nothing makes {_listing(left, 4)}")

    def dtype_of(name: str) -> torch.dtype:
        return target if meta[name].is_floating_point() else meta[name].dtype

    def written(m: str, tensor: Tensor | None = None) -> list[tuple[str, Any]]:
        """(checkpoint name, shape, or the tensor when given) of what model tensor ``m`` is written as."""
        if m not in parts:
            return [(saved[m], tuple(shapes[m]) if tensor is None else tensor)]
        shape = _part_shape(shapes[m], len(parts[m]))
        pieces = [shape] * len(parts[m]) if tensor is None else tensor.reshape(len(parts[m]), *shape)
        return list(zip(parts[m], pieces))

    order = [(i, n, m) for m, (i, n) in producer.items()]
    order.sort(key=lambda x: (x[0], rules[x[0]].ref.index(x[1])))
    entries = [Entry(name, dtype_of(m), shape) for m in [*(m for _, _, m in order), *from_extras] for name, shape in written(m)]

    def tensors() -> Iterator[tuple[str, Tensor]]:
        done = None
        for i, n, m in order:
            if done is None or done[0] != i:
                done = (i, reference_tensors(rules[i], state[rules[i].zoo], shapes, where))
            for name, t in written(m, done[1][n]):
                yield name, t.to(dtype_of(m)).contiguous()
        done = None
        for m, n in from_extras.items():
            for name, t in written(m, extras[n]):
                yield name, t.to(dtype_of(m)).contiguous()

    dst.mkdir(exist_ok=True)
    write_files(dst / HF_WEIGHTS, entries, tensors(), max_shard_size=max_shard_size, single={"format": "pt"},
                index={"total_parameters": count_parameters(hf)})
    hf.config.architectures = [arch.name]
    hf.config.dtype = target
    hf.config.save_pretrained(str(dst))
    if hf.can_generate():
        hf.generation_config.save_pretrained(str(dst))
    return Streamed(arch.name, dst, count_parameters(hf))
