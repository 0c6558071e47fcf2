"""Backbones: HF's headless ``*Model`` classes (``GPT2Model``, ``LlamaModel``, ..., ``BertModel``) against
zoo models with ``head: none``, whose forward returns the hidden states after the final norm (HF's
``last_hidden_state``). tests/test_conformance.py converts each one both ways, padded or not, through
zoo files and streamed folders; here what is particular to backbones: where they sit in the registry,
that the backbone of a converted LM is its ``model``, that a directory naming one converts by default
to one, and that heads which do not fit are refused by name.
"""

from __future__ import annotations

import json

import pytest
import torch
from conformance_table import BACKBONE_OF, V, reference
from conformance_table import hf_config as table_config
from conftest import max_diff

import zoo
from zoo.cli import main
from zoo.interop import ConversionError, from_hf, hf_spec, to_hf
from zoo.interop.claims import claims_family
from zoo.interop.hf import ARCHS

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
DECODER_BACKBONES = [b for b in ARCHS if b in BACKBONE_OF and hf_spec(table_config(b)).family == "decoder"]  # in to_hf's order


def tokens(batch: int = 3, length: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_every_decoder_class_has_a_backbone_after_the_classes_with_heads():
    names = list(ARCHS)
    with_base = [a for a in ARCHS.values() if a.base is not None]
    assert {a.base: a.name for a in with_base} == BACKBONE_OF  # each backbone is its LM's
    decoders = [a for a in ARCHS.values() if claims_family(a.claims, "decoder") and a.name not in BACKBONE_OF]
    assert all(a.base is not None for a in decoders)
    assert names[-len(with_base):] == [a.base for a in with_base]


@pytest.mark.parametrize("lm_class", ["Qwen3ForCausalLM", "GPT2LMHeadModel"])
def test_an_lms_backbone_is_its_model(lm_class):
    """from_hf of the LM, its head dropped (head: none), converts to the backbone class, whose hidden
    states are the LM's ``model`` / ``transformer``'s; the LM itself still converts to the LM class."""
    lm = reference(lm_class)
    model = from_hf(lm)
    headless = zoo.build(zoo.load_spec(model.spec, ["head=none"]))
    headless.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("head.")})
    hf = to_hf(headless.eval())
    x = tokens()
    with torch.no_grad():
        assert type(hf).__name__ == ARCHS[lm_class].base
        assert max_diff(hf(x).last_hidden_state, lm.base_model(x).last_hidden_state) < ATOL
        assert max_diff(headless(x), lm.base_model(x).last_hidden_state) < ATOL
    assert type(to_hf(model)) is type(lm)


def test_zoo_convert_reads_and_writes_a_backbone_directory(tmp_path, capsys):
    """An HF directory whose config.json names LlamaModel converts to a headless zoo file, and back
    without naming the class."""
    hf = reference("LlamaModel")
    hf.save_pretrained(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["LlamaModel"]
    assert main(["convert", str(tmp_path / "hf"), "-o", str(tmp_path / "m.safetensors")]) == 0
    assert "LlamaModel" in capsys.readouterr().out
    model = zoo.load(tmp_path / "m.safetensors").eval()
    assert model.spec.head.kind == "none"
    assert main(["convert", str(tmp_path / "m.safetensors"), "-o", str(tmp_path / "back")]) == 0
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == ["LlamaModel"]
    back = transformers.LlamaModel.from_pretrained(tmp_path / "back", local_files_only=True).eval()
    x = tokens()
    with torch.no_grad():
        ref = hf(x).last_hidden_state
        assert max_diff(model(x), ref) < ATOL and max_diff(back(x).last_hidden_state, ref) < ATOL


def test_heads_that_do_not_fit_are_refused_by_name():
    lm = zoo.build("llama-tiny", [f"vocab_size={V}", "n_layers=1"], device="meta")
    with pytest.raises(ConversionError, match="zoo -> LlamaModel: head.kind='lm' is not supported: LlamaModel is "
                                              "LlamaForCausalLM's backbone without a head"):
        to_hf(lm, "LlamaModel")
    headless = zoo.build("llama-tiny", [f"vocab_size={V}", "n_layers=1", "head=none"], device="meta")
    with pytest.raises(ConversionError, match="zoo -> GPT2LMHeadModel: head.kind='none' is not supported: GPT2LMHeadModel "
                                              "has an LM head; a decoder without one converts to GPT2Model"):
        to_hf(headless, "GPT2LMHeadModel")
    with pytest.raises(ConversionError, match="zoo -> GPT2Model: block.attention.bias=False is not supported"):
        to_hf(headless, "GPT2Model")
    relu = zoo.build("llama-tiny", [f"vocab_size={V}", "n_layers=1", "head=none", "block.ffn.kind=relu"], device="meta")
    with pytest.raises(ConversionError, match="no HF architecture expresses this decoder") as refused:
        to_hf(relu)  # the reasons are the backbones'
    reasons = str(refused.value).splitlines()[1:]
    assert [r.split(":")[0].strip() for r in reasons] == [f"zoo -> {b}" for b in DECODER_BACKBONES]
