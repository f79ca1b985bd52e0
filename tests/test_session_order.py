"""The order of the test session (tests/conftest.py): the LLM runs' modules after all the others, and the modules
on the shared Dask cluster one block (each module's tests in their order), at the first one's place or, when one
of them is an LLM module, between the other modules and the LLM ones."""

from __future__ import annotations

import types
from types import SimpleNamespace

from tests import conftest


def _items(spec):
    """``spec``: (module path, [test names], uses the cluster) per module, in collection order."""
    items = []
    for path, names, cluster in spec:
        module = types.ModuleType(path)  # hashable, as a collected test module is
        for n in names:
            fixtures = (conftest._CLUSTER_FIXTURE,) if cluster else ()
            items.append(SimpleNamespace(nodeid=f"{path}::{n}", module=module, fixturenames=fixtures))
    return items


def _order(spec):
    items = _items(spec)
    conftest.pytest_collection_modifyitems(None, None, items)
    return [i.nodeid for i in items]


def test_llm_modules_run_last_and_the_cluster_modules_are_one_block_between():
    spec = [("tests/llm_runs/test_a.py", ["t1", "t2"], False), ("tests/llm_runs/test_sweep.py", ["s1", "s2"], True),
            ("tests/sim/test_b.py", ["t1"], False), ("tests/verification/engine/test_sweep.py", ["s1", "s2"], True),
            ("tests/verification/test_c.py", ["t1"], False)]
    assert _order(spec) == [
        "tests/sim/test_b.py::t1", "tests/verification/test_c.py::t1",
        "tests/verification/engine/test_sweep.py::s1", "tests/verification/engine/test_sweep.py::s2",
        "tests/llm_runs/test_sweep.py::s1", "tests/llm_runs/test_sweep.py::s2",
        "tests/llm_runs/test_a.py::t1", "tests/llm_runs/test_a.py::t2"]


def test_without_an_llm_module_the_cluster_block_is_at_the_first_ones_place():
    spec = [("tests/sim/test_b.py", ["t1"], False), ("tests/v/test_s1.py", ["a"], True),
            ("tests/v/test_c.py", ["t1"], False), ("tests/v/test_s2.py", ["b"], True),
            ("tests/llm_runs/test_a.py", ["t1"], False)]
    assert _order(spec) == ["tests/sim/test_b.py::t1", "tests/v/test_s1.py::a", "tests/v/test_s2.py::b",
                            "tests/v/test_c.py::t1", "tests/llm_runs/test_a.py::t1"]


def test_without_cluster_modules_only_the_llm_modules_move():
    spec = [("tests/llm_runs/test_a.py", ["t2", "t1"], False), ("tests/sim/test_b.py", ["t1"], False)]
    assert _order(spec) == ["tests/sim/test_b.py::t1", "tests/llm_runs/test_a.py::t2", "tests/llm_runs/test_a.py::t1"]
