"""Which kernel runs: one policy object for the whole process.

What a part computes lives in the components, how a kernel computes it in :mod:`zoo.kernels`; this
module says which kernel runs. Every choice the dispatchers make reads one :class:`Policy`:

============== ================================ =====================================================
field          values (default first)           what it steers
============== ================================ =====================================================
attention      auto, dense, blocked, flex       the backend of a structured mask (windows, packed
                                                documents, biases): ``auto`` is FlexAttention on CUDA
                                                and blocked on a CPU where the mask bounds its keys
                                                enough (by rule, or measured), else dense SDPA
cpu_attention  measure, rule, sdpa              zoo's CPU attention kernel or SDPA's: chosen by timing
                                                each shape class once per machine, by the length
                                                rule, or never zoo's (so a forced SDPA kernel applies)
cpu_linear     auto, onednn, aten               fp32 CPU linears: measured per shape class, or pinned
cache          a file, or ``off``               where measured choices persist (default
                                                ``<cache dir>/kernels-<machine>.json``)
============== ================================ =====================================================

The environment is read once, at the first question: ``ZOO_ATTENTION``, ``ZOO_CPU_ATTENTION``,
``ZOO_CPU_LINEAR``, ``ZOO_KERNEL_CACHE``, and ``ZOO_CACHE_DIR`` (one cache directory for the data
caches and the kernel choices; else ``$XDG_CACHE_HOME/zoo`` or ``~/.cache/zoo``). Python sets it
with :func:`use` (for the rest of the process, or within a ``with`` block), a recipe with ``run.*``
(:func:`zoo.train.attention_kernels`), and ``zoo kernels --explain SPEC`` prints it with the kernel
each call of a model's step took.

Nothing decides or measures inside a compiled region (``torch.compile``): there the rule stands,
or a choice already made, and zoo's eager-only kernels step aside for the compiler's.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from zoo.dirs import cache_dir

__all__ = ["FIELDS", "Policy", "cache_dir", "explaining", "note", "policy", "sources", "use"]

FIELDS: dict[str, tuple[str, ...] | None] = {  # field -> allowed values (None: free text)
    "attention": ("auto", "dense", "blocked", "flex"),
    "cpu_attention": ("measure", "rule", "sdpa"),
    "cpu_linear": ("auto", "onednn", "aten"),
    "cache": None,
}
_ENV = {"attention": "ZOO_ATTENTION", "cpu_attention": "ZOO_CPU_ATTENTION", "cpu_linear": "ZOO_CPU_LINEAR",
        "cache": "ZOO_KERNEL_CACHE"}


@dataclass(frozen=True)
class Policy:
    """The kernel choices in force (see the module's table)."""

    attention: str = "auto"
    cpu_attention: str = "measure"
    cpu_linear: str = "auto"
    cache: str = ""  # "": the default file under cache_dir(); "off": memory only


def _check(field: str, value: Any, where: str) -> str:
    if field not in FIELDS:
        raise ValueError(f"kernel policy: unknown field {field!r}; use one of {', '.join(FIELDS)}")
    value = "" if value is None else str(value).strip()
    allowed = FIELDS[field]
    if field != "cache":
        value = value.lower() or allowed[0]
        if value not in allowed:
            raise ValueError(f"{where}={value!r}: use one of {', '.join(allowed)}")
    return value


def _from_env() -> tuple[Policy, dict[str, str]]:
    values, origin = {}, {}
    for field, name in _ENV.items():
        raw = os.environ.get(name, "").strip()
        if raw:
            values[field], origin[field] = _check(field, raw, name), f"environment ({name})"
    return Policy(**values), origin


_current: Policy | None = None
_origin: dict[str, str] = {}


def policy() -> Policy:
    """The policy in force (the environment's, read at the first call, with :func:`use`'s changes)."""
    global _current, _origin
    if _current is None:
        _current, _origin = _from_env()
    return _current


def sources() -> dict[str, str]:
    """Where each field's value comes from: ``default``, ``environment (NAME)``, or ``use()``."""
    policy()
    return {f: _origin.get(f, "default") for f in FIELDS}


class use:
    """Set kernel choices: ``zoo.kernels.use(cpu_linear="aten")`` holds for the rest of the process;
    ``with zoo.kernels.use(attention="dense"): ...`` only within the block (or until ``.restore()``).
    Each keyword is a :class:`Policy` field; None leaves a field as it is. ``from_env=True`` first
    reads the environment again (a process that changed it)."""

    def __init__(self, *, from_env: bool = False, **changes: str | None) -> None:
        global _current, _origin
        before, before_origin = policy(), dict(_origin)
        base, origin = _from_env() if from_env else (before, dict(_origin))
        fields = {}
        for field, value in changes.items():
            if value is not None:
                fields[field] = _check(field, value, f"zoo.kernels.use({field}=...)")
                origin[field] = "use()"
        self._saved = (before, before_origin)
        _current, _origin = dataclasses.replace(base, **fields), origin

    def restore(self) -> None:
        """Back to the policy before this call."""
        global _current, _origin
        _current, _origin = self._saved

    def __enter__(self) -> Policy:
        return policy()

    def __exit__(self, *exc) -> None:
        self.restore()


# ------------------------------------------------------------------ what ran, for --explain
_notes: list[tuple[str, str, str]] | None = None


class explaining:
    """Within this block each dispatch records ``(op, shapes, kernel)`` in ``.calls`` (``zoo kernels
    --explain``); outside it recording costs one ``is None`` test."""

    def __enter__(self) -> "explaining":
        global _notes
        self._outer, _notes = _notes, []
        self.calls = _notes
        return self

    def __exit__(self, *exc) -> None:
        global _notes
        _notes = self._outer


def note(op: str, kernel: str, *inputs) -> None:
    """Record one dispatch decision, ``kernel`` for ``op`` on ``inputs`` (tensors: their shapes and
    the first one's dtype), where :class:`explaining` is on; elsewhere nothing is read."""
    if _notes is not None:
        shapes = " x ".join("[" + ", ".join(str(n) for n in t.shape) + "]" for t in inputs)
        _notes.append((op, f"{shapes} {str(inputs[0].dtype).removeprefix('torch.')}" if inputs else "", kernel))
