"""The presets of released decoders are their HF configs, and their tiny variants convert to HF exactly.

Real sizes (``llama-3.2-1b``, ``qwen3-0.6b``, ``gemma-2-2b``, ``gemma-3-1b``, ``phi-3-mini``, ``olmo-1b``,
``nemotron-mini-4b``, and the mixtures of experts ``mixtral-8x7b``, ``qwen3-30b-a3b``, ``olmoe-1b-7b``,
``qwen1.5-moe-a2.7b``, ``gpt-oss-20b``, ``deepseek-v3`` (671B), ``deepseek-v2`` (236B), ``deepseek-v2-lite``, and ``granite-3.3-8b``, ``smollm3-3b``, ``command-r-v01``,
``llama-4-scout-text``), on the
meta device only: each preset is ``hf_spec`` of the release's config as HF's config class completes it,
has the parameter count of the HF class built from that config (tied tensors once), and writes back to
the same config values; so are T5 (``t5-small``) and Flan-T5 (``flan-t5-base``), and their tiny variants
(``t5-tiny``, ``flan-t5-tiny``) convert to HF exactly. Tiny variants (``llama-3.2-tiny``, ``qwen3-tiny``, ``gemma-2-tiny``,
``gemma-3-tiny``, ``phi-3-tiny``, ``mixtral-tiny``, ``qwen3-moe-tiny``, ``olmoe-tiny``, ``qwen1.5-moe-tiny``,
``granite-tiny``, ``smollm3-tiny``, ``command-r-tiny``, ``olmo-tiny``, ``nemotron-tiny``, ``gpt-oss-tiny``,
``deepseek-tiny``, ``deepseek-v2-tiny``, ``llama4-tiny``,
``qwen3-next-tiny``; real size ``qwen3-next-80b-a3b``): at random init each converts to its HF class with the same logits
(fp32, padded or not, on sequences longer than its window) and the same greedy decoding past the window.
"""

from __future__ import annotations

import pytest
import torch
from conftest import max_diff, positions

import zoo
from zoo.interop import hf_config, hf_spec, to_hf

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
S, F = "sliding_attention", "full_attention"

# the released configs' architecture fields (config.json of each Hub repository), as HF config arguments
RELEASES = {
    "llama-3.2-1b": ("LlamaForCausalLM", "LlamaConfig", 1_235_814_400, {  # meta-llama/Llama-3.2-1B
        "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": True}),
    "qwen3-0.6b": ("Qwen3ForCausalLM", "Qwen3Config", 596_049_920, {  # Qwen/Qwen3-0.6B
        "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "attention_bias": False, "use_sliding_window": False, "tie_word_embeddings": True}),
    "gemma-2-2b": ("Gemma2ForCausalLM", "Gemma2Config", 2_614_341_888, {  # google/gemma-2-2b
        "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
        "sliding_window": 4096, "layer_types": [S, F] * 13, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "max_position_embeddings": 8192,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}),
    "gemma-3-1b": ("Gemma3ForCausalLM", "Gemma3TextConfig", 999_885_952, {  # google/gemma-3-1b-pt
        "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256,
        "sliding_window": 512, "layer_types": [F if i % 6 == 5 else S for i in range(26)],
        "rope_theta": 1e6, "rope_local_base_freq": 10000.0, "final_logit_softcapping": None,
        "attn_logit_softcapping": None, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}),
    "phi-3-mini": ("Phi3ForCausalLM", "Phi3Config", 3_821_079_552, {  # microsoft/Phi-3-mini-4k-instruct
        "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "sliding_window": 2047, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}),
    "mixtral-8x7b": ("MixtralForCausalLM", "MixtralConfig", 46_702_792_704, {  # mistralai/Mixtral-8x7B-v0.1
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "sliding_window": None, "hidden_act": "silu",
        "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02, "tie_word_embeddings": False}),
    "qwen3-30b-a3b": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", 30_532_122_624, {  # Qwen/Qwen3-30B-A3B
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "attention_bias": False, "use_sliding_window": False, "num_experts": 128, "num_experts_per_tok": 8,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False}),
    "olmoe-1b-7b": ("OlmoeForCausalLM", "OlmoeConfig", 6_919_161_856, {  # allenai/OLMoE-1B-7B-0924
        "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16,
        "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "attention_bias": False, "clip_qkv": None,
        "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False, "router_aux_loss_coef": 0.01,
        "tie_word_embeddings": False}),
    "qwen1.5-moe-a2.7b": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", 14_315_784_192, {  # Qwen/Qwen1.5-MoE-A2.7B
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,
        "num_key_value_heads": 16, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "use_sliding_window": False,
        "sliding_window": 32768, "num_experts": 60, "num_experts_per_tok": 4, "norm_topk_prob": False,
        "decoder_sparse_step": 1, "router_aux_loss_coef": 0.001, "tie_word_embeddings": False}),
    "gpt-oss-20b": ("GptOssForCausalLM", "GptOssConfig", 20_914_757_184, {  # openai/gpt-oss-20b
        "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
        "num_experts_per_tok": 4, "sliding_window": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "attention_bias": True, "swiglu_limit": 7.0, "router_aux_loss_coef": 0.9, "hidden_act": "silu",
        "layer_types": [S if i % 2 == 0 else F for i in range(24)], "tie_word_embeddings": False,
        # the release also states beta_fast 32 and beta_slow 1, HF's defaults, which zoo does not write
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "truncate": False,
                            "original_max_position_embeddings": 4096},
        "eos_token_id": 200002, "pad_token_id": 199999}),
    "granite-3.3-8b": ("GraniteForCausalLM", "GraniteConfig", 8_170_864_640, {  # ibm-granite/granite-3.3-8b-base
        "vocab_size": 49159, "hidden_size": 4096, "intermediate_size": 12800, "num_hidden_layers": 40,
        "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7}, "attention_bias": False, "mlp_bias": False,
        "embedding_multiplier": 12.0, "attention_multiplier": 0.0078125, "residual_multiplier": 0.22,
        "logits_scaling": 16.0, "tie_word_embeddings": True}),
    "smollm3-3b": ("SmolLM3ForCausalLM", "SmolLM3Config", 3_075_098_624, {  # HuggingFaceTB/SmolLM3-3B
        "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
        "num_attention_heads": 16, "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 65536,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e6}, "no_rope_layer_interval": 4,
        "use_sliding_window": False, "sliding_window": None, "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": True}),
    "command-r-v01": ("CohereForCausalLM", "CohereConfig", 34_980_831_232, {  # CohereForAI/c4ai-command-r-v01
        "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "num_hidden_layers": 40,
        "num_attention_heads": 64, "num_key_value_heads": 64, "layer_norm_eps": 1e-5, "max_position_embeddings": 8192,
        "logit_scale": 0.0625, "rope_parameters": {"rope_type": "default", "rope_theta": 8e6}, "attention_bias": False,
        "use_qk_norm": False, "tie_word_embeddings": True}),
    "llama-4-scout-text": ("Llama4ForCausalLM", "Llama4TextConfig", 107_769_861_120, {  # text_config of
        # meta-llama/Llama-4-Scout-17B-16E
        "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_act": "silu", "max_position_embeddings": 10485760, "rms_norm_eps": 1e-5, "attention_bias": False,
        "num_experts_per_tok": 1, "num_local_experts": 16, "interleave_moe_layer_step": 1, "use_qk_norm": True,
        "no_rope_layer_interval": 4, "attention_chunk_size": 8192, "attn_temperature_tuning": True,
        "floor_scale": 8192, "attn_scale": 0.1, "router_aux_loss_coef": 0.001, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}}),
    "olmo-1b": ("OlmoForCausalLM", "OlmoConfig", 1_176_764_416, {  # allenai/OLMo-1B-hf
        "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 2048, "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "attention_bias": False, "clip_qkv": None,
        "tie_word_embeddings": True}),
    "nemotron-mini-4b": ("NemotronForCausalLM", "NemotronConfig", 4_190_509_056, {  # nvidia/Nemotron-Mini-4B-Instruct
        "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 9216, "num_hidden_layers": 32,
        "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "relu2",
        "max_position_embeddings": 4096, "norm_eps": 1e-5, "attention_bias": False, "mlp_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        "initializer_range": 0.0134, "tie_word_embeddings": False}),
    "deepseek-v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", 671_026_404_352, {  # deepseek-ai/DeepSeek-V3
        "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
        "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True, "hidden_act": "silu",
        "max_position_embeddings": 163840, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "original_max_position_embeddings": 4096},  # beta_fast 32, beta_slow 1: HF's defaults
        "attention_bias": False, "rope_interleave": True, "tie_word_embeddings": False}),
}
_V2_LITE = {  # deepseek-ai/DeepSeek-V2-Lite
    "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
    "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1, "topk_method": "greedy", "num_experts_per_tok": 6,
    "first_k_dense_replace": 1, "norm_topk_prob": False, "hidden_act": "silu", "max_position_embeddings": 163840,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "attention_bias": False, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707,
                        "original_max_position_embeddings": 4096}}  # beta_fast 32, beta_slow 1: HF's defaults
RELEASES["deepseek-v2-lite"] = ("DeepseekV2ForCausalLM", "DeepseekV2Config", 15_706_484_224, _V2_LITE)
RELEASES["deepseek-v2"] = ("DeepseekV2ForCausalLM", "DeepseekV2Config", 235_741_434_880, {  # deepseek-ai/DeepSeek-V2
    **_V2_LITE, "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 60,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 160, "routed_scaling_factor": 16.0,
    "q_lora_rank": 1536, "n_group": 8, "topk_group": 3, "topk_method": "group_limited_greedy"})
RELEASES["qwen3-next-80b-a3b"] = ("Qwen3NextForCausalLM", "Qwen3NextConfig", 79_674_391_296, {  # Qwen/Qwen3-Next-80B-A3B-Instruct
    "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 512,
    "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "decoder_sparse_step": 1, "norm_topk_prob": True, "full_attention_interval": 4, "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False})
NOT_SPEC = {"architectures", "bos_token_id", "eos_token_id", "pad_token_id"}  # token ids are no part of a spec
NOT_SPEC |= {"num_nextn_predict_layers"}  # DeepSeek-V3's MTP module, which zoo does not hold: it writes 0


def release_config(name: str):
    _, config_class, _, fields = RELEASES[name]
    return getattr(transformers, config_class)(**fields)


def unique_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


@pytest.mark.parametrize("name", RELEASES)
def test_release_presets_are_the_hf_configs(name):
    architecture, _, count, _ = RELEASES[name]
    config = release_config(name)
    if name == "gemma-3-1b":  # the release's fields as HF reads them: a rope per layer type, five local per global
        assert config.rope_parameters == {S: {"rope_type": "default", "rope_theta": 10000.0},
                                          F: {"rope_type": "default", "rope_theta": 1e6}}
    with torch.device("meta"):
        ref = getattr(transformers, architecture)(config)
    model = zoo.build(name, device="meta")
    assert zoo.count_parameters(model) == unique_parameters(ref) == count
    assert (model.head.weight is model.tok_emb.weight) == (ref.lm_head.weight is ref.model.embed_tokens.weight)
    assert model.spec.model_dump(exclude={"name"}) == hf_spec(config).model_dump(exclude={"name"})
    back = hf_config(model.spec, architecture)
    assert type(back) is type(config)
    theirs, ours = config.to_dict(), back.to_dict()
    assert {k: v for k, v in ours.items() if k not in NOT_SPEC} == {k: v for k, v in theirs.items() if k not in NOT_SPEC}


# tiny variant: (its release, the class it converts to, the class to_hf picks by default)
TINY = {
    "llama-3.2-tiny": ("llama-3.2-1b", "LlamaForCausalLM", "LlamaForCausalLM"),
    "qwen3-tiny": ("qwen3-0.6b", "Qwen3ForCausalLM", "Qwen3ForCausalLM"),
    "gemma-2-tiny": ("gemma-2-2b", "Gemma2ForCausalLM", "Gemma2ForCausalLM"),
    "gemma-3-tiny": ("gemma-3-1b", "Gemma3ForCausalLM", "Gemma3ForCausalLM"),
    "phi-3-tiny": ("phi-3-mini", "Phi3ForCausalLM", "MistralForCausalLM"),  # without partial rotary, Mistral's function
    "mixtral-tiny": ("mixtral-8x7b", "MixtralForCausalLM", "MixtralForCausalLM"),
    "qwen3-moe-tiny": ("qwen3-30b-a3b", "Qwen3MoeForCausalLM", "Qwen3MoeForCausalLM"),
    "olmoe-tiny": ("olmoe-1b-7b", "OlmoeForCausalLM", "OlmoeForCausalLM"),
    "qwen1.5-moe-tiny": ("qwen1.5-moe-a2.7b", "Qwen2MoeForCausalLM", "Qwen2MoeForCausalLM"),
    "granite-tiny": ("granite-3.3-8b", "GraniteForCausalLM", "GraniteForCausalLM"),
    "smollm3-tiny": ("smollm3-3b", "SmolLM3ForCausalLM", "SmolLM3ForCausalLM"),
    "command-r-tiny": ("command-r-v01", "CohereForCausalLM", "CohereForCausalLM"),
    "olmo-tiny": ("olmo-1b", "OlmoForCausalLM", "OlmoForCausalLM"),
    "nemotron-tiny": ("nemotron-mini-4b", "NemotronForCausalLM", "NemotronForCausalLM"),
    "gpt-oss-tiny": ("gpt-oss-20b", "GptOssForCausalLM", "GptOssForCausalLM"),
    "deepseek-tiny": ("deepseek-v3", "DeepseekV3ForCausalLM", "DeepseekV3ForCausalLM"),
    "deepseek-v2-tiny": ("deepseek-v2", "DeepseekV2ForCausalLM", "DeepseekV2ForCausalLM"),
    "llama4-tiny": ("llama-4-scout-text", "Llama4ForCausalLM", "Llama4ForCausalLM"),
    "qwen3-next-tiny": ("qwen3-next-80b-a3b", "Qwen3NextForCausalLM", "Qwen3NextForCausalLM"),
}
WINDOW = 64
# Qwen3-Next's gated DeltaNet layers amplify (about 5x a layer at scrambled weights) the fp32 rounding that the MoE
# layers before them leave (4e-6 on layer 0's FFN output); each mixer alone matches HF's to 1e-6 on the same input
# (tests/test_deltanet.py), so its logits are held to a 3x looser bound
LOOSER = {"qwen3-next-tiny": 3.0}


def scramble(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights at a scale that keeps activations near 1 through the stack (matrices
    1/sqrt(fan-in), norm weights around 1), so the logits are O(1) and a wrong detail shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:  # [out, in], or stacked experts [E, out, in]
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model.eval()


def same_but_name(a, b) -> bool:
    """The same spec but for its name, with the same layers however the patterns spell them (HF's
    config reads Gemma 3's single global layer of six as ``at: 5``; the tiny preset says "5::6")."""
    return a.model_dump(exclude={"name", "layers"}) == b.model_dump(exclude={"name", "layers"}) and \
        a.stack_layers() == b.stack_layers()


@pytest.mark.parametrize("name", TINY)
def test_tiny_presets_keep_their_release_details(name):
    """Each tiny variant differs from its release in its sizes (widths, heads, layers) and window only,
    and is the spec of its HF config."""
    release = zoo.load_spec(TINY[name][0])
    tiny = zoo.load_spec(name)
    assert (tiny.vocab_size, tiny.max_seq_len) == (8192, 512) and tiny.d_model <= 320 and 4 <= tiny.n_layers <= 6
    a, r = tiny.block.attention, release.block.attention
    assert (a.kind, a.qk_norm, a.softcap, a.bias) == (r.kind, r.qk_norm, r.softcap, r.bias)
    assert (a.window is None) == (r.window is None) and a.window in (None, WINDOW)
    assert tiny.block.kind == release.block.kind and tiny.block.norm == release.block.norm
    f, rf = tiny.block.ffn, release.block.ffn
    assert (f.kind, getattr(f, "bias", None)) == (rf.kind, getattr(rf, "bias", None))
    if rf.kind == "moe":  # the same routing and experts' kind, fewer and narrower experts
        assert f.router == rf.router and f.expert.kind == rf.expert.kind and f.top_k <= rf.top_k < f.n_experts <= rf.n_experts
        assert (f.shared_hidden is None) == (rf.shared_hidden is None) and f.shared_gate == rf.shared_gate
    assert tiny.position == release.position and tiny.embedding == release.embedding
    assert tiny.head == release.head and tiny.dropout == release.dropout and tiny.init == release.init
    assert [layer.at for layer in tiny.layers] == [layer.at for layer in release.layers]
    assert [layer.position for layer in tiny.layers] == [layer.position for layer in release.layers]
    config = hf_config(tiny, TINY[name][1])
    assert same_but_name(hf_spec(config), tiny)
    assert hf_config(tiny).architectures == [TINY[name][2]]


def tokens(batch: int, length: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow
@pytest.mark.parametrize("name", TINY)
def test_tiny_presets_convert_to_hf_and_decode_the_same(name):
    architecture = TINY[name][1]
    model = scramble(zoo.build(name))
    hf = to_hf(model, architecture).eval()
    hf.config._attn_implementation = "eager"  # Gemma 2 soft-caps only there
    assert type(hf).__name__ == architecture and same_but_name(hf_spec(hf.config), model.spec)
    V, length = model.spec.vocab_size, WINDOW + 19
    x = tokens(2, length, V)
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, :7] = False
    with torch.no_grad():
        logits = model(x)
        head = model.spec.head  # a head scaling its logits (Cohere: 1/16) scales what O(1) and the tolerance mean
        unit = (head.scale or 1.0) / (head.divisor or 1.0)
        assert logits.abs().max() > unit  # O(1) logits: the tolerance below is a real test
        tol = max(ATOL * unit, 2e-5 * logits.abs().max().item())  # fp32 rounding grows with the logits (Gemma's reach ~10)
        tol *= LOOSER.get(name, 1.0)
        assert max_diff(logits, hf(x).logits) < tol
        ref = hf(x, attention_mask=mask, position_ids=positions(mask)).logits
        assert max_diff(model(x, mask), ref, mask) < tol

    # greedy decoding through zoo's KV cache equals HF's generate, past the window: prompt 60 + 12 new
    hf.generation_config.eos_token_id = None
    prompt = tokens(2, WINDOW - 4, V, seed=3)
    ours = zoo.generate(model, prompt, max_new_tokens=12).tokens
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs[:, prompt.shape[1]:])


# ------------------------------------------------------------------------------ T5 encoder-decoders
T5_RELEASES = {  # the released configs' fields (config.json on the Hub) and parameter counts
    "t5-small": (60_506_624, {  # google-t5/t5-small: v1.0, ReLU, the head tied (and its input scaled)
        "vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
        "n_positions": 512, "relative_attention_num_buckets": 32, "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6,
        "initializer_factor": 1.0, "feed_forward_proj": "relu", "decoder_start_token_id": 0}),
    "flan-t5-base": (247_577_856, {  # google/flan-t5-base: v1.1, gated GELU, an untied head
        "vocab_size": 32128, "d_model": 768, "d_kv": 64, "d_ff": 2048, "num_layers": 12, "num_decoder_layers": 12,
        "num_heads": 12, "n_positions": 512, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
        "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6, "initializer_factor": 1.0, "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False, "decoder_start_token_id": 0}),
}
T5_TINY = {"t5-tiny": "t5-small", "flan-t5-tiny": "flan-t5-base"}


@pytest.mark.parametrize("name", T5_RELEASES)
def test_t5_presets_are_the_hf_configs(name):
    """The parameter count of the HF class built from the release's config, on the meta device: the
    head counted apart where the release holds its own (transformers 5 ties it at construction and
    unties it when from_pretrained reads two different matrices)."""
    count, fields = T5_RELEASES[name]
    config = transformers.T5Config(**fields)
    with torch.device("meta"):
        ref = transformers.T5ForConditionalGeneration(config)
    untied = fields.get("tie_word_embeddings") is False
    model = zoo.build(name, device="meta")
    assert zoo.count_parameters(model) == unique_parameters(ref) + untied * ref.lm_head.weight.numel() == count
    assert (model.head.weight is model.tgt_emb.weight) != untied and model.src_emb is model.tgt_emb
    assert model.spec.model_dump(exclude={"name"}) == hf_spec(config).model_dump(exclude={"name"})
    theirs, ours = config.to_dict(), hf_config(model.spec).to_dict()
    assert {k: v for k, v in ours.items() if k not in NOT_SPEC} == {k: v for k, v in theirs.items() if k not in NOT_SPEC}


@pytest.mark.slow
@pytest.mark.parametrize("name", T5_TINY)
def test_tiny_t5_presets_convert_to_hf_and_decode_the_same(name):
    """Its release's details at smaller sizes; at random init the same logits as HF (a padded source)
    and the same greedy decoding through the cache (tests/test_t5.py reaches past the last bucket)."""
    release, tiny = zoo.load_spec(T5_TINY[name]), zoo.load_spec(name)
    for field in ("position", "embedding", "head", "dropout", "share_embeddings"):
        assert getattr(tiny, field) == getattr(release, field), field
    b, rb = tiny.block, release.block
    assert (b.kind, b.norm, b.ffn.kind, b.ffn.bias, b.attention.bias, b.attention.scale_dim) == \
        (rb.kind, rb.norm, rb.ffn.kind, rb.ffn.bias, rb.attention.bias, rb.attention.scale_dim)
    model = scramble(zoo.build(name))
    with torch.no_grad():  # queries 1/sqrt(d_kv) smaller, as T5's init has them: T5 does not scale the scores
        for block in [*model.encoder.blocks, *model.decoder.blocks]:
            block.attn.qkv.weight[: block.attn.splits[0]] /= block.attn.head_dim**0.5
            if block.cross_attn is not None:
                block.cross_attn.q.weight /= block.attn.head_dim**0.5
    hf = to_hf(model).eval()
    assert type(hf).__name__ == "T5ForConditionalGeneration"
    assert hf_spec(hf.config).model_dump(exclude={"name"}) == model.spec.model_dump(exclude={"name"})
    V = model.spec.vocab_size
    src, tgt = tokens(2, 40, V), tokens(2, 30, V, seed=2)
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[1, 25:] = False
    with torch.no_grad():
        logits = model(src, tgt, mask)
        assert logits.abs().max() > 0.1  # t5-tiny's head input is 1/16 of the decoder's output
        theirs = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
        assert max_diff(logits, theirs) < max(ATOL, 2e-5 * logits.abs().max().item())
    ours = zoo.generate(model, src, padding_mask=mask, num_beams=1, max_new_tokens=8, bos_id=0).tokens
    theirs = hf.generate(src, attention_mask=mask.long(), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours, theirs[:, 1:])
