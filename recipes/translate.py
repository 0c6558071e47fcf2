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
from pathlib import Path
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

import zoo
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

DEFAULT_CONFIG = Path(__file__).with_name("translate.yaml")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


# ------------------------------------------------------------------------------------------ config
class DataConfig(Config):
    path: Path | None = Field(None, description="folder with train/valid/test.{src,tgt} or *.tsv; null: Ding pairs")
    src_lang: str = "en"
    tgt_lang: str = "de"
    vocab_size: PositiveInt = Field(6000, description="shared source-target BPE vocabulary")
    min_frequency: PositiveInt = 2
    tokenizer: Path | None = Field(None, description="an existing tokenizer.json to use instead of training BPE")
    max_len: PositiveInt = Field(128, description="tokens per sentence (longer ones are truncated)")
    valid: PositiveInt = Field(500, description="Ding only: held-out validation pairs")
    test: PositiveInt = Field(1000, description="Ding only: held-out test pairs")
    split_seed: int = 1234
    train_limit: PositiveInt | None = Field(None, description="use only the first N training pairs")
    valid_limit: PositiveInt | None = None
    test_limit: PositiveInt | None = None


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
    samples: int = Field(5, description="example translations to print")
    final_splits: list[Literal["valid", "test"]] = Field(
        ["valid", "test"], min_length=1, description="splits scored (beam search, BLEU, chrF, ppl) at the end of "
        "training; an ablation grid that selects on dev needs only valid")


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
def load_splits(cfg: DataConfig) -> dict[str, T.Pairs]:
    """train / valid / test pairs as the config says (test may be empty for user data)."""
    if cfg.path is None:
        direction = f"{cfg.src_lang}-{cfg.tgt_lang}"
        splits, _ = T.ding_splits(direction=direction, valid=cfg.valid, test=cfg.test, seed=cfg.split_seed)
    else:
        root = Path(cfg.path)
        if not root.is_dir():
            raise T.DataError(f"data.path {root} is not a folder (want train.{cfg.src_lang}/train.{cfg.tgt_lang} or train.tsv)")
        splits = {}
        for name in ("train", "valid", "test"):
            tsv, src, tgt = root / f"{name}.tsv", root / f"{name}.{cfg.src_lang}", root / f"{name}.{cfg.tgt_lang}"
            if tsv.is_file():
                splits[name] = T.read_tsv(tsv)
            elif src.is_file() or tgt.is_file():
                splits[name] = T.read_parallel(src, tgt)
            elif name == "test":
                splits[name] = T.Pairs()
            else:
                raise T.DataError(f"no {name} data in {root}: want {src.name} and {tgt.name}, or {tsv.name}")
    for name, limit in (("train", cfg.train_limit), ("valid", cfg.valid_limit), ("test", cfg.test_limit)):
        if limit is not None:
            p = splits[name]
            splits[name] = T.Pairs(p.src[:limit], p.tgt[:limit], p.dropped)
    return splits


def get_tokenizer(cfg: DataConfig, splits: dict[str, T.Pairs], out_dir: Path, dist, *, resume: bool):
    """The shared BPE: ``data.tokenizer`` if given, else ``out_dir/tokenizer.json`` when it was trained
    with these settings (or when resuming), else trained on the training pairs and saved there."""
    if cfg.tokenizer is not None:
        return T.load_bpe(cfg.tokenizer), "given"
    path, meta_path = out_dir / "tokenizer.json", out_dir / "tokenizer.settings.json"
    settings = {"vocab_size": cfg.vocab_size, "min_frequency": cfg.min_frequency, "path": str(cfg.path),
                "langs": [cfg.src_lang, cfg.tgt_lang], "train_limit": cfg.train_limit, "n_train": len(splits["train"])}
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


def batches_by_tokens(lens: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices in length order, grouped so that batch size x longest stays under ``max_tokens``."""
    return T.token_batches(lens, lens, max_tokens=max(max_tokens, max(lens, default=1)), shuffle=False)


def word_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """``x`` with each real token (not padding, <s> or </s>) replaced by <unk> with probability ``p``;
    draws from the global CPU generator, so a resumed run draws the same masks."""
    if p <= 0:
        return x
    drop = (torch.rand(x.shape) < p) & (x > UNK_ID)
    return x.masked_fill(drop, UNK_ID)


# ------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def valid_loss(model, src, tgt, cfg: TranslateConfig, dist, device) -> tuple[float, float]:
    """Teacher-forced (label-smoothed loss, NLL) per target token on this data, over all ranks."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)
    batches = T.token_batches([len(s) for s in src], [len(t) for t in tgt], max_tokens=cfg.train.max_tokens, shuffle=False)
    for b in batches[dist.rank :: dist.world_size]:
        s, t_in, t_out = (x.to(device) for x in T.collate(src, tgt, b))
        with autocast(device, cfg.run.precision):
            logits = model(s, t_in, s != PAD_ID, t_in != PAD_ID)
        flat, gold = logits.float().flatten(0, 1), t_out.flatten()
        totals[0] += F.cross_entropy(flat, gold, ignore_index=PAD_ID, label_smoothing=cfg.train.label_smoothing, reduction="sum").item()
        totals[1] += F.cross_entropy(flat, gold, ignore_index=PAD_ID, reduction="sum").item()
        totals[2] += int((gold != PAD_ID).sum())
    dist.all_reduce(totals)
    model.train()
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])


@torch.no_grad()
def translate_ids(model, src: Sequence[Sequence[int]], dcfg: DecodeConfig, *, device, precision="auto",
                  beams: int | None = None) -> list[list[int]]:
    """Beam search (or greedy) over ``src`` token ids, batched by length; output in input order."""
    model.eval()
    beams = beams or dcfg.beams
    out: list[list[int]] = [[] for _ in src]
    if not src:
        return out
    for b in batches_by_tokens([len(s) for s in src], max(1, dcfg.batch_tokens // beams)):
        S = max(len(src[i]) for i in b)
        x = torch.full((len(b), S), PAD_ID, dtype=torch.long)
        for row, i in enumerate(b):
            x[row, : len(src[i])] = torch.tensor(src[i])
        x = x.to(device)
        with autocast(device, precision):
            gen = zoo.generate(model, x, padding_mask=x != PAD_ID, num_beams=beams, length_penalty=dcfg.length_penalty,
                               alpha=dcfg.alpha, max_len_a=dcfg.max_len_a, max_len_b=dcfg.max_len_b,
                               eos_id=EOS_ID, bos_id=BOS_ID, pad_id=PAD_ID)
        for row, i in enumerate(b):
            out[i] = gen.tokens[row, : int(gen.lengths[row])].tolist()
    return out


def translate_split(model, tok, src_ids, cfg: TranslateConfig, dist, device, beams: int | None = None) -> list[str]:
    """Detokenized translations of ``src_ids``, decoded in shares across ranks, on every rank."""
    mine = list(dist.shard(len(src_ids)))
    ids = translate_ids(model, [src_ids[i] for i in mine], cfg.decode, device=device, precision=cfg.run.precision, beams=beams)
    hyps: list[str] = [""] * len(src_ids)
    for part_idx, part_txt in dist.gather_object((mine, T.decode(tok, ids))):
        for i, text in zip(part_idx, part_txt):
            hyps[i] = text
    return hyps


def score(hyps: list[str], refs: list[str]) -> dict:
    """sacreBLEU (13a tokenization, on detokenized text) and chrF, with their signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2), "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()), "bleu_detail": str(b)}


# --------------------------------------------------------------------------- cross-attention picture
@torch.no_grad()
def cross_attention_weights(model, src: list[int], tgt: list[int], layer: int = -1) -> torch.Tensor:
    """Cross-attention probabilities [H, T, S] of decoder block ``layer`` for a source and its
    translation (teacher-forced, fp32), computed from the module's own q and kv projections."""
    block = model.decoder.blocks[layer]
    attn = block.cross_attn
    seen = {}

    def hook(module, args, kwargs):
        seen["x"], seen["memory"] = args[0], args[1] if len(args) > 1 else kwargs["memory"]

    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        model.eval()
        s = torch.tensor([src])
        t_in = torch.tensor([[BOS_ID] + tgt[:-1]])
        model(s, t_in)
    finally:
        handle.remove()
    x, memory = seen["x"].float(), seen["memory"].float()
    B, Tq, _ = x.shape
    q = attn.q(x).view(B, Tq, attn.n_heads, attn.head_dim).transpose(1, 2)  # (1, H, T, K)
    k, _ = attn._heads_kv(attn.kv(memory))  # (1, G, S, K)
    k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
    return ((q @ k.transpose(-1, -2)) / math.sqrt(attn.head_dim)).softmax(dim=-1)[0]


def plot_attention(weights: torch.Tensor, src_tokens: list[str], tgt_tokens: list[str], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    H = weights.shape[0]
    cols = 2 if H <= 4 else 4
    rows = math.ceil(H / cols)
    S, Tn = len(src_tokens), len(tgt_tokens)
    fig, axes = plt.subplots(rows, cols, figsize=(0.32 * S * cols + 2, 0.3 * Tn * rows + 1.5), squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        ax.imshow(weights[h].numpy(), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(S), src_tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(Tn), tgt_tokens, fontsize=7)
        ax.set_title(f"head {h}", fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def attention_picture(model, tok, src_text: str, dcfg: DecodeConfig, path: Path) -> Path:
    src = T.encode(tok, [src_text])[0]
    hyp = translate_ids(model, [src], dcfg, device=torch.device("cpu"), precision="fp32")[0]
    weights = cross_attention_weights(model, src, hyp)
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
    splits = load_splits(cfg.data)
    tok, how = get_tokenizer(cfg.data, splits, out, dist, resume=ckpt is not None)
    V = tok.get_vocab_size()
    ids = {name: (T.encode(tok, p.src, max_len=cfg.data.max_len), T.encode(tok, p.tgt, max_len=cfg.data.max_len))
           for name, p in splits.items()}
    source = str(cfg.data.path) if cfg.data.path else f"Ding dictionary pairs ({T.DING_PATH})"
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
    sched = build_scheduler(opt, cfg.schedule, cfg.train.steps, d_model=spec.d_model)
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
    cfg_json = cfg.model_dump(mode="json")
    spec_json = spec.model_dump(mode="json")

    def evaluate(s: int) -> dict:
        loss, nll = valid_loss(unwrap(train_model), valid_src, valid_tgt, cfg, dist, device)
        values = {"loss": loss, "nll": nll, "ppl": math.exp(min(nll, 50))}
        if cfg.decode.eval_bleu:
            hyps = translate_split(unwrap(train_model), tok, valid_src, cfg, dist, device, beams=cfg.decode.eval_beams)
            values["bleu"] = score(hyps, valid_refs)["bleu"]
        log.write(step=s, split="valid", **values)
        return values

    if ckpt is not None:
        restore_rng(ckpt)
    progress = Progress(total, initial=step, desc="train", enabled=dist.is_main and cfg.run.progress, every=cfg.run.log_every)
    t_loop = time.perf_counter()
    time_limit = cfg.train.minutes * 60 if cfg.train.minutes else None
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
                if time_limit is not None:
                    flag = torch.tensor([float(elapsed >= time_limit)])
                    stopped_early = bool(dist.all_reduce(flag, "max")[0]) and step < total
                final = step == total or stopped_early
                if step % eval_every == 0 or final:
                    last_valid = evaluate(step)
                    progress.write(f"step {step}: valid loss {last_valid['loss']:.3f}, ppl {last_valid['ppl']:.2f}"
                                   + (f", BLEU {last_valid['bleu']:.2f} ({'greedy' if cfg.decode.eval_beams == 1 else 'beam'})"
                                      if "bleu" in last_valid else ""))
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
    return finish(cfg, dist, model, spec, tok, splits, ids, out, step=step, epoch=epoch, log=log, t_start=t_start,
                  train_seconds=train_seconds, pad=(pad_src, pad_tgt), stopped_early=stopped_early)


def finish(cfg, dist, model, spec, tok, splits, ids, out: Path, *, step, epoch, log, t_start, train_seconds, pad,
           stopped_early) -> dict:
    """Average the last checkpoints, score last and averaged on valid and test, export, plot."""
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
    with attention_kernels(cfg.run.attention):
        hyps_out: dict = {}
        for split in ("valid", "test"):
            if not len(splits[split]) or split not in cfg.decode.final_splits:
                continue
            src_ids, tgt_ids = ids[split]
            refs = splits[split].tgt
            for name, m in (("last", model), ("averaged", averaged)):
                if name == "averaged" and averaged is model:  # scored already as "last"
                    results[f"{split}/averaged"] = results[f"{split}/last"]
                    hyps_out[(split, name)] = hyps_out[(split, "last")]
                    continue
                t0 = time.perf_counter()
                hyps = translate_split(m, tok, src_ids, cfg, dist, device)
                sc = score(hyps, refs)
                loss, nll = valid_loss(m, src_ids, tgt_ids, cfg, dist, device)
                sc.update(loss=round(loss, 4), ppl=round(math.exp(min(nll, 50)), 3), decode_seconds=round(time.perf_counter() - t0, 1))
                results[f"{split}/{name}"] = sc
                hyps_out[(split, name)] = hyps
                log.write(step=step, split=f"{split}_{name}", bleu=sc["bleu"], chrf=sc["chrf"], loss=loss)
                dist.print(f"{split:5s} {name:8s}: BLEU {sc['bleu']:.2f}  chrF {sc['chrf']:.2f}  "
                           f"loss {loss:.3f}  ({len(hyps)} sentences, beam {cfg.decode.beams}, {sc['decode_seconds']}s)")
    final_name = "averaged"
    if "valid/averaged" in results and results["valid/averaged"]["bleu"] < results["valid/last"]["bleu"]:
        dist.print("note: the averaged model scores below the last one on valid; exporting the averaged model all the same")
    results["exported"] = final_name
    if dist.is_main:
        model_dir = out / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        zoo.save(averaged, model_dir / "model.safetensors")
        shutil.copyfile(out / "tokenizer.json" if cfg.data.tokenizer is None else cfg.data.tokenizer, model_dir / "tokenizer.json")
        (model_dir / "translate.json").write_text(json.dumps({
            "src_lang": cfg.data.src_lang, "tgt_lang": cfg.data.tgt_lang, "max_len": cfg.data.max_len,
            "decode": cfg.decode.model_dump(mode="json")}, indent=2) + "\n")
        key = "test" if "test/averaged" in results else "valid"
        sig = results[f"{key}/averaged"]["bleu_signature"]
        print(f"sacreBLEU signature: {sig}")
        print(f"chrF signature:      {results[f'{key}/averaged']['chrf_signature']}")
        hyps = hyps_out[(key, "averaged")]
        for i in range(min(cfg.decode.samples, len(hyps))):
            print(f"  src: {splits[key].src[i]}\n  ref: {splits[key].tgt[i]}\n  hyp: {hyps[i]}")
        if cfg.run.plot:
            plot_metrics(out / "metrics.jsonl", out / "curves.png",
                         panels=[("loss (label-smoothed)", ["train/loss", "valid/loss"]),
                                 ("perplexity", ["train/ppl", "valid/ppl"]),
                                 ("valid BLEU", ["valid/bleu"])], log_y=["perplexity"],
                         title=f"{spec.name or cfg.model} {cfg.data.src_lang}->{cfg.data.tgt_lang}")
            pick = next((i for i, s in enumerate(splits[key].src) if 6 <= len(s.split()) <= 14), 0)
            attention_picture(averaged.float().cpu(), tok, splits[key].src[pick], cfg.decode, out / "cross_attention.png")
        from zoo.train import read_metrics

        speeds = [r["tokens_per_s"] for r in read_metrics(out / "metrics.jsonl") if r.get("split") == "train"]
        if speeds:
            results["train_tokens_per_s"] = round(sum(speeds) / len(speeds), 1)
            print(f"training: {step} steps, {train_seconds:.0f}s, {results['train_tokens_per_s']:.0f} target tokens/s "
                  f"(mean over log intervals), padding {100 * pad[0]:.1f}% source / {100 * pad[1]:.1f}% target")
        results["total_seconds"] = round(time.perf_counter() - t_start, 1)
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        r = results[f"{key}/averaged"]
        print(f"{key}: BLEU {r['bleu']:.2f} chrF {r['chrf']:.2f} (averaged), "
              f"BLEU {results[f'{key}/last']['bleu']:.2f} (last); exported {model_dir} "
              f"[{results['total_seconds']:.0f}s in all]", flush=True)
    dist.barrier()
    return results


# ------------------------------------------------------------------------------------- translate
class Translator:
    """An exported model folder (model.safetensors, tokenizer.json, translate.json) ready to translate."""

    def __init__(self, model_dir: str | Path, device: str = "cpu") -> None:
        model_dir = Path(model_dir)
        for name in ("model.safetensors", "tokenizer.json"):
            if not (model_dir / name).is_file():
                raise RecipeError(f"no {name} in {model_dir}; export a model with recipes/translate.py first")
        settings = json.loads((model_dir / "translate.json").read_text()) if (model_dir / "translate.json").is_file() else {}
        self.max_len = settings.get("max_len", 256)
        self.decode = DecodeConfig.model_validate(settings.get("decode", {}))
        self.device = torch.device(device)
        self.model = zoo.load(model_dir / "model.safetensors", device=self.device).eval()
        self.tok = T.load_bpe(model_dir / "tokenizer.json")

    def __call__(self, lines: Sequence[str]) -> list[str]:
        keep = [i for i, line in enumerate(lines) if line.strip()]
        src = T.encode(self.tok, [lines[i].strip() for i in keep], max_len=self.max_len)
        out = [""] * len(lines)
        for i, text in zip(keep, T.decode(self.tok, translate_ids(self.model, src, self.decode, device=self.device, precision="fp32"))):
            out[i] = text
        return out


def translate_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="translate.py translate",
                                     description="translate stdin line by line with an exported model")
    parser.add_argument("--model", required=True, metavar="DIR", help="the exported folder (run.out_dir/model)")
    parser.add_argument("--beams", type=int, default=None, help="beam size (default: the model's)")
    parser.add_argument("--batch", type=int, default=1, metavar="N", help="lines translated together (default 1)")
    args = parser.parse_args(argv)
    try:
        tr = Translator(args.model)
    except (RecipeError, OSError, ValueError) as e:
        print(f"{parser.prog}: error: {zoo.io.one_line(e)}", file=sys.stderr)
        return 2
    if args.beams:
        tr.decode = tr.decode.model_copy(update={"beams": args.beams})
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
