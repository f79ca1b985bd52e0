"""The layout of :mod:`verification` by role: each sub-package imports only the layers below it, and the module
names of the flat layout before it still import (the same module objects, with a DeprecationWarning)."""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

import verification
from tests.import_graph import circles, describe, import_graph

ROOT = Path(verification.__file__).parent
#: Layer of each sub-package (and of the two top-level modules): a module may import its own layer and those below.
LAYERS = {"core": 0, "statements": 1, "studies": 1, "engine": 2, "llm": 3, "report": 4, "__main__": 5}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every ``verification.*`` module that ``path`` imports, at any depth of the file (imports inside functions
    included), with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
            if node.module == "verification":
                names += [f"verification.{a.name}" for a in node.names]
            out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return [(line, n) for line, n in out if n.startswith("verification.")]


def _layer_of(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def test_every_sub_package_imports_only_downward():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        own = _layer_of(path)
        if own == "__init__":
            continue
        for line, name in _imports(path):
            target = name.split(".")[1]
            assert target in LAYERS, f"{path.relative_to(ROOT)}:{line} imports {name}, outside the layout"
            if LAYERS[target] > LAYERS[own]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({own}) imports {name} ({target})")
    assert not wrong, "imports upward:\n" + "\n".join(wrong)


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check above can fail: an engine module that imports the report is reported."""
    (tmp_path / "engine").mkdir()
    bad = tmp_path / "engine" / "x.py"
    bad.write_text("def f():\n    from verification.report import figures\n")
    assert _imports(bad) == [(2, "verification.report")]
    assert LAYERS["report"] > LAYERS[bad.relative_to(tmp_path).parts[0]]


def test_verification_has_no_import_circle():
    """No two modules of :mod:`verification` import each other, directly or through others, at any depth of the
    file (an import inside a function is an import: a late import does not break a circle)."""
    graph = import_graph(ROOT, "verification")
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(describe(graph, c) for c in found)


def test_the_circle_check_sees_a_planted_circle(tmp_path):
    """The check above can fail: a core module that imports the statements' helpers, which import it back inside
    a function, is a circle, and so is a chain of three modules."""
    root = tmp_path / "verification"
    files = {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/registry.py": "from verification.statements import _helper\n",
        "core/evidence.py": "x = 1\n",
        "statements/__init__.py": "",
        "statements/_helper.py": "from verification.core.evidence import x\n\ndef f():\n"
                                 "    from verification.core import registry\n",
        "engine/a.py": "from . import b\n",
        "engine/b.py": "from verification.engine.c import y\n",
        "engine/c.py": "import verification.engine.a\ny = 2\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    graph = import_graph(root, "verification")
    found = circles(graph)
    assert found == [["verification.core.registry", "verification.statements._helper"],
                     ["verification.engine.a", "verification.engine.b", "verification.engine.c"]]
    assert "verification.statements._helper -> verification.core.registry (l. 4)" in describe(graph, found[0])


def test_the_top_level_holds_only_the_sub_packages_and_the_command_line():
    top = sorted(p.name for p in ROOT.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file()))
    assert top == sorted(["__init__.py", "__main__.py", *[k for k in LAYERS if k != "__main__"]])


@pytest.mark.parametrize("old, new", sorted(verification.MOVED.items()))
def test_an_old_module_name_is_the_moved_module_with_a_warning(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    module = importlib.import_module(new)
    with pytest.warns(DeprecationWarning, match=f"{old} is now {new}"):
        assert importlib.import_module(old) is module
    assert module.__name__ == new and sys.modules[old] is module


def test_the_report_and_the_studies_packages_keep_the_old_modules_names():
    from verification.report import dashboard
    from verification.studies import synthetic

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import verification.report as report
        import verification.studies as studies

        assert report.build_report is dashboard.build_report and studies.STUDIES is synthetic.STUDIES
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        report.no_such_name  # noqa: B018
