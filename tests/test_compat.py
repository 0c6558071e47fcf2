"""Files an earlier zoo wrote still load: the models of tests/fixtures/v0.1 (saved by zoo 0.1.0, one
per family and norm placement, see make.py there) rebuild from their files alone and compute what
0.1.0 computed; the spec YAML 0.1.0 read still reads, to the same model."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import zoo
from zoo.io import read_spec
from zoo.spec import SpecError, SpecNote

FIXTURES = Path(__file__).parent / "fixtures" / "v0.1"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.safetensors") if p.stem != "outputs")


def _run(model, name: str, saved: dict) -> torch.Tensor:
    args, i = [], 0
    while f"{name}.input{i}" in saved:
        args.append(saved[f"{name}.input{i}"])
        i += 1
    with torch.no_grad():
        return model(*args)


@pytest.fixture(scope="module")
def saved() -> dict:
    return load_file(str(FIXTURES / "outputs.safetensors"))


def test_every_family_and_placement_has_a_fixture():
    assert len(NAMES) >= 9
    families = {read_spec(FIXTURES / f"{n}.safetensors").family for n in NAMES}
    assert families == {"decoder", "encoder", "encoder_decoder", "vit"}


@pytest.mark.parametrize("name", NAMES)
def test_old_file_loads_and_computes_what_it_did(name, saved):
    model = zoo.load(FIXTURES / f"{name}.safetensors").eval()
    torch.testing.assert_close(_run(model, name, saved), saved[f"{name}.output"], rtol=0, atol=2e-6)


@pytest.mark.parametrize("name", NAMES)
def test_old_yaml_reads_to_the_model_in_the_file(name, saved):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = zoo.load_spec(FIXTURES / f"{name}.yaml")
    assert spec == read_spec(FIXTURES / f"{name}.safetensors")
    model = zoo.build(spec, seed=0).eval()
    zoo.load_weights(model, FIXTURES / f"{name}.safetensors")
    torch.testing.assert_close(_run(model, name, saved), saved[f"{name}.output"], rtol=0, atol=2e-6)


def test_old_yaml_notes_each_renamed_field_in_one_line():
    with pytest.warns(SpecNote) as notes:
        spec = zoo.load_spec(FIXTURES / "decoder-parallel.yaml")
    lines = [str(n.message) for n in notes]
    assert lines == [f"file '{FIXTURES / 'decoder-parallel.yaml'}': block.parallel is block.kind: parallel (with its "
                     f"shared_norm) since zoo 0.2; write the new field"]
    assert spec.block.kind == "parallel" and spec.block.shared_norm is False
    with pytest.warns(SpecNote) as notes:
        zoo.load_spec(FIXTURES / "vit-pre.yaml")
    assert [str(n.message).split(": ", 1)[1] for n in notes] == [
        "block.norm.placement: pre is block.kind: pre since zoo 0.2; write the new field",
        "num_classes is head.num_classes (head: {kind: linear, num_classes: N}) since zoo 0.2; write the new field"]


def test_old_files_load_without_notes():
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecNote)
        for name in NAMES:
            zoo.load(FIXTURES / f"{name}.safetensors")


def test_old_fields_that_conflict_are_refused():
    """0.1's parallel block normalized before its branches; with a placement other than pre, or a
    block.kind of today's that says otherwise, one of the two would be dropped without a word."""
    import yaml

    old = yaml.safe_load((FIXTURES / "decoder-parallel.yaml").read_text())
    old["block"]["norm"]["placement"] = "post"
    with pytest.raises(SpecError, match=r"^spec 0.1: block.parallel and block.norm.placement: post conflict: .*write block.kind: "
                                        r"parallel or block.kind: post$"):
        zoo.spec.parse_spec(old, source="0.1", notes=False)
    old["block"]["norm"]["placement"] = "pre"
    assert zoo.spec.parse_spec(old, notes=False).block.kind == "parallel"
    for block, fields in [({"kind": "post", "parallel": {"shared_norm": True}}, "block.parallel"),
                          ({"kind": "post", "norm": {"kind": "layernorm", "placement": "pre"}}, "block.norm.placement: pre")]:
        with pytest.raises(SpecError, match=rf"block.kind: post conflicts with the 0.1 field {fields} \(block.kind: "):
            zoo.spec.parse_spec({**old, "block": {**old["block"], "parallel": None, **block}}, notes=False)
    with pytest.raises(SpecError, match=r"block.parallel: True is not the 0.1 field's mapping \{shared_norm: ...\}"):
        zoo.spec.parse_spec({**old, "block": {**old["block"], "parallel": True}}, notes=False)
