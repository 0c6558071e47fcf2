"""Presets reproduce the reference models' sizes exactly; the paper's Table 3 rows as overrides."""

from __future__ import annotations

import pytest
import torch

import zoo

EXACT = {
    # HF GPT2LMHeadModel(GPT2Config()), tied
    "gpt2-small": 124_439_808,
    # HF BertForMaskedLM(BertConfig())
    "bert-base": 109_514_298,
    "bert-base-headless": 109_482_240,  # HF BertModel(BertConfig()), with its pooler
    # HF RobertaForMaskedLM from FacebookAI/roberta-base's config (tests/test_hf_encoders.py)
    "roberta-base": 124_697_433,
    "distilbert-base": 66_985_530,  # HF DistilBertForMaskedLM from distilbert-base-uncased's config
    "modernbert-base": 149_655_232,  # HF ModernBertForMaskedLM from answerdotai/ModernBERT-base's config
    # timm vit_{tiny,small,base}_patch16_224
    "vit-tiny-16": 5_717_416,
    "vit-small-16": 22_050_664,
    "vit-base-16": 86_567_656,
    # timm deit3_small_patch16_224, vit_medium_patch16_reg4_gap_256, vit_so150m_patch16_reg4_map_256
    "deit3-small-16": 22_059_496,
    "vit-medium-16-reg4-gap-256": 38_881_768,
    "vit-so150m-16-reg4-map-256": 141_481_064,
    "vit-small-16-reg4": 22_051_816,  # timm vit_small_patch16_224 with reg_tokens=4, no_embed_class=True
    "vit-base-16-clip": 85_799_424,  # timm vit_base_patch16_clip_224 with num_classes=0
    "eva02-tiny-14": 5_502_144,  # timm eva02_tiny_patch14_224 (its default num_classes is 0)
    "beit-base-16": 86_530_984,  # timm beit_base_patch16_224
    "aimv2-large-14": 309_197_824,  # timm aimv2_large_patch14_224 (its default num_classes is 0)
    "vit-small-16-dinov3": 21_586_944,  # timm vit_small_patch16_dinov3 (its default num_classes is 0)
    "naflexvit-base-16-gap": 86_633_704,  # timm naflexvit_base_patch16_gap
    "vit-base-16-rope-mixed": 86_444_008,  # timm vit_base_patch16_rope_mixed_224
    # HF {Llama,Qwen3,Gemma2,Gemma3,Phi3,Mixtral,Qwen3Moe,Olmoe,Qwen2Moe}ForCausalLM from the releases' configs
    # (tests/test_presets_hf.py)
    "llama-3.2-1b": 1_235_814_400,
    "qwen3-0.6b": 596_049_920,
    "gemma-2-2b": 2_614_341_888,
    "gemma-3-1b": 999_885_952,
    "phi-3-mini": 3_821_079_552,
    "mixtral-8x7b": 46_702_792_704,
    "qwen3-30b-a3b": 30_532_122_624,
    "olmoe-1b-7b": 6_919_161_856,
    "qwen1.5-moe-a2.7b": 14_315_784_192,
    # HF GraniteForCausalLM, SmolLM3ForCausalLM, CohereForCausalLM from the releases' configs (tests/test_presets_hf.py)
    "granite-3.3-8b": 8_170_864_640,
    "smollm3-3b": 3_075_098_624,
    "command-r-v01": 34_980_831_232,
    "olmo-1b": 1_176_764_416,  # HF OlmoForCausalLM from allenai/OLMo-1B-hf's config
    "nemotron-mini-4b": 4_190_509_056,  # HF NemotronForCausalLM from nvidia/Nemotron-Mini-4B-Instruct's config
    "llama-4-scout-text": 107_769_861_120,  # HF Llama4ForCausalLM from Llama-4-Scout-17B-16E's text_config
    "gpt-oss-20b": 20_914_757_184,  # HF GptOssForCausalLM from openai/gpt-oss-20b's config (tests/test_presets_hf.py)
    # HF BartForConditionalGeneration from facebook/bart-base's config (tests/test_bart_hf.py)
    "bart-base": 139_420_416,
    # HF CLIPTextModelWithProjection and SiglipTextModel from the releases' text configs (tests/test_text_towers.py)
    "clip-vit-base-patch32-text": 63_428_096,
    "siglip-base-patch16-224-text": 110_271_744,
    # HF M2M100ForConditionalGeneration from the releases' configs (tests/test_m2m100.py)
    "nllb-200-distilled-600m": 615_073_792,
    "m2m100-418m": 483_905_536,
    "deberta-v3-base": 184_551_780,  # HF DebertaV2ForMaskedLM from microsoft/deberta-v3-base's config (tests/test_hf_encoders.py)
}
EXACT["qwen3-next-80b-a3b"] = 79_674_391_296  # HF Qwen3NextForCausalLM from Qwen/Qwen3-Next-80B-A3B-Instruct's config


def n_params(name: str, overrides=()) -> int:
    return zoo.count_parameters(zoo.build(name, overrides, device="meta"))


@pytest.mark.parametrize("name,count", EXACT.items())
def test_reference_counts(name, count):
    assert n_params(name) == count


@pytest.mark.slow
def test_every_preset_is_in_the_table_and_builds():
    assert set(zoo.preset_names()) >= {*EXACT, "transformer-base", "transformer-big", "llama-small"}
    for name in zoo.preset_names():
        model = zoo.build(name, device="meta")
        assert model.spec.name == name


def transformer_by_hand(d: int, ff: int, n: int, vocab: int, d_k: int | None = None, h: int = 8) -> int:
    """The original Transformer's parameters: 3 attentions per decoder layer, 1 per encoder layer."""
    d_k = d_k or d // h
    attn = 2 * (d * h * d_k + h * d_k) + (d * d + d) + (d * d + d)  # q, k (d_k) + v (d_v = d/h) + output
    ffn = d * ff + ff + ff * d + d
    enc = attn + ffn + 2 * 2 * d
    dec = 2 * attn + ffn + 3 * 2 * d
    return n * (enc + dec) + vocab * d  # one embedding shared by source, target and output


def test_paper_sizes():
    base, big = n_params("transformer-base"), n_params("transformer-big")
    assert base == transformer_by_hand(512, 2048, 6, 37000) == 63_082_496  # the paper reports ~65M
    assert big == transformer_by_hand(1024, 4096, 6, 37000) == 214_245_376  # the paper reports ~213M
    assert 60e6 < base < 66e6 and 205e6 < big < 220e6


TABLE3 = {
    # (B): d_k shrinks, d_v stays 64
    "B d_k=16": (["block.attention.head_dim=16"], -7_091_712),
    "B d_k=32": (["block.attention.head_dim=32"], -4_727_808),
    # (C): depth and width
    "C N=2": (["n_layers=2"], -29_425_664),
    "C N=4": (["n_layers=4"], -14_712_832),
    "C N=8": (["n_layers=8"], +14_712_832),
    "C d_ff=1024": (["block.ffn.hidden=1024"], -12_595_200),
    "C d_ff=4096": (["block.ffn.hidden=4096"], +25_190_400),
    # (A): heads change, d_k = d_v = d_model / h, count unchanged
    "A h=1": (["block.attention.n_heads=1"], 0),
    "A h=4": (["block.attention.n_heads=4"], 0),
    "A h=16": (["block.attention.n_heads=16"], 0),
    "A h=32": (["block.attention.n_heads=32"], 0),
    # (E): learned positions instead of sinusoids: max_seq_len x d_model more
    "E learned": (["position.kind=learned"], 1024 * 512),
}


@pytest.mark.parametrize("row", TABLE3)
def test_table3_deltas(row):
    overrides, delta = TABLE3[row]
    assert n_params("transformer-base", overrides) - n_params("transformer-base") == delta
    # vocabulary-independent
    small = ["vocab_size=1000"]
    assert n_params("transformer-base", small + overrides) - n_params("transformer-base", small) == delta


def test_llama_small_shape():
    spec = zoo.load_spec("llama-small")
    assert (spec.position.kind, spec.block.ffn.kind, spec.block.norm.kind, spec.block.kind) == ("rope", "swiglu", "rmsnorm", "pre")
    assert spec.block.attention.n_kv_heads == 4 and not spec.block.attention.bias and not spec.block.ffn.bias
    model = zoo.build(spec, device="meta")
    assert not any(name.endswith(".bias") for name, _ in model.named_parameters())
    assert model.stack.blocks[0].attn.qkv.weight.shape == (768 + 2 * 4 * 64, 768)


@pytest.mark.reference
def test_counts_equal_reference_classes():
    import timm
    import transformers

    with torch.device("meta"):
        refs = {
            "gpt2-small": transformers.GPT2LMHeadModel(transformers.GPT2Config()),
            "bert-base": transformers.BertForMaskedLM(transformers.BertConfig()),
            "bert-base-headless": transformers.BertModel(transformers.BertConfig()),
            "llama-small": transformers.LlamaForCausalLM(transformers.LlamaConfig(
                vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=False)),
            "vit-tiny-16": timm.create_model("vit_tiny_patch16_224"),
            "vit-base-16-clip": timm.create_model("vit_base_patch16_clip_224", num_classes=0),
            "eva02-tiny-14": timm.create_model("eva02_tiny_patch14_224"),
            "beit-base-16": timm.create_model("beit_base_patch16_224"),
            "aimv2-large-14": timm.create_model("aimv2_large_patch14_224"),
            "vit-small-16-dinov3": timm.create_model("vit_small_patch16_dinov3"),
            "naflexvit-base-16-gap": timm.create_model("naflexvit_base_patch16_gap"),
            "vit-base-16-rope-mixed": timm.create_model("vit_base_patch16_rope_mixed_224"),
        }
    for name, ref in refs.items():
        assert n_params(name) == sum(p.numel() for p in ref.parameters()), name
