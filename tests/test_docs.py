"""The docs stay true: the spec reference matches the code, the extension example runs, links resolve."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import zoo
from zoo.registry import REGISTRIES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("make_spec_reference", DOCS / "make_spec_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.fixture
def restore_registries():
    """Parts registered by the docs' examples do not leak into other tests."""
    saved = {name: (dict(r._specs), dict(r._builders)) for name, r in REGISTRIES.items()}
    yield
    for name, (specs, builders) in saved.items():
        r = zoo.registry(name)
        r._specs.clear(), r._specs.update(specs)
        r._builders.clear(), r._builders.update(builders)


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


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_extending_example_runs(tmp_path, monkeypatch, restore_registries):
    text = (DOCS / "extending.md").read_text(encoding="utf-8")
    # YAML blocks that start with "# NAME.yaml" are the files the Python blocks read
    for body in _blocks(text, "yaml"):
        first = body.splitlines()[0]
        if re.fullmatch(r"# [\w.-]+\.ya?ml", first):
            (tmp_path / first[2:]).write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code = _blocks(text, "python")
    assert code, "docs/extending.md has no Python example"
    namespace: dict = {"__name__": "docs_extending"}
    for i, block in enumerate(code):
        code_object = compile(block, f"docs/extending.md (python block {i + 1})", "exec", dont_inherit=True)
        exec(code_object, namespace)  # dont_inherit: run as written, without this file's __future__ imports


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
