"""Train a Transformer for translation (Vaswani et al. 2017), average its last checkpoints, score it
with sacreBLEU and chrF, export it, and translate with it.

    python recipes/translate.py                          # the embedded default: Ding EN->DE on the CPU
    python recipes/translate.py data.path=wmt14 model=transformer-base train.steps=100000 ...
    torchrun --nproc_per_node 8 recipes/translate.py --config my.yaml
    python recipes/translate.py --resume                 # continue exactly where the run stopped
    echo "The room faces north." | python recipes/translate.py translate --model runs/translate/model

Data (``data.path``): a folder with ``train.SRC``/``train.TGT``, ``valid.*``, ``test.*`` (the WMT14
layout, one sentence a line) or ``train.tsv``/``valid.tsv``/``test.tsv`` (``source<TAB>target``);
without a path, the Ding dictionary's sentence pairs (Debian's ``trans-de-en``). See
docs/recipes/translate.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator

import zoo
from zoo.data import corpus as C
from zoo.data import translation as T
from zoo.train import (
    CheckpointError,
    Config,
    MetricsLog,
    OptimConfig,
    Progress,
    RunConfig,
    ScheduleConfig,
    autocast,
    attention_kernels,
    average_checkpoints,
    build_optimizer,
    build_scheduler,
    checkpoint_name,
    distributed,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    parse_args,
    plot_metrics,
    prune_checkpoints,
    resolve_precision,
    restore_rng,
    save_checkpoint,
    seed_everything,
    tune_malloc,
    unwrap,
)
from zoo.train.translation import (DECODE_KEYS, Translator, cross_attention_weights, decode_batches, plot_attention,
                                   score_domains)

DEFAULT_CONFIG = Path(__file__).with_name("translate.yaml")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


# ------------------------------------------------------------------------------------------ config
class DataConfig(Config):
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


class TrainConfig(Config):
    steps: PositiveInt = Field(1000, description="optimizer steps")
    minutes: PositiveFloat | None = Field(None, description="stop training after this many minutes (a safety net)")
    max_tokens: PositiveInt = Field(4096, description="padded source (and target) tokens per micro-batch per process")
    batch_tokens: PositiveInt | None = Field(
        None, description="target tokens per optimizer step over all processes; sets run.grad_accum")
    label_smoothing: NonNegativeFloat = 0.1
    word_dropout: float = Field(0.0, ge=0.0, lt=1.0, description=(
        "replace this fraction of the source and decoder-input tokens by <unk> in training (the targets "
        "stay intact): word dropout, which low-resource NMT found to help (Sennrich & Zhang 2019)"))
    average_last: PositiveInt = Field(5, description="average the last N checkpoints (1: no averaging)")


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


class TranslateConfig(Config):
    model: str = Field("transformer-tiny-ding", description="a zoo preset or spec YAML")
    model_overrides: list[str] = Field(default_factory=list, description="spec overrides, e.g. dropout.residual=0.1")
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    decode: DecodeConfig = DecodeConfig()
    optim: OptimConfig = OptimConfig(name="adam", lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, clip_grad=None)
    schedule: ScheduleConfig = ScheduleConfig(kind="inverse_sqrt", warmup=4000)
    run: RunConfig = RunConfig(out_dir=Path("runs/translate"))


class RecipeError(RuntimeError):
    """A run that cannot go on; printed as one line."""


# -------------------------------------------------------------------------------------------- data
def load_splits(cfg: DataConfig) -> tuple[dict[str, T.Pairs], dict[str, list[str]], C.Corpus | None]:
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


def describe_corpus(corpus: C.Corpus, cfg: TranslateConfig, dist, out: Path) -> None:
    """Log each domain's size, fingerprint and drops by reason, and the catalogs that could not be
    read; write the exact splits to ``out/data/{train,valid,test}.<domain>.tsv``."""
    for domain, st in corpus.stats.items():
        drops = ", ".join(f"{n:,} {why}" for why, n in sorted(st["dropped"].items(), key=lambda kv: -kv[1]))
        dist.print(f"corpus {domain}: {st['pairs']:,} pairs (train {st['train']:,}, valid {st['valid']:,}, test "
                   f"{st['test']:,}), sha256 {st['sha256'][:16]}; dropped: {drops or 'none'}")
    for path, why in corpus.unreadable:
        dist.print(f"corpus: skipped unreadable catalog {path}: {why}")
    if corpus.missing_packages:
        dist.print(f"corpus: no catalogs of {len(corpus.missing_packages)} listed packages ({' '.join(corpus.missing_packages)}); "
                   f"the corpus differs from the documented one; "
                   + C.catalog_hint("stories" if set(corpus.missing_packages) & set(C.catalog_packages("stories")) else "messages"))
    if dist.is_main:
        (out / "data").mkdir(parents=True, exist_ok=True)
        for domain, parts in corpus.splits.items():
            for name, pairs in parts.items():
                C.write_tsv(pairs, out / "data" / f"{name}.{domain}.tsv")


def get_tokenizer(cfg: DataConfig, splits: dict[str, T.Pairs], out_dir: Path, dist, *, resume: bool, corpus=None):
    """The shared BPE: ``data.tokenizer`` if given, else ``out_dir/tokenizer.json`` when it was trained
    with these settings (or when resuming), else trained on the training pairs and saved there."""
    if cfg.tokenizer is not None:
        return T.load_bpe(cfg.tokenizer), "given"
    path, meta_path = out_dir / "tokenizer.json", out_dir / "tokenizer.settings.json"
    settings = {"vocab_size": cfg.vocab_size, "min_frequency": cfg.min_frequency, "path": str(cfg.path),
                "langs": [cfg.src_lang, cfg.tgt_lang], "train_limit": cfg.train_limit, "n_train": len(splits["train"]),
                "corpus": {d: st["sha256"] for d, st in corpus.stats.items()} if corpus is not None else None,
                "oversample": cfg.oversample}
    reuse = path.is_file() and (resume or (meta_path.is_file() and json.loads(meta_path.read_text()) == settings))
    if not reuse and dist.is_main:
        tok = T.train_bpe(splits["train"].src + splits["train"].tgt, cfg.vocab_size, min_frequency=cfg.min_frequency)
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tok.save(str(tmp))
        tmp.replace(path)
        meta_path.write_text(json.dumps(settings))
    dist.barrier()
    return T.load_bpe(path), "reused" if reuse else "trained"


def word_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """``x`` with each real token (not padding, <s> or </s>) replaced by <unk> with probability ``p``;
    draws from the global CPU generator, so a resumed run draws the same masks."""
    if p <= 0:
        return x
    drop = (torch.rand(x.shape) < p) & (x > UNK_ID)
    return x.masked_fill(drop, UNK_ID)


# ------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def valid_loss(model, src, tgt, cfg: TranslateConfig, dist, device, labels: Sequence[str] | None = None) -> dict:
    """Teacher-forced (label-smoothed loss, NLL) per target token on this data, over all ranks:
    ``{"all": (loss, nll), domain: (loss, nll), ...}`` with ``labels`` naming each pair's domain."""
    model.eval()
    names = list(dict.fromkeys(labels)) if labels is not None else []
    col = {d: i for i, d in enumerate(names)}
    totals = torch.zeros(len(names) + 1, 3, dtype=torch.float64)  # row 0: all
    batches = T.token_batches([len(s) for s in src], [len(t) for t in tgt], max_tokens=cfg.train.max_tokens, shuffle=False)
    for b in batches[dist.rank :: dist.world_size]:
        s, t_in, t_out = (x.to(device) for x in T.collate(src, tgt, b))
        with autocast(device, cfg.run.precision):
            logits = model(s, t_in, s != PAD_ID, t_in != PAD_ID)
        flat, gold = logits.float().flatten(0, 1), t_out.flatten()
        smoothed = F.cross_entropy(flat, gold, ignore_index=PAD_ID, label_smoothing=cfg.train.label_smoothing, reduction="none")
        nll = F.cross_entropy(flat, gold, ignore_index=PAD_ID, reduction="none")
        per_row = torch.stack([smoothed.view(len(b), -1).sum(1), nll.view(len(b), -1).sum(1),
                               (t_out != PAD_ID).sum(1).to(smoothed.dtype)], dim=1).double().cpu()
        totals[0] += per_row.sum(0)
        for r, i in enumerate(b):
            if names:
                totals[1 + col[labels[i]]] += per_row[r]
    dist.all_reduce(totals)
    model.train()
    rows = {"all": totals[0], **{d: totals[1 + j] for d, j in col.items()}}
    return {d: (float(t[0] / max(t[2], 1)), float(t[1] / max(t[2], 1))) for d, t in rows.items()}


def translate_ids(model, src: Sequence[Sequence[int]], dcfg: DecodeConfig, *, device, precision="auto",
                  beams: int | None = None) -> list[list[int]]:
    """Beam search (or greedy) over ``src`` token ids with the decoding settings, in input order."""
    return decode_batches(model, src, beams=beams or dcfg.beams, device=device, precision=precision, pad_id=PAD_ID,
                          bos_id=BOS_ID, eos_id=EOS_ID, **dcfg.model_dump(include=set(DECODE_KEYS)))


def translate_split(model, tok, src_ids, cfg: TranslateConfig, dist, device, beams: int | None = None) -> list[str]:
    """Detokenized translations of ``src_ids``, decoded in shares across ranks, on every rank."""
    mine = list(dist.shard(len(src_ids)))
    ids = translate_ids(model, [src_ids[i] for i in mine], cfg.decode, device=device, precision=cfg.run.precision, beams=beams)
    hyps: list[str] = [""] * len(src_ids)
    for part_idx, part_txt in dist.gather_object((mine, T.decode(tok, ids))):
        for i, text in zip(part_idx, part_txt):
            hyps[i] = text
    return hyps


def attention_picture(model, tok, src_text: str, dcfg: DecodeConfig, path: Path) -> Path:
    """``cross_attention.png``: every head of the last decoder layer over one sentence and its translation."""
    src = T.encode(tok, [src_text])[0]
    hyp = translate_ids(model, [src], dcfg, device=torch.device("cpu"), precision="fp32")[0]
    weights = cross_attention_weights(model, src, hyp, bos_id=BOS_ID)
    names = lambda ids: [tok.id_to_token(i) for i in ids]  # noqa: E731
    n = len(model.decoder.blocks)
    return plot_attention(weights, names(src), names(hyp), path,
                          f"cross-attention, decoder layer {n} of {n}: {src_text!r} -> {T.decode(tok, [hyp])[0]!r}")


# -------------------------------------------------------------------------------------- training
def train(cfg: TranslateConfig, resume: str | None, dist) -> dict:
    t_start = time.perf_counter()
    device = dist.device
    cfg.run.precision = resolve_precision(cfg.run.precision, device)
    out = Path(cfg.run.out_dir)
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
    ckpt = None
    if resume is not None:
        path = latest_checkpoint(out) if resume == "latest" else Path(resume)
        if path is None:
            raise RecipeError(f"--resume: no checkpoint in {out} (run without --resume to start)")
        ckpt = load_checkpoint(path)
        dist.print(f"resuming from {path} (step {ckpt['step']})")
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)

    # data and the shared BPE
    t0 = time.perf_counter()
    splits, labels, corpus = load_splits(cfg.data)
    if corpus is not None:
        describe_corpus(corpus, cfg, dist, out)
    tok, how = get_tokenizer(cfg.data, splits, out, dist, resume=ckpt is not None, corpus=corpus)
    V = tok.get_vocab_size()
    ids = {name: (T.encode(tok, p.src, max_len=cfg.data.max_len), T.encode(tok, p.tgt, max_len=cfg.data.max_len))
           for name, p in splits.items()}
    source = str(cfg.data.path) if cfg.data.path else f"the embedded corpus ({cfg.data.corpus}: {', '.join(corpus.domains)})"
    dist.print(f"data: {source}, {cfg.data.src_lang}->{cfg.data.tgt_lang}: "
               + ", ".join(f"{k} {len(v):,}" for k, v in splits.items())
               + f"; BPE {how}: {V:,} tokens; {time.perf_counter() - t0:.1f}s")
    train_src, train_tgt = ids["train"]
    src_lens, tgt_lens = [len(x) for x in train_src], [len(x) for x in train_tgt]

    # model, optimizer, schedule
    seed_everything(cfg.run.seed)
    spec = zoo.load_spec(cfg.model, [*cfg.model_overrides, f"vocab_size={V}"])
    if spec.family != "encoder_decoder":
        raise RecipeError(f"model {cfg.model!r} is a {spec.family}; translation needs an encoder_decoder")
    model = zoo.build(spec, seed=cfg.run.seed).to(device)
    n_params = zoo.count_parameters(model)
    opt = build_optimizer(model, cfg.optim)
    budget = cfg.train.minutes * 60 if cfg.train.minutes else None
    clock = {"elapsed": 0.0}  # training seconds so far, the same on every rank: a cooldown follows the budget
    sched = build_scheduler(opt, cfg.schedule, cfg.train.steps, d_model=spec.d_model,
                            done=lambda s: max(s / cfg.train.steps, clock["elapsed"] / budget if budget else 0.0))
    accum = cfg.run.grad_accum
    if cfg.train.batch_tokens:
        accum = max(1, math.ceil(cfg.train.batch_tokens / (cfg.train.max_tokens * dist.world_size)))
    step, epoch, pos, elapsed_before = 0, 0, 0, 0.0
    running = {"loss": 0.0, "nll": 0.0, "tokens": 0, "src_tokens": 0, "time": 0.0, "nll_tokens": 0}
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        st = ckpt["state"]
        step, epoch, pos, elapsed_before = ckpt["step"], st["epoch"], st["pos"], st["elapsed"]
        running = dict(st["running"])
    train_model = torch.compile(model) if cfg.run.compile else model
    train_model = dist.wrap(train_model)
    dist.print(f"model: {spec.name or cfg.model}, {n_params:,} parameters, d_model {spec.d_model}, "
               f"{spec.encoder_layers}+{spec.decoder_layers} layers; {dist.world_size} process(es) on {device}, "
               f"{cfg.run.precision}, micro-batch {cfg.train.max_tokens} tokens x {accum} accumulation")

    def epoch_steps(e: int) -> list[list[list[int]]]:
        batches = T.token_batches(src_lens, tgt_lens, max_tokens=cfg.train.max_tokens, shuffle=True, seed=cfg.run.seed + e)
        batches = T.shard(batches, dist.rank, dist.world_size)
        n = len(batches) // accum * accum
        return [batches[i : i + accum] for i in range(0, n, accum)]

    first = T.token_batches(src_lens, tgt_lens, max_tokens=cfg.train.max_tokens, shuffle=True, seed=cfg.run.seed)
    pad_src, pad_tgt = T.padding_fraction(first, src_lens), T.padding_fraction(first, tgt_lens)
    steps_per_epoch = len(epoch_steps(0))
    dist.print(f"batches: {len(first)} a epoch ({steps_per_epoch} optimizer steps), padding {100 * pad_src:.1f}% source, "
               f"{100 * pad_tgt:.1f}% target")

    log = MetricsLog(out / "metrics.jsonl", enabled=dist.is_main, resume_step=step if ckpt is not None else None)
    if ckpt is None:
        log.write(step=0, split="info", params=n_params, vocab=V, padding_src=pad_src, padding_tgt=pad_tgt,
                  world_size=dist.world_size, grad_accum=accum, max_tokens=cfg.train.max_tokens)
    eval_every = cfg.run.eval_every or steps_per_epoch
    ckpt_every = cfg.run.checkpoint_every or steps_per_epoch
    keep = max(cfg.run.keep_checkpoints, cfg.train.average_last)
    total = cfg.train.steps
    valid_src, valid_tgt = ids["valid"]
    valid_refs = splits["valid"].tgt
    domains = list(dict.fromkeys(labels["valid"])) if corpus is not None else []  # per-domain rows: embedded corpus
    n_curve = cfg.decode.eval_sentences or len(valid_refs)  # the first n of each domain for the BLEU curve
    seen, curve = Counter(), []
    for i, d in enumerate(labels["valid"]):
        seen[d] += 1
        if seen[d] <= n_curve:
            curve.append(i)
    cfg_json = cfg.model_dump(mode="json")
    spec_json = spec.model_dump(mode="json")

    def evaluate(s: int) -> dict:
        losses = valid_loss(unwrap(train_model), valid_src, valid_tgt, cfg, dist, device, labels["valid"])
        values = {d: {"loss": loss, "nll": nll, "ppl": math.exp(min(nll, 50))} for d, (loss, nll) in losses.items()}
        if cfg.decode.eval_bleu:
            hyps = translate_split(unwrap(train_model), tok, [valid_src[i] for i in curve], cfg, dist, device,
                                   beams=cfg.decode.eval_beams)
            for d, sc in score_domains(hyps, [valid_refs[i] for i in curve], [labels["valid"][i] for i in curve]).items():
                values[d]["bleu"] = sc["bleu"]
        for d in domains:
            log.write(step=s, split=f"valid_{d}", **values[d])
        log.write(step=s, split="valid", **values["all"])
        return values

    if ckpt is not None:
        restore_rng(ckpt)
    progress = Progress(total, initial=step, desc="train", enabled=dist.is_main and cfg.run.progress, every=cfg.run.log_every)
    t_loop = time.perf_counter()
    clock["elapsed"] = elapsed_before
    stopped_early = False
    last_valid: dict = {}
    model.train()
    with attention_kernels(cfg.run.attention):
        while step < total and not stopped_early:
            plan = epoch_steps(epoch)
            if not plan:
                raise RecipeError("no full optimizer step in an epoch: lower train.max_tokens or grad accumulation")
            while pos < len(plan) and step < total:
                t_step = time.perf_counter()
                group = plan[pos]
                counts = torch.tensor([sum(tgt_lens[i] for b in group for i in b)], dtype=torch.float64)
                dist.all_reduce(counts)
                n_tgt = float(counts[0])
                loss_sum = nll_sum = 0.0
                nll_tokens = 0
                measure_nll = (step + 1) % cfg.run.log_every == 0 or step + 1 == total
                for j, b in enumerate(group):
                    s, t_in, t_out = T.collate(train_src, train_tgt, b)
                    s, t_in = (word_dropout(x, cfg.train.word_dropout) for x in (s, t_in))
                    s, t_in, t_out = s.to(device), t_in.to(device), t_out.to(device)
                    sync = j == len(group) - 1 or not dist.enabled
                    with (contextlib.nullcontext() if sync else train_model.no_sync()):
                        with autocast(device, cfg.run.precision):
                            logits = train_model(s, t_in, s != PAD_ID, t_in != PAD_ID)
                        flat, gold = logits.float().flatten(0, 1), t_out.flatten()
                        loss = F.cross_entropy(flat, gold, ignore_index=PAD_ID, label_smoothing=cfg.train.label_smoothing,
                                               reduction="sum")
                        (loss * dist.world_size / n_tgt).backward()
                    loss_sum += loss.item()
                    if measure_nll:  # the unsmoothed NLL (perplexity) costs a pass over the logits: log steps only
                        with torch.no_grad():
                            nll_sum += F.cross_entropy(flat, gold, ignore_index=PAD_ID, reduction="sum").item()
                            nll_tokens += int((gold != PAD_ID).sum())
                    running["src_tokens"] += int((s != PAD_ID).sum())
                if cfg.optim.clip_grad:
                    torch.nn.utils.clip_grad_norm_(train_model.parameters(), cfg.optim.clip_grad)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                step, pos = step + 1, pos + 1
                running["loss"] += loss_sum
                running["nll"] += nll_sum
                running["nll_tokens"] = running.get("nll_tokens", 0) + nll_tokens
                running["tokens"] += sum(tgt_lens[i] for b in group for i in b)
                running["time"] += time.perf_counter() - t_step
                lr = opt.param_groups[0]["lr"]
                if step % cfg.run.log_every == 0 or step == total:
                    r = torch.tensor([running["loss"], running["nll"], running["tokens"], running["src_tokens"],
                                      running.get("nll_tokens", 0)], dtype=torch.float64)
                    dist.all_reduce(r)
                    tps = float(r[2] / max(running["time"], 1e-9))
                    nll = float(r[1] / max(float(r[4]), 1.0))
                    log.write(step=step, split="train", loss=float(r[0] / r[2]), nll=nll,
                              ppl=math.exp(min(nll, 50)), lr=lr, tokens_per_s=tps,
                              src_tokens_per_s=float(r[3] / max(running["time"], 1e-9)), epoch=epoch)
                    running = {"loss": 0.0, "nll": 0.0, "tokens": 0, "src_tokens": 0, "time": 0.0, "nll_tokens": 0}
                    progress.update(1, loss=float(r[0] / r[2]), tok_s=int(tps), lr=lr)
                else:
                    progress.update(1, lr=lr)
                elapsed = elapsed_before + time.perf_counter() - t_loop
                if budget is not None:
                    clock["elapsed"] = float(dist.all_reduce(torch.tensor([elapsed], dtype=torch.float64), "max")[0])
                    stopped_early = clock["elapsed"] >= budget and step < total
                final = step == total or stopped_early
                if step % eval_every == 0 or final:
                    last_valid = evaluate(step)
                    v = last_valid["all"]
                    progress.write(f"step {step}: valid loss {v['loss']:.3f}, ppl {v['ppl']:.2f}"
                                   + (f", BLEU {v['bleu']:.2f} ({'greedy' if cfg.decode.eval_beams == 1 else 'beam'})"
                                      if "bleu" in v else "")
                                   + "".join(f"; {d} ppl {last_valid[d]['ppl']:.1f}"
                                             + (f" BLEU {last_valid[d]['bleu']:.2f}" if "bleu" in last_valid[d] else "")
                                             for d in domains))
                    model.train()
                if step % ckpt_every == 0 or final:
                    if dist.is_main:
                        at_end = pos >= len(plan)
                        save_checkpoint(out / checkpoint_name(step), model=train_model, optimizer=opt, scheduler=sched,
                                        step=step, config=cfg_json,
                                        state={"epoch": epoch + 1 if at_end else epoch, "pos": 0 if at_end else pos,
                                               "elapsed": elapsed, "running": running, "spec": spec_json})
                        prune_checkpoints(out, keep)
                    dist.barrier()
                if stopped_early:
                    progress.write(f"train.minutes={cfg.train.minutes} reached at step {step} of {total}: stopping")
                    break
            if pos >= len(plan):
                epoch, pos = epoch + 1, 0
    progress.close()
    train_seconds = elapsed_before + time.perf_counter() - t_loop
    return finish(cfg, dist, model, spec, tok, splits, ids, out, labels=labels, corpus=corpus, step=step, epoch=epoch,
                  log=log, t_start=t_start,
                  train_seconds=train_seconds, pad=(pad_src, pad_tgt), stopped_early=stopped_early)


def finish(cfg, dist, model, spec, tok, splits, ids, out: Path, *, labels, corpus, step, epoch, log, t_start,
           train_seconds, pad, stopped_early) -> dict:
    """Average the last checkpoints, score last and averaged on valid and test (overall and per
    domain), export, plot."""
    device = dist.device
    model = unwrap(model)
    model.eval()
    paths = list_checkpoints(out)[-cfg.train.average_last :]
    if len(paths) == 1 and paths[0].name == checkpoint_name(step):
        averaged = model  # the final checkpoint alone is the model itself (the paper's Table 3 reports no averaging)
    else:
        averaged = zoo.build(spec, seed=cfg.run.seed).to(device)
        averaged.load_state_dict(average_checkpoints(paths))
        averaged.eval()
    dist.print(f"averaged {len(paths)} checkpoints: {', '.join(p.name for p in paths)}")
    results: dict = {"params": zoo.count_parameters(model), "step": step, "epochs": epoch,
                     "train_seconds": round(train_seconds, 1), "stopped_early": stopped_early,
                     "averaged": [p.name for p in paths], "padding_src": pad[0], "padding_tgt": pad[1]}
    results["config"] = cfg.model_dump(mode="json")
    if corpus is not None:
        results["corpus"] = {"name": cfg.data.corpus, **corpus.summary()}
    domains = list(corpus.splits) if corpus is not None else []
    hyps_out: dict = {}
    with attention_kernels(cfg.run.attention):
        for split in ("valid", "test"):
            scored = split in cfg.decode.final_splits  # decoded and scored; valid's loss is always computed
            if not len(splits[split]) or not (scored or split == "valid"):
                continue
            src_ids, tgt_ids = ids[split]
            for name, m in (("last", model), ("averaged", averaged)):
                if name == "averaged" and averaged is model:  # scored already as "last"
                    for key in [k for k in results if k.startswith(f"{split}/") and k.endswith("/last")]:
                        results[key[: -len("last")] + "averaged"] = results[key]
                    hyps_out[(split, name)] = hyps_out.get((split, "last"))
                    continue
                t0 = time.perf_counter()
                losses = valid_loss(m, src_ids, tgt_ids, cfg, dist, device, labels[split])
                decode = scored and (name == "averaged" or cfg.decode.score_last or averaged is model)
                scores = {}
                if decode:
                    hyps = translate_split(m, tok, src_ids, cfg, dist, device)
                    scores = score_domains(hyps, splits[split].tgt, labels[split])
                    hyps_out[(split, name)] = hyps
                seconds = round(time.perf_counter() - t0, 1)
                for d in ["all", *domains]:
                    loss, nll = losses[d]
                    sc = {**scores.get(d, {}), "loss": round(loss, 4), "ppl": round(math.exp(min(nll, 50)), 3)}
                    key = f"{split}/{name}" if d == "all" else f"{split}/{d}/{name}"
                    results[key] = sc
                    log.write(step=step, split=f"{split}_{name}" if d == "all" else f"{split}_{d}_{name}",
                              **{k: v for k, v in sc.items() if k in ("bleu", "chrf", "loss")})
                    what = f"BLEU {sc['bleu']:6.2f}  chrF {sc['chrf']:6.2f}  " if "bleu" in sc else ""
                    n = labels[split].count(d) if d != "all" else len(labels[split])
                    dist.print(f"{split:5s} {name:8s} {d if domains else '':9s}: {what}loss {loss:.3f}  ({n} sentences"
                               + (f", beam {cfg.decode.beams}, {seconds}s)" if decode and d == "all" else ")"))
    results["exported"] = "averaged"
    va, vl = results.get("valid/averaged", {}), results.get("valid/last", {})
    if "bleu" in va and "bleu" in vl and va["bleu"] < vl["bleu"]:
        dist.print("note: the averaged model scores below the last one on valid; exporting the averaged model all the same")
    if dist.is_main:
        model_dir = out / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        zoo.save(averaged, model_dir / "model.safetensors")
        shutil.copyfile(out / "tokenizer.json" if cfg.data.tokenizer is None else cfg.data.tokenizer, model_dir / "tokenizer.json")
        (model_dir / "translate.json").write_text(json.dumps({
            "src_lang": cfg.data.src_lang, "tgt_lang": cfg.data.tgt_lang, "max_len": cfg.data.max_len,
            "decode": cfg.decode.model_dump(mode="json")}, indent=2) + "\n")
        key = "test" if "test/averaged" in results else "valid"
        r = results[f"{key}/averaged"]
        print(f"sacreBLEU signature: {r['bleu_signature']}")
        print(f"chrF signature:      {r['chrf_signature']}")
        hyps, src, refs = hyps_out[(key, "averaged")], splits[key].src, splits[key].tgt
        for d in domains or ["data"]:
            rows = [i for i, x in enumerate(labels[key]) if x == d][: cfg.decode.samples]
            if rows and domains:
                print(f"{d}:")
            for i in rows:
                print(f"  src: {src[i]}\n  ref: {refs[i]}\n  hyp: {hyps[i]}")
        if cfg.run.plot:
            plot_metrics(out / "metrics.jsonl", out / "curves.png",
                         panels=[("loss (label-smoothed)", ["train/loss", "valid/loss"]),
                                 ("perplexity", ["train/ppl", "valid/ppl", *(f"valid_{d}/ppl" for d in domains)]),
                                 ("valid BLEU", ["valid/bleu", *(f"valid_{d}/bleu" for d in domains)])],
                         log_y=["perplexity"], title=f"{spec.name or cfg.model} {cfg.data.src_lang}->{cfg.data.tgt_lang}")
            first = domains[0] if domains else "data"
            pick = next((i for i, (s, x) in enumerate(zip(src, labels[key])) if x == first and 6 <= len(s.split()) <= 14), 0)
            attention_picture(averaged.float().cpu(), tok, src[pick], cfg.decode, out / "cross_attention.png")
        from zoo.train import read_metrics

        speeds = [r["tokens_per_s"] for r in read_metrics(out / "metrics.jsonl") if r.get("split") == "train"]
        if speeds:
            results["train_tokens_per_s"] = round(sum(speeds) / len(speeds), 1)
            print(f"training: {step} steps, {train_seconds:.0f}s, {results['train_tokens_per_s']:.0f} target tokens/s "
                  f"(mean over log intervals), padding {100 * pad[0]:.1f}% source / {100 * pad[1]:.1f}% target")
        results["total_seconds"] = round(time.perf_counter() - t_start, 1)
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        last = results.get(f"{key}/last", {})
        per_domain = "".join(f", {d} {results[f'{key}/{d}/averaged']['bleu']:.2f}" for d in domains)
        print(f"{key}: BLEU {r['bleu']:.2f} chrF {r['chrf']:.2f} (averaged{per_domain})"
              + (f", BLEU {last['bleu']:.2f} (last)" if "bleu" in last else "")
              + f"; exported {model_dir} [{results['total_seconds']:.0f}s in all]", flush=True)
    dist.barrier()
    return results


# ------------------------------------------------------------------------------------- translate
def translate_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="translate.py translate",
                                     description="translate stdin line by line with an exported model")
    parser.add_argument("--model", required=True, metavar="DIR", help="the exported folder (run.out_dir/model)")
    parser.add_argument("--beams", type=int, default=None, help="beam size (default: the model's)")
    parser.add_argument("--batch", type=int, default=1, metavar="N", help="lines translated together (default 1)")
    args = parser.parse_args(argv)
    try:
        tr = Translator(args.model)
    except (OSError, ValueError) as e:
        print(f"{parser.prog}: error: {zoo.io.one_line(e)}", file=sys.stderr)
        return 2
    if args.beams:
        tr.decode["beams"] = args.beams
    buf: list[str] = []
    for line in sys.stdin:
        buf.append(line.rstrip("\n"))
        if len(buf) >= args.batch:
            print("\n".join(tr(buf)), flush=True)
            buf = []
    if buf:
        print("\n".join(tr(buf)), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "translate":
        return translate_main(argv[1:])
    cfg, args = parse_args(TranslateConfig, argv, default=DEFAULT_CONFIG, description=__doc__)
    tune_malloc()
    try:
        with distributed(cfg.run.device) as dist:
            train(cfg, args.resume, dist)
    except (RecipeError, T.DataError, CheckpointError) as e:
        print(f"translate.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
