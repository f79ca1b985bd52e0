"""The calibration study of the Monte Carlo protocol (verification.engine.mc_calibration): exact rates against the
replications, a negative control, reproducibility, and the committed full-size result against the budget."""

from __future__ import annotations

import inspect
import json
import math
from collections import Counter

import numpy as np
import pytest

from verification.__main__ import build_parser, main
from verification.core import registry
from verification.core.montecarlo import ASSERTIONS, CAP_FACTOR, DELTA, FAMILY_WISE_BUDGET, protocol_lcbs
from verification.engine import mc_calibration as MC
from verification.engine.sweep import CP_ALPHA, clopper_pearson
from verification.statements.h17_near_aligned_regime import _k_crit


def _within(k: int, R: int, p: float, alpha: float = 1e-3) -> bool:
    """``p`` inside the two-sided ``1 - alpha`` Clopper–Pearson interval of ``k`` in ``R``."""
    lo, hi = clopper_pearson(k, R, alpha / 2)
    return lo <= p <= hi


def _sub(n: int, delta: float, b: float = 1.0, samples=None) -> MC.MeanSubtest:
    return MC.MeanSubtest("synthetic", b, CAP_FACTOR * b, delta, n, samples)


def test_exact_two_point_sum_agrees_with_the_replications():
    """Where the rate is measurable (N = 50, δ = 0.5: about 3 %), the binomial sum over the count of M's lies in
    the binomial interval of the replicated full samples, at both ends of the protocol's regime of N."""
    sub = _sub(50, 0.5, b=0.37)
    ex = MC.two_point_exact(sub)
    assert 0.01 < ex["exact"] < 0.1 and ex["failing_counts_contiguous"] and ex["omitted_mass"] < 1e-30
    R = 20_000
    k = MC.replicate_mean([sub], "two_point", R, np.random.default_rng(1))
    assert _within(k, R, ex["exact"])
    # a composite of two independent claims: 1 - (1 - p)^2
    k2 = MC.replicate_mean([sub, sub], "two_point", R, np.random.default_rng(2))
    assert _within(k2, R, 1 - (1 - ex["exact"]) ** 2)
    # at the suite's delta and a statement's N the protocol is far below delta; the count agrees too
    tight = MC.two_point_exact(_sub(963, DELTA, b=0.5))
    assert 0 < tight["exact"] < DELTA / 100
    assert _within(MC.replicate_mean([_sub(963, DELTA, b=0.5)], "two_point", 2000, np.random.default_rng(3)), 2000,
                   tight["exact"])


def test_order_statistic_replications_agree_with_the_beta_binomial_law():
    R = 20_000
    for side in ("below", "above"):
        k = MC.replicate_order_statistic(50, 40, 2, R, np.random.default_rng(4), side)
        assert _within(k, R, MC.order_statistic_exact(50, 40, 2))
    # the suite's critical value: P(K > k_crit) < delta
    kc = _k_crit(1000, 1000, DELTA)
    assert MC.order_statistic_exact(1000, 1000, kc) < DELTA <= MC.order_statistic_exact(1000, 1000, kc - 1)


def _synthetic_assertions(rng) -> list[MC.Assertion]:
    own = rng.exponential(0.2, 300)
    return [
        MC.Assertion("T.1", "mean claim", 0.5, "mean", (_sub(50, 0.5, samples=own[:50]),)),
        MC.Assertion("T.1", "composite", 0.5, "mean", (_sub(40, 0.25, samples=own[:40]), _sub(60, 0.25)),
                     (MC.ExactSubtest("F test", 0.01, "exact"),)),
        MC.Assertion("T.2", "order statistic", 0.2, "order_statistic", n_est=30, n_fresh=30, k_crit=2, side="above"),
    ]


def test_negative_control_an_invalid_bound_is_caught():
    """A lower confidence bound without its width (Hoeffding's Ȳ alone), or the protocol at 10⁴ δ, fails far more
    often than δ at the boundary: the calibration's lower bound exceeds δ and the family-wise status is not shown.
    (The protocol is conservative enough that at 100 δ its two-point rate, 8.9e-6, is still below δ.)"""
    a = MC.Assertion("T.3", "a tight instance", DELTA, "mean", (_sub(963, DELTA, samples=np.ones(963)),))
    for bad in (lambda y, M, d: y.mean(axis=-1), lambda y, M, d: protocol_lcbs(y, M, 1e4 * d)[2]):
        res = MC.calibrate([a], replications=3000, lcb=bad)
        row = res["rows"][0]
        assert row["lower"] > DELTA and row["families"]["two_point"]["exact"] > DELTA
        assert res["family_wise"]["status"] == "not shown"
    good = MC.calibrate([a], replications=3000)["rows"][0]
    assert good["families"]["two_point"]["failures"] == 0 and good["exact"] < DELTA / 100
    # an order-statistic test with a critical value too small for its delta
    k = MC.replicate_order_statistic(1000, 1000, 2, 3000, np.random.default_rng(5))
    assert clopper_pearson(k, 3000, CP_ALPHA)[0] > DELTA


def test_same_seed_same_numbers():
    A = _synthetic_assertions(np.random.default_rng(6))
    first = MC.calibrate(A, replications=400, seed=3)
    again = MC.calibrate(A, replications=400, seed=3)
    other = MC.calibrate(A, replications=400, seed=4)

    def strip(res):  # everything but the timings
        return json.dumps([{k: v for k, v in r.items() if k != "cpu_seconds"} for r in res["rows"]], sort_keys=True)

    assert strip(first) == strip(again) and first["family_wise"] == again["family_wise"]
    assert strip(first) != strip(other)


def test_boundary_scale_puts_the_capped_mean_at_the_bound():
    rng = np.random.default_rng(8)
    for x, b in ((rng.exponential(1.0, 4000), 0.01), (rng.chisquare(1, 963), 3.0), (rng.pareto(1.2, 500), 1.0)):
        s = MC.boundary_scale(x, b, CAP_FACTOR * b)
        m = np.minimum(s * x, CAP_FACTOR * b).mean()
        assert b <= m <= b * (1 + 1e-12)
    mostly_zero = np.r_[np.zeros(90), np.ones(10)]  # M P(x > 0) = 5 b · 0.1 < b
    assert MC.boundary_scale(mostly_zero, 1.0, CAP_FACTOR) is None


def test_cli_usage_errors_exit_2(capsys):
    for argv in (["--replications", "0"], ["--os-replications", "-3"], ["--seed", "x"]):
        assert main(["mc-calibration", *argv]) == 2, argv
        assert "python -m verification mc-calibration: error: argument " in capsys.readouterr().err


def test_cli_small_run_maps_every_budgeted_assertion(tmp_path, capsys):
    """The default run of every budgeted statement is read (its own samples) and each budgeted assertion gets a
    row; with 30 replications nothing is shown (exit 1), and the JSON is written."""
    out = tmp_path / "cal.json"
    rc = main(["mc-calibration", "--replications", "30", "--os-replications", "30", "--json", str(out)])
    res = json.loads(out.read_text())
    assert rc == 1 and res["family_wise"]["status"] == "not shown"
    assert Counter(r["statement"] for r in res["rows"]) == Counter(ASSERTIONS)
    assert all("skipped" not in d for r in res["rows"] for d in r["families"].values())
    assert "family-wise (24 assertions)" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ the committed file


@pytest.fixture(scope="module")
def committed():
    return MC.load_calibration()


def test_committed_file_has_a_row_for_every_budgeted_assertion(committed):
    assert Counter(r["statement"] for r in committed["rows"]) == Counter(ASSERTIONS)
    assert committed["family_wise"]["assertions"] == sum(ASSERTIONS.values())
    assert committed["delta"] == DELTA and committed["family_wise_budget"] == FAMILY_WISE_BUDGET
    assert all(r["delta"] == DELTA for r in committed["rows"])
    assert committed["replications"] >= 100_000 and committed["order_statistic_replications"] >= 100_000
    assert committed["seed"] == MC.DEFAULT_SEED
    for r in committed["rows"]:
        fams = [d for d in r["families"].values() if "failures" in d]
        if r["kind"] == "mean":
            assert set(r["families"]) == set(MC.FAMILIES) and len(fams) == 2
            assert sum(s["delta"] for s in r["families"]["two_point"]["subtests"]) + sum(
                e["delta"] for e in r["exact_subtests"]) <= r["delta"] * (1 + 1e-9)
        else:
            assert r["k_crit"] == _k_crit(r["n_fresh"], r["n_est"], r["delta"])
            assert r["exact"] == pytest.approx(MC.order_statistic_exact(r["n_est"], r["n_fresh"], r["k_crit"]),
                                               rel=1e-12)
        for d in fams:  # the bounds are those of the counts
            lo, hi = clopper_pearson(d["failures"], d["replications"], CP_ALPHA)
            assert (d["cp_lower"], d["cp_upper"]) == (lo, hi) and d.get("agrees_with_exact", True)
        assert r["upper"] == max(d["cp_upper"] for d in fams) + r["exact_part"]
        R = committed["replications"] if r["kind"] == "mean" else committed["order_statistic_replications"]
        if r["exact_part"] > 0:  # the replicated part of a composite has delta - exact_part of its delta
            R = math.ceil(R * r["delta"] / (r["delta"] - r["exact_part"]))
        assert all(d["replications"] == R for d in fams)


def test_the_defaults_are_the_committed_files_parameters(committed):
    """``mc-calibration`` without options reproduces the committed file: its replications (mean claims and
    order-statistic tests) and seed are the command line's and the library's defaults, and the file records
    them."""
    args = build_parser().parse_args(["mc-calibration"])
    assert (args.replications, args.seed) == (committed["replications"], committed["seed"])
    assert args.os_replications is None  # the default that goes with --replications:
    assert MC.default_order_statistic_replications(args.replications) == committed["order_statistic_replications"]
    sig = inspect.signature(MC.run_calibration).parameters
    assert sig["replications"].default == committed["replications"] and sig["seed"].default == committed["seed"]
    assert committed["statement_seed"] == registry.DEFAULT_SEED


def test_committed_family_wise_status(committed):
    fw = committed["family_wise"]
    assert fw["upper_sum"] == pytest.approx(sum(r["upper"] for r in committed["rows"]), rel=1e-12)
    assert fw["status"] == ("shown <= 1e-3" if fw["upper_sum"] <= FAMILY_WISE_BUDGET else "not shown")
    assert fw["status"] == "shown <= 1e-3" and fw["replications_agree_with_exact"]
    assert all(r["upper_within_delta"] for r in committed["rows"])  # every assertion within its own delta too
    assert fw["lower_sum"] <= fw["exact_sum"] <= fw["upper_sum"]
    rt = committed["runtime"]
    assert rt["cpu_seconds"] > 0 and rt["cpu_model"]
