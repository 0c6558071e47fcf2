"""The lists of classes zoo converts come from the converters' registries: every class registered
(HF's ``ARCHS``, timm's ``ARCHS``) is named in ``zoo convert --help``, in the package docstrings, and
in docs/interop.md's generated table, which is current; the README points to that table. The
generator refuses a description file that leaves a class out or names one no registry holds."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import zoo.interop
import zoo.interop.hf
import zoo.interop.timm
from zoo.cli import main

ROOT = Path(__file__).resolve().parents[1]
HF, TIMM = list(zoo.interop.hf.ARCHS), list(zoo.interop.timm.ARCHS)


def _make_docs():
    spec = importlib.util.spec_from_file_location("make_docs", ROOT / "docs" / "make_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = _make_docs()


def _named(text: str) -> set[str]:
    """The words of ``text`` (class names, whole: DistilBertModel does not name BertModel)."""
    return set(re.findall(r"\w+", text))


def _table(text: str) -> str:
    m = re.search(r"<!-- generated: interop-classes (?P<args>[^>]*?) -->(?P<body>.*?)<!-- /generated -->", text, re.S)
    assert m, "docs/interop.md has no generated table of classes"
    return m["body"]


def test_the_registries_are_the_ones_listed():
    assert HF and TIMM and not set(HF) & set(TIMM)
    assert [r.name for r in zoo.interop.catalog.references()] == HF + TIMM


def test_convert_help_names_every_class(capsys):
    assert main(["convert", "--help"]) == 0
    named = _named(capsys.readouterr().out)
    assert not [c for c in HF + TIMM if c not in named]


def test_docstrings_name_every_class():
    assert not [c for c in HF + TIMM if c not in _named(zoo.interop.__doc__)]
    assert not [c for c in HF if c not in _named(zoo.interop.hf.__doc__)]
    assert not [c for c in TIMM if c not in _named(zoo.interop.timm.__doc__)]


def test_the_docs_table_has_a_row_for_every_class_and_is_current():
    text = (ROOT / "docs" / "interop.md").read_text(encoding="utf-8")
    first_column = [row.split(" | ")[0] for row in _table(text).strip().splitlines()[2:]]
    listed = [name for cell in first_column for name in re.findall(r"`(\w+)`", cell)]
    assert sorted(listed) == sorted(HF + TIMM)  # each once
    assert MAKE.render(text) == text, "docs/interop.md is stale; run `python docs/make_docs.py`"


def test_the_readme_points_to_the_generated_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/interop.md#reference-classes" in readme
    assert "## Reference classes" in (ROOT / "docs" / "interop.md").read_text(encoding="utf-8")


def test_a_class_left_out_or_unknown_fails_the_generator(tmp_path):
    import yaml

    described = yaml.safe_load((ROOT / "docs" / "interop-classes.yaml").read_text(encoding="utf-8"))
    left_out = {k: v for k, v in described.items() if k != "LlamaForCausalLM"}
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(left_out), encoding="utf-8")
    with pytest.raises(ValueError, match="no row for LlamaForCausalLM"):
        MAKE.interop_classes(str(tmp_path / "a.yaml"))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({**described, "OPTForCausalLM": "x"}), encoding="utf-8")
    with pytest.raises(ValueError, match="OPTForCausalLM is no registered class"):
        MAKE.interop_classes(str(tmp_path / "b.yaml"))
