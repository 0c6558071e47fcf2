"""Encoders people download, against HF at random init: RoBERTa and XLM-R (fairseq's positions past
the padding index), with their backbones with and without the pooler; DistilBERT (no segments, a
stored sinusoid table read as a learned one) and its backbone; ModernBERT (local layers that see
2 tokens each way with a rope base of their own between global ones, in 11-token rows) and its
backbone, with and without biases; ELECTRA (factorised embeddings, or none where they are as wide
as the layers) and ALBERT (factorised embeddings, one block applied at every layer) and their
backbones; MPNet's backbone (a relative bias beside fairseq's positions); and the refusals of what
they have that zoo does not compute.

Each class in a variant beside the conformance table's config of it (d_model 36, 3 heads, 2 layers,
vocabulary 89: XLM-R untied, its backbone without the pooler, DistilBERT with sinusoids, ModernBERT's
backbone with biases) goes through the conformance suite's checks; a saved HF directory goes through
``zoo convert`` both ways. The presets of the releases have the parameter counts of the HF classes
built from the released configs (meta device) and write back the same configs; their tiny variants
convert to HF with the same logits.
"""

from __future__ import annotations

import pytest
import torch
from conformance_checks import check_config, check_outputs, check_round_trip
from conftest import max_diff, randomize

import zoo
from zoo.cli import main
from zoo.interop import ConversionError, from_hf, hf_config, hf_spec, to_hf

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
V = 89
PAD = 1  # the padding token's id in every config here; real tokens are drawn from 3..V-1

ROBERTA = dict(vocab_size=V, hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50,
               max_position_embeddings=16, type_vocab_size=1, pad_token_id=PAD, layer_norm_eps=1e-5)
DISTILBERT = dict(vocab_size=V, dim=36, n_heads=3, n_layers=2, hidden_dim=50, max_position_embeddings=16, pad_token_id=PAD)
MODERNBERT = dict(vocab_size=V, hidden_size=36, num_hidden_layers=3, num_attention_heads=3, intermediate_size=40,
                  max_position_embeddings=32, local_attention=4, global_attn_every_n_layers=2, global_rope_theta=1000.0,
                  local_rope_theta=50.0, pad_token_id=PAD, bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2)
# (config class, its fields, constructor arguments, whether HF numbers positions from the ids itself)
CLASSES = {
    "RobertaForMaskedLM": ("RobertaConfig", ROBERTA, {}, True),
    "XLMRobertaForMaskedLM": ("XLMRobertaConfig", {**ROBERTA, "pad_token_id": 2, "type_vocab_size": 2,
                                                   "tie_word_embeddings": False}, {}, True),
    "RobertaModel": ("RobertaConfig", ROBERTA, {"add_pooling_layer": True}, True),
    "XLMRobertaModel": ("XLMRobertaConfig", ROBERTA, {"add_pooling_layer": False}, True),
    "DistilBertForMaskedLM": ("DistilBertConfig", {**DISTILBERT, "sinusoidal_pos_embds": True}, {}, False),
    "DistilBertModel": ("DistilBertConfig", DISTILBERT, {}, False),
    "ModernBertForMaskedLM": ("ModernBertConfig", {**MODERNBERT, "attn_implementation": "eager"}, {}, False),
    "ModernBertModel": ("ModernBertConfig", {**MODERNBERT, "attention_bias": True, "mlp_bias": True, "norm_bias": True,
                                             "attn_implementation": "sdpa"}, {}, False),
}
ALBERT = dict(vocab_size=V, embedding_size=20, hidden_size=36, num_hidden_layers=3, num_attention_heads=3,
              intermediate_size=50, max_position_embeddings=16, pad_token_id=PAD)
CLASSES |= {  # ELECTRA with embeddings as wide as the layers (no projection); ALBERT's one block applied 3 times
    "ElectraModel": ("ElectraConfig", dict(ROBERTA, embedding_size=36, hidden_act="relu", type_vocab_size=2), {}, False),
    "AlbertForMaskedLM": ("AlbertConfig", {**ALBERT, "hidden_act": "gelu"}, {}, False),
    "AlbertModel": ("AlbertConfig", ALBERT, {"add_pooling_layer": True}, False),
    "MPNetModel": ("MPNetConfig", {k: v for k, v in ROBERTA.items() if k != "type_vocab_size"}, {"add_pooling_layer": True},
                   True),
}


UNTIED_UNREAD = {"XLMRobertaForMaskedLM": ("lm_head.bias",)}  # HF keeps it and reads the decoder's bias
DEFAULT_CLASS = {"XLMRobertaForMaskedLM": "RobertaForMaskedLM", "XLMRobertaModel": "RobertaModel"}  # the same computation


def reference(name: str) -> torch.nn.Module:
    config, fields, kwargs, _ = CLASSES[name]
    return randomize(getattr(transformers, name)(getattr(transformers, config)(**fields), **kwargs))


def batch(pad: int, length: int = 11) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Tokens [3, length] without the padding id, and masks: row 1 right-padded, row 2 left-padded."""
    x = torch.randint(3, V, (3, length), generator=torch.Generator().manual_seed(1))
    right = torch.ones(3, length, dtype=torch.bool)
    right[1, length - 4:], right[2, 3:] = False, False
    left = right.flip(1)
    return x, {"right": right, "left": left}


def output(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


# the variants beside the conformance table's config of each class
VARIANTS = ["XLMRobertaForMaskedLM", "XLMRobertaModel", "DistilBertForMaskedLM", "ModernBertModel", "ElectraModel",
            "AlbertForMaskedLM", "AlbertModel", "MPNetModel"]


@pytest.mark.parametrize("name", VARIANTS)
def test_encoder_variant_converts_both_ways(name):
    """The conformance suite's checks (tests/conformance_checks.py): the same outputs both ways,
    unpadded and padded on either side (the padding ids where RoBERTa's positions read them); every
    tensor back to the class named; the config read and written, and the class ``to_hf`` picks."""
    hf = reference(name)
    check_outputs(hf)
    unread = UNTIED_UNREAD.get(name, ()) if not hf.config.tie_word_embeddings else ()  # tied to the decoder's bias only when tied
    check_round_trip(hf, unread=unread)
    check_config(hf, DEFAULT_CLASS.get(name))


@pytest.mark.parametrize("field, value", [("inner_group_num", 2), ("hidden_dropout_prob", 0.1), ("hidden_act", "relu")])
def test_albert_refuses_what_zoo_does_not_compute_by_name(field, value):
    hf = transformers.AlbertForMaskedLM(transformers.AlbertConfig(**{**ALBERT, field: value}))
    with pytest.raises(ConversionError, match=field):
        from_hf(hf)


def test_mpnet_refuses_buckets_hf_does_not_compute():
    hf = transformers.MPNetForMaskedLM(transformers.MPNetConfig(**{**CLASSES["MPNetModel"][1], "relative_attention_num_buckets": 16}))
    with pytest.raises(ConversionError, match="relative_attention_num_buckets"):
        from_hf(hf)
    model = zoo.build("mpnet-tiny", ["layers=[{at: '1:', position: {kind: relative_bias}}]"])  # layer 0 unbiased
    with pytest.raises(ConversionError, match="layers"):
        to_hf(model, "MPNetForMaskedLM")


def test_factorised_embeddings_refused_where_the_class_lacks_them():
    """ELECTRA projects only embeddings of another width and shares no layers; BERT has no projection."""
    config = transformers.AlbertConfig(**{**ALBERT, "embedding_size": 36, "hidden_act": "gelu", "num_hidden_groups": 3})
    model = from_hf(transformers.AlbertForMaskedLM(config))  # a projection at the hidden size, no shared layers
    for architecture, field in (("ElectraForMaskedLM", "embedding.dim"), ("BertForMaskedLM", "embedding.dim")):
        with pytest.raises(ConversionError, match=field):
            to_hf(model, architecture)
    with pytest.raises(ConversionError, match="shared_layers"):
        to_hf(from_hf(transformers.AlbertModel(transformers.AlbertConfig(**{**ALBERT, "num_hidden_groups": 1}))), "ElectraModel")
    with pytest.raises(ConversionError, match="ElectraForPreTraining does not convert"):
        from_hf(transformers.ElectraForPreTraining(transformers.ElectraConfig(**ROBERTA)))


def test_roberta_directory_converts_with_zoo_convert(tmp_path, capsys):
    hf = reference("RobertaForMaskedLM")
    hf.save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), "-o", str(tmp_path / "m.safetensors")]) == 0
    assert main(["convert", str(tmp_path / "m.safetensors"), "-o", str(tmp_path / "back")]) == 0
    assert "zoo file, RobertaForMaskedLM" in capsys.readouterr().out
    disk = transformers.RobertaForMaskedLM.from_pretrained(tmp_path / "back", local_files_only=True).eval()
    model = zoo.load(tmp_path / "m.safetensors").eval()
    x, masks = batch(PAD)
    xp = x.masked_fill(~masks["right"], PAD)
    with torch.no_grad():
        ref = hf(xp, attention_mask=masks["right"].long()).logits
        assert max_diff(model(xp, masks["right"]), ref, masks["right"]) < ATOL
        assert max_diff(disk(xp, attention_mask=masks["right"].long()).logits, ref, masks["right"]) < ATOL


# ------------------------------------------------------------------------------------ presets
RELEASES = {  # the released configs' architecture fields (config.json of each Hub repository)
    "roberta-base": ("RobertaForMaskedLM", "RobertaConfig", 124_697_433, {  # FacebookAI/roberta-base
        "vocab_size": 50265, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 514, "type_vocab_size": 1, "initializer_range": 0.02, "layer_norm_eps": 1e-5,
        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}),
    "distilbert-base": ("DistilBertForMaskedLM", "DistilBertConfig", 66_985_530, {  # distilbert-base-uncased
        "vocab_size": 30522, "dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072, "max_position_embeddings": 512,
        "dropout": 0.1, "attention_dropout": 0.1, "activation": "gelu", "initializer_range": 0.02,
        "sinusoidal_pos_embds": False, "pad_token_id": 0, "tie_word_embeddings": True}),
    "modernbert-base": ("ModernBertForMaskedLM", "ModernBertConfig", 149_655_232, {  # answerdotai/ModernBERT-base
        "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22, "num_attention_heads": 12,
        "hidden_activation": "gelu", "max_position_embeddings": 8192, "initializer_range": 0.02, "norm_eps": 1e-5,
        "norm_bias": False, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "global_attn_every_n_layers": 3,
        "local_attention": 128, "attention_bias": False, "attention_dropout": 0.0, "embedding_dropout": 0.0, "mlp_bias": False,
        "mlp_dropout": 0.0, "decoder_bias": True, "classifier_bias": False, "classifier_activation": "gelu",
        "pad_token_id": 50283, "eos_token_id": 50282, "bos_token_id": 50281, "cls_token_id": 50281, "sep_token_id": 50282,
        "tie_word_embeddings": True}),
}
RELEASES |= {  # factorised embeddings; ALBERT's one shared block
    "electra-base-generator": ("ElectraForMaskedLM", "ElectraConfig", 33_740_602, {  # google/electra-base-generator
        "vocab_size": 30522, "embedding_size": 768, "hidden_size": 256, "num_hidden_layers": 12, "num_attention_heads": 4,
        "intermediate_size": 1024, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
        "pad_token_id": 0}),
    "electra-base-discriminator": ("ElectraModel", "ElectraConfig", 108_891_648, {  # google/electra-base-discriminator
        "vocab_size": 30522, "embedding_size": 768, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
        "pad_token_id": 0, "architectures": ["ElectraModel"]}),
    "albert-base-v2": ("AlbertForMaskedLM", "AlbertConfig", 11_221_680, {  # albert/albert-base-v2
        "vocab_size": 30000, "embedding_size": 128, "hidden_size": 768, "num_hidden_layers": 12, "num_hidden_groups": 1,
        "inner_group_num": 1, "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu_new",
        "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0, "max_position_embeddings": 512, "type_vocab_size": 2,
        "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}),
    "mpnet-base": ("MPNetForMaskedLM", "MPNetConfig", 109_518_527, {  # microsoft/mpnet-base
        "vocab_size": 30527, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 514, "initializer_range": 0.02, "layer_norm_eps": 1e-5,
        "relative_attention_num_buckets": 32, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}),
}
RELEASES["deberta-v3-base"] = ("DebertaV2ForMaskedLM", "DebertaV2Config", 184_551_780, {  # microsoft/deberta-v3-base
    "vocab_size": 128100, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 0, "initializer_range": 0.02, "layer_norm_eps": 1e-7,
    "relative_attention": True, "max_relative_positions": -1, "position_buckets": 256, "norm_rel_ebd": "layer_norm",
    "share_att_key": True, "pos_att_type": "p2c|c2p", "position_biased_input": False, "pad_token_id": 0})
TINY = {"roberta-tiny": "roberta-base", "distilbert-tiny": "distilbert-base", "modernbert-tiny": "modernbert-base",
        "electra-tiny": "electra-base-generator", "albert-tiny": "albert-base-v2", "mpnet-tiny": "mpnet-base",
        "deberta-tiny": "deberta-v3-base"}
READ_ONLY = {"architectures", "transformers_version", "global_attn_every_n_layers"}  # HF keeps this one beside layer_types


@pytest.mark.parametrize("name", RELEASES)
def test_release_presets_are_the_hf_configs(name):
    architecture, config_class, count, fields = RELEASES[name]
    config = getattr(transformers, config_class)(**fields)
    with torch.device("meta"):
        ref = getattr(transformers, architecture)(config)
    model = zoo.build(name, device="meta")
    assert zoo.count_parameters(model) == sum(p.numel() for p in ref.parameters()) == count
    assert model.spec.model_dump(exclude={"name"}) == hf_spec(config).model_dump(exclude={"name"})
    back = hf_config(model.spec, architecture).to_dict()
    assert all(back[k] == v for k, v in config.to_dict().items() if k not in READ_ONLY)


@pytest.mark.parametrize("name", TINY)
def test_tiny_presets_convert_to_hf_with_the_same_logits(name):
    release, tiny = zoo.load_spec(TINY[name]), zoo.load_spec(name)
    sizes = {k: True for k in ("name", "vocab_size", "max_seq_len", "d_model", "n_layers", "block", "layers")}
    sizes["embedding"] = {"dim"}  # factorised embeddings: their width is a size too
    assert tiny.model_dump(exclude=sizes) == release.model_dump(exclude=sizes)
    assert [(layer.block.kind, layer.position) for layer in tiny.stack_layers()[:3]] == \
        [(layer.block.kind, layer.position) for layer in release.stack_layers()[:3]]
    model = zoo.build(name, seed=0).eval()
    hf = to_hf(model).eval()
    assert type(hf).__name__ == RELEASES[TINY[name]][0]
    x, masks = batch(PAD, length=24)  # past modernbert-tiny's window
    x = x % model.spec.vocab_size
    mask = masks["right"]
    xp = x.masked_fill(~mask, hf.config.pad_token_id or 0)  # ModernBERT's (50283) is past the tiny vocabulary
    with torch.no_grad():
        logits = model(xp, mask)
        assert logits.abs().max() > 0.5
        assert max_diff(logits, hf(xp, attention_mask=mask.long()).logits, mask) < ATOL
