"""LoRA (zoo.finetune): what an adapted model computes, what trains, merging, adapter files.

Truths used: the model before adapting (B starts at zero), the weight update written out by hand per
slice of a fused projection (W[rows] + scale * B @ A), HF's model converted from the merged one, the
eager step for the compiled one, and the base tensors' bytes before training.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import example_inputs, tiny_spec
from pydantic import ValidationError
from safetensors import safe_open

import zoo
import zoo.train as T
from zoo.finetune import (ADAPTERS, LoraLinear, LoraSpec, adapt, adapter_spec, apply_lora, base_hash, has_lora,
                          load_adapters, lora_parameters, merge_lora, save_adapters)
from zoo.io import LoadError

# GQA 4/2 (q rows 32, k and v rows 16 each), a gated FFN, RoPE, an untied head
DECODER = ["d_model=32", "n_layers=2", "block.attention.n_heads=4", "block.attention.n_kv_heads=2",
           "block.ffn.hidden=40", "vocab_size=61", "max_seq_len=32", "block.attention.window=null"]
ENCODER = ["classifier.num_labels=3"]
ALL = ("q", "k", "v", "o", "ffn")


def decoder(seed: int = 0, extra: list[str] = ()):
    return zoo.build(zoo.load_spec("mistral-tiny", DECODER + list(extra)), seed=seed)


def encoder(seed: int = 0):
    return zoo.build(tiny_spec("encoder", ENCODER), seed=seed)


MODELS = {"decoder": decoder, "encoder": encoder, "encoder_decoder": lambda seed=0: zoo.build(tiny_spec("encoder_decoder"), seed=seed)}


def outputs(model, seed: int = 0):
    ins = example_inputs(model, seed=seed)
    return model.classify(*ins) if getattr(model, "classifier", None) is not None else model(*ins)


def nudge(model, seed: int = 1):
    """Every adapter's B random (it starts at zero), so the adapters change the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora_parameters(model).items():
            if ".lora_b." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def test_outputs_are_unchanged_at_init_and_adapters_sit_where_the_targets_say():
    model = decoder().eval()
    before = outputs(model)
    apply_lora(model, LoraSpec(rank=4, targets=ALL))
    assert torch.equal(outputs(model), before)  # B = 0: the update adds exact zeros
    attn, ffn = model.stack.blocks[0].attn, model.stack.blocks[0].ffn
    assert attn.qkv.slices == {"q": (0, 32), "k": (32, 48), "v": (48, 64)} and attn.out.slices == {"all": (0, 32)}
    assert ffn.fc1.slices == {"gate": (0, 40), "up": (40, 80)} and ffn.fc2.slices == {"all": (0, 32)}
    assert not isinstance(model.head, LoraLinear) and model.adapter.rank == 4


def test_only_adapters_and_the_named_parameters_require_grad():
    model = apply_lora(encoder(), LoraSpec(rank=2, targets=("q", "v"), trainable=("classifier",)))
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    adapters = set(lora_parameters(model))
    assert adapters and all(".attn.qkv.lora_" in n for n in adapters)
    assert trains == adapters | {n for n, _ in model.named_parameters() if n.startswith("classifier.")}


def test_optimizer_steps_change_only_the_adapters_and_the_trainable_head():
    model = apply_lora(encoder(), LoraSpec(rank=2, alpha=4, targets=ALL, trainable=("classifier",))).train()
    frozen = {n: t.clone() for n, t in model.state_dict().items() if "lora_" not in n and not n.startswith("classifier.")}
    trained = {n: t.clone() for n, t in model.state_dict().items() if n not in frozen}
    optimizer = T.build_optimizer(model, T.OptimConfig(lr=1e-2, weight_decay=0.1))
    tokens, labels = example_inputs(model)[0], torch.tensor([0, 1, 2])
    for _ in range(3):
        F.cross_entropy(model.classify(tokens), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    state = model.state_dict()
    assert all(torch.equal(state[n], t) for n, t in frozen.items())  # bit for bit
    assert all(not torch.equal(state[n], t) for n, t in trained.items() if ".lora_" in n or n.endswith("weight"))


@pytest.mark.parametrize("family", MODELS)
def test_merged_model_computes_what_the_adapted_one_does_and_is_a_plain_model_again(family, tmp_path):
    model = apply_lora(MODELS[family](), LoraSpec(rank=3, alpha=6, targets=ALL)).eval()
    nudge(model)
    adapted = outputs(model)
    assert not torch.allclose(adapted, outputs(MODELS[family]().eval()), rtol=1e-2, atol=1e-5)  # the adapters act
    merge_lora(model)
    assert torch.allclose(outputs(model), adapted, atol=1e-5, rtol=1e-4)
    assert not has_lora(model) and not hasattr(model, "adapter")
    plain = MODELS[family]()
    assert list(model.state_dict()) == list(plain.state_dict())
    assert [type(m) for m in model.modules()] == [type(m) for m in plain.modules()]
    path = zoo.save(model, tmp_path / "merged.safetensors")
    assert torch.allclose(outputs(zoo.load(path).eval()), adapted, atol=1e-5, rtol=1e-4)


def test_each_slice_of_a_fused_projection_gets_its_own_update_as_separate_projections_would():
    """q and v of a GQA qkv (and gate and up of a gated fc1) against W + scale * B @ A written out per
    slice, as LoRA on separate q_proj / k_proj / v_proj (PEFT on HF's layout) computes it."""
    model = decoder()
    attn, ffn = model.stack.blocks[1].attn, model.stack.blocks[1].ffn
    w_qkv, w_fc1 = attn.qkv.weight.detach().clone(), ffn.fc1.weight.detach().clone()
    apply_lora(model, LoraSpec(rank=2, alpha=7, targets=("q", "v", "ffn")))
    nudge(model)
    scale, x = 3.5, torch.randn(2, 5, 32)
    a, b = attn.qkv.lora_a, attn.qkv.lora_b
    assert set(a) == {"q", "v"}
    q_proj, k_proj, v_proj = w_qkv[:32], w_qkv[32:48], w_qkv[48:]
    q_merged, v_merged = q_proj + scale * b["q"] @ a["q"], v_proj + scale * b["v"] @ a["v"]
    expected = torch.cat([x @ q_merged.T, x @ k_proj.T, x @ v_merged.T], dim=-1)
    assert torch.allclose(attn.qkv(x), expected, atol=1e-5)
    a, b = ffn.fc1.lora_a, ffn.fc1.lora_b
    gate, up = w_fc1[:40], w_fc1[40:]
    expected = torch.cat([x @ (gate + scale * b["gate"] @ a["gate"]).T, x @ (up + scale * b["up"] @ a["up"]).T], -1)
    assert torch.allclose(ffn.fc1(x), expected, atol=1e-5)
    merge_lora(model)
    qkv = model.stack.blocks[1].attn.qkv.weight
    assert torch.equal(qkv[32:48], k_proj)  # rows without an adapter are untouched
    assert torch.allclose(qkv[:32], q_merged, atol=1e-6) and torch.allclose(qkv[48:], v_merged, atol=1e-6)


def test_adapters_round_trip_through_a_file_into_a_fresh_base(tmp_path):
    base = tmp_path / "base.safetensors"
    zoo.save(encoder(), base)
    model = apply_lora(zoo.load(base), LoraSpec(rank=2, targets=("q", "k", "o"), trainable=("classifier",))).eval()
    nudge(model)
    with torch.no_grad():
        model.classifier.out.weight.mul_(2)  # a trained head
    path = save_adapters(model, tmp_path / "adapters.safetensors", base=str(base))
    with safe_open(str(path), framework="pt") as f:
        names, meta = set(f.keys()), f.metadata()
    assert names == set(lora_parameters(model)) | {n for n, _ in model.named_parameters() if n.startswith("classifier.")}
    assert json.loads(meta["zoo.adapter"])["targets"] == ["q", "k", "o"] and meta["zoo.base"] == str(base)
    assert meta["zoo.base_hash"] == base_hash(zoo.load(base), ("classifier",)) == base_hash(model, ("classifier",))
    fresh = load_adapters(zoo.load(base), path).eval()
    assert fresh.adapter == model.adapter and torch.equal(outputs(fresh), outputs(model))
    assert {n for n, p in fresh.named_parameters() if p.requires_grad} == names
    with pytest.raises(LoadError, match="holds adapters, not a model; load its base model, then zoo.finetune.load_adapters"):
        zoo.load(path)


def test_adapters_refuse_other_base_weights_and_another_spec_naming_both(tmp_path):
    model = apply_lora(encoder(seed=0), LoraSpec(rank=2))
    path = save_adapters(model, tmp_path / "a.safetensors", base="bert-tiny seed 0")
    other = encoder(seed=1)
    with pytest.raises(LoadError, match=rf"other base weights: the file's base hash is {base_hash(model)}, "
                                        rf"this model's {base_hash(other)}; .*\(bert-tiny seed 0\)"):
        load_adapters(other, path)
    assert not has_lora(other)  # refused before anything changed
    wider = zoo.build(tiny_spec("encoder", ENCODER + ["block.ffn.hidden=64"]))
    with pytest.raises(LoadError, match=r"another model spec \(block.ffn.hidden: the file's 48, the model's 64\)"):
        load_adapters(wider, path)
    with pytest.raises(LoadError, match="holds no adapters .*; it is a model file, which zoo.load reads"):
        load_adapters(encoder(), zoo.save(encoder(), tmp_path / "m.safetensors"))


@pytest.mark.usefixtures("aten_linears")
def test_merged_model_converted_to_hf_gives_the_adapted_models_logits():
    pytest.importorskip("transformers")
    from zoo.interop import to_hf

    model = apply_lora(zoo.build(zoo.load_spec("llama-tiny", DECODER[:-1]), seed=0), LoraSpec(rank=4, targets=ALL)).eval()
    nudge(model)
    tokens = example_inputs(model)[0]
    adapted = model(tokens)
    hf = to_hf(merge_lora(model)).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        assert torch.allclose(hf(tokens).logits, adapted, atol=1e-4, rtol=1e-4)


@pytest.mark.usefixtures("aten_linears")
def test_lora_equals_peft_on_separate_projections_of_the_converted_hf_model():
    """The same adapters copied into PEFT's LoRA on HF's q/k/v/o_proj and gate/up/down_proj: the same
    parameter count and logits (PEFT is not a dependency of zoo: skipped where it is not installed)."""
    peft = pytest.importorskip("peft")
    from zoo.interop import to_hf

    base = zoo.build(zoo.load_spec("llama-tiny", DECODER[:-1]), seed=0).eval()
    hf = to_hf(base).eval()
    model = apply_lora(base, LoraSpec(rank=4, alpha=12, targets=ALL))
    nudge(model)
    names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    theirs = peft.get_peft_model(hf, peft.LoraConfig(r=4, lora_alpha=12, lora_dropout=0.0, target_modules=names)).eval()
    assert sum(p.numel() for n, p in theirs.named_parameters() if "lora_" in n) == \
        sum(p.numel() for p in lora_parameters(model).values())
    with torch.no_grad():
        for i, block in enumerate(model.stack.blocks):
            layer = theirs.base_model.model.model.layers[i]
            pairs = {"q_proj": (block.attn.qkv, "q"), "k_proj": (block.attn.qkv, "k"), "v_proj": (block.attn.qkv, "v"),
                     "o_proj": (block.attn.out, "all"), "gate_proj": (block.ffn.fc1, "gate"),
                     "up_proj": (block.ffn.fc1, "up"), "down_proj": (block.ffn.fc2, "all")}
            for name, (lora, part) in pairs.items():
                target = getattr(layer.self_attn if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else layer.mlp, name)
                target.lora_A["default"].weight.copy_(lora.lora_a[part])
                target.lora_B["default"].weight.copy_(lora.lora_b[part])
        tokens = example_inputs(model)[0]
        assert torch.allclose(theirs(tokens).logits, model(tokens), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["eager", pytest.param("aot_eager", marks=pytest.mark.slow)])
def test_an_adapted_training_step_compiles_as_one_graph_and_equals_eager(backend):
    """fullgraph=True: a graph break is an error. aot_eager also traces the backward pass, as inductor gets it."""
    from torch._dynamo.testing import CompileCounterWithBackend

    model = apply_lora(decoder(), LoraSpec(rank=2, dropout=0.0, targets=ALL)).train()
    nudge(model)
    tokens = example_inputs(model)[0]
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    torch.compile(model, fullgraph=True, backend=counter)(tokens).float().pow(2).mean().backward()
    assert counter.frame_count == 1
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model(tokens).float().pow(2).mean().backward()
    assert got.keys() == set(lora_parameters(model))
    assert all(torch.allclose(got[n], p.grad, rtol=1e-3, atol=1e-6) for n, p in lora_parameters(model).items())


def test_moe_ffn_is_refused_unless_skipped_by_name():
    spec = zoo.load_spec("mixtral-tiny", ["d_model=32", "n_layers=2", "block.ffn.expert.hidden=24", "vocab_size=61"])
    model = zoo.build(spec)
    with pytest.raises(ValueError, match=r"lora.targets ffn: stack.blocks.0.ffn is a mixture of experts, whose experts "
                                         r"are batched tensors, not linears; drop ffn .* or set lora.skip_moe=true"):
        apply_lora(model, LoraSpec(targets=("q", "ffn")))
    assert not has_lora(model)  # refused before anything changed
    apply_lora(model, LoraSpec(targets=("q", "ffn"), skip_moe=True))
    assert all(".attn.qkv.lora_" in n for n in lora_parameters(model)) and lora_parameters(model)
    with pytest.raises(ValueError, match="nothing to adapt"):
        apply_lora(zoo.build(spec), LoraSpec(targets=("ffn",), skip_moe=True))


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValidationError, match=r"unknown target 'qq'; did you mean 'q'\? \(known: q, k, v, o, ffn, latent\)"):
        LoraSpec(targets=("qq",))
    with pytest.raises(ValidationError, match="'v' is listed twice"):
        LoraSpec(targets=("v", "v"))
    for bad in ({"rank": 0}, {"dropout": 1.0}, {"alpha": 0}, {"ranks": 4}, {"trainable": ("head.",)}):
        with pytest.raises(ValidationError, match=next(iter(bad)).rstrip("s")):
            LoraSpec(**bad)
    with pytest.raises(ValueError, match=r"trainable: 'clasifier' names no parameter of the Encoder; did you mean "
                                         r"'classifier'\?"):
        apply_lora(encoder(), LoraSpec(trainable=("clasifier",)))
    model = apply_lora(decoder(), LoraSpec())
    with pytest.raises(ValueError, match="already has LoRA adapters; merge_lora"):
        apply_lora(model, LoraSpec())
    with pytest.raises(ValueError, match="no LoRA adapters"):
        merge_lora(decoder())
    eva = zoo.build(zoo.load_spec("eva02-mini", ["n_layers=1"]))
    with pytest.raises(ValueError, match=r"key_bias: false.*target o and ffn only"):
        apply_lora(eva, LoraSpec(targets=("q",)))
    assert apply_lora(eva, LoraSpec(targets=("o", "ffn"))) is eva


def test_lora_is_an_adapter_kind_of_its_registry():
    assert ADAPTERS.names() == ["lora"] and ADAPTERS.spec("lora") is LoraSpec
    with pytest.raises(KeyError, match="unknown adapter kind 'lorra'; did you mean 'lora'"):
        adapter_spec({"kind": "lorra"})
    model = adapt(decoder(), {"kind": "lora", "rank": 2, "targets": ["o"]})
    assert model.adapter == LoraSpec(rank=2, targets=("o",)) and model.adapter.scale == 1.0


def test_the_docs_table_lists_every_setting_with_its_default():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "finetune.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", text, flags=re.M))
    assert set(rows) == set(LoraSpec.model_fields) - {"kind"}
    for name, info in LoraSpec.model_fields.items():
        if name != "kind":
            default = json.dumps(info.default).replace('"', "") if info.default is not None else "null"
            assert rows[name].strip("`").replace(", ", ",") == default.replace(", ", ","), name


def test_a_half_precision_base_trains_fp32_adapters():
    model = apply_lora(decoder().to(torch.bfloat16), LoraSpec(rank=2, targets=("q", "o")))
    assert {p.dtype for p in lora_parameters(model).values()} == {torch.float32}
    assert {p.dtype for n, p in model.named_parameters() if ".lora_" not in n} == {torch.bfloat16}
    tokens = example_inputs(model)[0]
    logits = model(tokens)  # no autocast: the adapters cast their input and their output
    assert logits.dtype == torch.bfloat16
    logits.float().pow(2).mean().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in lora_parameters(model).values())
    before = model.stack.blocks[0].attn.qkv.weight.clone()
    nudge(model)
    merge_lora(model)
    assert model.stack.blocks[0].attn.qkv.weight.dtype == torch.bfloat16
    assert not torch.equal(model.stack.blocks[0].attn.qkv.weight[:32], before[:32])
    assert torch.equal(model.stack.blocks[0].attn.qkv.weight[32:], before[32:])


class Tokens(T.ListTask):
    """Next-token loss on fixed random rows; a micro-batch is a list of row indices."""

    def __init__(self) -> None:
        super().__init__(T.Dist(), 1)
        self.rows = torch.randint(0, 61, (8, 9), generator=torch.Generator().manual_seed(0))

    def batches(self, epoch):
        return [[0, 1, 2, 3], [4, 5, 6, 7]]

    def count(self, batch):
        return float(len(batch) * 8)

    def loss(self, model, batch, step):
        rows = self.rows[batch]
        return model(rows[:, :-1], targets=rows[:, 1:]), {}

    def evaluate(self, model):
        return {}


def test_fit_trains_the_adapters_alone_and_resumes_into_a_model_adapted_alike(tmp_path):
    """What a recipe does: adapt, then fit (which builds the optimizer over what requires grad);
    a checkpoint resumes exactly into a model adapted with the same spec."""
    spec = LoraSpec(rank=2, targets=("q", "v", "ffn"))

    def run(out, steps, resume=None):
        c = dict(optim=T.OptimConfig(lr=1e-2), schedule=T.ScheduleConfig(kind="constant"), dist=T.Dist(),
                 run=T.RunConfig(out_dir=out, plot=False, progress=False, precision="fp32", checkpoint_every=2))
        return T.fit(apply_lora(decoder(), spec, seed=0), Tokens(), **c, total_steps=steps, resume=resume).model

    base = decoder().state_dict()
    full = run(tmp_path / "full", 4)
    assert all(torch.equal(full.state_dict()[n], t) for n, t in base.items())  # the base, bit for bit
    assert any(p.abs().sum() > 0 for n, p in lora_parameters(full).items() if ".lora_b." in n)
    run(tmp_path / "part", 4)  # the same run: seed=0 draws the same A matrices
    resumed = run(tmp_path / "part", 4, resume=tmp_path / "part" / "ckpt-0000002.pt")
    assert all(torch.equal(resumed.state_dict()[n], t) for n, t in full.state_dict().items())
