"""The LLM sweep in the dashboard (verification.llm.sweep, ``report --llm-sweep DIR``): the hypotheses of the run
studies across seeds, the section's order (pre-registered statistics first) and the command line's usage errors.

The sweep folder is made without a model: each seed's run is Algorithm 1 on a small planted problem whose source
records what an LLM source records (named per-objective losses, held-out columns, the LP inputs), written in the
LLM run's format (``DIR/runs/<seed>/trajectory.csv`` and ``summary.json`` with objectives, the clients'
preferences, a model name and a made-up ``personalisation.hcn_at_w_ref``)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from sim import algorithm as al
from sim.simulate import PRESETS, Preset, simulate, write_run
from verification.__main__ import main
from verification.llm import sweep as SW
from verification.llm.records import load_run
from verification.llm.studies import run_llm_studies
from verification.report.llm_section import LLMSection, section_html, section_markdown

#: Made-up H_Cn at w_ref per seed: (Stage-1+2, Stage-1-only, same partition, random draws).
HCN = {0: (0.04, 0.04, True, [0.05, 0.06, 0.07, 0.045, 0.055, 0.065, 0.052, 0.058, 0.061, 0.049]),
       1: (0.06, 0.07, False, [0.05, 0.06, 0.08, 0.07, 0.09, 0.065, 0.075, 0.085, 0.055, 0.095, 0.1, 0.04])}


class _LLMLikeSource(al.ClientSource):
    """A planted source recording the LLM source's extra columns (per-objective losses, held-out loss and
    accuracy as functions of the population losses, the LP inputs)."""

    record_lp_inputs = True

    def record_metrics(self, W, clients, losses):
        out = {}
        for j in range(losses.shape[1]):
            out[f"loss_o{j}"] = losses[:, j].copy()
            out[f"heldout_loss_o{j}"] = losses[:, j].copy()
            out[f"heldout_acc_o{j}"] = np.exp(-losses[:, j])
        return out


def _small_smoke() -> Preset:
    """sim.simulate's smoke preset with few rounds and steps (a run in a fraction of a second)."""
    base = PRESETS["smoke"]
    R = dataclasses.replace
    return Preset(base.problem, R(base.config, phase1=R(base.config.phase1, rounds=6),
                                  phase2=R(base.config.phase2, rounds=3), adapt=R(base.config.adapt, K=3),
                                  adamw=R(base.config.adamw, K=3),
                                  pipeline2=R(base.config.pipeline2, max_steps=60, record_every=20)))


def _write_llm_like_run(d, seed: int) -> None:
    base = _small_smoke()
    cfg = base.config
    rng = np.random.default_rng(seed)
    src0, w_ref, train, new, _ = al.build_problem(base.problem, rng)
    src = _LLMLikeSource(src0.problem, src0.samples)
    res = al.run_algorithm(src, cfg, rng, w_ref=w_ref, train_clients=train, new_clients=new)
    s12, s1, same, rnd = HCN[seed]
    d.mkdir(parents=True)
    res.records.to_csv(d / "trajectory.csv", index=False)
    clients = [{"client": int(i), "prefs": src.prefs[i].tolist()} for i in range(src.n_clients)]
    summary = dict(status="complete", preset="fake-study", seed=seed, objectives=[f"o{j}" for j in range(base.problem.m)],
                   model={"name": "none (planted F1 in the LLM run's format)"},
                   preset_config={"algorithm": cfg.to_dict()}, clients={"clients": clients},
                   personalisation={"hcn_at_w_ref": {"stage1_stage2": s12, "stage1_only": s1,
                                                     "stage1_only_same_partition": same, "random": rnd,
                                                     "note": "made up for the test"}})
    (d / "summary.json").write_text(json.dumps(summary))


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llm-sweep")
    for seed in HCN:
        _write_llm_like_run(d / "runs" / str(seed), seed)
    (d / "params.json").write_text(json.dumps({"preset": "fake-study"}))
    return d


@pytest.fixture(scope="module")
def hyp(sweep_dir):
    return SW.hypotheses_across_seeds(SW.sweep_run_dirs(sweep_dir))


def _row(h, key):
    return next(r for r in h["rows"] if r["key"] == key)


#: A small fake of verification.llm.personalisation.sweep_statistics's answer (for the rendering only).
FAKE_STATS = {"lines": [
    {"statistic": "b (within-objective slope of z on lambda)", "estimate": 0.12, "interval": [0.01, 0.23],
     "p_value": 0.03, "mde": 0.09, "verdict": "supported", "n_seeds": 2, "n_units": 40},
    {"statistic": "share of personalisation-matrix rows won", "estimate": 0.4, "interval": [0.2, 0.6],
     "p_value": 0.4, "mde": 0.35, "verdict": "underpowered", "n_seeds": 2, "n_units": 16}],
    "text": "Two pre-registered statistics over 2 seeds."}


# ------------------------------------------------------------------------------------------------ aggregation


def test_t_interval_by_hand():
    r = SW.t_interval([0.04, 0.06, None, math.nan])
    half = 12.706204736174707 * math.sqrt(2e-4) / math.sqrt(2)  # t_{0.975, 1} * sd / sqrt(2)
    assert r["n"] == 2 and r["mean"] == pytest.approx(0.05, abs=1e-15)
    assert r["sd"] == pytest.approx(math.sqrt(2e-4), rel=1e-12)
    assert (r["ci_low"], r["ci_high"]) == (pytest.approx(0.05 - half, rel=1e-9), pytest.approx(0.05 + half, rel=1e-9))
    assert SW.t_interval([1.0])["ci_low"] is None and SW.t_interval([])["mean"] is None


def test_hcn_at_w_ref_rank_percentile_interval(sweep_dir):
    h = SW.hcn_at_w_ref(load_run(sweep_dir / "runs" / "1"))
    rnd = np.array(HCN[1][3])
    # 0.06 among the draws: 3 below (0.05, 0.055, 0.04), one tie -> rank 4, mid-rank percentile 3.5 / 12
    assert h["rank"] == 4 and h["percentile"] == pytest.approx(3.5 / 12)
    assert h["random_mean"] == pytest.approx(rnd.mean()) and h["ratio_to_random_mean"] == pytest.approx(0.06 / rnd.mean())
    assert (h["random_q025"], h["random_q975"]) == tuple(pytest.approx(q) for q in np.quantile(rnd, [0.025, 0.975]))
    assert h["stage1_only_same_partition"] is False and h["below_random_q025"] is False
    assert SW.hcn_at_w_ref(load_run(sweep_dir / "runs" / "0"))["below_random_q025"] is True
    old = load_run(sweep_dir / "runs" / "0")
    assert SW.hcn_at_w_ref(dataclasses.replace(old, summary={**old.summary, "personalisation": {}})) is None


def test_hypotheses_aggregate_each_seeds_study_values(sweep_dir, hyp):
    assert hyp["seeds"] == ["0", "1"] and not hyp["left_out"]
    assert [r["key"] for r in hyp["rows"]] == [q.key for q in SW.QUANTITIES]
    s12 = _row(hyp, "hcn_wref_stage1_stage2")
    assert s12["per_seed"] == {"0": 0.04, "1": 0.06} and s12["n"] == 2
    ref = stats.t.interval(0.95, 1, loc=0.05, scale=np.std([0.04, 0.06], ddof=1) / math.sqrt(2))
    assert ref[0] < 0 and s12["ci_low"] == 0.0 and s12["clipped"]  # H_Cn >= 0: the interval is clipped there
    assert s12["ci_high"] == pytest.approx(ref[1], rel=1e-12)
    gap = _row(hyp, "p1_wII_minus_p2")  # unbounded: the plain t-interval of the two seeds' values
    v = list(gap["per_seed"].values())
    ref = stats.t.interval(0.95, 1, loc=np.mean(v), scale=np.std(v, ddof=1) / math.sqrt(2))
    assert (gap["ci_low"], gap["ci_high"]) == (pytest.approx(ref[0], rel=1e-12), pytest.approx(ref[1], rel=1e-12))
    assert not gap["clipped"]
    same = _row(hyp, "hcn_wref_same_partition")
    assert same["kind"] == "count" and (same["count"], same["n"]) == (1, 2)
    # a study quantity: the per-seed values are the studies' own summaries of each run alone, the mean is theirs
    vals = []
    for s in ("0", "1"):
        res, _ = run_llm_studies([load_run(sweep_dir / "runs" / s)])
        band = next(r for r in res if r.id == "llm-contraction").summary["LLM"]["band_mean"]
        assert _row(hyp, "contraction_band")["per_seed"][s] == band
        vals.append(band)
    assert _row(hyp, "contraction_band")["mean"] == pytest.approx(np.mean(vals), rel=1e-14)
    for key in ("eq71_phase1", "h20_sigma_Jstar", "h20_sigma_Jeps", "p1_wII_minus_p2", "fedavg_adapt_minus_p2",
                "h6_common_basis"):
        assert _row(hyp, key)["n"] == 2, key
    json.dumps(hyp, allow_nan=False)


def test_incomplete_run_is_left_out_and_named(sweep_dir, tmp_path):
    d = tmp_path / "sw"
    shutil.copytree(sweep_dir, d)
    s = json.loads((d / "runs" / "1" / "summary.json").read_text())
    (d / "runs" / "1" / "summary.json").write_text(json.dumps({**s, "status": "failed"}))
    h = SW.hypotheses_across_seeds(SW.sweep_run_dirs(d))
    assert h["seeds"] == ["0"] and "failed" in h["left_out"]["1"]
    assert _row(h, "hcn_wref_stage1_stage2")["ci_low"] is None


# ------------------------------------------------------------------------------------------------ rendering


def _section(sweep_dir, hyp, stats_dict):
    run0 = load_run(sweep_dir / "runs" / "0")
    res, not_run = run_llm_studies([run0])
    return LLMSection("read", "Read the LLM sweep.", llm_runs=[run0], results=res, not_run=not_run,
                      sweep=str(sweep_dir), hypotheses=hyp, statistics=stats_dict)


def test_section_opens_with_the_pre_registered_statistics(sweep_dir, hyp):
    sec = _section(sweep_dir, hyp, FAKE_STATS)
    md = "\n".join(section_markdown(sec))
    order = [md.index(x) for x in ("## LLM run", "### Pre-registered statistics", "**supported**",
                                   "**underpowered**", "### Hypotheses across seeds",
                                   "| H_Cn at w_ref: Stage-1+2 clusters | 0.05 [", "<summary>Per seed</summary>",
                                   "### One seed in detail")]
    assert order == sorted(order)
    first = md.split("### Pre-registered statistics", 1)[1].strip().splitlines()[0]
    assert first.startswith("* **supported** — b (within-objective slope") and "p = 0.03" in first
    assert "[0.01, 0.23]" in first and "minimum detectable effect (80 % power) 0.09" in first
    assert "| H_Cn at w_ref: Stage-1-only is the Stage-1+2 partition | 1 of 2 seeds | 2 |" in md
    page = section_html(sec)
    order = [page.index(x) for x in ("<h2>LLM run</h2>", "<h3>Pre-registered statistics</h3>", "<b>supported</b>",
                                     "<h3>Hypotheses across seeds</h3>", "<h3>One seed in detail</h3>")]
    assert order == sorted(order)


def test_statistics_are_imported_lazily(sweep_dir, monkeypatch):
    """Without verification.llm.personalisation the section says so; with it, its lines are shown."""
    monkeypatch.setitem(sys.modules, "verification.llm.personalisation", None)
    st = SW.personalisation_statistics(SW.sweep_run_dirs(sweep_dir))
    assert st["lines"] == [] and "verification.llm.personalisation" in st["unavailable"]
    assert "* none: verification.llm.personalisation cannot be imported" in "\n".join(SW.sweep_markdown(None, st))
    fake = types.ModuleType("verification.llm.personalisation")
    fake.sweep_statistics = lambda run_dirs: {**FAKE_STATS, "n_dirs": len(run_dirs)}
    monkeypatch.setitem(sys.modules, "verification.llm.personalisation", fake)
    st = SW.personalisation_statistics(SW.sweep_run_dirs(sweep_dir))
    assert st["n_dirs"] == 2 and st["lines"] == FAKE_STATS["lines"]


# ------------------------------------------------------------------------------------------------ command line


def _usage_error(capsys, argv) -> str:
    """The one error line of a usage error (exit 2, nothing on stdout), naming --llm-sweep."""
    assert main(argv) == 2, argv
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("python -m verification report: error: argument --llm-sweep: "), lines[0]
    return lines[0]


def test_llm_sweep_usage_errors(sweep_dir, tmp_path, capsys, no_statement_runs):
    rep = ["report", "S4", "--no-studies", "--out", str(tmp_path / "rep")]
    err = _usage_error(capsys, rep + ["--llm-sweep", str(sweep_dir), "--llm-run", str(sweep_dir / "runs" / "0")])
    assert "argument --llm-sweep: not allowed with argument --llm-run" in err
    err = _usage_error(capsys, rep + ["--llm-sweep", str(sweep_dir), "--no-llm"])
    assert "argument --llm-sweep: not allowed with argument --no-llm" in err
    missing = tmp_path / "nowhere"
    assert repr(str(missing)) in _usage_error(capsys, rep + ["--llm-sweep", str(missing)])
    (tmp_path / "no-runs").mkdir()
    assert "no runs/ sub-folder" in _usage_error(capsys, rep + ["--llm-sweep", str(tmp_path / "no-runs")])
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    assert "holds no runs" in _usage_error(capsys, rep + ["--llm-sweep", str(tmp_path / "empty")])
    bad = tmp_path / "bad"
    shutil.copytree(sweep_dir, bad)
    (bad / "runs" / "1" / "trajectory.csv").unlink()
    err = _usage_error(capsys, rep + ["--llm-sweep", str(bad)])
    assert repr(str(bad / "runs" / "1")) in err and "trajectory.csv is missing" in err
    failed = tmp_path / "failed"
    shutil.copytree(sweep_dir, failed)
    for seed in HCN:
        p = failed / "runs" / str(seed) / "summary.json"
        p.write_text(json.dumps({**json.loads(p.read_text()), "status": "failed"}))
    assert "holds no complete run" in _usage_error(capsys, rep + ["--llm-sweep", str(failed)])
    assert not (tmp_path / "rep").exists()  # found before anything runs


# ------------------------------------------------------------------------------------------------ end to end


def _tiny_synthetic(out, seed, progress):
    """The section's synthetic runs, at the small preset (the smoke preset's S axis takes ~20 s)."""
    res, summary = simulate(_small_smoke(), seed)
    summary.update(preset="smoke (small)", seed=seed)
    write_run(out / "sim-run", res, summary)
    run = load_run(out / "sim-run")
    return run, [run]


def test_report_llm_sweep_end_to_end(sweep_dir, tmp_path, monkeypatch, capsys):
    """``report --llm-sweep DIR``: the LLM section opens with the (fake) pre-registered statistics, then the
    across-seed table with the synthetic value beside it, then one seed in detail; studies.json keeps both. (The
    synthetic runs are the small preset and no figure is drawn, to keep it fast.)"""
    from verification.report import figures, llm_section

    monkeypatch.setattr(llm_section, "_synthetic", _tiny_synthetic)
    monkeypatch.setattr(figures, "draw_all", lambda *a, **k: ({}, {}))
    from verification.llm import personalisation

    # the real module with a fake answer: the report also imports the shots analysis, which takes its constants
    monkeypatch.setattr(personalisation, "sweep_statistics", lambda run_dirs: FAKE_STATS)
    out = tmp_path / "rep"
    assert main(["report", "S4", "--no-studies", "--out", str(out), "--llm-sweep", str(sweep_dir)]) == 0
    md = (out / "README.md").read_text()
    sec = md.split("## LLM run", 1)[1]
    assert sec.lstrip().startswith("### Pre-registered statistics\n\n* **supported** — ")
    assert sec.index("### Hypotheses across seeds") < sec.index("### One seed in detail") < sec.index("| quantity | LLM |")
    row = next(ln for ln in sec.splitlines() if ln.startswith("| contraction: test iterates within the eq-75 bound"))
    assert row.endswith("| 2 | 100.0% |")  # two seeds; the synthetic value beside the mean
    assert f"--llm-sweep {sweep_dir}" in md
    page = (out / "index.html").read_text()
    assert page.index("<h3>Pre-registered statistics</h3>") < page.index("<h3>Hypotheses across seeds</h3>")
    entry = next(e for e in json.loads((out / "studies.json").read_text()) if e["id"] == "llm-section")["summary"]
    # the section reads the report's own copy of the sweep's summaries (reports/ stays self-contained)
    copy = out / "llm-sweep"
    assert entry["status"] == "read" and entry["sweep"] == str(copy)
    assert str(sweep_dir) in entry["message"]
    for seed_dir in (sweep_dir / "runs").iterdir():
        assert json.loads((copy / "runs" / seed_dir.name / "summary.json").read_text()) == \
            json.loads((seed_dir / "summary.json").read_text())  # no path of this checkout in the fixture
        gen = copy / "runs" / seed_dir.name / "generations.csv"
        if gen.exists():
            assert "text" not in pd.read_csv(gen).columns
    assert entry["pre_registered_statistics"]["lines"][0]["verdict"] == "supported"
    assert entry["hypotheses_across_seeds"]["seeds"] == ["0", "1"]
    assert "LLM section: read" in capsys.readouterr().out


def test_real_pre_registered_statistics_on_a_small_sweep(sweep_dir, tmp_path):
    """verification.llm.personalisation.sweep_statistics on the sweep's runs with held-out margins added (the
    pre-registered analysis's own test writer), rendered as the section's first lines."""
    lp = pytest.importorskip("verification.llm.personalisation")
    from tests.verification.llm import test_llm_personalisation as writer
    d = tmp_path / "sw"
    shutil.copytree(sweep_dir, d)
    rng = np.random.default_rng(3)
    for seed in HCN:
        lam = rng.dirichlet(np.ones(3), size=8)
        extra = writer.write_run(tmp_path / f"margins{seed}", lam, writer.planted(rng, rng.normal(size=3), 2.0, lam),
                                 rng=rng, noise=0.3)
        shutil.copy(extra / "heldout_margins.csv", d / "runs" / str(seed) / "heldout_margins.csv")
        pers = json.loads((extra / "summary.json").read_text())["personalisation"]
        path = d / "runs" / str(seed) / "summary.json"
        summary = json.loads(path.read_text())
        summary["personalisation"] = {**pers, "hcn_at_w_ref": summary["personalisation"]["hcn_at_w_ref"]}
        path.write_text(json.dumps(summary))
    dirs = SW.sweep_run_dirs(d)
    st = SW.personalisation_statistics(dirs)
    assert "unavailable" not in st, st.get("unavailable")
    assert [ln["statistic"] for ln in st["lines"]] == list(lp.STATISTICS)
    md = SW.sweep_markdown(SW.hypotheses_across_seeds(dirs), st)
    first = md[md.index("### Pre-registered statistics") + 2]
    assert first.startswith(f"* **{st['lines'][0]['verdict']}** — {lp.STATISTICS['heldout_margin_slope']}: estimate ")
    assert st["lines"][0]["verdict"] in SW.VERDICTS


def test_export_writes_paths_of_this_checkout_relative(tmp_path):
    """export_sweep: a summary's absolute path inside this project's checkout (the shipped data file) is written
    relative to it in the copy; a path elsewhere is kept as it is."""
    from verification.llm.sweep import _project_relative

    root = Path(__file__).resolve().parents[3]
    text = json.dumps({"data_file": {"path": str(root / "llm_runs" / "data" / "x.jsonl.gz")},
                       "other": ["/elsewhere/file", 3]})
    out = json.loads(_project_relative(text))
    assert out == {"data_file": {"path": "llm_runs/data/x.jsonl.gz"}, "other": ["/elsewhere/file", 3]}
