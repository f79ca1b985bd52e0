"""The run studies, their figures and the LLM regression on a real LLM run: ``python -m llm_runs run --preset
smoke`` on the embedded model (minutes on a CPU; ``llm`` marker: ``.venv/bin/python -m pytest -m llm``).

The run directory can be given with ``PREFALIGN_LLM_SMOKE_RUN=DIR`` (an earlier smoke run of seed 0) to skip the
run itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verification.llm import studies as LS
from verification.report.llm_section import llm_command, llm_unavailable

pytestmark = pytest.mark.llm

ROOT = Path(__file__).resolve().parents[3]
BASELINE = ROOT / "verification" / "data" / "llm_smoke_baseline.json"


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    given = os.environ.get("PREFALIGN_LLM_SMOKE_RUN")
    if given:
        return Path(given)
    why = llm_unavailable()
    if why is not None:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("llm") / "llm-run"
    proc = subprocess.run(llm_command(out, 0), cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def llm_run(llm_dir):
    from verification.llm.records import load_run

    return load_run(llm_dir)


def test_llm_run_is_read_with_its_objectives_and_preferences(llm_run):
    from verification.llm.records import objective_columns

    assert llm_run.kind == "llm" and llm_run.label == "LLM" and llm_run.psi_star == "estimated"
    assert llm_run.status == "complete"
    assert llm_run.objectives and set(objective_columns(llm_run, "heldout_acc")) == set(llm_run.objectives)
    train = llm_run.records.loc[llm_run.records["phase"] == "phase1", "client"].unique()
    assert all(int(i) in llm_run.prefs for i in train)
    assert (llm_run.records["gap"] >= 0).all()  # ψ̂* is lowered to the smallest ψ seen: r̂ >= 0 by construction


def test_every_study_runs_on_the_llm_run(llm_run, tmp_path):
    from verification.report import figures
    from verification.report.llm_figures import LLM_FIGURES

    res, not_run = LS.run_llm_studies([llm_run])
    assert not not_run, not_run
    by = {r.id: r for r in res}
    assert by["llm-preference"].summary["available"] is True
    h20 = by["llm-H20-ratio"].summary["LLM"]
    assert {"J_star.all", "J_eps.all"} <= set(h20)
    # (4c): the LP keeps the bottleneck numerator non-negative (to LP roundoff) in an LLM run too
    assert h20["J_star.all"]["frac_negative_numerator"] == 0.0
    h8 = by["llm-H8-dispersion"].summary["LLM"]
    assert h8["h6_rule"] == "lp_inputs" and h8["h6_common_basis_frac_multi_client"] is not None
    comp = h8["clustering_comparison"]
    assert {"stage1_stage2", "stage1_only", "random"} <= set(comp)
    assert comp["random"]["cluster_sizes"] == comp["stage1_stage2"]["cluster_sizes"]
    drawn, missing = figures.draw_all(tmp_path, [], {r.id: r.tables for r in res}, figures=LLM_FIGURES)
    assert set(drawn) == set(LLM_FIGURES), missing


def test_llm_smoke_matches_the_committed_baseline(llm_run):
    from verification.llm import regression as LR

    base = LR.load_baseline(BASELINE)
    reg = LR.compare_run(llm_run, base)
    assert reg.ok, LR.regression_text(reg)
    assert reg.compared == len(base["quantities"])


def test_report_reads_an_llm_run(llm_dir, tmp_path):
    """``report --llm-run DIR`` on the smoke run: the LLM section with every LLM figure."""
    out = tmp_path / "rep"
    proc = subprocess.run([sys.executable, "-m", "verification", "report", "S4", "--no-studies", "--out", str(out),
                           "--llm-run", str(llm_dir)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "README.md").read_text()
    assert "## LLM run" in md
    llm_figs = sorted(p.name for p in (out / "figures").glob("*llm*.png"))
    assert len(llm_figs) >= 4 and all(f"figures/{f}" in md for f in llm_figs)
