"""Mixture-of-experts rows: HF ``MixtralForCausalLM`` against zoo's equivalent decoder (``ffn.kind:
moe``), the same config and weights, with HF's experts implementations side by side.

zoo's spec is written here from the Mixtral config (RoPE, RMSNorm, GQA, swiglu experts under a
softmax-then-top-k router) and the weights copied by name; :func:`pair` checks that both compute the
same logits before anything is timed. HF's ``experts_implementation`` options that run on a CPU are
``grouped_mm`` (its default: ``torch.nn.functional.grouped_mm``, whose inputs it casts to the
weights' dtype, so under bf16 autocast its experts compute in fp32), ``eager`` (a Python loop over
the experts that have tokens) and ``batched_mm`` (each routed token gathers its expert's weights:
top_k x 3 x D x F elements per token, 15 GB for one training step of this model, so it is timed
only where few tokens pass: decoding). FLOPs are active FLOPs (each token's top_k experts), counted
by zoo's summary (:func:`zoo.summary.forward_flops`): torch's FLOP counter does not see grouped_mm.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import zoo
import zoo.train as T
from bench.common import Row, Side, compare, here
from bench.workloads import _train_step
from zoo.summary import forward_flops

Timing = dict

IMPLEMENTATIONS = {"train": ("grouped_mm", "eager"), "infer": ("grouped_mm", "eager"),
                   "greedy": ("grouped_mm", "eager", "batched_mm")}


def config(tiny: bool = False):
    """The HF config: Mixtral's shape at 1/8 of its width and 4 layers (expert hidden 3.5 x d_model,
    heads of 64, GQA 8/2, Mixtral's 32k vocabulary)."""
    from transformers import MixtralConfig

    size = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4} if tiny else {
        "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1792, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "num_local_experts": 8}
    return MixtralConfig(num_experts_per_tok=2, max_position_embeddings=4096, attn_implementation="sdpa",
                         tie_word_embeddings=False, **size)


def zoo_spec(c) -> dict:
    """zoo's decoder spec of a MixtralConfig, field by field."""
    return {
        "family": "decoder", "vocab_size": c.vocab_size, "max_seq_len": c.max_position_embeddings,
        "d_model": c.hidden_size, "n_layers": c.num_hidden_layers,
        "head": {"kind": "lm", "bias": False, "tied": c.tie_word_embeddings},
        "embedding": {"scale": False, "norm": False},
        "position": {"kind": "rope", "base": c.rope_parameters["rope_theta"]},
        "block": {
            "kind": "pre",
            "norm": {"kind": "rmsnorm", "eps": c.rms_norm_eps},
            "attention": {"kind": "gqa", "n_heads": c.num_attention_heads, "n_kv_heads": c.num_key_value_heads,
                          "bias": False, "window": c.sliding_window},
            "ffn": {"kind": "moe", "n_experts": c.num_local_experts, "top_k": c.num_experts_per_tok,
                    "expert": {"kind": "swiglu", "hidden": c.intermediate_size},
                    "router": {"softmax_before_topk": True, "norm_topk_prob": True, "jitter": c.router_jitter_noise,
                               "aux_loss_coef": c.router_aux_loss_coef}},
        },
        "dropout": {"attention": c.attention_dropout},
    }


def copy_weights(ours: nn.Module, peer: nn.Module) -> None:
    """HF Mixtral's tensors into zoo's model, by name."""
    hf = dict(peer.named_parameters())
    mapping = {"tok_emb.weight": "model.embed_tokens.weight", "stack.norm.weight": "model.norm.weight",
               "head.weight": "lm_head.weight"}
    for i in range(peer.config.num_hidden_layers):
        z, h = f"stack.blocks.{i}", f"model.layers.{i}"
        mapping.update({f"{z}.attn_norm.weight": f"{h}.input_layernorm.weight",
                        f"{z}.attn.out.weight": f"{h}.self_attn.o_proj.weight",
                        f"{z}.ffn_norm.weight": f"{h}.post_attention_layernorm.weight",
                        f"{z}.ffn.router.weight": f"{h}.mlp.gate.weight",
                        f"{z}.ffn.w_gate_up": f"{h}.mlp.experts.gate_up_proj",
                        f"{z}.ffn.w_down": f"{h}.mlp.experts.down_proj"})
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith(".attn.qkv.weight"):
                h = name.replace("stack.blocks.", "model.layers.").replace(".attn.qkv.weight", ".self_attn")
                p.copy_(torch.cat([hf[f"{h}.{x}_proj.weight"] for x in "qkv"]))
            else:
                p.copy_(hf[mapping[name]])


def pair(tiny: bool = False) -> tuple[nn.Module, dict[str, nn.Module]]:
    """zoo's model and HF's, one per experts implementation, all with the same weights; checked to
    compute the same logits."""
    from transformers import MixtralForCausalLM

    torch.manual_seed(0)
    peer = MixtralForCausalLM(config(tiny))
    ours = zoo.build(zoo.parse_spec(zoo_spec(peer.config)), seed=0)
    copy_weights(ours, peer)
    peers = {}
    for impl in ("grouped_mm", "eager", "batched_mm"):
        m = copy.deepcopy(peer)
        m.set_experts_implementation(impl)
        peers[impl] = m
    tokens = torch.randint(0, peer.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1),
                           device="cpu").to(here())
    with torch.no_grad():
        ours.eval()
        want = ours(tokens).float()
        for impl, m in peers.items():
            got = m.eval()(input_ids=tokens).logits.float()
            assert (got - want).abs().max() < 1e-3 * want.abs().max(), f"zoo and HF ({impl}) disagree"
    return ours, peers


def _side(impl: str) -> str:
    return f"HF {impl}"


def _name(spec) -> str:
    ffn = spec.block.ffn
    return f"Mixtral-style {spec.n_layers}L/{spec.d_model} {ffn.n_experts} experts top-{ffn.top_k}"


def train(precision: str, timing: Timing, *, batch: int = 4, seq: int = 256, tiny: bool = False) -> Row:
    """A causal-LM training step (forward, backward, AdamW step), no router loss on either side (HF
    Mixtral adds it only with output_router_logits)."""
    if tiny:
        batch, seq = 2, 16
    ours, peers = pair(tiny)
    tokens = torch.randint(0, ours.spec.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0),
                           device="cpu").to(here())

    labels = F.pad(tokens[:, 1:], (0, 1), value=-100).flatten()  # HF's loss: labels shifted, not logits

    def ours_loss():
        return F.cross_entropy(ours(tokens).flatten(0, 1).float(), labels, ignore_index=-100)

    def peer_loss(m):
        return lambda: m(input_ids=tokens, labels=tokens).loss

    ours.train()
    sides = [Side("zoo", _train_step(ours, ours_loss, T.build_optimizer(
        ours, T.OptimConfig(name="adamw", lr=1e-4, weight_decay=0.05)), precision))]
    for impl in IMPLEMENTATIONS["train"]:
        m = peers[impl].train()
        sides.append(Side(_side(impl), _train_step(m, peer_loss(m), torch.optim.AdamW(
            m.parameters(), lr=1e-4, weight_decay=0.05), precision)))
    row = Row(workload=f"{_name(ours.spec)} train", precision=precision, unit="tokens", work=batch * seq)
    row.flops = 3 * batch * forward_flops(ours, seq)
    row.seconds, row.spread = compare(sides, **timing)
    return row


def infer(precision: str, timing: Timing, *, batch: int = 4, seq: int = 256, tiny: bool = False) -> Row:
    """A forward pass over full sequences under inference_mode (logits of every position)."""
    if tiny:
        batch, seq = 2, 16
    ours, peers = pair(tiny)
    tokens = torch.randint(0, ours.spec.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0),
                           device="cpu").to(here())

    def step(fn):
        def run():
            with torch.inference_mode(), T.autocast(here(), precision):
                fn()
        return run

    sides = [Side("zoo", step(lambda: ours(tokens)))]
    for impl in IMPLEMENTATIONS["infer"]:
        m = peers[impl]
        sides.append(Side(_side(impl), step(lambda m=m: m(input_ids=tokens, use_cache=False).logits)))
    row = Row(workload=f"{_name(ours.spec)} infer", precision=precision, unit="tokens", work=batch * seq)
    row.flops = batch * forward_flops(ours, seq)
    row.seconds, row.spread = compare(sides, **timing)
    return row


def greedy(precision: str, timing: Timing, *, batch: int = 4, prompt: int = 16, new_tokens: int = 64,
           tiny: bool = False) -> Row:
    """Greedy decoding of ``new_tokens`` (no early stop) with a KV cache: zoo.generate vs HF generate."""
    if tiny:
        batch, new_tokens = 2, 6
    ours, peers = pair(tiny)
    ids = torch.randint(0, ours.spec.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0),
                        device="cpu").to(here())

    def zoo_step():
        with T.autocast(here(), precision):
            out = zoo.generate(ours, ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_id=None)
        assert out.tokens.shape[1] >= new_tokens

    def hf_step(m):
        def run():
            with torch.inference_mode(), T.autocast(here(), precision):
                out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            assert out.shape[1] == prompt + new_tokens
        return run

    sides = [Side("zoo", zoo_step)] + [Side(_side(impl), hf_step(peers[impl])) for impl in IMPLEMENTATIONS["greedy"]]
    row = Row(workload=f"{_name(ours.spec)} greedy b{batch}", precision=precision, unit="tokens", work=batch * new_tokens)
    row.seconds, row.spread = compare(sides, **timing)
    return row


def rows(precision: str, timing: Timing, tiny: bool = False) -> list[Row]:
    """Training, a forward pass and greedy decoding in ``precision``."""
    return [train(precision, timing, tiny=tiny), infer(precision, timing, tiny=tiny),
            greedy(precision, timing, tiny=tiny)]
