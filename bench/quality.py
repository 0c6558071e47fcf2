"""Translation quality against a peer, on the same data, the same shared BPE, the same model
dimensions and the same wall-clock budget:

(a) zoo: ``recipes/translate.py`` as the README runs it (its default config, ``train.minutes`` set
    to the budget);
(b) the peer: ``transformers.MarianMTModel`` of the same dimensions, trained with the standard HF
    seq2seq recipe (AdamW, linear warmup then linear decay to zero at the end of the budget, label
    smoothing 0.1; no checkpoint averaging) on zoo's run's exact splits (``data/*.tsv``) and
    tokenizer, in batches of the same token size, decoded with beam 4 (``generate``). The peer's
    learning rate is picked on the validation loss among ``peer_lrs``.

Test sacreBLEU and chrF per domain, side by side: ``python -m bench --only translation-quality``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from zoo.data import bpe
from zoo.data import corpus as C
from zoo.data import translation as T
from zoo.train.optim import autocast, resolve_precision

from recipes.translate_eval import score_domains  # the recipe's own scoring, as its results.json has it

ROOT = Path(__file__).resolve().parents[1]
PAD, BOS, EOS = 0, 1, 2


def run_zoo(out: Path, minutes: float | None, overrides: list[str]) -> dict:
    """The recipe as a newcomer runs it (``minutes``: its training budget, None for the default's), in a
    child process; its results.json."""
    cmd = [sys.executable, str(ROOT / "recipes" / "translate.py"), f"run.out_dir={out}", "run.progress=false",
           *([f"train.minutes={minutes}"] if minutes is not None else []), *overrides]
    print("zoo:", " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    results = json.loads((out / "results.json").read_text())
    results["wall_seconds"] = round(time.perf_counter() - t0, 1)  # the whole command, interpreter start included
    return results


def read_run_data(run: Path) -> tuple[dict, dict]:
    """The exact splits of a recipe run: {split: Pairs (domains concatenated)}, {split: domain labels}."""
    splits, labels = {}, {}
    for name in ("train", "valid", "test"):
        splits[name], labels[name] = T.Pairs(), []
        for path in sorted(run.glob(f"data/{name}.*.tsv"), key=lambda p: C.DOMAINS.index(p.stem.split(".")[1])):
            p = T.read_tsv(path)
            splits[name].src += p.src
            splits[name].tgt += p.tgt
            labels[name] += [path.stem.split(".")[1]] * len(p)
    return splits, labels


def trainable(model) -> int:
    """Trained parameters (Marian's sinusoidal position table is a frozen parameter)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def marian_like(spec, vocab: int):
    """A MarianMTModel with the dimensions of zoo's spec (post-norm, as Marian is)."""
    from transformers import MarianConfig, MarianMTModel

    d = spec.dropout
    cfg = MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=spec.d_model, encoder_layers=spec.encoder_layers,
        decoder_layers=spec.decoder_layers, encoder_attention_heads=spec.block.attention.n_heads,
        decoder_attention_heads=spec.block.attention.n_heads, encoder_ffn_dim=spec.block.ffn.hidden,
        decoder_ffn_dim=spec.block.ffn.hidden, activation_function="relu", dropout=d.residual,
        attention_dropout=d.attention, activation_dropout=d.ffn, max_position_embeddings=spec.max_seq_len,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=BOS, forced_eos_token_id=EOS,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    return MarianMTModel(cfg)


def train_peer(model, data: dict, *, lr: float, warmup: int, seconds: float, max_tokens: int, precision: str,
               seed: int = 1, label_smoothing: float = 0.1) -> dict:
    """The HF seq2seq recipe for ``seconds`` of training: AdamW (HF's defaults: betas 0.9/0.999, eps 1e-8,
    no weight decay), lr warmed up linearly over ``warmup`` steps then decayed linearly to zero at the
    end of the time budget (HF's linear schedule counts steps; the budget here is wall-clock)."""
    torch.manual_seed(seed)
    src, tgt = data["train"]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    src_lens, tgt_lens = [len(x) for x in src], [len(x) for x in tgt]
    model.train()
    step, epoch, t0 = 0, 0, time.perf_counter()
    while True:
        for b in T.token_batches(src_lens, tgt_lens, max_tokens=max_tokens, shuffle=True, seed=seed + epoch):
            elapsed = time.perf_counter() - t0
            if step and elapsed >= seconds:
                return {"steps": step, "epochs": epoch, "seconds": round(elapsed, 1)}
            for g in opt.param_groups:
                g["lr"] = lr * min((step + 1) / warmup, 1.0) * max(0.0, 1 - elapsed / max(seconds, 1e-9))
            s, t_in, t_out = T.collate(src, tgt, b)
            with autocast("cpu", precision):
                logits = model(input_ids=s, attention_mask=(s != PAD).long(), decoder_input_ids=t_in,
                               decoder_attention_mask=(t_in != PAD).long()).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), t_out.flatten(), ignore_index=PAD,
                                   label_smoothing=label_smoothing)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % 200 == 0:
                print(f"  peer step {step}: loss {loss.item():.3f}, {elapsed:.0f}s", flush=True)
        epoch += 1


@torch.no_grad()
def peer_loss(model, src, tgt, max_tokens: int, precision: str) -> float:
    """Teacher-forced label-free NLL per target token."""
    model.eval()
    total = n = 0.0
    for b in T.token_batches([len(x) for x in src], [len(x) for x in tgt], max_tokens=max_tokens, shuffle=False):
        s, t_in, t_out = T.collate(src, tgt, b)
        with autocast("cpu", precision):
            logits = model(input_ids=s, attention_mask=(s != PAD).long(), decoder_input_ids=t_in,
                           decoder_attention_mask=(t_in != PAD).long()).logits
        total += F.cross_entropy(logits.float().flatten(0, 1), t_out.flatten(), ignore_index=PAD, reduction="sum").item()
        n += int((t_out != PAD).sum())
    return total / max(n, 1)


@torch.no_grad()
def peer_translate(model, src, *, beams: int, precision: str, batch_tokens: int = 4000) -> list[list[int]]:
    """HF ``generate`` with beam search (its defaults otherwise), batched by length like zoo's decoding."""
    model.eval()
    out: list[list[int]] = [[] for _ in src]
    lens = [len(s) for s in src]
    for b in T.token_batches(lens, lens, max_tokens=max(batch_tokens // beams, max(lens)), shuffle=False):
        x = torch.full((len(b), max(lens[i] for i in b)), PAD, dtype=torch.long)
        for row, i in enumerate(b):
            x[row, : lens[i]] = torch.tensor(src[i])
        with autocast("cpu", precision):
            gen = model.generate(input_ids=x, attention_mask=(x != PAD).long(), num_beams=beams,
                                 max_new_tokens=x.shape[1] + 50)
        for row, i in enumerate(b):
            out[i] = [t for t in gen[row].tolist()[1:]]  # after decoder_start; decode() stops at </s>
    return out


def translation_quality(*, minutes: float | None = None, out_dir: Path, peer_lrs: tuple[float, ...] = (5e-4, 1e-3),
                        zoo_overrides: list[str] = (), tiny: bool = False) -> dict:
    """Both sides on one machine, one after the other; returns the comparison (also written as JSON)."""
    from zoo.io import read_spec

    out_dir.mkdir(parents=True, exist_ok=True)
    results = run_zoo(out_dir / "zoo", minutes, list(zoo_overrides))
    cfg = json.loads((out_dir / "zoo" / "model" / "translate.json").read_text())
    spec = read_spec(out_dir / "zoo" / "model" / "model.safetensors")
    tok = bpe.load_bpe(out_dir / "zoo" / "tokenizer.json", specials=T.SPECIALS)
    splits, labels = read_run_data(out_dir / "zoo")
    data = {k: tuple(bpe.encode(tok, side, eos=T.EOS, max_len=cfg["max_len"]) for side in (p.src, p.tgt))
            for k, p in splits.items()}
    max_tokens, warmup = results["config"]["train"]["max_tokens"], results["config"]["schedule"]["warmup"]
    precision = resolve_precision("auto", "cpu")
    budget = results["train_seconds"]
    peers = []
    for lr in peer_lrs:
        torch.manual_seed(1)
        model = marian_like(spec, tok.get_vocab_size())
        print(f"peer: MarianMTModel {trainable(model):,} trainable parameters, lr {lr}, "
              f"{budget:.0f}s", flush=True)
        info = train_peer(model, data, lr=lr, warmup=warmup, seconds=budget, max_tokens=max_tokens, precision=precision)
        info.update(lr=lr, valid_nll=round(peer_loss(model, *data["valid"], max_tokens, precision), 4))
        print(f"peer lr {lr}: {info}", flush=True)
        peers.append((info["valid_nll"], info, model))
    _, info, best = min(peers, key=lambda p: p[0])
    t0 = time.perf_counter()
    hyps = bpe.decode(tok, peer_translate(best, data["test"][0], beams=4, precision=precision), eos=T.EOS)
    peer_scores = score_domains(hyps, splits["test"].tgt, labels["test"])
    info["decode_seconds"] = round(time.perf_counter() - t0, 1)
    domains = list(dict.fromkeys(labels["test"]))
    zoo_scores = {d: results[f"test/{d}/averaged"] for d in domains}
    zoo_scores["all"] = results["test/averaged"]
    report = {
        "budget_seconds": budget, "zoo": {"steps": results["step"], "params": results["params"],
                                          "decode": {k: cfg["decode"][k] for k in ("beams", "length_norm", "alpha")},
                                          "wall_seconds": results["wall_seconds"],
                                          "valid_nll": round(math.log(results["valid/averaged"]["ppl"]), 4),
                                          "scores": {d: {k: v[k] for k in ("bleu", "chrf")} for d, v in zoo_scores.items()}},
        "peer": {**info, "params": trainable(best), "candidates": [p[1] for p in peers],
                 "scores": {d: {k: v[k] for k in ("bleu", "chrf")} for d, v in peer_scores.items()}},
        "corpus": results.get("corpus", {}), "samples": [
            {"domain": labels["test"][i], "src": splits["test"].src[i], "ref": splits["test"].tgt[i], "peer": hyps[i]}
            for d in domains for i in [labels["test"].index(d)]],
    }
    (out_dir / "translation-quality.json").write_text(json.dumps(report, indent=1))
    return report


def markdown(report: dict, env: dict) -> str:
    """The side-by-side table of a report."""
    z, p = report["zoo"], report["peer"]
    dec = z.get("decode", {})
    lines = [f"Measured {env['date']} on {env['cpu']} ({env['threads']} threads, torch {env['torch']}): each side "
             f"trained for {report['budget_seconds'] / 60:.1f} minutes of wall-clock on the same splits and BPE.", "",
             "| test domain | zoo BLEU | zoo chrF | HF Marian BLEU | HF Marian chrF |", "| --- | ---: | ---: | ---: | ---: |"]
    def pair(a: float | None, b: float | None) -> tuple[str, str]:  # the better of the two in bold
        cells = [f"{v:.2f}" if v is not None else "-" for v in (a, b)]
        if a is not None and b is not None and a != b:
            best = 0 if a > b else 1
            cells[best] = f"**{cells[best]}**"
        return cells[0], cells[1]

    for d in z["scores"]:
        a, b = z["scores"][d], p["scores"].get(d, {})
        (zb, pb), (zc, pc) = pair(a["bleu"], b.get("bleu")), pair(a["chrf"], b.get("chrf"))
        lines.append(f"| {d} | {zb} | {zc} | {pb} | {pc} |")
    lines += ["", f"zoo: `recipes/translate.py` defaults, {z['params']:,} parameters, {z['steps']:,} steps, checkpoint "
              f"averaging, beam {dec.get('beams', 4)} ({dec.get('length_norm', dec.get('length_penalty', 'gnmt'))} length norm, alpha "
              f"{dec.get('alpha', 0.6)}). HF Marian: {p['params']:,} trained parameters, "
              f"{p['steps']:,} steps, AdamW lr {p['lr']} (picked on valid NLL among "
              + ", ".join(f"{c['lr']}: {c['valid_nll']} after {c['steps']:,} steps" for c in p["candidates"])
              + f"; zoo's averaged model: {z['valid_nll']}), beam 4 with HF's defaults."]
    return "\n".join(lines) + "\n"
