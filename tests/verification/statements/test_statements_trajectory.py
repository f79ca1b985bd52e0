"""Executable statements of the shared-iteration part of Appendix H: H.25, H.28, H.29, H.31, Cor-C, H.32, H.37
(docs/spec/statements.md#catalogue, docs/spec/statements.md#t-h25, docs/spec/statements.md#t-h28,
docs/spec/statements.md#t-h29, docs/spec/statements.md#t-h31, docs/spec/statements.md#t-cor-c,
docs/spec/statements.md#t-h32, docs/spec/statements.md#t-h37).

Each statement runs with its default ``Config`` and seed ``registry.DEFAULT_SEED`` through
:func:`verification.core.registry.run_statement` (check + negative control). Every verdict must be ``"holds"`` and every
negative control ``"detected"`` (the broken hypothesis is flagged and the conclusion fails on a flagged instance;
for the trajectory statements both control families — F4 double well and F5 kink, or the two H.32 controls — must
show the failure). H.28, H.29, H.31 and Cor-C share their runs (memoised on the generator state), so running them
in one process costs about one of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from verification.core import registry
from verification.statements import h32_two_phase_band as H32

IDS = ("H.25", "H.28", "H.29", "H.31", "CorC", "H.32", "H.37")


@pytest.mark.parametrize("stmt_id", IDS)
def test_trajectory_statement(stmt_id, default_run):
    ev = default_run(stmt_id)
    assert ev.id == stmt_id
    assert ev.verdict == "holds", (ev.verdict, ev.counterexamples[:2])
    assert ev.negative_control == "detected", ev.control.to_record() if ev.control else None
    assert ev.instances > ev.excluded  # never vacuous
    assert ev.n_counterexamples == 0
    assert ev.tightness is not None and np.isfinite(ev.tightness) and ev.tightness <= 1.0 + 1e-9
    checks = ev.details["checks"]
    assert all(c["violated"] == 0 for c in checks.values()), checks
    # every conclusion is evaluated somewhere (a constant set may leave a check empty: its hypotheses are monitored)
    assert all(c.instances > c.excluded for c in ev.conclusions), [(c.name, c.instances) for c in ev.conclusions]
    if stmt_id in ("H.28", "H.29", "H.31", "CorC", "H.37"):  # constants not fitted on the checked iterates
        labels = " ".join(checks)
        assert "held-out run" in labels and "region sample, eta c_d <= 1/2" in labels
    if stmt_id == "H.29":
        fig = ev.details["figure_data"]
        assert set(fig["band"]) == {"t", "client", "r", "bound", "band", "constants"}
        r, bound = np.asarray(fig["band"]["r"]), np.asarray(fig["band"]["bound"])
        assert np.all(r <= bound * (1 + 1e-9) + 1e-12)  # the drawn bound holds on the drawn run
        assert set(fig["nesting"]) == {"t", "client", "psi_increase", "slack"}
        assert set(ev.control.details["figure_data"]["double_well"]) >= {"t", "r", "band"}
        assert all(len(v) <= 2000 for tab in fig.values() for v in tab.values())


def test_double_well_control_numbers(default_run):
    """T-H31(e): the double well is stuck at the spurious minimum (r_T ≈ 0.4998) against a band of a few
    hundredths, with c_d ≈ 6.21 estimated on the left well (docs/spec/observations.md#obs-14)."""
    ev = default_run("H.31")
    dw = [c for c in ev.control.details["controls"] if c["family"] == "F4 double well"]
    assert len(dw) == 2
    for c in dw:
        assert abs(c["final_gap"] - 0.4998) < 1e-3
        assert abs(c["c_d"] - 6.21) < 0.01
        assert c["eps0"] < 0.07
        assert c["iterates_outside_region"] == c["iterates"]


def test_h32_isotropic_point_leaves_only_the_band_factor():
    """H.32 with H.31 item 3 at the designed point (Q_j = I, nearly common centres, hence nearly uniform lambda_i):
    the quadratic-growth link is then nearly exact and item 3 loses only the band factor of eq 75 at w_II; a halved
    bound of item 3 is detected there."""
    cfg = H32.isotropic_config()
    assert (cfg.kappa_Q, cfg.s_c) == (1.0, 0.01)
    ev = H32.run(cfg, np.random.default_rng(registry.DEFAULT_SEED))
    assert ev.verdict == "holds" and ev.n_counterexamples == 0
    item3, band = ev.conclusion("H.31 item 3 with eps_hat at w_II"), ev.conclusion("eq 75 at w_II")
    assert 0.9 < item3.detect_factor <= band.detect_factor <= 1.0
    assert item3.detect_factor / band.detect_factor > 0.9  # the QG link alone
    assert item3.power()["status"] == "detected"
    mu = np.asarray(item3.worst["mu"])
    assert np.all(mu > 0.45)  # mu_i = min_j lambda_ij with lambda_i nearly (1/2, 1/2)


def test_h32_isotropic_point_joins_the_tight_points_with_the_box():
    """ISOTROPIC_POINT names kappa_Q and s_c: it is a tight point exactly when the search box carries them, and the
    box's Config then has the point's values (a point is never run with a parameter silently dropped)."""
    names = {p.name for p in H32.SEARCH.params}
    if {"kappa_Q", "s_c"} <= names:
        assert H32.ISOTROPIC_POINT in H32.TIGHT_POINTS
        cfg = H32.SEARCH.config(dict(H32.ISOTROPIC_POINT))
        assert (cfg.kappa_Q, cfg.s_c) == (1.0, 0.01)
    else:
        assert H32.ISOTROPIC_POINT not in H32.TIGHT_POINTS
    for p in H32.TIGHT_POINTS:
        assert set(p) <= names, p
