"""Tests of the run studies (verification.llm.studies), the run-directory reader (verification.llm.records), their
figures and the dashboard's LLM section, on a real synthetic run directory (``sim.simulate``'s smoke preset, the
same record schema as an LLM run). The LLM-only parts (per-objective columns, the preference study, a real LLM
run) are in tests/verification/llm/test_llm_report.py under the ``llm`` marker."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from sim import algorithm as al
from sim.simulate import PRESETS, simulate, write_run
from verification.llm import studies as LS
from verification.llm.records import REQUIRED_COLUMNS, load_run, step_rows, training_iterates


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory):
    """A real synthetic run directory: sim.simulate's smoke preset, seed 0."""
    d = tmp_path_factory.mktemp("sim") / "sim-run"
    res, summary = simulate(PRESETS["smoke"], 0)
    summary.update(preset="smoke", seed=0)
    write_run(d, res, summary)
    return d


@pytest.fixture(scope="module")
def run(sim_dir):
    return load_run(sim_dir)


@pytest.fixture(scope="module")
def results(run):
    res, not_run = LS.run_llm_studies([run])
    return {r.id: r for r in res}, not_run


_OBJ = ("first", "second", "third")


class _RecordedSource(al.ClientSource):
    """A planted F1 source that records what an LLM source records: per-objective losses (named), held-out
    columns (here: functions of the population losses, only to exercise the readers) and the LP inputs."""

    record_lp_inputs = True

    def record_metrics(self, W, clients, losses):
        out = {}
        for j, o in enumerate(_OBJ):
            out[f"loss_{o}"] = losses[:, j].copy()
            out[f"heldout_loss_{o}"] = losses[:, j].copy()
            out[f"heldout_acc_{o}"] = np.exp(-losses[:, j])
        return out


@pytest.fixture(scope="module")
def llm_like(tmp_path_factory):
    """A run directory in the LLM run's format (trajectory.csv with per-objective and LP-input columns,
    clusterings.csv, a summary with objectives, clients' preferences, the preset's clustering and the comparison)
    made from a planted F1 problem: the studies' LLM code paths on synthetic records. Returns (directory, the
    AlgorithmResult, the source)."""
    rng = np.random.default_rng(5)
    spec = al.ProblemSpec(m=3, n_w=4, n_groups=3, n_train=3, n_new=1, spread=0.05)
    src0, w_ref, train, new, _ = al.build_problem(spec, rng)
    src = _RecordedSource(src0.problem, src0.samples)
    cfg = al.AlgorithmConfig(
        cluster=al.ClusterConfig(key="bottleneck", threshold=0.25),
        phase1=al.Phase1Config(rounds=6, tau=1, eta_local=0.05), phase2=al.Phase2Config(rounds=4, S=8, K=2,
                                                                                        eta_meta_inner=0.02),
        adapt=al.AdaptConfig(K=3, S=8, alpha_adapt=0.05, preconditioner="rmsprop_lagged", p_minus=0.5, p_plus=1.0),
        pipeline2=al.Pipeline2Config(max_steps=50))
    res = al.run_algorithm(src, cfg, rng, w_ref=w_ref, train_clients=train, new_clients=new)
    parts = al.comparison_clusterings(res.clustering, rng, 2)
    same = [p for p in parts[1:] if al.same_partition(p[2], parts[0][2])]
    comp = al.phase1_by_clustering(src, train, w_ref, [p for p in parts[1:] if p not in same], cfg.phase1, rng)
    d = tmp_path_factory.mktemp("llm-like") / "run"
    d.mkdir()
    res.records.to_csv(d / "trajectory.csv", index=False)
    comp.to_csv(d / "clusterings.csv", index=False)
    summary = dict(preset="planted-F1-in-the-LLM-format", seed=5, status="complete", objectives=list(_OBJ),
                   model={"name": "none (planted F1)"}, preset_config={"algorithm": cfg.to_dict()},
                   clients={"clients": [{"client": int(i), "prefs": src.prefs[i].tolist()}
                                        for i in range(src.n_clients)]},
                   clustering_comparison={"clusterings": [
                       dict(clustering=n, draw=dr, clusters=[[int(train[i]) for i in c] for c in cl],
                            trained=not any(p[:2] == (n, dr) for p in same),
                            **({"same_as": "stage1_stage2"} if any(p[:2] == (n, dr) for p in same) else {}))
                       for n, dr, cl in parts]})
    (d / "summary.json").write_text(json.dumps(summary))
    return d, res, src


# ------------------------------------------------------------------------------------------------ reader


def test_reader_kind_and_iterates(run):
    assert run.kind == "sim" and run.label == "synthetic" and run.psi_star == "planted"
    assert "planted" in run.describe()
    it = training_iterates(run)
    # every (client, t) once; t runs over 0 .. R + R' without gaps
    assert not it.duplicated(["client", "t"]).any()
    R = int(run.records.loc[run.records["phase"] == "phase1", "round"].max())
    R2 = int(run.records.loc[run.records["phase"] == "phase2", "round"].max())
    for _, g in it.groupby("client"):
        assert g["t"].tolist() == list(range(R + R2 + 1))
    st = step_rows(run)
    assert (st["local_steps"] > 0).all() and set(st["phase"]) == {"phase1", "phase2"}


def test_reader_rejects_bad_directories(tmp_path, sim_dir):
    with pytest.raises(ValueError, match="summary.json is missing"):
        (tmp_path / "a").mkdir()
        (tmp_path / "a" / "trajectory.csv").write_text("x\n1\n")
        load_run(tmp_path / "a")
    d = tmp_path / "b"
    d.mkdir()
    df = pd.read_csv(sim_dir / "trajectory.csv").drop(columns=["margin_Jeps"])
    df.to_csv(d / "trajectory.csv", index=False)
    (d / "summary.json").write_text((sim_dir / "summary.json").read_text())
    with pytest.raises(ValueError, match="margin_Jeps"):
        load_run(d)
    (d / "summary.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        load_run(d)
    assert "margin_Jeps" in REQUIRED_COLUMNS


def test_every_study_runs_on_a_synthetic_run(results):
    res, not_run = results
    assert set(res) | set(not_run) == set(LS.LLM_STUDIES)
    assert not_run == {}
    for r in res.values():
        json.dumps(r.summary, allow_nan=False)
        assert r.notes and r.tables
        for name, df in r.tables.items():
            bad = [c for c in df.columns if c != c.lower() or " " in c]
            assert not bad, (r.id, name, bad)
    # the preference study needs per-objective held-out columns: a synthetic run has none, and it says so
    assert res["llm-preference"].summary["available"] is False


def test_studies_are_deterministic(run, results):
    again, _ = LS.run_llm_studies([run])
    for r in again:
        first = results[0][r.id]
        assert json.dumps(r.summary, sort_keys=True) == json.dumps(first.summary, sort_keys=True)
        for name in r.tables:
            pd.testing.assert_frame_equal(r.tables[name], first.tables[name], check_exact=True)


# ------------------------------------------------------------------------------------------------ eq 71


def test_eq71_constants_come_from_the_calibration_window_only(run, results):
    res = results[0]["llm-eq71-trajectory"]
    pts, consts = res.tables["points"], res.tables["constants"]
    it = training_iterates(run)
    for scheme in LS.CALIBRATION_SCHEMES:
        cal, _, t0 = LS.calibration_masks(it, scheme)
        c = it[cal]
        for cl, g in c.groupby("cluster"):
            k = consts[(consts["scheme"] == scheme) & (consts["cluster"] == cl)]
            assert (k["beta_bar"] == g["beta"].max()).all()
            rho_min = it.loc[it["cluster"] == cl, "rho"].min()
            assert np.allclose(k["delta_bar_h14"], math.sqrt(g["dispersion"].max() / rho_min), rtol=0, atol=0)
        p = pts[pts["scheme"] == scheme]
        assert (p.loc[p["window"] == "test", "t"] >= t0).all() and (p.loc[p["window"] == "calibration", "t"] < t0).all()


def test_eq71_can_fail(run, results):
    """Negative control: β raised tenfold on the test window breaks eq 71 there, the constants do not move."""
    it = training_iterates(run)
    cal, _, t0 = LS.calibration_masks(it, "phase1_first_half")
    rec = run.records.copy()
    late = rec["t"] >= t0
    rec.loc[late, "beta"] = 10.0 * rec.loc[late, "beta"] + 1.0
    broken = type(run)(path=run.path, kind=run.kind, records=rec, summary=run.summary, objectives=None)
    res = LS.study_eq71_trajectory([broken])
    ok = LS.study_eq71_trajectory([run])
    h = res.summary["headline"]["synthetic"]
    assert h["phase1"]["frac_rounds_eq71"] == 0.0 and h["phase2"]["frac_beta_ok"] == 0.0
    a, b = (r.tables["constants"] for r in (res, ok))
    a, b = (x[x["scheme"] == "phase1_first_half"] for x in (a, b))
    pd.testing.assert_frame_equal(a, b)


# ------------------------------------------------------------------------------------------------ H.20


def test_h20_ratio_definitions(run, results):
    res = results[0]["llm-H20-ratio"]
    pts = res.tables["points"]
    inc = pts[~pts["dm_zero"]]
    assert np.allclose(inc["ratio"], inc["margin"] / inc["dm_norm"] ** 2, rtol=1e-15, atol=0)
    assert pts.loc[pts["dm_zero"], "ratio"].isna().all()
    assert (pts["dm_zero"] == (pts["dm_norm"] <= 1e-3 * pts["generator_bound"])).all()
    # the LP constrains the bottleneck set (4c): no negative numerator on J* beyond LP roundoff, in either mode
    js = pts[pts["index_set"] == "J_star"]
    assert not js["numerator_negative"].any()
    for key in ("J_star.phase1", "J_star.phase2", "J_eps.phase1", "J_eps.phase2", "J_star.all", "J_eps.all"):
        assert key in res.summary["synthetic"]
    # distributions by client and phase, both index sets
    q = res.tables["quantiles_by_client"]
    assert set(q["index_set"]) == {"J_star", "J_eps"} and set(q["phase"]) == {"phase1", "phase2"}
    assert q["client"].nunique() == training_iterates(run)["client"].nunique()
    sens = res.tables["dm_zero_sensitivity"]
    counts = sens[(sens["index_set"] == "J_eps") & (sens["phase"] == "phase1")].sort_values("dm_zero_rtol")
    assert counts["n_dm_zero"].is_monotonic_increasing  # a larger threshold excludes more points


# ------------------------------------------------------------------------------------------------ H_Cn / H.6


def test_dispersion_and_h6_statuses(run, results):
    res = results[0]["llm-H8-dispersion"]
    br, h6 = res.tables["by_round"], res.tables["h6_status"]
    it = training_iterates(run)
    merged = br.merge(it.groupby(["cluster", "t"])["dispersion"].first().rename("rec").reset_index(),
                      on=["cluster", "t"])
    assert (merged["dispersion"] == merged["rec"]).all()
    desc = it.groupby(["cluster", "t"])["lp_mode"].apply(lambda m: bool((m != "balance").any())).rename("desc")
    m = h6.merge(desc.reset_index(), on=["cluster", "t"])
    assert ((m["status"] == "descent_client") == m["desc"]).all()
    assert set(h6["status"]) <= {"descent_client", "undetermined_all_balancing"}  # no J* without the losses


# ------------------------------------------------------------------------------------------------ contraction


def test_contraction_constants_hold_on_their_window(run, results):
    res = results[0]["llm-contraction"]
    tr, c = res.tables["trajectory"], res.tables["constants"]
    cal = tr[tr["window"] == "calibration"]
    assert cal["h19_holds"].all()  # (c_d, b_i) make eq 51 hold on the calibration points by construction
    t0 = int(c["t0"].iloc[0])
    first = tr[tr["t"] == t0]
    assert first["within_bound"].all()  # at t0 the bound is r^t0 + band
    assert (c["c_d"] * np.maximum(c["eta_phase1"], c["eta_phase2"]) <= 1 + 1e-12).all()
    from sim.constants import band_radius

    for _, row in c.iterrows():
        band = band_radius(row["c_d"], row["b"], row["eta_phase1"], row["lam_max"], row["grad_bound_cal"], 0.0,
                           np.array([row["delta_bar"]]), eta_II=row["eta_phase2"])
        assert band[0] == pytest.approx(row["band"], rel=1e-14)


def test_lambda_max_is_recovered_from_the_records(run):
    from verification.llm.records import lambda_max

    st = step_rows(run)
    lam = lambda_max(run, st)
    per = pd.Series(lam).groupby(st["client"].to_numpy()).agg(["min", "max"])
    assert (per["max"] - per["min"] <= 1e-12).all() and ((per["min"] > 0) & (per["max"] <= 1)).all()


# ------------------------------------------------------------------------------------------------ pipelines


def test_pipelines_agree_with_the_run_summary(run, results):
    res = results[0]["llm-pipelines"]
    df = res.tables["gap_vs_k"]
    K = int(df["k_max"].max())
    s = run.summary
    for method, g in df[df["k"] == K].groupby("method"):
        assert g["gap"].mean() == pytest.approx(s["mean_final_gap"][method], rel=1e-12)
        want = s["mean_final_gap"][method] - s["mean_final_gap"]["pipeline2"]
        assert g["gap_minus_pipeline2"].mean() == pytest.approx(want, rel=1e-9, abs=1e-12)
    key = f"S={s['params']['adapt']['S']}"
    assert res.summary["synthetic"][key]["pipeline1_wII"]["K"] == K
    assert "mu_PL" in res.summary["eq91"]


# ------------------------------------------------------------------------------------------------ figures, section


def test_llm_figures_are_drawn_with_captions(results, tmp_path):
    from verification.report import figures
    from verification.report.llm_figures import LLM_FIGURES

    tables = {r.id: r.tables for r in results[0].values()}
    drawn, missing = figures.draw_all(tmp_path, [], tables, figures=LLM_FIGURES)
    assert all("llm" in f for f in LLM_FIGURES)
    assert set(missing) == {"llm_preference.png"}  # no held-out columns in a synthetic run
    assert {"llm_trajectory_hypothesis.png", "llm_h20_ratio.png", "llm_dispersion_by_clustering.png",
            "llm_pipelines_vs_k.png"} <= set(drawn)
    for f, cap in drawn.items():
        assert (tmp_path / f).stat().st_size > 10_000
        assert "Measured" in cap or "measured" in cap or "Gap" in cap or "Per training client" in cap


def test_section_without_an_llm_says_why_and_goes_on(tmp_path, monkeypatch):
    """torch / the model missing: the section says so, the synthetic side is still studied and drawn."""
    from verification.report import llm_section

    monkeypatch.setattr(llm_section, "llm_unavailable", lambda: "torch is not installed (test)")
    monkeypatch.setattr(llm_section, "SIM_S_VALUES", (16,))
    sec = llm_section.build_llm_section(tmp_path, seed=0)
    assert sec.status == "unavailable" and "torch is not installed (test)" in sec.message
    assert sec.synthetic is not None and not sec.llm_runs
    assert {r.id for r in sec.results} >= {"llm-eq71-trajectory", "llm-H20-ratio", "llm-pipelines"}
    md = "\n".join(llm_section.section_markdown(sec))
    assert md.startswith("## LLM run") and "torch is not installed (test)" in md
    assert "llm_h20_ratio.png" in md
    html = llm_section.section_html(sec)
    assert "<h2>LLM run</h2>" in html


def test_skipped_section(tmp_path):
    from verification.report import llm_section

    sec = llm_section.build_llm_section(tmp_path, enabled=False)
    assert sec.status == "skipped" and not sec.results
    assert "--no-llm" in "\n".join(llm_section.section_markdown(sec))


def test_llm_run_option_rejects_a_synthetic_run(sim_dir, capsys, no_statement_runs):
    from verification.__main__ import main

    assert main(["report", "S4", "--out", str(sim_dir.parent / "rep"), "--llm-run", str(sim_dir)]) == 2
    assert "argument --llm-run" in capsys.readouterr().err
    assert main(["report", "S4", "--out", str(sim_dir.parent / "rep"), "--llm-run", str(sim_dir.parent / "nope")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ LLM regression


def _copy(run, psi_scale: float = 1.0, path=None):
    rec = run.records.copy()
    rec["psi"] = rec["psi"] * psi_scale
    return type(run)(path=path or run.path, kind=run.kind, records=rec, summary=run.summary, objectives=None)


def test_llm_regression_baseline_and_comparison(run):
    from verification.llm import regression as LR

    with pytest.raises(ValueError, match=">= 2 runs"):
        LR.make_baseline([run])
    base = LR.make_baseline([run, _copy(run, 1.0 + 1e-4)])
    q = base["quantities"]
    exact = [k for k, v in q.items() if v["compare"] == "exact"]
    assert exact and all(k.startswith("exact.") for k in exact)
    tol = [v for v in q.values() if v["compare"] == "tolerance"]
    # spread 1e-4 measured -> rtol = max(2^-8, 10 * 1e-4) = 2^-8
    assert all(v["rtol"] == max(LR.RTOL_FLOOR, LR.FACTOR * v["spread"]) for v in tol)
    assert max(v["spread"] for v in tol) == pytest.approx(1e-4, rel=1e-3)
    assert LR.compare_run(run, base).ok
    assert LR.compare_run(_copy(run, 1.0 + 1e-3), base).ok  # within the bf16 floor
    reg = LR.compare_run(_copy(run, 1.05), base)
    assert not reg.ok and all("baseline" in f for f in reg.failures)
    assert "psi." in LR.regression_text(reg) and "REGRESSION" in LR.regression_text(reg)
    other = dict(base, seed=1)
    assert "seed" in LR.compare_run(run, other).failures[0]
    json.dumps(base, allow_nan=False)
    assert "bf16" in LR.baseline_text(base)


def test_llm_regression_command_line(sim_dir, tmp_path, capsys):
    from verification.__main__ import main

    b = tmp_path / "base.json"
    assert main(["llm-regression", str(sim_dir), str(sim_dir), "--baseline", str(b), "--write"]) == 0
    assert main(["llm-regression", str(sim_dir), "--baseline", str(b)]) == 0
    assert "0 regression(s)" in capsys.readouterr().out
    assert main(["llm-regression", str(sim_dir), "--baseline", str(tmp_path / "missing.json")]) == 2
    assert "argument --baseline" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ LLM-format records


def test_studies_read_the_llm_format(llm_like):
    d, res, _ = llm_like
    run = load_run(d)
    assert run.kind == "llm" and run.clusterings is not None and run.objectives == _OBJ
    out, not_run = LS.run_llm_studies([run])
    assert not not_run, not_run
    by = {r.id: r for r in out}
    assert by["llm-preference"].summary["available"] is True
    h8 = by["llm-H8-dispersion"].summary["LLM"]
    assert h8["h6_rule"] == "lp_inputs" and "h6_common_basis_frac_multi_client" in h8
    assert h8["stage1_key"] == "bottleneck"
    assert al.same_partition([np.array(g) for g in h8["stage1_groups"]],
                             [res.train_clients[np.flatnonzero(res.clustering.stage1_labels == g)]
                              for g in range(int(res.clustering.stage1_labels.max()) + 1)])
    comp = h8["clustering_comparison"]
    assert {"stage1_stage2", "stage1_only", "random"} <= set(comp) and comp["random"]["n_draws"] == 2
    assert comp["random"]["cluster_sizes"] == comp["stage1_stage2"]["cluster_sizes"]
    assert comp["ratio_stage1_stage2_to_random.time_mean_dispersion"] == pytest.approx(
        comp["stage1_stage2"]["time_mean_dispersion"] / comp["random"]["time_mean_dispersion"])


def test_h8_comparison_rows_are_the_recorded_dispersions(llm_like):
    d, res, _ = llm_like
    run = load_run(d)
    br = LS.study_h8_dispersion_run([run]).tables["by_round"]
    own = br[br["clustering"] == "stage1_stage2"]
    it = training_iterates(run)
    want = it.groupby(["cluster", "t"])["dispersion"].first()
    assert (own.set_index(["cluster", "t"])["dispersion"] == want).all()
    comp = run.clusterings
    for (name, draw), g in br[br["clustering"] != "stage1_stage2"].groupby(["clustering", "draw"]):
        if g["same_as_stage1_stage2"].all():
            p1 = own[own["phase"] == "phase1"]
            assert sorted(g["dispersion"]) == sorted(p1["dispersion"])
            continue
        c = comp[(comp["clustering"] == name) & (comp["draw"] == draw)]
        w = c.groupby(["cluster", "round"])["dispersion"].first()
        assert (g.set_index(["cluster", "t"])["dispersion"].sort_index() == w.sort_index()).all()


def test_h6_from_recorded_lp_inputs_matches_the_in_memory_classification(llm_like):
    """H.6 re-classified from the recorded Grams and LP weights equals the classification of the LP solved on the
    population Grams of the server models themselves."""
    from sim.constants import client_basis
    from sim.direction import lp_direction
    from verification.studies.synthetic import H6_STATUSES, _h6_status

    d, res, src = llm_like
    run = load_run(d)
    h6 = LS.study_h8_dispersion_run([run]).tables["h6_status"]
    assert set(h6["status"]) <= set(H6_STATUSES) and (h6["rule"] == "lp_inputs").all()
    checked = 0
    for c, members in enumerate(res.clustering.clusters):
        clients = res.train_clients[members]
        traj = res.phases[c]["phase1"].trajectory
        for r in range(traj.shape[0]):
            l, G = src.population(np.broadcast_to(traj[r], (clients.size, src.n_params)), clients)
            C = np.einsum("nwj,nwk->njk", G, G)
            lam = src.prefs[clients]
            dr = lp_direction(l, lam, C)
            bases = [client_basis(l[k], lam[k], C[k], dr.weights[k], str(dr.mode[k])) for k in range(clients.size)]
            want = "descent_client" if np.any(dr.mode != "balance") else _h6_status(dr.mode, bases)
            got = h6[(h6["cluster"] == c) & (h6["t"] == r)]["status"].iloc[0]
            assert got == want, (c, r, got, want)
            checked += 1
    assert checked > 0


def test_h6_without_lp_inputs_falls_back_to_what_the_records_rule_out(llm_like, tmp_path):
    d, _, _ = llm_like
    rec = pd.read_csv(d / "trajectory.csv")
    rec = rec.drop(columns=[c for c in rec.columns if c.startswith(("gram_", "mu_"))])
    (tmp_path / "r").mkdir()
    rec.to_csv(tmp_path / "r" / "trajectory.csv", index=False)
    summary = json.loads((d / "summary.json").read_text())
    (tmp_path / "r" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="clusterings.csv is missing"):
        load_run(tmp_path / "r")
    del summary["clustering_comparison"]
    (tmp_path / "r" / "summary.json").write_text(json.dumps(summary))
    res = LS.study_h8_dispersion_run([load_run(tmp_path / "r")])
    s = res.summary["LLM"]
    assert s["h6_rule"] == "records_only" and "h6_upper_bound_frac_multi_client" in s
    assert s["clustering_comparison"] is None  # the run records no comparison
    assert set(res.tables["h6_status"]["status"]) <= {"descent_client", "different_Jstar", "undetermined_all_balancing"}


def test_llm_figures_on_llm_format_records(llm_like, tmp_path):
    from verification.report import figures
    from verification.report.llm_figures import LLM_FIGURES

    run = load_run(llm_like[0])
    out, _ = LS.run_llm_studies([run])
    # the two figures whose LLM-only parts a synthetic run does not reach (the others: the test above)
    which = {f: LLM_FIGURES[f] for f in ("llm_dispersion_by_clustering.png", "llm_preference.png")}
    drawn, missing = figures.draw_all(tmp_path, [], {r.id: r.tables for r in out}, figures=which)
    assert not missing, missing
    assert "stage1_only" in drawn["llm_dispersion_by_clustering.png"]


def test_h20_denominators_from_the_recorded_grams(llm_like):
    """With the LP inputs each set's d_M comes from its own hull; the J*_eps hull's agrees with the d_M the run
    measured, and a singleton J* gives ||lambda_j g_j||."""
    from sim.hull import near_active_set

    run = load_run(llm_like[0])
    res = LS.study_h20_ratio_run([run])
    pts = res.tables["points"]
    assert (pts["denominator"] == "own_hull_from_gram").all()
    assert res.summary["LLM"]["dm_gram_vs_recorded_max_rel_diff"] < 1e-6
    je = pts[(pts["index_set"] == "J_eps") & ~pts["dm_zero"]]
    np.testing.assert_allclose(je["dm_norm"], je["dm_norm_recorded"], rtol=1e-6)
    st = step_rows(run)
    l = st[[f"loss_{o}" for o in _OBJ]].to_numpy()
    lam = np.stack([run.prefs[int(i)] for i in st["client"]])
    js = pts[pts["index_set"] == "J_star"].reset_index(drop=True)
    single = near_active_set(l, lam, 0.0).sum(axis=1) == 1
    j = np.argmax(lam * l, axis=1)
    diag = st[[f"gram_{k}_{k}" for k in range(3)]].to_numpy()[np.arange(len(st)), j]
    np.testing.assert_allclose(js.loc[single, "dm_norm"], (lam[np.arange(len(st)), j] * np.sqrt(diag))[single],
                               rtol=1e-12)
    assert (js["dm_zero"] == (js["dm_norm"] <= 1e-3 * js["generator_bound"])).all()


def test_rewards_of_generated_responses_are_paired_with_the_base_model(llm_like, tmp_path):
    """generations.csv: each model's rewards against the base model's on the same (prompt, sample), in
    within-prompt sd units; the weighted change is positive when rewards rise on the heavier objectives."""
    import shutil

    d = tmp_path / "run"
    shutil.copytree(llm_like[0], d)
    summary = json.loads((d / "summary.json").read_text())
    sd = {"first": 2.0, "second": 0.5, "third": 1.0}
    summary["objective_agreement"] = {"objectives": {o: {"within_prompt_sd": v} for o, v in sd.items()}}
    (d / "summary.json").write_text(json.dumps(summary))
    res = llm_like[1]
    prefs = {c["client"]: np.array(c["prefs"]) for c in summary["clients"]["clients"]}
    rows = []
    rng = np.random.default_rng(0)
    base = {(p, s): rng.normal(size=3) for p in ("a", "b") for s in (0, 1)}
    for (p, s), r in base.items():
        rows.append(dict(model="w_ref", cluster=-1, clients=" ".join(map(str, range(len(prefs)))), prompt_id=p,
                         sample=s, **{f"reward_{o}": r[j] for j, o in enumerate(_OBJ)}))
    for k, i in enumerate(res.new_clients):  # each new client's model gains 0.1 * lambda_j * sd_j on every response
        lam = prefs[int(i)]
        for (p, s), r in base.items():
            rows.append(dict(model="pipeline1_wII", cluster=int(res.assignment[k]), clients=str(int(i)), prompt_id=p,
                             sample=s, **{f"reward_{o}": r[j] + 0.1 * lam[j] * sd[o] for j, o in enumerate(_OBJ)}))
    pd.DataFrame(rows).assign(n_tokens=10, finished=True, cut_off="", text="x").to_csv(d / "generations.csv",
                                                                                       index=False)
    study = LS.study_preference_run([load_run(d)])
    t = study.tables["rewards"]
    assert set(t["model"]) == {"pipeline1_wII"} and (t["n_responses"] == 4).all()
    np.testing.assert_allclose(t["change_sd_units"], 0.1 * t["lam"], rtol=1e-12)
    np.testing.assert_allclose(t["change_se_sd_units"], 0.0, atol=1e-12)
    s = study.summary["rewards"]["LLM"]["pipeline1_wII"]
    assert s["mean_weighted_change"] > 0 and s["frac_clients_top_objective_gain_largest"] == 1.0
