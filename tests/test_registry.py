"""Registries: names, lookups with suggestions, and a user's own component used from a spec file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import pytest
import torch
from torch import nn

import zoo
from zoo.registry import REGISTRIES, Registry, RegistryError
from zoo.spec import FFNSpec, SpecError


@pytest.fixture(autouse=True)
def _restore_registries():
    """Registrations made by a test do not leak into others."""
    saved = {name: (dict(r._specs), dict(r._builders)) for name, r in REGISTRIES.items()}
    yield
    for name, (specs, builders) in saved.items():
        r = zoo.registry(name)
        r._specs.clear(), r._specs.update(specs)
        r._builders.clear(), r._builders.update(builders)


def test_names():
    assert zoo.registry("position").names() == ["alibi", "learned", "none", "relative_bias", "relative_bias2d", "relative_embedding",
                                                "rope", "rope2d", "rope2d_mixed", "sincos2d", "sinusoidal"]
    assert zoo.registry("attention").names() == ["disentangled", "gated_deltanet", "gqa", "mha", "mla", "mqa"]
    assert zoo.registry("ffn").names() == ["geglu", "gelu", "moe", "quick_gelu", "relu", "relu2", "silu", "swiglu"]
    assert zoo.registry("norm").names() == ["layernorm", "rmsnorm"]
    assert zoo.registry("family").names() == ["decoder", "encoder", "encoder_decoder", "vit"]


def test_lookup_errors_suggest():
    with pytest.raises(RegistryError, match="no registry named 'postion'; did you mean 'position'"):
        zoo.registry("postion")
    with pytest.raises(KeyError, match="unknown ffn kind 'swigl'; did you mean 'swiglu'"):
        zoo.registry("ffn").spec("swigl")
    with pytest.raises(RegistryError, match="known: geglu, gelu, moe, quick_gelu, relu, relu2, silu, swiglu"):
        zoo.registry("ffn").builder("nothing-like-it")


def test_registration_is_checked():
    reg = Registry("ffn")
    reg.spec_base = FFNSpec
    with pytest.raises(RegistryError, match="must be a subclass of zoo.spec.FFNSpec"):
        reg.register("x", spec=dict)(lambda spec: None)
    with pytest.raises(RegistryError, match="pass its spec class"):
        reg.register("y")(lambda spec: None)
    with pytest.raises(RegistryError, match="already registered"):
        zoo.register("ffn", "relu", spec=type("Other", (FFNSpec,), {"__annotations__": {"kind": Literal["relu"]}}))(
            lambda spec, **_: None
        )


class ScaledReluSpec(FFNSpec):
    """A user's FFN: relu(x W1) W2 * scale."""

    kind: Literal["scaled_relu"] = "scaled_relu"
    scale: float = 0.5


class ScaledRelu(nn.Module):
    def __init__(self, dim: int, hidden: int, *, scale: float) -> None:
        super().__init__()
        self.fc1, self.fc2, self.scale = nn.Linear(dim, hidden), nn.Linear(hidden, dim), scale

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


def test_user_component_from_a_spec_file(tmp_path):
    @zoo.register("ffn", "scaled_relu", spec=ScaledReluSpec, replace=True)
    def build_scaled_relu(spec, *, dim, dropout, **_):
        return ScaledRelu(dim, spec.hidden_size(dim), scale=spec.scale)

    path = tmp_path / "mine.yaml"
    path.write_text(
        "family: decoder\nvocab_size: 50\nd_model: 16\nn_layers: 2\nmax_seq_len: 16\n"
        "block:\n  attention: {kind: mha, n_heads: 2}\n  ffn: {kind: scaled_relu, hidden: 24, scale: 0.25}\n"
    )
    model = zoo.build(path)
    ffn = model.stack.blocks[0].ffn
    assert isinstance(ffn, ScaledRelu) and ffn.scale == 0.25 and ffn.fc1.out_features == 24
    assert model(torch.randint(0, 50, (2, 5))).shape == (2, 5, 50)
    assert "scaled_relu" in zoo.registry("ffn").names()
    assert "scaled_relu" in str(zoo.json_schema())
    with pytest.raises(SpecError, match="block.ffn.scal: unknown key"):
        zoo.load_spec(path, ["block.ffn.scal=3"])
    # overrides that switch to the new kind keep the keys it knows
    spec = zoo.load_spec("gpt2-small", ["block.ffn.kind=scaled_relu", "block.ffn.scale=2"])
    assert spec.block.ffn.scale == 2 and spec.block.ffn.hidden == 3072


def test_spec_without_builder_says_how_to_register():
    class LonelySpec(FFNSpec):
        kind: Literal["lonely"] = "lonely"

    zoo.registry("ffn").add_spec("lonely", LonelySpec)
    with pytest.raises(RegistryError, match=r"has a spec but no builder; register one with @zoo.register\('ffn', 'lonely'\)"):
        zoo.build("gpt2-small", ["d_model=16", "n_layers=1", "block.attention.n_heads=2", "block.ffn.kind=lonely"])


def _documented_contexts() -> dict[str, set[str]]:
    """Each registry's builder arguments as docs/extending.md's table of rules names them (the
    backquoted names of its third column, outside parentheses)."""
    text = (Path(__file__).parent.parent / "docs" / "extending.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"`\w+`", cells[0]) and cells[0].strip("`") in REGISTRIES:
            rows[cells[0].strip("`")] = set(re.findall(r"`(\w+)`", re.sub(r" \([^()]*\)", "", cells[2])))
    return rows


def test_builder_contexts_are_documented_as_builders_receive_them():
    """Build tiny models of every family and many kinds, recording the keyword arguments each
    registry's builders really receive; the registry's ``context`` and the docs name exactly those."""
    received: dict[str, set[str]] = {name: set() for name in REGISTRIES}
    for name, reg in REGISTRIES.items():
        for kind in reg.names():
            original = reg.builder(kind)

            def record(spec, *args, _name=name, _original=original, **context):
                received[_name].update(context)
                return _original(spec, *args, **context)

            reg.register(kind, replace=True)(record)
    presets = Path(zoo.__file__).parent / "presets"
    for path in sorted(presets.glob("*-tiny*.yaml")) + sorted(presets.glob("*-mini.yaml")):
        zoo.build(zoo.load_spec(str(path)), device="meta")
    documented = _documented_contexts()
    assert set(documented) == set(REGISTRIES)
    for name, reg in REGISTRIES.items():
        assert set(reg.context_keys) == received[name], name
        assert documented[name] == received[name], name


def test_package_docstrings_name_every_registered_kind():
    """zoo's doctest prints the position registry as it is; zoo.spec's map of modules lists every
    block kind and family; every registered spec class is exported from zoo.spec."""
    import doctest

    import zoo.spec

    assert doctest.testmod(zoo, verbose=False).failed == 0
    lines = {line.split()[0]: line for line in zoo.spec.__doc__.splitlines() if line.startswith("    zoo.spec.")}
    listed = re.search(r"\(([^)]*)\)", lines["zoo.spec.blocks"]).group(1)
    assert sorted(k.strip() for k in listed.split(",")) == zoo.registry("block").names()
    families = lines["zoo.spec.families"].split(": ")[-1]
    assert sorted(k.strip() for k in families.split(",")) == zoo.registry("family").names()
    for name, reg in REGISTRIES.items():
        for kind in reg.names():
            cls = reg.spec(kind)
            assert getattr(zoo.spec, cls.__name__, None) is cls and cls.__name__ in zoo.spec.__all__, (name, kind)
