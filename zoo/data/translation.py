"""Parallel text for translation: the embedded Ding dictionary pairs, real parallel files, the special
tokens of the shared source-target BPE (zoo.data.bpe), and token-bucket batching.

Nothing is dropped silently: every reader returns what it kept and counts of what it dropped, and
malformed input fails with the file and line.
"""

from __future__ import annotations

import math
import random
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from zoo.data.common import DataError, read_lines
from zoo.data.messages import PLACEHOLDER

DING_PATH = Path("/usr/share/trans/de-en")
INSTALL_HINT = "install the embedded default data with: apt-get install trans-de-en (Debian/Ubuntu)"

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]  # ids 0, 1, 2, 3 (train the BPE with unk=UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIALS))


@dataclass
class Pairs:
    """Sentence pairs (source, target) and what was dropped on the way, by reason."""

    src: list[str] = field(default_factory=list)
    tgt: list[str] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self.src)

    def add(self, s: str, t: str) -> None:
        self.src.append(s)
        self.tgt.append(t)


# --------------------------------------------------------------------------------- the Ding pairs
_SHORTHAND = re.compile(r"\b(sb|sth|jdn|jdm|jds|etw|jd|so|smb|smth)\.", re.IGNORECASE)
_BRACKETS = re.compile(r"[\[\]{}()<>/]|…|\.\.\.")
_SLASHED = re.compile(r"(\w[\w’'-]*)(?:/[\w’'-]+)+")  # "abgemacht/ausgemacht" -> "abgemacht"
_SENTENCE_END = (".", "?", "!")


def is_sentence(text: str) -> bool:
    """A whole everyday sentence: capitalised, ends in . ? !, 3-60 words, no dictionary shorthand
    (sb./sth./jdn./etw.), no bracketed notes or slashed alternatives."""
    words = text.split()
    return (
        3 <= len(words) <= 60
        and text[:1].isupper()
        and text.endswith(_SENTENCE_END)
        and not _SHORTHAND.search(text)
        and not _BRACKETS.search(text)
        and ";" not in text
    )


def read_ding(path: str | Path = DING_PATH) -> Pairs:
    """German-English sentence pairs of the Ding dictionary (``de :: en`` lines, sub-entries
    aligned on `` | ``). Returns pairs as (German, English)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no Ding dictionary at {path}; {INSTALL_HINT}")
    pairs = Pairs()
    with open(path, encoding="utf-8", errors="strict") as f:
        for lineno, line in enumerate(_lines(f, path), start=1):
            if line.startswith("#") or not line.strip():
                continue
            sides = line.rstrip("\n").split(" :: ")
            if len(sides) != 2:
                pairs.dropped["not one ' :: '"] += 1
                continue
            de_parts, en_parts = sides[0].split(" | "), sides[1].split(" | ")
            if len(de_parts) != len(en_parts):
                pairs.dropped["sub-entries not aligned"] += 1
                continue
            for de, en in zip(de_parts, en_parts):
                for d, e in _alternatives(de, en):
                    if is_sentence(d) and is_sentence(e):
                        pairs.add(d, e)
                    else:
                        pairs.dropped["not a sentence pair"] += 1
    return pairs


def _alternatives(de: str, en: str) -> list[tuple[str, str]]:
    """Pairs from one aligned sub-entry; ``; `` separates alternatives. Equal counts pair in order;
    one sentence against several pairs with the first. A slash between two words keeps the first
    ("abgemacht/ausgemacht" -> "abgemacht"); spaced slashes join longer alternatives, which cannot
    be resolved safely, so those sentences are dropped."""
    if "/" in de:
        de = _SLASHED.sub(r"\1", de)
    if "/" in en:
        en = _SLASHED.sub(r"\1", en)
    ds, es = [x.strip() for x in de.split("; ")], [x.strip() for x in en.split("; ")]
    if len(ds) == len(es):
        return list(zip(ds, es))
    if len(ds) == 1 or len(es) == 1:
        return [(ds[0], es[0])]
    return [(de, en)]  # unalignable: fails the sentence test (it contains ';')


def _lines(f, path: Path) -> Iterator[str]:
    lineno = 0
    while True:
        try:
            line = f.readline()
        except UnicodeDecodeError as e:
            raise DataError(f"{path}:{lineno + 1}: not valid UTF-8 ({e.reason}); re-encode the file as UTF-8") from None
        if not line:
            return
        lineno += 1
        yield line


def normalise(text: str) -> str:
    """The key for near-duplicate detection: format placeholders (``%s``, ``%1$s``, ``{name}``, ``$VAR``)
    collapse to one token, every digit run to ``0``, and case, punctuation, accent forms and
    whitespace are ignored. "Cannot open %s: %d." and "cannot open {path} (2)" share a key."""
    text = unicodedata.normalize("NFKC", text)
    text = PLACEHOLDER.sub(" 0 ", text).lower().replace("’", "'")
    text = re.sub(r"\d+", "0", text)
    return " ".join(re.sub(r"[^\w']+|_", " ", text).split())


def dedupe(pairs: Pairs, *, seen: tuple[set[str], set[str]] | None = None, reason: str = "duplicate") -> Pairs:
    """Keep the first pair of each normalised source AND each normalised target, so that no sentence
    (on either side) can land in two splits; drops are counted under ``reason``. ``seen`` (the
    normalised sources and targets kept so far, updated in place) deduplicates across several calls."""
    out = Pairs(dropped=Counter(pairs.dropped))
    seen_src, seen_tgt = seen if seen is not None else (set(), set())
    for s, t in zip(pairs.src, pairs.tgt):
        ks, kt = normalise(s), normalise(t)
        if ks in seen_src or kt in seen_tgt:
            out.dropped[reason] += 1
            continue
        seen_src.add(ks)
        seen_tgt.add(kt)
        out.add(s, t)
    return out


def split(pairs: Pairs, *, valid: int, test: int, seed: int = 1234) -> dict[str, Pairs]:
    """A deterministic shuffle-and-cut into train / valid / test (dedupe first)."""
    if valid + test >= len(pairs):
        raise DataError(f"{len(pairs)} pairs cannot give {valid} valid + {test} test pairs and a training set")
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    cuts = {"test": order[:test], "valid": order[test : test + valid], "train": order[test + valid :]}
    return {name: Pairs([pairs.src[i] for i in idx], [pairs.tgt[i] for i in idx]) for name, idx in cuts.items()}


def ding_splits(
    *, direction: str = "en-de", valid: int = 500, test: int = 1000, seed: int = 1234, path: str | Path = DING_PATH
) -> tuple[dict[str, Pairs], Counter]:
    """The embedded default: Ding sentence pairs, deduplicated, split; ``direction`` en-de or de-en."""
    if direction not in ("en-de", "de-en"):
        raise DataError(f"direction must be 'en-de' or 'de-en', got {direction!r}")
    raw = read_ding(path)
    if direction == "en-de":
        raw = Pairs(raw.tgt, raw.src, raw.dropped)
    pairs = dedupe(raw)
    return split(pairs, valid=valid, test=test, seed=seed), pairs.dropped


# ------------------------------------------------------------------------------ real parallel data
def read_parallel(src_path: str | Path, tgt_path: str | Path) -> Pairs:
    """Two aligned plain-text files, one sentence a line (the WMT layout: train.en / train.de)."""
    src_lines, tgt_lines = _read_lines(Path(src_path)), _read_lines(Path(tgt_path))
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}; parallel files must align line by line"
        )
    pairs = Pairs()
    for s, t in zip(src_lines, tgt_lines):
        if s.strip() and t.strip():
            pairs.add(s.strip(), t.strip())
        else:
            pairs.dropped["empty side"] += 1
    return pairs


def read_tsv(path: str | Path) -> Pairs:
    """Tab-separated pairs, ``source<TAB>target`` a line."""
    pairs = Pairs()
    for lineno, line in enumerate(_read_lines(Path(path)), start=1):
        cols = line.split("\t")
        if len(cols) != 2:
            raise DataError(f"{path}:{lineno}: expected 2 tab-separated columns (source, target), got {len(cols)}")
        if cols[0].strip() and cols[1].strip():
            pairs.add(cols[0].strip(), cols[1].strip())
        else:
            pairs.dropped["empty side"] += 1
    return pairs


def read_folder(root: str | Path, src_lang: str, tgt_lang: str) -> dict[str, Pairs]:
    """train / valid / test pairs of a folder: ``{split}.tsv`` or ``{split}.{src_lang}`` + ``{split}.{tgt_lang}``
    (the WMT layout); test may be absent (empty pairs)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data.path {root} is not a folder (want train.{src_lang}/train.{tgt_lang} or train.tsv)")
    splits = {}
    for name in ("train", "valid", "test"):
        tsv, src, tgt = root / f"{name}.tsv", root / f"{name}.{src_lang}", root / f"{name}.{tgt_lang}"
        if tsv.is_file():
            splits[name] = read_tsv(tsv)
        elif src.is_file() or tgt.is_file():
            splits[name] = read_parallel(src, tgt)
        elif name == "test":
            splits[name] = Pairs()
        else:
            raise DataError(f"no {name} data in {root}: want {src.name} and {tgt.name}, or {tsv.name}")
    return splits


def _read_lines(path: Path) -> list[str]:
    lines = read_lines(path)
    if not "".join(lines).strip(" \t\n\r\x0b\x0c"):  # only ASCII whitespace, as bytes.strip() sees it
        raise DataError(f"{path} is empty")
    return lines


# ---------------------------------------------------------------------------- token-bucket batches
def token_batches(
    src_lens: Sequence[int],
    tgt_lens: Sequence[int],
    *,
    max_tokens: int,
    shuffle: bool = True,
    seed: int = 0,
) -> list[list[int]]:
    """Batches of example indices holding at most ``max_tokens`` padded source tokens and as many
    padded target tokens (the paper: ~25k + 25k), sentences of similar length together.

    Sorting by length (ties broken at random when shuffling) keeps padding low; the batch order
    is shuffled so training does not see lengths in order."""
    rng = random.Random(seed)
    keys = [(max(s, t), rng.random() if shuffle else i) for i, (s, t) in enumerate(zip(src_lens, tgt_lens))]
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    batches, batch, longest_s, longest_t = [], [], 0, 0
    for i in order:
        s, t = max(longest_s, src_lens[i]), max(longest_t, tgt_lens[i])
        if batch and (len(batch) + 1) * max(s, t) > max_tokens:
            batches.append(batch)
            batch, s, t = [], src_lens[i], tgt_lens[i]
        if max(src_lens[i], tgt_lens[i]) > max_tokens:
            raise DataError(f"example {i} has {max(src_lens[i], tgt_lens[i])} tokens, more than max_tokens ({max_tokens})")
        batch.append(i)
        longest_s, longest_t = s, t
    if batch:
        batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


def pack_pairs(
    src_lens: Sequence[int],
    tgt_lens: Sequence[int],
    *,
    src_len: int,
    tgt_len: int,
    seed: int = 0,
    chunk: int = 4096,
) -> list[list[int]]:
    """Sentence pairs packed into rows of at most ``src_len`` source and ``tgt_len`` target tokens
    (each row's pairs then attend only to each other through document masks: see
    :func:`collate_packed`). The pairs are shuffled, then packed ``chunk`` at a time, longest target
    first, each into the open row of the chunk with the least target room that holds both of its
    sides (best-fit decreasing); a pair longer than a row takes a row of its own. Returns each row's
    pair indices."""
    if src_len < 1 or tgt_len < 1:
        raise DataError(f"packed rows need room: got {src_len} source and {tgt_len} target tokens a row")
    order = list(range(len(src_lens)))
    random.Random(seed).shuffle(order)
    rows: list[list[int]] = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c : c + chunk], key=lambda i: (-tgt_lens[i], -src_lens[i]))
        by_room: list[dict[int, None]] = [{} for _ in range(tgt_len + 1)]  # open rows by target room left
        room_src: dict[int, int] = {}
        for i in part:
            s, t = src_lens[i], tgt_lens[i]
            if s > src_len or t > tgt_len:
                rows.append([i])
                continue
            room, row = next(((k, r) for k in range(t, tgt_len + 1) for r in by_room[k] if room_src[r] >= s),
                             (tgt_len, None))
            if row is None:
                row = len(rows)
                rows.append([])
                room_src[row] = src_len
            else:
                del by_room[room][row]
            rows[row].append(i)
            room_src[row] -= s
            if room - t > 0 and room_src[row] > 0:
                by_room[room - t][row] = None
    return rows


def source_row_len(src_lens: Sequence[int], tgt_lens: Sequence[int], tgt_len: int) -> int:
    """The source row that goes with target rows of ``tgt_len``: in proportion to the pairs' source
    and target tokens, rounded up."""
    return math.ceil(tgt_len * sum(src_lens) / max(1, sum(tgt_lens)))


def packed_batches(src_lens: Sequence[int], tgt_lens: Sequence[int], *, src_len: int, tgt_len: int, max_tokens: int,
                   seed: int = 0) -> list[list[list[int]]]:
    """Token buckets (:func:`token_batches`, ``max_tokens``) of the rows :func:`pack_pairs` packs:
    each batch a list of rows, each row a list of pair indices."""
    rows = pack_pairs(src_lens, tgt_lens, src_len=src_len, tgt_len=tgt_len, seed=seed)
    lens = [sum(src_lens[i] for i in r) for r in rows], [sum(tgt_lens[i] for i in r) for r in rows]
    return [[rows[i] for i in b] for b in token_batches(*lens, max_tokens=max_tokens, seed=seed)]


def collate_packed(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], rows: list[list[int]], *,
                   pad_id: int = 0, bos_id: int = 1):
    """:func:`collate` for packed rows (lists of pair indices): src [B, S], tgt_in [B, T] (each pair's
    target after its own ``<s>``), tgt_out [B, T], and the document ids of each source and target
    token, src_documents [B, S] and tgt_documents [B, T] (the k-th pair of a row is document k; the
    padding after a row's last pair keeps that pair's id, so no query is left without keys)."""
    import torch

    flat = lambda seqs: [[x for i in r for x in seqs[i]] for r in rows]  # noqa: E731
    ids = lambda seqs: [[k for k, i in enumerate(r) for _ in seqs[i]] for r in rows]  # noqa: E731
    t_in = [[x for i in r for x in (bos_id, *tgt[i][:-1])] for r in rows]
    out = []
    for seqs, fill in ((flat(src), pad_id), (t_in, pad_id), (flat(tgt), pad_id), (ids(src), None), (ids(tgt), None)):
        n = max(len(x) for x in seqs)
        out.append(torch.tensor([x + [x[-1] if fill is None else fill] * (n - len(x)) for x in seqs], dtype=torch.long))
    return tuple(out)


def padding_fraction(batches: Iterable[list[int]], lens: Sequence[int]) -> float:
    """Share of padded positions among all positions of the batches."""
    real = padded = 0
    for b in batches:
        longest = max(lens[i] for i in b)
        real += sum(lens[i] for i in b)
        padded += longest * len(b)
    return 1 - real / padded if padded else 0.0


def collate(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], idx: list[int], *, pad_id: int = 0, bos_id: int = 1):
    """Padded tensors for a batch: src [B, S], tgt_in [B, T] (<s> + target[:-1]), tgt_out [B, T]."""
    import torch

    S = max(len(src[i]) for i in idx)
    T = max(len(tgt[i]) for i in idx)
    s = torch.full((len(idx), S), pad_id, dtype=torch.long)
    t_in = torch.full((len(idx), T), pad_id, dtype=torch.long)
    t_out = torch.full((len(idx), T), pad_id, dtype=torch.long)
    for row, i in enumerate(idx):
        s[row, : len(src[i])] = torch.tensor(src[i])
        y = tgt[i]
        t_out[row, : len(y)] = torch.tensor(y)
        t_in[row, 0] = bos_id
        t_in[row, 1 : len(y)] = torch.tensor(y[:-1])
    return s, t_in, t_out
