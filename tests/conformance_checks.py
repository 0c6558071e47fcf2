"""What the conformance suite (tests/test_conformance.py) runs on each class: inputs at odd sizes, the
reference's and zoo's forward on them (padded right and left where the class takes a mask), the two
directions of conversion, and the settings that make HF's ``generate`` decode as ``zoo.generate``
(tests/test_beam_hf.py explains the beam search ones)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_greedy_equals_hf, max_diff, positions
from conformance_table import TIMM_CONFIGS, V, timm_class

import zoo
from zoo.interop import from_hf, from_timm, hf_config, hf_spec, to_hf, to_timm
from zoo.interop.hf import by_model_type

ATOL = 1e-4
LENGTH, PROMPT, NEW = 9, 5, 6  # forward passes; prompts and the tokens decoded after them (past the windows of 5)
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
FROM_IDS = ("roberta", "xlm-roberta", "mpnet")  # HF numbers these positions from the ids (fairseq's, past the padding id)


def is_timm(name: str) -> bool:
    return name in TIMM_CONFIGS


def to_zoo(ref: torch.nn.Module) -> torch.nn.Module:
    return (from_timm if type(ref).__name__ in TIMM_CONFIGS else from_hf)(ref).eval()


def to_reference(model: torch.nn.Module, name: str, ref: torch.nn.Module) -> torch.nn.Module:
    """``model`` converted to class ``name``, with ``ref``'s token ids (which the spec does not decide)
    and attention implementation."""
    if is_timm(name):
        return to_timm(model, timm_class(name)).eval()
    ids = {k: getattr(ref.config, k) for k in TOKEN_IDS if getattr(ref.config, k, None) is not None}
    back = to_hf(model, name, **ids).eval()
    back.config._attn_implementation = ref.config._attn_implementation  # Gemma 2 soft-caps only in eager
    return back


def same_state(ref: torch.nn.Module, back: torch.nn.Module) -> list[str]:
    """The tensors of ``ref``'s state dict that ``back``'s lacks or holds otherwise (exact)."""
    theirs = back.state_dict()
    return sorted(set(ref.state_dict()) ^ set(theirs)) + [
        k for k, t in ref.state_dict().items() if k in theirs and not torch.equal(t, theirs[k])]


def tokens(batch: int, length: int, seed: int, low: int = 3) -> torch.Tensor:
    """Tokens from ``low`` up, so that none is a padding or special id of the table's configs."""
    return torch.randint(low, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def mask(side: str | None, batch: int = 3, length: int = LENGTH) -> torch.Tensor | None:
    """True at real tokens: row 0 whole, row 1 three short, row 2 two real tokens; padded on ``side``."""
    if side is None:
        return None
    m = torch.ones(batch, length, dtype=torch.bool)
    m[1, length - 3:], m[2, 2:] = False, False
    return m if side == "right" else m.flip(1)


def sides(family: str) -> list[str | None]:
    """Unpadded, then the paddings the family takes: decoders and encoders both sides; an
    encoder-decoder's source and target right-padded (zoo's encoder-decoders number positions from the
    start of each row, as BART, Marian and T5 do); a ViT none."""
    return {"decoder": [None, "right", "left"], "encoder": [None, "right", "left"],
            "encoder_decoder": [None, "right"], "vit": [None]}[family]


def inputs(ref: torch.nn.Module, family: str, side: str | None) -> tuple[tuple, dict, torch.Tensor | None]:
    """(zoo's positional inputs, the reference's keyword inputs, the real positions of the output); with
    segment ids where the class has several."""
    if family == "vit":
        size = TIMM_CONFIGS[type(ref).__name__]["img_size"]
        images = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
        return (images,), {"x": images}, None
    m = mask(side)
    pad = getattr(ref.config, "pad_token_id", None) or 0
    x = tokens(3, LENGTH, seed=1)
    if family == "encoder_decoder":
        tgt, tgt_mask = tokens(3, LENGTH - 2, seed=2), mask(side, length=LENGTH - 2)
        kw = {"input_ids": x, "decoder_input_ids": tgt}
        if m is not None:
            kw |= {"attention_mask": m.long(), "decoder_attention_mask": tgt_mask.long()}
        return (x, tgt, m, tgt_mask), kw, tgt_mask
    if m is None:
        return (x,), {"input_ids": x}, None
    x = x.masked_fill(~m, pad)  # padding ids where HF reads them (RoBERTa's positions)
    kw = {"input_ids": x, "attention_mask": m.long()}
    if ref.config.model_type not in FROM_IDS:
        kw["position_ids"] = positions(m)
    if getattr(ref.config, "type_vocab_size", 1) > 1:  # BERT's segments
        kw["token_type_ids"] = torch.randint(0, ref.config.type_vocab_size, x.shape, generator=torch.Generator().manual_seed(2))
        return (x, m, kw["token_type_ids"]), kw, m
    return (x, m), kw, m


def output(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def forward(model: torch.nn.Module, args: tuple | dict) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(args, dict):
            return output(model(**args) if "x" not in args else model(args["x"]))
        return output(model(*args))


def classifies(model: torch.nn.Module) -> bool:
    """Whether a zoo model has a classifier (HF's ``*ForSequenceClassification``): its output is
    ``model.classify``'s logits [B, num_labels], one row a sequence, not the hidden states."""
    return getattr(model.spec, "classifier", None) is not None


def zoo_output(model: torch.nn.Module, args: tuple) -> torch.Tensor:
    """What a zoo model gives for the reference's logits: its classifier's, else its forward's."""
    if not classifies(model):
        return forward(model, args)
    with torch.no_grad():
        return model.classify(*args)


# ------------------------------------------------------------------------------------------ generation
def hf_start(ref: torch.nn.Module) -> int:
    """The first decoder token of an encoder-decoder (BART's and mBART's eos, Marian's and T5's pad)."""
    for start in (getattr(ref.config, "decoder_start_token_id", None), ref.generation_config.decoder_start_token_id,
                  ref.config.eos_token_id):
        if start is not None:
            return start
    raise AssertionError(f"{type(ref).__name__} names no decoder start token")


def hf_generate(ref: torch.nn.Module, family: str, prompt: torch.Tensor, m: torch.Tensor | None, *, beams: int,
                eos: int | None = None, penalty: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF's ``generate`` set to zoo's plain decoding: (the new tokens, the beam scores or None)."""
    kw = dict(attention_mask=(torch.ones_like(prompt) if m is None else m).long(), num_beams=beams, do_sample=False,
              max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    if beams > 1:
        kw |= dict(length_penalty=penalty, early_stopping="never", num_return_sequences=1)
    if family == "encoder_decoder":
        kw |= dict(decoder_start_token_id=hf_start(ref), forced_bos_token_id=None, forced_eos_token_id=None)
    ref.generation_config.eos_token_id = eos  # or HF stops at the config's own
    out = ref.generate(prompt, **kw)
    skip = 1 if family == "encoder_decoder" else prompt.shape[1]  # after the start token, after the prompt
    return out.sequences[:, skip:], getattr(out, "sequences_scores", None)


def zoo_generate(model: torch.nn.Module, ref: torch.nn.Module, prompt: torch.Tensor, m: torch.Tensor | None, **kw):
    if model.spec.family == "encoder_decoder":
        kw["bos_id"] = hf_start(ref)
    return zoo.generate(model, prompt, padding_mask=m, max_new_tokens=NEW, **kw)


def rows(tokens: torch.Tensor, eos: int | None) -> list[list[int]]:
    """Each row's tokens up to its eos (HF fills after it with pad or eos, zoo with pad_id)."""
    return [row[: row.index(eos) + 1] if eos is not None and eos in row else row for row in tokens.tolist()]


# ------------------------------------------------------------------------------------------ the checks
def check_round_trip(ref: torch.nn.Module, name: str | None = None, unread: tuple[str, ...] = ()) -> None:
    """reference -> zoo -> reference (class ``name``, default the reference's) gives back every tensor of
    ``ref``'s state dict, bit for bit (``unread``: tensors HF keeps that no forward pass reads)."""
    name = name or type(ref).__name__
    back = to_reference(to_zoo(ref), name, ref)
    assert type(back) is type(ref)
    assert [k for k in same_state(ref, back) if k not in unread] == []


def check_outputs(ref: torch.nn.Module, name: str | None = None) -> torch.nn.Module:
    """The converted zoo model, and the reference converted back from it, give ``ref``'s outputs at real
    tokens, unpadded and padded on each side the family takes; returns the zoo model."""
    name = name or type(ref).__name__
    model = to_zoo(ref)
    back = to_reference(model, name, ref)
    fam = model.spec.family
    for side in sides(fam):
        ours, theirs, real = inputs(ref, fam, side)
        expected = forward(ref, theirs)
        assert expected.abs().max() > 0.1  # not a degenerate output
        if classifies(model) and side == "left" and model.spec.classifier.pool == "cls":  # the first slot padding
            with pytest.raises(ValueError, match="padding_mask: the classifier pools the first token"):
                zoo_output(model, ours)
            assert max_diff(forward(back, theirs), expected) < ATOL, f"zoo -> {name}, padding {side}"
            continue
        out = zoo_output(model, ours)
        real = None if classifies(model) else real  # a classifier's logits are per sequence
        assert max_diff(out, expected, real) < ATOL, f"{name} -> zoo, padding {side}"
        assert max_diff(forward(back, theirs), out, real) < ATOL, f"zoo -> {name}, padding {side}"
    if getattr(model, "pooler", None) is not None:  # BERT's and RoBERTa's backbones with their pooler
        x = tokens(3, 7, seed=1)
        with torch.no_grad():
            assert max_diff(model.pool(x), ref(x).pooler_output) < ATOL
    if getattr(model, "pooling", None) is not None:  # text towers: their pooled (and projected) output
        check_pooled(model, ref, back)
    return model


def pooled(out) -> torch.Tensor:
    """A text tower's pooled output: ``text_embeds`` (CLIP's with its projection), else ``pooler_output``."""
    return out.text_embeds if getattr(out, "text_embeds", None) is not None else out.pooler_output


def check_pooled(model: torch.nn.Module, ref: torch.nn.Module, back: torch.nn.Module) -> None:
    """``model.pool`` gives the reference's pooled output, and so does ``back`` (converted from ``model``),
    unpadded and padded each side, with an end-of-text token (where the pool looks for one) at each
    row's last real token; a pool that would read a padding token refuses by name."""
    token = getattr(model.spec.pool, "token", None)
    for side in sides(model.spec.family):
        ours, theirs, real = inputs(ref, model.spec.family, side)
        x = ours[0].clone()
        if token is not None:
            last = (torch.arange(x.shape[1]) * (real if real is not None else torch.ones_like(x, dtype=torch.bool))).argmax(1)
            x[torch.arange(x.shape[0]), last] = token
        theirs = {**theirs, "input_ids": x}
        with torch.no_grad():
            expected = pooled(ref(**theirs))
            assert expected.abs().max() > 0.1
            try:
                out = model.pool(x, *ours[1:])
            except ValueError as e:  # the last slot is padding: HF's state there is not zoo's
                assert side == "right" and "padding_mask: pool last" in str(e), e
                continue
            assert max_diff(out, expected) < ATOL, f"{type(ref).__name__} -> zoo pooled, padding {side}"
            assert max_diff(pooled(back(**theirs)), out) < ATOL, f"zoo -> {type(ref).__name__} pooled, padding {side}"


def check_config(ref: torch.nn.Module, default: str | None = None) -> None:
    """The config zoo writes for the class names it and reads back as the converted model's spec, as
    ``ref``'s own config does where it names the class, and ``to_hf`` picks class ``default`` (the
    reference's own where None) when none is named. A config alone cannot say what only the tensors
    do: a logits bias (BART's, Marian's), a pooler (a backbone reads as having HF's default)."""
    name = type(ref).__name__
    model = to_zoo(ref)

    def spec(s):
        data = s.model_dump(mode="json", exclude={"pooler"})
        data["head"].pop("bias", None)
        return data

    written = hf_config(model.spec, name)
    assert written.architectures == [name]
    assert spec(hf_spec(written)) == spec(model.spec)
    if by_model_type(ref.config.model_type, ref.config.architectures).name == name:  # the config names the class
        assert spec(hf_spec(ref.config)) == spec(model.spec)
    assert type(to_hf(model)).__name__ == (default or name)


def check_greedy(ref: torch.nn.Module) -> None:
    """zoo's cached greedy decoding gives HF's ``generate(do_sample=False)`` tokens past the windows, for
    prompts unpadded and padded (decoders on the left, encoder-decoders' sources on the right)."""
    model = to_zoo(ref)
    fam = model.spec.family
    if fam == "decoder":
        prompt = tokens(3, PROMPT, seed=3)
        for m in (None, mask("left", length=PROMPT)):
            assert_greedy_equals_hf(model, ref, prompt, m, NEW)
        return
    src = tokens(3, PROMPT + 2, seed=3)
    for m in (None, mask("right", length=PROMPT + 2)):
        theirs, _ = hf_generate(ref, fam, src, m, beams=1)
        ours = zoo_generate(model, ref, src, m, num_beams=1)
        assert theirs.shape == (3, NEW) and torch.equal(ours.tokens, theirs)
        assert max(len(set(row)) for row in theirs.tolist()) > 1  # not one token repeated
