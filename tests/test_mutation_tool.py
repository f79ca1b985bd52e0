"""Tests of tools/mutation.py, the mutation-testing runner behind `make mutation` (the mutant generator here; a
full run against a real test file is in the slow tier)."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_tool():
    spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutation_tool"] = mod
    spec.loader.exec_module(mod)
    return mod


mt = _load_tool()

_SNIPPET = '''"""Docstring: not mutated."""
__all__ = ["f"]


def f(x: int, y: float = 0.5) -> float:
    """Not mutated either."""
    if x < 2 and not y:
        raise ValueError(f"x={x} is bad")
    z = np.argmin([x, y], axis=-1)
    for _ in range(3):
        break
    return -z * 2.0
'''


def _mutants_of(tmp_path, text):
    path = tmp_path / "mod.py"
    path.write_text(text)
    return mt.enumerate_mutants(path, "mod.py")


def _changes(tmp_path, text, expected):
    """The mutants of ``text`` (all of which compile) and their ``(operator, change)`` set, which holds every
    pair of ``expected``."""
    mutants, invalid = _mutants_of(tmp_path, text)
    assert invalid == 0
    changes = {(m.operator, m.change) for m in mutants}
    missing = [e for e in expected if e not in changes]
    assert not missing, missing
    return mutants, changes


def test_operators_on_a_snippet(tmp_path):
    mutants, _ = _changes(tmp_path, _SNIPPET, [
        ("compare", "x < 2  ->  (x <= 2)"),
        ("compare", "x < 2  ->  (x >= 2)"),
        ("boolop", "x < 2 and not y  ->  (x < 2 or not y)"),
        ("unary", "not y  ->  (y)"),
        ("negate-cond", "x < 2 and not y  ->  (not (x < 2 and (not y)))"),
        ("delete", 'raise ValueError(f"x={x} is bad")  ->  pass'),
        ("swap-name", "np.argmin  ->  (np.argmax)"),
        ("drop-keyword", "np.argmin([x, y], axis=-1)  ->  (np.argmin([x, y]))"),
        ("constant", "2.0  ->  (3.0)"),
        ("constant", "0.5  ->  (0.0)"),
        ("constant", "3  ->  (4)"),
        ("break-continue", "break  ->  continue"),
        ("return-none", "return -z * 2.0  ->  return None"),
        ("binop", "-z * 2.0  ->  (-z / 2.0)"),
    ])
    # docstrings, __all__, annotations, imports and f-string messages stay as they are
    assert not any("Docstring" in m.original or "Not mutated" in m.original for m in mutants)
    assert not any(m.original in ('"f"', "int", "float") for m in mutants)
    assert not any("is bad" in m.original and m.operator == "constant" for m in mutants)


_SNIPPET_NEW = '''
def g(x, tol=1e-6):
    assert x >= 0, "x must be >= 0"
    assert x is not None
    y = x if x <= 3 else 2 * x
    return y < tol
'''


def test_reverse_scale_and_negation_operators(tmp_path):
    """The operators an independent mutator also applies: comparisons turned around, numbers doubled (tolerances
    also x1000), asserts and conditional expressions negated."""
    mutants, changes = _changes(tmp_path, _SNIPPET_NEW, [
        ("reverse", "x >= 0  ->  (x <= 0)"),
        ("reverse", "x <= 3  ->  (x >= 3)"),
        ("reverse", "y < tol  ->  (y > tol)"),
        ("scale", "1e-6  ->  (2e-06)"),
        ("scale", "1e-6  ->  (0.001)"),
        ("scale", "3  ->  (6)"),
        ("negate-assert", "x >= 0  ->  (not (x >= 0))"),
        ("negate-cond", "x <= 3  ->  (not (x <= 3))"),  # the conditional expression
    ])
    # 2 -> 4 is a scale mutant, but 1 -> 2 stays the constant mutant it already was; 0 has no scaled mutant
    assert ("scale", "2  ->  (4)") in changes and not any(m.operator == "scale" and m.original == "0" for m in mutants)
    # no negation that a compare mutant already is; messages of asserts are not mutated
    assert not any(m.operator == "negate-assert" and "is not None" in m.original for m in mutants)
    assert not any("must be" in m.original for m in mutants if m.operator != "delete")
    # the new operators leave the ids of the old ones as they were: the old operators' mutants are the same set
    old = {m.id for m in mutants if m.operator not in ("reverse", "scale", "negate-assert")}
    assert len(old) == len({(m.span, m.replacement) for m in mutants if m.id in old})


def test_compile_options_and_ellipsis_bodies_are_not_mutated(tmp_path):
    """numba's decorator options and a Protocol's ``...`` body give no mutant; the decorated body does."""
    mutants, _ = _mutants_of(tmp_path, "@njit(cache=True, inline='always')\ndef h(a):\n    return a + 1\n\n\n"
                                       "class P:\n    def f(self) -> int: ...\n")
    assert {m.line for m in mutants} == {3}
    assert {m.operator for m in mutants} >= {"binop", "constant", "return-none"}


def test_every_mutant_of_the_kernels_compiles_and_changes_the_module():
    for rel in ("sim/cluster.py", "sim/hull.py"):
        source = (ROOT / rel).read_bytes()
        mutants, invalid = mt.enumerate_mutants(ROOT / rel, rel)
        assert invalid == 0 and len(mutants) > 300
        assert len({m.id for m in mutants}) == len(mutants)
        original = ast.dump(ast.parse(source))
        for m in mt.sample_mutants(mutants, 12, 0, rel):
            mutated = m.apply(source)
            assert ast.dump(ast.parse(mutated)) != original, m.change
            # the splice touches only the node's own lines: line numbers elsewhere are unchanged
            assert mutated.count(b"\n") - source.count(b"\n") == m.replacement.count("\n") - m.original.count("\n")


def test_sampling_is_seeded_and_ids_survive_edits_elsewhere(tmp_path):
    mutants, _ = mt.enumerate_mutants(ROOT / "sim/hull.py", "sim/hull.py")
    a = mt.sample_mutants(mutants, 60, 0, "sim/hull.py")
    assert [m.id for m in a] == [m.id for m in mt.sample_mutants(mutants, 60, 0, "sim/hull.py")]
    assert len(a) == 60 and [m.id for m in a] != [m.id for m in mt.sample_mutants(mutants, 60, 1, "sim/hull.py")]
    assert mt.sample_mutants(mutants, 0, 0, "sim/hull.py") == mutants
    shifted, _ = _mutants_of(tmp_path, "# a comment\n\n\n" + _SNIPPET)
    plain, _ = _mutants_of(tmp_path, _SNIPPET)
    assert {m.id for m in shifted} == {m.id for m in plain}
    assert {m.line for m in shifted} == {m.line + 3 for m in plain}


def test_equivalents_file_is_well_formed():
    eq = mt.load_equivalents(ROOT / "tools" / "mutation_equivalents.toml")
    for entry in eq.values():
        assert (ROOT / entry["file"]).is_file()
        assert len(entry["reason"]) > 20


def test_usage_errors_exit_2(capsys):
    for argv, named in ((["--n", "-1"], "--n"), (["--jobs", "0"], "--jobs"), (["--files", "sim/nope.py"], "sim/nope.py"),
                        (["--fail-under", "2"], "--fail-under"), (["--seed", "x"], "--seed")):
        with pytest.raises(SystemExit) as exc:
            mt.main(argv)
        assert exc.value.code == 2
        assert named in capsys.readouterr().err


@pytest.mark.slow
def test_end_to_end_run_kills_and_reports(tmp_path):
    out = tmp_path / "m.json"
    assert mt.main(["--files", "sim/hull.py", "--n", "3", "--seed", "0", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    (f,) = rep["files"]
    assert f["sampled"] == 3 and sum(f["counts"].values()) == 3
    assert {r["status"] for r in f["results"]} <= {"killed", "survived", "timeout", "equivalent"}


def test_a_file_may_name_several_test_files():
    pairs = [(t.src, t.tests) for t in mt._parse_files(
        ["sim/hull.py", "sim/direction.py=tests/sim/test_direction.py, tests/sim/test_direction_twin.py"])]
    assert pairs == [("sim/hull.py", "tests/sim/test_hull.py"),
                     ("sim/direction.py", "tests/sim/test_direction.py,tests/sim/test_direction_twin.py")]
    assert ("sim/direction.py", "tests/sim/test_direction.py,tests/sim/test_direction_twin.py") in [
        (t.src, t.tests) for t in mt._parse_files(list(mt.DEFAULT_FILES))]
    for spec, named in (("sim/direction.py=tests/sim/test_direction.py,tests/nope.py", "tests/nope.py"),
                        ("sim/direction.py=tests/sim/test_direction.py,", "''")):
        with pytest.raises(ValueError, match=re.escape(named)):
            mt._parse_files([spec])


def test_a_file_may_select_functions_and_set_its_environment(tmp_path):
    t, = mt._parse_files(["sim/algorithm::random_partition,same_partition=tests/sim/test_clustering_comparison.py"
                          "@NUMBA_DISABLE_JIT=1,A_B="])
    assert (t.src, t.tests, t.functions) == ("sim/algorithm", "tests/sim/test_clustering_comparison.py",
                                             ("random_partition", "same_partition"))
    assert t.env == (("NUMBA_DISABLE_JIT", "1"), ("A_B", ""))
    assert t.label == "sim/algorithm::random_partition,same_partition"
    mutants, _ = _mutants_of(tmp_path, "def random_partition(x):\n    return x + 1\n\n\ndef same_partition(a):\n"
                                       "    return a * 2\n\n\ndef other(b):\n    return b - 1\n\n\nclass ClusterConfig:\n"
                                       "    k: int = 3\n\n    def check(self):\n        return self.k > 0\n")
    picked = [m for m in mutants if t.selects(m)]
    assert picked and {m.function for m in picked} == {"random_partition", "same_partition"}
    # a class name selects its methods
    cfg, = mt._parse_files(["sim/algorithm::ClusterConfig=tests/sim/test_algorithm_configs.py"])
    assert {m.function for m in mutants if cfg.selects(m)} == {"ClusterConfig", "ClusterConfig.check"}
    for spec, named in (("sim/hull.py::", "empty function name"), ("sim/hull.py@X", "'X'"),
                        ("sim/hull.py@1A=2", "'1A=2'"), ("sim/hull.py sim/hull.py", "twice")):
        with pytest.raises(ValueError, match=re.escape(named)):
            mt._parse_files(spec.split())
    # the compiled twin is mutated as Python, against the twin tests
    assert "sim/_lp_compiled.py=tests/sim/test_direction_twin.py@NUMBA_DISABLE_JIT=1" in mt.DEFAULT_FILES


def _package(root: Path) -> None:
    """A package ``pkg`` with a sub-package, its modules written out of their path order."""
    for rel, text in (("pkg/b.py", "def g(y):\n    return y * 3\n"), ("pkg/__init__.py", "from pkg.a import f\n"),
                      ("pkg/sub/c.py", "def h(z):\n    return z - 1\n"), ("pkg/a.py", "def f(x):\n    return x + 1\n"),
                      ("pkg/sub/__init__.py", '"""Sub-package."""\n'), ("pkg/__pycache__/a.py", "def f(x):\n    return 0\n")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_a_package_is_mutated_module_by_module_in_path_order(tmp_path):
    """A package's mutants are its modules' (``__pycache__`` left out), module after module in the order of their
    paths, each with its own file:line and the id it has as a file of its own; the sample is seeded by the entry."""
    _package(tmp_path)
    files = ["pkg/__init__.py", "pkg/a.py", "pkg/b.py", "pkg/sub/__init__.py", "pkg/sub/c.py"]
    assert mt.source_files(tmp_path, "pkg") == files
    assert mt.source_files(tmp_path, "pkg/a.py") == ["pkg/a.py"]
    mutants, invalid = mt.enumerate_source(tmp_path, "pkg")
    assert invalid == 0
    assert mutants == [m for f in files for m in mt.enumerate_mutants(tmp_path / f, f)[0]]
    assert {m.file for m in mutants} == {"pkg/a.py", "pkg/b.py", "pkg/sub/c.py"}
    assert all(m.where == f"{m.file}:2" and m.source_line.startswith("return") for m in mutants)
    sample = mt.sample_mutants(mutants, 4, 0, "pkg")
    assert [m.id for m in sample] == [m.id for m in mt.sample_mutants(mutants, 4, 0, "pkg")]
    assert [m.id for m in sample] == sorted((m.id for m in sample), key=[m.id for m in mutants].index)


def test_the_algorithm_package_is_an_entry():
    """``sim/algorithm`` (a package, with or without the trailing slash) is one entry over all of its modules, its
    default test file named after the package (Algorithm 1's tests, one file per layer, are named in the defaults);
    a directory that is no package is refused; a package's ``__init__.py`` is imported by the package's name."""
    t, = mt._parse_files(["sim/algorithm/=tests/sim/test_algorithm_phases.py"])
    assert (t.src, t.tests, t.label) == ("sim/algorithm", "tests/sim/test_algorithm_phases.py", "sim/algorithm")
    with pytest.raises(ValueError, match=re.escape("'tests/sim/test_algorithm.py' does not exist")):
        mt._parse_files(["sim/algorithm"])
    files = mt.source_files(ROOT, "sim/algorithm")
    assert files[0] == "sim/algorithm/__init__.py" and len(files) > 5 and files == sorted(files)
    with pytest.raises(ValueError, match="neither a Python source file nor a package"):
        mt._parse_files(["docs"])
    assert mt._module_name("sim/algorithm/__init__.py") == "sim.algorithm"
    assert mt._module_name("sim/algorithm/phases.py") == "sim.algorithm.phases"
    entry, = (s for s in mt.DEFAULT_FILES if s.startswith("sim/algorithm="))
    assert entry.split("=")[1].split(",")[:4] == [f"tests/sim/test_algorithm_{m}.py" for m in mt.ALGORITHM_TESTS]
    assert f"sim/algorithm::{mt.CLUSTERING_COMPARISON}=tests/sim/test_clustering_comparison.py" in mt.DEFAULT_FILES


def _package_repo(tmp_path: Path) -> tuple[Path, dict]:
    """:func:`_package` in a git repository of its own with a test that kills every mutant; and its files' bytes."""
    repo = tmp_path / "repo"
    _package(repo)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_pkg.py").write_text("import pkg\nfrom pkg.b import g\nfrom pkg.sub.c import h\n\n\n"
                                                "def test_pkg():\n    assert (pkg.f(1), g(2), h(5)) == (2, 6, 4)\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / ".gitignore").write_text("__pycache__/\n")
    return repo, {p: p.read_bytes() for p in repo.rglob("*.py")}


def test_a_run_over_a_package_mutates_each_module_in_its_copy(tmp_path, monkeypatch):
    """End to end on a package in a repository of its own: every mutant is written into its own module of the copy
    (the working tree is left as it was), killed by the package's test, and reported with its module."""
    repo, before = _package_repo(tmp_path)
    monkeypatch.setattr(mt, "REPO", repo)
    out = tmp_path / "m.json"
    assert mt.main(["--files", "pkg", "--n", "0", "--runner", "fork", "--json", str(out),
                    "--equivalents", str(tmp_path / "none.toml")]) == 0
    (f,) = json.loads(out.read_text())["files"]
    assert f["file"] == "pkg" and f["tests"] == "tests/test_pkg.py" and f["sampled"] == f["total_mutants"] > 6
    assert {r["file"] for r in f["results"]} == {"pkg/a.py", "pkg/b.py", "pkg/sub/c.py"}
    assert all(r["status"] == "killed" and r["where"] == f"{r['file']}:2" for r in f["results"])
    assert [r["file"] for r in f["results"]] == sorted(r["file"] for r in f["results"])
    assert {p: p.read_bytes() for p in repo.rglob("*.py")} == before


@pytest.mark.e2e
def test_the_subprocess_runner_kills_in_a_new_interpreter(tmp_path, monkeypatch):
    """``--runner subprocess`` (a new interpreter per mutant, where there is no fork): two of the package's
    mutants, each killed in its module of the copy, the working tree left as it was."""
    repo, before = _package_repo(tmp_path)
    monkeypatch.setattr(mt, "REPO", repo)
    out = tmp_path / "m.json"
    assert mt.main(["--files", "pkg", "--n", "2", "--seed", "0", "--runner", "subprocess", "--json", str(out),
                    "--equivalents", str(tmp_path / "none.toml")]) == 0
    (f,) = json.loads(out.read_text())["files"]
    assert f["sampled"] == 2 and [r["status"] for r in f["results"]] == ["killed", "killed"]
    assert json.loads(out.read_text())["meta"]["runner"] == "subprocess"
    assert {p: p.read_bytes() for p in repo.rglob("*.py")} == before
