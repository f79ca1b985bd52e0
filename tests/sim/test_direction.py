"""The EPO direction LP: batched exact solver against the HiGHS oracle, LP properties, statuses, bad input.

Every test runs on both backends of ``lp_direction``: the numpy reference (the code of ``sim/direction.py``, which
the mutation runner changes) and the compiled twin (what ``backend="auto"`` runs where numba is installed; its
equality with the reference, bit for bit on the same LP data, is ``test_direction_twin.py``). Tests of the numpy
solver's internals (``_dual_simplex``, ``_recover``, ``_resolve_basis``) run on the reference only.
"""

from __future__ import annotations

import functools
import importlib.util
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.direction as sd
from sim.direction import LPInfeasibleError, lp_direction, lp_direction_reference
from sim.preference import uniformity_and_adjustment
from sim.problems.generic import lp_instance_family, random_lp_instances
from tests.error_patterns import float_value, names

_HAVE_NUMBA = importlib.util.find_spec("numba") is not None


@pytest.fixture(scope="module", autouse=True, params=["numpy", "compiled"])
def backend(request):
    """Run the module on one backend: ``lp_direction`` below is ``sim.direction.lp_direction(..., backend=...)``."""
    if request.param == "compiled" and not _HAVE_NUMBA:
        pytest.skip("numba is not installed (the compiled twin is unavailable)")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(globals(), "lp_direction", functools.partial(sd.lp_direction, backend=request.param))
        assert lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2)).backend == request.param
        yield request.param


def _numpy_internals(backend):
    """Tests of the numpy solver's internals run once, with the numpy backend."""
    if backend != "numpy":
        pytest.skip("numpy solver internals: the compiled twin's are compared in test_direction_twin.py")

FAMILIES = ("gaussian", "conflicting", "near_stationary", "rank_deficient")
LP_TOL = 1e-9  # docs/spec/tolerances.md#tolerances: LP and active sets


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


_REFERENCE: dict = {}


def _reference(losses, prefs, gram, **kw):
    """``lp_direction_reference(losses, prefs, gram, **kw)``, solved once for the module's two runs: HiGHS's answer
    does not depend on the backend under test (one LP at a time through ``linprog``, about 1 ms each, was a third
    of this module's time). Keyed by the arrays' bytes and the options; a result is frozen, so it is shared."""
    arrays = [np.ascontiguousarray(a, dtype=np.float64) for a in (losses, prefs, gram)]
    key = (*((a.shape, a.tobytes()) for a in arrays), tuple(sorted(kw.items())))
    if key not in _REFERENCE:
        _REFERENCE[key] = lp_direction_reference(losses, prefs, gram, **kw)
    return _REFERENCE[key]


@pytest.mark.parametrize("m", [2, 3, 5, 8])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("eps_mode", [1e-4, 0.05])
def test_batched_solver_matches_highs(family, m, eps_mode):
    rng = np.random.default_rng([m, FAMILIES.index(family), int(eps_mode * 1e4)])
    losses, prefs, _, gram = lp_instance_family(family, rng, 120, m)
    res = lp_direction(losses, prefs, gram, eps_mode=eps_mode)
    ref = _reference(losses, prefs, gram, eps_mode=eps_mode)
    _compare(res, ref, gram)


@pytest.mark.parametrize("descent", ["restricted", "relaxed"])
def test_descent_variants_match_highs(descent):
    rng = np.random.default_rng(42)
    losses, prefs, _, gram = _f6(rng, 400)
    for policy in ("relaxed", "fallback_preference"):
        res = lp_direction(losses, prefs, gram, eps_mode=10.0, descent=descent, on_infeasible=policy)
        ref = _reference(losses, prefs, gram, eps_mode=10.0, descent=descent, on_infeasible=policy)
        assert np.all(res.mode == "descent")  # eps_mode = 10 > log m
        _compare(res, ref, gram)


def _f6(rng, n, m=None, n_w=None):
    """F6 instances with a fixed m (the LP batch needs one m), returned as (losses, prefs, grads, gram)."""
    inst = random_lp_instances(rng, n, m=m if m is not None else 4, n_w=n_w)
    return inst.losses, inst.prefs, inst.grads, inst.gram


# ------------------------------------------------------------------------------------ LP properties
# (docs/spec/lp.md#lp)


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

    Both frequencies are recorded and asserted non-zero with a fixed seed (docs/spec/lp.md#lp,
    docs/spec/observations.md#observations saw 523/2991 and 111/4776).
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


def _restricted_infeasible():
    """F6 instances (m = 3, seed 9) whose restricted descent LP HiGHS finds infeasible (computed once, copied out)."""
    return tuple(a.copy() for a in _restricted_infeasible_cached())


@functools.lru_cache(maxsize=1)
def _restricted_infeasible_cached():
    losses, prefs, G, C = _f6(np.random.default_rng(9), 600, 3)
    ref = lp_direction_reference(losses, prefs, C, eps_mode=10.0, on_infeasible="fallback_preference")
    idx = np.flatnonzero(ref.status == "fallback")
    assert idx.size > 0
    return losses[idx], prefs[idx], G[idx], C[idx]


def test_infeasible_policies_are_explicit():
    losses, prefs, _, C = _restricted_infeasible()
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
@pytest.mark.parametrize("solver", ["lp_direction", "lp_direction_reference"])
def test_bad_input_raises_value_error(solver, kwargs, match):
    args = dict(losses=[1.0, 2.0], prefs=[0.5, 0.5], gram=np.eye(2))
    kwargs = dict(kwargs)
    opts = {k: kwargs.pop(k) for k in list(kwargs) if k in ("eps_mode", "descent", "on_infeasible", "tol_Jstar")}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        globals()[solver](args["losses"], args["prefs"], args["gram"], **opts)


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
@pytest.mark.parametrize("solver", ["lp_direction", "lp_direction_reference"])
def test_one_bad_row_in_a_good_batch_is_named(solver, case):
    solver = globals()[solver]
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


# ------------------------------------------------------------- results, rules R1-R5, solver internals (mutation gaps)


def test_result_is_frozen_and_direction_is_float64():
    import dataclasses
    from fractions import Fraction

    G = np.array([[1.0, 0.5], [0.0, 1.0], [0.25, 0.0]])
    res = lp_direction([1.0, 2.0], [0.5, 0.5], G.T @ G)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.weights = np.zeros(2)
    d = res.direction(G)
    np.testing.assert_allclose(d, G @ res.weights, rtol=1e-15)
    # exact numbers (Fractions, as from a symbolic computation) and lists come back as float64
    exact = np.array([[Fraction(int(4 * g), 4) for g in row] for row in G], dtype=object)
    for grads in (exact, G.tolist()):
        out = res.direction(grads)
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, d)


def test_reference_has_the_same_defaults():
    """lp_direction_reference solves the same LPs: every option it shares with lp_direction has the same default,
    and both, called with their defaults, pick the same mode on instances with β on either side of 1e-4."""
    import inspect

    ours = inspect.signature(sd.lp_direction).parameters
    ref = inspect.signature(lp_direction_reference).parameters
    for name, par in ref.items():
        assert ours[name].default == par.default, name
    l = np.array([[1.0, 1.0 + 1e-3], [1.0, 1.2], [1.0, 1.0 + 3e-2]])  # β = 1.2e-7, 4.2e-3, 1.1e-4
    C = np.broadcast_to(np.eye(2), (3, 2, 2))
    a, b = lp_direction(l, [0.5, 0.5], C), lp_direction_reference(l, [0.5, 0.5], C)
    assert a.mode.tolist() == b.mode.tolist() == ["descent", "balance", "balance"]


def _two_objectives_with_CA0_at(t, which="resolution"):
    """m = 2, l = (2, 1), λ = (½, ½), C = [[1, ρ], [ρ, 1]] with ρ chosen so that (CA)_0 = t·r_0, where r_0 is the
    (R3) resolution res_0 = Σ_k |C_0k| (r_k + 4mε|a_k|) of that entry (``which="resolution"``) or its roundoff
    bound Σ_k |C_0k| (e_k + 4mε|a_k|) (``which="roundoff"``), to first order; (CA)_1 ≈ -0.17 is far from both."""
    from sim.preference import preference_parts
    from sim.roundoff import EPS

    l, lam = np.array([2.0, 1.0]), np.array([0.5, 0.5])
    parts = preference_parts(l, lam)
    a = parts.adjustment
    base = parts.adjustment_resolution if which == "resolution" else parts.adjustment_roundoff
    r = base + 4 * 2 * EPS * np.abs(a)
    rho = (a[0] - t * r[0]) / (t * r[1] - a[1])
    return l, lam, np.array([[1.0, rho], [rho, 1.0]])


@pytest.mark.parametrize("t, in_J, ambiguous", [(0.5, True, True), (0.98, True, True), (1.02, True, True),
                                                (2.0, True, True), (2.9, True, True), (3.2, True, False),
                                                (10.0, True, False)])
def test_R3_entries_of_CA_at_their_resolution(t, in_J, ambiguous):
    """(R3): an entry the float data decide is kept however small (j ∈ J), and the instance is flagged ambiguous
    while (CA)_j <= 3·res_j (one entry in the band suffices: data that differ by the resolution could give the
    other sign), not beyond."""
    l, lam, C = _two_objectives_with_CA0_at(t)
    res = lp_direction(l, lam, C, eps_mode=0.0)
    assert res.J.tolist() == [in_J, False]
    assert bool(res.ambiguous) is ambiguous
    assert str(res.mode) == "balance" and str(res.status) == "optimal"


@pytest.mark.parametrize("t, in_J", [(0.3, False), (0.7, False), (1.5, True), (4.0, True)])
def test_R3_zeroes_only_entries_within_their_roundoff_and_flags_them(t, in_J):
    """(R3): (CA)_j within its roundoff bound (the float data do not decide its sign) is exactly 0, j ∉ J, and the
    instance is flagged ambiguous (a rule changed an entry); just above the bound the entry is kept, j ∈ J, and
    the instance is flagged because the entry lies in the resolution band."""
    l, lam, C = _two_objectives_with_CA0_at(t, "roundoff")
    res = lp_direction(l, lam, C, eps_mode=0.0)
    assert res.J.tolist() == [in_J, False]
    assert bool(res.ambiguous)


def test_R3_reproducer_a_decided_sign_is_not_zeroed():
    """The instance of the falsification audit (restricted descent, m = 2, loss spread 1e-11): the exact CA of the
    float data is (-3.756e-12, 3.627e-11), and the float CA agrees with it to 6 digits. The sign is computable, so
    the LP keeps the restriction row: μ = (0.906, 0.094), objective 31.072 (the exact LP), flagged ambiguous (the
    entries lie within the resolution band). Before, (R3) zeroed CA: μ = (1, 0), objective 33.188, unflagged."""
    l = np.array([4.089550554599048, 0.44512388497765343])
    lam = np.array([0.0981600533631883, 0.9018399466368119])
    C = np.array([[30.662598610574964, 2.525527178000202], [2.525527178000202, 8.115455264585101]])
    res = lp_direction(l, lam, C)
    assert str(res.mode) == "descent" and str(res.status) == "optimal"
    np.testing.assert_allclose(res.weights, [0.906163489, 0.093836511], rtol=0, atol=1e-8)
    assert abs(float(res.objective) - 31.072380512423532) <= 1e-9
    assert bool(res.ambiguous)
    ca = np.asarray(C @ res.adjustment)
    np.testing.assert_allclose(ca, [-3.756e-12, 3.627e-11], rtol=1e-3)


@pytest.mark.parametrize("delta, on_ray, ambiguous", [(0.0, True, False), (0.5e-12, True, True),
                                                      (2e-12, False, True), (2.9e-12, False, True),
                                                      (3.5e-12, False, False)])
@pytest.mark.parametrize("tol_Jstar", [0.0, 0.5])
def test_R1_on_the_ray_and_the_spread_band(delta, on_ray, ambiguous, tol_Jstar):
    """(R1): a spread log(max λl / min λl) <= TIE_RTOL is on the ray (β = 0 and A = 0 exactly), flagged ambiguous
    when the spread is not exactly 0 (the rule changed β and A); a spread in (TIE_RTOL, 3·TIE_RTOL] is flagged
    ambiguous too, beyond it not (with tol_Jstar = 0.5 the J* band plays no part). C = 0 keeps CA = 0 out of the
    picture."""
    l = np.array([2.0, 2.0 * (1.0 + delta)])
    res = lp_direction(l, [0.5, 0.5], np.zeros((2, 2)), tol_Jstar=tol_Jstar)
    assert (float(res.beta) == 0.0) is on_ray
    assert (not res.adjustment.any()) is on_ray
    if not on_ray:
        assert 0.0 < float(res.beta) < 1e-20
    assert bool(res.ambiguous) is ambiguous
    assert res.J_star.tolist() == ([True, True] if on_ray or tol_Jstar else [False, True])
    assert str(res.status) == "optimal"


@pytest.mark.parametrize("gap, ambiguous", [(-0.5e-12, False), (0.5e-12, True), (1.5e-12, True), (2.5e-12, False)])
def test_R2_the_Jstar_band_and_its_edge(gap, ambiguous):
    """(R2) with tol_Jstar = 0.1: J* = {j : λ_j l_j >= (1 - 0.1)ψ}, i.e. x_j >= max x - t with t = -log(0.9) in log
    units; an objective that misses it by at most 2·TIE_RTOL is flagged ambiguous. λl = (1, 0.9·e^{-gap})."""
    l = np.array([2.0, 2.0 * 0.9 * np.exp(-gap)])
    res = lp_direction(l, [0.5, 0.5], np.zeros((2, 2)), tol_Jstar=0.1)
    assert res.J_star.tolist() == [True, gap < 0]
    assert bool(res.ambiguous) is ambiguous


@pytest.mark.parametrize("gap, in_Jstar, ambiguous", [(0.0, True, False), (0.5e-12, True, True),
                                                     (2.5e-12, False, True), (3.5e-12, False, False)])
def test_R2_ties_by_the_widening_are_flagged(gap, in_Jstar, ambiguous):
    """(R2) with tol_Jstar = 0: an exact tie is in J* unflagged; an objective within TIE_RTOL of the maximum is in
    J* only by the widening (a changed entry: flagged); outside, within 2·TIE_RTOL more, it is flagged as a datum
    at the edge of the band; beyond, not. λl ∝ (1, e^{-gap}, ½): far from the ray, so (R1) plays no part (C = 0)."""
    l = np.array([2.0, 2.0 * np.exp(-gap), 1.0])
    res = lp_direction(l, np.full(3, 1.0 / 3.0), np.zeros((3, 3)), tol_Jstar=0.0)
    assert res.J_star.tolist() == [True, in_Jstar, False]
    assert bool(res.ambiguous) is ambiguous


def test_mode_band_flags_only_beta_at_eps_mode():
    """β within its resolution of eps_mode is ambiguous; 2 resolutions away it is not; on the ray with eps_mode = 0
    (β = 0 = eps_mode exactly, descent by the rule β > eps_mode) it is not; generic instances never are."""
    from sim.preference import preference_parts

    l, lam = np.array([1.0, 1.3, 0.8]), np.array([0.2, 0.3, 0.5])
    parts = preference_parts(l, lam)
    beta, res_beta = float(parts.beta), float(parts.beta_resolution)
    C = np.eye(3)
    assert bool(lp_direction(l, lam, C, eps_mode=beta + 0.5 * res_beta).ambiguous)
    assert bool(lp_direction(l, lam, C, eps_mode=beta - 0.5 * res_beta).ambiguous)
    assert not lp_direction(l, lam, C, eps_mode=beta + 2 * res_beta).ambiguous
    assert not lp_direction(l, lam, C, eps_mode=beta - 2 * res_beta).ambiguous
    on_ray = lp_direction(1.0 / lam, lam, C, eps_mode=0.0)
    assert float(on_ray.beta) == 0.0 and str(on_ray.mode) == "descent" and not on_ray.ambiguous
    losses, prefs, _, gram = _f6(np.random.default_rng(31), 300, 4)
    assert not lp_direction(losses, prefs, gram).ambiguous.any()


def test_R4_restriction_row_left_out_only_where_CA_is_zero():
    """(R4): with CA = 0 the restricted descent LP is the relaxed one (same iterations and weights); where CA ≠ 0
    the row is there and can make the LP infeasible (status relaxed)."""
    rng = np.random.default_rng(32)
    lam = 0.95 * rng.dirichlet(np.ones(3), 200) + 0.05 / 3
    G = rng.normal(size=(200, 4, 3))
    C = np.swapaxes(G, 1, 2) @ G
    on_ray = 1.0 / lam
    a = lp_direction(on_ray, lam, C)
    b = lp_direction(on_ray, lam, C, descent="relaxed")
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(a.iterations, b.iterations)
    losses, prefs, _, gram = _restricted_infeasible()
    assert np.all(lp_direction(losses, prefs, gram, eps_mode=10.0).status == "relaxed")


def test_R5_degenerate_ties_go_to_the_smallest_index():
    """(R5): two identical objectives (columns 0 and 1 of G, equal weighted losses) give several optimal vertices;
    ties are broken by the smallest index, so objective 1 never carries weight alone where 0 could, and data that differ
    by roundoff end at the same vertex."""
    l, lam, G, C = lp_instance_family("degenerate", np.random.default_rng(33), 300, 3)
    res = lp_direction(l, lam, C)
    assert not res.unique.all()
    assert np.all(res.weights[:, 1] == 0.0)
    C2 = np.einsum("nwi,nwj->nij", G, G)
    C2 = 0.5 * (C2 + np.swapaxes(C2, -1, -2))
    assert np.any(C2 != C)
    np.testing.assert_allclose(lp_direction(l, lam, C2).weights, res.weights, rtol=0, atol=1e-10)


def test_unique_certifies_the_optimal_vertex():
    """Non-singular Gram matrices give unique optima (all of these); identical objectives do not; unsolved and
    fallback instances are never certified."""
    losses, prefs, _, C = _f6(np.random.default_rng(34), 300, 3, n_w=6)
    assert lp_direction(losses, prefs, C).unique.all()
    G = np.array([[1.0, 1.0], [0.5, 0.5]])  # two identical gradients: every μ gives the same direction
    tie = lp_direction([2.0, 2.0], [0.5, 0.5], G.T @ G)
    assert not tie.unique and str(tie.status) == "optimal"
    res = lp_direction(losses, prefs, C, max_iter=1)
    assert not res.unique[res.status == "iteration_limit"].any()
    infeasible = _restricted_infeasible()
    fb = lp_direction(*infeasible[:2], infeasible[3], eps_mode=10.0, on_infeasible="fallback_preference")
    assert not fb.unique.any() and np.all(np.isnan(fb.kkt_residual))


def test_unsolved_instances_in_a_mixed_batch_are_nan_and_the_others_unaffected():
    """An iteration limit that stops some instances of a batch: exactly those are NaN in every LP output (weights,
    gain, objective, residuals), and every solved instance equals the same instance solved alone."""
    losses, prefs, _, C = _f6(np.random.default_rng(10), 60, 5)
    res = lp_direction(losses, prefs, C, max_iter=3)
    hit = res.status == "iteration_limit"
    assert 0 < hit.sum() < hit.size
    for name in ("weights", "gain", "objective", "feasibility_residual", "kkt_residual"):
        v = getattr(res, name)
        v = v if v.ndim == 1 else v.max(axis=1)
        assert np.all(np.isnan(v[hit])) and np.all(np.isfinite(v[~hit])), name
    assert sum(res.status_counts().values()) == hit.size
    for i in np.flatnonzero(~hit)[:8]:
        one = lp_direction(losses[i], prefs[i], C[i], max_iter=3)
        for name in ("weights", "gain", "objective", "kkt_residual", "iterations", "unique", "status"):
            np.testing.assert_array_equal(getattr(one, name), getattr(res, name)[i], err_msg=name)


def test_relaxed_resolve_counts_both_solves_and_its_certificate():
    """on_infeasible='relaxed': the iterations are those of the infeasible restricted LP plus those of the relaxed
    LP; the certificate is that of the relaxed LP; the gain is μᵀCA of the returned weights."""
    losses, prefs, _, C = _restricted_infeasible()
    rel = lp_direction(losses, prefs, C, eps_mode=10.0)
    first = lp_direction(losses, prefs, C, eps_mode=10.0, on_infeasible="fallback_preference")
    second = lp_direction(losses, prefs, C, eps_mode=10.0, descent="relaxed")
    np.testing.assert_array_equal(rel.iterations, first.iterations + second.iterations)
    np.testing.assert_array_equal(rel.weights, second.weights)
    np.testing.assert_array_equal(rel.kkt_residual, second.kkt_residual)
    CA = np.einsum("nij,nj->ni", C, rel.adjustment)
    np.testing.assert_allclose(rel.gain, np.einsum("nm,nm->n", rel.weights, CA), rtol=1e-14)
    np.testing.assert_allclose(first.gain, np.einsum("nm,nm->n", prefs, CA), rtol=1e-14)


def test_kkt_residual_includes_the_primal_infeasibility():
    """The certificate is the max of dual infeasibility, duality gap and primal infeasibility on the row-scaled LP,
    also for bases re-solved from the data (near-stationary instances are re-solved: their tableau solutions are
    primal infeasible by up to 1e-12 after clipping)."""
    for m in (2, 5):
        l, lam, _, C = lp_instance_family("near_stationary", np.random.default_rng([m, 7]), 300, m)
        res = lp_direction(l, lam, C)
        ok = res.status == "optimal"
        assert np.all(res.kkt_residual[ok] >= res.feasibility_residual[ok])
        assert np.any(res.feasibility_residual[ok] > 1e-13)


# Solver internals: Bland's rule, the certificate and re-solve, the singular-basis fallback. lp_direction switches
# to Bland's rule after 4·(m + 2) pivots, more than any LP of the test families needs (at most 29 at m = 8), so the
# internal solver is called with an earlier switch.


def _scaled_family_lps(family, m, n, seed, eps_mode=1e-4):
    from sim.direction import _build, _scale_lp

    l, lam, _, C = lp_instance_family(family, np.random.default_rng([seed, m]), n, m)
    return _scale_lp(_build(l, lam, C, eps_mode, "restricted", 0.0)[0])


def _solve_internal(c, D, e, bland_after, max_iter=1000):
    from sim.direction import _dual_simplex, _recover

    basis, code, iters, reduced, xB = _dual_simplex(c, D, e, max_iter=max_iter, bland_after=bland_after)
    ok = code == 0
    mu, kkt, _ = _recover(c[ok], D[ok], e[ok], basis[ok], reduced[ok], xB[ok])
    return code, iters, mu, kkt, ok


@pytest.mark.parametrize("family, m", [("gaussian", 5), ("rank_deficient", 5), ("conflicting", 4),
                                       ("degenerate", 4), ("near_stationary", 3)])
def test_bland_rule_reaches_the_same_optimum(family, m, backend):
    """Bland's rule from the first pivot (and from pivots 1..3) ends at an optimum of the same value as Dantzig's
    rule (1e-10 in the unit-scale objective: the primal tolerance is 1e-12), with a certificate <= 1e-9, on every LP;
    the switch is really taken on most of them."""
    _numpy_internals(backend)
    c, D, e = _scaled_family_lps(family, m, 150, seed=35)
    p = D.shape[1] + 1
    code0, it0, mu0, kkt0, ok0 = _solve_internal(c, D, e, bland_after=4 * p)
    assert ok0.all() or family != "gaussian"
    for after in (0, 1, 2, 3):
        code, it, mu, kkt, ok = _solve_internal(c, D, e, bland_after=after)
        np.testing.assert_array_equal(code, code0)
        assert kkt.max(initial=0.0) <= 1e-9
        v, v0 = np.einsum("nm,nm->n", c[ok], mu), np.einsum("nm,nm->n", c[ok0], mu0)
        np.testing.assert_allclose(v, v0, rtol=0, atol=1e-10)
        if after == 0:
            assert np.count_nonzero(it > 0) >= 0.5 * it.size  # Bland's rule chose every one of these pivots


def test_resolve_from_the_data_repairs_an_inaccurate_tableau(backend):
    """Tableau values off by 1e-8 (accumulated roundoff, simulated) fail the 1e-13 certificate; the basis is then
    re-solved from the data and the weights and certificate are those of the exact tableau."""
    _numpy_internals(backend)
    from sim.direction import _dual_simplex, _recover

    c, D, e = _scaled_family_lps("gaussian", 4, 100, seed=36)
    basis, code, _, reduced, xB = _dual_simplex(c, D, e, max_iter=1000, bland_after=24)
    assert np.all(code == 0)
    mu, kkt, unique = _recover(c, D, e, basis, reduced, xB)
    noisy = xB + 1e-8 * np.random.default_rng(0).uniform(-1, 1, xB.shape)
    mu2, kkt2, unique2 = _recover(c, D, e, basis, reduced, noisy)
    np.testing.assert_allclose(mu2, mu, rtol=0, atol=1e-13)
    assert kkt2.max() <= 1e-13
    np.testing.assert_array_equal(unique2, unique)


def test_exactly_singular_basis_keeps_the_tableau_weights(backend):
    """The re-solve ``B x_B = b`` in a batch in which one basis matrix is singular (two μ columns with the same
    [1; D_j]): the regular instance is re-solved exactly; the singular one is flagged, keeps the tableau's weights and
    reports their (uncertified) certificate instead of a made-up solution."""
    _numpy_internals(backend)
    from sim.direction import _recover, _resolve_basis

    D = np.array([[[1.0, 2.0]], [[1.0, 1.0]]])  # N = 2, k = 1, m = 2
    e = np.array([[1.5], [1.0]])
    basis = np.array([[0, 1], [0, 1]])
    x, singular = _resolve_basis(D, e, basis)
    assert singular.tolist() == [False, True]
    np.testing.assert_allclose(x[0], [0.5, 0.5], rtol=0, atol=1e-15)
    c = np.array([[1.0, 1.0], [1.0, 2.0]])  # instance 1: reduced cost +1 of μ_1, a certificate of 1
    xB = np.array([[0.5 + 1e-8, 0.5 - 1e-8], [0.75, 0.25]])  # instance 0: a row residual of 1e-8
    mu, kkt, _ = _recover(c, D, e, basis, np.zeros((2, 3)), xB)
    np.testing.assert_allclose(mu[0], [0.5, 0.5], rtol=0, atol=1e-15)
    assert kkt[0] <= 1e-15
    np.testing.assert_array_equal(mu[1], [0.75, 0.25])
    assert kkt[1] == 1.0


def test_bland_rule_takes_over_after_4p_pivots(backend):
    """The solver switches from Dantzig's rule to Bland's after 4·(m + 2) pivots: on rank-deficient descent LPs at
    m = 16, of which some need more than 3·(m + 2) pivots, the iteration counts of lp_direction (numpy) and of the
    compiled twin's solver (on the same LP data: its builder may differ in the last bits) are those of the internal
    solver switching after 4·(m + 2) pivots; a switch after 3·(m + 2) gives other counts."""
    from sim.direction import _build, _compiled_params, _dual_simplex, _prepare, _scale_lp

    m, p = 16, 18
    l, lam, _, C = lp_instance_family("rank_deficient", np.random.default_rng([m, 0]), 200, m)
    c, D, e = _scale_lp(_build(*_prepare(l, lam, C, True)[:3], 10.0, "restricted", 0.0)[0])
    it4 = _dual_simplex(c, D, e, max_iter=50 * (m + p), bland_after=4 * p)[2]
    it3 = _dual_simplex(c, D, e, max_iter=50 * (m + p), bland_after=3 * p)[2]
    long = it4 > 3 * p
    assert np.count_nonzero(long) >= 2 and np.any(it3[long] != it4[long])
    if backend == "numpy":  # fallback_preference: no re-solve adds pivots
        iters = lp_direction(l, lam, C, eps_mode=10.0, on_infeasible="fallback_preference").iterations
    else:
        from sim import _lp_compiled as kern

        iters = kern.solve_lps(c, D, e, -1, _compiled_params())[2]
    np.testing.assert_array_equal(iters, it4)


def test_lps_that_need_more_than_4p_pivots_reach_bland_and_match_highs():
    """Rank-deficient descent LPs with m = 24 need up to 123 pivots, more than the 4·(m + 2) = 104 after which
    lp_direction switches to Bland's rule: those instances (at least 5 here) end at HiGHS's status and optimum."""
    m, hit = 24, 0
    for seed in (0, 2):
        l, lam, _, C = lp_instance_family("rank_deficient", np.random.default_rng([m, seed]), 200, m)
        res = lp_direction(l, lam, C, eps_mode=10.0, on_infeasible="fallback_preference")
        long = np.flatnonzero(res.iterations > 4 * (m + 2))
        hit += long.size
        sub = lp_direction(l[long], lam[long], C[long], eps_mode=10.0, on_infeasible="fallback_preference")
        ref = _reference(l[long], lam[long], C[long], eps_mode=10.0, on_infeasible="fallback_preference")
        np.testing.assert_array_equal(sub.iterations, res.iterations[long])
        _compare(sub, ref, C[long])
    assert hit >= 5


def test_balance_and_relaxed_lps_are_never_declared_infeasible_on_mixed_magnitude_data():
    """The balancing LP and the relaxed descent LP are always feasible (docs/spec/lp.md#lp; the minimum-norm
    point μ* of the hull has (Cμ*)_j >= μ*ᵀCμ* >= 0), so "infeasible" can only be a solver failure. On data of wildly mixed
    magnitude (m = 12: losses 1e±200, gradient scales 1e±100) some LPs reach a basis with a row violated by just over
    the primal tolerance (1.1e-12 to 9e-12 in row-scaled units) whose entries are all below the pivot tolerance: such
    a row proves nothing, the basis is accepted, and its violation, within the bound the module docstring states, is
    reported in ``feasibility_residual``."""
    m = 12
    l, lam, _, C = lp_instance_family("mixed_magnitude", np.random.default_rng([m, 1]), 200, m)
    bound = 1e-12 + 1e-11 * (m + 2 * (m + 1))
    accepted = 0
    for eps_mode in (1e-4, 10.0):
        for descent in ("restricted", "relaxed"):
            res = lp_direction(l, lam, C, eps_mode=eps_mode, descent=descent)
            assert res.status_counts()["infeasible"] == 0, np.flatnonzero(res.status == "infeasible")
            assert np.all(res.feasibility_residual <= bound)
            accepted += np.count_nonzero(res.feasibility_residual > 1e-12)
    assert accepted >= 4  # the path is taken (instances 52 at eps_mode 1e-4, 61 and 199 at 10)


def _one_lp(c, rows, e):
    """One scaled LP (a batch of 1): ``max cᵀμ`` over the simplex with ``rows·μ >= e``."""
    return np.array([c], dtype=float), np.array([rows], dtype=float), np.array([e], dtype=float)


# Start vertex μ_0 (c_0 = 1 is the largest); each row's slack starts at D_i0 - e_i. Row A = (-3e-12, 0, -1) >= 0 is
# violated by 3e-12; its tableau entries are -3e-12 (μ_1) and 1 - 3e-12 (μ_2): no pivot, and μ_1 = 1 would repair it,
# so it proves nothing. Row (-5e-12, -4.5e-12, -1) >= 0 has the entry -5e-13 on μ_1: however μ_1 moves the basic
# value stays <= -4.5e-12, a proof (the LP is infeasible: every coefficient is negative). Row B = (-2e-12, 1, 0) >= 0
# is violated by 2e-12 and has the pivot -1 - 2e-12 on μ_1.
_ROW_A, _ROW_PROOF, _ROW_B = [-3e-12, 0.0, -1.0], [-5e-12, -4.5e-12, -1.0], [-2e-12, 1.0, 0.0]


@pytest.mark.parametrize("bland_after", [0, 100])
def test_a_row_without_pivot_declares_infeasibility_only_with_a_proof(bland_after, backend):
    """A leaving row with no entry below the pivot tolerance: a proof of infeasibility where its basic value stays
    below -1e-12 for every value of the nonbasic variables within their bounds (infeasible, at once), otherwise
    nothing (the basis is accepted, its violation reported by the certificate) — under Dantzig's rule and Bland's."""
    _numpy_internals(backend)
    from sim.direction import _dual_simplex, _recover

    c = [1.0, 0.5, 0.0]
    basis, code, iters, reduced, xB = _dual_simplex(*_one_lp(c, [_ROW_PROOF], [0.0]), 100, bland_after)
    assert (code[0], iters[0]) == (1, 0)
    lp = _one_lp(c, [_ROW_A], [0.0])
    basis, code, iters, reduced, xB = _dual_simplex(*lp, 100, bland_after)
    assert (code[0], iters[0]) == (0, 0)
    mu, kkt, _ = _recover(*lp, basis, reduced, xB)
    np.testing.assert_array_equal(mu[0], [1.0, 0.0, 0.0])
    assert kkt[0] == pytest.approx(3e-12, rel=1e-3)  # the violation, reported


# Start vertex μ_1; row B = (1, -0.5, 0) >= 0.8 leaves first (μ_0 enters), after which the slack s_B of B (at most
# max_j D_Bj - e_B = 0.2 on the simplex) is nonbasic and row A = (a_0, a_1, -1) >= 0 reads s_A = a_0 + (a_1 - a_0)μ_1
# - (1 + a_0)μ_2 with μ_1 = (0.2 - μ_2 - s_B)/1.5: its entry on s_B is (a_1 - a_0)/1.5, below the pivot tolerance.
_SLACK_BOUND_LPS = {
    # a_0 = 0, a_1 = -1.2e-11: s_A = -1.6e-12 at the vertex, 0 at s_B = 0.2 (μ = e_0 is feasible): no proof
    "feasible": ([0.0, 1.0, -1.0], [[0.0, -1.2e-11, -1.0], [1.0, -0.5, 0.0]], [0.0, 0.8]),
    # a_0 = -2e-12, a_1 = -4.5e-12: s_A <= -2.33e-12 + 1.67e-12·0.2 = -2e-12 (every coefficient is negative); with
    # the bound 1 instead of 0.2 the row would prove nothing
    "infeasible": ([0.0, 1.0, -1.0], [[-2e-12, -4.5e-12, -1.0], [1.0, -0.5, 0.0]], [0.0, 0.8]),
}


@pytest.mark.parametrize("case", sorted(_SLACK_BOUND_LPS))
def test_the_proof_of_infeasibility_counts_the_slack_bounds(case, backend):
    """Entries on a nonbasic slack count with the slack's bound max_j D_ij - e_i (0.2 here): a row whose violation
    that slack could repair proves nothing (an LP with a feasible point is not declared infeasible), and a row that
    the slack cannot repair within its bound is a proof."""
    _numpy_internals(backend)
    from sim.direction import _dual_simplex

    basis, code, iters, _, xB = _dual_simplex(*_one_lp(*_SLACK_BOUND_LPS[case]), 100, 100)
    assert basis[0].tolist() == [1, 3, 0] and iters[0] == 1 and xB[0, 1] < -1.5e-12  # s_A violated, no pivot
    assert code[0] == {"feasible": 0, "infeasible": 1}[case]


@pytest.mark.parametrize("bland_after", [0, 100])
def test_a_row_that_proves_nothing_leaves_the_choice_to_the_other_rows(bland_after, backend):
    """Row A (most negative, and first under Bland's rule) proves nothing; row B, infeasible with a pivot, is
    chosen instead: one pivot (μ_1 enters in B's place), then no infeasible row can pivot and the basis is accepted
    with A's violation. With the proof check alone (no choice among the other rows) it would stop at once."""
    _numpy_internals(backend)
    from sim.direction import _dual_simplex

    basis, code, iters, _, xB = _dual_simplex(*_one_lp([1.0, 0.5, 0.0], [_ROW_A, _ROW_B], [0.0, 0.0]), 100,
                                              bland_after)
    assert (code[0], iters[0]) == (0, 1)
    assert basis[0].tolist() == [0, 3, 1]  # μ_0, slack of A, μ_1
    np.testing.assert_allclose(xB[0], [1.0 - 2e-12, -3e-12, 2e-12], rtol=1e-3, atol=0)


# ------------------------------------------------------------------------ the LPs as the module docstring states them


def _docstring_lp(l, lam, C, eps_mode, descent):
    """Optimal value of the EPO direction LP of one generic instance, built here from the module docstring (not from
    sim.direction's builder) and solved by HiGHS; None if infeasible. Generic data: no entry of CA, no weighted loss
    and no β within the resolution of a threshold, so the roundoff rules R1-R5 play no part."""
    from scipy.optimize import linprog

    from sim.preference import uniformity_and_adjustment

    beta, A = uniformity_and_adjustment(l, lam)
    CA = C @ A
    m = len(l)
    w = lam * l
    J, J_star = CA > 0, w == w.max()
    rows, rhs = [], []
    if beta > eps_mode:
        c = CA
        for j in range(m):
            if not J.any() or J_star[j]:
                rows.append(C[j]), rhs.append(0.0)
            elif not J[j]:
                rows.append(C[j]), rhs.append(CA[j])
    else:
        c = C.sum(axis=0)
        rows, rhs = list(C), [0.0] * m
        if descent == "restricted":
            rows.append(CA), rhs.append(min(CA.max(), 0.0))
    s = np.abs(c).max()
    scale = np.maximum(np.abs(np.array(rows)).max(axis=1), np.abs(rhs))
    res = linprog(-c / s, A_ub=-np.array(rows) / scale[:, None], b_ub=-np.array(rhs) / scale, A_eq=np.ones((1, m)),
                  b_eq=[1.0], bounds=[(0, None)] * m, method="highs",
                  options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
    assert res.status in (0, 2)
    return None if res.status == 2 else -res.fun * s


@pytest.mark.parametrize("descent", ["restricted", "relaxed"])
@pytest.mark.parametrize("eps_mode", [1e-4, 10.0])
def test_lp_is_the_one_the_docstring_states(eps_mode, descent):
    """The LP that lp_direction solves (balancing with rows J̄ ∖ J* at (CA)_j and J* at 0, or all rows at 0 when
    J = ∅; uniform descent with Cμ >= 0 and, restricted, μᵀCA >= min(max_j (CA)_j, 0)) against the same LP built
    independently from the docstring: same feasibility, optimal values within 1e-9 of the objective's scale."""
    losses, prefs, _, C = _f6(np.random.default_rng(37), 100, 3, n_w=4)
    res = lp_direction(losses, prefs, C, eps_mode=eps_mode, descent=descent, on_infeasible="fallback_preference")
    assert not res.ambiguous.any()
    statuses = set()
    for i in range(len(losses)):
        v = _docstring_lp(losses[i], prefs[i], C[i], eps_mode, descent)
        statuses.add(str(res.status[i]))
        if v is None:
            assert res.status[i] == "fallback", i
            continue
        assert res.status[i] == "optimal", i
        CA = C[i] @ res.adjustment[i]
        scale = np.abs(CA if res.mode[i] == "balance" else C[i].sum(axis=0)).max()
        assert abs(res.objective[i] - v) <= 1e-9 * scale, (i, res.objective[i], v)
    if eps_mode == 10.0 and descent == "restricted":
        assert statuses == {"optimal", "fallback"}  # both outcomes of the restricted LP are checked


# ---------------------------------------------------------------------------------- options, policies, reference


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(max_iter=0), r"max_iter must be an integer >= 1 or None; got 0"),
        (dict(max_iter=-1), r"max_iter must be an integer >= 1 or None; got -1"),
        (dict(max_iter=2.5), r"max_iter must be an integer >= 1 or None; got 2\.5"),
        (dict(max_iter=True), r"max_iter must be an integer >= 1 or None; got True"),
        (dict(eps_mode="1e-4"), r"eps_mode must be a real number; got '1e-4' \(str\)"),
        (dict(eps_mode=True), r"eps_mode must be a real number; got True \(bool\)"),
        (dict(eps_mode=np.nan), r"eps_mode must be a finite number >= 0; got nan"),
        (dict(tol_Jstar=None), r"tol_Jstar must be a real number; got None \(NoneType\)"),
        (dict(tol_Jstar=-np.inf), r"tol_Jstar must be a finite number >= 0; got -inf"),
    ],
)
def test_options_are_validated_naming_the_value(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2), **kwargs)


def test_valid_options_of_every_numeric_type_are_accepted():
    a = lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2), eps_mode=0, tol_Jstar=np.float32(0.0), max_iter=np.int64(20))
    b = lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2), eps_mode=0.0, tol_Jstar=0.0, max_iter=1)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert str(b.status) == "optimal"  # one pivot suffices here


def test_raise_policy_messages_name_the_instances():
    losses, prefs, _, C = _f6(np.random.default_rng(9), 600, 3)
    fb = lp_direction(losses, prefs, C, eps_mode=10.0, on_infeasible="fallback_preference")
    bad = np.flatnonzero(fb.status == "fallback")
    assert bad.size > 10
    msg = (rf"restricted descent LP infeasible for {bad.size} instance\(s\) \(flat indices "
           rf"{re.escape(str(bad[:10].tolist()))} \.\.\.\)")
    with pytest.raises(LPInfeasibleError, match=msg):
        lp_direction(losses, prefs, C, eps_mode=10.0, on_infeasible="raise")
    few = bad[:3]
    with pytest.raises(LPInfeasibleError, match=r"for 3 instance\(s\) \(flat indices \[0, 1, 2\]\); use"):
        lp_direction(losses[few], prefs[few], C[few], eps_mode=10.0, on_infeasible="raise")
    res = lp_direction(losses, prefs, C, max_iter=1, on_infeasible="fallback_preference")
    stopped = np.flatnonzero(res.status == "iteration_limit")
    assert 0 < stopped.size
    with pytest.raises(LPInfeasibleError, match=rf"LP not solved for {stopped.size} instance\(s\) \(flat indices "
                       rf"{re.escape(str(stopped[:10].tolist()))}, statuses \['iteration_limit'\]\)"):
        lp_direction(losses, prefs, C, eps_mode=1e-4, max_iter=1, on_infeasible="raise")


def test_fallback_weights_are_the_normalised_preference():
    """μ = λ / Σλ also when validation (and with it the renormalisation of λ) is skipped."""
    losses, prefs, _, C = _restricted_infeasible()
    off = prefs * (1.0 + 1e-9)
    fb = lp_direction(losses, off, C, eps_mode=10.0, on_infeasible="fallback_preference", validate=False)
    assert np.all(fb.status == "fallback")
    np.testing.assert_allclose(fb.weights, off / off.sum(axis=1, keepdims=True), rtol=1e-15, atol=0)


def test_validate_false_converts_to_float64():
    """Inputs numpy keeps as objects (exact Fractions, Python integers) are converted without validation too."""
    from fractions import Fraction

    rng = np.random.default_rng(38)
    losses, prefs = np.exp(rng.normal(size=(5, 3))), rng.dirichlet(np.ones(3), 5)
    G = rng.integers(-3, 4, (5, 4, 3)).astype(float)
    C = np.swapaxes(G, 1, 2) @ G  # integer entries, exact as Fractions
    Cq = np.array([[[Fraction(float(x)) for x in row] for row in Ci] for Ci in C], dtype=object)
    lq = np.array([[Fraction(float(x)) for x in row] for row in losses], dtype=object)
    want = lp_direction(losses, prefs, C, validate=False)
    got = lp_direction(lq, prefs.astype(object), Cq, validate=False)
    for name in ("weights", "objective", "gain", "beta"):
        v = getattr(got, name)
        assert v.dtype == np.float64, name
        np.testing.assert_array_equal(v, getattr(want, name), err_msg=name)


def test_reference_maps_highs_failures_to_statuses(monkeypatch):
    """HiGHS status 2 is "infeasible" (then the policy applies), 1 "iteration_limit", others "solver_error"; the
    unsolved instances are NaN and the iteration counts are HiGHS's."""
    import scipy.optimize

    from sim.direction import STATUSES

    losses, prefs, _, C = _f6(np.random.default_rng(39), 8, 3)
    ref = lp_direction_reference(losses, prefs, C)
    assert np.all(ref.iterations >= 0) and ref.iterations.max() > 0
    real = scipy.optimize.linprog
    calls = iter([1, 4, 0, 0, 0, 0, 0, 0])

    def fake(*args, **kwargs):
        res = real(*args, **kwargs)
        res.status = next(calls)
        return res

    monkeypatch.setattr(scipy.optimize, "linprog", fake)
    out = lp_direction_reference(losses, prefs, C)
    assert out.status[:2].tolist() == ["iteration_limit", "solver_error"] and set(STATUSES) >= set(out.status)
    assert np.all(np.isnan(out.weights[:2])) and np.all(np.isnan(out.kkt_residual[:2]))
    np.testing.assert_array_equal(out.weights[2:], ref.weights[2:])
    np.testing.assert_array_equal(out.kkt_residual[2:], 0.0)


def test_infeasible_policy_applies_to_the_restriction_row_only():
    """on_infeasible concerns the restricted descent LP, whose extra row can make it infeasible. A relaxed descent LP
    that is infeasible (impossible for a PSD Gram matrix; here C = -I, passed with validate=False: Cμ >= 0 has no
    point on the simplex) stays "infeasible" with NaN weights under every policy, and "raise" says it was not
    solved."""
    l, lam, C = np.array([1.0, 2.0, 1.5]), np.array([0.2, 0.3, 0.5]), -np.eye(3)
    for policy in ("relaxed", "fallback_preference"):
        res = lp_direction(l, lam, C, eps_mode=10.0, descent="relaxed", on_infeasible=policy, validate=False)
        assert str(res.status) == "infeasible" and np.all(np.isnan(res.weights)), policy
    with pytest.raises(LPInfeasibleError, match=r"LP not solved for 1 instance\(s\).*\['infeasible'\]"):
        lp_direction(l, lam, C, eps_mode=10.0, descent="relaxed", on_infeasible="raise", validate=False)



def test_jstar_tolerance_one_admits_every_objective():
    """tol_Jstar >= 1: λ_j l_j >= ψ - tol·ψ <= 0 holds for every j (J* = [m]) on either backend."""
    l, lam = np.array([1.0, 3.0, 0.2]), np.array([0.2, 0.3, 0.5])
    for tol in (1.0, 2.5):
        assert lp_direction(l, lam, np.eye(3), tol_Jstar=tol).J_star.tolist() == [True, True, True]
    assert lp_direction(l, lam, np.eye(3), tol_Jstar=0.5).J_star.tolist() == [False, True, False]


@pytest.mark.parametrize("shared", ["losses", "prefs", "gram", "prefs+gram"])
def test_one_input_shared_by_the_batch(shared):
    """Any of the inputs may be one instance broadcast against the batch of the others: the result equals the
    batch with that input repeated."""
    losses, prefs, _, C = _f6(np.random.default_rng(40), 6, 3)
    full = {"losses": losses, "prefs": prefs, "gram": C}
    args = dict(full)
    for name in shared.split("+"):
        args[name] = full[name][0]
        full = dict(full, **{name: np.broadcast_to(full[name][0], full[name].shape)})
    got = lp_direction(args["losses"], args["prefs"], args["gram"])
    want = lp_direction(*(np.ascontiguousarray(full[k]) for k in ("losses", "prefs", "gram")))
    for name in ("weights", "status", "objective", "J_star", "iterations"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


def test_feasibility_residual_counts_negative_weights_and_the_sum():
    """max(max_j (e_j - D_j μ), max_j -μ_j, |1ᵀμ - 1|, 0) on the scaled rows: each term can be the largest."""
    from sim.direction import _feasibility_residual

    D, e = np.array([[[1.0, 0.0]]]), np.array([[0.25]])
    np.testing.assert_array_equal(_feasibility_residual(D, e, np.array([[0.5, 0.5]])), [0.0])
    np.testing.assert_array_equal(_feasibility_residual(D, e, np.array([[0.125, 0.875]])), [0.125])
    np.testing.assert_array_equal(_feasibility_residual(D, e, np.array([[1.5, -0.5]])), [0.5])
    np.testing.assert_array_equal(_feasibility_residual(D, e, np.array([[0.5, 0.75]])), [0.25])


def test_broken_numba_warns_at_the_caller(monkeypatch):
    """numba installed but its kernels not importable: one RuntimeWarning that says why, attributed to the line that
    asked for the backend, and the numpy reference runs."""
    import sys

    import sim

    monkeypatch.setitem(sys.modules, "sim._lp_compiled", None)  # import sim._lp_compiled raises ImportError
    monkeypatch.delattr(sim, "_lp_compiled", raising=False)
    sd._load_compiled.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="numba is installed but cannot be imported") as rec:
            assert sd.resolve_backend("auto") == "numpy"
        assert rec[0].filename == __file__
    finally:
        sd._load_compiled.cache_clear()


def test_restriction_row_is_decided_per_instance_in_a_batch(backend):
    """One batch (C = -I, validate=False): off the ray the restricted LP is infeasible and the policy gives the
    fallback; on the ray (CA = 0: no restriction row, R4) the LP is the relaxed one, infeasible, and stays
    "infeasible" — whether an instance has the restriction row depends on its own CA, not on the batch's."""
    lam = np.array([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]])
    l = np.array([[1.0, 2.0, 1.5], 1.0 / lam[1]])
    res = lp_direction(l, lam, -np.eye(3), eps_mode=10.0, on_infeasible="fallback_preference", validate=False)
    assert res.status.tolist() == ["fallback", "infeasible"]
    assert res.beta[1] == 0.0 and not res.adjustment[1].any()


def test_kkt_residual_counts_a_positive_dual():
    """The certificate's residual ``max(max_j (c - Aᵀy)_j, max_i y_i, |cᵀμ - bᵀy|, 0)``: with every other term 0, a
    dual ``y_1 = 0.5 > 0`` (the second dual -2 is feasible) is the residual."""
    c, D, e = np.array([[1.0]]), np.zeros((1, 2, 1)), np.zeros((1, 2))
    mu, y = np.array([[1.0]]), np.array([[1.0, 0.5, -2.0]])
    assert sd._certificate(c, D, e, mu, y).tolist() == [0.5]
    assert sd._certificate(c, D, e, mu, np.array([[1.0, -0.5, -2.0]])).tolist() == [0.0]


def test_numpy_solver_runs_without_floating_point_warnings():
    """Every LP family through the numpy solver with warnings as errors: no division by zero on the columns that
    cannot enter."""
    import warnings

    from sim.problems.generic import LP_FAMILIES

    for family in LP_FAMILIES:
        inst = lp_instance_family(family, np.random.default_rng(3), 40, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            res = sd.lp_direction(inst.losses, inst.prefs, inst.gram, backend="numpy")
        assert res.weights.shape == (40, 4), family


@pytest.mark.parametrize("m", [3, 5, 9])
def test_an_instance_result_does_not_depend_on_the_batch_around_it(m):
    """Each instance's result is bit-identical alone, in its batch, and in the batch reversed and shifted: the compiled
    twin checks and builds blocks of 64 instances, one SIMD lane each (m = 9: sums by numpy's pairwise order), and a
    lane that read another's data, or a per-block quantity not reset, would change a result with its position."""
    l, lam, _, C = random_lp_instances(np.random.default_rng([m, 11]), 150, m)
    names = ("weights", "mode", "status", "gain", "beta", "adjustment", "J", "J_star", "objective",
             "feasibility_residual", "kkt_residual", "iterations", "unique", "ambiguous")
    for eps_mode in (1e-4, 10.0):
        batch = lp_direction(l, lam, C, eps_mode=eps_mode)
        order = np.roll(np.arange(len(l))[::-1], 37)
        moved = lp_direction(l[order], lam[order], C[order], eps_mode=eps_mode)
        for name in names:
            np.testing.assert_array_equal(getattr(moved, name), getattr(batch, name)[order], err_msg=name)
        for i in (0, 1, 63, 64, 100, 149):
            one = lp_direction(l[i], lam[i], C[i], eps_mode=eps_mode)
            for name in names:
                np.testing.assert_array_equal(getattr(one, name), getattr(batch, name)[i], err_msg=f"{name} [{i}]")


@pytest.mark.skipif(importlib.util.find_spec("numba") is None or not sd.backend_status()["compiled_available"],
                    reason="the compiled twin is unavailable")
def test_read_only_and_broadcast_inputs_reuse_the_compiled_twins_one_specialisation():
    """numba compiles the twin once per layout and read-only flag of each argument (about 12 s each on a 2-core
    machine, on every fresh clone): read-only, broadcast and strided inputs reach it as the same C-contiguous
    writeable float64 arrays, so they add no specialisation, and their results are those of plain arrays."""
    kern, _ = sd._load_compiled()
    rng = np.random.default_rng(3)
    inst = random_lp_instances(rng, 4, 3)
    l, lam, C = inst.losses, inst.prefs, inst.gram
    ref = lp_direction(l, lam, C, backend="compiled")
    before = len(kern.directions.signatures)
    ro = [np.array(a) for a in (l, lam, C)]
    for a in ro:
        a.flags.writeable = False
    wide = [np.repeat(a, 2, axis=0)[::2] for a in (l, lam, C)]  # strided views
    one = lp_direction(l, np.repeat(lam[:1], len(lam), axis=0), C, backend="compiled")  # every client prefers lam[0]
    cases = ((ro, ref), (wide, ref), ((l, np.broadcast_to(lam[0], lam.shape), C), one), ((ro[0], ro[1][0], ro[2]), one))
    for args, want in cases:
        np.testing.assert_array_equal(lp_direction(*args, backend="compiled").weights, want.weights)
    assert len(kern.directions.signatures) == before
