"""Labelled text for sequence classification (recipes/classify.py, and mlm.py's fine-tuning): TSV
files of ``text<TAB>label`` or ``text<TAB>text<TAB>label`` (pairs, GLUE's MNLI/QQP layout), encoded
by a tokenizer's own template (``[CLS] a [SEP] b [SEP]`` with segment ids for a BERT tokenizer;
``<cls> a <eos> b <eos>`` for the recipes' BPE), the task that trains on them and the model wrapper
whose forward is ``classify``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

import zoo
from zoo.data import text as T
from zoo.data.common import DataError, read_lines
from zoo.train import Dist

from text_data import LengthBatched, eval_batches  # beside this script

__all__ = ["Labelled", "split_labelled", "read_labelled", "recipe_template", "Encoded", "encode_labelled", "ClassifyTask",
           "Classifying", "majority"]


@dataclass
class Labelled:
    """Examples: a text (or a pair of texts) and a label each."""

    texts: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    seconds: list[str] | None = None  # the pair's second texts

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, n: int) -> Labelled:
        return Labelled(self.texts[:n], self.labels[:n], None if self.seconds is None else self.seconds[:n])

    def select(self, rows: list[int]) -> Labelled:
        """The examples at ``rows``, in that order."""
        return Labelled([self.texts[i] for i in rows], [self.labels[i] for i in rows],
                        None if self.seconds is None else [self.seconds[i] for i in rows])


def split_labelled(data: Labelled, fraction: float, seed: int) -> tuple[Labelled, Labelled]:
    """(train, valid): a seeded ``fraction`` of ``data`` (at least one example) held out."""
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
    n_valid = max(1, round(len(data) * fraction))
    return data.select(order[n_valid:]), data.select(order[:n_valid])


def read_labelled(path: str | Path) -> Labelled:
    """``text<TAB>label`` or ``text<TAB>text<TAB>label`` lines (one layout a file; empty lines skipped)."""
    path = Path(path)
    out, width = Labelled(), None
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split("\t")]
        if len(cols) not in (2, 3) or not all(cols):
            raise DataError(f"{path}:{lineno}: expected 'text<TAB>label' or 'text<TAB>text<TAB>label', got {line[:60]!r}")
        if width is None:
            width = len(cols)
            out.seconds = [] if width == 3 else None
        elif len(cols) != width:
            raise DataError(f"{path}:{lineno}: {len(cols)} columns, but the file's first example has {width}; "
                            f"one layout a file")
        out.texts.append(cols[0])
        out.labels.append(cols[-1])
        if out.seconds is not None:
            out.seconds.append(cols[1])
    if not out.texts:
        raise DataError(f"{path}: no labelled examples")
    return out


def recipe_template(tok) -> None:
    """Give a recipe-trained BPE (``<pad> <eos> <cls> <mask>``) the template ``<cls> a <eos> [b <eos>]``
    with segment ids, so that it encodes classification examples as a BERT tokenizer does."""
    from tokenizers.processors import TemplateProcessing

    specials = [(s, tok.token_to_id(s)) for s in (T.CLS, T.EOS)]
    tok.post_processor = TemplateProcessing(single=f"{T.CLS} $A {T.EOS}", pair=f"{T.CLS} $A {T.EOS} $B:1 {T.EOS}:1",
                                            special_tokens=specials)


@dataclass
class Encoded:
    """Token ids, segment ids and label ids of labelled examples."""

    rows: list[list[int]]
    types: list[list[int]]
    labels: torch.Tensor


def encode_labelled(tok, data: Labelled, label_id: dict[str, int], max_len: int) -> Encoded:
    """``data`` through the tokenizer's template (its special tokens, segment ids for pairs), cut to
    ``max_len`` tokens (the longer text of a pair first, as HF's ``truncation=True``)."""
    unknown = sorted(set(data.labels) - set(label_id))
    if unknown:
        raise DataError(f"labels {unknown[:5]} never occur in the training data")
    tok.enable_truncation(max_len, strategy="longest_first")
    try:
        inputs = list(zip(data.texts, data.seconds)) if data.seconds is not None else data.texts
        encs = tok.encode_batch(inputs, add_special_tokens=True)
    finally:
        tok.no_truncation()
    return Encoded([e.ids for e in encs], [e.type_ids for e in encs], torch.tensor([label_id[x] for x in data.labels]))


def majority(train: Labelled, valid_labels: torch.Tensor, label_id: dict[str, int]) -> tuple[str, float]:
    """The most frequent training label and its accuracy on the validation labels."""
    top = Counter(train.labels).most_common(1)[0][0]
    return top, float((valid_labels == label_id[top]).double().mean())


class ClassifyTask(LengthBatched):
    """Cross-entropy of the pooled classifier on labelled examples; valid loss and accuracy."""

    name = "finetune"
    panels = [("loss", ["train/loss", "valid/loss"]), ("accuracy", ["valid/accuracy"])]

    def __init__(self, dist: Dist, accum: int, train: Encoded, valid: Encoded, *, batch_size: int, seed: int,
                 pad_id: int, segments: bool) -> None:
        super().__init__(dist, accum, train.rows, batch_size, seed)
        self.train, self.valid, self.pad_id, self.segments = train, valid, pad_id, segments
        self.mine = eval_batches(valid.rows, batch_size, dist.rank, dist.world_size)

    def inputs(self, data: Encoded, batch) -> tuple:
        tokens, pad_mask = T.pad_batch([data.rows[i] for i in batch], pad_id=self.pad_id)
        device = self.dist.device
        types = T.pad_batch([data.types[i] for i in batch], pad_id=0)[0].to(device) if self.segments else None
        return tokens.to(device), pad_mask.to(device), types

    def loss(self, model, batch, step):
        tokens, pad_mask, types = self.inputs(self.train, batch)
        logits = model(tokens, pad_mask, types)
        return F.cross_entropy(logits.float(), self.train.labels[batch].to(self.dist.device)), {"tokens": float(pad_mask.sum())}

    def evaluate(self, model) -> dict[str, float]:
        device = self.dist.device
        total = torch.zeros(3, dtype=torch.float64, device=device)
        for b in self.mine:
            y = self.valid.labels[b].to(device)
            logits = model(*self.inputs(self.valid, b)).float()
            total += torch.stack([F.cross_entropy(logits, y, reduction="sum").double(), (logits.argmax(-1) == y).sum().double(),
                                  torch.tensor(len(b), dtype=torch.float64, device=device)])
        self.dist.all_reduce(total)
        return {"loss": float(total[0] / total[2]), "accuracy": float(total[1] / total[2])}


class Classifying(torch.nn.Module):
    """An encoder whose forward is ``classify`` (so DDP syncs it). An MLM head, unused here, is frozen
    (its projection stays trainable where it is the tied embedding)."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        shared = {id(p) for p in encoder.tok_emb.parameters()}
        head = encoder.head.parameters() if encoder.head is not None else ()
        for p in head:
            if id(p) not in shared:
                p.requires_grad_(False)

    def forward(self, tokens, padding_mask=None, token_types=None):
        return self.encoder.classify(tokens, padding_mask, token_types)

    def rebuild(self) -> Classifying:
        """A fresh copy of the same structure (how a sharded run hands back a whole model)."""
        return Classifying(zoo.build(self.encoder.spec))
