"""Bound regression against a committed baseline of the default run, tested both ways."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from verification.core import registry
from verification.core.regression import compare, load_results, shipped_baseline

ROOT = Path(__file__).resolve().parents[3]
BASELINE = shipped_baseline()
# Fast statements (a few seconds together) compared against the committed baseline of the full default run.
SUBSET = ["S4", "H.14", "H.15", "H.9"]


def _row(sid="H.1", verdict="holds", tightness=0.5, control="detected"):
    return {"id": sid, "name": sid, "verdict": verdict, "tightness": tightness, "instances": 10, "excluded": 0,
            "negative_control": control, "counterexamples": 0, "seconds": 0.1}


def test_compare_passes_on_identical_runs_and_round_off():
    base = [_row("A"), _row("B", tightness=None, control="none"), _row("C", verdict="finding")]
    cur = copy.deepcopy(base)
    cur[0]["tightness"] = 0.5 * (1 + 1e-6)
    reg = compare(cur, base)
    assert reg.ok, reg.summary()
    assert reg.compared == 3


@pytest.mark.parametrize(
    "change, fragment",
    [
        (dict(verdict="violated"), "verdict holds -> violated"),
        (dict(verdict="vacuous"), "verdict holds -> vacuous"),
        (dict(control="missed"), "negative control detected -> missed"),
        (dict(tightness=0.9), "tighter"),
        (dict(tightness=0.1), "looser"),
        (dict(tightness=None), "tightness"),
    ],
)
def test_compare_fails_on_each_kind_of_regression(change, fragment):
    base = [_row("A")]
    kw = dict(sid="A", verdict="holds", tightness=0.5, control="detected")
    kw.update({k: v for k, v in change.items()})
    reg = compare([_row(**kw)], base)
    assert not reg.ok
    assert fragment in reg.failures[0]


def test_finding_that_stops_reproducing_is_a_regression():
    reg = compare([_row("H.16", verdict="vacuous")], [_row("H.16", verdict="finding")])
    assert not reg.ok


def test_subset_runs_and_new_statements_do_not_fail():
    reg = compare([_row("A"), _row("NEW")], [_row("A"), _row("OLD")])
    assert reg.ok and reg.new == ["NEW"] and reg.not_run == ["OLD"]


def test_bad_baseline_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"not": "a list"}')
    with pytest.raises(ValueError, match="not a results list"):
        load_results(p)


def _run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "verification", "run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_committed_baseline_covers_the_default_run():
    rows = load_results(BASELINE)
    ids = {r["id"] for r in rows}
    assert set(SUBSET) <= ids
    assert all(r["verdict"] in ("holds", "finding") for r in rows), "the committed baseline must be green"


@pytest.fixture(scope="module")
def subset_run(tmp_path_factory):
    """One `run SUBSET --shipped-baseline --json PATH` (the real command line): its process and its results log,
    which the changed-baseline test resumes instead of running the same statements again."""
    path = tmp_path_factory.mktemp("subset") / "results.json"
    return _run_cli(*SUBSET, "--shipped-baseline", "--json", str(path)), path


@pytest.mark.e2e
def test_current_run_matches_committed_baseline(subset_run):
    proc, _ = subset_run  # the baseline shipped in the package
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 regression(s)" in proc.stdout


@pytest.mark.e2e
def test_deliberately_changed_baseline_fails(subset_run, tmp_path, capsys):
    """The rows of the subset run (its results log, --resume), compared by `run` with a baseline in which H.14's
    bound was much looser and H.15's finding a holds."""
    from verification.__main__ import main

    _, results = subset_run
    rows = load_results(BASELINE)
    for r in rows:
        if r["id"] == "H.14":
            r["tightness"] = float(r["tightness"]) * 0.5  # the bound was much looser "before"
        if r["id"] == "H.15":
            r["negative_control"] = "detected"
            r["verdict"] = "holds"
    changed = tmp_path / "baseline.json"
    changed.write_text(json.dumps(rows))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "run_statement", lambda *a, **k: pytest.fail("a statement of the log ran again"))
        code = main(["run", *SUBSET, "--json", str(results), "--resume", "--baseline", str(changed)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "REGRESSION H.14: tightness" in out


def test_counterexample_count_change_is_a_regression():
    base = [_row("H.16", verdict="finding")]
    base[0]["counterexamples"] = 195
    cur = copy.deepcopy(base)
    cur[0]["counterexamples"] = 189
    reg = compare(cur, base)
    assert not reg.ok and "counterexamples 195 -> 189" in reg.failures[0]


def test_residual_tightness_is_compared_against_its_floor_not_relatively():
    """H.5/H.6-style rows: an identity residual's tightness is roundoff; below the stated floor any two values are
    equal (the BLAS kernel moved H.5 from 4.44e-6 to 4.37e-6), above it the residual has grown: a regression."""
    base = [_row("H.5", tightness=4.44e-6)]
    base[0]["tightness_floor"] = 1e-3
    cur = copy.deepcopy(base)
    cur[0]["tightness"] = 4.37e-6
    assert compare(cur, base).ok
    cur[0]["tightness"] = 2e-3
    reg = compare(cur, base)
    assert not reg.ok and "roundoff floor" in reg.failures[0]
    # without a floor the same change is a (relative) regression
    del base[0]["tightness_floor"], cur[0]["tightness_floor"]
    cur[0]["tightness"] = 4.37e-6
    assert not compare(cur, base).ok


def test_committed_baseline_states_the_floor_of_the_residual_checks():
    rows = {r["id"]: r for r in load_results(BASELINE)}
    for sid in ("H.5", "H.6"):
        assert rows[sid]["tightness_floor"] > rows[sid]["tightness"]
    assert sum("tightness_floor" in r for r in rows.values()) == 2


# Statements whose instances end on the preference ray (the converged regime), where roundoff once decided the LP.
ON_RAY = ["H.15", "H.28", "H.29", "H.31", "CorC"]


def _run_main(capsys, *args) -> tuple[int, str]:
    """``python -m verification run ARGS`` in this process (the jitter mode is under test here, not the process:
    ``subset_run`` above runs the real command line)."""
    from verification.__main__ import main

    code = main(["run", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_roundoff_sensitivity_mode_matches_the_baseline_on_the_on_ray_statements(capsys):
    """`run --jitter 1e-14`: every problem's data perturbed by a relative 1e-14; verdicts, negative controls,
    counterexample counts and tightness must match the committed baseline (this catches the next BLAS dependence
    without changing the BLAS kernel)."""
    code, out = _run_main(capsys, *ON_RAY, "--jitter", "1e-14", "--baseline", str(BASELINE))
    assert code == 0, out
    assert f"{len(ON_RAY)} statement(s) compared, 0 regression(s)" in out


def test_roundoff_sensitivity_mode_can_fail(capsys):
    """The jitter mode is not vacuous: at a relative 1e-3 the problems differ enough to move tightness."""
    code, out = _run_main(capsys, "H.15", "--jitter", "9e-4", "--baseline", str(BASELINE))
    assert code == 1 and "REGRESSION H.15" in out, out


def test_non_finite_tightness_spelled_as_strings_is_compared():
    """results.json spells non-finite floats "nan"/"inf" (strict JSON): they are values, not missing values."""
    assert not compare([_row("A", tightness=0.5)], [_row("A", tightness="inf")]).ok
    assert not compare([_row("A", tightness="nan")], [_row("A", tightness="inf")]).ok
    assert compare([_row("A", tightness="inf")], [_row("A", tightness="inf")]).ok
