"""The answer in the dashboard (verification.llm.answer, ``report --llm-gate DIR --llm-sweep DIR``): the LLM section
opens with the gate, then the shots curve (figure, one line per pre-registered statistic, ψ-raise flags, w_II − w_I,
the adaptation at each budget), then what a sweep showed before; the report keeps copies of the gate and the shots
records; a sweep without shots records (the committed old study) renders as before.

The sweep is the model-free LLM-like sweep of test_llm_sweep_report (2 seeds) with the shots records of
test_llm_shots's simulator written into each seed's run directory; the gate is a small made-up ``gate.json`` in
the format of ``llm_runs.sweeps.gate.summarize``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.verification.llm.test_llm_shots import simulate, to_records
from tests.verification.llm.test_llm_sweep_report import HCN, _tiny_synthetic, _write_llm_like_run
from verification.__main__ import main
from verification.engine.dask_engine import CELLS_DIR
from verification.llm import answer as A
from verification.llm import shots as sh
from verification.llm import sweep as SW

ROOT = Path(__file__).resolve().parents[3]
BUDGETS = (1, 2)


def _gate_entry(objective: str, budget: int, z: float, p: float, passed: bool) -> dict:
    return {"objective": objective, "budget": budget, "draws": 2, "of_draws": 2, "status": "complete", "z": z,
            "z_interval": [z - 0.02, z + 0.02], "p_margin": p, "accuracy": 0.5 + z, "accuracy_interval":
            [0.49 + z, 0.51 + z], "p_accuracy": p, "units": 50, "pairs": 200, "passed": passed,
            "train_accuracy": 1.0, "train_loss": 0.3, "cpu_seconds": [10.0, 11.0]}


def write_gate(d: Path) -> Path:
    d.mkdir(parents=True)
    table = [_gate_entry("positivity", 16, 0.0123, 0.0004, True), _gate_entry("density", 16, -0.0031, 0.61, False),
             _gate_entry("positivity", 64, 0.0456, 0.0001, True), _gate_entry("density", 64, 0.0042, 0.03, False)]
    summary = {"gate": A.GATE_KIND, "params": {"model": str(ROOT / "model-dir")},
               "settings": {"objectives": ["positivity", "density"], "target": 0.8, "steps": 16,
                            "max_response_tokens": 16, "budgets": [16, 64], "draws": 2},
               "rule": "made up for the test", "table": table, "passes_at": {"positivity": 16, "density": None},
               "passed": ["positivity"], "cells": {"requested": 8, "complete": 8}}
    (d / A.GATE_JSON).write_text(json.dumps(summary))
    (d / "params.json").write_text(json.dumps({"gate": A.GATE_KIND, "data": str(ROOT / "data.jsonl")}))
    cell = d / CELLS_DIR / "positivity" / "b16-d0.json"
    cell.parent.mkdir(parents=True)
    cell.write_text(json.dumps({"objective": "positivity", "budget": 16, "draw": 0, "status": "complete",
                                "model": str(ROOT / "model-dir"), "margins": [0.25, -0.5]}))
    return d


def make_shots_sweep(d: Path) -> Path:
    """The LLM-like sweep of 2 seeds with the shots records of 2 budgets in its run directories, its plan in
    ``llm_sweep.json`` and ``params.json``."""
    records = to_records(simulate(np.random.default_rng(5), n_seeds=len(HCN), budgets=BUDGETS), BUDGETS)
    for seed in HCN:
        run = d / "runs" / str(seed)
        _write_llm_like_run(run, seed)
        for name, frame in ((sh.CLIENTS, records.clients), (sh.SCORES, records.scores),
                            (sh.ADAPTATION, records.adaptation), (sh.CROSS, records.cross)):
            assert frame is not None
            frame[frame["seed"] == seed].to_csv(run / name, index=False)
    (d / "params.json").write_text(json.dumps({"preset": "fake-shots", "preset_config": {"design": {
        "budgets": list(BUDGETS)}}}))
    (d / "llm_sweep.json").write_text(json.dumps({"by_seed": [{"seed": s, "status": "complete"} for s in HCN]}))
    return d


@pytest.fixture(scope="module")
def shots_sweep(tmp_path_factory):
    return make_shots_sweep(tmp_path_factory.mktemp("shots-sweep"))


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory):
    return write_gate(tmp_path_factory.mktemp("gate") / "g")


def _fast(monkeypatch):
    """The section's synthetic runs at the small preset and the run studies' figures not drawn (the curve's figure
    is drawn: it is what is tested)."""
    from verification.report import figures, llm_section

    monkeypatch.setattr(llm_section, "_synthetic", _tiny_synthetic)
    monkeypatch.setattr(figures, "draw_all", lambda *a, **k: ({}, {}))


def _in_order(text: str, parts) -> None:
    missing = [p for p in parts if p not in text]
    assert not missing, missing
    at = [text.index(p) for p in parts]
    assert at == sorted(at), [p for p, _ in sorted(zip(parts, at, strict=True), key=lambda x: x[1])]


def test_report_opens_with_the_gate_then_the_curve(shots_sweep, gate_dir, tmp_path, monkeypatch):
    """``report --llm-sweep DIR --llm-gate G``: the gate's table and the objectives that entered, then the curve's
    figure and its pre-registered lines in the report's order, the ψ-raise flags, w_II − w_I, the adaptation at
    each budget, then the sweep's own part; the report's folder holds copies of gate.json and the shots records."""
    _fast(monkeypatch)
    out = tmp_path / "rep"
    assert main(["report", "S4", "--no-studies", "--out", str(out), "--llm-sweep", str(shots_sweep),
                 "--llm-gate", str(gate_dir)]) == 0
    md = (out / "README.md").read_text()
    sec = md.split("## LLM run", 1)[1]
    assert sec.lstrip().startswith("### Positive-control gate")
    report = sh.shots_report(sh.read_records(SW.sweep_run_dirs(out / "llm-sweep")), seeds=list(HCN), budgets=BUDGETS)
    lines = [sh.line_text(ln) for ln in report["lines"]]
    assert len(lines) == 5 * len(BUDGETS)  # gains over local and FedAvg, two slopes, own vs mates, per budget
    _in_order(sec, ["### Positive-control gate", "| positivity | 16 | 2 of 2 | +0.0123 [-0.0077, +0.0323] | 0.0004 |",
                    "| density | 64 |", "Objectives that entered: positivity (from budget 16); did not: density.",
                    "### The shots curve", f"![The shots curve](figures/{A.CURVE_FIGURE})",
                    "Algorithm 1 (Pipeline 1 from w_II) beats", "#### Pre-registered statistics",
                    *[f"* {t}\n" for t in lines], "* ψ-raising adaptations", "acc(w_II) − acc(w_I) (budget 1)",
                    "### Hypotheses at each budget", "| 2 | pipeline1_wI | 18 | 18 | 0 |", "\n### Pre-registered statistics",
                    "### Hypotheses across seeds", "### One seed in detail"])
    png = out / "figures" / A.CURVE_FIGURE
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "index.html").read_text()
    _in_order(page, ["<h2>LLM run</h2>", "<h3>Positive-control gate</h3>", "<h3>The shots curve</h3>",
                     f"<img src='figures/{A.CURVE_FIGURE}'", "<h3>Hypotheses at each budget</h3>",
                     "<h3>Hypotheses across seeds</h3>"])
    # the copies the dashboard reads: gate.json (paths of this checkout relative) and every shots record
    copy = json.loads((out / "llm-gate" / A.GATE_JSON).read_text())
    assert copy["table"] == json.loads((gate_dir / A.GATE_JSON).read_text())["table"]
    assert copy["params"]["model"] == "model-dir"
    # and the cells, so the copy can be re-summarised and extended by further draws without the gate's own folder
    cell = json.loads((out / "llm-gate" / CELLS_DIR / "positivity" / "b16-d0.json").read_text())
    assert cell["margins"] == [0.25, -0.5] and cell["model"] == "model-dir"
    for seed in HCN:
        for name in (sh.CLIENTS, sh.SCORES, sh.ADAPTATION, sh.CROSS):
            assert (out / "llm-sweep" / "runs" / str(seed) / name).read_bytes() == \
                (shots_sweep / "runs" / str(seed) / name).read_bytes()
    entry = next(e for e in json.loads((out / "studies.json").read_text()) if e["id"] == "llm-section")["summary"]
    assert entry["gate"]["passes_at"] == {"positivity": 16, "density": None}
    assert entry["shots_curve"]["report"]["lines"] == json.loads(json.dumps(report["lines"]))
    assert f"--llm-gate {gate_dir}" in md


def test_answer_sentences_follow_the_verdicts(shots_sweep):
    """The sentence names the budgets where the gain is ``supported`` and states the numbers of the report."""
    curve = A.sweep_curve(shots_sweep, SW.sweep_run_dirs(shots_sweep), n_perm=99)
    assert curve is not None and "unavailable" not in curve
    rep = curve["report"]
    first = A.answer_sentences(rep)[0]
    assert "beats local-only at no budget and its cluster's FedAvg model at no budget" in first  # 2 seeds: p ≥ 1/4
    for ln in rep["lines"]:
        if ln["statistic"] == "gain_over_local" and ln["budget"] == 2:
            ln["verdict"] = "supported"
    sentences = A.answer_sentences(rep)
    assert "beats local-only at budget 2 and its cluster's FedAvg model at no budget" in sentences[0]
    w2 = next(r for r in rep["table"] if r["method"] == "pipeline1_wII" and r["budget"] == 2)
    assert sentences[2].startswith(f"At budget 2: λ-weighted held-out accuracy {w2['acc']:.3f} ")
    assert f"reaches {w2['ceiling_share']:.3g} [" in sentences[2]
    by = {(r["budget"], r["method"]): r for r in curve["adaptation_by_budget"]}
    assert set(by) == {(b, m) for b in BUDGETS for m in ("pipeline1_wII", "pipeline1_wI")}
    assert by[(1, "pipeline1_wII")] == {"budget": 1, "method": "pipeline1_wII", "n": 18, "psi_lowered": 18,
                                        "psi_raised": 0, "psi_ratio_mean": pytest.approx(0.8), "h43_held": 18}


def test_curve_analysis_errors_are_shown_not_raised(shots_sweep, tmp_path):
    """A plan the records do not match (a budget outside it) is said in the section, not a crash."""
    import shutil

    d = tmp_path / "sw"
    shutil.copytree(shots_sweep, d)
    (d / "params.json").write_text(json.dumps({"preset_config": {"design": {"budgets": [1]}}}))
    curve = A.sweep_curve(d, SW.sweep_run_dirs(d))
    assert curve is not None and "budget 2 is not in the pre-registered budgets [1]" in curve["unavailable"]
    assert "cannot run: " in "\n".join(A.curve_markdown(curve))
    (d / "params.json").write_text(json.dumps({"preset": "x"}))
    assert "preset_config.design.budgets" in A.sweep_curve(d, SW.sweep_run_dirs(d))["unavailable"]


def test_llm_gate_usage_errors(gate_dir, tmp_path, capsys, no_statement_runs):
    rep = ["report", "S4", "--no-studies", "--out", str(tmp_path / "rep")]
    for argv, words in ((["--llm-gate", str(tmp_path / "nowhere")], "is not a directory"),
                        (["--llm-gate", str(tmp_path)], "has no gate.json"),
                        (["--llm-gate", str(gate_dir), "--no-llm"], "not allowed with argument --no-llm")):
        assert main(rep + argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1, err
        assert "error: argument --llm-gate: " in err and words in err, err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "gate.json").write_text(json.dumps({"gate": "something else"}))
    assert main(rep + ["--llm-gate", str(tmp_path / "bad")]) == 2
    assert "is not the summary of `llm gate`" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


@pytest.mark.e2e  # the whole committed sweep of 8 seeds read and rendered: about 4 CPU-s
def test_the_old_study_sweep_renders_as_before(tmp_path, monkeypatch):
    """The committed sweep of the old study (no shots records): no curve, no gate, and the section is what it was
    — the sweep's part (its pre-registered lines as the committed dashboard shows them) then one seed in detail."""
    from verification.report.llm_section import build_llm_section, section_html, section_markdown

    _fast(monkeypatch)
    sweep = ROOT / "reports" / "llm-sweep"
    sec = build_llm_section(tmp_path, llm_sweep=sweep)
    assert sec.curve is None and sec.gate is None
    md = section_markdown(sec)
    head = ["## LLM run", ""] + SW.sweep_markdown(sec.hypotheses, sec.statistics) + ["### One seed in detail", ""]
    assert md[:len(head)] == head
    committed = (ROOT / "reports" / "README.md").read_text()
    stats = [ln for ln in head if ln.startswith("* **")]
    assert len(stats) == 3 and all(ln in committed for ln in stats)
    assert not any(w in "\n".join(md) for w in ("shots curve", "Positive-control gate", "at each budget"))
    assert not (tmp_path / "figures" / A.CURVE_FIGURE).exists()
    assert "shots_curve" not in sec.to_json()["summary"] and "gate" not in sec.to_json()["summary"]
    assert "<h3>The shots curve</h3>" not in section_html(sec)


def test_an_objective_with_a_missing_cell_is_not_decided_yet():
    summary = {"passes_at": {"a": None, "b": 16, "c": None},
               "table": [{"objective": "a", "budget": 16, "passed": False}, {"objective": "b", "budget": 16, "passed": True},
                         {"objective": "c", "budget": 16, "passed": None}],
               "cells": {"complete": 2, "requested": 3}}
    assert A.gate_entered(summary) == ("Objectives that entered: b (from budget 16); did not: a; not decided yet "
                                       "(cells missing): c. 2 of 3 cells complete.")
