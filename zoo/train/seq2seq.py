"""Sequence-to-sequence pieces of the translation recipe beyond its task and command line: its data
config and splits (embedded corpus or a folder, with each valid/test pair's domain), the decoding settings, word dropout, the shared BPE, teacher-forced validation loss per domain, decoding a
split across processes, the final scoring of the last and averaged models, the exported model folder
and the corpus report."""

from __future__ import annotations

import json
import time
from pathlib import Path
import shutil
from typing import Any, Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field, NonNegativeFloat, PositiveInt, field_validator

from zoo.atomic import atomic_path, atomic_write_text
from zoo.data import bpe
from zoo.data import corpus as C
from zoo.data import translation as T
from zoo.io import save as save_model
from zoo.train.config import Config
from zoo.train.distributed import Dist
from zoo.train.loop import perplexity
from zoo.train.metrics import MetricsLog
from zoo.train.optim import autocast
from zoo.train.translation import DECODE_KEYS, cross_attention_weights, decode_batches, plot_attention, score_domains

__all__ = ["PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID", "TranslationDataConfig", "load_splits", "DecodeConfig", "decode_settings", "word_dropout",
           "export_model_dir", "shared_bpe", "describe_corpus", "valid_loss", "translate_split",
           "attention_picture", "score_models"]

PAD_ID, BOS_ID, EOS_ID, UNK_ID = (T.SPECIALS.index(s) for s in (T.PAD, T.BOS, T.EOS, T.UNK))


class TranslationDataConfig(Config):
    """Where the translation recipe's pairs come from (its ``data``), and how they are tokenized."""

    path: Path | None = Field(None, description="folder with train/valid/test.{src,tgt} or *.tsv; null: the embedded corpus")
    corpus: str = Field("both", description=(
        "without data.path, the embedded EN-DE domains to use: ding (Ding dictionary sentences), messages (software "
        "messages from German gettext catalogs), stories (game dialogue and narrative), both (ding+messages), all, "
        "or domains joined by '+'; training uses their union, valid and test are scored per domain"))
    catalogs: Path | None = Field(None, description="folder of the German catalogs (default: where tools/install-data puts them)")
    src_lang: str = "en"
    tgt_lang: str = "de"
    vocab_size: PositiveInt = Field(6000, description="shared source-target BPE vocabulary")
    min_frequency: PositiveInt = 2
    tokenizer: Path | None = Field(None, description="an existing tokenizer.json to use instead of training BPE")
    max_len: PositiveInt = Field(128, description="tokens per sentence (longer ones are truncated)")
    oversample: dict[str, PositiveInt] = Field(default_factory=dict, description=(
        "embedded corpus: copies of a domain's training pairs in the union, e.g. {ding: 2}, to give a smaller "
        "domain more of the updates"))
    valid: PositiveInt = Field(500, description="embedded corpus: held-out validation pairs per domain")
    test: PositiveInt = Field(1000, description="embedded corpus: held-out test pairs per domain")
    split_seed: int = 1234
    train_limit: PositiveInt | None = Field(None, description="use only the first N training pairs")
    valid_limit: PositiveInt | None = Field(None, description="use only the first N validation pairs (per domain)")
    test_limit: PositiveInt | None = Field(None, description="use only the first N test pairs (per domain)")

    @field_validator("corpus")
    @classmethod
    def _known_domains(cls, v: str) -> str:
        C.parse_corpus(v)  # raises with the choices
        return v


def load_splits(cfg: TranslationDataConfig) -> tuple[dict[str, T.Pairs], dict[str, list[str]], C.Corpus | None]:
    """train / valid / test pairs as the config says (test may be empty for user data), the domain
    of each valid and test pair, and the embedded corpus by domain (None for user data)."""
    if cfg.path is None:
        if {cfg.src_lang, cfg.tgt_lang} != {"en", "de"}:
            raise T.DataError(f"the embedded corpus is English-German; got data.src_lang={cfg.src_lang} "
                              f"data.tgt_lang={cfg.tgt_lang} (use en/de or de/en, or your own data.path)")
        corpus = C.build_corpus(cfg.corpus, direction=f"{cfg.src_lang}-{cfg.tgt_lang}", valid=cfg.valid, test=cfg.test,
                                seed=cfg.split_seed, catalogs=cfg.catalogs)
        limits = {"valid": cfg.valid_limit, "test": cfg.test_limit}
        try:
            splits, labels = {"train": corpus.union("train", cfg.oversample)}, {}
        except T.DataError as e:
            raise T.DataError(f"data.oversample: {e} (data.corpus={cfg.corpus})") from None
        for name in ("valid", "test"):
            splits[name], labels[name] = T.Pairs(), []
            for domain, parts in corpus.splits.items():
                p = parts[name]
                n = min(len(p), limits[name] or len(p))
                splits[name].src += p.src[:n]
                splits[name].tgt += p.tgt[:n]
                labels[name] += [domain] * n
    else:
        splits = T.read_folder(cfg.path, cfg.src_lang, cfg.tgt_lang)
        for name, limit in (("valid", cfg.valid_limit), ("test", cfg.test_limit)):
            if limit is not None:
                p = splits[name]
                splits[name] = T.Pairs(p.src[:limit], p.tgt[:limit], p.dropped)
        labels = {name: ["data"] * len(splits[name]) for name in ("valid", "test")}
        corpus = None
    if cfg.train_limit is not None:
        p = splits["train"]
        splits["train"] = T.Pairs(p.src[: cfg.train_limit], p.tgt[: cfg.train_limit], p.dropped)
    return splits, labels, corpus


class DecodeConfig(Config):
    beams: PositiveInt = 4
    length_penalty: Literal["gnmt", "hf", "none"] = "gnmt"
    alpha: NonNegativeFloat = 0.6
    max_len_a: NonNegativeFloat = 1.0
    max_len_b: int = 50
    batch_tokens: PositiveInt = Field(4000, description="source tokens x beams per decoding batch")
    eval_beams: PositiveInt = Field(1, description="beams for the BLEU curve during training (1: greedy)")
    eval_bleu: bool = Field(True, description="decode valid at each evaluation for the BLEU curve")
    eval_sentences: PositiveInt | None = Field(200, description="valid sentences per domain decoded for the BLEU curve "
                                               "(null: all); the final scores always use all of them")
    samples: int = Field(5, description="example translations to print (per domain)")
    score_last: bool = Field(True, description="also decode valid/test with the last (not averaged) model; its "
                             "loss is always computed")
    final_splits: list[Literal["valid", "test"]] = Field(
        ["valid", "test"], min_length=1, description="splits decoded and scored (beam search, BLEU, chrF) at the end "
        "of training (the valid loss of the last and averaged models is always computed); an ablation grid that "
        "selects on dev needs only valid")


def decode_settings(dcfg: DecodeConfig, beams: int | None = None) -> dict:
    """The keyword arguments of decode_batches for these decoding settings."""
    return {"beams": beams or dcfg.beams, **dcfg.model_dump(include=set(DECODE_KEYS))}


def word_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """``x`` with each real token (not padding, <s> or </s>) replaced by <unk> with probability ``p``;
    draws from the global CPU generator, so a resumed run draws the same masks."""
    if p <= 0:
        return x
    drop = (torch.rand(x.shape) < p) & (x > UNK_ID)
    return x.masked_fill(drop, UNK_ID)


def export_model_dir(model, tokenizer: str | Path, model_dir: Path, settings: dict[str, Any]) -> Path:
    """The folder :class:`zoo.train.translation.Translator` loads: ``model.safetensors``,
    ``tokenizer.json`` and ``translate.json`` (languages, max_len, decoding settings)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    save_model(model, model_dir / "model.safetensors")
    shutil.copyfile(tokenizer, model_dir / "tokenizer.json")
    atomic_write_text(model_dir / "translate.json", json.dumps(settings, indent=2) + "\n")
    return model_dir


def shared_bpe(data, splits: dict[str, T.Pairs], out_dir: Path, dist: Dist, *, resume: bool, corpus=None):
    """The shared source-target BPE: ``data.tokenizer`` if given, else ``out_dir/tokenizer.json`` when it
    was trained with these settings (or when resuming), else trained on the training pairs and saved
    there. ``data`` is the recipe's data config. Returns (tokenizer, "given" | "reused" | "trained")."""
    if data.tokenizer is not None:
        return bpe.load_bpe(data.tokenizer, specials=T.SPECIALS), "given"
    path, meta_path = out_dir / "tokenizer.json", out_dir / "tokenizer.settings.json"
    settings = {"vocab_size": data.vocab_size, "min_frequency": data.min_frequency, "path": str(data.path),
                "langs": [data.src_lang, data.tgt_lang], "train_limit": data.train_limit, "n_train": len(splits["train"]),
                "corpus": {d: st["sha256"] for d, st in corpus.stats.items()} if corpus is not None else None,
                "oversample": data.oversample}
    reuse = path.is_file() and (resume or (meta_path.is_file() and json.loads(meta_path.read_text()) == settings))
    if not reuse and dist.is_main:
        tok = bpe.train_bpe(splits["train"].src + splits["train"].tgt, data.vocab_size, specials=T.SPECIALS, unk=T.UNK,
                             min_frequency=data.min_frequency)
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tok.save(str(tmp))
        atomic_write_text(meta_path, json.dumps(settings))
    dist.barrier()
    return bpe.load_bpe(path, specials=T.SPECIALS), "reused" if reuse else "trained"


def describe_corpus(corpus: C.Corpus, dist: Dist, out: Path) -> None:
    """Log each domain's size, fingerprint and drops by reason, and the catalogs that could not be
    read; write the exact splits to ``out/data/{train,valid,test}.<domain>.tsv``."""
    for domain, st in corpus.stats.items():
        drops = ", ".join(f"{n:,} {why}" for why, n in sorted(st["dropped"].items(), key=lambda kv: -kv[1]))
        dist.print(f"corpus {domain}: {st['pairs']:,} pairs (train {st['train']:,}, valid {st['valid']:,}, test "
                   f"{st['test']:,}), sha256 {st['sha256'][:16]}; dropped: {drops or 'none'}")
    for path, why in corpus.unreadable:
        dist.print(f"corpus: skipped unreadable catalog {path}: {why}")
    if corpus.missing_packages:
        stories = set(corpus.missing_packages) & set(C.catalog_packages("stories"))
        dist.print(f"corpus: no catalogs of {len(corpus.missing_packages)} listed packages "
                   f"({' '.join(corpus.missing_packages)}); the corpus differs from the documented one; "
                   + C.catalog_hint("stories" if stories else "messages"))
    if dist.is_main:
        (out / "data").mkdir(parents=True, exist_ok=True)
        for domain, parts in corpus.splits.items():
            for name, pairs in parts.items():
                C.write_tsv(pairs, out / "data" / f"{name}.{domain}.tsv")


@torch.no_grad()
def valid_loss(model, src, tgt, dist: Dist, *, max_tokens: int, label_smoothing: float, precision: str,
               labels: Sequence[str] | None = None) -> dict[str, tuple[float, float]]:
    """Teacher-forced (label-smoothed loss, NLL) per target token on this data, over all processes:
    ``{"all": (loss, nll), domain: (loss, nll), ...}`` with ``labels`` naming each pair's domain."""
    device = dist.device
    was_training = model.training
    model.eval()
    names = list(dict.fromkeys(labels)) if labels is not None else []
    col = {d: i for i, d in enumerate(names)}
    totals = torch.zeros(len(names) + 1, 3, dtype=torch.float64)  # row 0: all
    batches = T.token_batches([len(s) for s in src], [len(t) for t in tgt], max_tokens=max_tokens, shuffle=False)
    for b in batches[dist.rank :: dist.world_size]:
        s, t_in, t_out = (x.to(device) for x in T.collate(src, tgt, b))
        with autocast(device, precision):
            logits = model(s, t_in, s != PAD_ID, t_in != PAD_ID)
        flat, gold = logits.float().flatten(0, 1), t_out.flatten()
        smoothed = F.cross_entropy(flat, gold, ignore_index=PAD_ID, label_smoothing=label_smoothing, reduction="none")
        nll = F.cross_entropy(flat, gold, ignore_index=PAD_ID, reduction="none")
        per_row = torch.stack([smoothed.view(len(b), -1).sum(1), nll.view(len(b), -1).sum(1),
                               (t_out != PAD_ID).sum(1).to(smoothed.dtype)], dim=1).double().cpu()
        totals[0] += per_row.sum(0)
        for r, i in enumerate(b):
            if names:
                totals[1 + col[labels[i]]] += per_row[r]
    dist.all_reduce(totals)
    model.train(was_training)
    rows = {"all": totals[0], **{d: totals[1 + j] for d, j in col.items()}}
    return {d: (float(t[0] / max(t[2], 1)), float(t[1] / max(t[2], 1))) for d, t in rows.items()}


def translate_split(model, tok, src_ids, dist: Dist, decode: dict[str, Any], *, precision: str = "auto") -> list[str]:
    """Detokenized translations of ``src_ids`` (beam search or greedy with the ``decode`` settings of
    :func:`zoo.train.translation.decode_batches`), decoded in shares across processes, on every one."""
    mine = list(dist.shard(len(src_ids)))
    ids = decode_batches(model, [src_ids[i] for i in mine], device=dist.device, precision=precision, pad_id=PAD_ID,
                         bos_id=BOS_ID, eos_id=EOS_ID, **decode)
    hyps: list[str] = [""] * len(src_ids)
    for part_idx, part_txt in dist.gather_object((mine, bpe.decode(tok, ids, eos=T.EOS))):
        for i, text in zip(part_idx, part_txt):
            hyps[i] = text
    return hyps


def attention_picture(model, tok, src_text: str, decode: dict[str, Any], path: Path) -> Path:
    """``cross_attention.png``: every head of the last decoder layer over one sentence and its translation."""
    src = bpe.encode(tok, [src_text], eos=T.EOS)[0]
    hyp = decode_batches(model, [src], device=torch.device("cpu"), precision="fp32", pad_id=PAD_ID, bos_id=BOS_ID,
                         eos_id=EOS_ID, **decode)[0]
    weights = cross_attention_weights(model, src, hyp, bos_id=BOS_ID)
    names = lambda ids: [tok.id_to_token(i) for i in ids]  # noqa: E731
    n = len(model.decoder.blocks)
    return plot_attention(weights, names(src), names(hyp), path,
                          f"cross-attention, decoder layer {n} of {n}: {src_text!r} -> {bpe.decode(tok, [hyp], eos=T.EOS)[0]!r}")


def score_models(models: dict[str, Any], splits: dict[str, T.Pairs], ids, labels: dict[str, list[str]], *,
                 domains: list[str], loss: Callable, translate: Callable, decoded: Callable[[str, str], bool],
                 log: MetricsLog, step: int, dist: Dist, beams: int) -> tuple[dict, dict]:
    """Valid/test loss of each model (``{"last": m, "averaged": m2}``; one model under both names is
    scored once), and BLEU/chrF where ``decoded(split, name)``, overall and per domain (``domains``; none
for data without domains). Test is scored only where some model is decoded on it. Returns the
    results (``{split}/{name}`` and ``{split}/{domain}/{name}``) and the hypotheses by (split, name)."""
    results: dict = {}
    hyps_out: dict = {}
    for split in ("valid", "test"):
        if not len(splits[split]) or not (split == "valid" or any(decoded(split, n) for n in models)):
            continue
        src_ids, tgt_ids = ids[split]
        done: dict[int, str] = {}
        for name, m in models.items():
            if id(m) in done:  # the same model under another name: copy its scores
                first = done[id(m)]
                for key in [k for k in results if k.startswith(f"{split}/") and k.endswith(f"/{first}")]:
                    results[key[: -len(first)] + name] = results[key]
                hyps_out[(split, name)] = hyps_out.get((split, first))
                continue
            done[id(m)] = name
            t0 = time.perf_counter()
            losses = loss(m, src_ids, tgt_ids, labels[split])
            scores = {}
            if decoded(split, name):
                hyps_out[(split, name)] = hyps = translate(m, src_ids)
                scores = score_domains(hyps, splits[split].tgt, labels[split])
            seconds = round(time.perf_counter() - t0, 1)
            for d in ["all", *domains]:
                lo, nll = losses[d]
                sc = {**scores.get(d, {}), "loss": round(lo, 4), "ppl": round(perplexity(nll), 3)}
                results[f"{split}/{name}" if d == "all" else f"{split}/{d}/{name}"] = sc
                log.write(step=step, split=f"{split}_{name}" if d == "all" else f"{split}_{d}_{name}",
                          **{k: v for k, v in sc.items() if k in ("bleu", "chrf", "loss")})
                what = f"BLEU {sc['bleu']:6.2f}  chrF {sc['chrf']:6.2f}  " if "bleu" in sc else ""
                n = labels[split].count(d) if d != "all" else len(labels[split])
                dist.print(f"{split:5s} {name:8s} {d if domains else '':9s}: {what}loss {lo:.3f}  ({n} sentences"
                           + (f", beam {beams}, {seconds}s)" if scores and d == "all" else ")"))
    return results, hyps_out
