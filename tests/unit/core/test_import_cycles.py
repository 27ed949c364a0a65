"""The package's import graph: no cycle anywhere in ``stapo_verl``, and the lab (the CPU platform) imports nothing from
the launcher.

Every ``import`` / ``from … import`` statement of the package counts, at module level and inside functions (a lazy
import still ties the two modules: one cannot be understood, moved or tested without the other). ``from a import b``
is an edge to ``a.b`` when that is a module of the package, else to ``a``; relative imports are resolved. A cycle is
named in the failure as the chain of modules that closes it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stapo_verl

PACKAGE = Path(stapo_verl.__file__).parent


def module_files(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the package's modules its import statements name (see the module docstring)."""
    top = next(iter(files)).split(".")[0]

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = module.split(".")
                    keep = len(parts) - node.level + (1 if path.name == "__init__.py" else 0)
                    base = ".".join(parts[:keep] + ([node.module] if node.module else []))
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
            for name in names:
                target = owner(name) if name.split(".")[0] == top else None
                if target is not None and target != module:
                    edges.add(target)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[m0, m1, …, m0]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(import_graph(module_files()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_walk_finds_a_cycle_and_names_it(tmp_path):
    """The same walk on a small package with a lazy import closing a loop."""
    pkg = tmp_path / "pk"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pk.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    import pk.a\n")
    (pkg / "d.py").write_text("from pk import a\n")
    graph = import_graph(module_files(pkg))
    assert graph["pk.d"] == {"pk.a"} and graph["pk.sub.b"] == {"pk.sub.c"}
    assert find_cycle(graph) == ["pk.a", "pk.sub.b", "pk.sub.c", "pk.a"]
    (pkg / "sub" / "c.py").write_text("def f():\n    import json\n")
    assert find_cycle(import_graph(module_files(pkg))) is None


def test_the_lab_imports_nothing_from_the_launcher():
    """The CPU platform (its rollout server, shims, tiny assets) is the lab: what a GPU job never loads; it may use
    the plugin, never the recipes' launcher."""
    graph = import_graph(module_files())
    lab = {m: sorted(t for t in targets if t.startswith("stapo_verl.launch"))
           for m, targets in graph.items() if m.startswith("stapo_verl.cpu")}
    assert lab and {m: t for m, t in lab.items() if t} == {}
