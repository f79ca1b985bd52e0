"""Tests of sim.algorithm.run and sim.algorithm.scenario (run_algorithm end to end: its records, determinism,
progress and trajectories; the local-only baseline; the planted scenario's defaults) and the sim.simulate command
line."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd
import pytest

import sim.algorithm as al
from sim.simulate import ProblemSpec, build_problem, main


def _small_run(seed, **kw):
    spec = ProblemSpec(m=3, n_w=4, n_groups=1, n_train=3, n_new=2, train_samples=30, new_samples=60)
    src, w_ref, train, new, _ = build_problem(spec, np.random.default_rng(seed))
    cfg = al.AlgorithmConfig(
        phase1=al.Phase1Config(rounds=3, tau=2, batch_size=5), phase2=al.Phase2Config(rounds=2, S=4, K=2),
        adapt=al.AdaptConfig(K=3, S=4, preconditioner="rmsprop_lagged"),
        adamw=al.AdaptConfig(K=3, S=4, preconditioner="adamw", weight_decay=0.01),
        pipeline2=al.Pipeline2Config(max_steps=10, record_every=4),
    )
    return al.run_algorithm(src, cfg, np.random.default_rng(seed), w_ref=w_ref, train_clients=train,
                            new_clients=new, **kw)


def test_records_are_tidy_and_runs_are_deterministic():
    a, b, c = _small_run(0), _small_run(0), _small_run(1)
    df = a.records
    assert tuple(df.columns) == al.RECORD_COLUMNS
    # snake_case; capitals only in the paper's symbols J*, J*_ε and d_M
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", col.replace("Jstar", "j").replace("Jeps", "j").replace("dM", "d"))
               for col in df.columns)
    assert not df.duplicated(["phase", "cluster", "round", "client"]).any()
    assert set(df["phase"]) == {"phase1", "phase2", "fedavg", "pipeline1_wI", "pipeline1_wII", "local_only",
                                "fedavg_adapt", "pipeline1_wII_adamw", "pipeline2"}
    assert df["psi"].dtype == np.float64 and np.isfinite(df["gap"]).all()
    tr = df[df["phase"].isin(["phase1", "phase2"])]
    for col in ("beta", "gain", "deviation", "dispersion", "margin_Jstar", "margin_Jeps", "dM_norm", "eps_act"):
        assert np.isfinite(tr[col]).all(), col
    assert (tr["margin_Jeps"] <= tr["margin_Jstar"] + 1e-15).all()  # J* ⊆ J*_ε
    np.testing.assert_allclose(tr["eta_eff"], tr["alpha_server"] * tr["eta_local"].fillna(tr["eta_meta_inner"]))
    assert df.attrs["params"]["phase1"]["rounds"] == 3
    pd.testing.assert_frame_equal(a.records, b.records)
    assert a.summary == b.summary
    assert not np.allclose(a.w_II, c.w_II)


class _WithMetrics(al.ClientSource):
    """The planted source with the optional ``record_metrics``: the first loss of each row and ψ recomputed."""

    def record_metrics(self, W, clients, losses):
        return {"loss_0": losses[:, 0].copy(), "psi_again": (self.prefs[clients] * losses).max(axis=-1)}


def test_the_source_metric_columns_are_recorded_with_their_values(f1_samples):
    """A source's ``record_metrics`` columns follow RECORD_COLUMNS in every phase's records, with its values (ψ
    recomputed from the row's losses is the recorded ψ)."""
    src, w0 = f1_samples
    ms = _WithMetrics(src.problem, src.samples)
    new = np.array([4, 5])
    frames = [al.phase1(ms, np.arange(4), w0, al.Phase1Config(rounds=2), np.random.default_rng(0)).records,
              al.pipeline1(ms, new, w0, al.AdaptConfig(K=2, S=4), np.random.default_rng(0)).records,
              al.pipeline2(ms, new, w0, al.Pipeline2Config(max_steps=3, record_every=2)).records]
    for df in frames:
        assert list(df.columns) == [*al.RECORD_COLUMNS, "loss_0", "psi_again"]
        np.testing.assert_allclose(df["psi_again"], df["psi"], rtol=1e-15)
        assert np.isfinite(df["loss_0"]).all() and (df["loss_0"] > 0).all()


def test_run_algorithm_reports_the_progress_of_every_stage():
    """``progress(label, done, total)`` names each stage: the phases per round, each adaptation at its start (0 of 1)
    and its end (1 of 1); Pipeline 2 comes last."""
    calls: list[tuple] = []
    _small_run(0, keep_trajectory=False, progress=lambda *a: calls.append(a))
    labels = [c[0] for c in calls]
    assert labels.count("phase1 cluster 0") == 4  # rounds 0..3 of Phase 1
    assert calls[-2:] == [("pipeline2", 0, 1), ("pipeline2", 1, 1)] and labels.count("pipeline2") == 2


def test_run_algorithm_keeps_trajectories_only_when_asked():
    res = _small_run(0, keep_trajectory=False)
    assert all(ph.trajectory is None for c in res.phases.values() for ph in c.values())
    assert all(a.trajectory is None for a in res.adaptation.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.summary = {}


def test_cli_smoke_writes_trajectory_and_summary(tmp_path, capsys):
    assert main(["--preset", "smoke", "--out", str(tmp_path), "--seed", "0", "--clients", "6"]) == 0
    out = capsys.readouterr()
    assert "phase1 cluster 0" in out.err  # progress on stderr
    assert "pipeline2" in out.out  # one-screen summary on stdout
    df = pd.read_csv(tmp_path / "trajectory.csv")
    assert tuple(df.columns) == al.RECORD_COLUMNS
    import json

    summary = json.loads((tmp_path / "summary.json").read_text())
    gaps = summary["mean_final_gap"]
    assert set(gaps) >= {"pipeline1_wI", "pipeline1_wII", "pipeline2", "local_only", "fedavg_adapt"}
    assert gaps["pipeline2"] < 1e-8 < gaps["pipeline1_wII"]
    assert summary["seed"] == 0 and summary["params"]["adapt"]["preconditioner"] == "rmsprop_lagged"
    assert summary["n_train_clients"] == 6 and summary["problem"]["n_train"] == 3  # --clients 6: 3 per group
    assert df[df.phase == "phase1"].client.nunique() == 6


def test_local_only_records_its_own_phase(f1_samples):
    """The local-only baseline is Pipeline 1's optimiser, recorded under its own phase name."""
    src, w0 = f1_samples
    res = al.local_only(src, np.array([4]), w0, al.AdaptConfig(K=1, S=2), np.random.default_rng(0))
    assert set(res.records["phase"]) == {"local_only"}


def test_problem_spec_defaults_are_the_default_scenario():
    """``ProblemSpec()``, the scenario ``python -m sim.simulate`` runs by default: 2 groups of 4 training and 2 new
    clients, m = 3 objectives, 5 parameters, spread 0.05."""
    spec = al.ProblemSpec()
    assert (spec.m, spec.n_w, spec.n_groups, spec.n_train, spec.n_new, spec.spread) == (3, 5, 2, 4, 2, 0.05)
    assert (spec.train_samples, spec.new_samples, spec.noise_scale, spec.w_ref_offset) == (200, 4000, 0.1, 0.5)


def test_the_summary_records_both_training_step_sizes():
    res = _small_run(0)
    cfg1, cfg2 = al.Phase1Config(rounds=3, tau=2, batch_size=5), al.Phase2Config(rounds=2, S=4, K=2)
    assert res.summary["eta_I"] == cfg1.eta_eff and res.summary["eta_II"] == cfg2.eta_eff


def test_an_adaptation_row_is_from_an_lp_step_exactly_when_it_is_a_steps_row():
    """Adaptation records: a step's row (``local_steps`` 1) carries that step's LP (``lp_from_step``), the last row
    of a run (``local_steps`` 0, no step taken from it) does not."""
    df = _small_run(0).records
    ad = df[df["phase"].isin(["pipeline1_wI", "pipeline1_wII", "local_only", "fedavg_adapt", "pipeline1_wII_adamw"])]
    assert set(ad["local_steps"]) == {0, 1}
    assert (ad["lp_from_step"] == (ad["local_steps"] == 1)).all()
