"""What the translation recipe measures a model with: sacreBLEU and chrF, overall and per domain,
and a picture of the decoder's cross-attention."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Sequence

import torch

from zoo.data.bpe import decode, encode, load_bpe
from zoo.data.translation import EOS, SPECIALS, token_batches
from zoo.generate import generate
from zoo.io import load as load_model
from zoo.io import one_line
from zoo.train.optim import autocast

__all__ = ["DECODE_KEYS", "Translator", "cross_attention_weights", "decode_batches", "plot_attention", "score",
           "score_domains", "translate_stdin"]

DECODE_KEYS = ("length_penalty", "alpha", "max_len_a", "max_len_b", "batch_tokens")


@torch.no_grad()
def decode_batches(model, src: Sequence[Sequence[int]], *, beams: int = 4, length_penalty: str = "gnmt",
                   alpha: float = 0.6, max_len_a: float = 1.0, max_len_b: int = 50, batch_tokens: int = 4000,
                   device="cpu", precision: str = "auto", pad_id: int = 0, bos_id: int = 1, eos_id: int = 2) -> list[list[int]]:
    """Beam search (or greedy, ``beams=1``) over source token-id sequences with ``zoo.generate``, in
    batches of similar length holding about ``batch_tokens`` source tokens x beams; the outputs
    (without <s> and </s>) come back in input order."""
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
            gen = generate(model, x, padding_mask=x != pad_id, num_beams=beams, length_penalty=length_penalty,
                               alpha=alpha, max_len_a=max_len_a, max_len_b=max_len_b, eos_id=eos_id, bos_id=bos_id,
                               pad_id=pad_id)
        for row, i in enumerate(b):
            out[i] = gen.tokens[row, : int(gen.lengths[row])].tolist()
    return out


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
        settings = json.loads((model_dir / "translate.json").read_text()) if (model_dir / "translate.json").is_file() else {}
        self.max_len = settings.get("max_len", 256)
        given = settings.get("decode", {})
        self.decode = {"beams": given.get("beams", 4), **{k: given[k] for k in DECODE_KEYS if k in given}}
        self.device = torch.device(device)
        self.model = load_model(model_dir / "model.safetensors", device=self.device).eval()
        self.tok = load_bpe(model_dir / "tokenizer.json", specials=SPECIALS)

    def __call__(self, lines: Sequence[str]) -> list[str]:
        """One translation a line; empty lines stay empty."""
        keep = [i for i, line in enumerate(lines) if line.strip()]
        src = encode(self.tok, [lines[i].strip() for i in keep], eos=EOS, max_len=self.max_len)
        out = [""] * len(lines)
        hyps = decode_batches(self.model, src, device=self.device, precision="fp32", **self.decode)
        for i, text in zip(keep, decode(self.tok, hyps, eos=EOS)):
            out[i] = text
        return out


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


def translate_stdin(argv: list[str], prog: str = "translate") -> int:
    """The command that translates stdin line by line with an exported model folder."""
    parser = argparse.ArgumentParser(prog=prog,
                                     description="translate stdin line by line with an exported model")
    parser.add_argument("--model", required=True, metavar="DIR", help="the exported folder (run.out_dir/model)")
    parser.add_argument("--beams", type=int, default=None, help="beam size (default: the model's)")
    parser.add_argument("--batch", type=int, default=1, metavar="N", help="lines translated together (default 1)")
    args = parser.parse_args(argv)
    try:
        tr = Translator(args.model)
    except (OSError, ValueError) as e:
        print(f"{parser.prog}: error: {one_line(e)}", file=sys.stderr)
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
