"""Tests of verification.studies.synthetic: every study runs with its default config, returns non-empty tidy tables with the
expected columns and a JSON-serialisable summary, is deterministic for a fixed seed; the properties that the theory
*does* imply are asserted (eq 91 for the idealised adaptation, H.43; (P-a)/(P-b) of the LP on J*)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sim.algorithm import AdaptConfig, ClientSource, draw_batches, pipeline1
from sim.problems import CommonMinimizer
from verification.studies import synthetic as ST

EXPECTED_COLUMNS = {
    "study-H20-ratio": {
        "points": {"phase", "round", "t", "cluster", "client", "index_set", "margin", "dm_norm_sq", "dm_zero",
                   "numerator_negative", "ratio", "gap", "lp_mode"},
        "frequencies": {"phase", "index_set", "n_points", "n_dm_zero", "n_included", "frac_negative_numerator",
                        "sigma_hat", "ratio_median"},
        "quantiles_by_phase": {"phase", "index_set", "quantile", "ratio", "n_included"},
        "quantiles_by_client": {"phase", "index_set", "cluster", "client", "quantile", "ratio", "n_included"},
        "per_client": {"phase", "index_set", "client", "frac_negative_numerator", "sigma_hat"},
    },
    "study-H8-dispersion": {
        "by_round": {"problem", "clustering", "draw", "round", "n_clusters", "mean_dispersion", "max_dispersion",
                     "size_weighted_dispersion"},
        "by_cluster": {"problem", "clustering", "draw", "cluster", "size", "round", "dispersion"},
        "reference": {"problem", "clustering", "draw", "cluster", "size", "dispersion_ref",
                      "adjustment_variance_ref"},
    },
    "study-H6-basis": {
        "by_round": {"scope", "phase", "round", "t", "status", "n_clusters", "count", "fraction"},
        "by_cluster": {"phase", "round", "t", "cluster", "size", "status", "common_basis", "n_descent", "h5_gap"},
    },
    "study-adamw-adaptation": {
        "gap_vs_k": {"preconditioner", "batch_size", "k", "mean_gap", "se_gap", "exact_gap", "bound", "ratio",
                     "bound_kind", "hypotheses_h41_hold"},
        "hypotheses": {"preconditioner", "hypothesis", "holds", "detail"},
        "preconditioner_range": {"preconditioner", "batch_size", "p_min_observed", "p_max_observed"},
    },
}

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(study_id)``: two runs of the study with its default config and seed 0, computed once per module: the
    study's own ``run`` and ``ST.run_studies([study_id], seed=0, out_dir=...)`` (the same config and a fresh
    generator of the same seed, so the determinism test compares two runs and the writer's test reads the second's
    files), and the second's output folder."""
    cache: dict = {}

    def get(study_id: str):
        if study_id not in cache:
            s = ST.get_study(study_id)
            out = tmp_path_factory.mktemp(f"studies-{study_id}")
            first = s.run(s.config_factory(), np.random.default_rng(0))
            (second,) = ST.run_studies([study_id], seed=0, out_dir=out)
            cache[study_id] = (first, second), out
        return cache[study_id]

    return get


def _runs(runs, study_id: str):
    return runs(study_id)[0]


@pytest.mark.parametrize("study_id", list(ST.STUDIES))
def test_tables_and_summary(study_id, runs):
    res, _ = _runs(runs, study_id)
    assert res.id == study_id
    assert set(res.tables) == set(EXPECTED_COLUMNS[study_id])
    for name, cols in EXPECTED_COLUMNS[study_id].items():
        df = res.tables[name]
        assert isinstance(df, pd.DataFrame) and len(df) > 0, name
        assert cols <= set(df.columns), (name, cols - set(df.columns))
        assert all(c == c.lower() and " " not in c for c in df.columns), name
    json.dumps(res.summary, allow_nan=False)
    assert res.summary and res.notes


@pytest.mark.parametrize("study_id", list(ST.STUDIES))
def test_deterministic(study_id, runs):
    a, b = _runs(runs, study_id)
    for name in a.tables:
        pd.testing.assert_frame_equal(a.tables[name], b.tables[name], check_exact=True)
    assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)


def test_adamw_idealised_gaps_below_eq91(runs):
    """H.43 / eq 91 holds for the idealised methods: exactly (moment recursion) for deterministic P, and for the
    Monte-Carlo means within 4 standard errors (identity, fixed, lagged RMSprop)."""
    res, _ = _runs(runs, "study-adamw-adaptation")
    t = res.tables["gap_vs_k"]
    ideal = t[t["preconditioner"].isin(["identity", "fixed"])]
    assert len(ideal) and ideal["step_condition"].all()
    assert (ideal["exact_gap"] <= ideal["bound"] * (1 + 1e-9) + 1e-12).all()
    mc = t[t["preconditioner"].isin(["identity", "fixed", "rmsprop_lagged"])]
    assert (mc["mean_gap"] - 4.0 * mc["se_gap"] <= mc["bound"]).all()
    ident = t[t["preconditioner"] == "identity"]
    assert np.allclose(ident["mean_gap"][ident["k"] == 0], ident["exact_gap"][ident["k"] == 0], rtol=1e-12)
    adam = res.tables["hypotheses"]
    assert not adam[(adam["preconditioner"] == "adamw")
                    & adam["hypothesis"].isin(["h41a_P_k_measurable", "h41c_no_momentum",
                                               "h41d_no_weight_decay"])]["holds"].any()


def test_h20_Jstar_numerator_nonnegative_and_dM_rule(runs):
    """(P-a)/(P-b): the LP direction never increases a bottleneck objective to first order, so the J* numerator is
    >= 0 up to the rounding tolerance; d_M ~ 0 points carry no ratio."""
    res, _ = _runs(runs, "study-H20-ratio")
    p = res.tables["points"]
    assert not p.loc[p["index_set"] == "J_star", "numerator_negative"].any()
    assert p.loc[p["dm_zero"], "ratio"].isna().all()
    assert p.loc[~p["dm_zero"], "ratio"].notna().all()


def test_h6_fractions_and_h5(runs):
    res, _ = _runs(runs, "study-H6-basis")
    br = res.tables["by_round"]
    sums = br.groupby(["scope", "phase", "round"])["fraction"].sum()
    assert np.allclose(sums, 1.0)
    assert (res.tables["by_cluster"]["h5_gap"] == 0).all()
    assert set(br["status"]) == set(ST.H6_STATUSES)


def test_h8_random_partitions_have_stage2_sizes(runs):
    res, _ = _runs(runs, "study-H8-dispersion")
    ref = res.tables["reference"]
    for _prob, g in ref.groupby("problem"):
        s12 = sorted(g[g["clustering"] == "stage1_stage2"]["size"])
        for _, r in g[g["clustering"] == "random"].groupby("draw"):
            assert sorted(r["size"]) == s12


# ---------------------------------------------------------------------------------------------------------- adapters


class _F3Clients:
    """F3 as a ClientProblem of ``n`` identical new clients (population level)."""

    def __init__(self, F3: CommonMinimizer, n: int):
        self.F3 = F3
        self.prefs = np.broadcast_to(F3.prefs, (n, F3.n_objectives)).copy()
        self.psi_star = np.full(n, F3.psi_star)

    n_clients = property(lambda self: self.prefs.shape[0])
    n_params = property(lambda self: self.F3.n_params)
    n_objectives = property(lambda self: self.F3.n_objectives)

    def losses_per_client(self, w):
        return self.F3.losses(w)

    def grads_per_client(self, w):
        return self.F3.grads(w)


class _F3Samples:
    """Sample level: client ``i`` holds a pool of gradient-noise samples; a batch mean ``ξ̄`` gives the direction
    ``λ_{j*}(Q(w − c) + ξ̄)`` through pipeline1's ``"chebyshev"`` direction."""

    def __init__(self, problem: _F3Clients, pool: np.ndarray):
        self.problem, self.pool = problem, pool

    @property
    def n_samples(self):
        return np.full(self.pool.shape[0], self.pool.shape[1])

    def sample_losses(self, w, client, idx=None):
        return self.problem.F3.losses(w)

    def sample_grads(self, w, client, idx=None):
        F3 = self.problem.F3
        g = F3.hessian @ (np.asarray(w) - F3.centre) + self.pool[client][idx].mean(axis=0)
        return np.repeat(g[:, None], F3.n_objectives, axis=1)

    def episode(self, rng, client, size):
        return np.sort(rng.choice(self.pool.shape[1], size=size, replace=False))


@pytest.mark.parametrize("method", ["identity", "fixed", "rmsprop_lagged", "adamw"])
def test_adaptation_runs_match_pipeline1(method):
    """The study's vectorised Pipeline-1 optimiser reproduces sim.algorithm.pipeline1 step for step."""
    rng = np.random.default_rng(3)
    F3 = CommonMinimizer.reference()
    n, K, S, alpha = 3, 7, 4, 0.08
    prob = _F3Clients(F3, n)
    pool = rng.standard_normal((n, 50, F3.n_params))
    src = ClientSource(prob, _F3Samples(prob, pool))
    clients = np.arange(n)
    w0 = F3.w0 + 0.3 * rng.standard_normal((n, F3.n_params))
    batches = draw_batches(src, clients, K, S, rng)
    P = np.diag([0.5, 1.0, 1.5, 2.0]) if method == "fixed" else None
    cfg = AdaptConfig(K=K, S=S, alpha_adapt=alpha, preconditioner=method, direction="chebyshev", P=P,
                      p_minus=0.5, p_plus=2.0, weight_decay=0.01 if method == "adamw" else 0.0)
    ref = pipeline1(src, clients, w0, cfg, batches=batches)
    xi_bar = np.stack([[pool[c][batches[c, k]].mean(axis=0) for k in range(K)] for c in range(n)])  # (n, K, n_w)
    lam = F3.lam_star

    def direction(k, W):
        return lam * ((W - F3.centre) @ F3.hessian + xi_bar[:, k])

    traj, _, _ = ST.adaptation_runs(w0, K, alpha, direction, method, P=P, p_clip=(0.5, 2.0),
                                    weight_decay=cfg.weight_decay)
    np.testing.assert_allclose(traj, ref.trajectory, rtol=1e-12, atol=1e-12)


def test_run_studies_writes_tables(runs):
    (first, second), tmp_path = runs("study-adamw-adaptation")  # second: run_studies(["study-adamw-adaptation"])
    out = [second]
    assert [r.id for r in out] == ["study-adamw-adaptation"]
    d = tmp_path / "study-adamw-adaptation"
    for name, df in out[0].tables.items():
        back = pd.read_csv(d / f"{name}.csv")
        assert back.shape == df.shape and list(back.columns) == list(df.columns)
    doc = json.loads((d / "summary.json").read_text())
    assert doc["id"] == "study-adamw-adaptation" and doc["seed"] == 0 and "summary" in doc
    assert "study-adamw-adaptation" in json.loads((tmp_path / "summary.json").read_text())
    pd.testing.assert_frame_equal(out[0].tables["gap_vs_k"], first.tables["gap_vs_k"])


def test_unknown_study_id():
    with pytest.raises(ValueError, match="unknown study id 'nope'"):
        ST.run_studies(["nope"])
