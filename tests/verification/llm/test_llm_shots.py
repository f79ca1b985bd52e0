"""Tests of verification.llm.shots (the shots curve's pre-registered analysis) on simulated records: planted effects
are detected (power stated), the nulls are uniform, the within-cluster null ignores between-cluster effects, Holm
against a hand computation, the ψ-raise flags and H.43's check, bad input, the CSV records and the figure. No model
runs; the many-simulation checks call the statistics on simulated per-seed arrays, the end-to-end ones go through
the record tables."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from verification.llm import shots as sh
from verification.llm.personalisation import fixed_effect_slope, verdict

OBJECTIVES = ("o0", "o1", "o2")
ALPHA = 0.05


def simulate(rng: np.random.Generator, *, n_seeds: int = 8, n_clusters: int = 3, per_cluster: int = 3,
             budgets=(1,), gain_local: float = 0.0, gain_fedavg: float = 0.0, between: float = 0.0,
             within: float = 0.0, mates: float = 0.0, noise: float = 0.03, n_pairs: int = 60,
             cross: bool = True) -> list[sh._Seed]:
    """Seeds of ``n_clusters`` clusters of ``per_cluster`` new clients; λ near the cluster's centre (0.6 on its
    objective) with a Dirichlet spread. ``pipeline1_wII``'s margin change is ``between·Λ_c + within·(λ − Λ_c)``
    plus a random cluster × objective effect and noise; its accuracy exceeds ``local``'s by ``gain_local`` and
    ``fedavg``'s by ``gain_fedavg``; a cluster-mate's model scores ``mates`` below the own one (cross table)."""
    m = len(OBJECTIVES)
    out = []
    for s in range(n_seeds):
        centres = 0.2 + 0.4 * np.eye(m)[:n_clusters]
        cluster = np.repeat(np.arange(n_clusters), per_cluster)
        lam = 0.6 * centres[cluster] + 0.4 * rng.dirichlet(np.ones(m), size=len(cluster))
        n = len(lam)
        lam_c = np.array([lam[cluster == c].mean(axis=0) for c in range(n_clusters)])[cluster]
        acc, z, xs = {}, {}, {}
        for b in budgets:
            common = 0.6 + noise * rng.standard_normal((n, m))
            noisy = {meth: 0.55 + noise * rng.standard_normal((n, m)) for meth in sh.METHODS}
            noisy.update({
                "pipeline1_wII": common,
                "local": common - gain_local + noise * rng.standard_normal((n, m)),
                "fedavg": common - gain_fedavg + noise * rng.standard_normal((n, m)),
                "base": np.full((n, m), 0.5), "oracle": np.full((n, m), 0.75)})
            for meth in sh.METHODS:
                acc[(b, meth)] = np.round(np.clip(noisy[meth], 0, 1) * 2 * n_pairs) / (2 * n_pairs)
                z[(b, meth)] = noise * rng.standard_normal((n, m)) if meth != "base" else np.zeros((n, m))
            z[(b, "pipeline1_wII")] = (between * lam_c + within * (lam - lam_c) + 0.05 *
                                       rng.standard_normal((n_clusters, m))[cluster] + noise * rng.standard_normal((n, m)))
            if cross:
                arr = 0.6 - mates + noise * rng.standard_normal((n, n, m))
                arr[np.arange(n), np.arange(n)] = acc[(b, "pipeline1_wII")]
                xs[b] = np.where((cluster[:, None] == cluster[None, :])[..., None], arr, np.nan)
        out.append(sh._Seed(s, np.arange(n), cluster, lam, acc, z, xs if cross else None))
    return out


def to_records(seeds: list[sh._Seed], budgets, *, psi: dict | None = None) -> sh.ShotsRecords:
    """The record tables of simulated seeds (the format of the module docstring; cluster labels 10, 11, …);
    ``psi[(seed, client, budget, method)] = (psi0, psiK, alpha, p_minus, p_plus, L0_hat)`` overrides the default
    adaptation row (ψ falls, α = 0.1, P in [0.5, 2], L̂0 = 1)."""
    clients, scores, adapt, cross = [], [], [], []
    psi = psi or {}
    for sd in seeds:
        for i, c in enumerate(sd.clients):
            clients += [(sd.seed, c, 10 + sd.cluster[i], o, sd.lam[i, j]) for j, o in enumerate(OBJECTIVES)]
            for b in budgets:
                for meth in sh.METHODS:
                    scores += [(sd.seed, c, b, meth, o, 60, sd.acc[(b, meth)][i, j], sd.z[(b, meth)][i, j])
                               for j, o in enumerate(OBJECTIVES)]
                for meth in ("pipeline1_wII", "pipeline1_wI"):
                    adapt.append((sd.seed, c, b, meth, *psi.get((sd.seed, c, b, meth), (0.5, 0.4, 0.1, 0.5, 2.0, 1.0))))
                if sd.cross is not None:
                    for k in sd.clients:
                        if k != c and sd.cluster[k] == sd.cluster[i]:
                            cross += [(sd.seed, b, "pipeline1_wII", k, c, o, sd.cross[b][i, k, j])
                                      for j, o in enumerate(OBJECTIVES)]
    cols = {name: [c for c, _ in spec] for name, spec in sh._COLUMNS.items()}
    return sh.ShotsRecords(pd.DataFrame(clients, columns=cols[sh.CLIENTS]), pd.DataFrame(scores, columns=cols[sh.SCORES]),
                           pd.DataFrame(adapt, columns=cols[sh.ADAPTATION]),
                           pd.DataFrame(cross, columns=cols[sh.CROSS]) if cross else None)


def p_values(seeds: list[sh._Seed], seed: int, n_perm: int = 499) -> dict[str, float]:
    out = sh._analyse(seeds, [1], n_perm=n_perm, seed=seed, n_boot=20)
    return {line["statistic"]: line["p_value"] for line in out["lines"]}


def binomial_band(n: int, rate: float = ALPHA) -> tuple[int, int]:
    """The two-sided 99 % band of the number of rejections in ``n`` independent tests at ``rate``."""
    return int(stats.binom.ppf(0.005, n, rate)), int(stats.binom.ppf(0.995, n, rate))


# ------------------------------------------------------------------------------------------ power and nulls


def test_uniform_under_the_null():
    """200 null data sets (no gain, no slope, no own-model advantage): every tested statistic's p-values pass a KS
    test against uniform at 0.01, and the rejections at α = 0.05 are within the 99 % binomial band."""
    rng = np.random.default_rng(11)
    n_sim = 200
    ps = pd.DataFrame([p_values(simulate(rng), seed=k) for k in range(n_sim)])
    assert list(ps.columns) == ["gain_over_local", "gain_over_fedavg", "cluster_slope", "within_cluster_slope",
                                "own_vs_mates"]
    lo, hi = binomial_band(n_sim)
    for stat in ps.columns:
        assert stats.kstest(ps[stat], "uniform").pvalue > 0.01, stat
        assert lo <= int((ps[stat] < ALPHA).sum()) <= hi, (stat, int((ps[stat] < ALPHA).sum()))


def test_planted_effects_are_detected():
    """A gain of 0.01 over local-only and over FedAvg (per-client, per-objective accuracy noise 0.03), a within-cluster
    slope of 0.1 (noise 0.03, λ's within-cluster spread about 0.1) and an own-model advantage of 0.01: p < 0.05 in
    at least 85 % of 100 simulations of 8 seeds each (measured power: 98 %, 98 %, 97 %, 98 %; the cluster-level
    test, with nothing planted between clusters, 6 %)."""
    rng = np.random.default_rng(12)
    ps = pd.DataFrame([p_values(simulate(rng, gain_local=0.01, gain_fedavg=0.01, within=0.1, mates=0.01), seed=k)
                       for k in range(100)])
    for stat in ("gain_over_local", "gain_over_fedavg", "within_cluster_slope", "own_vs_mates"):
        assert (ps[stat] < ALPHA).mean() >= 0.85, (stat, (ps[stat] < ALPHA).mean())
    assert (ps["cluster_slope"] < ALPHA).mean() <= 0.15


def test_within_cluster_null_ignores_between_cluster_effects():
    """A pure between-cluster effect (margin change 1.0·Λ_c, the cluster's mean λ; nothing within): the cluster-level
    test detects it, the within-cluster test rejects no more than α (the 99 % binomial band over 200 data sets),
    while a flat permutation of λ across all clients of a seed, the study's null, would reject it almost always."""
    rng = np.random.default_rng(13)
    n_sim = 200
    sims = [simulate(rng, between=1.0, noise=0.03, cross=False) for _ in range(n_sim)]
    ps = pd.DataFrame([p_values(s, seed=k) for k, s in enumerate(sims)])
    lo, hi = binomial_band(n_sim)
    assert lo <= int((ps["within_cluster_slope"] < ALPHA).sum()) <= hi
    assert stats.kstest(ps["within_cluster_slope"], "uniform").pvalue > 0.01
    assert (ps["cluster_slope"] < ALPHA).mean() >= 0.9
    flat = []
    for s in sims[:40]:
        perm_rng = np.random.default_rng(0)
        observed = np.mean([fixed_effect_slope(sd.lam, sd.z[(1, sh.PRIMARY)]) for sd in s])
        draws = np.mean([fixed_effect_slope(sd.lam[perm_rng.permuted(np.tile(np.arange(len(sd.lam)), (499, 1)),
                                                                         axis=1)], sd.z[(1, sh.PRIMARY)])
                         for sd in s], axis=0)
        flat.append((1 + np.sum(draws >= observed)) / 500)
    assert np.mean(np.array(flat) < ALPHA) >= 0.9


def test_sign_flip_exact_by_hand():
    """Gains 0.01, 0.02, 0.03 over 3 seeds: the 8 sign flips put the observed mean alone at the top (p = 1/8,
    exact); the MDE is 2.486 · sqrt(Σ (d − d̄)²)/3."""
    rng = np.random.default_rng(0)
    seeds = simulate(rng, n_seeds=3, cross=False)
    for sd, gain in zip(seeds, (0.01, 0.02, 0.03), strict=True):
        sd.acc[(1, "pipeline1_wII")] = sd.acc[(1, "local")] + gain
    line = sh._analyse(seeds, [1], n_perm=999, seed=0, n_boot=20)["lines"][0]
    assert line["statistic"] == "gain_over_local" and line["exact"]
    assert line["estimate"] == pytest.approx(0.02, abs=1e-12)
    assert line["p_value"] == pytest.approx(1 / 8) and line["p_min"] == pytest.approx(1 / 8)
    assert line["mde"] == pytest.approx((stats.norm.ppf(0.95) + stats.norm.ppf(0.8)) * np.sqrt(2e-4) / 3)


# ---------------------------------------------------------------------------------------------- multiplicity


def test_holm_matches_a_hand_computation():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert sh.holm([0.01, 0.04, 0.03, 0.005]).tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert sh.holm([0.5, 0.9]).tolist() == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="1.5"):
        sh.holm([0.1, 1.5])


def test_report_adjusts_the_whole_family():
    """Two budgets × five tested statistics: p_holm is Holm over all ten lines, the verdicts use it, the table has
    w_I beside w_II at every budget, and the report is JSON-able."""
    rng = np.random.default_rng(3)
    seeds = simulate(rng, budgets=(1, 4), gain_local=0.03, within=0.5)
    report = sh.shots_report(to_records(seeds, (1, 4)), seeds=range(8), budgets=(4, 1), n_perm=999)
    json.dumps(report, allow_nan=False)
    lines = report["lines"]
    assert report["family_size"] == 10 and [line["budget"] for line in lines] == [1] * 5 + [4] * 5
    assert [line["p_holm"] for line in lines] == pytest.approx(sh.holm([line["p_value"] for line in lines]).tolist())
    for line in lines:
        assert line["verdict"] == verdict(line["p_holm"], line["interval"], line["mde"])
    # 8 seeds: the sign flips' smallest p 1/256 is below α/10 = 0.005 (no note; 2 seeds below get one)
    assert lines[0]["p_min"] == pytest.approx(1 / 256) and report["notes"] == []
    table = pd.DataFrame(report["table"])
    for b in (1, 4):
        got = set(table.loc[table["budget"] == b, "method"])
        assert {"pipeline1_wII", "pipeline1_wI", "pipeline2"} <= got
    row = table[(table["method"] == "pipeline1_wII") & (table["budget"] == 1)].iloc[0]
    hand = np.mean([np.sum(sd.lam * sd.acc[(1, "pipeline1_wII")], axis=1).mean() for sd in seeds])
    assert row["acc"] == pytest.approx(hand, abs=1e-12)
    assert row["ceiling_share"] == pytest.approx((hand - 0.5) / 0.25, abs=1e-12)
    text = sh.line_text(lines[3])
    assert "within-cluster" in text and "Holm p" in text and lines[3]["verdict"] in text
    assert "reported, not tested" in sh.line_text(report["descriptive"][1])


# ------------------------------------------------------------------------------------------- ψ and H.43


def test_psi_raise_flags_and_the_h43_check():
    """Two adaptations end with a larger ψ: one with α·L̂0·p₊²/p₋ = 0.1·2·4/0.5 = 1.6 (H.43's condition violated),
    one with 0.05·1·1/1 = 0.05 (held); both are listed and counted, and both clients stay in the statistics."""
    rng = np.random.default_rng(4)
    seeds = simulate(rng, n_seeds=2, cross=False)
    psi = {(0, 1, 1, "pipeline1_wII"): (0.267, 0.464, 0.1, 0.5, 2.0, 2.0),
           (1, 4, 1, "pipeline1_wI"): (0.3, 0.31, 0.05, 1.0, 1.0, 1.0)}
    report = sh.shots_report(to_records(seeds, (1,), psi=psi), seeds=[0, 1], budgets=[1], n_perm=99)
    ad = report["adaptation"]
    assert ad["n_adaptations"] == 2 * 9 * 2 and ad["n_psi_raised"] == 2
    first, second = ad["psi_raised"]
    assert (first["seed"], first["client"], first["budget"], first["method"]) == (0, 1, 1, "pipeline1_wII")
    assert (first["psi0"], first["psiK"]) == (0.267, 0.464)
    assert first["h43_ratio"] == pytest.approx(1.6) and first["h43_held"] is False
    assert (second["seed"], second["client"], second["method"]) == (1, 4, "pipeline1_wI")
    assert second["h43_ratio"] == pytest.approx(0.05) and second["h43_held"] is True
    assert ad["psi_raised_by_method_budget"] == {"pipeline1_wII": {"1": 1}, "pipeline1_wI": {"1": 1}}
    # the default rows: 0.1·1·4/0.5 = 0.8 held; the two above: one violated
    assert ad["h43"] == {"n_held": 35, "n_violated": 1, "ratio_max": pytest.approx(1.6), "n_violated_psi_raised": 1}
    assert sh.h43_ratio(0.25, 1.0, 0.5, 2.0) == pytest.approx(2.0)
    # 2 seeds: the sign flips' smallest p is 1/4, not below α/5
    assert report["notes"] and "gain_over_local, gain_over_fedavg" in report["notes"][0]
    line = report["lines"][0]
    hand = [np.sum(sd.lam * (sd.acc[(1, "pipeline1_wII")] - sd.acc[(1, "local")]), axis=1).mean() for sd in seeds]
    assert line["per_seed"] == pytest.approx(hand, abs=1e-12)  # every client, the flagged ones included


# ------------------------------------------------------------------------------------------------ bad input


@pytest.fixture(scope="module")
def good() -> sh.ShotsRecords:
    return to_records(simulate(np.random.default_rng(5), n_seeds=2, budgets=(1, 2)), (1, 2))


def _with(records: sh.ShotsRecords, **tables) -> sh.ShotsRecords:
    return sh.ShotsRecords(**{**records.__dict__, **tables})


def test_bad_input_names_the_value(good):
    run = dict(seeds=[0, 1], budgets=[1, 2], n_perm=99)
    sh.shots_report(good, **run)
    with pytest.raises(ValueError, match=r"shots_scores.csv: missing column\(s\) \['z'\]"):
        sh.shots_report(_with(good, scores=good.scores.drop(columns="z")), **run)
    scores = good.scores.copy()
    scores.loc[7, "acc"] = np.nan
    with pytest.raises(ValueError, match=r"column 'acc' has a non-finite value nan at row 7 \(seed 0"):
        sh.shots_report(_with(good, scores=scores), **run)
    scores = good.scores.copy()
    scores.loc[scores["method"] == "global", "method"] = "global_uniform"
    with pytest.raises(ValueError, match="unknown method 'global_uniform'"):
        sh.shots_report(_with(good, scores=scores), **run)
    adapt = good.adaptation.copy()
    adapt.loc[0, "method"] = "oracle"
    with pytest.raises(ValueError, match="method 'oracle' does not adapt"):
        sh.shots_report(_with(good, adaptation=adapt), **run)
    scores = good.scores[~((good.scores["budget"] == 2) & (good.scores["seed"] == 1))]
    with pytest.raises(ValueError, match=r"budget 2 is recorded for 1 seed \(\[0\]\)"):
        sh.shots_report(_with(good, scores=scores), **run)
    with pytest.raises(ValueError, match="budget 2 is not in the pre-registered budgets"):
        sh.shots_report(good, seeds=[0, 1], budgets=[1])
    with pytest.raises(ValueError, match=r"seeds \[0\]"):
        sh.shots_report(good, seeds=[0], budgets=[1, 2])
    scores = good.scores.drop(index=good.scores.index[(good.scores["method"] == "oracle")][:1])
    with pytest.raises(ValueError, match="no row for seed 0, budget 1, method 'oracle', client 0, objective 'o0'"):
        sh.shots_report(_with(good, scores=scores), **run)
    clients = good.clients.copy()
    clients.loc[0, "lam"] = 0.9
    with pytest.raises(ValueError, match="seed 0, client 0: lam .* does not sum to 1"):
        sh.shots_report(_with(good, clients=clients), **run)
    adapt = good.adaptation[good.adaptation["method"] != "pipeline1_wI"]
    with pytest.raises(ValueError, match="no row for seed 0, client 0, budget 1, method 'pipeline1_wI'"):
        sh.shots_report(_with(good, adaptation=adapt), **run)


# ------------------------------------------------------------------------------------------- files and figure


def test_records_from_run_directories_and_the_figure(tmp_path, good):
    dirs = []
    for s in (0, 1):
        d = tmp_path / f"seed-{s}"
        d.mkdir()
        for name, frame in ((sh.CLIENTS, good.clients), (sh.SCORES, good.scores), (sh.ADAPTATION, good.adaptation),
                            (sh.CROSS, good.cross)):
            assert frame is not None
            frame[frame["seed"] == s].to_csv(d / name, index=False)
        dirs.append(d)
    records = sh.read_records(dirs)
    report = sh.shots_report(records, seeds=[0, 1], budgets=[1, 2], n_perm=99)
    again = sh.shots_report(good, seeds=[0, 1], budgets=[1, 2], n_perm=99)
    assert report["lines"] == again["lines"] and report["plan"]["cross_scores"]
    png = sh.shots_figure(report, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    (dirs[1] / sh.CROSS).unlink()
    with pytest.raises(ValueError, match="written by 1 of 2 run directories"):
        sh.read_records(dirs)
    (dirs[1] / sh.SCORES).unlink()
    with pytest.raises(ValueError, match="seed-1/shots_scores.csv: missing"):
        sh.read_records(dirs)
