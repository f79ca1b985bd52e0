"""The import graph of a package, read from its sources (nothing is imported): which of its modules each module
imports, at any depth of the file (imports inside functions count: a late import does not break a circle), and the
circles of that graph (strongly connected components of more than one module, or a module that imports itself).

Used by the layout tests of :mod:`verification`, :mod:`llm_runs` and :mod:`sim`.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(root: Path, package: str, path: Path) -> str:
    """The dotted name of the module at ``path`` in the package ``package`` whose folder is ``root``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def import_graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """``{module: {imported module of the package: first line}}`` for every ``.py`` file under ``root`` (the folder
    of ``package``). ``from a.b import c`` is an import of ``a.b.c`` where that is a module of the package, else of
    ``a.b``; relative imports are resolved; imports of other packages are left out."""
    files = {module_name(root, package, p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        here = name if is_pkg else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            for t in targets:
                while t and t not in files:  # `import a.b.c` where c is a name: the nearest module above
                    t = t.rpartition(".")[0]
                if t and t != name and (t == package or t.startswith(package + ".")):
                    edges.setdefault(t, node.lineno)
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The circles of ``graph``: its strongly connected components of two or more modules (Tarjan's algorithm,
    iterative), each sorted, sorted by their first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def describe(graph: dict[str, dict[str, int]], circle: list[str]) -> str:
    """One circle in words: each module of it with the modules of the circle it imports and the line."""
    members = set(circle)
    return "; ".join(f"{m} -> " + ", ".join(f"{t} (l. {line})" for t, line in sorted(graph[m].items())
                                            if t in members) for m in circle)
