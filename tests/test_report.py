"""The report: dashboard files, results schema, raw data, figures (a quick subset; the full run is `slow`)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from verification.figures import FIGURES
from verification.report import build_report

RUN_FIELDS = {"id", "name", "verdict", "tightness", "instances", "excluded", "negative_control", "counterexamples",
              "seconds"}


def _check_common(res, out):
    for name in ("README.md", "index.html", "results.json", "instances.csv"):
        assert (out / name).is_file(), name
    rows = json.loads((out / "results.json").read_text())
    assert rows == res.rows
    for r in rows:
        assert RUN_FIELDS <= set(r)
        assert "figure_data" not in r.get("details", {})
    inst = pd.read_csv(out / "instances.csv")
    assert list(inst.columns) == ["id", "instance", "lhs", "rhs", "ratio"]
    readme = (out / "README.md").read_text()
    html = (out / "index.html").read_text()
    for r in rows:
        assert f"| {r['id']} |" in readme
        assert f"<td>{r['id']}</td>" in html
    for f in res.figures:
        assert (out / "figures" / f).stat().st_size > 10_000, f
        assert f"figures/{f}" in readme and f"figures/{f}" in html
    assert set(res.figures) | set(res.missing_figures) == set(FIGURES)


def test_report_on_a_subset(tmp_path):
    out = tmp_path / "rep"
    lines = []
    res = build_report(out, ids=["H.16", "H.11", "S4"], studies=False, progress=lines.append)
    _check_common(res, out)
    assert lines and any("H.16" in ln for ln in lines)  # progress was reported
    assert {"mixed_cluster_penalty.png", "dispersion_scaling.png", "tightness_overview.png"} <= set(res.figures)
    assert "contraction.png" in res.missing_figures  # its statement did not run: said, not drawn empty
    # the finding stands out and its repaired statement is shown next to it
    readme = (out / "README.md").read_text()
    assert "**FINDING** (repaired: holds" in readme
    assert (out / "counterexamples" / "H.16.json").is_file()
    cex = json.loads((out / "counterexamples" / "H.16.json").read_text())
    assert cex["n_counterexamples"] > 0 and cex["repaired"]["verdict"] == "holds"
    assert (out / "data" / "H.16" / "penalty.csv").is_file()
    assert not res.failed
    assert "findings" in res.summary()


def test_bad_scale_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="scale"):
        build_report(tmp_path, scale="huge", ids=["S4"], studies=False, progress=lambda _: None)


@pytest.mark.slow
def test_full_report_has_every_figure(tmp_path):
    out = tmp_path / "full"
    res = build_report(out, progress=lambda _: None)
    _check_common(res, out)
    assert not res.missing_figures, res.missing_figures
    assert not res.failed, res.summary()
