"""The import-graph reader the layout tests use (:mod:`tests.import_graph`): it sees a planted circle, a late
import inside a function, relative imports and ``from package import module``; and :mod:`sim` and :mod:`prefalign`
have no circle."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.import_graph import circles, describe, import_graph


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_planted_circle_through_a_late_import_is_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from pkg.low import b\n",
        "low/b.py": "def f():\n    from ..high import c\n",
        "high/__init__.py": "",
        "high/c.py": "from pkg.low.a import name\nimport os\n",
        "high/d.py": "from pkg.high import c\n",
    })
    graph = import_graph(root, "pkg")
    assert graph["pkg.low.b"] == {"pkg.high.c": 2}
    assert graph["pkg.high.c"] == {"pkg.low.a": 1}
    found = circles(graph)
    assert found == [["pkg.high.c", "pkg.low.a", "pkg.low.b"]]
    assert "pkg.low.b -> pkg.high.c (l. 2)" in describe(graph, found[0])


def test_a_layered_package_has_no_circle(tmp_path):
    root = _package(tmp_path, {"__init__.py": "from pkg.a import x\n", "a.py": "x = 1\n",
                               "b.py": "from pkg import a\nfrom . import a as again\n"})
    graph = import_graph(root, "pkg")
    assert graph["pkg.b"] == {"pkg.a": 1} and graph["pkg"] == {"pkg.a": 1}
    assert circles(graph) == []


@pytest.mark.parametrize("package", ["sim", "prefalign"])
def test_the_package_has_no_import_circle(package):
    root = Path(importlib.import_module(package).__file__).parent
    graph = import_graph(root, package)
    assert not circles(graph), "\n".join(describe(graph, c) for c in circles(graph))
