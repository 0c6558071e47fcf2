"""The zoo command: tables, listings, YAML, schema, and one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from zoo.cli import main


def test_presets_table(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in zoo.preset_names():
        assert name in out
    assert "124,439,808" in out and "109,514,298" in out and "6+6" in out


def test_list_show_schema(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "position: alibi, learned, none, relative_bias, relative_bias2d, relative_embedding, rope, rope2d, rope2d_mixed, sincos2d, sinusoidal" in out
    assert main(["show", "llama-small", "--set", "n_layers=3"]) == 0
    text = capsys.readouterr().out
    spec = zoo.load_spec(zoo.spec.read_yaml(text, "show"))
    assert spec.n_layers == 3 and spec == zoo.load_spec("llama-small", ["n_layers=3"])
    assert main(["schema"]) == 0
    assert "oneOf" in json.loads(capsys.readouterr().out)


def test_errors_are_one_line_with_exit_2(capsys):
    assert main(["show", "gpt2-smal"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zoo: error: unknown preset 'gpt2-smal'; did you mean 'gpt2-small'") and "Traceback" not in err
    assert main(["show", "gpt2-small", "--set", "block.attention.n_heads=7"]) == 2
    assert "block.attention.n_heads: d_model (768) must be divisible by n_heads (7)" in capsys.readouterr().err


def _python_m_zoo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zoo", *args], capture_output=True, text=True, timeout=300, check=False)


def test_python_m_zoo_list_is_zoo_list(capsys):
    run = _python_m_zoo("list")
    assert main(["list"]) == 0
    assert run.returncode == 0 and run.stderr == ""
    assert run.stdout == capsys.readouterr().out
    assert "ffn: geglu, gelu, moe, quick_gelu, relu, relu2, silu, swiglu" in run.stdout and "presets: " in run.stdout


@pytest.mark.slow
def test_python_m_zoo_without_a_command_and_with_help(capsys):
    run = _python_m_zoo()  # as `zoo`: the presets table (the module entry point, in a new interpreter)
    assert run.returncode == 0 and "zoo presets" in run.stdout and "gpt2-small" in run.stdout
    assert main(["--help"]) == 0  # the same main, in this process
    out = capsys.readouterr().out
    assert out.startswith("usage: zoo ") and "list" in out and "kernels" in out
    assert main(["frobnicate"]) == 2
    run = capsys.readouterr()
    assert run.out == "" and run.err.startswith("zoo: error: argument COMMAND: invalid choice")


def test_the_guides_command_table_lists_every_subcommand(capsys):
    from zoo.cli import commands

    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    names = [usage.split()[1] for usage, _ in commands()]
    listed = re.findall(r"^    (\w+)\s", shown, flags=re.M)
    assert names == listed and len(names) >= 12
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    assert all(f"| `{usage}` | {text} |" in guide for usage, text in commands())
