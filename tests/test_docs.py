"""The docs stay true: the spec reference matches the code, links resolve (the extension walk-through:
test_extending.py)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from zoo.registry import REGISTRIES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("make_spec_reference", DOCS / "make_spec_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def test_spec_reference_is_current():
    committed = (DOCS / "spec-reference.md").read_text(encoding="utf-8")
    fresh = GEN.render()
    if fresh != committed:
        old, new = committed.splitlines(), fresh.splitlines()
        line = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        pytest.fail(
            f"docs/spec-reference.md is stale (first difference at line {line + 1}); "
            f"run `python docs/make_spec_reference.py` and commit the result"
        )


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {GEN.anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_links_between_docs_resolve():
    broken = []
    for doc in sorted(DOCS.glob("*.md")):
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # an external address
            file, _, fragment = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif fragment and path.suffix == ".md" and fragment not in _anchors(path):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, "broken links in docs/:\n" + "\n".join(broken)


def test_guide_lists_every_builtin_kind():
    text = (DOCS / "guide.md").read_text(encoding="utf-8")
    for part in REGISTRIES:
        row = re.search(rf"^\| `{part}` \| (.+) \|$", text, flags=re.M)
        assert row, f"docs/guide.md: no row for the {part} registry in the registries table"
        listed = set(re.findall(r"`([^`]+)`", row.group(1)))
        builtin = {kind for kinds, _ in GEN.builtin_kinds(part) for kind in kinds}
        assert listed == builtin, f"docs/guide.md lists {part} kinds {sorted(listed)}, the registry has {sorted(builtin)}"
