"""Beam search through the KV cache equals HF's ``generate(num_beams=4, do_sample=False)`` for decoders
with scaled rope, soft-caps and a rope per layer type, under each length penalty: random-init HF
``LlamaForCausalLM`` (llama3 scaling), ``Gemma2ForCausalLM`` (eager, soft-caps, alternating windows)
and ``Gemma3ForCausalLM`` (five local layers per global one, the global ones with linear scaling 8),
each converted by ``from_hf``. A batch of 2 (one row left-padded), 12 new tokens past the window of 4.
tests/test_conformance.py compares beam search on every class that generates, with these settings.

How HF is configured to zoo's beam search (tests compare sequences and scores, not weakened):

- length penalty: zoo's ``length_norm="power"`` with ``alpha`` is HF's ``length_penalty=alpha``
  (score / |Y|^alpha, |Y| the generated tokens with the stop token); zoo's ``"none"`` is HF's
  ``length_penalty=0.0``. zoo's default ``"gnmt"`` has no HF counterpart.
- stopping: zoo stops a sentence when no live beam can beat its best finished hypothesis, each live
  beam bounded by its score / lp(max length). That is HF's ``early_stopping="never"`` bound (HF's
  default ``False`` bounds by the current length, ``True`` stops at K finished hypotheses; both can
  return other sequences). HF keeps K finished hypotheses and zoo the best one only; with the same
  bound the best is the same.
- where a stop token finishes a hypothesis: HF only among the K best of a step's 2K candidates, zoo
  by default among all 2K (tensor2tensor's rule, the paper's code). HF has no setting for this, so
  zoo has one: ``finish_from="beams"`` is HF's rule, used here wherever there is an eos. The last
  test shows the two rules part on one of these models, the default finding the better hypothesis.
"""

from __future__ import annotations

import pytest
import torch
from conftest import randomize
from torch import nn

import zoo
from zoo.interop import from_hf

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
V, WINDOW, NEW = 61, 4, 12
S, F = "sliding_attention", "full_attention"

CASES = {  # (HF class, config fields): tiny, odd sizes; every window 4 < prompt 5 + 12 new tokens
    "llama, llama3 scaling past its original 8": ("Llama", {
        "hidden_size": 36, "num_attention_heads": 3, "num_key_value_heads": 1, "intermediate_size": 40,
        "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8, "rope_theta": 10000.0}}),
    "gemma2, eager, caps, alternating windows": ("Gemma2", {
        "hidden_size": 48, "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 40,
        "sliding_window": WINDOW, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 3.0,
        "final_logit_softcapping": 2.5, "attn_implementation": "eager"}),
    "gemma3, 5 local per global, linear 8 on the global": ("Gemma3Text", {
        "hidden_size": 48, "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 40,
        "num_hidden_layers": 6, "sliding_window": WINDOW, "query_pre_attn_scalar": 24, "attn_implementation": "eager",
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
}
PENALTIES = {"power, alpha 1 (HF's default)": ("power", 1.0, 1.0), "none": ("none", 0.0, 0.0),
             "power, alpha 0.6": ("power", 0.6, 0.6)}


def reference(kind: str, seed: int = 0, **kw) -> nn.Module:
    kw = {"vocab_size": V, "num_hidden_layers": 2, "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": None,
          "pad_token_id": None, **kw}
    model_class = "Gemma3ForCausalLM" if kind == "Gemma3Text" else f"{kind}ForCausalLM"
    return randomize(getattr(transformers, model_class)(getattr(transformers, f"{kind}Config")(**kw)), seed)


def prompt(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 5 tokens, the second left-padded to 3."""
    x = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, :2] = False
    return x, mask


def hf_beams(hf: nn.Module, x: torch.Tensor, mask: torch.Tensor, eos: int | None, penalty: float):
    """HF's beam search set to zoo's: (new tokens [B, <= NEW], scores [B])."""
    out = hf.generate(x, attention_mask=mask.long(), num_beams=4, do_sample=False, max_new_tokens=NEW, eos_token_id=eos,
                      pad_token_id=0, length_penalty=penalty, early_stopping="never", num_return_sequences=1,
                      return_dict_in_generate=True, output_scores=True)
    return out.sequences[:, x.shape[1]:], out.sequences_scores


def rows(tokens: torch.Tensor, eos: int | None) -> list[list[int]]:
    """Each row's tokens up to its eos (HF fills after it with pad or eos, zoo with pad_id)."""
    out = []
    for row in tokens.tolist():
        out.append(row[: row.index(eos) + 1] if eos is not None and eos in row else row)
    return out


@pytest.mark.parametrize("case", CASES)
def test_beam_search_equals_hf_past_the_window_with_and_without_eos(case):
    """Without eos every hypothesis runs to 12 new tokens (past the window) and the best at the end
    wins, whatever the length penalty: zoo's default rules give HF's sequences and scores. Then eos
    is a token HF's beams produce (the fourth of row 0), so hypotheses finish at different lengths
    and the length penalty and stopping rule decide: for each penalty, zoo with finish_from="beams"
    gives HF's sequences and scores, and a stopped hypothesis wins in some row (at alpha 1 the
    Gemmas' long runs of one repeated token beat every stopped one, in both)."""
    kind, kw = CASES[case]
    hf = reference(kind, **kw)
    model = from_hf(hf)
    x, mask = prompt()
    theirs, their_scores = hf_beams(hf, x, mask, None, 1.0)
    ours = zoo.generate(model, x, padding_mask=mask, num_beams=4, max_new_tokens=NEW, length_norm="power", alpha=1.0)
    assert theirs.shape == (2, NEW) and torch.equal(ours.tokens, theirs)
    torch.testing.assert_close(ours.scores, their_scores, atol=1e-4, rtol=1e-5)

    eos, stopped = int(theirs[0, 3]), []
    for name, (kind_, alpha, penalty) in PENALTIES.items():
        theirs, their_scores = hf_beams(hf, x, mask, eos, penalty)
        ours = zoo.generate(model, x, padding_mask=mask, num_beams=4, max_new_tokens=NEW, eos_id=eos,
                            length_norm=kind_, alpha=alpha, finish_from="beams")
        assert rows(ours.tokens, eos) == rows(theirs, eos), f"length penalty {name}, eos {eos}"
        torch.testing.assert_close(ours.scores, their_scores, atol=1e-4, rtol=1e-5, msg=f"length penalty {name}")
        stopped += [row[-1] == eos for row in rows(theirs, eos)]
    assert any(stopped)


def test_the_default_finish_rule_parts_from_hfs_and_finds_the_better_hypothesis():
    """Gemma 2 (seed 2, no length penalty, eos 56): at the first step eos is the 6th best of the 8
    candidates. zoo's default (a stop among the 2K candidates finishes, tensor2tensor's) keeps [56]
    (log-probability -2.96); HF finishes only among the 4 best, so it never sees [56] and returns
    [28, 40, 40, 56] (-10.43). finish_from="beams" returns HF's; the default a higher score."""
    kind, kw = CASES["gemma2, eager, caps, alternating windows"]
    hf = reference(kind, seed=2, **kw)
    model = from_hf(hf)
    x, mask = prompt(seed=5)
    eos = 56
    with torch.no_grad():
        first = hf(x[:1]).logits[0, -1].log_softmax(-1)
    assert int((first > first[eos]).sum()) == 5  # ranked 6th: among the 2K = 8, not among the K = 4
    theirs, their_scores = hf_beams(hf, x, mask, eos, 0.0)
    hf_rule = zoo.generate(model, x, padding_mask=mask, num_beams=4, max_new_tokens=NEW, eos_id=eos, length_norm="none",
                           finish_from="beams")
    default = zoo.generate(model, x, padding_mask=mask, num_beams=4, max_new_tokens=NEW, eos_id=eos, length_norm="none")
    assert rows(hf_rule.tokens, eos) == rows(theirs, eos) and rows(theirs, eos)[0] == [28, 40, 40, 56]
    torch.testing.assert_close(hf_rule.scores, their_scores, atol=1e-4, rtol=1e-5)
    assert rows(default.tokens, eos)[0] == [eos]
    assert float(default.scores[0]) == pytest.approx(float(first[eos]), abs=1e-4)
    assert (default.scores > hf_rule.scores + 1.0).all()


def test_finish_from_is_checked():
    model = zoo.build({"family": "decoder", "vocab_size": V, "d_model": 16, "n_layers": 1, "max_seq_len": 16,
                       "block": {"attention": {"kind": "mha", "n_heads": 2}}}, seed=0)
    with pytest.raises(ValueError, match="finish_from must be 'candidates' .* or 'beams'.*got 'top'"):
        zoo.generate(model, torch.zeros(1, 2, dtype=torch.long), num_beams=2, max_new_tokens=2, finish_from="top")
