"""docs/extending.md's walk-through, run as a user would: the new FFN in its own module, a spec file
naming it, then the doc's script. The new part must be used, get the scaled residual init, and count
in zoo.summary's FLOPs."""

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
    assert "my_parts.py" in files and "my-model.yaml" in files, f"the walk-through's files: {files}"
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
