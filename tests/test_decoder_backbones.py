"""Decoder backbones: HF's headless ``*Model`` classes (``GPT2Model``, ``LlamaModel``, ...) against zoo
decoders with ``head: none``, whose forward returns the hidden states after the final norm (HF's
``last_hidden_state``).

For every decoder class with a backbone: a random-init ``*Model`` at odd sizes converts into zoo
with the same hidden states (fp32, padded or not), back to the same class by default with every
tensor equal, survives ``zoo.save``/``zoo.load``, and goes through ``zoo convert`` as a directory
whose ``config.json`` names the backbone. A backbone is the LM's model less its head, so the
backbone of a converted LM gives the LM's own ``model(...)`` output. Heads that do not fit are
refused by name.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import max_diff, positions, randomize
from torch import nn

import zoo
from zoo.cli import main
from zoo.interop import ConversionError, from_hf, hf_config, hf_spec, to_hf
from zoo.interop.claims import claims_family
from zoo.interop.hf import ARCHS

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
V = 101
ROTARY = {"vocab_size": V, "num_hidden_layers": 3, "max_position_embeddings": 64, "hidden_size": 48,
          "num_attention_heads": 6, "intermediate_size": 56, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None}
GQA = {**ROTARY, "num_key_value_heads": 2}

# (class prefix, config fields), in ARCHS's order: hidden 48, 3 layers, 6 heads (2 kv heads and head_dim 16 where the class
# has them; 3 experts, 2 per token, and dense layers where the class has them)
BACKBONES = {
    "GPT2": {"vocab_size": V, "n_positions": 64, "n_embd": 48, "n_layer": 3, "n_head": 6, "n_inner": 56, "bos_token_id": 0,
             "eos_token_id": 0},
    "Llama": {**GQA, "head_dim": 16, "attention_bias": True},
    "Mistral": {**GQA, "head_dim": 16, "sliding_window": 4},
    "Qwen2": {**GQA, "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
    "GPTNeoX": {**ROTARY, "rotary_pct": 0.5},
    "Olmo2": GQA,
    "Gemma": {**GQA, "head_dim": 16},
    "Qwen3": {**GQA, "head_dim": 16, "use_sliding_window": True, "sliding_window": 4,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
    "Phi3": {**GQA, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
             "sliding_window": 5},
    "Gemma2": {**GQA, "head_dim": 16, "sliding_window": 4, "attn_implementation": "eager"},
    "Gemma3Text": {**GQA, "head_dim": 16, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention",
                                                                          "sliding_attention"]},
    "Mixtral": {**GQA, "num_local_experts": 3, "num_experts_per_tok": 2, "sliding_window": 4},
    "Qwen2Moe": {**GQA, "num_experts": 3, "num_experts_per_tok": 2, "moe_intermediate_size": 20,
                 "shared_expert_intermediate_size": 24, "mlp_only_layers": [0]},
    "Qwen3Moe": {**GQA, "head_dim": 16, "num_experts": 3, "num_experts_per_tok": 2, "moe_intermediate_size": 20,
                 "decoder_sparse_step": 2},
    "Olmoe": {**GQA, "num_experts": 3, "num_experts_per_tok": 2},
    "StableLm": {**GQA, "partial_rotary_factor": 0.5, "use_qkv_bias": True, "use_parallel_residual": True},
}
HEADED = {"GPT2": "GPT2LMHeadModel", "Gemma3Text": "Gemma3ForCausalLM"}  # else <prefix>ForCausalLM


def headed(kind: str) -> str:
    return HEADED.get(kind, f"{kind}ForCausalLM")


def backbone(kind: str, cls: str = "Model") -> nn.Module:
    """``kind``'s backbone (``cls`` "Model"), or its class with the head (any other ``cls``)."""
    name = f"{kind}Model" if cls == "Model" else headed(kind)
    return randomize(getattr(transformers, name)(getattr(transformers, f"{kind}Config")(**BACKBONES[kind])))


def tokens(batch: int = 3, length: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def left_padding(batch: int = 3, length: int = 11) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, : length // 2], mask[2, : length - 2] = False, False
    return mask


def test_every_decoder_class_has_a_backbone_after_the_classes_with_heads():
    names = list(ARCHS)
    with_base = [a for a in ARCHS.values() if a.base is not None]  # BertForMaskedLM's too (tests/test_embed.py)
    decoders = [a for a in with_base if claims_family(a.claims, "decoder")]
    assert [a.name for a in decoders] == [headed(k) for k in BACKBONES]
    assert [a.base for a in decoders] == [f"{k}Model" for k in BACKBONES]
    assert names[-len(with_base):] == [a.base for a in with_base]


@pytest.mark.parametrize("kind", BACKBONES)
def test_backbone_converts_both_ways_saves_and_reads_its_config(kind, tmp_path):
    hf = backbone(kind)
    model = from_hf(hf)
    assert model.spec.head.kind == "none" and not hasattr(model.head, "weight")
    x, mask = tokens(), left_padding()
    with torch.no_grad():
        ref = hf(x).last_hidden_state
        assert max_diff(model(x), ref) < ATOL
        padded = hf(x, attention_mask=mask, position_ids=positions(mask)).last_hidden_state
        assert max_diff(model(x, mask), padded, mask) < ATOL
        back = to_hf(model).eval()  # by default: the backbone class
        assert type(back) is type(hf)
        assert max_diff(back(x).last_hidden_state, ref) < ATOL
    ref_state, back_state = hf.state_dict(), back.state_dict()
    assert ref_state.keys() == back_state.keys()
    assert all(torch.equal(t, back_state[name]) for name, t in ref_state.items())

    config = hf_config(model.spec)  # names the backbone, so hf_spec reads it without a head
    assert config.architectures == [f"{kind}Model"] and hf_spec(config) == model.spec
    zoo.save(model, tmp_path / "m.safetensors")
    loaded = zoo.load(tmp_path / "m.safetensors").eval()  # eval: GPT-2 has dropout
    assert loaded.spec == model.spec
    with torch.no_grad():
        assert torch.equal(loaded(x, mask), model(x, mask))


@pytest.mark.parametrize("kind", ["Qwen3", "GPT2"])
def test_an_lms_backbone_is_its_model(kind):
    """from_hf of the LM, its head dropped (head: none), converts to the backbone class, whose hidden
    states are the LM's ``model`` / ``transformer``'s; the LM itself still converts to the LM class."""
    lm = backbone(kind, "head")
    model = from_hf(lm)
    headless = zoo.build(zoo.load_spec(model.spec, ["head=none"]))
    headless.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("head.")})
    hf = to_hf(headless.eval())
    x = tokens()
    with torch.no_grad():
        assert type(hf).__name__ == f"{kind}Model"
        assert max_diff(hf(x).last_hidden_state, lm.base_model(x).last_hidden_state) < ATOL
        assert max_diff(headless(x), lm.base_model(x).last_hidden_state) < ATOL
    assert type(to_hf(model)) is type(lm)


def test_zoo_convert_reads_and_writes_a_backbone_directory(tmp_path, capsys):
    """An HF directory whose config.json names LlamaModel converts to a headless zoo file, and back."""
    hf = backbone("Llama")
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
    assert [r.split(":")[0].strip() for r in reasons] == [f"zoo -> {k}Model" for k in BACKBONES]
