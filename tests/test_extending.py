"""docs/extending.md's walk-throughs, run as a user would: the new FFN and the new block kind in their
own modules, spec files naming them, then the doc's scripts. The new FFN must be used, get the scaled
residual init, and count in zoo.summary's FLOPs; the new block kind must compute its formula and
work wherever a built-in kind does (summary, files, activation checkpointing, FSDP, layer patterns,
the converters' refusals)."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import zoo
from zoo.components import parts
from zoo.registry import REGISTRIES
from zoo.summary import summarize

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.DOTALL)


def _file_name(block: str, suffix: str) -> str | None:
    """``NAME.suffix`` where a block's first line is ``# NAME.suffix``: a file the walk-through writes."""
    first = block.splitlines()[0] if block else ""
    return first[2:] if re.fullmatch(rf"# [\w.-]+\.{suffix}", first) else None


@pytest.fixture
def walkthrough(tmp_path, monkeypatch):
    """Write the doc's files into a temp folder, run its script there; yield the script's namespace.
    Registries and the imported module are restored afterwards."""
    text = DOC.read_text(encoding="utf-8")
    files = []
    for lang, suffix in [("yaml", "ya?ml"), ("python", "py")]:
        for block in _blocks(text, lang):
            name = _file_name(block, suffix)
            if name:
                (tmp_path / name).write_text(block, encoding="utf-8")
                files.append(name)
    script = [b for b in _blocks(text, "python") if not _file_name(b, "py")]
    assert {"my_parts.py", "my-model.yaml", "my_blocks.py", "my-deep.yaml"} <= set(files), f"the walk-through's files: {files}"
    assert script, "docs/extending.md has no script after its module"
    saved = {name: (dict(r._specs), dict(r._builders)) for name, r in REGISTRIES.items()}
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        namespace: dict = {"__name__": "docs_extending"}
        for i, block in enumerate(script):
            code = compile(block, f"docs/extending.md (script block {i + 1})", "exec", dont_inherit=True)
            exec(code, namespace)  # noqa: S102 (the doc's code; dont_inherit: without this file's __future__)
        yield namespace
    finally:
        sys.modules.pop("my_parts", None)
        sys.modules.pop("my_blocks", None)
        for name, (specs, builders) in saved.items():
            r = zoo.registry(name)
            r._specs.clear(), r._specs.update(specs)
            r._builders.clear(), r._builders.update(builders)


def test_the_new_part_is_used(walkthrough):
    my_parts = sys.modules["my_parts"]
    model = walkthrough["model"]
    ffns = [block.ffn for block in model.stack.blocks]
    assert ffns and all(type(f) is my_parts.ReluPowerFFN for f in ffns)
    calls = []
    for f in ffns:
        f.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    model(torch.randint(0, model.spec.vocab_size, (2, 5)))
    assert calls == [(2, 5, model.spec.d_model)] * model.spec.n_layers


def test_its_residual_output_gets_the_scaled_init(walkthrough):
    spec = zoo.load_spec("my-model.yaml")
    assert spec.init.scheme == "normal" and spec.init.scaled_residual  # the decoder's defaults
    model = zoo.build(spec, seed=0)
    fc1 = torch.cat([b.ffn.fc1.weight.flatten() for b in model.stack.blocks])
    fc2 = torch.cat([b.ffn.fc2.weight.flatten() for b in model.stack.blocks])
    # GPT-2: residual projections drawn with std / sqrt(2 * layers), every other linear with std
    expected = spec.init.std / math.sqrt(2 * spec.n_layers)
    assert fc2.std().item() == pytest.approx(expected, rel=0.03)
    assert fc1.std().item() == pytest.approx(spec.init.std, rel=0.03)


def test_summary_counts_its_flops(walkthrough):
    spec = zoo.load_spec("my-model.yaml")
    d, layers, hidden = spec.d_model, spec.n_layers, spec.block.ffn.hidden
    ours = summarize(spec, seq=16).flops_forward
    assert walkthrough["cost"].flops_forward == ours
    narrower = summarize(zoo.load_spec("my-model.yaml", [f"block.ffn.hidden={hidden // 2}"]), seq=16).flops_forward
    removed = hidden - hidden // 2
    assert ours - narrower == layers * 2 * (d * removed + removed * d)  # fc1 and fc2, multiply-adds count two
    # the same shapes as a built-in two-layer FFN
    assert ours == summarize(zoo.load_spec("my-model.yaml", ["block.ffn.kind=relu"]), seq=16).flops_forward


def test_undeclared_parts_fall_back_on_names():
    class FFN(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 4)

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(4, 12), nn.Linear(4, 4)

    class Declared(FFN):
        residual_out = ("fc1",)

    assert parts.residual_out(FFN()) == ("fc2",)
    assert parts.residual_out(Attn()) == ("out",)
    assert parts.residual_out(Declared()) == ("fc1",)
    assert parts.residual_out(nn.Linear(4, 4)) == ()
    assert parts.flops(FFN(), 3) == 3 * 2 * (4 * 8 + 8 * 4)
    assert parts.head_sizes(Attn(), 4) == (1, 1, 4, 4)


# ------------------------------------------------------------------------------- the block kind
def test_the_block_kind_computes_its_formula(walkthrough):
    deep = zoo.build("my-deep.yaml", seed=1).eval()
    block, alpha = deep.stack.blocks[0], deep.spec.block.alpha
    x = torch.randn(2, 7, deep.spec.d_model)
    tokens = torch.zeros(2, 7, dtype=torch.long)
    ctx = deep.stack.context(deep.position, tokens, None, causal=True).layers[0]
    with torch.no_grad():
        h = block.attn_norm(alpha * x + block.attn(x, mask=ctx.mask, is_causal=ctx.is_causal, pos=ctx.pos,
                                                   positions=ctx.positions))
        assert torch.allclose(block(x, ctx), block.ffn_norm(alpha * h + block.ffn(h)), atol=1e-6)


def test_the_block_kind_counts_like_a_builtin(walkthrough):
    deep, post = zoo.load_spec("my-deep.yaml"), zoo.load_spec("my-deep.yaml", ["block.kind=post"])
    a, b = summarize(deep, seq=16), summarize(post, seq=16)
    assert a.flops_forward == b.flops_forward and a.parts == b.parts  # the same parts, arranged otherwise
    assert a.activation_bytes == b.activation_bytes and a.kv_cache_bytes == b.kv_cache_bytes
    assert walkthrough["deep_cost"].flops_forward == a.flops_forward


def test_the_block_kind_in_layer_patterns_and_converters(walkthrough):
    from zoo.interop import ConversionError, to_hf

    mixed = zoo.build("my-deep.yaml", ["layers=[{at: 0, block: {kind: post}}]"], seed=0)
    assert type(mixed.stack.blocks[0]).__name__ == "PostNormBlock"
    assert all(type(b).__name__ == "DeepNormBlock" for b in mixed.stack.blocks[1:])
    with pytest.raises(ConversionError, match="block.kind='deepnorm'"):
        to_hf(zoo.build("my-deep.yaml", device="meta"))


@pytest.mark.slow
def test_the_block_kind_under_fsdp(walkthrough, tmp_path):
    """One process in a gloo group: FSDP2 wraps each DeepNorm block as a unit, and the gradients are
    those of the plain model."""
    import torch.distributed as td

    from zoo.train import Dist, apply_fsdp

    plain = zoo.build("my-deep.yaml", seed=0)
    sharded = zoo.build("my-deep.yaml", seed=0)
    tokens = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(0))
    plain(tokens).logsumexp(-1).mean().backward()
    td.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        apply_fsdp(sharded, Dist())
        from torch.distributed.fsdp import FSDPModule

        assert all(isinstance(b, FSDPModule) for b in sharded.stack.blocks)
        sharded(tokens).logsumexp(-1).mean().backward()
        for (name, p), q in zip(sharded.named_parameters(), plain.parameters()):
            assert torch.allclose(p.grad.full_tensor(), q.grad, atol=1e-6), name
    finally:
        td.destroy_process_group()


def test_a_registered_family_gets_a_summary():
    """A family of the user's own, subclassing zoo.models.Family, is counted without editing zoo."""
    from typing import Literal

    from zoo.models import Family
    from zoo.models.common import build_stack, init_weights
    from zoo.spec import FamilySpec

    class BagSpec(FamilySpec):
        family: Literal["bag"] = "bag"

    class Bag(Family):  # vectors in, vectors out: x [B, T, D] -> the blocks
        def __init__(self, spec):
            super().__init__()
            self.spec = spec
            self.stack = build_stack(spec, max_len=64)
            init_weights(self, spec)

    saved = {name: (dict(r._specs), dict(r._builders)) for name, r in REGISTRIES.items()}
    try:
        zoo.register("family", "bag", spec=BagSpec)(Bag)
        spec = zoo.parse_spec({"family": "bag", "d_model": 32, "n_layers": 2, "position": {"kind": "none"},
                               "block": {"attention": {"kind": "mha", "n_heads": 4}, "ffn": {"kind": "relu", "hidden": 48}}})
        s = summarize(spec, seq=10)
        ffn = 2 * (32 * 48 + 48 * 32)
        attention = 2 * 4 * 32 * 32 + 2 * 10 * 4 * (8 + 8)  # projections, scores and weighted sum per token
        assert s.flops_forward == 2 * (ffn + attention)
        assert s.parts["attention"] == 2 * (4 * 32 * 32 + 4 * 32) and s.parts["ffn"] == 2 * (32 * 48 * 2 + 48 + 32)
        assert s.activation_bytes > 0 and s.kv_cache_bytes_per_token is None
    finally:
        for name, (specs, builders) in saved.items():
            r = zoo.registry(name)
            r._specs.clear(), r._specs.update(specs)
            r._builders.clear(), r._builders.update(builders)
