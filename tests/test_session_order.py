"""The order of the test session (tests/conftest.py), each module's tests in their order: the other modules, the
modules on the shared Dask cluster as one block, the LLM runs' modules."""

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
        "tests/llm_runs/test_sweep.py::s1", "tests/llm_runs/test_sweep.py::s2",
        "tests/verification/engine/test_sweep.py::s1", "tests/verification/engine/test_sweep.py::s2",
        "tests/llm_runs/test_a.py::t1", "tests/llm_runs/test_a.py::t2"]


def test_a_module_counts_as_a_cluster_user_if_any_of_its_tests_is_one():
    spec = [("tests/v/test_s.py", ["a"], False), ("tests/v/test_s.py", ["b"], True), ("tests/v/test_c.py", ["t"], False)]
    items = _items(spec)
    items[1].module = items[0].module  # one module, two tests, the second on the cluster
    conftest.pytest_collection_modifyitems(None, None, items)
    assert [i.nodeid for i in items] == ["tests/v/test_c.py::t", "tests/v/test_s.py::a", "tests/v/test_s.py::b"]


def test_without_cluster_modules_only_the_llm_modules_move():
    spec = [("tests/llm_runs/test_a.py", ["t2", "t1"], False), ("tests/sim/test_b.py", ["t1"], False)]
    assert _order(spec) == ["tests/sim/test_b.py::t1", "tests/llm_runs/test_a.py::t2", "tests/llm_runs/test_a.py::t1"]
