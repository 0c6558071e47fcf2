"""The mixture-of-experts decoders against HF at random init, with odd sizes no preset has: Mixtral
(a sliding window), Qwen2-MoE (shared expert, q/k/v biases, a dense layer by ``mlp_only_layers``, a
sliding layer), Qwen3-MoE (qk-norm per head, dense layers by ``decoder_sparse_step``) and OLMoE
(qk-norm over the whole projections).

Each, in a variant beside the conformance table's config of its class, goes through the conformance
suite's checks (the same logits both ways, padded or not; every tensor back; greedy decoding as HF's
``generate``), writes back HF's config field for field, and gives HF's load-balancing loss from its
router logits. On disk,
the layout of downloaded checkpoints (each expert's matrices apart, written here by hand) converts
with ``zoo convert`` both ways, streaming, and what zoo writes is what ``save_pretrained`` writes
and ``from_pretrained`` loads.
"""

from __future__ import annotations

import json

import pytest
import torch
from conformance_checks import check_greedy, check_outputs, check_round_trip
from conftest import max_diff, positions, randomize

import zoo
from zoo.components.moe import MoE, load_balancing_loss
from zoo.interop import ConversionError, from_hf, hf_config, hf_spec, to_hf
from zoo.interop.files import convert
from zoo.spec.moe import MoESpec

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]
ATOL = 1e-4
V = 97
SIZES = dict(vocab_size=V, max_position_embeddings=64, hidden_size=36, num_attention_heads=6, num_key_value_heads=2,
             num_experts_per_tok=2)
CONFIGS = {  # class -> (config class, fields)
    "MixtralForCausalLM": ("MixtralConfig", dict(SIZES, num_hidden_layers=2, intermediate_size=20, num_local_experts=5,
                                                 sliding_window=5, router_jitter_noise=0.1, router_aux_loss_coef=0.02)),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", dict(SIZES, num_hidden_layers=3, intermediate_size=30, moe_intermediate_size=20,
                                                   shared_expert_intermediate_size=24, num_experts=5, mlp_only_layers=[1],
                                                   use_sliding_window=True, sliding_window=5, max_window_layers=2)),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", dict(SIZES, num_hidden_layers=3, head_dim=8, intermediate_size=30,
                                                   moe_intermediate_size=20, num_experts=5, decoder_sparse_step=2,
                                                   norm_topk_prob=True, attention_bias=True, router_aux_loss_coef=0.05)),
    "OlmoeForCausalLM": ("OlmoeConfig", dict(SIZES, num_hidden_layers=2, intermediate_size=20, num_experts=5)),
}
# Qwen3-Next: its MoE blocks (a gated shared expert, a dense layer) beside gated DeltaNet and gated attention layers
CONFIGS["Qwen3NextForCausalLM"] = ("Qwen3NextConfig", dict(
    SIZES, num_hidden_layers=3, head_dim=8, intermediate_size=30, moe_intermediate_size=20, shared_expert_intermediate_size=24,
    num_experts=5, mlp_only_layers=[2], layer_types=["linear_attention", "full_attention", "linear_attention"],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=6, linear_value_head_dim=5,
    linear_conv_kernel_dim=3, router_aux_loss_coef=0.05))
BACKBONES = {"MixtralModel": "MixtralForCausalLM", "Qwen2MoeModel": "Qwen2MoeForCausalLM",
             "Qwen3MoeModel": "Qwen3MoeForCausalLM", "OlmoeModel": "OlmoeForCausalLM"}


def hf_model(name: str, seed: int = 0) -> torch.nn.Module:
    config_class, fields = CONFIGS[BACKBONES.get(name, name)]
    config = getattr(transformers, config_class)(**fields)
    return randomize(getattr(transformers, name)(config), seed)


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def left_padding(batch: int, length: int) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, :4] = False
    return mask


def router_logits(model: torch.nn.Module, *args) -> list[torch.Tensor]:
    """The router logits [B*T, E] of each MoE layer of ``model``'s forward on ``args``, in order."""
    found, hooks = [], [m.router.register_forward_hook(lambda mod, inp, out: found.append(out))
                        for m in model.modules() if isinstance(m, MoE)]
    with torch.no_grad():
        model(*args)
    for h in hooks:
        h.remove()
    return found


@pytest.mark.parametrize("name", CONFIGS)
def test_converts_both_ways_with_the_same_logits_decoding_config_and_router_loss(name):
    hf = hf_model(name)
    model = from_hf(hf)
    spec = model.spec

    # the layers HF builds sparse are zoo's moe layers, the others a dense gated FFN
    sparse = [type(layer.mlp).__name__.endswith("SparseMoeBlock") for layer in hf.model.layers]
    assert [isinstance(layer.block.ffn, MoESpec) for layer in spec.stack_layers()] == sparse
    assert not all(sparse) or name in ("MixtralForCausalLM", "OlmoeForCausalLM")

    # the conformance suite's checks (tests/conformance_checks.py): the same logits both ways, padded or
    # not; every tensor back to the class named; cached greedy decoding, unpadded and left-padded
    check_outputs(hf)
    check_round_trip(hf)
    check_greedy(hf)
    back = to_hf(model)
    assert type(back).__name__ == name
    ours, original = back.config.to_dict(), hf.config.to_dict()
    skip = {"architectures", "bos_token_id", "eos_token_id", "pad_token_id", "max_window_layers"}  # the last: layer_types say
    assert {k: v for k, v in ours.items() if k not in skip} == {k: v for k, v in original.items() if k not in skip}

    x, mask = tokens(2, 11), left_padding(2, 11)
    # HF's aux_loss is load_balancing_loss over the same router logits; its loss adds it times the coefficient
    moe = next(layer.block.ffn for layer in spec.stack_layers() if isinstance(layer.block.ffn, MoESpec))
    pos = positions(mask)
    with torch.no_grad():
        out = hf(x, attention_mask=mask, position_ids=pos, labels=x, output_router_logits=True)
        ce = hf(x, attention_mask=mask, position_ids=pos, labels=x).loss
    logits_per_layer = router_logits(model, x, mask)
    assert len(logits_per_layer) == len(out.router_logits) == sum(sparse)
    aux = load_balancing_loss(logits_per_layer, moe.top_k, moe.n_experts, mask)
    assert abs(float(aux) - float(out.aux_loss)) < 1e-5
    assert moe.router.aux_loss_coef == hf.config.router_aux_loss_coef
    assert abs(float(moe.router.aux_loss_coef * aux) - float(out.loss - ce)) < 1e-5
    unpadded = load_balancing_loss(router_logits(model, x), moe.top_k, moe.n_experts)
    with torch.no_grad():
        assert abs(float(unpadded) - float(hf(x, output_router_logits=True).aux_loss)) < 1e-5


# ---------------------------------------------------------------------------------------------- on disk
def downloaded_layout(hf: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``hf``'s tensors named as the released checkpoints name them: each expert's gate, up and down
    matrices apart (Mixtral: w1, w3, w2 under block_sparse_moe), tied tensors once."""
    mixtral = "Mixtral" in type(hf).__name__
    module, gate, up, down = ("block_sparse_moe", "w1", "w3", "w2") if mixtral else ("mlp", "gate_proj", "up_proj", "down_proj")
    out = {}
    for key, t in hf.state_dict().items():
        if key == "lm_head.weight" and hf.config.tie_word_embeddings:
            continue
        layer, _, rest = key.partition(".mlp.")
        if not rest:
            out[key] = t.clone()
        elif rest == "experts.gate_up_proj":  # [E, 2F, D]: per expert [gate | up]
            gates, ups = t.chunk(2, dim=1)
            for e in range(t.shape[0]):
                out[f"{layer}.{module}.experts.{e}.{gate}.weight"] = gates[e].clone()
                out[f"{layer}.{module}.experts.{e}.{up}.weight"] = ups[e].clone()
        elif rest == "experts.down_proj":  # [E, D, F]
            for e, d in enumerate(t.unbind(0)):
                out[f"{layer}.{module}.experts.{e}.{down}.weight"] = d.clone()
        else:
            out[f"{layer}.{module}.{rest}"] = t.clone()
    return out


def write_checkpoint(hf: torch.nn.Module, directory, *, bin_file: bool = False) -> dict[str, torch.Tensor]:
    from safetensors.torch import save_file

    state = downloaded_layout(hf)
    directory.mkdir()
    hf.config.architectures = [type(hf).__name__]  # as save_pretrained writes it
    hf.config.save_pretrained(str(directory))
    if bin_file:
        torch.save(state, directory / "pytorch_model.bin")
    else:
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return state


def hf_names(directory) -> set[str]:
    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        return set(f.keys())


def output(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        y = model(x)
    return y if isinstance(y, torch.Tensor) else y.logits if "logits" in y else y.last_hidden_state


@pytest.mark.parametrize("name", [*CONFIGS, "MixtralModel", "Qwen2MoeModel"])
def test_checkpoints_in_the_downloaded_layout_convert_both_ways(name, tmp_path):
    hf = hf_model(name, seed=1)
    state = write_checkpoint(hf, tmp_path / "hf")
    assert any(".experts.0." in key for key in state)
    cls = getattr(transformers, name)
    x = tokens(2, 9)
    ref = output(hf, x)
    # the layout HF reads (two HF instances with equal tensors can differ in the last bit: seen with
    # Qwen2MoeModel's grouped experts on the CPU; the tensors are compared exactly below)
    assert max_diff(output(cls.from_pretrained(str(tmp_path / "hf")).eval(), x), ref) < 1e-6
    hf.save_pretrained(str(tmp_path / "saved"))
    assert hf_names(tmp_path / "saved") == set(state)  # and writes

    done = convert(tmp_path / "hf", tmp_path / "m.safetensors")
    assert done.reference == name and done.ignored == ()
    model = zoo.load(done.path).eval()
    assert max_diff(output(model, x), ref) < ATOL

    written = convert(done.path, tmp_path / "back", max_shard_size="16KB")  # sharded: each expert's matrices apart
    assert written.reference == name and written.parameters == sum(p.numel() for p in hf.parameters())
    assert (tmp_path / "back" / "model.safetensors.index.json").is_file() and hf_names(tmp_path / "back") == set(state)
    loaded = cls.from_pretrained(str(tmp_path / "back")).eval()
    assert all(torch.equal(t, loaded.state_dict()[k]) for k, t in hf.state_dict().items())
    assert max_diff(output(loaded, x), ref) < 1e-6


def test_a_whole_checkpoint_in_pytorch_model_bin_converts(tmp_path):
    hf = hf_model("MixtralForCausalLM", seed=2)
    write_checkpoint(hf, tmp_path / "hf", bin_file=True)
    done = convert(tmp_path / "hf", tmp_path / "m.safetensors")  # read whole by from_pretrained
    x = tokens(2, 9)
    assert max_diff(output(zoo.load(done.path).eval(), x), output(hf, x)) < ATOL


def test_a_checkpoint_of_fused_experts_converts_and_one_missing_an_expert_is_refused_by_name(tmp_path):
    from safetensors.torch import save_file

    hf = hf_model("OlmoeForCausalLM")
    state = write_checkpoint(hf, tmp_path / "hf")
    fused = tmp_path / "fused"  # HF 5.x's module names: gate_up_proj [E, 2F, D], down_proj [E, D, F]
    fused.mkdir()
    hf.config.save_pretrained(str(fused))
    save_file({k: t.contiguous() for k, t in hf.state_dict().items()}, str(fused / "model.safetensors"), metadata={"format": "pt"})
    x = tokens(2, 9)
    assert max_diff(output(zoo.load(convert(fused, tmp_path / "f.safetensors").path).eval(), x), output(hf, x)) < ATOL
    del state["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(state, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConversionError, match=r"model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight"):
        convert(tmp_path / "hf", tmp_path / "m.safetensors")


# ------------------------------------------------------------------------------------ dense and MoE layers
@pytest.mark.parametrize("moe_layers,step,mlp_only", [([1, 3], 2, []), ([0, 2], 1, [1, 3]), ([3], 4, []), ([0, 1, 2, 3], 1, [])])
def test_any_arrangement_of_moe_layers_writes_qwen_fields_and_reads_back(moe_layers, step, mlp_only):
    base = hf_spec(getattr(transformers, "Qwen3MoeConfig")(**CONFIGS["Qwen3MoeForCausalLM"][1])).model_dump(mode="json")
    dense = [i for i in range(4) if i not in moe_layers]
    base.update(n_layers=4, layers=[{"at": dense, "block": {"ffn": {"kind": "swiglu", "hidden": 30, "bias": False}}}] if dense else [])
    spec = zoo.parse_spec(base)
    config = hf_config(spec, "Qwen3MoeForCausalLM")
    assert (config.decoder_sparse_step, config.mlp_only_layers) == (step, mlp_only)
    assert hf_spec(config).stack_layers() == spec.stack_layers()
    with torch.device("meta"):
        ref = transformers.Qwen3MoeForCausalLM(config)
    assert [i for i, layer in enumerate(ref.model.layers) if hasattr(layer.mlp, "experts")] == moe_layers


def test_a_dense_model_block_with_moe_layers_converts_as_the_reverse_pattern():
    moe = hf_spec(getattr(transformers, "Qwen2MoeConfig")(**CONFIGS["Qwen2MoeForCausalLM"][1]))
    data = moe.model_dump(mode="json")
    dense = data["layers"][-1]["block"]["ffn"]
    data["block"]["ffn"], data["layers"] = dense, [*data["layers"][:-1], {"at": [0, 2], "block": {"ffn": moe.block.ffn.model_dump(mode="json")}}]
    spec = zoo.parse_spec(data)
    assert spec.stack_layers() == moe.stack_layers()
    assert hf_config(spec).to_dict() == hf_config(moe).to_dict()


@pytest.mark.parametrize("name,fields,option", [
    ("OlmoeForCausalLM", {"clip_qkv": 8.0}, "clip_qkv"),
    ("Qwen2MoeForCausalLM", {"num_experts": 0}, "num_experts"),
    ("Qwen3MoeForCausalLM", {"mlp_only_layers": [0, 1, 2]}, "mlp_only_layers"),
    ("Qwen3MoeForCausalLM", {"decoder_sparse_step": 4}, "decoder_sparse_step"),
    ("MixtralForCausalLM", {"hidden_act": "relu"}, "hidden_act"),
])
def test_configs_zoo_cannot_express_are_refused_by_name(name, fields, option):
    config_class, base = CONFIGS[name]
    with pytest.raises(ConversionError, match=rf"{option}="):
        hf_spec(getattr(transformers, config_class)(**{**base, **fields}))


def test_dense_layers_the_config_cannot_write_are_refused_by_name():
    spec = hf_spec(getattr(transformers, "Qwen3MoeConfig")(**CONFIGS["Qwen3MoeForCausalLM"][1]))
    geglu = zoo.parse_spec({**spec.model_dump(mode="json"), "layers": [{"at": 0, "block": {"ffn": {"kind": "geglu", "hidden": 30, "bias": False}}}]})
    with pytest.raises(ConversionError, match=r"layers=\"layer 0's ffn\".*experts' activation \(swiglu\)"):
        hf_config(geglu)
    two = zoo.parse_spec({**spec.model_dump(mode="json"), "layers": [{"at": 0, "block": {"ffn": {"kind": "swiglu", "hidden": 30, "bias": False}}},
                                                                      {"at": 2, "block": {"ffn": {"kind": "swiglu", "hidden": 40, "bias": False}}}]})
    with pytest.raises(ConversionError, match=r"layers=\[30, 40\].*one intermediate_size"):
        hf_config(two)
