"""What every converter shares: the error for unsupported options, name maps between state dicts,
exact loading, and checks that tied weights stay tied.

A converter is a list of :class:`Rule` s. Each rule names one zoo tensor and the reference tensors
it is made of: one tensor copied (reshaped if the layouts differ, e.g. timm's ``pos_embed`` [1, N, D]
and zoo's position table [N, D]), or several stacked along the output rows (zoo's fused ``qkv`` is
[q | k | v]; its gated ``fc1`` is [gate | up]). ``transpose`` marks references that store [in, out]
(GPT-2's Conv1D; per expert [E, in, out], Llama 4's experts); ``permute`` those that hold one tensor's
axes in another order (timm NaFlexVit's linear patch embedding over (row, column, channel) patches).
``part`` makes a zoo tensor one slice of a reference tensor that holds every layer's (timm's
RoPE-Mixed ``rope.freqs`` [2, depth, H, K/2]). The same rules run backwards to split zoo tensors
into the reference's.
:func:`zoo_tensor` and :func:`reference_tensors` apply one rule, so a converter of files on disk
(:mod:`zoo.interop.hf.stream`) reads and writes one tensor at a time with the same rules.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import Tensor, nn

from zoo.shards import tie_groups

__all__ = ["ConversionError", "Rule", "zoo_state", "zoo_tensor", "reference_state", "reference_tensors", "check_covered",
           "check_used", "check_counted", "load_exact", "device_dtype", "name_list", "first_expressing"]


class ConversionError(ValueError):
    """A model that cannot be converted exactly; the message names the option and why."""


def unsupported(where: str, option: str, value: object, why: str) -> ConversionError:
    """``where: option=value is not supported: why``."""
    return ConversionError(f"{where}: {option}={value!r} is not supported: {why}")


def name_list(names: Iterable[str], indent: str = "    ", width: int = 100) -> str:
    """``names`` as one comma-separated paragraph, wrapped and indented: the lists of classes that
    docstrings and help texts take from the registries instead of keeping by hand."""
    return textwrap.fill(", ".join(names), width=width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


@dataclass(frozen=True)
class Rule:
    """zoo tensor ``zoo`` = reference tensors ``ref`` stacked along rows (dim 0), in order; with
    ``part`` (dim, index), the slice ``index`` along ``dim`` of the one reference tensor (the rules
    of every index together fill it)."""

    zoo: str
    ref: tuple[str, ...]
    transpose: bool = False
    permute: tuple[int, ...] | None = None  # the reference holds the zoo tensor's axes in this order (one tensor)
    part: tuple[int, int] | None = None


def first_expressing(candidates: Iterable[Any], express: Callable[[Any], object], refusal: str) -> Any:
    """The first of ``candidates`` (converter classes, in the order a spec tries them) that
    ``express`` takes without a ConversionError; else one ConversionError: the only reason, or
    ``refusal`` and every class's reason, a line each."""
    reasons = []
    for candidate in candidates:
        try:
            express(candidate)
        except ConversionError as e:
            reasons.append(str(e))
        else:
            return candidate
    if len(reasons) == 1:
        raise ConversionError(reasons[0])
    raise ConversionError(refusal + ":\n  " + "\n  ".join(reasons))


def rule(zoo: str, *ref: str, transpose: bool = False, permute: tuple[int, ...] | None = None,
         part: tuple[int, int] | None = None) -> Rule:
    if part is not None and (len(ref) != 1 or transpose or permute):
        raise ValueError(f"rule {zoo!r}: a part is a slice of one reference tensor, not transposed nor permuted")
    return Rule(zoo, ref, transpose, permute, part)


def _rows(shape: torch.Size, transpose: bool) -> int:
    return shape[-1] if transpose else shape[0]


def zoo_tensor(r: Rule, ref: Mapping[str, Tensor], shape: torch.Size, where: str) -> Tensor:
    """The zoo tensor ``r.zoo`` (of ``shape``) made from the reference's tensors, looked up in ``ref``
    by name: one rule at a time, so a caller may read them one by one from disk (``zoo convert``)."""
    missing = [name for name in r.ref if name not in ref]
    if missing:
        raise ConversionError(f"{where}: the reference has no tensor {missing[0]!r} (for zoo's {r.zoo!r})")
    parts = [ref[name].transpose(-2, -1) if r.transpose else ref[name] for name in r.ref]
    if r.part is not None:
        parts = [parts[0].select(*r.part)]
    tensor = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
    if tensor.numel() != shape.numel():
        got = " + ".join(f"{name} {tuple(p.shape)}" for name, p in zip(r.ref, parts))
        raise ConversionError(f"{where}: zoo's {r.zoo!r} {tuple(shape)} does not fit {got}")
    if r.permute is not None:  # the reference's axes, in its order, back to zoo's
        tensor = tensor.reshape([shape[i] for i in r.permute]).permute(*sorted(range(len(shape)), key=r.permute.__getitem__))
    return tensor.reshape(shape)


def zoo_state(ref: Mapping[str, Tensor], rules: Iterable[Rule], shapes: Mapping[str, torch.Size], where: str) -> dict[str, Tensor]:
    """The zoo state dict (names and ``shapes`` of the zoo model) from the reference's."""
    out = {}
    for r in rules:
        tensor = zoo_tensor(r, ref, shapes[r.zoo], where)
        if r.zoo in out and not torch.equal(out[r.zoo], tensor):  # two reference names, one zoo tensor
            raise ConversionError(f"{where}: zoo holds {r.zoo!r} once, but the reference's {', '.join(r.ref)} differs from its other copy")
        out[r.zoo] = tensor
    return out


def reference_tensors(r: Rule, tensor: Tensor, shapes: Mapping[str, torch.Size], where: str) -> dict[str, Tensor]:
    """The reference's tensors (names and ``shapes`` of the reference model) that rule ``r`` makes
    from the zoo tensor ``tensor``: one rule at a time, as :func:`zoo_tensor`."""
    if r.part is not None:
        raise ConversionError(f"{where}: zoo's {r.zoo!r} is a slice of {r.ref[0]!r}; convert the whole model "
                              f"(reference_state) to write it")
    sizes = [_rows(shapes[name], r.transpose) for name in r.ref]
    if sum(shapes[name].numel() for name in r.ref) != tensor.numel():
        want = " + ".join(f"{name} {tuple(shapes[name])}" for name in r.ref)
        raise ConversionError(f"{where}: zoo's {r.zoo!r} {tuple(tensor.shape)} does not fit {want}")
    if r.permute is not None:
        tensor = tensor.permute(*r.permute)
    chunks = tensor.split(sizes, dim=0) if len(r.ref) > 1 else [tensor]
    out = {}
    for name, chunk in zip(r.ref, chunks):
        shape = shapes[name]
        if r.transpose:
            chunk = chunk.reshape(*shape[:-2], shape[-1], shape[-2]).transpose(-2, -1)
        out[name] = chunk.reshape(shape).contiguous()
    return out


def reference_state(zoo: Mapping[str, Tensor], rules: Iterable[Rule], shapes: Mapping[str, torch.Size], where: str) -> dict[str, Tensor]:
    """The reference's state dict (names and ``shapes`` of the reference model) from zoo's."""
    out: dict[str, Tensor] = {}
    filled: dict[tuple[str, int], set[int]] = {}  # a tensor made of parts, its dimension: the slices written
    for r in rules:
        if r.part is None:
            out.update(reference_tensors(r, zoo[r.zoo], shapes, where))
            continue
        (name,), (dim, index) = r.ref, r.part
        tensor = zoo[r.zoo]
        piece = out.setdefault(name, tensor.new_empty(shapes[name])).select(dim, index)
        if piece.numel() != tensor.numel():
            raise ConversionError(f"{where}: zoo's {r.zoo!r} {tuple(tensor.shape)} does not fit slice {index} of "
                                  f"{name} {tuple(shapes[name])} along dimension {dim}")
        piece.copy_(tensor.reshape(piece.shape))
        filled.setdefault((name, dim), set()).add(index)
    for (name, dim), got in filled.items():
        if len(got) != shapes[name][dim]:
            raise ConversionError(f"{where}: the reference's {name!r} has {shapes[name][dim]} slices along dimension "
                                  f"{dim}, but zoo fills {len(got)}")
    return out


def check_covered(names: Iterable[str], rules: Iterable[Rule], where: str, *, handled: Iterable[str] = ()) -> None:
    """Every reference tensor has a place in zoo; one left over means an option zoo lacks."""
    used = {name for r in rules for name in r.ref} | set(handled)
    left = sorted(set(names) - used)
    if left:
        shown = ", ".join(left[:6]) + (f", ... ({len(left)} in all)" if len(left) > 6 else "")
        raise ConversionError(
            f"{where}: the reference has tensors zoo has no place for: {shown}; "
            f"it uses an option zoo does not have"
        )


_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")


def _count_field(config: Mapping[str, Any], key: str, module: str, count: int) -> str | None:
    """The field of ``config`` that sets the number of ``module`` s (``count``) that ``key`` indexes."""
    word = "expert" if "expert" in module else "layer"
    fields = [f for f, v in config.items() if type(v) is int and v == count and word in f.lower()]
    side = "decoder" if "decoder" in key else ("encoder" if "encoder" in key else None)
    if side == "decoder":
        fields.sort(key=lambda f: "decoder" not in f)
    elif side == "encoder":
        fields.sort(key=lambda f: "decoder" in f)
    return fields[0] if fields else None


def check_counted(read: Iterable[str], left: Iterable[str], config: Mapping[str, Any], where: str) -> None:
    """Refuse source tensors ``left`` unread that are more of what was read: a layer or an expert
    beyond the number that ``config`` (config.json's fields) sets. Read alone, such a checkpoint would
    lose a whole layer without a word, so the message names the tensors and the field to correct."""
    seen: dict[str, list[set[int]]] = {}
    for name in read:
        for values, i in zip(seen.setdefault(_INDEX.sub("#", name), [set() for _ in _INDEX.findall(name)]),
                             map(int, _INDEX.findall(name))):
            values.add(i)
    extra: dict[tuple[str, int], list[str]] = {}  # (module, position) -> the tensors beyond
    for name in left:
        values = seen.get(_INDEX.sub("#", name))
        if values is None:
            continue
        for pos, (m, have) in enumerate(zip(_INDEX.finditer(name), values)):
            if have and int(m.group()) > max(have):
                module = name[:m.start() - 1].rsplit(".", 1)[-1]
                extra.setdefault((module, pos, len(have), name[:m.start() - 1]), []).append(name)
                break
    if extra:
        (module, _, count, prefix), names = next(iter(extra.items()))
        field = _count_field(config, prefix, module, count)
        module = "experts" if "expert" in module else "layers"  # GPT-2's h, T5's block: layers
        told = f"config.json's {field}={count}" if field else f"config.json, which makes {count}"
        shown = ", ".join(sorted(names)[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
        raise ConversionError(f"{where}: the checkpoint holds more {module} than {told}: {shown} would be left out; "
                              f"correct {field or 'config.json'} to the number the weights hold")


def check_mtp(mtp: list[str], skip: bool, reference: str, where: str) -> None:
    """Refuse a checkpoint's multi-token-prediction tensors ``mtp`` (``Architecture.mtp_names``)
    unless the caller chose to ``skip`` them: neither ``reference`` nor zoo holds them, and a
    conversion must not lose them without a word."""
    if mtp and not skip:
        shown = ", ".join(sorted(mtp)[:3]) + (f" (+{len(mtp) - 3} more)" if len(mtp) > 3 else "")
        raise ConversionError(f"{where}: the checkpoint holds a multi-token-prediction module ({shown}) that {reference} "
                              f"does not hold and zoo does not convert; pass skip_mtp=True (zoo convert --skip-mtp) to "
                              f"convert without its {len(mtp)} tensors, which the result lists as ignored")


def check_used(names: Iterable[str], rules: Iterable[Rule], where: str) -> None:
    """Every zoo tensor has a place in the reference; one left over means an option it lacks (the
    converter's checks should have named it, so this is the guard behind them)."""
    left = sorted(set(names) - {r.zoo for r in rules})
    if left:
        shown = ", ".join(left[:6]) + (f", ... ({len(left)} in all)" if len(left) > 6 else "")
        raise ConversionError(f"{where}: zoo's tensors {shown} have no place in the reference; the spec uses an option it does not have")


def _tie_groups(module: nn.Module) -> list[list[str]]:
    """State-dict names that share one tensor (tied weights; parameters over one storage)."""
    return [names for names in tie_groups(module.state_dict(keep_vars=True)).values() if len(names) > 1]


def load_exact(module: nn.Module, state: Mapping[str, Tensor], where: str) -> None:
    """Load ``state`` into ``module``: every name present, and tensors that ``module`` ties equal."""
    for names in _tie_groups(module):
        first = state[names[0]]
        for other in names[1:]:
            if not torch.equal(first, state[other]):
                raise ConversionError(
                    f"{where}: {names[0]!r} and {other!r} are one tied tensor in the target model, but differ in "
                    f"the source (max difference {(first - state[other]).abs().max().item():.3g}); "
                    f"the source does not tie them, so set the target's tying option off"
                )
    result = module.load_state_dict(state, strict=False)
    problems = [*result.missing_keys, *result.unexpected_keys]
    if problems:  # a converter bug, never the user's model
        raise ConversionError(f"{where}: internal name map incomplete: missing {result.missing_keys}, unexpected {result.unexpected_keys}")


def device_dtype(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(module.parameters())
    return p.device, p.dtype
