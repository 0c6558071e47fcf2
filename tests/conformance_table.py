"""The one table of small reference configs the conformance suite (tests/test_conformance.py) and the
claims test (tests/test_claims.py) build their references from: one config per converted class.

Every HF class in :data:`zoo.interop.hf.ARCHS` (the classes with heads and their headless backbones)
and every timm class ``to_timm`` writes has one entry, at odd sizes no preset has (hidden 24, 1-3
layers, a vocabulary of 53), with the options that make a class differ from its neighbours switched
on where they fit a tiny model: windows on some layers, partial rotary, soft-caps that bite, dense
layers among the experts, a shared expert. tests/test_conformance.py fails when a registered class
has no entry here.
"""

from __future__ import annotations

import functools

import torch
from conftest import randomize

V = 53  # a small, odd vocabulary
S, F = "sliding_attention", "full_attention"
_ROTARY = dict(vocab_size=V, max_position_embeddings=32, hidden_size=24, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=40)

HF_CONFIGS = {  # HF class -> (config class, fields)
    "GPT2LMHeadModel": ("GPT2Config", dict(vocab_size=V, n_positions=32, n_embd=24, n_layer=2, n_head=3, n_inner=40)),
    "BertForMaskedLM": ("BertConfig", dict(vocab_size=V, max_position_embeddings=32, hidden_size=24, num_hidden_layers=2,
                                           num_attention_heads=3, intermediate_size=40, type_vocab_size=2)),
    "LlamaForCausalLM": ("LlamaConfig", dict(_ROTARY)),
    "MarianMTModel": ("MarianConfig", dict(vocab_size=V, decoder_vocab_size=V, max_position_embeddings=32, d_model=24,
                                           encoder_layers=2, decoder_layers=2, encoder_attention_heads=3,
                                           decoder_attention_heads=3, encoder_ffn_dim=40, decoder_ffn_dim=40, pad_token_id=V - 1,
                                           decoder_start_token_id=V - 1)),
    "BartForConditionalGeneration": ("BartConfig", dict(vocab_size=V, max_position_embeddings=32, d_model=24, encoder_layers=1,
                                                         decoder_layers=1, encoder_attention_heads=3, decoder_attention_heads=3,
                                                         encoder_ffn_dim=40, decoder_ffn_dim=40)),
    "MBartForConditionalGeneration": ("MBartConfig", dict(vocab_size=V, max_position_embeddings=32, d_model=24, encoder_layers=1,
                                                          decoder_layers=1, encoder_attention_heads=3, decoder_attention_heads=3,
                                                          encoder_ffn_dim=40, decoder_ffn_dim=40)),
    # fairseq's sinusoids past an odd padding id, encoder and decoder depths apart
    "M2M100ForConditionalGeneration": ("M2M100Config", dict(vocab_size=V, max_position_embeddings=32, d_model=24,
                                                            encoder_layers=2, decoder_layers=1, encoder_attention_heads=3,
                                                            decoder_attention_heads=3, encoder_ffn_dim=40, decoder_ffn_dim=40,
                                                            encoder_layerdrop=0.0, decoder_layerdrop=0.0)),
    "MistralForCausalLM": ("MistralConfig", dict(_ROTARY, sliding_window=5)),
    "Qwen2ForCausalLM": ("Qwen2Config", dict(_ROTARY, num_hidden_layers=3, use_sliding_window=True, sliding_window=5,
                                             max_window_layers=1)),
    "GPTNeoXForCausalLM": ("GPTNeoXConfig", dict(vocab_size=V, max_position_embeddings=32, hidden_size=24, num_hidden_layers=2,
                                                 num_attention_heads=3, intermediate_size=40, rotary_pct=0.5)),
    "Olmo2ForCausalLM": ("Olmo2Config", dict(_ROTARY)),
    "GemmaForCausalLM": ("GemmaConfig", dict(_ROTARY, head_dim=6)),
    "Qwen3ForCausalLM": ("Qwen3Config", dict(_ROTARY, num_hidden_layers=3, head_dim=8, use_sliding_window=True,
                                             sliding_window=5, max_window_layers=1)),
    "Phi3ForCausalLM": ("Phi3Config", dict(_ROTARY, hidden_size=32, sliding_window=5, resid_pdrop=0.1, pad_token_id=None,
                                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                            "partial_rotary_factor": 0.5})),
    "Gemma2ForCausalLM": ("Gemma2Config", dict(_ROTARY, head_dim=6, sliding_window=5, query_pre_attn_scalar=10,
                                               attn_logit_softcapping=3.0, final_logit_softcapping=2.5,
                                               attn_implementation="eager")),  # eager: HF soft-caps only there
    "Gemma3ForCausalLM": ("Gemma3TextConfig", dict(_ROTARY, head_dim=6, sliding_window=5, layer_types=[S, F],
                                                   final_logit_softcapping=20.0, attn_implementation="eager")),
    # mixtures of experts: jitter, a window, dense layers among the MoE ones, a shared expert; the experts' widths
    # multiples of 4 (HF's grouped_mm on the CPU wants rows of 16 bytes)
    "MixtralForCausalLM": ("MixtralConfig", dict(_ROTARY, intermediate_size=12, num_local_experts=3, num_experts_per_tok=2,
                                                 sliding_window=5, router_jitter_noise=0.1, router_aux_loss_coef=0.02)),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", dict(_ROTARY, num_hidden_layers=3, moe_intermediate_size=12,
                                                   shared_expert_intermediate_size=16, num_experts=3, num_experts_per_tok=2,
                                                   mlp_only_layers=[1], use_sliding_window=True, sliding_window=5,
                                                   max_window_layers=1)),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", dict(_ROTARY, num_hidden_layers=3, head_dim=8, moe_intermediate_size=12,
                                                   num_experts=3, num_experts_per_tok=2, decoder_sparse_step=2,
                                                   norm_topk_prob=True, use_sliding_window=True, sliding_window=5)),
    "OlmoeForCausalLM": ("OlmoeConfig", dict(_ROTARY, intermediate_size=12, num_experts=3, num_experts_per_tok=2)),
    # StableLM: LayerNorm with biases, partial rotary, q/k/v biases, attention and FFN side by side from one norm
    "StableLmForCausalLM": ("StableLmConfig", dict(_ROTARY, num_attention_heads=3, num_key_value_heads=3,
                                                   partial_rotary_factor=0.5, use_qkv_bias=True, use_parallel_residual=True)),
    # Granite: its four multipliers, none a power of two
    "GraniteForCausalLM": ("GraniteConfig", dict(_ROTARY, embedding_multiplier=3.5, attention_multiplier=0.3,
                                                 residual_multiplier=0.7, logits_scaling=1.7)),
    # Cohere: parallel blocks from one bias-free LayerNorm, interleaved rope, a logit scale, attention biases
    "CohereForCausalLM": ("CohereConfig", dict(_ROTARY, logit_scale=0.3, attention_bias=True, bos_token_id=1,
                                               eos_token_id=2)),
    # SmolLM3: NoPE layers (no_rope_layers), a window on one layer
    "SmolLM3ForCausalLM": ("SmolLM3Config", dict(_ROTARY, num_hidden_layers=3, no_rope_layers=[1, 0, 1],
                                                 use_sliding_window=True, sliding_window=5,
                                                 layer_types=[F, F, S], bos_token_id=1, eos_token_id=2,
                                                 pad_token_id=0)),
    # Llama 4 text: chunked attention (chunk 3) on its rope layers, a NoPE layer with temperature tuning (floor 2),
    # the L2 qk norm, interleaved llama3 rope, an MoE layer (top-1 sigmoid, input-weighted, shared expert) and a dense one
    "Llama4ForCausalLM": ("Llama4TextConfig", dict(_ROTARY, num_hidden_layers=4, head_dim=8, intermediate_size=12,
                                                   intermediate_size_mlp=20, num_local_experts=3, num_experts_per_tok=1,
                                                   interleave_moe_layer_step=2, no_rope_layer_interval=3,
                                                   attention_chunk_size=3, floor_scale=2, attn_scale=0.3,
                                                   rope_parameters={"rope_type": "llama3", "rope_theta": 5000.0,
                                                                    "factor": 4.0, "low_freq_factor": 1.0,
                                                                    "high_freq_factor": 2.0,
                                                                    "original_max_position_embeddings": 8},
                                                   bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "T5ForConditionalGeneration": ("T5Config", dict(vocab_size=V, d_model=24, d_kv=6, d_ff=40, num_layers=1, num_heads=3,
                                                    relative_attention_num_buckets=8, relative_attention_max_distance=20)),
    "RobertaForMaskedLM": ("RobertaConfig", dict(vocab_size=V, max_position_embeddings=34, hidden_size=24, num_hidden_layers=2,
                                                 num_attention_heads=3, intermediate_size=40, type_vocab_size=1, pad_token_id=1)),
    "XLMRobertaForMaskedLM": ("XLMRobertaConfig", dict(vocab_size=V, max_position_embeddings=34, hidden_size=24,
                                                       num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
                                                       type_vocab_size=2, pad_token_id=2)),
    "DistilBertForMaskedLM": ("DistilBertConfig", dict(vocab_size=V, max_position_embeddings=32, dim=24, n_layers=2, n_heads=3,
                                                       hidden_dim=40)),
    "ModernBertForMaskedLM": ("ModernBertConfig", dict(vocab_size=V, max_position_embeddings=32, hidden_size=24,
                                                       num_hidden_layers=3, num_attention_heads=3, intermediate_size=40,
                                                       local_attention=4, global_attn_every_n_layers=2, pad_token_id=1,
                                                       bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2,
                                                       attn_implementation="eager")),
    # OLMo: LayerNorm without weight or bias
    "OlmoForCausalLM": ("OlmoConfig", dict(_ROTARY)),
    # Nemotron: layernorm1p with biases, relu2 MLP with biases, partial rotary, a head size of its own, attention biases
    "NemotronForCausalLM": ("NemotronConfig", dict(_ROTARY, head_dim=8, mlp_bias=True, attention_bias=True,
                                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                    "partial_rotary_factor": 0.5})),
}
HF_CONFIGS |= {  # factorised embeddings (embedding_size != hidden_size)
    "ElectraForMaskedLM": ("ElectraConfig", dict(vocab_size=V, max_position_embeddings=32, embedding_size=14, hidden_size=24,
                                                 num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
                                                 type_vocab_size=2, hidden_act="gelu_new")),
    # and shared layers: 3 layers running 2 groups (layers 0 and 1 share one)
    "AlbertForMaskedLM": ("AlbertConfig", dict(vocab_size=V, max_position_embeddings=32, embedding_size=14, hidden_size=24,
                                               num_hidden_layers=3, num_hidden_groups=2, num_attention_heads=3,
                                               intermediate_size=40, type_vocab_size=2)),
    # a relative bias beside fairseq's learned positions
    "MPNetForMaskedLM": ("MPNetConfig", dict(vocab_size=V, max_position_embeddings=34, hidden_size=24, num_hidden_layers=2,
                                             num_attention_heads=3, intermediate_size=40)),
}
_TOWER = dict(vocab_size=V, max_position_embeddings=32, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
              intermediate_size=40)
HF_CONFIGS |= {  # text towers: a causal mask and the end-of-text token (legacy argmax, or an id), or the last slot
    "CLIPTextModel": ("CLIPTextConfig", dict(_TOWER, eos_token_id=2)),
    "CLIPTextModelWithProjection": ("CLIPTextConfig", dict(_TOWER, eos_token_id=7, projection_dim=10, hidden_act="gelu",
                                                                           architectures=["CLIPTextModelWithProjection"])),
    "SiglipTextModel": ("SiglipTextConfig", dict(_TOWER, projection_size=10)),
    "Siglip2TextModel": ("Siglip2TextConfig", dict(_TOWER, hidden_act="gelu_new")),
}
# the backbones without a head (head: none): their class's config, named in its architectures
BACKBONE_OF = {
    "GPT2Model": "GPT2LMHeadModel", "BertModel": "BertForMaskedLM", "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM", "Qwen2Model": "Qwen2ForCausalLM", "GPTNeoXModel": "GPTNeoXForCausalLM",
    "Olmo2Model": "Olmo2ForCausalLM", "GemmaModel": "GemmaForCausalLM", "Qwen3Model": "Qwen3ForCausalLM",
    "Phi3Model": "Phi3ForCausalLM", "Gemma2Model": "Gemma2ForCausalLM", "Gemma3TextModel": "Gemma3ForCausalLM",
    "MixtralModel": "MixtralForCausalLM", "Qwen2MoeModel": "Qwen2MoeForCausalLM", "Qwen3MoeModel": "Qwen3MoeForCausalLM",
    "OlmoeModel": "OlmoeForCausalLM", "RobertaModel": "RobertaForMaskedLM", "XLMRobertaModel": "XLMRobertaForMaskedLM",
    "DistilBertModel": "DistilBertForMaskedLM", "ModernBertModel": "ModernBertForMaskedLM", "StableLmModel": "StableLmForCausalLM",
    "GraniteModel": "GraniteForCausalLM", "CohereModel": "CohereForCausalLM", "SmolLM3Model": "SmolLM3ForCausalLM",
    "OlmoModel": "OlmoForCausalLM", "NemotronModel": "NemotronForCausalLM",
}
# gpt-oss: attention sinks, a sliding and a full layer, yarn without truncation, biased router and experts, a clamped
# SwiGLU whose limit bites on the tiny model's activations
HF_CONFIGS["GptOssForCausalLM"] = ("GptOssConfig", dict(_ROTARY, head_dim=6, intermediate_size=12, num_local_experts=3,
                                                        num_experts_per_tok=2, sliding_window=5, swiglu_limit=0.5,
                                                        router_aux_loss_coef=0.02,
                                                        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                                                         "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                                         "truncate": False,
                                                                         "original_max_position_embeddings": 8}))
BACKBONE_OF["GptOssModel"] = "GptOssForCausalLM"
BACKBONE_OF |= {"Llama4TextModel": "Llama4ForCausalLM"}
BACKBONE_OF |= {"ElectraModel": "ElectraForMaskedLM", "AlbertModel": "AlbertForMaskedLM", "MPNetModel": "MPNetForMaskedLM"}
BACKBONE_OF |= {"M2M100Model": "M2M100ForConditionalGeneration"}
# DeepSeek-V3: multi-head latent attention (q through a latent), yarn with mscale_all_dim (the scores' scale), the
# first layer dense, a sigmoid router over groups with a correction bias, two shared experts
HF_CONFIGS["DeepseekV3ForCausalLM"] = ("DeepseekV3Config", dict(
    _ROTARY, num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=10, kv_lora_rank=8, qk_nope_head_dim=6,
    qk_rope_head_dim=4, v_head_dim=5, n_routed_experts=6, num_experts_per_tok=2, n_group=3, topk_group=2,
    moe_intermediate_size=12, n_shared_experts=2, first_k_dense_replace=1, routed_scaling_factor=1.7,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
                     "mscale": 1.0, "mscale_all_dim": 0.8}))
BACKBONE_OF |= {"DeepseekV3Model": "DeepseekV3ForCausalLM"}
# DeepSeek-V2: multi-head latent attention with q through a latent, yarn with mscale_all_dim, the first layer dense, a
# softmax router limited to the best 2 of 3 groups (each ranked by its best expert), the weights scaled, not renormalised
HF_CONFIGS["DeepseekV2ForCausalLM"] = ("DeepseekV2Config", dict(
    _ROTARY, num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=10, kv_lora_rank=8, qk_nope_head_dim=6,
    qk_rope_head_dim=4, v_head_dim=5, n_routed_experts=6, num_experts_per_tok=3, n_group=3, topk_group=2,
    topk_method="group_limited_greedy", moe_intermediate_size=12, n_shared_experts=2, first_k_dense_replace=1,
    routed_scaling_factor=1.7, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                "original_max_position_embeddings": 8, "mscale": 0.9, "mscale_all_dim": 0.8}))
BACKBONE_OF |= {"DeepseekV2Model": "DeepseekV2ForCausalLM"}
# DeBERTa-v3: disentangled attention (c2p, p2c, shared keys) over 8 log buckets reaching 12, the table normalised
HF_CONFIGS["DebertaV2ForMaskedLM"] = ("DebertaV2Config", dict(
    vocab_size=V, max_position_embeddings=32, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
    intermediate_size=40, relative_attention=True, position_buckets=8, max_relative_positions=12, norm_rel_ebd="layer_norm",
    share_att_key=True, pos_att_type="p2c|c2p", position_biased_input=False, type_vocab_size=0))
BACKBONE_OF["DebertaV2Model"] = "DebertaV2ForMaskedLM"
# Qwen3-Next: gated DeltaNet layers (3 value heads per key head, odd head sizes, a 3-tap convolution) around a gated
# full-attention layer with partial rotary, a dense layer among MoE ones with a gated shared expert
HF_CONFIGS["Qwen3NextForCausalLM"] = ("Qwen3NextConfig", dict(
    _ROTARY, num_hidden_layers=3, head_dim=8, layer_types=["linear_attention", "full_attention", "linear_attention"],
    linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=5, linear_value_head_dim=7,
    linear_conv_kernel_dim=3, partial_rotary_factor=0.5, moe_intermediate_size=12, shared_expert_intermediate_size=16,
    num_experts=3, num_experts_per_tok=2, mlp_only_layers=[1], rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                                 "partial_rotary_factor": 0.5}))
BACKBONE_OF |= {"Qwen3NextModel": "Qwen3NextForCausalLM"}
HF_CONFIGS |= {name: (HF_CONFIGS[lm][0], {**HF_CONFIGS[lm][1], "architectures": [name]}) for name, lm in BACKBONE_OF.items()}
# sequence classifiers: their masked-LM class's config with labels named, a problem type, head dropouts of their own
_LABELS = dict(id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2})
CLASSIFIER_OF = {  # HF class -> (its masked-LM class, what its config sets beside that one's)
    "DebertaV2ForSequenceClassification": ("DebertaV2ForMaskedLM", dict(_LABELS, pooler_dropout=0.05, cls_dropout=0.2,
                                                                       problem_type="multi_label_classification")),
    "BertForSequenceClassification": ("BertForMaskedLM", dict(_LABELS, classifier_dropout=0.2)),
    "RobertaForSequenceClassification": ("RobertaForMaskedLM", dict(_LABELS, classifier_dropout=0.0)),
    "XLMRobertaForSequenceClassification": ("XLMRobertaForMaskedLM", dict(num_labels=4)),
    "ElectraForSequenceClassification": ("ElectraForMaskedLM", dict(num_labels=1, problem_type="regression")),
    "DistilBertForSequenceClassification": ("DistilBertForMaskedLM", dict(_LABELS, seq_classif_dropout=0.3)),
    "AlbertForSequenceClassification": ("AlbertForMaskedLM", dict(_LABELS, classifier_dropout_prob=0.15)),
    "ModernBertForSequenceClassification": ("ModernBertForMaskedLM", dict(_LABELS, classifier_pooling="mean",
                                                                         classifier_activation="silu", classifier_dropout=0.1)),
    "MPNetForSequenceClassification": ("MPNetForMaskedLM", dict(id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1})),
}
HF_CONFIGS |= {name: (HF_CONFIGS[lm][0], {**HF_CONFIGS[lm][1], **kw, "architectures": [name]})
               for name, (lm, kw) in CLASSIFIER_OF.items()}

TIMM_CONFIGS = {  # timm class -> its arguments
    "VisionTransformer": dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5),
    # timm's Eva: rope2d, SwiGLU, no key bias
    "Eva": dict(img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3, mlp_ratio=2.0, num_classes=5,
                use_rot_pos_emb=True, use_abs_pos_emb=False, swiglu_mlp=True, ref_feat_shape=(8, 8)),
    # timm's Beit: a 2-D relative bias of each layer's own, layer scale, q and v biases, mean pooling with fc_norm
    "Beit": dict(img_size=24, patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5,
                 use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.1),
}
# variants of a class ("class:variant"): models of a registered class that set other parts apart
# AIMv2: RmsNorm in the patch embedding and the blocks, timm's SwiGLU without biases, mean pooling without a class token
TIMM_CONFIGS["VisionTransformer:aimv2"] = dict(
    img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.75, num_classes=5, class_token=False,
    global_pool="avg", fc_norm=False, qkv_bias=False, proj_bias=False, act_layer="silu", norm_layer="rmsnorm",
    embed_norm_layer="rmsnorm", mlp_layer="SwiGLU")  # a timm.layers class, named (timm is imported when used)
# DINOv3: its centred rope2d turning halves, a class token and 4 registers, layer scale, no q/k/v biases, any image size
TIMM_CONFIGS["Eva:dinov3"] = dict(
    img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5, qkv_bias=False,
    init_values=1e-5, rope_type="dinov3", rope_temperature=100, rope_rotate_half=True, use_rot_pos_emb=True,
    use_abs_pos_emb=False, num_reg_tokens=4, use_fc_norm=False, dynamic_img_size=True)
# NaFlexVit: a linear patch embedding over (row, column, channel) patches, a learned 4 x 4 position grid on the patches
# only, a class token and 2 registers, attention pooling; and pooled by the patch mean after fc_norm with layer scale
TIMM_CONFIGS["NaFlexVit"] = dict(
    img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5, pos_embed_grid_size=(4, 4),
    class_token=True, reg_tokens=2, global_pool="map")
TIMM_CONFIGS["NaFlexVit:gap"] = dict(
    img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5, pos_embed_grid_size=(4, 4),
    reg_tokens=4, global_pool="avg", fc_norm=True, init_values=0.1)
# RoPE-Mixed (vit_*_patch16_rope_mixed_224): learned frequencies per layer and head, x by the column; AttentionRope's q,
# k and v biases; any image size
TIMM_CONFIGS["Eva:rope_mixed"] = dict(
    img_size=32, patch_size=8, embed_dim=36, depth=3, num_heads=3, mlp_ratio=2.0, num_classes=5, attn_type="rope",
    init_values=1e-5, global_pool="token", use_abs_pos_emb=False, use_rot_pos_emb=True,
    rope_grid_indexing="xy", rope_temperature=10.0, rope_type="mixed", dynamic_img_size=True)
# RoPE-Mixed beside learned positions left off the class token (vit_*_patch16_rope_mixed_ape_224)
TIMM_CONFIGS["Eva:rope_mixed_ape"] = dict(
    img_size=32, patch_size=8, embed_dim=36, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5, attn_type="rope",
    init_values=1e-5, global_pool="token", no_embed_class=True, use_abs_pos_emb=True, use_rot_pos_emb=True,
    rope_grid_indexing="xy", rope_temperature=10.0, rope_type="mixed")
# AttentionRope's grouped-query attention (num_kv_heads, on split q, k, v projections) beside EVA-02's rope2d
TIMM_CONFIGS["Eva:gqa"] = dict(
    img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4, num_kv_heads=2, mlp_ratio=2.0, num_classes=5,
    attn_type="rope", qkv_fused=False, use_rot_pos_emb=True, use_abs_pos_emb=False, ref_feat_shape=(8, 8))
# the variants whose timm directory timm's saved-model config cannot record (a class, a norm layer): the field refused
NO_TIMM_DIRECTORY = {"VisionTransformer:aimv2": "block.norm.kind='rmsnorm'"}
CLASSES = [*HF_CONFIGS, *TIMM_CONFIGS]


def timm_class(name: str) -> str:
    """The timm class of a table entry (a variant "class:variant" is of its class)."""
    return name.split(":")[0]


def timm_classes() -> list[str]:
    """The timm classes the registry holds (zoo.interop.timm.ARCHS)."""
    from zoo.interop.timm import ARCHS

    return list(ARCHS)


def hf_config(name: str, **kw):
    import transformers

    config, fields = HF_CONFIGS[name]
    return getattr(transformers, config)(**{**fields, **kw})


def build_reference(name: str, seed: int = 0, **kw) -> torch.nn.Module:
    """A new random-init reference of class ``name`` from the table (``kw`` changes its config or,
    for timm, its arguments), every parameter random (BART's and Marian's logits bias too), in eval mode."""
    if name in TIMM_CONFIGS:
        from zoo.interop.timm import ARCHS

        import timm.layers

        args = {**TIMM_CONFIGS[name], **kw}
        if isinstance(args.get("mlp_layer"), str):
            args["mlp_layer"] = getattr(timm.layers, args["mlp_layer"])
        return randomize(ARCHS[timm_class(name)].reference()(**args), seed)
    import transformers

    model = getattr(transformers, name)(hf_config(name, **kw))
    bias = tuple(n for n, _ in model.named_buffers() if n.endswith("e_score_correction_bias"))  # DeepSeek-V3's router
    return randomize(model, seed, buffers=("final_logits_bias", *bias))


@functools.cache
def reference(name: str) -> torch.nn.Module:
    """The table's reference of class ``name``, built once per test process (tests must not change it)."""
    return build_reference(name)


# the encoder-decoders decode from untied variants (seed 1): tied to its input embedding, a random one
# repeats its last token, which would compare little
GENERATION = {name: dict(tie_word_embeddings=False) for name in
              ("MarianMTModel", "BartForConditionalGeneration", "MBartForConditionalGeneration",
               "M2M100ForConditionalGeneration")}


@functools.cache
def generation_reference(name: str) -> torch.nn.Module:
    """The reference the decoding tests of class ``name`` use: the table's, or its untied variant."""
    return build_reference(name, seed=1, **GENERATION[name]) if name in GENERATION else reference(name)
