"""Bound regression against a committed baseline of the default run, tested both ways."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from verification.regression import compare, load_results

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tests" / "data" / "baseline_results.json"
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


def test_current_run_matches_committed_baseline():
    proc = _run_cli(*SUBSET, "--baseline", str(BASELINE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 regression(s)" in proc.stdout


def test_deliberately_changed_baseline_fails(tmp_path):
    rows = load_results(BASELINE)
    for r in rows:
        if r["id"] == "H.14":
            r["tightness"] = float(r["tightness"]) * 0.5  # the bound was much looser "before"
        if r["id"] == "H.15":
            r["negative_control"] = "detected"
            r["verdict"] = "holds"
    changed = tmp_path / "baseline.json"
    changed.write_text(json.dumps(rows))
    proc = _run_cli(*SUBSET, "--baseline", str(changed))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REGRESSION H.14: tightness" in proc.stdout
