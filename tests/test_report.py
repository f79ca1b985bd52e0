"""The report: dashboard files, results schema, raw data, figures (a quick subset; the full run is `slow`)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from verification.figures import FIGURES
from verification.report import build_report
from verification.resultlog import ResultLogError

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
    assert list(inst.columns) == ["id", "instance", "lhs", "rhs", "ratio", "conclusion"]
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


# ------------------------------------------------------------------------------ results log and --resume

RESUME_IDS = ["H.11", "H.9", "S4"]  # H.11 has figure tables and a counterexample file


def _tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def uninterrupted_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "rep"
    return build_report(out, ids=RESUME_IDS, studies=False, progress=lambda _: None), out


def test_report_logs_each_statement(uninterrupted_report):
    res, out = uninterrupted_report
    lines = [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines()]
    assert lines[0]["command"] == "report" and lines[0]["ids"] == RESUME_IDS
    assert [ln["row"] for ln in lines[1:]] == res.rows
    assert lines[1]["report"]["tables"] == ["clusters", "scaling"] and lines[1]["report"]["counterexample_file"]


def test_interrupted_report_resumes_to_the_same_report(tmp_path, interrupt_after, uninterrupted_report):
    full, full_out = uninterrupted_report
    out = tmp_path / "rep"
    interrupt_after(1)
    with pytest.raises(KeyboardInterrupt):
        build_report(out, ids=RESUME_IDS, studies=False, progress=lambda _: None)
    assert not (out / "results.json").exists()
    assert (out / "data" / "H.11" / "scaling.csv").is_file()  # the finished statement's files are kept
    ran = interrupt_after(10)
    lines = []
    res = build_report(out, ids=RESUME_IDS, studies=False, progress=lines.append, resume=True)
    assert ran == RESUME_IDS[1:]
    assert any("H.11" in ln and "from" in ln for ln in lines)
    _check_common(res, out)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in res.rows]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in full.rows]
    assert res.figures == full.figures and res.missing_figures == full.missing_figures
    assert "dispersion_scaling.png" in res.figures  # drawn from the tables the interrupted run wrote
    new, old = _tree(out), _tree(full_out)
    assert set(new) == set(old)
    same = {"instances.csv"} | {f for f in old if f.startswith(("data/", "counterexamples/", "figures/"))}
    assert {f for f in same if new[f] != old[f]} == set()  # byte for byte


def test_report_resume_with_another_seed_is_refused(tmp_path, capsys, uninterrupted_report):
    from verification.__main__ import main

    _, full_out = uninterrupted_report
    out = tmp_path / "rep"
    out.mkdir()
    (out / "results.jsonl").write_bytes((full_out / "results.jsonl").read_bytes())
    assert main(["report", *RESUME_IDS, "--out", str(out), "--no-studies", "--seed", "1", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --resume" in err[0] and "seed 0 in the log, 1 now" in err[0], err
    assert sorted(p.name for p in out.iterdir()) == ["results.jsonl"]


@pytest.mark.parametrize("damage, message", [
    ("data/H.11/scaling.csv", r"scaling\.csv', written for H\.11 by the interrupted report, is missing"),
    ("counterexamples/H.11.json", r"H\.11\.json', written for H\.11 by the interrupted report, is missing"),
    ("instances.csv", r"instances\.csv' holds 0 rows of H\.11, the results log records \d+"),
])
def test_report_resume_refuses_when_a_kept_file_is_missing(tmp_path, no_statement_runs, uninterrupted_report,
                                                           damage, message):
    _, full_out = uninterrupted_report
    out = tmp_path / "rep"
    shutil.copytree(full_out, out)
    if damage == "instances.csv":
        (out / damage).write_text("id,instance,lhs,rhs,ratio\n")
    else:
        (out / damage).unlink()
    with pytest.raises(ResultLogError, match=message):
        build_report(out, ids=RESUME_IDS, studies=False, progress=lambda _: None, resume=True)
