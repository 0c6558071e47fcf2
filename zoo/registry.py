"""Registries of interchangeable parts.

One registry per kind of part (``attention``, ``position``, ``ffn``, ``norm``, the ``block``
arrangement of a layer, a model's ``head`` and a ViT's ``pool``) and one for model families
(``family``). Each entry pairs a ``kind`` name with

* a pydantic spec class (what a spec file may say about the part), and
* a builder, ``builder(spec, **context) -> nn.Module`` (how the part is made).

Specs are registered by :mod:`zoo.spec` (torch-free), builders by :mod:`zoo.components` and
:mod:`zoo.models`, which :mod:`zoo.build` imports (so ``import zoo`` registers every built-in part),
and a spec can be validated without importing torch. A user adds a part in their own code with
:func:`register` and names it as ``kind`` in a spec file; nothing in zoo is edited.

This module is the bottom of the package: it imports nothing of zoo, nor torch nor pydantic.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

__all__ = ["Registry", "RegistryError", "registry", "register", "REGISTRIES"]


class RegistryError(KeyError, ValueError):
    """An unknown or clashing registry name. Both a KeyError and a ValueError."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def suggest(name: str, known: list[str]) -> str:
    """'; did you mean 'x'?' for the closest known name, or ''."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


class Registry:
    """Name -> (spec class, builder) for one kind of part."""

    def __init__(self, part: str, *, context: str = "") -> None:
        self.part = part
        self.context = context  # the keyword arguments builders receive, for docs and errors
        self._specs: dict[str, type] = {}
        self._builders: dict[str, Callable[..., Any]] = {}
        self.spec_base: type | None = None  # set by zoo.spec: every spec must subclass it

    @property
    def context_keys(self) -> tuple[str, ...]:
        """The names in :attr:`context`: every keyword argument a builder of this part receives."""
        return tuple(k.strip() for k in self.context.split(",") if k.strip())

    def names(self) -> list[str]:
        """Every registered kind, sorted."""
        return sorted(self._specs)

    def __contains__(self, kind: object) -> bool:
        return kind in self._specs

    def __repr__(self) -> str:
        return f"Registry({self.part!r}, kinds={self.names()})"

    def _unknown(self, kind: object) -> RegistryError:
        known = self.names()
        hint = suggest(str(kind), known) if isinstance(kind, str) else ""
        return RegistryError(f"unknown {self.part} kind {kind!r}{hint} (known: {', '.join(known)})")

    def spec(self, kind: str) -> type:
        """The spec class registered for ``kind``; an unknown name lists the known ones."""
        try:
            return self._specs[kind]
        except (KeyError, TypeError):
            raise self._unknown(kind) from None

    def builder(self, kind: str) -> Callable[..., Any]:
        """The builder registered for ``kind``."""
        if kind in self._builders:
            return self._builders[kind]
        if kind in self._specs:
            raise RegistryError(
                f"{self.part} kind {kind!r} has a spec but no builder; "
                f"register one with @zoo.register({self.part!r}, {kind!r})"
            )
        raise self._unknown(kind)

    def add_spec(self, kind: str, spec: type, *, replace: bool = False) -> None:
        if self.spec_base is not None and not (isinstance(spec, type) and issubclass(spec, self.spec_base)):
            raise RegistryError(
                f"{self.part} kind {kind!r}: spec must be a subclass of zoo.spec.{self.spec_base.__name__}, "
                f"got {spec!r}"
            )
        old = self._specs.get(kind)
        if old is not None and old is not spec and not replace:
            raise RegistryError(f"{self.part} kind {kind!r} is already registered (pass replace=True to replace it)")
        self._specs[kind] = spec

    def register(self, kind: str, *, spec: type | None = None, replace: bool = False) -> Callable:
        """Decorator: register ``builder(spec, **context) -> nn.Module`` under ``kind``.

        ``spec`` is the pydantic spec class for the kind (a subclass of this registry's spec base);
        it may be omitted when the spec is already registered (the built-in parts).
        """
        if not isinstance(kind, str) or not kind:
            raise RegistryError(f"{self.part}: a kind must be a non-empty string, got {kind!r}")

        def decorate(builder: Callable[..., Any]) -> Callable[..., Any]:
            if spec is not None:
                self.add_spec(kind, spec, replace=replace)
            elif kind not in self._specs:
                raise RegistryError(f"{self.part} kind {kind!r}: pass its spec class, register({kind!r}, spec=...)")
            if kind in self._builders and self._builders[kind] is not builder and not replace:
                raise RegistryError(f"{self.part} kind {kind!r} already has a builder (pass replace=True to replace it)")
            self._builders[kind] = builder
            return builder

        return decorate


REGISTRIES: dict[str, Registry] = {
    "attention": Registry("attention", context="dim, kv_dim, d_model, dropout, cross"),
    "position": Registry("position", context="dim, max_len, n_heads, head_dim, grid, causal"),
    "ffn": Registry("ffn", context="dim, dropout, norm"),
    "norm": Registry("norm", context="dim"),
    "pool": Registry("pool", context="dim, block"),
    "block": Registry("block", context="dim, dropout, cross"),
    "head": Registry("head", context="dim, vocab_size, norm, embedding, embedding_dim"),
    "family": Registry("family", context=""),
}


def registry(part: str) -> Registry:
    """The registry of one kind of part: attention, position, ffn, norm, pool, block, head or family."""
    try:
        return REGISTRIES[part]
    except KeyError:
        raise RegistryError(
            f"no registry named {part!r}{suggest(part, list(REGISTRIES))} (known: {', '.join(REGISTRIES)})"
        ) from None


def register(part: str, kind: str, *, spec: type | None = None, replace: bool = False) -> Callable:
    """``@zoo.register("ffn", "my_ffn", spec=MyFFNSpec)`` on a ``builder(spec, **context)``."""
    return registry(part).register(kind, spec=spec, replace=replace)
