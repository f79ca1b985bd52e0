"""Tests of verification.llm.personalisation (the pre-registered personalisation analysis) on synthetic run
directories written in tmp_path: planted effects, nulls, the objective fixed effects, the bootstrap, the matrix
shares on a hand-made example, and bad inputs. No model runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from verification.llm import personalisation as lp

PERS = "pipeline1_wII"


def write_run(path: Path, lam, z_of, *, n_prompts: int = 6, pairs_per_prompt: int = 2, noise: float = 1.0,
              rng: np.random.Generator | None = None, comparators: bool = True, base_margin=None,
              generations=None, clusters=None) -> Path:
    """A run directory: ``lam`` (n, m) the new clients' λ; ``z_of(kind, i)`` the true mean change (m,) of model
    ``kind`` (``pers``/``local``/``fedavg``/``global``) of client (or cluster) i; per-pair noise ``noise``;
    ``generations(i)``: the true reward change (m,) of client i's personalised model (None: no generations)."""
    rng = rng or np.random.default_rng(0)
    lam = np.asarray(lam, dtype=np.float64)
    n, m = lam.shape
    objectives = [f"o{j}" for j in range(m)]
    clusters = list(clusters) if clusters is not None else [i % 2 for i in range(n)]
    models = [("w_ref", -1, -1, None)] + [(PERS, clusters[i], i, ("pers", i)) for i in range(n)]
    if comparators:
        models += [("local_only", clusters[i], i, ("local", i)) for i in range(n)]
        models += [("w_fedavg", c, -1, ("fedavg", c)) for c in sorted(set(clusters))]
        models += [("global_uniform", -1, -1, ("global", 0))]
    n_pairs = n_prompts * pairs_per_prompt
    base = np.zeros((m, n_pairs)) if base_margin is None else np.asarray(base_margin, dtype=np.float64)
    rows = []
    for label, cluster, client, kind in models:
        mean = np.zeros(m) if kind is None else np.asarray(z_of(*kind), dtype=np.float64)
        for j, obj in enumerate(objectives):
            eps = np.zeros(n_pairs) if kind is None else noise * rng.standard_normal(n_pairs)
            for p in range(n_pairs):
                rows.append({"model": label, "cluster": cluster, "client": client, "objective": obj, "pair": p,
                             "prompt_id": f"q{p // pairs_per_prompt}", "margin": base[j, p] + mean[j] + eps[p],
                             "loss": 0.7})
    path.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path / "heldout_margins.csv", index=False)
    personalisation = {
        "file": "heldout_margins.csv", "beta": 0.1, "objectives": objectives, "personalised_model": PERS,
        "new_clients": [{"client": i, "prefs": list(lam[i]), "cluster": clusters[i]} for i in range(n)],
        "models": [{"label": lab, "cluster": c, "client": k} for lab, c, k, _ in models],
        "heldout": {"pairs_per_objective": n_pairs, "prompts": [f"q{q}" for q in range(n_prompts)]},
        "generation_models": ["w_ref", PERS] if generations is not None else [],
        "hcn_at_w_ref": {},
    }
    (path / "summary.json").write_text(json.dumps({"status": "ok", "personalisation": personalisation}))
    if generations is not None:
        gen = []
        base_r = rng.standard_normal((n_prompts * 2, m))
        for label, clients, shift in [("w_ref", " ".join(map(str, range(n))), None)] + \
                [(PERS, str(i), i) for i in range(n)]:
            delta = np.zeros(m) if shift is None else np.asarray(generations(shift))
            eps = np.zeros((n_prompts * 2, m)) if shift is None else noise * rng.standard_normal((n_prompts * 2, m))
            for r in range(n_prompts * 2):
                gen.append({"model": label, "cluster": -1, "clients": clients, "prompt_id": f"g{r // 2}",
                            "sample": r % 2, "n_tokens": 10, "finished": True, "cut_off": "eos",
                            **{f"reward_{o}": base_r[r, j] + delta[j] + eps[r, j] for j, o in enumerate(objectives)},
                            "text": "some, text"})
        pd.DataFrame(gen).to_csv(path / "generations.csv", index=False)
    return path


def planted(rng, alpha, slope, lam, other=0.0):
    """z_of for a planted effect: own models α + slope·λ_i, every other model ``other``."""

    def z_of(kind, i):
        if kind == "pers":
            return alpha + slope * lam[i]
        return alpha + other

    return z_of


def synthetic_seeds(tmp_path, n_seeds, *, n=8, m=3, slope=0.0, gen_slope=None, noise=1.0, n_prompts=6,
                    pairs_per_prompt=2, seed=0, comparators=True):
    rng = np.random.default_rng(seed)
    dirs = []
    for s in range(n_seeds):
        lam = rng.dirichlet(np.ones(m), size=n)
        alpha = rng.normal(0, 3, size=m)
        gen = None if gen_slope is None else (lambda i, lam=lam: gen_slope * lam[i])
        dirs.append(write_run(tmp_path / f"seed{s}", lam, planted(rng, alpha, slope, lam), noise=noise, rng=rng,
                              n_prompts=n_prompts, pairs_per_prompt=pairs_per_prompt, generations=gen,
                              comparators=comparators))
    return dirs


def by_stat(result):
    return {line["statistic"]: line for line in result["lines"]}


# ------------------------------------------------------------------------------------------------- verdicts


def test_verdict_rule():
    assert lp.verdict(0.01, [0.1, 0.5], 0.2) == "supported"
    assert lp.verdict(0.3, [-0.1, 0.1], 0.2) == "not supported"
    assert lp.verdict(0.3, [-0.1, 0.3], 0.2) == "underpowered"
    assert lp.verdict(0.05, [-0.1, 0.1], 0.2) == "not supported"  # p = 0.05 is not below 0.05
    assert lp.verdict(0.3, [None, None], 0.2) == "underpowered"
    with pytest.raises(ValueError, match="p-value"):
        lp.verdict(float("nan"), [0, 1], 0.1)


def test_planted_effect_is_supported(tmp_path):
    dirs = synthetic_seeds(tmp_path, 3, slope=4.0, gen_slope=2.0, noise=1.0)
    result = lp.sweep_statistics(dirs, n_perm=999, n_boot=200)
    lines = by_stat(result)
    assert [line["statistic"] for line in result["lines"]] == list(lp.STATISTICS)
    for name in lp.STATISTICS:
        line = lines[name]
        assert line["verdict"] == "supported", (name, line)
        assert line["p_value"] < 0.01 and line["n_seeds"] == 3 and line["n_units"] == 24
        assert line["interval"][0] <= line["estimate"] <= line["interval"][1]
        assert line["mde"] > 0
    assert abs(lines["heldout_margin_slope"]["estimate"] - 4.0) < 1.0
    assert lines["matrix_own_row_share"]["null"] == pytest.approx(1 / 8)
    assert set(result["matrix"]) == set(lp.COMPARATORS)
    assert "supported" in result["text"] and "3 seeds" in result["text"]
    json.dumps(result, allow_nan=False)  # JSON-able, no NaN
    for line in result["lines"]:
        assert lp.line_text(line).endswith("(3 seeds, 24 models)")


def test_no_effect_with_large_n_is_not_supported(tmp_path):
    dirs = synthetic_seeds(tmp_path, 12, n=16, slope=0.0, gen_slope=0.0, noise=1.0, n_prompts=10, seed=1,
                           comparators=False)
    result = lp.sweep_statistics(dirs, n_perm=999, n_boot=50)
    for line in result["lines"]:
        assert line["verdict"] == "not supported", line
    line = by_stat(result)["heldout_margin_slope"]
    assert line["p_value"] >= 0.05 and line["interval"][1] < line["mde"]
    assert "not supported" in result["text"]
    for line in result["lines"]:  # every line follows the rule
        shifted = [line["interval"][0], line["interval"][1] - line["null"]]
        assert line["verdict"] == lp.verdict(line["p_value"], shifted, line["mde"])


def test_tiny_noisy_design_is_underpowered(tmp_path):
    dirs = synthetic_seeds(tmp_path, 2, n=3, slope=1.0, gen_slope=1.0, noise=3.0, n_prompts=2, pairs_per_prompt=1,
                           seed=1)
    result = lp.sweep_statistics(dirs, n_perm=999, n_boot=200)
    for line in result["lines"]:
        assert line["verdict"] == "underpowered", line
        assert line["p_value"] >= 0.05
    assert "underpowered" in result["text"]


def test_permutation_p_values_are_uniform_under_the_null(tmp_path):
    """Over 200 independent null data sets the rejection rate at 0.05 lies in a 99.9 % binomial band, and p is
    about uniform; under a planted effect the same test rejects almost always (the check can fail)."""
    rng = np.random.default_rng(11)
    p_null, p_effect = [], []
    for t in range(200):
        lam = rng.dirichlet(np.ones(3), size=8)
        alpha = rng.normal(0, 3, size=3)
        d = write_run(tmp_path / f"null{t}", lam, planted(rng, alpha, 0.0, lam), rng=rng, n_prompts=3,
                      comparators=False)
        p_null.append(by_stat(lp.sweep_statistics([d], n_perm=199, n_boot=1, seed=t))["heldout_margin_slope"]
                      ["p_value"])
        if t < 40:
            d = write_run(tmp_path / f"effect{t}", lam, planted(rng, alpha, 3.0, lam), rng=rng, n_prompts=3,
                          comparators=False)
            p_effect.append(by_stat(lp.sweep_statistics([d], n_perm=199, n_boot=1, seed=t))
                            ["heldout_margin_slope"]["p_value"])
    p_null = np.array(p_null)
    rejections = int(np.sum(p_null < 0.05))
    assert 2 <= rejections <= 21, rejections  # Binomial(200, 0.05): P(X ∉ [2, 21]) < 0.001
    assert 0.38 <= p_null.mean() <= 0.62  # mean of U(0, 1): 0.5 ± 0.02 sd
    assert 75 <= np.sum(p_null < 0.5) <= 125
    assert np.mean(np.array(p_effect) < 0.05) >= 0.8


def test_objective_fixed_effects_remove_an_objective_wide_shift(tmp_path):
    """λ and z both larger on objective 0 for every model: a pooled regression sees a strong slope, the
    fixed-effect slope is 0."""
    rng = np.random.default_rng(2)
    lam = np.column_stack([rng.uniform(0.6, 0.8, 8), np.zeros(8)])
    lam[:, 1] = rng.uniform(0, 1, 8) * (1 - lam[:, 0])
    lam = np.column_stack([lam, 1 - lam.sum(axis=1)])
    alpha = np.array([5.0, -1.0, 0.0])
    d = write_run(tmp_path / "shift", lam, planted(rng, alpha, 0.0, lam), noise=0.0, rng=rng)
    stats = lp.seed_statistics(d, n_boot=20)
    z = np.array([[row[f"o{j}"] for j in range(3)] for row in stats["z"] if row["model"] == PERS])
    assert np.polyfit(lam.ravel(), z.ravel(), 1)[0] > 5  # what pooling objectives would report
    assert abs(stats["b"]) < 1e-9
    assert stats["b_bootstrap_interval"] == [pytest.approx(0, abs=1e-9)] * 2


def test_paired_differences_cancel_the_pairs_shared_draw(tmp_path):
    """A per-pair offset shared by every model (the base model's draw) leaves every statistic unchanged."""
    rng = np.random.default_rng(4)
    lam = rng.dirichlet(np.ones(3), size=8)
    alpha = rng.normal(size=3)
    a = write_run(tmp_path / "a", lam, planted(rng, alpha, 1.0, lam), rng=np.random.default_rng(9))
    b = write_run(tmp_path / "b", lam, planted(rng, alpha, 1.0, lam), rng=np.random.default_rng(9),
                  base_margin=rng.normal(0, 10, size=(3, 12)))
    sa, sb = lp.seed_statistics(a, n_boot=50), lp.seed_statistics(b, n_boot=50)
    assert sb["b"] == pytest.approx(sa["b"], abs=1e-9)
    assert sb["b_bootstrap_interval"] == pytest.approx(sa["b_bootstrap_interval"], abs=1e-9)


def test_bootstrap_over_prompts_is_reproducible(tmp_path):
    (d,) = synthetic_seeds(tmp_path, 1, slope=1.0, gen_slope=1.0, noise=2.0)
    one, two = lp.seed_statistics(d, seed=3), lp.seed_statistics(d, seed=3)
    assert one == two
    other = lp.seed_statistics(d, seed=4)
    assert other["b"] == one["b"] and other["b_bootstrap_interval"] != one["b_bootstrap_interval"]
    lo, hi = one["b_bootstrap_interval"]
    assert lo < one["b"] < hi and one["n_boot"] == lp.N_BOOT
    assert one["generation"]["b_bootstrap_interval"][0] < one["generation"]["b"]
    # one seed: the sweep's interval is that seed's bootstrap interval
    sweep = lp.sweep_statistics([d], n_perm=99, seed=3)
    assert by_stat(sweep)["heldout_margin_slope"]["interval"] == one["b_bootstrap_interval"]
    assert sweep == lp.sweep_statistics([d], n_perm=99, seed=3)


def test_matrix_shares_on_a_hand_made_example(tmp_path):
    lam = np.array([[0.8, 0.2], [0.2, 0.8], [0.5, 0.5]])
    z = {("pers", 0): (2, 0), ("pers", 1): (0, 2), ("pers", 2): (1, 1),
         ("local", 0): (3, 0), ("local", 1): (0, 1), ("local", 2): (0, 0),
         ("fedavg", 0): (1, 1), ("fedavg", 1): (1, 1), ("global", 0): (1.5, 1.5)}
    d = write_run(tmp_path / "hand", lam, lambda kind, i: z[kind, i], noise=0.0, clusters=[0, 1, 0])
    shares = {k: v["share"] for k, v in lp.seed_statistics(d, n_boot=10)["matrix"].items()}
    # row 0: own 1.6 beats fedavg 1.0, base 0, global 1.5, the others 0.4/1.0; loses to local 2.4
    # row 1: own 1.6 beats everything; row 2: own 1.0 ties fedavg and the others, loses to global 1.5
    assert shares == pytest.approx({"fedavg": 2 / 3, "local_only": 2 / 3, "base": 1.0, "global_uniform": 2 / 3,
                                    "other_personalised": 2 / 3, "all": 1 / 3})


def test_missing_comparators_are_not_recorded(tmp_path):
    (d,) = synthetic_seeds(tmp_path, 1, comparators=False)
    stats = lp.seed_statistics(d, n_boot=10)
    assert stats["matrix"]["fedavg"] is None and stats["matrix"]["global_uniform"] is None
    assert stats["matrix"]["base"] is not None and stats["generation"] is None
    assert any("fedavg" in note for note in stats["notes"])
    result = lp.sweep_statistics([d], n_perm=99, n_boot=10)
    assert by_stat(result)["generation_reward_slope"]["verdict"] == "not recorded"
    assert result["matrix"]["local_only"] is None


@pytest.mark.e2e
def test_the_module_imports_no_torch():
    code = ("import sys, verification.llm.personalisation; "
            "assert not any(m == 'torch' or m.startswith(('torch.', 'llm_runs')) for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


# ---------------------------------------------------------------------------------------------- bad inputs


@pytest.fixture
def run(tmp_path):
    (d,) = synthetic_seeds(tmp_path, 1, n=4, gen_slope=1.0, n_prompts=3)
    return d


def edit_csv(path, fn):
    frame = pd.read_csv(path, dtype={"clients": str})
    fn(frame).to_csv(path, index=False)


def edit_summary(path, fn):
    summary = json.loads((path / "summary.json").read_text())
    fn(summary["personalisation"])
    (path / "summary.json").write_text(json.dumps(summary))


def test_bad_summary(run, tmp_path):
    with pytest.raises(ValueError, match="not a run directory"):
        lp.seed_statistics(tmp_path / "nowhere")
    (run / "summary.json").write_text("{")
    with pytest.raises(ValueError, match="summary.json: not valid JSON"):
        lp.seed_statistics(run)
    (run / "summary.json").write_text(json.dumps({"status": "ok"}))
    with pytest.raises(ValueError, match="no 'personalisation'"):
        lp.seed_statistics(run)
    (run / "summary.json").unlink()
    with pytest.raises(ValueError, match="summary.json: missing"):
        lp.seed_statistics(run)


@pytest.mark.parametrize("edit, match", [
    (lambda p: p["new_clients"][0].update(prefs=[0.5, 0.5, 0.5]), "client 0: prefs .* summing to 1"),
    (lambda p: p["new_clients"][0].update(prefs=[1.0]), "client 0: prefs"),
    (lambda p: p["new_clients"][1].update(client=0), "repeats a client"),
    (lambda p: p["new_clients"][0].pop("cluster"), "needs an int 'client', 'cluster'"),
    (lambda p: [c.update(prefs=[1 / 3] * 3) for c in p["new_clients"]], "same prefs"),
    (lambda p: p.update(new_clients=p["new_clients"][:1]), "at least 2 new clients"),
    (lambda p: p.update(objectives=["o0", "o0", "o2"]), "distinct names"),
    (lambda p: p["models"].append({"label": "w_II", "cluster": 0, "client": -1}), "no rows of model .*w_II"),
    (lambda p: p["heldout"].update(prompts=["q0"]), "prompt_id 'q1' is not in"),
])
def test_bad_personalisation_entries(run, edit, match):
    edit_summary(run, edit)
    with pytest.raises(ValueError, match=match):
        lp.seed_statistics(run)


@pytest.mark.parametrize("edit, match", [
    (lambda f: f.drop(columns="margin"), r"heldout_margins.csv: missing column\(s\) \['margin'\]"),
    (lambda f: f.assign(margin=f["margin"].where(f.index != 30, np.nan)), "column 'margin' has a non-finite"),
    (lambda f: f.assign(pair=f["pair"].where(f.index != 30, 1.5)), "column 'pair' has a non-integer"),
    (lambda f: f.drop(index=40), r"lacks \(objective 'o0', pair 4\)"),
    (lambda f: f[f["model"] != "w_ref"], "no 'w_ref' rows"),
    (lambda f: f.assign(objective=f["objective"].where(f.index != 30, "o9")), "'o9', not one of"),
    (lambda f: pd.concat([f, f.iloc[[30]]]), "repeats"),
    (lambda f: f.assign(prompt_id=f["prompt_id"].where(f.index != 30, "q2")), "has prompt_id 'q2'"),
    (lambda f: f[~((f["model"] == "local_only") & (f["client"] == 2))], "local_only' for new client 2"),
    (lambda f: f[f["model"] != PERS], "no rows of model 'pipeline1_wII'"),
])
def test_bad_margins(run, edit, match):
    edit_summary(run, lambda p: p.update(models=[]))
    edit_csv(run / "heldout_margins.csv", edit)
    with pytest.raises(ValueError, match=match):
        lp.seed_statistics(run)


@pytest.mark.parametrize("edit, match", [
    (lambda f: f.drop(columns="reward_o1"), r"missing column\(s\) \['reward_o1'\]"),
    (lambda f: f.drop(index=len(f) - 1), "lacks \\(prompt_id 'g2', sample 1\\) of 'w_ref'"),
    (lambda f: f.assign(clients=f["clients"].where(f["model"] != PERS, "0 1")), "has clients '0 1'"),
    (lambda f: f.assign(reward_o0=f["reward_o0"].where(f.index != 3, np.inf)), "'reward_o0' has a non-finite"),
    (lambda f: f[f["model"] != "w_ref"], "generations.csv: column 'model' has no 'w_ref'"),
])
def test_bad_generations(run, edit, match):
    edit_csv(run / "generations.csv", edit)
    with pytest.raises(ValueError, match=match):
        lp.seed_statistics(run)


def test_listed_generations_must_exist(run):
    (run / "generations.csv").unlink()
    with pytest.raises(ValueError, match="generations.csv: missing"):
        lp.seed_statistics(run)


def test_bad_sweep_arguments(run):
    with pytest.raises(ValueError, match="no run directories"):
        lp.sweep_statistics([])
    with pytest.raises(ValueError, match="listed twice"):
        lp.sweep_statistics([run, run])
    with pytest.raises(ValueError, match="n_perm"):
        lp.sweep_statistics([run], n_perm=0)
