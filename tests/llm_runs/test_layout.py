"""The layout of :mod:`llm_runs` by role: each sub-package imports only the layers below it, no module imports
another that imports it back (the import graph of ``tests/import_graph.py``, imports inside functions included),
and the module names of the flat layout before it still import (the same module objects, with a
DeprecationWarning). Nothing here needs torch."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import llm_runs
from tests.import_graph import circles, describe, import_graph

ROOT = Path(llm_runs.__file__).parent
#: Layer of each sub-package (and of the command line): a module may import its own layer and those below.
LAYERS = {"model": 0, "preferences": 1, "training": 2, "runs": 3, "sweeps": 4, "gpu": 5, "__main__": 6}


def _layer(module: str) -> str | None:
    """The layer of a module of :mod:`llm_runs` (None for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _upward(graph: dict[str, dict[str, int]]) -> list[str]:
    return [f"{m} ({_layer(m)}) imports {t} ({_layer(t)}) at l. {line}"
            for m, edges in sorted(graph.items()) for t, line in sorted(edges.items())
            if _layer(m) is not None and _layer(t) is not None and LAYERS[_layer(t)] > LAYERS[_layer(m)]]


def test_every_module_is_in_a_layer_and_imports_only_downward():
    graph = import_graph(ROOT, "llm_runs")
    outside = sorted(m for m in graph if _layer(m) is not None and _layer(m) not in LAYERS)
    assert not outside, f"modules outside the layout: {outside}"
    assert not _upward(graph), "imports upward:\n" + "\n".join(_upward(graph))


def test_no_import_circles():
    graph = import_graph(ROOT, "llm_runs")
    assert circles(graph) == [], "\n".join(describe(graph, c) for c in circles(graph))


def test_the_checks_report_a_planted_circle_and_an_upward_import(tmp_path):
    """The two checks above can fail: a copy of the package in which a run module imports the sweep (upward) and the
    sweep imports it back (a circle, the import being late, inside a function) is reported by both."""
    pkg = tmp_path / "llm_runs"
    for sub in ("runs", "sweeps"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "runs" / "run.py").write_text("def f():\n    from llm_runs.sweeps.sweep import g\n")
    (pkg / "sweeps" / "sweep.py").write_text("from llm_runs.runs import run\n\n\ndef g():\n    pass\n")
    graph = import_graph(pkg, "llm_runs")
    assert circles(graph) == [["llm_runs.runs.run", "llm_runs.sweeps.sweep"]]
    assert describe(graph, circles(graph)[0]) == ("llm_runs.runs.run -> llm_runs.sweeps.sweep (l. 2); "
                                                   "llm_runs.sweeps.sweep -> llm_runs.runs.run (l. 1)")
    assert _upward(graph) == ["llm_runs.runs.run (runs) imports llm_runs.sweeps.sweep (sweeps) at l. 2"]


def test_the_top_level_holds_only_the_sub_packages_and_the_command_line():
    top = sorted(p.name for p in ROOT.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file()))
    assert top == sorted(["__init__.py", "__main__.py", *[k for k in LAYERS if k != "__main__"]])


@pytest.mark.parametrize("old, new", sorted(llm_runs.MOVED.items()))
def test_an_old_module_name_is_the_moved_module_with_a_warning(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a module's own imports may warn (third-party packages)
        module = importlib.import_module(new)
    with pytest.warns(DeprecationWarning, match=f"{old} is now {new}"):
        assert importlib.import_module(old) is module
    assert module.__name__ == new and sys.modules[old] is module


def test_the_run_module_keeps_the_names_of_its_presets_and_records_with_a_warning():
    from llm_runs.runs import presets, records, run

    with pytest.warns(DeprecationWarning, match="llm_runs.runs.run.PRESETS is now llm_runs.runs.presets.PRESETS"):
        assert run.PRESETS is presets.PRESETS
    with pytest.warns(DeprecationWarning, match="llm_runs.runs.run.OBJECTIVES_3 is now llm_runs.runs.presets"):
        assert run.OBJECTIVES_3 is presets.OBJECTIVES_3
    assert run.write_json is records.write_json and run.RecordWriter is records.RecordWriter  # the run uses them
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        run.no_such_name  # noqa: B018


def test_the_old_name_of_the_gpu_check_still_runs_as_a_command():
    """``python -m llm_runs.gpu_check`` (the old module name) runs the GPU check's command line."""
    res = subprocess.run([sys.executable, "-m", "llm_runs.gpu_check", "--help"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT.parent)
    assert res.returncode == 0, res.stderr
    assert "usage: python -m llm_runs.gpu.check" in res.stdout and "preflight" in res.stdout
