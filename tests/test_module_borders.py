"""House rules on module borders: no private name (`_x`) crosses a module, and no two modules import each
other (directly or around a longer loop), counting imports inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import m3bench

ROOT = Path(m3bench.__file__).parent


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _imports(tree: ast.Module) -> list[tuple[str, str | None]]:
    """(module, name) of every `from m3bench... import name` and `import m3bench...` (name None)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("m3bench") and not node.level:
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.startswith("m3bench")]
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_crossings(modules: dict[str, ast.Module]) -> list[str]:
    """`from a import _x`, and `a._x` on a module imported whole, across module borders."""
    bad = []
    for name, tree in modules.items():
        aliases = {}
        for module, imported in _imports(tree):
            if imported is not None and _private(imported) and module != name:
                bad.append(f"{name}: from {module} import {imported}")
            if imported is not None and f"{module}.{imported}" in modules:
                aliases[imported] = f"{module}.{imported}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                    and _private(node.attr):
                bad.append(f"{name}: {aliases[node.value.id]}.{node.attr}")
    return bad


def import_graph(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """module -> the package modules it imports (a package's __init__ counts as the package)."""
    graph = {}
    for name, tree in modules.items():
        deps = set()
        for module, imported in _imports(tree):
            target = f"{module}.{imported}" if imported and f"{module}.{imported}" in modules else module
            if target in modules and target != name and not name.startswith(target + "."):
                deps.add(target)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_private_name_crosses_a_module():
    assert private_crossings(_modules()) == []


def test_no_import_cycles():
    assert cycles(import_graph(_modules())) == []


def test_the_checks_see_what_they_guard():
    src = {"m3bench.a": "from m3bench.b import _hidden\n", "m3bench.b": "def f():\n    import m3bench.a\n",
           "m3bench.c": "from m3bench import b\nb._x\n"}
    trees = {k: ast.parse(v) for k, v in src.items()}
    assert private_crossings(trees) == ["m3bench.a: from m3bench.b import _hidden", "m3bench.c: m3bench.b._x"]
    assert cycles(import_graph(trees)) == [["m3bench.a", "m3bench.b"]]
