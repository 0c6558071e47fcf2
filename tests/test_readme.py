"""The README's tour runs as written, and its set-up commands are the ones CI uses."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tour_runs(capsys):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python tour"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "['alibi', 'learned', 'none', 'relative_bias', 'relative_bias2d', 'relative_embedding', 'rope', 'rope2d', 'rope2d_mixed', 'sincos2d', 'sinusoidal']" in out
    assert "124439808" in out
    assert "did you mean 'swiglu'" in out


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    assert len(commands) == 2, "the README has exactly two set-up commands"
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = commands[1].strip().split("&&")[-1].strip()
    assert test_command in ci


def test_the_opening_names_every_registered_component_kind():
    from zoo.registry import REGISTRIES

    opening = (ROOT / "README.md").read_text().split("## ")[0]
    named = set(re.findall(r"`(\w+)`", opening))
    missing = {f"{kind}: {name}" for kind, registry in REGISTRIES.items() if kind != "family" for name in registry.names()
               if name not in named}
    assert not missing, f"README's opening paragraph does not name {sorted(missing)}"


def test_the_command_paragraph_names_every_subcommand():
    from zoo.cli import commands

    paragraph = next(p for p in (ROOT / "README.md").read_text().split("\n\n") if p.startswith("The `zoo` command:"))
    missing = [usage.split()[1] for usage, _ in commands() if f"`zoo {usage.split()[1]}" not in paragraph]
    assert not missing, f"README's paragraph on the zoo command does not name {missing}"
