"""``zoo generate MODEL [PROMPT]``: text in, text out, with the model's own tokenizer.

The prompt is PROMPT or, without it, each line of stdin, one output line per prompt (an output's own
line breaks written as ``\\n``, a backslash as ``\\\\``). MODEL is a zoo file of a decoder, which
continues the prompt, or of an encoder-decoder, whose source the prompt is; its tokenizer, special
tokens and chat template are the files beside it (:class:`zoo.tokens.ModelTokenizer`, as ``zoo
convert`` copies them from an HF folder). Greedy and sampled text is written as it comes, each step
decoding the new tokens after a few of the prompt's (so that a token's leading space shows) and
holding back what may be the start of a stop string or an unfinished character; beam search writes
its best hypothesis at the end. The output ends at any of the model's eos tokens, before a ``--stop``
string, or after ``--max-new-tokens``; it is the continuation alone unless ``--echo``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import torch

__all__ = ["CONTEXT", "TextStream", "add_parser", "run"]

CONTEXT = 16  # prompt tokens decoded before the new ones, so that the first new token's leading space shows
SAMPLING = ("temperature", "top_k", "top_p", "seed")
BEAMS = ("length_norm", "alpha")


def add_parser(sub, positive_int, dtypes) -> argparse.ArgumentParser:
    text = "continue a prompt with a zoo decoder (or an encoder-decoder's output for it), with the model's own tokenizer"
    p = sub.add_parser("generate", help=text, description=text + (
        ". The prompt is PROMPT or, without it, each line of stdin, one output line per prompt (line breaks in an "
        "output written as \\n). The tokenizer, special tokens and chat template are the files beside MODEL "
        "(tokenizer.json, tokenizer_config.json, generation_config.json, as zoo convert copies them). Output ends "
        "at the model's eos tokens, before a --stop string, or after --max-new-tokens; greedy or sampled text is "
        "written as it comes."))
    p.add_argument("model", metavar="MODEL", help="a zoo .safetensors file of a decoder or an encoder-decoder")
    p.add_argument("prompt", nargs="?", default=None, metavar="PROMPT", help="the text to continue (default: each line of stdin)")
    p.add_argument("--max-new-tokens", type=positive_int, default=100, metavar="N", help="at most N new tokens (default 100)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--greedy", action="store_true", help="the most likely token at each step (the default)")
    how.add_argument("--sample", action="store_true", help="sample each token (--temperature, --top-k, --top-p, --seed)")
    how.add_argument("--beams", type=positive_int, default=None, metavar="K", help="beam search with K beams")
    p.add_argument("--temperature", type=float, default=None, metavar="T", help="divides the logits before sampling (default 1)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K likeliest tokens (default: all)")
    p.add_argument("--top-p", type=float, default=None, metavar="P",
                   help="sample among the likeliest tokens whose probabilities sum to P (default 1: all)")
    p.add_argument("--seed", type=int, default=None, metavar="N", help="seed of the sampling, for the same text again")
    p.add_argument("--length-norm", choices=("gnmt", "power", "none"), default=None,
                   help="what beam search divides a hypothesis's log-probability by (default gnmt: ((5 + |Y|) / 6)^alpha; "
                        "power: |Y|^alpha, HF's length_penalty)")
    p.add_argument("--alpha", type=float, default=None, metavar="A", help="the length norm's exponent (default 0.6)")
    p.add_argument("--stop", action="append", default=[], metavar="STR",
                   help="end the output before this text (repeatable)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the model's chat template as a user's message, as HF's apply_chat_template")
    p.add_argument("--echo", action="store_true", help="write the prompt (with --chat: as rendered) before its continuation")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="the model's tokenizer.json, or an HF folder with it (default: tokenizer.json next to MODEL)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (default auto: a GPU where there is one)")
    p.add_argument("--dtype", choices=dtypes, default=None, help="cast the weights (default: as stored)")
    return p


class TextStream:
    """The text of a prompt's new tokens, written as it grows (:meth:`push`), ended at an eos token or
    before the first of ``stops``; ``write`` receives each new piece, with line breaks escaped if ``escape``."""

    def __init__(self, tokenizer, prompt: Sequence[int], stops: Sequence[str], write: Callable[[str], None], *,
                 escape: bool = False) -> None:
        self.tok, self.write, self.escape = tokenizer, write, escape
        self.context = list(prompt[-CONTEXT:])
        self.base = tokenizer.decode(self.context)
        self.eos, self.stops = set(tokenizer.eos_ids), [s for s in stops if s]
        self.ids: list[int] = []
        self.shown = ""
        self.ended = False

    def text(self) -> tuple[str, bool]:
        """The new tokens' text, cut before the first stop string; whether one was found."""
        full = self.tok.decode(self.context + self.ids)
        text = full[len(self.base):] if full.startswith(self.base) else self.tok.decode(self.ids)
        cut = min((text.find(s) for s in self.stops if s in text), default=-1)
        return (text[:cut], True) if cut >= 0 else (text, False)

    def push(self, ids: Sequence[int]) -> bool:
        """Take new token ids and write what is settled; True once the text has ended."""
        for i in ids:
            if self.ended or i in self.eos:
                self.ended = True
                break
            self.ids.append(i)
        text, stopped = self.text()
        self.ended |= stopped
        if not self.ended:  # hold back an unfinished character and what may begin a stop string
            text = text.rstrip("\ufffd")
            held = max((n for s in self.stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
            text = text[:len(text) - held]
        self.show(text)
        return self.ended

    def finish(self) -> str:
        """Write the rest; the whole text."""
        text, _ = self.text()
        self.show(text)
        return text

    def show(self, text: str) -> None:
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.write(escaped(text[len(self.shown):]) if self.escape else text[len(self.shown):])
            self.shown = text


def escaped(text: str) -> str:
    """One line: backslashes doubled, line breaks as ``\\n`` and ``\\r``."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _check_options(args) -> None:
    given = [f"--{name.replace('_', '-')}" for name in SAMPLING if getattr(args, name) is not None]
    if given and not args.sample:
        raise ValueError(f"{', '.join(given)}: sampling options; add --sample (greedy decoding takes the likeliest token)")
    given = [f"--{name.replace('_', '-')}" for name in BEAMS if getattr(args, name) is not None]
    if given and not (args.beams or 1) > 1:
        raise ValueError(f"{', '.join(given)}: beam search options; add --beams K (K > 1)")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available here; use --device cpu (or auto)")
    return device


def _refusal(model, where: str) -> str:
    """How the model generates ("prompt" or "source"), or a one-line refusal."""
    from zoo.decoding import decodes_from

    try:
        how = decodes_from(model)
    except ValueError:
        raise ValueError(f"{where}: the {model.spec.family} family does not generate; zoo generate takes a decoder "
                         f"or an encoder-decoder") from None
    head = getattr(model.spec, "head", None)
    if getattr(head, "passes_hidden_states", False):
        raise ValueError(f"{where}: this decoder has no language-model head (head: {head.kind}); it gives hidden states "
                         f"(zoo embed), not tokens")
    return how


def _check_length(model, source: bool, tokens: int, new: int, where: str) -> None:
    """Refuse what the model's position tables cannot cover (rotary and relative positions cover any length)."""
    def limit(position) -> int | None:
        return getattr(position, "max_len", None)

    if source:
        src, tgt = limit(getattr(model, "src_position", None) or model.position), limit(model.position)
        if src is not None and tokens > src:
            raise ValueError(f"{where}: the prompt's {tokens} tokens are more than the model's {src} source positions")
        if tgt is not None and new + 1 > tgt:
            raise ValueError(f"--max-new-tokens {new} is more than the model's {tgt - 1} output positions allow")
    elif limit(model.position) is not None and tokens + new > limit(model.position):
        raise ValueError(f"{where}: the prompt's {tokens} tokens and --max-new-tokens {new} are more than the "
                         f"model's {limit(model.position)} positions; shorten the prompt or lower --max-new-tokens")


def run(args, dtypes) -> None:
    from zoo.build import build
    from zoo.data.common import stdin_lines
    from zoo.generate import generate
    from zoo.io import load, read_header, read_spec
    from zoo.tokens import ModelTokenizer, TokenizerError

    _check_options(args)
    header = read_header(args.model)
    spec = read_spec(header.path)
    meta = build(spec, device="meta")
    source = _refusal(meta, args.model) == "source"
    tok = ModelTokenizer.beside(header.path, args.tokenizer)
    tok.check_vocab(spec.vocab_size)
    if args.chat and tok.chat_template is None:
        raise TokenizerError(f"--chat: no chat template beside {tok.path} (no chat_template in tokenizer_config.json, "
                             f"no chat_template.jinja); prompt the model without --chat")
    start = (tok.decoder_start_id if tok.decoder_start_id is not None else tok.bos_id) if source else None
    if source and start is None:
        raise TokenizerError(f"{args.model}: an encoder-decoder starts its output with a token that generation_config.json "
                             f"names (decoder_start_token_id) or bos; there is neither beside {tok.path}")
    device = _device(args.device)
    model = load(header.path, device=device, dtype=dtypes[args.dtype] if args.dtype else None).eval()
    generator = torch.Generator(device).manual_seed(args.seed) if args.seed is not None else None
    prompts = [("PROMPT", args.prompt)] if args.prompt is not None else (
        (f"stdin:{n}", line) for n, line in enumerate(stdin_lines(sys.stdin), start=1))

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    for where, prompt in prompts:
        if not prompt.strip():
            raise ValueError(f"{where}: an empty prompt; give text to continue")
        text = tok.render_chat([{"role": "user", "content": prompt}]) if args.chat else prompt
        ids = tok.encode(text, add_special_tokens=not args.chat)  # a rendered chat holds its own special tokens
        if not ids:
            raise ValueError(f"{where}: {prompt!r} gives the tokenizer no token to continue")
        _check_length(meta, source, len(ids), args.max_new_tokens, where)
        escape = args.prompt is None
        if args.echo:
            write(escaped(text) if escape else text)
        stream = TextStream(tok, ids, args.stop, write, escape=escape)
        inputs = torch.tensor([ids], dtype=torch.long, device=device)
        common = {"max_new_tokens": args.max_new_tokens, "stop_tokens": tok.eos_ids, "bos_id": start}
        if (args.beams or 1) > 1:
            alpha = {} if args.alpha is None else {"alpha": args.alpha}
            out = generate(model, inputs, num_beams=args.beams, length_norm=args.length_norm or "gnmt", **alpha, **common)
            stream.push(out.tokens[0, :int(out.lengths[0])].tolist())
        else:
            generate(model, inputs, num_beams=1, do_sample=args.sample,
                     temperature=1.0 if args.temperature is None else args.temperature,
                     top_k=0 if args.top_k is None else args.top_k, top_p=1.0 if args.top_p is None else args.top_p,
                     generator=generator,
                     on_token=lambda t: stream.push([int(t[0])]), **common)
        stream.finish()
        write("\n")
