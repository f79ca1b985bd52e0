"""Command line: list, run with JSON output, unknown ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = {"id", "name", "verdict", "tightness", "instances", "excluded", "negative_control", "counterexamples",
          "seconds"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verification", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_list():
    res = _cli("list")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    rows = {ln.split()[0]: ln.split(None, 2) for ln in lines}
    for k in range(1, 27):
        assert f"S{k}" in rows
    assert rows["S4"][1] == "4" and "Euler" in rows["S4"][2]
    assert len(rows) == len(lines)  # one line per statement, unique ids


def test_run_json(tmp_path):
    out = tmp_path / "out.json"
    res = _cli("run", "S1", "S4", "--json", str(out), "--seed", "5")
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert [d["id"] for d in data] == ["S1", "S4"]
    for d in data:
        assert set(d) - {"details"} == SCHEMA | {"conclusions"}
        assert all({"name", "kind", "tightness", "instances", "excluded", "counterexamples", "power"} <= set(c)
                   for c in d["conclusions"])
        assert d["verdict"] == "holds" and d["negative_control"] == "none"
        assert isinstance(d["counterexamples"], int) and isinstance(d["seconds"], float)
    assert "S1" in res.stdout and "verdict" in res.stdout  # the table
    assert res.stderr.count("\n") >= 2  # one progress line per statement


def test_unknown_id():
    res = _cli("run", "S1", "NOPE.7")
    assert res.returncode != 0
    assert "NOPE.7" in res.stderr and "Valid ids" in res.stderr and "S26" in res.stderr
