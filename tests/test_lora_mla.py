"""LoRA on multi-head latent attention (``attention.kind: mla``): where each target's adapters sit,
the adapted model against the same model with the updates written into its weights by hand
(W + scale * B @ A per slice, kv_b's per head), folded decoding on the adapted weights, merging,
adapter files, and a training step that moves only the adapters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
import zoo.train as T
from zoo.components.mla import LatentAttention
from zoo.finetune import LoraLinear, LoraSpec, apply_lora, load_adapters, lora_parameters, merge_lora, save_adapters

H, R, P, N, V = 4, 10, 4, 6, 8
ALL = ("q", "k", "v", "o", "latent")


def mla(fold: str = "auto", q_rank: int | None = 12, seed: int = 0):
    spec = zoo.load_spec("deepseek-tiny", [
        "d_model=32", "n_layers=2", f"block.attention.n_heads={H}", "vocab_size=61", "max_seq_len=40",
        f"block.attention.q_lora_rank={'null' if q_rank is None else q_rank}", f"block.attention.kv_lora_rank={R}",
        f"block.attention.qk_nope_head_dim={N}", f"block.attention.qk_rope_head_dim={P}",
        f"block.attention.v_head_dim={V}", f"block.attention.fold={fold}", "block.ffn.expert.hidden=24",
        "block.ffn.shared_hidden=24", "layers=[{at: [0], block: {ffn: {kind: swiglu, hidden: 48, bias: false}}}]"])
    return zoo.build(spec, seed=seed)


def nudge(model, seed: int = 1):
    """Every adapter's B random (it starts at zero), so the adapters change the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora_parameters(model).items():
            if ".lora_b." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def by_hand(model, adapted) -> None:
    """``model``'s weights with ``adapted``'s updates added, written out per linear and slice."""
    with torch.no_grad():
        for name, m in adapted.named_modules():
            if not isinstance(m, LoraLinear):
                continue
            w = model.get_submodule(name).weight
            for s, (a, b) in m.slices.items():
                update = m.scale * m.lora_b[s] @ m.lora_a[s]  # [groups * rows, I]
                if name.endswith("kv_b"):  # each head's [key rows | value rows]
                    w.view(H, N + V, R)[:, a:b] += update.view(H, b - a, R)
                else:
                    w[a:b] += update


@pytest.mark.parametrize("q_rank", [12, None])
def test_targets_sit_on_what_only_their_role_uses(q_rank):
    model = apply_lora(mla(q_rank=q_rank), LoraSpec(rank=2, targets=ALL))
    att = model.stack.blocks[1].attn
    assert isinstance(att, LatentAttention)
    queries = ["q"] if q_rank is None else ["q_a", "q_b"]
    assert all(getattr(att, n).slices == {"all": (0, getattr(att, n).out_features)} for n in queries)
    assert att.kv_a.slices == {"latent": (0, R), "k": (R, R + P)} and att.kv_a.groups == 1
    assert att.kv_b.slices == {"k": (0, N), "v": (N, N + V)} and att.kv_b.groups == H
    assert att.kv_b.lora_b["k"].shape == (H * N, 2) and att.out.slices == {"all": (0, 32)}
    only_v = apply_lora(mla(), LoraSpec(rank=2, targets=("v",))).stack.blocks[0].attn
    assert set(only_v.kv_b.slices) == {"v"} and not isinstance(only_v.kv_a, LoraLinear)


def test_v_adapts_the_values_and_leaves_the_keys():
    """``v`` alone: every head's keys are the base model's, its values are not."""
    base = mla().stack.blocks[0].attn
    att = apply_lora(mla(), LoraSpec(rank=2, targets=("v",))).stack.blocks[0].attn
    nudge(att)
    latent, k_rope = torch.randn(2, 1, 5, R), torch.randn(2, 1, 5, P)
    with torch.no_grad():
        (k0, v0), (k1, v1) = base.expand(latent, k_rope), att.expand(latent, k_rope)
    assert torch.equal(k0, k1) and not torch.allclose(v0, v1, atol=1e-3)


@pytest.mark.parametrize("fold", ["never", "always"])
def test_adapted_model_computes_its_weights_with_the_updates_written_in(fold):
    model = apply_lora(mla(fold), LoraSpec(rank=3, alpha=6, targets=ALL)).eval()
    nudge(model)
    plain = mla(fold).eval()
    by_hand(plain, model)
    x = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = plain(x)
        assert not torch.allclose(want, mla(fold).eval()(x), atol=1e-3)  # the adapters act
        assert torch.allclose(model(x), want, atol=1e-5, rtol=1e-4)
        merge_lora(model)
        assert torch.allclose(model(x), want, atol=1e-5, rtol=1e-4)
    assert list(model.state_dict()) == list(plain.state_dict())
    assert all(torch.allclose(model.state_dict()[n], t, atol=1e-6) for n, t in plain.state_dict().items())


def test_folded_decoding_uses_the_adapted_weights():
    """Greedy and beam decoding of an adapted model: folded (kv_b's weight with its update) ==
    expanded == the merged model's."""
    x = torch.randint(3, 61, (2, 5), generator=torch.Generator().manual_seed(3))
    runs = []
    for fold in ("always", "never"):
        model = apply_lora(mla(fold), LoraSpec(rank=2, targets=ALL), seed=0).eval()
        nudge(model)
        runs += [zoo.generate(model, x, max_new_tokens=6, min_new_tokens=6, eos_id=None, num_beams=beams)
                 for beams in (1, 2)]
    merged = merge_lora(model)
    merged.stack.blocks[0].attn.fold = merged.stack.blocks[1].attn.fold = "always"
    runs += [zoo.generate(merged, x, max_new_tokens=6, min_new_tokens=6, eos_id=None, num_beams=beams)
             for beams in (1, 2)]
    for i in (0, 1):
        for other in runs[2 + i :: 2]:
            assert other.tokens.equal(runs[i].tokens)
            torch.testing.assert_close(other.scores, runs[i].scores, rtol=0, atol=1e-4)


@pytest.mark.parametrize("fold", ["never", "always"])
def test_a_training_step_moves_only_the_adapters(fold):
    model = apply_lora(mla(fold), LoraSpec(rank=2, targets=ALL)).train()
    nudge(model)
    frozen = {n: t.clone() for n, t in model.state_dict().items() if "lora_" not in n}
    adapters = {n: t.clone() for n, t in model.state_dict().items() if "lora_" in n}
    optimizer = T.build_optimizer(model, T.OptimConfig(lr=1e-2, weight_decay=0.0))
    x = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(4))
    F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
    optimizer.step()
    state = model.state_dict()
    assert all(torch.equal(state[n], t) for n, t in frozen.items())  # bit for bit
    assert all(not torch.equal(state[n], t) for n, t in adapters.items())
    model.stack.blocks[0].attn.kv_b.lora_dropout.p = 0.1
    with pytest.raises(ValueError, match="dropout"):
        model.stack.blocks[0].attn.kv_b.effective_weight()


def test_adapters_round_trip_through_a_file(tmp_path):
    model = apply_lora(mla(), LoraSpec(rank=2, targets=ALL)).eval()
    nudge(model)
    path = save_adapters(model, tmp_path / "adapters.safetensors")
    fresh = load_adapters(mla(), path).eval()
    x = torch.randint(0, 61, (2, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))


def test_latent_needs_a_latent_attention():
    llama = zoo.build(zoo.load_spec("llama-tiny", ["d_model=32", "n_layers=1", "block.attention.n_heads=4",
                                                   "block.attention.n_kv_heads=2", "vocab_size=61",
                                                   "block.ffn.hidden=48"]))
    with pytest.raises(ValueError, match="latent.*mla has one"):
        apply_lora(llama, LoraSpec(targets=("q", "latent")))
    with pytest.raises(ValueError, match="unknown target 'latnt'"):
        LoraSpec(targets=("latnt",))
