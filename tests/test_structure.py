"""The package's shape, read from its source with ``ast`` (nothing is imported):

- no import circle: modules form layers, ``zoo.registry`` at the bottom, ``zoo.cli`` at the top;
- no module takes another module's private name: ``from zoo.x import _name``, ``x._name`` with ``x``
  an imported zoo module or a name imported from one (``Mask._cache``), nor writes an attribute
  ``obj._name = ...`` (``obj._name[key] = ...``) that the module itself never defines;
- the spec modules stay torch-free, so a spec can be read and validated cheaply;
- nothing in zoo imports a recipe or the modules beside the recipes.

Every import counts, at module level or inside a function. ``import zoo.x.y`` and ``from zoo.x
import y`` tie a module to ``zoo.x.y`` when that is a module, else to ``zoo.x``; the parent
packages Python runs on the way are not counted (every module would import ``zoo`` itself).
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "zoo"
TORCH_FREE = ("zoo.registry", "zoo.spec")  # these, and all they import, never import torch


def package_dir(name: str = PACKAGE) -> Path:
    """The package's folder, found without importing it."""
    found = importlib.util.find_spec(name)
    assert found is not None and found.submodule_search_locations, f"{name} is not an importable package"
    return Path(next(iter(found.submodule_search_locations)))


def modules(root: Path, name: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(module: str, path: Path) -> Iterator[tuple[str, str | None]]:
    """``(imported module, imported name or None)`` for every import statement in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x, from ..y import z
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                yield source, alias.name


def import_graph(root: Path, name: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports."""
    known = modules(root, name)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for source, imported in imports(module, path):
            target = f"{source}.{imported}" if imported and f"{source}.{imported}" in known else source
            if target in known and target != module:
                graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def private_imports(root: Path, name: str = PACKAGE) -> list[str]:
    """``module: from source import _name`` for each private name a module takes from another."""
    out = []
    for module, path in modules(root, name).items():
        for source, imported in imports(module, path):
            private = imported is not None and imported.startswith("_") and not imported.startswith("__")
            if private and (source == name or source.startswith(name + ".")):
                out.append(f"{module}: from {source} import {imported}")
    return out


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__") and attr != "_"


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _written(target: ast.AST) -> Iterator[ast.Attribute]:
    """The attributes a store to ``target`` writes into: ``o._a = ``, ``o._a[k] = ``, ``o._a.b = ``."""
    if isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            yield from _written(t)
        return
    while isinstance(target, (ast.Attribute, ast.Subscript, ast.Starred)):
        if isinstance(target, ast.Attribute):
            yield target
        target = target.value


def private_attributes(root: Path, name: str = PACKAGE) -> list[str]:
    """``module: what`` for each private name of another module reached by attribute: ``m._name``
    (``m`` an imported module of the package), ``Name._name`` (``Name`` imported from one), and
    writes ``obj._name = ...`` to a private attribute the module never defines (``self._name = ...``,
    a class body's ``_name``, a ``def _name``)."""
    known = modules(root, name)
    out = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bound: dict[str, str] = {}  # local name -> the package's module it is, or the module it came from
        for source, imported in imports(module, path):
            if imported is None and source.split(".")[0] == name:
                bound[source.split(".")[0]] = name  # import pkg.x.y binds pkg: chains resolve below
            elif imported is not None and (source == name or source.startswith(name + ".")):
                bound[imported] = source
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in known:
                        bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.asname and alias.name in bound:
                        bound[alias.asname] = bound.pop(alias.name)
        defined = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                defined.add(node.attr)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                owner = _dotted(node.value)
                if owner is None or owner.split(".")[0] not in bound:
                    continue
                head, _, rest = owner.partition(".")
                full = f"{bound[head]}.{head}" if f"{bound[head]}.{head}" in known else bound[head]
                full = f"{full}.{rest}" if rest else full
                if full in known and full != module:
                    out.append(f"{module}: {owner}.{node.attr} (a private name of {full})")
            targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                for attr in _written(target):
                    receiver = attr.value.id if isinstance(attr.value, ast.Name) else None
                    if _private(attr.attr) and receiver not in ("self", "cls") and attr.attr not in defined:
                        out.append(f"{module}: writes {_dotted(attr) or attr.attr} (not defined in {module})")
    return sorted(set(out))


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    ties = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "circle of " + ", ".join(component) + ": " + "; ".join(ties)


# ------------------------------------------------------------------------------------------ the checks
def test_no_import_circles():
    graph = import_graph(package_dir())
    assert "zoo.registry" in graph and graph["zoo.cli"], "the import graph was not read"
    found = circles(graph)
    assert not found, "\n".join(_describe(graph, c) for c in found)


def test_the_registry_is_the_bottom():
    assert import_graph(package_dir())["zoo.registry"] == set()


def test_no_private_names_across_modules():
    found = private_imports(package_dir())
    assert not found, "private names imported from another module (give them a public name):\n" + "\n".join(found)


def test_no_private_attributes_across_modules():
    found = private_attributes(package_dir())
    assert not found, ("private names of another module reached by attribute (make them public, or give the "
                       "owner a method):\n" + "\n".join(found))


def test_specs_do_not_import_torch():
    root = package_dir()
    known, graph = modules(root), import_graph(root)
    reached, todo = set(), [m for m in known if m in TORCH_FREE or m.startswith(tuple(f"{t}." for t in TORCH_FREE))]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += graph[module]
    heavy = sorted({f"{m} imports {source}" for m in reached for source, _ in imports(m, known[m])
                    if source.split(".")[0] == "torch"})
    assert not heavy, heavy


def test_zoo_never_imports_a_recipe():
    """Data flows one way: recipes (and the modules beside them) use zoo, never the reverse, so zoo/train
    holds only what every recipe shares."""
    root = package_dir()
    recipes = {p.stem for p in (root.parent / "recipes").glob("*.py")}
    assert {"translate", "translate_eval", "text_data"} <= recipes, "the recipes were not found"
    found = sorted({f"{m} imports {source}" for m, path in modules(root).items() for source, _ in imports(m, path)
                    if source.split(".")[0] in recipes | {"recipes"}})
    assert not found, found


# ------------------------------------------------------------------------------ the checker checks itself
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_checker_sees_imports_inside_functions(tmp_path):
    root = _package(tmp_path, {
        "a.py": "from pkg.b import f\n",
        "b.py": "def f():\n    import pkg.c\n",
        "c.py": "def g():\n    from pkg import a\n",
        "d.py": "from pkg.sub import thing\nfrom . import a\n",
        "sub/__init__.py": "from .leaf import thing\n",
        "sub/leaf.py": "thing = 1\n",
    })
    graph = import_graph(root, "pkg")
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.sub", "pkg.a"} and graph["pkg.sub"] == {"pkg.sub.leaf"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert circles({"x": {"y"}, "y": set()}) == []


def test_the_checker_sees_private_imports(tmp_path):
    root = _package(tmp_path, {
        "a.py": "_hidden = 1\n__version__ = '1'\n",
        "b.py": "from pkg.a import __version__\ndef f():\n    from pkg.a import _hidden\n",
        "c.py": "from os import _exit\n",
    })
    assert private_imports(root, "pkg") == ["pkg.b: from pkg.a import _hidden"]


def test_the_checker_sees_private_attributes(tmp_path):
    root = _package(tmp_path, {
        "a.py": "_LIMIT = 1\nclass Box:\n    _cache = {}\n    def get(self):\n        self._seen = 1\n        return self._cache\n",
        "b.py": ("from pkg import a\nimport pkg.a\nimport pkg.a as alias\nfrom pkg.a import Box\n"
                 "def f(box):\n    box._cache['k'] = a._LIMIT + pkg.a._LIMIT + alias._LIMIT\n    Box._cache = {}\n"
                 "    box._seen.x = 1\n    box.public = a.Box\n    return box._cache\n"),
        "c.py": "import os\nclass C:\n    def __init__(self):\n        self._own = 1\n    def copy(self, other):\n"
                "        other._own = self._own\n        return os._exit\n",
    })
    assert private_attributes(root, "pkg") == [
        "pkg.b: Box._cache (a private name of pkg.a)", "pkg.b: a._LIMIT (a private name of pkg.a)",
        "pkg.b: alias._LIMIT (a private name of pkg.a)", "pkg.b: pkg.a._LIMIT (a private name of pkg.a)",
        "pkg.b: writes Box._cache (not defined in pkg.b)", "pkg.b: writes box._cache (not defined in pkg.b)",
        "pkg.b: writes box._seen (not defined in pkg.b)",
    ]
