"""The EPO direction LP: batched exact solver against the HiGHS oracle, LP properties, statuses, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from error_patterns import float_value, names
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.direction import LPInfeasibleError, lp_direction, lp_direction_reference
from sim.preference import uniformity_and_adjustment
from sim.problems.generic import lp_instance_family, random_lp_instances

FAMILIES = ("gaussian", "conflicting", "near_stationary", "rank_deficient")
LP_TOL = 1e-9  # THEOREMS.md §3.0: LP and active sets


def _objective_scale(res, gram):
    """``‖c‖_∞`` of the LP objective (``CA`` in balance mode, ``C1`` in descent mode)."""
    CA = np.einsum("...ij,...j->...i", gram, res.adjustment)
    c = np.where((res.mode == "balance")[..., None], CA, gram.sum(axis=-1))
    return np.abs(c).max(axis=-1)


def _compare(res, ref, gram):
    """Same status; optimal values within 1e-9·max(1,|v|); constraint violation <= 1e-10.

    Values are compared on the unit-scale objective ``c/‖c‖_∞`` (the LP is unchanged by scaling ``c``; the
    ``max(1, |v|)`` floor presumes unit-scale data). Feasibility is relative to each row's max-norm.
    """
    np.testing.assert_array_equal(res.status, ref.status)
    np.testing.assert_array_equal(res.mode, ref.mode)
    solved = np.isin(ref.status, ("optimal", "relaxed"))
    scale = np.maximum(_objective_scale(res, gram)[solved], 1e-300)
    v, v_ref = res.objective[solved] / scale, ref.objective[solved] / scale
    err = np.abs(v - v_ref) / np.maximum(1.0, np.abs(v_ref))
    assert err.max(initial=0.0) <= 1e-9, f"objective mismatch {err.max():.3e}"
    assert res.feasibility_residual[solved].max(initial=0.0) <= 1e-10
    assert res.kkt_residual[solved].max(initial=0.0) <= 1e-9
    # the gain γ* = μᵀCA is an explicit function of μ: equal optimal values in balance mode give equal gains
    bal = solved & (res.mode == "balance")
    np.testing.assert_allclose(res.gain[bal], ref.gain[bal], rtol=1e-9, atol=1e-9 * np.abs(ref.gain[bal]).max(initial=1))


@pytest.mark.parametrize("m", [2, 3, 5, 8])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("eps_mode", [1e-4, 0.05])
def test_batched_solver_matches_highs(family, m, eps_mode):
    rng = np.random.default_rng([m, FAMILIES.index(family), int(eps_mode * 1e4)])
    losses, prefs, _, gram = lp_instance_family(family, rng, 120, m)
    res = lp_direction(losses, prefs, gram, eps_mode=eps_mode)
    ref = lp_direction_reference(losses, prefs, gram, eps_mode=eps_mode)
    _compare(res, ref, gram)


@pytest.mark.parametrize("descent", ["restricted", "relaxed"])
def test_descent_variants_match_highs(descent):
    rng = np.random.default_rng(42)
    losses, prefs, _, gram = _f6(rng, 400)
    for policy in ("relaxed", "fallback_preference"):
        res = lp_direction(losses, prefs, gram, eps_mode=10.0, descent=descent, on_infeasible=policy)
        ref = lp_direction_reference(losses, prefs, gram, eps_mode=10.0, descent=descent, on_infeasible=policy)
        assert np.all(res.mode == "descent")  # eps_mode = 10 > log m
        _compare(res, ref, gram)


def _f6(rng, n, m=None, n_w=None):
    """F6 instances with a fixed m (the LP batch needs one m), returned as (losses, prefs, grads, gram)."""
    inst = random_lp_instances(rng, n, m=m if m is not None else 4, n_w=n_w)
    return inst.losses, inst.prefs, inst.grads, inst.gram


# ------------------------------------------------------------------------------------ LP properties (§1.5)


@pytest.mark.parametrize("m", [2, 3, 4, 6])
def test_lp_properties_on_random_instances(m):
    """(P-a), (P-b), (P-d), feasibility of the balancing and relaxed LPs, and I4 on thousands of instances."""
    rng = np.random.default_rng(100 + m)
    losses, prefs, G, C = _f6(rng, 1500, m)
    for eps_mode in (1e-4, 10.0):  # 10 > log m: every instance in descent mode
        res = lp_direction(losses, prefs, C, eps_mode=eps_mode)
        assert not np.any(res.status == "infeasible")
        d = res.direction(G)
        dg = np.einsum("nw,nwm->nm", d, G)  # dᵀg_j = (Cμ)_j
        tol = LP_TOL * np.maximum(1.0, np.abs(C).max(axis=(1, 2)))[:, None]
        bal = res.mode == "balance"
        CA = np.einsum("nij,nj->ni", C, res.adjustment)
        # (P-a) balancing: dᵀg_j >= 0 on J*, >= (CA)_j on J̄ ∖ J* (only when J ≠ ∅)
        anyJ = res.J.any(axis=1)
        assert np.all(np.where(bal[:, None] & res.J_star, dg >= -tol, True))
        on_Jbar = bal[:, None] & anyJ[:, None] & ~res.J & ~res.J_star
        assert np.all(np.where(on_Jbar, dg >= CA - tol, True))
        assert np.all(np.where(bal[:, None] & ~anyJ[:, None], dg >= -tol, True))
        # (P-b) descent: dᵀg_j >= 0 for all j
        assert np.all(np.where(~bal[:, None], dg >= -tol, True))
        # (P-d) ‖d‖ <= max_j ‖g_j‖
        gmax = np.linalg.norm(G, axis=1).max(axis=1)
        assert np.all(np.linalg.norm(d, axis=1) <= gmax * (1 + 1e-12))
        # γ* = μᵀCA explicitly, in both modes: equal up to the rounding of the two sums, which a backend may add
        # in another order (|Δ| <= 2m·ε·Σ_j μ_j (|CA_j| + Σ_k |C_jk||a_k|), the error bound of the dot products)
        gain = np.einsum("nm,nm->n", res.weights, CA)
        sums = np.abs(CA) + np.einsum("njk,nk->nj", np.abs(C), np.abs(res.adjustment))
        bound = 2 * m * np.finfo(float).eps * np.einsum("nm,nm->n", res.weights, sums)
        assert np.all(np.abs(res.gain - gain) <= bound)


def test_recorded_frequencies_gamma_nonpositive_and_restricted_infeasible():
    """P-c: γ* <= 0 happens in balancing mode; the restricted descent LP is sometimes infeasible.

    Both frequencies are recorded and asserted non-zero with a fixed seed (THEOREMS.md §1.5 and §6 saw
    523/2991 and 111/4776).
    """
    rng = np.random.default_rng(2024)
    counts = {"balance": 0, "gain<=0": 0, "descent": 0, "restricted infeasible": 0}
    for m in (2, 3, 4, 5, 6):
        losses, prefs, _, C = _f6(rng, 1000, m)
        res = lp_direction(losses, prefs, C, eps_mode=1e-4)
        bal = res.mode == "balance"
        counts["balance"] += int(bal.sum())
        counts["gain<=0"] += int((res.gain[bal] <= 0).sum())
        dom = lp_direction(losses, prefs, C, eps_mode=10.0)  # all in descent mode
        counts["descent"] += len(losses)
        counts["restricted infeasible"] += dom.status_counts()["relaxed"]
    assert counts["gain<=0"] > 0, counts
    assert counts["restricted infeasible"] > 0, counts


def test_balancing_step_decreases_beta_when_gain_positive():
    """I4: d/ds β(l(w - s d)) = -γ*/Z, so a tiny step decreases β whenever γ* > 0 (quadratic losses)."""
    rng = np.random.default_rng(77)
    m, n_w = 3, 5
    for _ in range(200):
        Q = [np.diag(rng.uniform(0.5, 2, n_w)) for _ in range(m)]
        c = rng.normal(size=(m, n_w))
        b = rng.uniform(0.2, 0.7, m)
        w = rng.normal(size=n_w)

        def loss(x, c=c, Q=Q, b=b):
            return np.array([0.5 * (x - c[j]) @ Q[j] @ (x - c[j]) + b[j] for j in range(m)])

        G = np.stack([Q[j] @ (w - c[j]) for j in range(m)], axis=1)
        lam = 0.9 * rng.dirichlet(np.ones(m)) + 0.1 / m
        res = lp_direction(loss(w), lam, G.T @ G)
        if res.mode != "balance" or res.gain <= 1e-12:
            continue
        d = res.direction(G)
        s = 1e-7
        beta0 = uniformity_and_adjustment(loss(w), lam)[0]
        beta1 = uniformity_and_adjustment(loss(w - s * d), lam)[0]
        assert beta1 < beta0


# ------------------------------------------------------------------------------------------- metamorphic


def test_permuting_objectives_permutes_outputs():
    rng = np.random.default_rng(5)
    losses, prefs, _, C = _f6(rng, 300, 4, n_w=6)
    perm = rng.permutation(4)
    res = lp_direction(losses, prefs, C)
    rp = lp_direction(losses[:, perm], prefs[:, perm], C[:, perm][:, :, perm])
    np.testing.assert_array_equal(rp.status, res.status)
    np.testing.assert_array_equal(rp.mode, res.mode)
    np.testing.assert_allclose(rp.objective, res.objective, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rp.adjustment, res.adjustment[:, perm], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(rp.J_star, res.J_star[:, perm])
    np.testing.assert_allclose(rp.weights, res.weights[:, perm], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("s", [1e-3, 0.37, 12.0, 1e3])
def test_scaling_losses_and_gram(s):
    """Scaling l leaves β, A unchanged; scaling C leaves μ unchanged.

    n_w = 6 > m makes C non-singular, so the LP optimum is unique (with rank-deficient C many μ give the same
    direction Gμ and the solver may return any of them).
    """
    rng = np.random.default_rng(6)
    losses, prefs, _, C = _f6(rng, 300, 3, n_w=6)
    res = lp_direction(losses, prefs, C)
    r_l = lp_direction(s * losses, prefs, C)  # β and A are 0-homogeneous in l
    np.testing.assert_allclose(r_l.beta, res.beta, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(r_l.adjustment, res.adjustment, rtol=1e-10, atol=1e-14)
    r_C = lp_direction(losses, prefs, s * C)  # the LP's feasible set and argmax are invariant
    np.testing.assert_allclose(r_C.weights, res.weights, rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(r_C.status, res.status)


# --------------------------------------------------------------------------------------- statuses, policy


def _restricted_infeasible(rng):
    losses, prefs, G, C = _f6(rng, 600, 3)
    ref = lp_direction_reference(losses, prefs, C, eps_mode=10.0, on_infeasible="fallback_preference")
    idx = np.flatnonzero(ref.status == "fallback")
    assert idx.size > 0
    return losses[idx], prefs[idx], G[idx], C[idx]


def test_infeasible_policies_are_explicit():
    losses, prefs, _, C = _restricted_infeasible(np.random.default_rng(9))
    res = lp_direction(losses, prefs, C, eps_mode=10.0)
    assert np.all(res.status == "relaxed")
    assert res.status_counts()["relaxed"] == len(losses)
    assert np.all(res.feasibility_residual <= 1e-10)
    fb = lp_direction(losses, prefs, C, eps_mode=10.0, on_infeasible="fallback_preference")
    assert np.all(fb.status == "fallback")
    np.testing.assert_allclose(fb.weights, prefs)
    with pytest.raises(LPInfeasibleError, match="infeasible"):
        lp_direction(losses, prefs, C, eps_mode=10.0, on_infeasible="raise")
    # the same LPs are feasible once relaxed: the relaxed descent LP never needs a fallback
    rel = lp_direction(losses, prefs, C, eps_mode=10.0, descent="relaxed", on_infeasible="raise")
    assert np.all(rel.status == "optimal")


def test_iteration_limit_is_a_status_not_a_silent_result():
    rng = np.random.default_rng(10)
    losses, prefs, _, C = _f6(rng, 200, 5)
    res = lp_direction(losses, prefs, C, max_iter=1)
    hit = res.status == "iteration_limit"
    assert hit.any()
    assert np.all(np.isnan(res.weights[hit]))
    assert np.all(np.isfinite(res.weights[~hit]))


def test_single_instance_and_broadcasting():
    G = np.array([[1.0, 0.0], [0.0, 1.0]])
    res = lp_direction([1.0, 2.0], [0.5, 0.5], G.T @ G)
    assert res.weights.shape == (2,) and res.mode.shape == () and str(res.mode) == "balance"
    np.testing.assert_allclose(res.weights, [0.0, 1.0])
    rng = np.random.default_rng(1)
    losses = np.exp(rng.uniform(-1, 1, (7, 3)))
    C = np.eye(3)
    res = lp_direction(losses, np.full(3, 1 / 3), C)  # one λ and one C for a batch of loss vectors
    assert res.weights.shape == (7, 3)
    res2 = lp_direction(losses.reshape(7, 1, 3), np.full(3, 1 / 3), C)
    assert res2.weights.shape == (7, 1, 3)


def test_kink_example_direction():
    """F5 (example H.18(b)): at 0 < w, J = J* = {1} and d = a_1 - a_2 = ½ log((1+w)/(1-w)) (S21)."""
    for w in (1e-3, 0.05, 0.3):
        g = np.array([[1.0, -1.0]])  # n_w = 1, m = 2
        res = lp_direction([1 + w, 1 - w], [0.5, 0.5], g.T @ g, eps_mode=0.0)
        d = res.direction(g)[0]
        assert res.J.tolist() == [True, False] and res.J_star.tolist() == [True, False]
        assert d == pytest.approx(0.5 * np.log((1 + w) / (1 - w)), rel=1e-12)


# --------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(prefs=[0.5, 0.75]), names(r"\bprefs\b", "sum to 1", r"1\.25")),
        (dict(prefs=[0.0, 1.0]), names(r"\bprefs\b", "open simplex", float_value("0.0"))),
        (dict(prefs=[np.nan, 1.0]), names(r"\bprefs\b", "non-finite", "nan")),
        (dict(losses=[1.0, 0.0]), names(r"\blosses\b", "strictly positive", float_value("0.0"))),
        (dict(losses=[1.0, np.nan]), names(r"\blosses\b", "non-finite", "nan")),
        (dict(gram=[[1.0, 0.25], [0.0, 1.0]]), names(r"\bgram\b", "symmetric", r"2\.500e-01|0\.25")),
        (dict(gram=[[1.0, 3.0], [3.0, 1.0]]), names(r"\bgram\b", "positive semi-definite", r"-2\.000e\+00|-2\.0")),
        (dict(gram=[[1.0, np.nan], [np.nan, 1.0]]), names(r"\bgram\b", "non-finite", "nan")),
        (dict(gram=np.eye(3)), names(r"\bgram\b", r"\(3, 3\)")),
        (dict(losses=[1.0, 2.0, 3.0]), names("objectives m", r"\(3,\)", r"\(2,\)")),
        (dict(eps_mode=-1.0), names(r"\beps_mode\b", r"-1\.0")),
        (dict(eps_mode=np.inf), names(r"\beps_mode\b", "inf")),
        (dict(descent="strict"), names(r"\bdescent\b", "'strict'")),
        (dict(on_infeasible="ignore"), names(r"\bon_infeasible\b", "'ignore'")),
        (dict(tol_Jstar=-0.5), names(r"\btol_Jstar\b", r"-0\.5")),
    ],
)
@pytest.mark.parametrize("solver", [lp_direction, lp_direction_reference])
def test_bad_input_raises_value_error(solver, kwargs, match):
    args = dict(losses=[1.0, 2.0], prefs=[0.5, 0.5], gram=np.eye(2))
    kwargs = dict(kwargs)
    opts = {k: kwargs.pop(k) for k in list(kwargs) if k in ("eps_mode", "descent", "on_infeasible", "tol_Jstar")}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        solver(args["losses"], args["prefs"], args["gram"], **opts)


# one bad row in a batch of good rows must raise and name that row: every row is validated, not just the first,
# and not only when all rows are bad
_MIXED_ROWS = {
    "prefs-sum": ("prefs", [0.25, 0.25, 0.75], names(r"\bprefs\b", r"\(3,", r"1\.25")),
    "prefs-zero": ("prefs", [0.5, 0.0, 0.5], names(r"\bprefs\b", r"\(3, 1\)", float_value("0.0"))),
    "losses-negative": ("losses", [1.0, -0.5, 2.0], names(r"\blosses\b", r"\(3, 1\)", float_value("-0.5"))),
    "losses-nan": ("losses", [1.0, np.nan, 2.0], names(r"\blosses\b", r"\(3, 1\)", "nan")),
    "gram-asymmetric": ("gram", [[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
                        names(r"\bgram\b", "symmetric", r"\(3,")),
    "gram-indefinite": ("gram", [[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
                        names(r"\bgram\b", "positive semi-definite", r"\(3,", r"-1\.000e\+00|-1\.0")),
    "gram-inf": ("gram", [[1.0, 0.0, 0.0], [0.0, np.inf, 0.0], [0.0, 0.0, 1.0]],
                 names(r"\bgram\b", r"\(3, 1, 1\)", "inf")),
}


@pytest.mark.parametrize("case", sorted(_MIXED_ROWS))
@pytest.mark.parametrize("solver", [lp_direction, lp_direction_reference])
def test_one_bad_row_in_a_good_batch_is_named(solver, case):
    losses, prefs, _, C = _f6(np.random.default_rng(4), 6, 3)
    assert np.all(np.isin(solver(losses, prefs, C).status, ("optimal", "relaxed")))  # the good batch solves
    which, row, pattern = _MIXED_ROWS[case]
    arrays = {"losses": losses.copy(), "prefs": prefs.copy(), "gram": C.copy()}
    arrays[which][3] = row
    with pytest.raises(ValueError, match=pattern):
        solver(arrays["losses"], arrays["prefs"], arrays["gram"])


# ---------------------------------------------------------------------------------------- property-based


@settings(max_examples=40, deadline=None)
@given(m=st.integers(2, 5), n_w=st.integers(1, 6), seed=st.integers(0, 2**32 - 1),
       log_scale=st.floats(-3, 3), eps_mode=st.sampled_from([0.0, 1e-4, 0.2]))
def test_property_solver_agrees_with_highs(m, n_w, seed, log_scale, eps_mode):
    rng = np.random.default_rng(seed)
    G = rng.normal(size=(6, n_w, m)) * 10.0 ** log_scale
    C = np.swapaxes(G, 1, 2) @ G
    losses = np.exp(rng.uniform(-2, 2, (6, m)))
    prefs = 0.95 * rng.dirichlet(np.ones(m), 6) + 0.05 / m
    _compare(lp_direction(losses, prefs, C, eps_mode=eps_mode),
             lp_direction_reference(losses, prefs, C, eps_mode=eps_mode), C)
