"""Two-way converters between zoo and HF transformers, exact in both directions.

    from_hf(hf_model) -> zoo model          to_hf(zoo_model, architecture=None, **config) -> HF model
    hf_spec(config)   -> zoo spec           hf_config(spec, architecture=None, **config) -> HF config

Reference classes (``ARCHITECTURES``): ``GPT2LMHeadModel`` (zoo decoder, learned positions,
LayerNorm), ``LlamaForCausalLM`` (zoo decoder: RoPE in the rotate-half layout, RMSNorm, gated FFN,
MHA/GQA/MQA), ``BertForMaskedLM`` (zoo encoder, Post-Norm, MLM head), ``MarianMTModel`` (zoo
encoder-decoder: Post-Norm, sinusoidal positions in the concat layout, scaled embeddings), and the
LLaMA-like decoders ``MistralForCausalLM`` (sliding-window attention), ``Qwen2ForCausalLM`` (q/k/v
biases, none on the output), ``GemmaForCausalLM`` (scaled embeddings, (1 + w) RMSNorm, its own
head size), ``Olmo2ForCausalLM`` (qk-norm, norms after each sub-layer), ``Qwen3ForCausalLM``
(per-head qk-norm, its own head size, per-layer windows) ``Phi3ForCausalLM`` (fused ``qkv_proj``
and ``gate_up_proj``, partial rotary), ``Gemma2ForCausalLM`` (sandwich norms, soft-capped attention
and final logits, ``query_pre_attn_scalar``, local and global layers), ``Gemma3ForCausalLM`` (as
Gemma 2 with a (1 + w) qk-norm per head and a RoPE base per layer type), ``GPTNeoXForCausalLM`` (Pythia: partial rotary, parallel
attention and FFN, LayerNorm), and the mixtures of experts (:mod:`zoo.interop.hf.moe`: ``ffn.kind:
moe``) ``MixtralForCausalLM``, ``Qwen2MoeForCausalLM`` (a shared expert, dense layers),
``Qwen3MoeForCausalLM`` (per-head qk-norm, dense layers) and ``OlmoeForCausalLM`` (qk-norm over the
whole projections). Each decoder class's backbone without its head (``GPT2Model``,
``LlamaModel``, ..., ``OlmoeModel``: :class:`~zoo.interop.hf.base.Headless`) converts to and from a
zoo decoder with ``head: none``, and ``BertModel`` (BERT's backbone, with or without its pooler) to
and from a zoo encoder with ``head: none`` (and ``pooler: true`` where it has one). A decoder converts by default to the first of these that
expresses it (the backbones come last, and take the decoders without a head).
Every rotary one carries RoPE scaling (``rope_parameters`` <-> ``position.scaling``,
:mod:`zoo.interop.hf.rope`).

The spec is read from the reference's config (and the config written from the spec); tensors are
then mapped by name (:mod:`zoo.interop.common`). Tying is read from the model itself, because HF
decides it from several config fields. Anything the target cannot express raises
:class:`ConversionError` naming the option. transformers is imported only when a converter runs.
"""

from zoo.interop.hf.convert import ARCHS, by_model_type, from_hf, hf_config, hf_spec, to_hf
from zoo.interop.hf.marian import permute_model_dim

__all__ = ["ARCHS", "by_model_type", "from_hf", "hf_config", "hf_spec", "permute_model_dim", "to_hf"]
