"""English-German pairs from gettext message catalogs: the msgid/msgstr pairs that Debian's German
translators wrote for programs (compiled ``.mo`` files), read with the standard library's gettext.

Cleaning keeps what a translator would accept as a training pair and counts everything it drops,
by reason:

- whitespace unwrapped (line breaks and runs of spaces become one space);
- plural entries give one pair, the English singular with the first German form (the standard
  reader keeps no English plural);
- empty and untranslated (msgstr == msgid) entries dropped, and so are entries without a letter and
  the catalog header; fuzzy entries never reach a compiled catalog (msgfmt leaves them out);
- keyboard mnemonics (``_Open`` / ``Ö_ffnen``, ``&File`` / ``&Datei``) removed, since they mark a key,
  not a word; an underscore or ampersand that the other side repeats verbatim (``max_connections``)
  is part of the text and stays;
- format placeholders (``%s``, ``%1$s``, ``%(name)s``, ``{name}``, ``$VAR``) kept verbatim;
- entries longer than ``max_words`` dropped (multi-paragraph help screens).

A catalog that cannot be read (a wrong magic number, truncated, undecodable bytes) is skipped with
its path and the reason; it never stops the others.
"""

from __future__ import annotations

import gettext
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from zoo.data.common import DataError

__all__ = ["Catalog", "CatalogPairs", "clean_pair", "read_catalog", "read_catalogs", "PLACEHOLDER"]

# printf (%s, %-10.3lu, %1$s, %<PRIu64>; not the space flag, so "100% sure" is text), Python (%(name)s,
# {name}, {0:>4}), Qt/KDE (%1), shell ($VAR, ${VAR})
PLACEHOLDER = re.compile(
    r"%(?:\d+\$)?[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t|I)?[diouxXeEfFgGaAcspnm]"
    r"|%<PRI[a-zA-Z0-9]+>"
    r"|%\([A-Za-z_][\w.]*\)[-+ #0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"
    r"|\{[A-Za-z_0-9][\w.\[\]]*(?:![rsa])?(?::[^{}]*)?\}|\{\}"
    r"|%\d+"
    r"|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?"
)
_LETTER = re.compile(r"[^\W\d_]")
_WS = re.compile(r"\s+")
_MNEMONIC = {"_": re.compile(r"(?<![_\w])_(?=\w)|(?<=[^\W\d_])_(?=[^\W\d_])"), "&": re.compile(r"&(?=[^\W\d_])(?![A-Za-z]+;)")}


@dataclass
class CatalogPairs:
    """(English, German) pairs of some catalogs, what was dropped by reason, and what could not be read."""

    src: list[str] = field(default_factory=list)
    tgt: list[str] = field(default_factory=list)
    origin: list[str] = field(default_factory=list)  # the catalog (file stem) each pair came from
    dropped: Counter = field(default_factory=Counter)
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    catalogs: list[str] = field(default_factory=list)  # the catalogs read

    def __len__(self) -> int:
        return len(self.src)


@dataclass(frozen=True)
class Catalog:
    """Where a catalog lives and which Debian package ships it."""

    package: str
    path: Path


def unwrap(text: str) -> str:
    return _WS.sub(" ", text).strip()


def _strip_mnemonic(text: str, other: str) -> str:
    """``text`` without keyboard-mnemonic markers, unless the marked word appears verbatim in
    ``other`` (then it is an identifier such as ``max_connections``, not a mnemonic)."""
    for mark, pattern in _MNEMONIC.items():
        if mark not in text or text.count(mark) != 1:
            continue
        m = pattern.search(text)
        if m is None:
            continue
        word = re.search(r"\S*$", text[: m.start()]).group(0) + mark + re.match(r"\S*", text[m.end() :]).group(0)
        if word in other:
            continue
        text = text[: m.start()] + text[m.end() :]
    return text


def clean_pair(msgid: str, msgstr: str, *, max_words: int = 80) -> tuple[str, str] | str:
    """The cleaned (English, German) pair, or the reason it is dropped."""
    if not msgstr or not msgstr.strip():
        return "untranslated (empty msgstr)"
    src, tgt = unwrap(msgid), unwrap(msgstr)
    if src == tgt:
        return "untranslated (msgstr == msgid)"
    src, tgt = _strip_mnemonic(src, tgt), _strip_mnemonic(tgt, src)
    if not _LETTER.search(PLACEHOLDER.sub(" ", src)) or not _LETTER.search(PLACEHOLDER.sub(" ", tgt)):
        return "no letters"
    if src == tgt:
        return "untranslated (msgstr == msgid)"
    if max(len(src.split()), len(tgt.split())) > max_words:
        return f"longer than {max_words} words"
    return src, tgt


class _Reader(gettext.GNUTranslations):
    """The standard library's ``.mo`` parser (it decodes with the catalog's declared charset and does
    not choke on odd header dates, as Babel's ``read_mo`` does on ~2% of Debian's German catalogs)."""

    def entries(self) -> list[tuple[str, str]]:
        out = []
        for key, msgstr in self._catalog.items():
            if isinstance(key, tuple):  # a plural entry: (singular msgid, form index)
                msgid, form = key
                if form != 0:
                    continue
            else:
                msgid = key
            msgid = msgid.rsplit("\x04", 1)[-1]  # msgctxt EOT msgid
            if msgid:  # msgid "" is the header
                out.append((msgid, msgstr))
        return out


def read_catalog(path: str | Path) -> list[tuple[str, str]]:
    """(msgid, msgstr) entries of one compiled catalog (``.mo``) in file order, the header left out;
    a plural entry gives its singular with the first German form. Raises DataError naming the file
    and the reason when it cannot be read (a wrong magic number, a truncated file, undecodable bytes)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _Reader(f).entries()
    except FileNotFoundError:
        raise DataError(f"{path}: no such catalog") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: undecodable bytes ({e.encoding}: {e.reason} at byte {e.start})") from None
    except OSError as e:  # a wrong magic number, an unknown version, offsets past the end
        raise DataError(f"{path}: {e.strerror or e}") from None
    except (struct.error, IndexError, ValueError) as e:  # tables cut short, a malformed header
        raise DataError(f"{path}: truncated or corrupt ({e})") from None
    except LookupError as e:
        raise DataError(f"{path}: unknown charset in the header ({e})") from None


def read_catalogs(paths: Iterable[str | Path], *, max_words: int = 80) -> CatalogPairs:
    """Cleaned pairs of several catalogs in the given order; unreadable catalogs are listed with
    their reason in ``unreadable`` and skipped."""
    pairs = CatalogPairs()
    for path in paths:
        path = Path(path)
        try:
            entries = read_catalog(path)
        except DataError as e:
            pairs.unreadable.append((str(path), str(e).split(": ", 1)[-1]))
            continue
        pairs.catalogs.append(str(path))
        for msgid, msgstr in entries:
            got = clean_pair(msgid, msgstr, max_words=max_words)
            if isinstance(got, str):
                pairs.dropped[got] += 1
                continue
            pairs.src.append(got[0])
            pairs.tgt.append(got[1])
            pairs.origin.append(path.stem)
    return pairs
