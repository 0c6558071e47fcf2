"""Train a Transformer for translation (Vaswani et al. 2017), average its last checkpoints, score it
with sacreBLEU and chrF, export it, and translate with it.

    python recipes/translate.py                          # the embedded default: EN->DE on the CPU, 9 minutes
    python recipes/translate.py data.path=wmt14 model=transformer-base train.steps=100000 ...
    torchrun --nproc_per_node 8 recipes/translate.py --config my.yaml
    python recipes/translate.py --resume                 # continue exactly where the run stopped
    echo "The room faces north." | python recipes/translate.py translate --model runs/translate/model

Data (``data.path``): a folder with ``train.SRC``/``train.TGT``, ``valid.*``, ``test.*`` (the WMT14
layout, one sentence a line) or ``train.tsv``/``valid.tsv``/``test.tsv`` (``source<TAB>target``);
without a path, two domains Debian ships: the Ding dictionary's everyday sentence pairs
(``trans-de-en``) and the German translations of software messages (gettext catalogs), each split
into train/valid/test. See docs/recipes/translate.md.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

import zoo
from zoo.atomic import atomic_write_text
from zoo.data import bpe
from zoo.data import translation as T
from zoo.train import (Config, ListTask, OptimConfig, RunConfig, ScheduleConfig, TrainError, average_checkpoints,
                       checkpoint_name, distributed, fit, list_checkpoints, parse_args, perplexity, read_metrics,
                       resolve_precision, resolve_resume, seed_everything, tune_malloc)

# this recipe's own code, beside it (a script's folder is on sys.path when it runs)
from zoo.train.pretrained import pretrained

from translate_data import TranslationDataConfig, describe_corpus, load_splits, shared_bpe, word_dropout
from translate_eval import (DecodeConfig, attention_picture, decode_settings, export_model_dir, score_domains,
                            score_models, translate_split, translate_stdin, valid_loss)

DEFAULT_CONFIG = Path(__file__).with_name("translate.yaml")
GPU_CONFIG = Path(__file__).with_name("translate.gpu.yaml")  # laid under the user's settings on CUDA


# ------------------------------------------------------------------------------------------ config
class TrainConfig(Config):
    steps: PositiveInt = Field(1000, description="optimizer steps")
    minutes: PositiveFloat | None = Field(None, description="stop training after this many minutes (a safety net)")
    max_tokens: PositiveInt = Field(4096, description="padded source (and target) tokens per micro-batch per process")
    batch_tokens: PositiveInt | None = Field(
        None, description="target tokens per optimizer step over all processes; sets run.grad_accum")
    label_smoothing: NonNegativeFloat = Field(0.1, description="the paper's 0.1")
    word_dropout: float = Field(0.0, ge=0.0, lt=1.0, description=(
        "replace this fraction of the source and decoder-input tokens by <unk> in training (the targets "
        "stay intact): word dropout, which low-resource NMT found to help (Sennrich & Zhang 2019)"))
    average_last: PositiveInt = Field(5, description="average the last N checkpoints (1: no averaging)")


class TranslateConfig(Config):
    init: Path | None = Field(None, description="start from these weights: a zoo encoder-decoder (a translation run's "
                              "model/model.safetensors) whose tokenizer.json beside it holds this recipe's <pad> <s> </s> "
                              "<unk> as ids 0-3; its tokenizer is used; null: the model spec from random weights")
    model: str = Field("transformer-tiny-ding", description="without init: a zoo preset or spec YAML")
    model_overrides: list[str] = Field(default_factory=list, description="spec overrides, e.g. dropout.residual=0.1")
    data: TranslationDataConfig = TranslationDataConfig()
    train: TrainConfig = TrainConfig()
    decode: DecodeConfig = DecodeConfig()
    optim: OptimConfig = OptimConfig(name="adam", lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, clip_grad=None)
    schedule: ScheduleConfig = ScheduleConfig(kind="inverse_sqrt", warmup=4000)
    run: RunConfig = RunConfig(out_dir=Path("runs/translate"))


# -------------------------------------------------------------------------------------------- task
class TranslationTask(ListTask):
    """Label-smoothed cross-entropy on token-bucketed batches of similar length (each process its
    share, ``accum`` batches a step); valid loss, perplexity and a greedy BLEU curve per domain."""

    name = "train"

    def __init__(self, cfg: TranslateConfig, dist, tok, splits, ids, labels, domains: list[str], accum: int) -> None:
        super().__init__(dist, accum)
        self.cfg, self.tok, self.domains = cfg, tok, domains
        self.src, self.tgt = ids["train"]
        self.src_lens, self.tgt_lens = [len(x) for x in self.src], [len(x) for x in self.tgt]
        self.src_row = T.source_row_len(self.src_lens, self.tgt_lens, cfg.data.pack_len)  # packed rows' source side
        self.valid_src, self.valid_tgt = ids["valid"]
        self.refs, self.labels = splits["valid"].tgt, labels["valid"]
        n_curve, seen, self.curve = cfg.decode.eval_sentences or len(self.refs), Counter(), []
        for i, d in enumerate(self.labels):  # the BLEU curve decodes the first n of each domain
            seen[d] += 1
            if seen[d] <= n_curve:
                self.curve.append(i)
        self.total_steps = cfg.train.steps
        self.panels = [("loss (label-smoothed)", ["train/loss", "valid/loss"]),
                       ("perplexity", ["train/ppl", "valid/ppl", *(f"valid_{d}/ppl" for d in domains)]),
                       ("valid BLEU", ["valid/bleu", *(f"valid_{d}/bleu" for d in domains)])]
        self.plot_options = {"log_y": ["perplexity"], "title": f"{cfg.model} {cfg.data.src_lang}->{cfg.data.tgt_lang}"}

    def batches(self, epoch: int) -> list[list[int]] | list[list[list[int]]]:
        """Token buckets of pair indices; packed: token buckets of rows, each a list of pair indices."""
        data, seed = self.cfg.data, self.cfg.run.seed + epoch
        if data.packing == "pad":
            return T.token_batches(self.src_lens, self.tgt_lens, max_tokens=self.cfg.train.max_tokens, seed=seed)
        return T.packed_batches(self.src_lens, self.tgt_lens, src_len=self.src_row, tgt_len=data.pack_len,
                                max_tokens=self.cfg.train.max_tokens, seed=seed)

    def padding(self, batches) -> tuple[float, float]:
        """The padded share of source and target slots in ``batches``."""
        if self.cfg.data.packing == "pad":
            return T.padding_fraction(batches, self.src_lens), T.padding_fraction(batches, self.tgt_lens)
        fractions = []
        for lens in (self.src_lens, self.tgt_lens):
            rows = [[sum(lens[i] for i in row) for row in b] for b in batches]  # each row's tokens
            fractions.append(1 - sum(map(sum, rows)) / max(1, sum(len(r) * max(r) for r in rows)))
        return fractions[0], fractions[1]

    def count(self, batch) -> float:
        pairs = batch if self.cfg.data.packing == "pad" else [i for row in batch for i in row]
        return float(sum(self.tgt_lens[i] for i in pairs))

    def loss(self, model, batch, step):
        cfg, device = self.cfg, self.dist.device
        documents = {}
        if cfg.data.packing == "pad":
            s, t_in, t_out = T.collate(self.src, self.tgt, batch)
        else:
            s, t_in, t_out, s_doc, t_doc = T.collate_packed(self.src, self.tgt, batch)
            documents = {"src_documents": s_doc.to(device), "tgt_documents": t_doc.to(device)}
        s, t_in = (word_dropout(x, cfg.train.word_dropout) for x in (s, t_in))
        s, t_in, t_out = s.to(device), t_in.to(device), t_out.to(device)
        gold = t_out.masked_fill(t_out == T.PAD_ID, -100)
        # the smoothed loss (and the unsmoothed NLL of the same logits) from the head, chunk by chunk, without
        # the [B, T, V] logits (zoo.kernels.loss)
        loss, nll = model(s, t_in, s != T.PAD_ID, t_in != T.PAD_ID, **documents, targets=gold,
                          label_smoothing=cfg.train.label_smoothing, return_nll=True)
        stats = {"tokens": self.count(batch), "src_tokens": float((s != T.PAD_ID).sum())}
        if (step + 1) % cfg.run.log_every == 0 or step + 1 == self.total_steps:  # the unsmoothed NLL: log steps only
            stats["nll"] = float(nll)
            stats["nll_tokens"] = float((gold != -100).sum())
        return loss, stats

    def train_values(self, sums: dict[str, float], seconds: float) -> dict[str, float]:
        values = {"tokens_per_s": sums["tokens"] / max(seconds, 1e-9), "src_tokens_per_s": sums["src_tokens"] / max(seconds, 1e-9)}
        if sums.get("nll_tokens"):
            nll = sums["nll"] / sums["nll_tokens"]
            values.update(nll=nll, ppl=perplexity(nll))
        return values

    def evaluate(self, model) -> dict:
        cfg, dist = self.cfg, self.dist
        losses = valid_loss(model, self.valid_src, self.valid_tgt, dist, max_tokens=cfg.train.max_tokens,
                            label_smoothing=cfg.train.label_smoothing, precision=cfg.run.precision, labels=self.labels)
        values = {d: {"loss": loss, "nll": nll, "ppl": perplexity(nll)} for d, (loss, nll) in losses.items()}
        if cfg.decode.eval_bleu:
            hyps = translate_split(model, self.tok, [self.valid_src[i] for i in self.curve], dist,
                                   decode_settings(cfg.decode, cfg.decode.eval_beams), precision=cfg.run.precision)
            for d, sc in score_domains(hyps, [self.refs[i] for i in self.curve], [self.labels[i] for i in self.curve]).items():
                values[d]["bleu"] = sc["bleu"]
        return {**values.pop("all"), **{d: values[d] for d in self.domains}}


# -------------------------------------------------------------------------------------- training
def train(cfg: TranslateConfig, resume: str | None, dist) -> dict:
    t_start = time.perf_counter()
    device = dist.device
    cfg.run.precision = resolve_precision(cfg.run.precision, device)
    out = Path(cfg.run.out_dir)
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
    ckpt_path = resolve_resume(resume, out)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)

    # data and the shared BPE
    t0 = time.perf_counter()
    splits, labels, corpus = load_splits(cfg.data)
    if corpus is not None:
        describe_corpus(corpus, dist, out)
    start = None
    if cfg.init is not None:
        start = pretrained(cfg.init, families=("encoder_decoder",), recipe="translate.py", overrides=cfg.model_overrides,
                           work_dir=out / "init", dist=dist, seed=cfg.run.seed)
        dist.print(start.describe())
        tok, how = init_tokenizer(cfg, start.folder / "tokenizer.json"), f"from init ({start.folder / 'tokenizer.json'})"
        if dist.is_main:  # where the export and a resumed run read it
            tok.save(str(out / "tokenizer.json"))
    else:
        tok, how = shared_bpe(cfg.data, splits, out, dist, resume=ckpt_path is not None, corpus=corpus)
    V = tok.get_vocab_size()
    ids = {name: tuple(bpe.encode(tok, side, eos=T.EOS, max_len=cfg.data.max_len) for side in (p.src, p.tgt))
           for name, p in splits.items()}
    source = str(cfg.data.path) if cfg.data.path else f"the embedded corpus ({cfg.data.corpus}: {', '.join(corpus.domains)})"
    dist.print(f"data: {source}, {cfg.data.src_lang}->{cfg.data.tgt_lang}: "
               + ", ".join(f"{k} {len(v):,}" for k, v in splits.items())
               + f"; BPE {how}: {V:,} tokens; {time.perf_counter() - t0:.1f}s")

    # model and task
    seed_everything(cfg.run.seed)
    spec = zoo.load_spec(cfg.model, [*cfg.model_overrides, f"vocab_size={V}"]) if start is None else start.spec
    if spec.family != "encoder_decoder":
        raise TrainError(f"model {cfg.model!r} is a {spec.family}; translation needs an encoder_decoder")
    model = (zoo.build(spec, seed=cfg.run.seed) if start is None else start.model).to(device)
    n_params = zoo.count_parameters(model)
    accum = cfg.run.grad_accum
    if cfg.train.batch_tokens:
        accum = max(1, math.ceil(cfg.train.batch_tokens / (cfg.train.max_tokens * dist.world_size)))
    domains = list(corpus.splits) if corpus is not None else []  # per-domain rows: the embedded corpus
    task = TranslationTask(cfg, dist, tok, splits, ids, labels, domains, accum)
    first = task.epoch_batches(0)
    pad = task.padding(first)
    dist.print(f"model: {spec.name or cfg.model}, {n_params:,} parameters, d_model {spec.d_model}, "
               f"{spec.encoder_layers}+{spec.decoder_layers} layers; {dist.world_size} process(es) on {device}, "
               f"{cfg.run.precision}, micro-batch {cfg.train.max_tokens} tokens x {accum} accumulation")
    packed = ("" if cfg.data.packing == "pad" else
              f" of rows packed with document masks ({task.src_row} source / {cfg.data.pack_len} target tokens a row, "
              f"{sum(map(len, first)):,} rows)")
    dist.print(f"batches: {len(first)} a epoch{packed} ({task.steps(0)} optimizer steps), padding {100 * pad[0]:.1f}% "
               f"source, {100 * pad[1]:.1f}% target")
    keep = max(cfg.run.keep_checkpoints, cfg.train.average_last)
    info = {"params": n_params, "vocab": V, "padding_src": pad[0], "padding_tgt": pad[1], "world_size": dist.world_size,
            "grad_accum": accum, "max_tokens": cfg.train.max_tokens}
    run = cfg.run.model_copy(update={"keep_checkpoints": keep})
    fitted = fit(model, task, optim=cfg.optim, schedule=cfg.schedule, run=run, dist=dist, total_steps=cfg.train.steps,
                 resume=ckpt_path, config=cfg.model_dump(mode="json"), minutes=cfg.train.minutes, d_model=spec.d_model,
                 info=info)
    return finish(cfg, dist, fitted, spec, tok, splits, ids, out, labels=labels, corpus=corpus, t_start=t_start, pad=pad,
                  init=None if start is None else start.report())


def init_tokenizer(cfg: TranslateConfig, path: Path):
    """The tokenizer beside ``init``'s weights, which must be this recipe's kind (its special ids)."""
    if cfg.data.tokenizer is not None:
        raise TrainError(f"data.tokenizer={cfg.data.tokenizer}: with init= the tokenizer beside the weights is used; "
                         f"drop data.tokenizer")
    try:
        return bpe.load_bpe(path, specials=T.SPECIALS)
    except T.DataError as e:
        raise TrainError(f"init={cfg.init}: {e}; this recipe continues models trained by it (a run's model/ folder), "
                         f"not other tokenizers' models") from None


def finish(cfg, dist, fitted, spec, tok, splits, ids, out: Path, *, labels, corpus, t_start, pad, init=None) -> dict:
    """Average the last checkpoints, score last and averaged on valid and test (overall and per
    domain), export, plot."""
    device, model, step = dist.device, fitted.best, fitted.step
    model.eval()
    paths = list_checkpoints(out)[-cfg.train.average_last :]
    if len(paths) == 1 and paths[0].name in (checkpoint_name(step), checkpoint_name(step, sharded=True)):
        averaged = model  # the final checkpoint alone is the model itself (the paper's Table 3 reports no averaging)
    else:
        averaged = zoo.build(spec, seed=cfg.run.seed).to(device)
        averaged.load_state_dict(average_checkpoints(paths))
        averaged.eval()
    dist.print(f"averaged {len(paths)} checkpoints: {', '.join(p.name for p in paths)}")
    results: dict = {"params": zoo.count_parameters(model), "step": step, "epochs": fitted.epoch,
                     "train_seconds": round(fitted.elapsed, 1), "stopped_early": fitted.stopped_early,
                     "averaged": [p.name for p in paths], "padding_src": pad[0], "padding_tgt": pad[1]}
    results["config"] = cfg.model_dump(mode="json")
    results["init"] = init
    if corpus is not None:
        results["corpus"] = {"name": cfg.data.corpus, **corpus.summary()}
    domains = list(corpus.splits) if corpus is not None else []
    d = cfg.decode
    scores, hyps_out = score_models(
        {"last": model, "averaged": averaged}, splits, ids, labels, domains=domains, log=fitted.log, step=step, dist=dist, beams=d.beams,
        loss=lambda m, src, tgt, lab: valid_loss(m, src, tgt, dist, max_tokens=cfg.train.max_tokens, labels=lab,
                                                 label_smoothing=cfg.train.label_smoothing, precision=cfg.run.precision),
        translate=lambda m, src: translate_split(m, tok, src, dist, decode_settings(d), precision=cfg.run.precision),
        decoded=lambda split, name: split in d.final_splits and (name == "averaged" or d.score_last or averaged is model))
    results.update(scores)
    results["exported"] = "averaged"
    va, vl = results.get("valid/averaged", {}), results.get("valid/last", {})
    if "bleu" in va and "bleu" in vl and va["bleu"] < vl["bleu"]:
        dist.print("note: the averaged model scores below the last one on valid; exporting the averaged model all the same")
    if dist.is_main:
        model_dir = export_model_dir(averaged, cfg.data.tokenizer or out / "tokenizer.json", out / "model", {
            "src_lang": cfg.data.src_lang, "tgt_lang": cfg.data.tgt_lang, "max_len": cfg.data.max_len,
            "decode": cfg.decode.model_dump(mode="json")})
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
            first = domains[0] if domains else "data"
            pick = next((i for i, (s, x) in enumerate(zip(src, labels[key])) if x == first and 6 <= len(s.split()) <= 14), 0)
            attention_picture(averaged.float().cpu(), tok, src[pick], decode_settings(cfg.decode), out / "cross_attention.png")
        speeds = [r["tokens_per_s"] for r in read_metrics(out / "metrics.jsonl") if r.get("split") == "train"]
        if speeds:
            results["train_tokens_per_s"] = round(sum(speeds) / len(speeds), 1)
            print(f"training: {step} steps, {fitted.elapsed:.0f}s, {results['train_tokens_per_s']:.0f} target tokens/s "
                  f"(mean over log intervals), padding {100 * pad[0]:.1f}% source / {100 * pad[1]:.1f}% target")
        results["total_seconds"] = round(time.perf_counter() - t_start, 1)
        atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
        last = results.get(f"{key}/last", {})
        per_domain = "".join(f", {d} {results[f'{key}/{d}/averaged']['bleu']:.2f}" for d in domains)
        print(f"{key}: BLEU {r['bleu']:.2f} chrF {r['chrf']:.2f} (averaged{per_domain})"
              + (f", BLEU {last['bleu']:.2f} (last)" if "bleu" in last else "")
              + f"; exported {model_dir} [{results['total_seconds']:.0f}s in all]", flush=True)
    dist.barrier()
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "translate":
        return translate_stdin(argv[1:], prog="translate.py translate")
    cfg, args = parse_args(TranslateConfig, argv, default=DEFAULT_CONFIG, gpu=GPU_CONFIG, description=__doc__)
    tune_malloc()
    try:
        with distributed(cfg.run.device) as dist:
            train(cfg, args.resume, dist)
    except (TrainError, T.DataError) as e:
        print(f"translate.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
