"""Two-way field tables: an HF config <-> a zoo spec, each mapping declared once.

A converter's table is a tuple of entries, each of which reads its part of the spec from the config
(reference -> zoo), writes its config fields from the spec (zoo -> reference), and claims the spec
paths it expresses (:mod:`zoo.interop.claims`), so what the table maps is what the converter
accepts and everything else is refused by name before anything is written:

- :class:`Field`: one config field <-> one spec path, with its transform each way (identity by
  default) and its default where a config may lack it; claims the path (ANY unless it says otherwise);
- :class:`Fixed`: a spec value the class always has (``block.norm.kind: rmsnorm``); claims that value;
- :class:`Derived`: fields that depend on each other (the attention kind from the heads and the
  key/value heads), read and written by two functions, with the claims it states;
- :class:`Refuse`: a config field zoo has no counterpart for, which must hold one value (written so);
- :class:`Check`: a refusal the claims cannot state because it compares fields (one bias setting);
- :class:`Claim`: a claim alone (a value a field may take that another entry writes);
- :class:`Tokens`: token ids the spec does not know (the caller's, else the reference's defaults);
- :class:`Tensors`: tensor rules a feature adds to each layer (its qk-norm weights);
- :class:`Drop`: removes an earlier entry (a check another trait makes moot).

A trait (:mod:`zoo.interop.hf.traits`) is a tuple of entries that together map a feature; a
class's table is :func:`table` of its parts, where an entry replaces an earlier one with the same
key (a Field or Fixed: its spec path), so a class changes what its base maps by naming it again.
Entries apply in order: a later one may refine a part an earlier one set (the FFN, then its bias).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zoo.interop.claims import ANY, FREE, Claims, one_of, predicate
from zoo.interop.common import Rule, unsupported
from zoo.spec import FamilySpec

__all__ = ["Check", "Claim", "Derived", "Drop", "Entry", "Field", "Fixed", "Refuse", "Tensors", "Tokens", "apply_read",
           "apply_write", "find", "get", "put", "table", "table_claims", "table_rules"]

_REQUIRED = object()


def get(s: Any, path: str) -> Any:
    """The value at a dotted path of a spec."""
    for part in path.split("."):
        s = getattr(s, part)
    return s


def put(s: dict, path: str, value: Any) -> None:
    """Set a dotted path of a spec mapping (the parts made on the way); a ``layers`` list extends the
    layer patterns already read, so several entries may add theirs."""
    *parents, last = path.split(".")
    for part in parents:
        s = s.setdefault(part, {})
    if last == "layers" and not parents:
        s["layers"] = [*s.get("layers", []), *value]
    else:
        s[last] = value


def _identity(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Field:
    """The config field ``config`` <-> the spec path ``path``: ``read`` turns the config's value into
    the spec's, ``write`` the spec's into the config's. ``default`` is what a config without the
    field means (else it must have it). ``claim`` is the path's claim (None: the path is claimed
    elsewhere, or free)."""

    config: str
    path: str
    read: Callable[[Any], Any] = _identity
    write: Callable[[Any], Any] = _identity
    default: Any = _REQUIRED
    claim: Any = ANY

    @property
    def key(self) -> str:
        return self.path

    def read_into(self, c: Any, s: dict, where: str) -> None:
        value = getattr(c, self.config) if self.default is _REQUIRED else getattr(c, self.config, self.default)
        put(s, self.path, self.read(value))

    def write_into(self, s: FamilySpec, c: dict, where: str, given: Mapping) -> None:
        c[self.config] = self.write(get(s, self.path))

    def claimed(self) -> Claims:
        return {} if self.claim is None else {self.path: self.claim}


@dataclass(frozen=True)
class Fixed:
    """A spec value the class always has: read as ``value``, written as nothing (the class has no
    field for it), claimed as that value only (``why``: the words of its refusal)."""

    path: str
    value: Any
    why: str | None = None

    @property
    def key(self) -> str:
        return self.path

    def read_into(self, c: Any, s: dict, where: str) -> None:
        put(s, self.path, self.value)

    def write_into(self, s: FamilySpec, c: dict, where: str, given: Mapping) -> None:
        pass

    def claimed(self) -> Claims:
        if self.why is None:
            return {self.path: one_of(self.value)}
        value = self.value
        return {self.path: predicate(self.why)(lambda v: v == value)}


@dataclass(frozen=True)
class Derived:
    """Config fields and spec paths that depend on each other: ``read(config, where)`` gives
    {spec path: value}, ``write(spec, where)`` {config field: value} (after the claims passed; it
    refuses what they cannot state). ``claims``: the paths it expresses."""

    key: str
    read: Callable[[Any, str], Mapping[str, Any]]
    write: Callable[[FamilySpec, str], Mapping[str, Any]]
    claims: Claims = field(default_factory=dict)

    def read_into(self, c: Any, s: dict, where: str) -> None:
        for path, value in self.read(c, where).items():
            put(s, path, value)

    def write_into(self, s: FamilySpec, c: dict, where: str, given: Mapping) -> None:
        c.update(self.write(s, where))

    def claimed(self) -> Claims:
        return self.claims


@dataclass(frozen=True)
class Refuse:
    """A config field zoo has no counterpart for: reading refuses any value but ``value`` (``why``
    says what zoo computes instead); writing writes ``value`` (unless ``write`` is False). A config
    without the field reads as ``value``."""

    config: str
    value: Any
    why: str
    write: bool = True
    falsy: bool = False  # any false value reads as ``value`` (a flag a config may spell None)

    @property
    def key(self) -> str:
        return f"config:{self.config}"

    def read_into(self, c: Any, s: dict, where: str) -> None:
        got = getattr(c, self.config, self.value)
        if (bool(got) if self.falsy else got != self.value):
            raise unsupported(where, self.config, got, self.why)

    def write_into(self, s: FamilySpec, c: dict, where: str, given: Mapping) -> None:
        if self.write:
            c[self.config] = self.value

    def claimed(self) -> Claims:
        return {}


@dataclass(frozen=True)
class Check:
    """A refusal of the spec path ``path`` the claims cannot state: ``ok(spec)`` must hold, else
    ``why(spec)`` says why. It claims the path ``claim`` (None: claimed elsewhere)."""

    path: str
    ok: Callable[[FamilySpec], bool]
    why: Callable[[FamilySpec], str]
    claim: Any = ANY
    name: str = ""

    @property
    def key(self) -> str:
        return f"check:{self.path}:{self.name}"

    def read_into(self, c: Any, s: dict, where: str) -> None:
        pass

    def write_into(self, s: FamilySpec, c: dict, where: str, given: Mapping) -> None:
        if not self.ok(s):
            value = get(s, self.path)
            raise unsupported(where, self.path, value.model_dump(mode="json") if hasattr(value, "model_dump") else value,
                              self.why(s))

    def claimed(self) -> Claims:
        return {} if self.claim is None else {self.path: self.claim}


@dataclass(frozen=True)
class Claim:
    """A claim alone: the spec path ``path`` takes ``claim`` (another entry reads and writes it)."""

    path: str
    claim: Any

    @property
    def key(self) -> str:
        return f"claim:{self.path}"

    def read_into(self, c: Any, s: dict, where: str) -> None:
        pass

    def write_into(self, s: FamilySpec, c: dict, where: str, given: Mapping) -> None:
        pass

    def claimed(self) -> Claims:
        return {self.path: self.claim}


@dataclass(frozen=True)
class Tokens:
    """Token ids the spec does not know, written as the caller's, else the reference's ``defaults``
    where they fit the vocabulary (a default past it is left out: None; a function of the spec:
    its value as it is)."""

    defaults: Mapping[str, int | None | Callable[[FamilySpec], int]]
    key: str = "tokens"

    def read_into(self, c: Any, s: dict, where: str) -> None:
        pass

    def write_into(self, s: FamilySpec, c: dict, where: str, given: Mapping) -> None:
        for name, default in self.defaults.items():
            if name in given:
                continue
            if callable(default):
                c[name] = default(s)
            else:
                c[name] = default if default is None or default < s.vocab_size else None

    def claimed(self) -> Claims:
        return {}


@dataclass(frozen=True)
class Tensors:
    """Tensor rules a feature adds to each layer: ``rules(spec, z, h)`` for zoo block ``z`` and
    reference layer ``h``."""

    name: str
    rules: Callable[[FamilySpec, str, str], list[Rule]]

    @property
    def key(self) -> str:
        return f"tensors:{self.name}"

    def read_into(self, c: Any, s: dict, where: str) -> None:
        pass

    def write_into(self, s: FamilySpec, c: dict, where: str, given: Mapping) -> None:
        pass

    def claimed(self) -> Claims:
        return {}


@dataclass(frozen=True)
class Drop:
    """In :func:`table`: removes the earlier entry with this key (a check a class's trait makes moot)."""

    key: str


Entry = Field | Fixed | Derived | Refuse | Check | Claim | Tokens | Tensors


def table(*parts: Entry | Drop | tuple) -> tuple[Entry, ...]:
    """The entries of ``parts`` (entries, traits, tables) in order, each replacing an earlier one with
    the same key in its place (a :class:`Drop` removing it)."""
    out: dict[str, Entry] = {}
    for part in parts:
        for entry in (part if isinstance(part, tuple) else (part,)):
            if isinstance(entry, Drop):
                out.pop(entry.key, None)
            else:
                out[entry.key] = entry
    return tuple(out.values())


def find(entries: tuple[Entry, ...], key: str) -> Entry:
    """The entry of a table with this key (a Field or Fixed: its spec path)."""
    return next(e for e in entries if e.key == key)


def table_claims(entries: tuple[Entry, ...]) -> dict[str, Any]:
    """The claims of a table: each entry's, a later one's over an earlier one's; free paths unclaimed."""
    claims: dict[str, Any] = {}
    for entry in entries:
        claims.update({p: c for p, c in entry.claimed().items() if p.split(".")[0] not in FREE})
    return claims


def apply_read(entries: tuple[Entry, ...], c: Any, where: str) -> dict:
    """The spec mapping of the HF config ``c``."""
    s: dict = {}
    for entry in entries:
        entry.read_into(c, s, where)
    return s


def apply_write(entries: tuple[Entry, ...], s: FamilySpec, where: str, given: Mapping) -> dict:
    """The HF config fields of the spec ``s`` (whose claims were checked)."""
    c: dict = {}
    for entry in entries:
        entry.write_into(s, c, where, given)
    return c


def table_rules(entries: tuple[Entry, ...], s: FamilySpec, z: str, h: str) -> list[Rule]:
    """The layer tensor rules the table's :class:`Tensors` entries add."""
    return [r for entry in entries if isinstance(entry, Tensors) for r in entry.rules(s, z, h)]
