"""The embedded English-German corpus of the translation recipe, in domains:

- ``ding``: whole everyday sentences of the Ding dictionary (Debian's ``trans-de-en``);
- ``messages``: software messages from the German gettext catalogs of the packages listed in
  ``catalogs-de.txt`` (compiler diagnostics, command-line help, GUI labels);
- ``stories``: the dialogue and narrative of Wesnoth's campaigns and of Dink Smallwood.

Near-duplicates are removed over all domains together before any split (the key ignores case,
punctuation, accent forms, whitespace, digits and format placeholders, on both sides), so no test
sentence, source or target, has a near-duplicate in any training set. Each domain then gets its own
valid and test split; training uses the union.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from zoo.atomic import atomic_write_text
from zoo.data.common import DataError
from zoo.data.messages import read_catalogs
from zoo.data.translation import DING_PATH, Pairs, dedupe, read_ding, split

__all__ = ["DOMAINS", "CATALOG_LIST", "Corpus", "build_corpus", "catalog_packages", "catalogs_dir", "parse_corpus",
           "write_tsv"]

DOMAINS = ("ding", "messages", "stories")
ALIASES = {"both": ("ding", "messages"), "all": DOMAINS}
CATALOG_LIST = Path(__file__).with_name("catalogs-de.txt")
CATALOG_HINT = "fetch them with: bash tools/install-data (Debian/Ubuntu; it downloads the packages of zoo/data/catalogs-de.txt)"


def catalog_hint(domain: str = "messages") -> str:
    return CATALOG_HINT.replace("install-data", "install-data stories") if domain == "stories" else CATALOG_HINT


def parse_corpus(name: str) -> tuple[str, ...]:
    """``ding``, ``messages``, ``stories``, ``both`` (ding + messages), ``all``, or domains joined
    by ``+`` (``ding+stories``) -> the domains, in reading order."""
    parts = ALIASES.get(name) or tuple(p.strip() for p in name.split("+"))
    unknown = [p for p in parts if p not in DOMAINS]
    if unknown or not parts:
        raise DataError(f"data.corpus: unknown domain {unknown[0] if unknown else name!r}; choose from "
                        f"{', '.join(DOMAINS)}, 'both' (ding+messages), 'all', or domains joined by '+'")
    return tuple(d for d in DOMAINS if d in parts)


def catalogs_dir() -> Path:
    """Where tools/install-data puts the German catalogs: ``$ZOO_DATA/catalogs-de``, by default
    ``${XDG_DATA_HOME:-~/.local/share}/zoo/catalogs-de``."""
    root = os.environ.get("ZOO_DATA") or Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "zoo"
    return Path(root) / "catalogs-de"


def catalog_packages(domain: str, path: Path = CATALOG_LIST) -> list[str]:
    """The packages of ``domain`` in ``catalogs-de.txt``, in reading order."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        cols = line.split()
        if len(cols) == 2 and not line.startswith("#") and cols[0] == domain:
            out.append(cols[1])
    return out


@dataclass
class Corpus:
    """Per-domain splits (``splits[domain][split]``), what was dropped per domain by reason,
    catalogs that could not be read, and the size and fingerprint of each domain."""

    splits: dict[str, dict[str, Pairs]] = field(default_factory=dict)
    dropped: dict[str, Counter] = field(default_factory=dict)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    missing_packages: list[str] = field(default_factory=list)
    stats: dict[str, dict] = field(default_factory=dict)

    @property
    def domains(self) -> list[str]:
        return list(self.splits)

    def union(self, split: str, repeat: Mapping[str, int] | None = None) -> Pairs:
        """``split`` of every domain, concatenated in domain order; ``repeat[domain]`` copies of a
        domain's pairs (oversampling; 1 where not named)."""
        unknown = set(repeat or {}) - set(self.splits)
        if unknown:
            raise DataError(f"cannot repeat {', '.join(sorted(unknown))}: the corpus has {', '.join(self.splits)}")
        out = Pairs()
        for domain, parts in self.splits.items():
            n = (repeat or {}).get(domain, 1)
            out.src += parts[split].src * n
            out.tgt += parts[split].tgt * n
        return out

    def summary(self) -> dict:
        return {"domains": self.stats, "unreadable": [list(u) for u in self.unreadable],
                "missing_packages": self.missing_packages}


def fingerprint(pairs: Pairs) -> str:
    """sha256 of the sorted ``source<TAB>target`` lines: equal for equal corpora, whatever the order."""
    h = hashlib.sha256()
    for s, t in sorted(zip(pairs.src, pairs.tgt)):
        h.update(f"{s}\t{t}\n".encode())
    return h.hexdigest()


def _read_domain(domain: str, *, ding_path: Path, catalogs: Path, catalog_list: Path, missing: list[str]):
    """(pairs as English -> German, dropped counts, unreadable catalogs) of one domain."""
    if domain == "ding":
        raw = read_ding(ding_path)
        return Pairs(raw.tgt, raw.src), Counter(raw.dropped), []
    if not catalogs.is_dir():
        raise DataError(f"no German message catalogs at {catalogs}; {catalog_hint(domain)}")
    paths = []
    for pkg in catalog_packages(domain, catalog_list):
        found = sorted((catalogs / pkg).glob("*.mo"))
        if not found:
            missing.append(pkg)
        paths += found
    if not paths:
        raise DataError(f"no catalogs of the {domain!r} domain under {catalogs}; {catalog_hint(domain)}")
    got = read_catalogs(paths)
    return Pairs(got.src, got.tgt), Counter(got.dropped), got.unreadable


def build_corpus(
    corpus: str = "both",
    *,
    direction: str = "en-de",
    valid: int = 500,
    test: int = 1000,
    seed: int = 1234,
    ding_path: str | Path = DING_PATH,
    catalogs: str | Path | None = None,
    catalog_list: str | Path = CATALOG_LIST,
) -> Corpus:
    """Read the domains of ``corpus``, drop near-duplicates over all of them (the first of each
    normalised source and each normalised target is kept, domains in order ding, messages, stories),
    and split each domain into train / valid / test with a fixed seed. ``catalogs`` is the folder
    tools/install-data fills (one subfolder of ``.mo`` files per package of ``catalog_list``)."""
    if direction not in ("en-de", "de-en"):
        raise DataError(f"direction must be 'en-de' or 'de-en', got {direction!r}")
    catalogs = Path(catalogs) if catalogs is not None else catalogs_dir()
    out = Corpus()
    seen: tuple[set[str], set[str]] = (set(), set())  # normalised sources and targets, over all domains
    for domain in parse_corpus(corpus):
        pairs, dropped, unreadable = _read_domain(domain, ding_path=Path(ding_path), catalogs=catalogs,
                                                  catalog_list=Path(catalog_list), missing=out.missing_packages)
        out.unreadable += unreadable
        kept = dedupe(Pairs(pairs.src, pairs.tgt, dropped), seen=seen, reason="near-duplicate")
        if valid + test >= len(kept):
            raise DataError(f"the {domain!r} domain has {len(kept)} pairs after cleaning and deduplication, too few "
                            f"for {valid} valid + {test} test pairs and a training set; lower data.valid / data.test")
        if direction == "de-en":
            kept = Pairs(kept.tgt, kept.src, kept.dropped)
        parts = split(kept, valid=valid, test=test, seed=seed)
        out.splits[domain] = {k: parts[k] for k in ("train", "valid", "test")}
        out.dropped[domain] = kept.dropped
        out.stats[domain] = {"pairs": len(kept), "sha256": fingerprint(kept),
                             **{k: len(v) for k, v in out.splits[domain].items()}, "dropped": dict(kept.dropped)}
    return out


def write_tsv(pairs: Pairs, path: Path) -> None:
    """``source<TAB>target`` lines (tabs and line breaks inside a sentence become spaces)."""
    clean = lambda x: " ".join(x.split())  # noqa: E731
    atomic_write_text(path, "".join(f"{clean(s)}\t{clean(t)}\n" for s, t in zip(pairs.src, pairs.tgt)))
