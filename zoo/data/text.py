"""Plain text for language models: the embedded WordNet glosses, text files, the special tokens of
their byte-level BPE (zoo.data.bpe), packing into fixed-length blocks (GPT-style), and BERT's masking
rule.

    texts = read_wordnet()                                    # the glosses of Debian's wordnet-base
    tok = bpe.train_bpe(texts.texts, 8192, specials=SPECIALS)  # byte-level BPE; ids 0-3 are SPECIALS
    blocks = pack_blocks(bpe.encode(tok, texts.texts), 128, eos_id=tok.token_to_id(EOS))   # [N, 129]
    rows = pack_documents(bpe.encode(tok, texts.texts), 128, eos_id=tok.token_to_id(EOS))  # with document masks
    inputs, labels = mask_tokens(tokens, mask, mask_id=..., vocab_size=..., generator=g)

Nothing is dropped silently, and unusable input fails with the file, the line and the fix.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import torch
from torch import Tensor

from zoo.data.common import DataError, read_lines

__all__ = [
    "WORDNET_DIR", "WORDNET_PARTS", "INSTALL_HINT", "SPECIALS", "PAD", "EOS", "CLS", "MASK", "DataError", "Texts",
    "read_wordnet", "read_text_files", "read_labelled_tsv", "split_texts", "pack_blocks", "unigram_perplexity",
    "pad_batch", "mask_tokens", "Rows", "pack_documents", "pad_documents", "pack_examples",
]

WORDNET_DIR = Path("/usr/share/wordnet")
WORDNET_PARTS = ("noun", "verb", "adj", "adv")
INSTALL_HINT = "install the embedded default text with: apt-get install wordnet-base (Debian/Ubuntu)"

PAD, EOS, CLS, MASK = "<pad>", "<eos>", "<cls>", "<mask>"
SPECIALS = [PAD, EOS, CLS, MASK]  # ids 0, 1, 2, 3


@dataclass
class Texts:
    """Texts (one example each: a gloss, a line), an optional label per text, and what was dropped."""

    texts: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self.texts)


# ------------------------------------------------------------------------------------- readers
def read_wordnet(path: str | Path = WORDNET_DIR, parts: Sequence[str] = WORDNET_PARTS) -> Texts:
    """The glosses of WordNet's ``data.{noun,verb,adj,adv}`` files, labelled with the part of speech.

    Lines starting with two spaces are the license header; a synset line holds its gloss after
    ``" | "``. Repeated glosses are kept once (counted in ``dropped["duplicate"]``).
    """
    path = Path(path)
    out, seen = Texts(), set()
    for part in parts:
        f = path / f"data.{part}"
        if not f.is_file():
            raise DataError(f"no WordNet data at {f}; {INSTALL_HINT}")
        for lineno, line in enumerate(read_lines(f), 1):
            if line.startswith("  ") or not line.strip():
                continue
            _, sep, gloss = line.partition(" | ")
            gloss = gloss.strip()
            if not sep or not gloss:
                out.dropped["no gloss"] += 1
                continue
            if gloss in seen:
                out.dropped["duplicate"] += 1
                continue
            seen.add(gloss)
            out.texts.append(gloss)
            out.labels.append(part)
    return out


def read_text_files(paths: str | Path | Iterable[str | Path]) -> Texts:
    """The non-empty lines of plain UTF-8 text files, or of every ``*.txt`` file under a folder."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.rglob("*.txt") if q.is_file())
            if not found:
                raise DataError(f"no *.txt files under {p}")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise DataError(f"no such file or folder: {p}")
    out = Texts()
    for f in files:
        for line in read_lines(f):
            line = line.strip()
            if line:
                out.texts.append(line)
            else:
                out.dropped["empty line"] += 1
    if not out.texts:
        raise DataError(f"no text in {', '.join(map(str, files))}")
    return out


def read_labelled_tsv(path: str | Path) -> Texts:
    """``text<TAB>label`` lines (empty lines skipped); a line without exactly one tab is an error."""
    path = Path(path)
    out = Texts()
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 2 or not cols[0].strip() or not cols[1].strip():
            raise DataError(f"{path}:{lineno}: expected 'text<TAB>label', got {line[:60]!r}")
        out.texts.append(cols[0].strip())
        out.labels.append(cols[1].strip())
    if not out.texts:
        raise DataError(f"{path} holds no labelled lines")
    return out


def split_texts(data: Texts, *, valid_fraction: float, seed: int = 1234, max_valid: int | None = None) -> tuple[Texts, Texts]:
    """A seeded random (train, valid) split of whole texts; labels travel with their text."""
    order = list(range(len(data)))
    random.Random(seed).shuffle(order)
    n_valid = max(1, int(round(len(order) * valid_fraction)))
    if max_valid is not None:
        n_valid = min(n_valid, max_valid)
    if n_valid >= len(order):
        raise DataError(f"{len(order)} texts are too few for a train/valid split (valid_fraction {valid_fraction})")

    def take(idx: list[int]) -> Texts:
        return Texts([data.texts[i] for i in idx], [data.labels[i] for i in idx] if data.labels else [])

    return take(sorted(order[n_valid:])), take(sorted(order[:n_valid]))


# ------------------------------------------------------------------------------ GPT-style blocks
def pack_blocks(docs: Iterable[Sequence[int]], block_len: int, *, eos_id: int) -> Tensor:
    """Documents joined into one stream, each followed by ``eos_id``, cut into rows of
    ``block_len + 1`` tokens that overlap by one (inputs ``row[:-1]``, targets ``row[1:]``), so each
    token of the stream is a target once. The last partial row is dropped. Shape [N, block_len + 1]."""
    return _stream(docs, block_len, eos_id, opened=False).unfold(0, block_len + 1, block_len).contiguous()


def _stream(docs: Iterable[Sequence[int]], block_len: int, eos_id: int, *, opened: bool) -> Tensor:
    """The documents as one stream, each followed by ``eos_id`` (and, ``opened``, one ``eos_id``
    first), cut to the ``n * block_len + 1`` tokens that whole overlapping rows take."""
    stream: list[int] = [eos_id] if opened else []
    for d in docs:
        stream.extend(d)
        stream.append(eos_id)
    n = (len(stream) - 1) // block_len
    if n < 1:
        raise DataError(f"{len(stream)} tokens are too few for one block of {block_len} + 1")
    return torch.tensor(stream[: n * block_len + 1], dtype=torch.long)


@dataclass(frozen=True)
class Rows:
    """Training rows of ``block_len + 1`` tokens (inputs ``[:, :-1]``, targets ``[:, 1:]``) and what
    the model needs besides: ``documents`` (ids, a packed row's document masks), ``positions`` (each
    token's position in its document) and ``padding`` (True = real token); None where not used."""

    tokens: Tensor
    documents: Tensor | None = None
    positions: Tensor | None = None
    padding: Tensor | None = None
    split: int = 0  # documents cut at a row boundary (their positions continue in the next row)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def take(self, index) -> Rows:
        pick = (lambda t: None if t is None else t[index])
        return Rows(self.tokens[index], pick(self.documents), pick(self.positions), pick(self.padding), self.split)

    def to(self, device) -> Rows:
        move = (lambda t: None if t is None else t.to(device))
        return Rows(self.tokens.to(device), move(self.documents), move(self.positions), move(self.padding), self.split)

    @property
    def targets(self) -> int:
        """How many tokens are predicted (real targets)."""
        return int(self.padding[:, 1:].sum()) if self.padding is not None else self.tokens[:, 1:].numel()


def pack_documents(docs: Iterable[Sequence[int]], block_len: int, *, eos_id: int, max_position: int | None = None) -> Rows:
    """Documents packed as :func:`pack_blocks` packs them (one stream, each document after an
    ``eos_id``, rows overlapping by one token), with document masks: ``eos_id`` opens each document
    (it is the document's first input, so a document sees nothing of the one before, and its last
    token predicts the ``eos_id`` that opens the next). A document cut at a row boundary goes on in
    the next row with its positions continuing (counted in ``split``); positions wrap at
    ``max_position`` (a position table's length)."""
    flat = _stream(docs, block_len, eos_id, opened=True)
    starts = flat == eos_id
    ids = starts.long().cumsum(0)
    index = torch.arange(flat.numel())
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(0).values
    positions = index - first
    if max_position is not None:
        positions = positions % max_position
    rows = lambda t: t.unfold(0, block_len + 1, block_len).contiguous()  # noqa: E731
    tokens, documents = rows(flat), rows(ids)
    split = int((~starts[block_len:-1:block_len]).sum())  # rows 1.. that open inside a document
    return Rows(tokens, documents, rows(positions), None, split)


def pad_documents(docs: Iterable[Sequence[int]], block_len: int, *, eos_id: int, pad_id: int) -> Rows:
    """One document a row, ``[eos_id] + doc + [eos_id]`` cut to ``block_len + 1`` tokens (counted in
    ``split``) and right-padded with ``pad_id`` (``padding`` False there)."""
    rows, cut = [], 0
    for d in docs:
        r = [eos_id, *d, eos_id]
        cut += len(r) > block_len + 1
        rows.append(r[: block_len + 1])
    if not rows:
        raise DataError("no documents to pad into rows")
    tokens, padding = pad_batch(rows, pad_id=pad_id)
    if tokens.shape[1] < block_len + 1:
        grow = block_len + 1 - tokens.shape[1]
        tokens = torch.nn.functional.pad(tokens, (0, grow), value=pad_id)
        padding = torch.nn.functional.pad(padding, (0, grow), value=False)
    return Rows(tokens, None, None, padding, cut)


def pack_examples(rows: Sequence[Sequence[int]], max_len: int) -> tuple[list[list[int]], list[list[int]]]:
    """Whole examples (each at most ``max_len`` tokens) packed in order into rows of at most
    ``max_len``, a new row where the next does not fit: (rows, each token's example index in its row)."""
    packed: list[list[int]] = []
    ids: list[list[int]] = []
    for r in rows:
        if len(r) > max_len:
            raise DataError(f"an example of {len(r)} tokens does not fit a row of {max_len}; cut examples first")
        if not packed or len(packed[-1]) + len(r) > max_len:
            packed.append([])
            ids.append([])
        ids[-1].extend([ids[-1][-1] + 1 if ids[-1] else 0] * len(r))
        packed[-1].extend(r)
    return packed, ids


def unigram_perplexity(train_tokens: Tensor, valid_tokens: Tensor, vocab_size: int) -> float:
    """Perplexity on ``valid_tokens`` of a unigram model fit on ``train_tokens`` with add-one
    smoothing over the whole vocabulary: the baseline a language model must beat."""
    counts = torch.bincount(train_tokens.reshape(-1), minlength=vocab_size).double() + 1.0
    logp = (counts / counts.sum()).log()
    return math.exp(-float(logp[valid_tokens.reshape(-1)].mean()))


# -------------------------------------------------------------------------------- BERT-style MLM
def pad_batch(rows: Sequence[Sequence[int]], *, pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Right-padded tokens [B, T] (T = the longest row) and the padding mask (True = real token)."""
    T = max(len(r) for r in rows)
    tokens = torch.full((len(rows), T), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    return tokens, torch.arange(T)[None, :] < lengths[:, None]


def mask_tokens(
    tokens: Tensor,
    maskable: Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    first_regular: int = len(SPECIALS),
    prob: float = 0.15,
    generator: torch.Generator | None = None,
    documents: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's rule (Devlin et al. 2019): each token where ``maskable`` is True is selected with
    probability ``prob``; a selected token becomes ``mask_id`` 80% of the time, a random regular
    token (id >= ``first_regular``) 10%, and stays itself 10%. Returns (inputs, labels) with labels
    -100 where not selected. At least one token per row is selected when the row has any; with
    ``documents`` ([B, T] ids of packed rows), per document."""
    g = generator
    selected = (torch.rand(tokens.shape, generator=g) < prob) & maskable
    if documents is not None:  # documents that drew nothing: one maskable position each
        change = torch.ones_like(documents, dtype=torch.bool)
        change[:, 1:] = documents[:, 1:] != documents[:, :-1]
        doc = change.flatten().long().cumsum(0) - 1  # a unique id per (row, document)
        n = int(doc[-1]) + 1 if doc.numel() else 0
        scores = torch.rand(tokens.shape, generator=g).masked_fill(~maskable, -1.0).flatten()
        best = torch.full((n,), -2.0).scatter_reduce(0, doc, scores, "amax")
        drew = torch.zeros(n, dtype=torch.long).scatter_reduce(0, doc, selected.flatten().long(), "amax")
        need = (drew == 0) & (best >= 0)
        selected |= (need[doc] & (scores == best[doc])).view_as(selected) & maskable
    # rows that drew nothing: select one maskable position so every example teaches something
    empty = ~selected.any(dim=1) & maskable.any(dim=1)
    if bool(empty.any()):
        scores = torch.rand(tokens.shape, generator=g).masked_fill(~maskable, -1.0)
        pick = scores.argmax(dim=1)
        selected[empty, pick[empty]] = True
    labels = tokens.masked_fill(~selected, -100)
    action = torch.rand(tokens.shape, generator=g)
    random_ids = torch.randint(first_regular, vocab_size, tokens.shape, generator=g)
    inputs = torch.where(selected & (action < 0.8), torch.full_like(tokens, mask_id), tokens)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels
