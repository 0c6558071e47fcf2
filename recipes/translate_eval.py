"""How the translation recipe decodes and measures a model: its ``decode`` config, beam search over
batches (:func:`decode_batches`), teacher-forced validation loss and decoding split over processes,
sacreBLEU and chrF overall and per domain, the final scoring of the last and averaged models, a
picture of the decoder's cross-attention, and the exported model folder with the command that
translates with it (:class:`Translator`, ``translate.py translate``)."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field, NonNegativeFloat, PositiveInt, model_validator

from zoo.atomic import atomic_write_text
from zoo.cli import positive_int
from zoo.data import bpe
from zoo.data.common import DataError, stdin_lines
from zoo.data.translation import BOS_ID, EOS, EOS_ID, PAD_ID, SPECIALS, Pairs, collate, token_batches
from zoo.generate import generate
from zoo.io import load as load_model
from zoo.io import one_line
from zoo.io import save as save_model
from zoo.train import Config, Dist, MetricsLog, autocast, perplexity

__all__ = ["DECODE_KEYS", "DecodeConfig", "decode_settings", "decode_batches", "valid_loss", "translate_split", "score",
           "score_domains", "score_models", "cross_attention_weights", "plot_attention", "attention_picture",
           "export_model_dir", "Translator", "translate_stdin"]

DECODE_KEYS = ("length_norm", "alpha", "max_len_a", "max_len_b", "batch_tokens")


class DecodeConfig(Config):
    """How the recipe decodes (its ``decode``): beam search, the BLEU curve during training, the final scores."""

    beams: PositiveInt = Field(4, description="beam size (1: greedy)")
    length_norm: Literal["gnmt", "power", "none"] = Field(
        "gnmt", description="what beam search divides a score by: gnmt: ((5 + |Y|) / 6)^alpha; power: |Y|^alpha "
        "(HF's length_penalty=alpha); none")
    alpha: NonNegativeFloat = Field(0.6, description="the length norm's exponent")
    max_len_a: NonNegativeFloat = Field(1.0, description="at most a * source length + b tokens")
    max_len_b: int = Field(50, description="at most a * source length + b tokens")
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

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """Older configs (and checkpoints) name ``length_norm`` ``length_penalty``, and ``power`` ``hf``."""
        if isinstance(data, dict) and "length_penalty" in data and "length_norm" not in data:
            data = dict(data)
            old = data.pop("length_penalty")
            data["length_norm"] = "power" if old == "hf" else old
        return data


def decode_settings(dcfg: DecodeConfig, beams: int | None = None) -> dict:
    """The keyword arguments of decode_batches for these decoding settings."""
    return {"beams": beams or dcfg.beams, **dcfg.model_dump(include=set(DECODE_KEYS))}


@torch.no_grad()
def decode_batches(model, src: Sequence[Sequence[int]], *, beams: int = 4, length_norm: str = "gnmt",
                   alpha: float = 0.6, max_len_a: float = 1.0, max_len_b: int = 50, batch_tokens: int = 4000,
                   device="cpu", precision: str = "auto", pad_id: int = 0, bos_id: int = 1, eos_id: int = 2,
                   cache: Literal["auto", "dynamic", "static"] = "auto", compile: bool | None = None) -> list[list[int]]:
    """Beam search (or greedy, ``beams=1``) over source token-id sequences with ``zoo.generate``, in
    batches of similar length holding about ``batch_tokens`` source tokens x beams; the outputs
    (without <s> and </s>) come back in input order.

    ``cache``: ``auto`` decodes on CUDA with the static cache and the compiled step (CUDA graphs),
    elsewhere with the dynamic cache (on CPU the faster; docs/guide.md, Generation); ``compile``
    (static cache only; None: on CUDA) compiles the step. The tokens are the same either way."""
    if cache not in ("auto", "dynamic", "static"):
        raise ValueError(f"decode_batches: cache must be 'auto', 'dynamic' or 'static', got {cache!r}")
    on_cuda = torch.device(device).type == "cuda"
    static = cache == "static" or (cache == "auto" and on_cuda)
    if compile and not static:
        raise ValueError("decode_batches: compile needs the static cache (cache='static', or 'auto' on CUDA)")
    opts = {"cache": "static", "compile": on_cuda if compile is None else compile} if static else {}
    model.eval()
    out: list[list[int]] = [[] for _ in src]
    if not src:
        return out
    lens = [len(s) for s in src]
    for b in token_batches(lens, lens, max_tokens=max(batch_tokens // beams, max(lens)), shuffle=False):
        x = torch.full((len(b), max(lens[i] for i in b)), pad_id, dtype=torch.long)
        for row, i in enumerate(b):
            x[row, : lens[i]] = torch.tensor(src[i])
        x = x.to(device)
        with autocast(x.device, precision):
            gen = generate(model, x, padding_mask=x != pad_id, num_beams=beams, length_norm=length_norm,
                               alpha=alpha, max_len_a=max_len_a, max_len_b=max_len_b, eos_id=eos_id, bos_id=bos_id,
                               pad_id=pad_id, **opts)
        for row, i in enumerate(b):
            out[i] = gen.tokens[row, : int(gen.lengths[row])].tolist()
    return out


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
    batches = token_batches([len(s) for s in src], [len(t) for t in tgt], max_tokens=max_tokens, shuffle=False)
    for b in batches[dist.rank :: dist.world_size]:
        s, t_in, t_out = (x.to(device) for x in collate(src, tgt, b))
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
    :func:`decode_batches`), decoded in shares across processes, on every one."""
    mine = list(dist.eval_indices(len(src_ids)))
    ids = decode_batches(model, [src_ids[i] for i in mine], device=dist.device, precision=precision, pad_id=PAD_ID,
                         bos_id=BOS_ID, eos_id=EOS_ID, **decode)
    hyps: list[str] = [""] * len(src_ids)
    for part_idx, part_txt in dist.gather_object((mine, bpe.decode(tok, ids, eos=EOS))):
        for i, text in zip(part_idx, part_txt):
            hyps[i] = text
    return hyps


def score(hyps: Sequence[str], refs: Sequence[str]) -> dict:
    """sacreBLEU (13a tokenization, on detokenized text) and chrF, with their signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    b, c = bleu.corpus_score(list(hyps), [list(refs)]), chrf.corpus_score(list(hyps), [list(refs)])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2), "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()), "bleu_detail": str(b)}


def score_domains(hyps: Sequence[str], refs: Sequence[str], domains: Sequence[str]) -> dict[str, dict]:
    """``score`` of the sentences of each domain (``domains[i]`` names sentence i's) and of all of
    them together (key ``"all"``: one corpus-level score, not a mean of the domains')."""
    if not len(hyps) == len(refs) == len(domains):
        raise ValueError(f"{len(hyps)} hypotheses, {len(refs)} references and {len(domains)} domain labels")
    out = {}
    for d in dict.fromkeys(domains):
        idx = [i for i, x in enumerate(domains) if x == d]
        out[d] = score([hyps[i] for i in idx], [refs[i] for i in idx])
    out["all"] = score(hyps, refs)
    return out


def score_models(models: dict[str, Any], splits: dict[str, Pairs], ids, labels: dict[str, list[str]], *,
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


@torch.no_grad()
def cross_attention_weights(model, src: list[int], tgt: list[int], *, bos_id: int = 1, layer: int = -1) -> torch.Tensor:
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
        model(torch.tensor([src]), torch.tensor([[bos_id] + tgt[:-1]]))
    finally:
        handle.remove()
    x, memory = seen["x"].float(), seen["memory"].float()
    B, Tq, _ = x.shape
    q = attn.q(x).view(B, Tq, attn.n_heads, attn.head_dim).transpose(1, 2)  # (1, H, T, K)
    k, _ = attn.memory_kv(memory)  # (1, G, S, K)
    k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
    return ((q @ k.transpose(-1, -2)) / math.sqrt(attn.head_dim)).softmax(dim=-1)[0]


def plot_attention(weights: torch.Tensor, src_tokens: list[str], tgt_tokens: list[str], path: Path, title: str) -> Path:
    """One heat map per head: target tokens down, source tokens across."""
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


def attention_picture(model, tok, src_text: str, decode: dict[str, Any], path: Path) -> Path:
    """``cross_attention.png``: every head of the last decoder layer over one sentence and its translation."""
    src = bpe.encode(tok, [src_text], eos=EOS)[0]
    hyp = decode_batches(model, [src], device=torch.device("cpu"), precision="fp32", pad_id=PAD_ID, bos_id=BOS_ID,
                         eos_id=EOS_ID, **decode)[0]
    weights = cross_attention_weights(model, src, hyp, bos_id=BOS_ID)
    names = lambda ids: [tok.id_to_token(i) for i in ids]  # noqa: E731
    n = len(model.decoder.blocks)
    return plot_attention(weights, names(src), names(hyp), path,
                          f"cross-attention, decoder layer {n} of {n}: {src_text!r} -> {bpe.decode(tok, [hyp], eos=EOS)[0]!r}")


def export_model_dir(model, tokenizer: str | Path, model_dir: Path, settings: dict[str, Any]) -> Path:
    """The folder :class:`Translator` loads: ``model.safetensors``,
    ``tokenizer.json`` and ``translate.json`` (languages, max_len, decoding settings)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    save_model(model, model_dir / "model.safetensors")
    shutil.copyfile(tokenizer, model_dir / "tokenizer.json")
    atomic_write_text(model_dir / "translate.json", json.dumps(settings, indent=2) + "\n")
    return model_dir


class Translator:
    """An exported model folder (``model.safetensors``, ``tokenizer.json``, ``translate.json``, as
    recipes/translate.py writes it) ready to translate lines of text::

        tr = Translator("runs/translate/model")
        tr(["The room faces north.", "Permission denied."])
    """

    def __init__(self, model_dir: str | Path, device: str = "cpu") -> None:
        model_dir = Path(model_dir)
        for name in ("model.safetensors", "tokenizer.json"):
            if not (model_dir / name).is_file():
                raise FileNotFoundError(f"no {name} in {model_dir}; export a model with recipes/translate.py first")
        settings = {}
        if (model_dir / "translate.json").is_file():
            try:
                settings = json.loads((model_dir / "translate.json").read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ValueError(f"{model_dir / 'translate.json'}: unreadable ({e}); export the model again") from None
            if not isinstance(settings, dict) or not isinstance(settings.get("decode", {}), dict):
                raise ValueError(f"{model_dir / 'translate.json'}: not the settings the recipe exports; export the model again")
        self.max_len = settings.get("max_len", 256)
        given = settings.get("decode", {})
        self.decode = {"beams": given.get("beams", 4), **{k: given[k] for k in DECODE_KEYS if k in given}}
        self.device = torch.device(device)
        self.model = load_model(model_dir / "model.safetensors", device=self.device).eval()
        self.tok = bpe.load_bpe(model_dir / "tokenizer.json", specials=SPECIALS)

    def __call__(self, lines: Sequence[str]) -> list[str]:
        """One translation a line; empty lines stay empty."""
        keep = [i for i, line in enumerate(lines) if line.strip()]
        src = bpe.encode(self.tok, [lines[i].strip() for i in keep], eos=EOS, max_len=self.max_len)
        out = [""] * len(lines)
        hyps = decode_batches(self.model, src, device=self.device, precision="fp32", **self.decode)
        for i, text in zip(keep, bpe.decode(self.tok, hyps, eos=EOS)):
            out[i] = text
        return out


def translate_stdin(argv: list[str], prog: str = "translate") -> int:
    """The command that translates stdin line by line with an exported model folder."""
    parser = argparse.ArgumentParser(prog=prog,
                                     description="translate stdin line by line with an exported model")
    parser.add_argument("--model", required=True, metavar="DIR", help="the exported folder (run.out_dir/model)")
    parser.add_argument("--beams", type=positive_int, default=None, help="beam size (default: the model's)")
    parser.add_argument("--batch", type=positive_int, default=1, metavar="N", help="lines translated together (default 1)")
    args = parser.parse_args(argv)
    try:
        tr = Translator(args.model)
    except (OSError, ValueError) as e:
        print(f"{parser.prog}: error: {one_line(e)}", file=sys.stderr)
        return 2
    if args.beams is not None:
        tr.decode["beams"] = args.beams
    buf: list[str] = []
    try:
        for line in stdin_lines(sys.stdin):
            buf.append(line)
            if len(buf) >= args.batch:
                print("\n".join(tr(buf)), flush=True)
                buf = []
    except DataError as e:  # what came before it is translated; the line is named
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    if buf:
        print("\n".join(tr(buf)), flush=True)
    return 0
