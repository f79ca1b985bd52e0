"""The compiled twin of the LP kernel against the numpy reference (sim.direction backends).

Three levels, on every LP instance family of ``sim.problems.generic`` (m in {2, 3, 5, 8}, both modes) and the F6
random instances:

* the **solver** (dual simplex, recovery and certificate, re-solve of uncertified bases) on the same LP data:
  bit-identical — the same status, pivots, iterations and basis, the same weights, certificate and uniqueness;
* the **builder** (preference parts and the resolution rules R1-R5): the same decisions (mode, ``J``, ``J*``,
  active rows, ``ambiguous``) and bit-identical data (``β``, ``A``, ``CA``, ``c``, ``D``, ``e``): both take ``log``,
  ``exp``, ``expm1`` and ``log1p`` from the C math library (:func:`sim.roundoff.libm`);
* **end to end** (``lp_direction(backend=...)``): the same statuses, modes and index sets; objectives within 1e-12
  of the objective's scale; weights within 1e-12 at unique optima — or, where the optimal basis is ill conditioned,
  within the first-order bound ``4‖B⁻¹‖(‖Δb‖ + ‖ΔB‖‖x_B‖)`` that a last-bit difference of the data would allow
  (bit-identical results, checked in ``test_direction_extreme.py``, meet these bounds with room).

And the registry: ``auto`` runs the compiled twin wherever numba is installed (never a silent fallback), says so
where numba is missing, and ``backend="compiled"`` then raises.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import sim.direction as sd
from sim.direction import BACKENDS, BackendUnavailableError, backend_status, lp_direction, resolve_backend
from sim.preference import preference_parts
from sim.problems.generic import LP_FAMILIES, lp_instance_family, random_lp_instances

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (the compiled twin is unavailable)")

MS = (2, 3, 5, 8)
EPS_MODES = (1e-4, 10.0)  # 10 > log m: every instance in descent mode (the restricted LP)
N = 200


def _instances(family, m, seed=0):
    rng = np.random.default_rng([seed, m, (LP_FAMILIES + ("F6",)).index(family)])
    if family == "F6":
        inst = random_lp_instances(rng, N, m)
    else:
        inst = lp_instance_family(family, rng, N, m)
    return inst.losses, inst.prefs, inst.gram


FAMILIES = LP_FAMILIES + ("F6",)


@pytest.fixture(autouse=True)
def _interpreted_twin(monkeypatch):
    """Under ``NUMBA_DISABLE_JIT=1`` (the mutation run of ``sim/_lp_compiled.py``: docs/mutation.md) the
    twin's source runs as Python; the registry refuses it there (``auto`` would run numpy), so these tests load it
    themselves and compare the interpreted twin with the reference, the same decisions as the compiled one."""
    if HAVE_NUMBA:
        import numba

        if numba.config.DISABLE_JIT:
            from sim import _lp_compiled

            monkeypatch.setattr(sd, "_load_compiled", lambda: (_lp_compiled, None))


# ------------------------------------------------------------------------------------------------ registry


def test_auto_runs_the_compiled_twin_where_numba_is_installed():
    """Fails if ``auto`` falls back to numpy although numba is installed (a broken numba install included)."""
    status = backend_status()
    res = lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2))
    if HAVE_NUMBA:
        assert status["auto"] == "compiled" and status["compiled_available"], status
        assert resolve_backend("auto") == "compiled"
        assert res.backend == "compiled"
    else:
        assert status["auto"] == "numpy" and "numba" in status["reason"]
        assert res.backend == "numpy"
    assert lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2), backend="numpy").backend == "numpy"
    assert sd.lp_direction_reference([1.0, 2.0], [0.5, 0.5], np.eye(2)).backend == "highs"


def test_without_numba_auto_says_numpy_and_compiled_raises():
    """In a process where numba cannot be imported: ``auto`` runs numpy and reports why; ``compiled`` raises."""
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import numpy as np\n"
        "from sim.direction import backend_status, lp_direction, BackendUnavailableError\n"
        "s = backend_status(); assert s['auto'] == 'numpy' and not s['compiled_available'], s\n"
        "assert s['reason'] == 'numba is not installed', s\n"
        "assert lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2)).backend == 'numpy'\n"
        "try:\n"
        "    lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2), backend='compiled')\n"
        "except BackendUnavailableError as exc:\n"
        "    assert 'numba' in str(exc) and \"backend='numpy'\" in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('backend=compiled ran without numba')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_unavailable_compiled_backend_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(sd, "_load_compiled", lambda: (None, "numba is not installed"))
    assert backend_status() == {"auto": "numpy", "compiled_available": False, "reason": "numba is not installed",
                                "numba": None}
    assert lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2)).backend == "numpy"
    with pytest.raises(BackendUnavailableError, match="numba is not installed"):
        lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2), backend="compiled")


def test_backend_names_are_checked():
    assert BACKENDS == ("auto", "numpy", "compiled")
    with pytest.raises(ValueError, match="backend must be one of"):
        lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2), backend="numba")


def test_resolve_backend_names_the_backend_that_runs(monkeypatch):
    """``resolve_backend`` returns ``"numpy"`` or ``"compiled"``, never anything else: ``numpy`` always, ``compiled``
    and ``auto`` where numba can be imported, ``auto`` without numba: ``numpy``."""
    assert resolve_backend("numpy") == "numpy"
    if HAVE_NUMBA:
        assert resolve_backend("compiled") == "compiled" and resolve_backend("auto") == "compiled"
    monkeypatch.setattr(sd, "_load_compiled", lambda: (None, "numba is not installed"))
    assert resolve_backend("numpy") == "numpy" and resolve_backend("auto") == "numpy"


@needs_numba
def test_policy_codes_are_the_kernels():
    """The ``on_infeasible`` names map onto the compiled kernel's policy constants (defined there, numba freezes
    module globals), one code per policy."""
    from sim import _lp_compiled as kern

    assert sd._POLICIES == {"relaxed": kern.POLICY_RELAXED, "fallback_preference": kern.POLICY_FALLBACK,
                            "raise": kern.POLICY_RAISE}
    assert len(set(sd._POLICIES.values())) == 3


# ------------------------------------------------------------------------------------------------ solver twin


def _build_lps(l, lam, C, *args):
    """The twin's builder on the arrays as ``lp_direction`` hands them to the kernel (``sim.direction._kernel_input``:
    C-contiguous and writeable), so that its compiled blocks are the ones ``directions`` uses (numba compiles a
    specialisation per read-only flag, about 10 CPU-s each on an empty cache)."""
    from sim import _lp_compiled as kern

    return kern.build_lps(*(sd._kernel_input(a) for a in (l, lam, C)), *args)


def _numpy_lp(l, lam, C, eps_mode, descent="restricted"):
    l, lam, C, _ = sd._prepare(l, lam, C, True)
    return l, lam, C, sd._build(l, lam, C, eps_mode, descent, 0.0)


@needs_numba
@pytest.mark.parametrize("family", FAMILIES)
def test_solver_twin_is_bit_identical_on_the_same_lp_data(family):
    from sim import _lp_compiled as kern

    for m in MS:
        for eps_mode in EPS_MODES:
            for descent in ("restricted", "relaxed"):
                *_, built = _numpy_lp(*_instances(family, m), eps_mode, descent)
                lp = built[0]
                c, D, e = sd._scale_lp(lp)
                basis, code, iters, _, _ = sd._dual_simplex(c, D, e, max_iter=50 * (2 * m + 2),
                                                            bland_after=4 * (m + 2))
                mu, _, _, kkt, unique = sd._solve_batched(lp, (c, D, e), None)
                mu2, code2, iters2, kkt2, unique2, basis2 = kern.solve_lps(c, D, e, -1, sd._compiled_params())
                where = f"{family} m={m} eps_mode={eps_mode} {descent}"
                np.testing.assert_array_equal(code2, code, err_msg=where)
                np.testing.assert_array_equal(iters2, iters, err_msg=where)
                np.testing.assert_array_equal(basis2, basis, err_msg=where)
                np.testing.assert_array_equal(mu2, mu, err_msg=where)  # NaN where not solved, in both
                np.testing.assert_array_equal(kkt2, kkt, err_msg=where)
                np.testing.assert_array_equal(unique2, unique, err_msg=where)
                assert unique2.dtype == unique.dtype and code2.dtype.kind == "i", where


@needs_numba
def test_solver_twin_iteration_limit_and_infeasible_codes():
    from sim import _lp_compiled as kern

    *_, built = _numpy_lp(*_instances("F6", 5), 10.0)
    c, D, e = sd._scale_lp(built[0])
    for max_iter in (1, 2, 3):
        basis, code, iters, _, _ = sd._dual_simplex(c, D, e, max_iter=max_iter, bland_after=4 * 7)
        _, code2, iters2, _, _, basis2 = kern.solve_lps(c, D, e, max_iter, sd._compiled_params())
        np.testing.assert_array_equal(code2, code)
        np.testing.assert_array_equal(iters2, iters)
        np.testing.assert_array_equal(basis2, basis)
    assert {0, 1, 2} <= set(code2.tolist()) | set(kern.solve_lps(c, D, e, -1, sd._compiled_params())[1].tolist())


@needs_numba
@pytest.mark.parametrize("bland", [False, True])
def test_solver_twin_takes_the_same_infeasibility_decisions(bland):
    """Rows without a pivot (a proof of infeasibility, or a violation that proves nothing and leaves the choice to the
    other rows) under Dantzig's and Bland's rule: the same codes, iterations, bases and tableaux, on mixed-magnitude
    LPs (m = 12, where such rows occur) and on LPs built so that a row proves nothing while another pivots."""
    from sim import _lp_compiled as kern

    m = 12
    *_, built = _numpy_lp(*_instances("mixed_magnitude", m, seed=1), 10.0, "relaxed")
    c, D, e = sd._scale_lp(built[0])
    hand = [([1.0, 0.5, 0.0], [[-3e-12, 0.0, -1.0], [-2e-12, 1.0, 0.0]], [0.0, 0.0]),
            ([1.0, 0.5, 0.0], [[-5e-12, -4.5e-12, -1.0], [-2e-12, 1.0, 0.0]], [0.0, 0.0]),
            ([0.0, 1.0, -1.0], [[0.0, -1.2e-11, -1.0], [1.0, -0.5, 0.0]], [0.0, 0.8]),  # slack bounds count
            ([0.0, 1.0, -1.0], [[-2e-12, -4.5e-12, -1.0], [1.0, -0.5, 0.0]], [0.0, 0.8])]
    lps = [(c, D, e)] + [tuple(np.array([a], dtype=float) for a in lp) for lp in hand]
    P = sd._compiled_params()
    codes, accepted = set(), 0
    for c, D, e in lps:
        N, k, m = D.shape
        n, p = m + k, k + 1
        after = 0 if bland else 4 * p
        basis, code, iters, reduced, xB = sd._dual_simplex(c, D, e, max_iter=50 * (m + p), bland_after=after)
        T, b2, prow, f = np.empty((p + 1, n + 1)), np.empty(p, dtype=np.int64), np.empty(n + 1), np.empty(p + 1)
        for t in range(N):
            code2, iters2 = kern._dual_simplex(c[t], D[t], e[t], 50 * (m + p), after, P, T, b2, prow, f)
            assert (code2, iters2) == (code[t], iters[t]), t
            np.testing.assert_array_equal(b2, basis[t])
            np.testing.assert_array_equal(T[:p, n], xB[t])
            np.testing.assert_array_equal(T[p, :n], reduced[t])
        codes |= set(code.tolist())
        accepted += np.count_nonzero((code == 0) & (xB.min(axis=1) < -1e-12))  # a row that proved nothing
    assert codes == {0, 1}
    assert accepted >= 4


def test_lu_solve_matches_lapack_and_flags_exactly_singular_bases():
    rng = np.random.default_rng(3)
    B = rng.normal(size=(50, 6, 6))
    b = rng.normal(size=(50, 6))
    B[7, :, 2] = B[7, :, 4]  # two equal columns: exactly singular
    x, singular = sd._lu_solve(B, b)
    assert singular.tolist() == [i == 7 for i in range(50)]
    ok = ~singular
    np.testing.assert_allclose(x[ok], np.linalg.solve(B[ok], b[ok][:, :, None])[:, :, 0], rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------ builder twin


@needs_numba
@pytest.mark.parametrize("family", FAMILIES)
def test_builder_twin_builds_bit_identical_lp_data(family):
    """The same decisions and the same bits: both builders take their logarithms and exponentials from the C math
    library (sim.roundoff.libm), so ``β``, ``A``, ``CA`` and the LP data are equal, not only close."""
    for m in MS:
        for eps_mode in EPS_MODES:
            l, lam, C, built = _numpy_lp(*_instances(family, m, seed=1), eps_mode)
            lp, beta, A, CA, J, J_star, balance, ambiguous = built
            c2, D2, e2, active2, beta2, A2, CA2, J2, J_star2, balance2, ambiguous2 = _build_lps(
                l, lam, C, eps_mode, True, sd._jstar_tol(0.0), sd._compiled_params())
            where = f"{family} m={m} eps_mode={eps_mode}"
            for name, a, b in (("active", lp.active, active2), ("J", J, J2), ("J*", J_star, J_star2),
                               ("balance", balance, balance2), ("ambiguous", ambiguous, ambiguous2),
                               ("beta", beta, beta2), ("A", A, A2), ("CA", CA, CA2), ("c", lp.c, c2),
                               ("D", lp.D, D2), ("e", lp.e, e2)):
                np.testing.assert_array_equal(b, a, err_msg=f"{where}: {name}")
                assert b.dtype == a.dtype, (where, name, b.dtype)


@needs_numba
def test_compiled_sums_are_numpys_pairwise_sums_at_every_length():
    """The twin's sums (numpy's pairwise order: blocks of 128 by 8 accumulators, longer runs halved at a multiple
    of 8) are bit-identical to ``numpy.sum`` at lengths around every block boundary."""
    from sim import _lp_compiled as kern

    rng = np.random.default_rng(5)
    for n in (1, 7, 8, 9, 15, 16, 17, 127, 128, 129, 136, 200, 255, 256, 257, 300, 1000, 1031, 4099):
        a = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 9, size=n)
        assert kern._np_sum(a) == np.sum(a), n


@needs_numba
def test_compiled_lane_sums_are_numpys_sums_at_every_length():
    """The builder's sums over the objective axis, one per SIMD lane (``_lane_sum``), are bit-identical to
    ``numpy.sum`` of each lane's entries at every length, across the switch from the in-order sum (below 8 terms) to
    numpy's pairwise one."""
    from sim import _lp_compiled as kern

    rng = np.random.default_rng(11)
    nb = 5
    for n in (*range(1, 21), 127, 128, 129, 200):
        S = rng.standard_normal((n + 3, nb)) * 10.0 ** rng.integers(-8, 9, size=(n + 3, nb))
        vec = np.empty(n)
        kern._lane_sum(S, 2, n, nb, 0, vec)
        for b in range(nb):
            assert S[0, b] == np.sum(S[2 : 2 + n, b].copy()), (n, b)


@needs_numba
def test_builder_twin_flags_instances_within_the_ray_resolution():
    """(R1): an instance whose log-spread is in ``(0, 3·TIE_RTOL]`` is reported ``ambiguous`` by both builders (its
    β and A are set to 0 up to ``TIE_RTOL``: a perturbation of the losses at that size could decide otherwise), and
    one exactly on the ray (spread 0) or clearly off it (1e-9) is not."""
    from sim.roundoff import TIE_RTOL

    lam = np.array([0.25, 0.25, 0.5])
    rel = np.array([0.0, 0.5e-12, 1e-12, 2e-12, 2.9e-12, 1e-9])
    l = np.array([[1.0 + r, 1.0, 1.0] for r in rel]) / lam  # λ_j l_j = 1 (+ r for the first)
    L = np.tile(lam, (len(rel), 1))
    l2, lam2, C2, built = _numpy_lp(l, L, np.tile(np.eye(3), (len(rel), 1, 1)), 1e-4)
    ambiguous = built[-1]
    got = _build_lps(l2, lam2, C2, 1e-4, True, sd._jstar_tol(0.0), sd._compiled_params())
    spread = preference_parts(l2, lam2).spread
    inside = (spread > 0.0) & (spread <= 3.0 * TIE_RTOL)
    assert inside.sum() >= 3 and not inside[0] and not inside[-1], spread
    np.testing.assert_array_equal(ambiguous, inside)
    np.testing.assert_array_equal(got[-1], inside)


@needs_numba
def test_compiled_checks_pass_every_family_instance_and_name_each_fault():
    """The compiled input checks (the fast path of ``backend="compiled"``) pass every instance of every family and
    flag the first bad instance of a batch with the fault's code: losses, preferences, Gram entries (not finite, not
    symmetric), not positive semi-definite."""
    from sim import _lp_compiled as kern

    for family in FAMILIES:
        for m in MS:
            l, lam, C = _instances(family, m)
            lam = lam / lam.sum(axis=-1, keepdims=True)
            assert kern.check_inputs(l, lam, np.ascontiguousarray(C), sd._compiled_params()) == (-1, kern.CHECK_OK)
    good = ([1.0, 2.0], [0.5, 0.5], np.eye(2))
    for change, code in ((dict(l=[1.0, np.inf]), kern.CHECK_LOSSES), (dict(l=[1.0, -2.0]), kern.CHECK_LOSSES),
                         (dict(lam=[0.5, 0.6]), kern.CHECK_PREFS), (dict(lam=[0.0, 1.0]), kern.CHECK_PREFS),
                         (dict(C=[[1.0, np.inf], [np.inf, 1.0]]), kern.CHECK_GRAM),
                         (dict(C=[[1.0, np.nan], [np.nan, 1.0]]), kern.CHECK_GRAM),
                         (dict(C=[[1.0, 0.2], [0.0, 1.0]]), kern.CHECK_GRAM),
                         (dict(C=[[1.0, 3.0], [3.0, 1.0]]), kern.CHECK_PSD)):
        bad = dict(zip(("l", "lam", "C"), good, strict=True))
        bad.update(change)
        rows = [good, good, (bad["l"], bad["lam"], bad["C"])]  # the third instance of a batch is the bad one
        l, lam, C = (np.ascontiguousarray([np.asarray(r[i], dtype=float) for r in rows]) for i in range(3))
        got = kern.check_inputs(l, lam, C, sd._compiled_params())
        assert got == (2, code) and isinstance(got[1], (int, np.integer)), (change, got)


# ------------------------------------------------------------------------------------------------ end to end


def _weights_bound(l, lam, C, eps_mode, res):
    """Per instance, ``4‖B⁻¹‖_∞ (‖Δb‖_∞ + ‖ΔB‖_∞ ‖x_B‖_∞)``: the first-order change of the optimal vertex of the
    reference's final LP when its scaled data change by the difference between the two builders."""
    bound = np.zeros(len(l))
    for descent in ("restricted", "relaxed"):
        sel = res.status == ("optimal" if descent == "restricted" else "relaxed")
        if not sel.any():
            continue
        lp = sd._build(l[sel], lam[sel], C[sel], eps_mode, descent, 0.0)[0]
        c, D, e = sd._scale_lp(lp)
        c2, D2, e2, active2, *_ = _build_lps(l[sel], lam[sel], C[sel], eps_mode, descent == "restricted",
                                              sd._jstar_tol(0.0), sd._compiled_params())
        _, D2, e2 = sd._scale_lp(sd._LP(c=c2, D=D2, e=e2, active=active2))
        basis = sd._dual_simplex(c, D, e, max_iter=50 * (2 * l.shape[1] + 2), bland_after=4 * (l.shape[1] + 2))[0]
        B, b = sd._basis_system(D, e, basis)
        B2, b2 = sd._basis_system(D2, e2, basis)
        inv = np.abs(np.linalg.inv(B)).sum(axis=2).max(axis=1)
        dB = np.abs(B2 - B).sum(axis=2).max(axis=1)
        db = np.abs(b2 - b).max(axis=1)
        xB = np.abs(np.linalg.solve(B, b[:, :, None])[:, :, 0]).max(axis=1)
        bound[sel] = 4.0 * inv * (db + dB * xB)
    return bound


@needs_numba
@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_backend_matches_numpy_end_to_end(family):
    n_ill = 0
    for m in MS:
        for eps_mode in EPS_MODES:
            l, lam, C = _instances(family, m, seed=2)
            a = lp_direction(l, lam, C, eps_mode=eps_mode, backend="numpy")
            b = lp_direction(l, lam, C, eps_mode=eps_mode, backend="compiled")
            assert (a.backend, b.backend) == ("numpy", "compiled")
            where = f"{family} m={m} eps_mode={eps_mode}"
            for name in ("status", "mode", "J", "J_star", "ambiguous", "unique"):
                np.testing.assert_array_equal(getattr(b, name), getattr(a, name), err_msg=f"{where}: {name}")
            solved = np.isfinite(a.objective)
            np.testing.assert_array_equal(np.isfinite(b.objective), solved, err_msg=where)
            CA = np.einsum("nij,nj->ni", C, a.adjustment)
            scale = np.abs(np.where((a.mode == "balance")[:, None], CA, C.sum(axis=1))).max(axis=1)
            dobj = np.abs(b.objective - a.objective)[solved] / np.maximum(scale[solved], 1e-300)
            assert dobj.max(initial=0.0) <= 1e-12, f"{where}: objective {dobj.max():.2e}"
            assert np.all(np.abs(b.gain - a.gain)[solved] <= 1e-12 * np.maximum(scale[solved], 1e-300)), where
            uniq = a.unique & solved
            dmu = np.abs(b.weights - a.weights).max(axis=1)
            off = uniq & (dmu > 1e-12)
            if off.any():
                lc, lamc, Cc, _ = sd._prepare(l, lam, C, True)
                bound = _weights_bound(lc, lamc, Cc, eps_mode, a)
                assert np.all(dmu[off] <= bound[off]), (
                    f"{where}: weights differ by {dmu[off].max():.2e} at unique optima, more than the conditioning "
                    f"bound {bound[off].min():.2e}")
                n_ill += int(off.sum())
    # Ill-conditioned optimal bases occur in the rank-deficient family only (C singular, n_w < m).
    if family != "rank_deficient":
        assert n_ill == 0, f"{family}: {n_ill} unique optima beyond 1e-12"


@needs_numba
@pytest.mark.parametrize("descent", ["restricted", "relaxed"])
@pytest.mark.parametrize("policy", ["relaxed", "fallback_preference", "raise"])
def test_infeasibility_policies_agree(descent, policy):
    l, lam, C = _instances("F6", 3, seed=9)
    l, lam, C = (np.concatenate([x] * 3) for x in (l, lam, C))
    kw = dict(eps_mode=10.0, descent=descent, on_infeasible=policy)
    try:
        a = lp_direction(l, lam, C, backend="numpy", **kw)
    except sd.LPInfeasibleError as exc:
        with pytest.raises(sd.LPInfeasibleError) as info:
            lp_direction(l, lam, C, backend="compiled", **kw)
        assert str(info.value) == str(exc)
        return
    b = lp_direction(l, lam, C, backend="compiled", **kw)
    np.testing.assert_array_equal(b.status, a.status)
    if descent == "restricted":
        assert (a.status == ("relaxed" if policy == "relaxed" else "fallback")).any()
    np.testing.assert_array_equal(b.iterations, a.iterations)
    np.testing.assert_allclose(b.weights, a.weights, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isnan(b.kkt_residual), np.isnan(a.kkt_residual))
    # the residuals are the policy's own: a fallback μ = λ is infeasible (residual > 0) and has no certificate (NaN)
    np.testing.assert_allclose(b.feasibility_residual, a.feasibility_residual, rtol=0, atol=1e-12)
    if policy == "fallback_preference" and descent == "restricted":
        fb = a.status == "fallback"
        assert np.all(a.feasibility_residual[fb] > 1e-6) and np.all(np.isnan(a.kkt_residual[fb]))
        assert not a.unique[fb].any()  # μ = λ is no LP optimum, unique or not
    np.testing.assert_array_equal(b.unique, a.unique)


@needs_numba
def test_iteration_limit_statuses_agree():
    l, lam, C = _instances("F6", 5, seed=4)
    a = lp_direction(l, lam, C, max_iter=2, backend="numpy")
    b = lp_direction(l, lam, C, max_iter=2, backend="compiled")
    assert (a.status == "iteration_limit").any()
    np.testing.assert_array_equal(b.status, a.status)
    np.testing.assert_array_equal(np.isnan(b.weights), np.isnan(a.weights))


@needs_numba
@pytest.mark.parametrize(
    "shape_case", ["single", "batch", "broadcast_prefs", "nested_batch", "float32_prefs", "lists", "tol_Jstar"])
def test_input_forms_agree(shape_case):
    rng = np.random.default_rng(8)
    l = np.exp(rng.uniform(-1, 1, (7, 3)))
    lam = rng.dirichlet(np.ones(3), 7)
    G = rng.normal(size=(7, 4, 3))
    C = np.swapaxes(G, 1, 2) @ G
    kw = {}
    args = {
        "single": (l[0], lam[0], C[0]),
        "batch": (l, lam, C),
        "broadcast_prefs": (l, lam[0], C[0]),
        "nested_batch": (l.reshape(7, 1, 3), lam.reshape(7, 1, 3), C.reshape(7, 1, 3, 3)),
        "float32_prefs": (l, lam.astype(np.float32), C),
        "lists": (l[0].tolist(), lam[0].tolist(), C[0].tolist()),
        "tol_Jstar": (l, lam, C),
    }[shape_case]
    if shape_case == "tol_Jstar":
        kw = dict(tol_Jstar=0.3)
    a = lp_direction(*args, backend="numpy", **kw)
    b = lp_direction(*args, backend="compiled", **kw)
    for name in ("weights", "mode", "status", "gain", "beta", "adjustment", "J", "J_star", "objective",
                 "feasibility_residual", "kkt_residual", "iterations", "unique", "ambiguous"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape and x.dtype == y.dtype, (name, x.shape, y.shape, x.dtype, y.dtype)
        if x.dtype.kind == "f":
            np.testing.assert_allclose(y, x, rtol=1e-12, atol=1e-15, err_msg=name)
            assert not np.any(np.signbit(x) & (x == 0.0)) and not np.any(np.signbit(y) & (y == 0.0)), name
        else:
            np.testing.assert_array_equal(y, x, err_msg=name)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(prefs=[0.5, 0.6]),
        dict(prefs=[0.0, 1.0]),
        dict(losses=[1.0, np.inf]),
        dict(losses=[1.0, -2.0]),
        dict(gram=[[1.0, 0.2], [0.0, 1.0]]),
        dict(gram=[[1.0, 3.0], [3.0, 1.0]]),
        dict(gram=[[1.0, np.nan], [np.nan, 1.0]]),
        dict(losses=[[1.0, 2.0], [3.0, 0.0]], prefs=[[0.5, 0.5], [0.5, 0.5]], gram=[np.eye(2), np.eye(2)]),
    ],
)
def test_bad_input_gives_the_same_error_on_both_backends(kwargs):
    args = dict(losses=[1.0, 2.0], prefs=[0.5, 0.5], gram=np.eye(2))
    args.update(kwargs)
    msgs = []
    for backend in ("numpy", "auto"):
        with pytest.raises(ValueError) as info:
            lp_direction(args["losses"], args["prefs"], args["gram"], backend=backend)
        msgs.append(str(info.value))
    assert msgs[0] == msgs[1]


# ------------------------------------------------------------------------------------------------ boundaries


@needs_numba
def test_compiled_checks_of_an_instance_do_not_depend_on_the_block_before_it():
    """The checks' per-lane scalars (Σλ, the largest |C| entry, the largest row sum) start afresh for every block:
    an instance that opens the second block is refused exactly as it is alone, although the instance in its lane of
    the first block has entries 10⁸ times larger (which would widen its symmetry and semi-definiteness tolerances
    to 10⁻² if they were carried over)."""
    from sim import _lp_compiled as kern

    P = sd._compiled_params()
    big = ([1.0, 2.0], [0.5, 0.5], 1e8 * np.eye(2))
    good = ([1.0, 2.0], [0.5, 0.5], np.eye(2))
    for C_bad, code in (([[1.0, 1e-8], [0.0, 1.0]], kern.CHECK_GRAM),  # asymmetry 1e-8 > GRAM_RTOL
                        ([[1.0, 0.0], [0.0, -1e-6]], kern.CHECK_PSD)):  # λ_min = -1e-6 < -GRAM_RTOL
        bad = ([1.0, 2.0], [0.5, 0.5], C_bad)
        alone = tuple(np.ascontiguousarray([np.asarray(x, dtype=float)]) for x in bad)
        assert kern.check_inputs(*alone, P) == (0, code)
        rows = [big] + [good] * (kern.BLOCK - 1) + [bad]
        batch = (np.ascontiguousarray([np.asarray(r[i], dtype=float) for r in rows]) for i in range(3))
        assert kern.check_inputs(*batch, P) == (kern.BLOCK, code), C_bad


def test_gram_symmetry_tolerance_is_inclusive_on_both_backends():
    """A Gram matrix whose asymmetry is exactly ``GRAM_RTOL·max(1, max|C|)`` is accepted (the documented test is
    ``asym > tol`` refused), by both backends, with the same direction; one ulp more is refused by both."""
    from sim.preference import GRAM_RTOL

    at = np.array([[1.0, GRAM_RTOL], [0.0, 1.0]])
    over = np.array([[1.0, np.nextafter(GRAM_RTOL, 1.0)], [0.0, 1.0]])
    res = [lp_direction([1.0, 2.0], [0.5, 0.5], at, backend=b) for b in ("numpy", "auto")]
    np.testing.assert_array_equal(res[1].weights, res[0].weights)
    if HAVE_NUMBA:  # the compiled fast path accepts it too (else every such input would pay the numpy checks)
        from sim import _lp_compiled as kern

        one = (np.array([[1.0, 2.0]]), np.array([[0.5, 0.5]]), at[None].copy())
        assert kern.check_inputs(*one, sd._compiled_params()) == (-1, kern.CHECK_OK)
        assert kern.check_inputs(*one[:2], over[None].copy(), sd._compiled_params()) == (0, kern.CHECK_GRAM)
    for backend in ("numpy", "auto"):
        with pytest.raises(ValueError, match="symmetric"):
            lp_direction([1.0, 2.0], [0.5, 0.5], over, backend=backend)


@needs_numba
def test_objective_entry_exactly_at_the_tie_tolerance_is_a_tie_on_both_solvers():
    """Dantzig's start column ``k*`` is the first objective entry within ``TIE_RTOL`` of the maximum, inclusive: with
    ``c_0 = fl(1 - TIE_RTOL)`` and ``c_1 = 1`` both solvers start at column 0 and take the same pivots to the same
    basis; starting at column 1 instead changes the iterations."""
    from sim import _lp_compiled as kern
    from sim.roundoff import TIE_RTOL

    c = np.array([[1.0 - TIE_RTOL, 1.0, 0.0]])
    assert c[0, 1] - TIE_RTOL == c[0, 0]  # exactly at the tolerance
    D = np.array([[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.2, -1.0, 0.3]]])
    e = np.array([[0.3, 0.2, -1.0]])
    P = sd._compiled_params()
    k, m = D.shape[1:]
    n, p = m + k, k + 1
    basis, code, iters, reduced, xB = sd._dual_simplex(c, D, e, max_iter=50 * (m + p), bland_after=4 * p)
    T, b2, prow, f = np.empty((p + 1, n + 1)), np.empty(p, dtype=np.int64), np.empty(n + 1), np.empty(p + 1)
    assert kern._dual_simplex(c[0], D[0], e[0], 50 * (m + p), 4 * p, P, T, b2, prow, f) == (code[0], iters[0])
    np.testing.assert_array_equal(b2, basis[0])
    np.testing.assert_array_equal(T[p, :n], reduced[0])
    # the tie decides: an entry one ulp further down is no tie, and the other start takes another path
    c_no_tie = c.copy()
    c_no_tie[0, 0] = np.nextafter(c[0, 0], 0.0)
    _, code_n, iters_n, _, _ = sd._dual_simplex(c_no_tie, D, e, max_iter=50 * (m + p), bland_after=4 * p)
    assert (code_n[0], iters_n[0]) != (code[0], iters[0])


@needs_numba
def test_builder_twin_zeroes_the_same_entries_of_CA_at_the_roundoff_scale():
    """(R3) near its threshold: ``C = P⊥ + εI`` with ``P⊥`` the projector orthogonal to the adjustment ``A``, so that
    ``CA = εA`` up to roundoff, swept over ε across the roundoff bound of ``CA`` (log weights ``y ≈ -0.05`` with a
    spread of 1e-3, where the bound is dominated by the roundoff of ``A``, ``Σ_k ĺ_k (|y_j| + |y_k| + |y_j - y_k|)``).
    Both builders zero the same entries and flag the same instances. The sweep has the power to see the bound
    change by a factor of 2: at least 5 of its points fall between the bound and twice it."""
    lam = np.array([0.3, 0.3, 0.4])
    l = 0.95 * (1.0 + np.array([0.0, 1e-3, -0.5e-3])) / lam  # λ_j l_j ≈ 0.95: y_j ≈ log 0.95
    parts = preference_parts(l, lam)
    A = parts.adjustment
    Pperp = np.eye(3) - np.outer(A, A) / (A @ A)
    eps_grid = np.geomspace(1e-15, 1e-9, 240)
    C = np.array([Pperp + s * np.eye(3) for s in eps_grid])
    C = 0.5 * (C + np.swapaxes(C, 1, 2))
    N = len(eps_grid)
    L, LAM = np.tile(l, (N, 1)), np.tile(lam, (N, 1))
    l2, lam2, C2, built = _numpy_lp(L, LAM, C, 1e-4)
    _, _, _, CA, J, _, _, ambiguous = built
    _, _, _, _, _, _, CA2, J2, _, _, ambiguous2 = _build_lps(
        l2, lam2, C2, 1e-4, True, sd._jstar_tol(0.0), sd._compiled_params())
    # the roundoff bound of CA as sim.direction computes it (the decision's threshold), and the raw CA
    raw = (C2 * preference_parts(l2, lam2, validate=False).adjustment[:, None, :]).sum(axis=2)
    err = (np.abs(C2) * (parts.adjustment_roundoff + 4.0 * 3 * np.finfo(float).eps * np.abs(A))[None, None, :]
           ).sum(axis=2)
    ratio = np.abs(raw) / err
    assert np.count_nonzero((ratio > 1.0) & (ratio < 2.0)) >= 5
    assert np.any(ratio < 0.5) and np.any(ratio > 4.0)
    clear = np.abs(ratio - 1.0) > 1e-6  # away from the threshold by more than the builders' last-bit differences
    np.testing.assert_array_equal((CA2 == 0.0)[clear], (CA == 0.0)[clear])
    np.testing.assert_array_equal(J2[clear.all(axis=1)], J[clear.all(axis=1)])
    np.testing.assert_array_equal(ambiguous2[clear.all(axis=1)], ambiguous[clear.all(axis=1)])


@needs_numba
def test_twin_outputs_keep_their_layout_on_the_refused_path():
    """A batch refused by the checks returns empty outputs in the layout of a solved one (columns ``2m + 5``,
    ``2m + 4``, ``2``; float64, bool, int64), so that both paths have one type (numba unifies them)."""
    from sim import _lp_compiled as kern

    m = 3
    l = np.ascontiguousarray([[1.0, 2.0, 3.0], [1.0, -1.0, 1.0]])
    lam = np.full((2, m), 1.0 / 3.0)
    C = np.ascontiguousarray(np.tile(np.eye(m), (2, 1, 1)))
    P = sd._compiled_params()
    args = (1e-4, True, sd._jstar_tol(0.0), 0, -1, P, True)
    bad, code, F, Fl, I = kern.directions(l, lam, C, *args)
    assert (bad, code) == (1, kern.CHECK_LOSSES)
    _, _, F1, Fl1, I1 = kern.directions(l[:1], lam[:1], C[:1], *args)
    for empty, solved in ((F, F1), (Fl, Fl1), (I, I1)):
        assert empty.shape == (0,) + solved.shape[1:] and empty.dtype == solved.dtype, (empty.shape, solved.shape)
    # LP data that overflow (found while solving, the instances before solved): empty outputs too
    a = 1e306
    C_ovf = np.ascontiguousarray([np.eye(m), [[a, -a, 0.0], [-a, a, 0.0], [0.0, 0.0, 1.0]]])
    l_ovf = np.ascontiguousarray([[1.0, 2.0, 3.0], [1e-300, 1e-300, 1e300]])
    lam_ovf = np.ascontiguousarray([[0.4, 0.4, 0.2]] * 2)
    bad, code, *outs = kern.directions(l_ovf, lam_ovf, C_ovf, *args)
    assert (bad, code) == (1, kern.CHECK_OVERFLOW)
    for empty, solved in zip(outs, (F1, Fl1, I1), strict=True):
        assert empty.shape == (0,) + solved.shape[1:] and empty.dtype == solved.dtype, (empty.shape, solved.shape)


@pytest.mark.parametrize("case", ["CA", "column_sums"])
def test_overflowing_lp_data_is_an_error_on_both_backends(case):
    """Finite inputs whose LP data overflow float64 — ``C·A`` of a Gram near 1e306 with log weights 1,400 apart
    (``inf - inf``), or the column sums of a Gram near 1e308 in descent mode — raise ``LPDataOverflowError`` naming
    the instance on both backends (before, the numpy backend said "optimal" with NaN weights and the twin "optimal"
    with weights of NaN data); the same Gram divided by its largest entry is solved."""
    from sim.direction import LPDataOverflowError

    if case == "CA":
        a = 1e306
        C = np.array([[a, -a, 0.0], [-a, a, 0.0], [0.0, 0.0, 1.0]])
        l, lam = np.array([1e-300, 1e-300, 1e300]), np.array([0.4, 0.4, 0.2])
    else:
        a = 1e308
        C = np.array([[a, a], [a, a]])
        l, lam = np.array([1.0, 1.0]), np.array([0.5, 0.5])  # on the ray: A = 0, descent mode, c = Σ_i C_ij
    batch = (np.stack([np.ones_like(l), l]), lam, np.stack([np.eye(len(l)), C]))
    msgs = []
    for backend in ("numpy", "auto"):
        with pytest.raises(LPDataOverflowError, match=r"overflow float64 at index \(1,\)") as info:
            with np.errstate(all="ignore"):
                lp_direction(*batch, backend=backend)
        msgs.append(str(info.value))
        res = lp_direction(l, lam, C / a, backend=backend)
        assert res.status == "optimal" and np.all(np.isfinite(res.weights)), backend
    assert msgs[0] == msgs[1]


@pytest.mark.parametrize("family", ["ray_edge", "F6", "rank_deficient"])
def test_zeros_of_every_float_result_are_positive_on_both_backends(family):
    """A zero in a result is +0.0 on every backend (the feasibility residual of an exact vertex, a zero weight): the
    sign of a zero is not part of a result (numpy's ``maximum`` returns either zero of ``(-0.0, 0.0)`` depending
    on the CPU's SIMD path), so results compare bit for bit across backends and CPUs."""
    l, lam, C = _instances(family, 3)
    for backend in ("numpy", "auto"):
        res = lp_direction(l, lam, C, eps_mode=10.0, backend=backend)
        zeros = 0
        for name in ("weights", "gain", "beta", "adjustment", "objective", "feasibility_residual", "kkt_residual"):
            x = getattr(res, name)
            assert not np.any(np.signbit(x) & (x == 0.0)), (backend, name)
            zeros += np.count_nonzero(x == 0.0)
        assert zeros > 0  # the family has zeros to check


@pytest.mark.parametrize("backend", ["numpy", "auto"])
def test_an_objective_with_a_zero_gradient_is_solved(backend):
    """An objective whose gradient is 0 (a zero row and column of the Gram) gives an LP row ``0·μ >= 0`` whose scale
    is 0; the row is kept at scale 1 and the LP solved: the same optimal weights on both backends, on the simplex."""
    C = np.diag([1.0, 0.0, 2.0])
    for l in ([1.0, 2.0, 3.0], [3.0, 1.0, 2.0], [1.0, 1.0, 1.0]):
        for eps_mode in (1e-4, 10.0):
            res = lp_direction(l, [0.2, 0.3, 0.5], C, eps_mode=eps_mode, backend=backend)
            ref = lp_direction(l, [0.2, 0.3, 0.5], C, eps_mode=eps_mode, backend="numpy")
            assert res.status == "optimal" and np.all(np.isfinite(res.weights)), (l, eps_mode, res.status)
            assert abs(res.weights.sum() - 1.0) < 1e-12 and res.weights.min() >= 0.0
            assert 0.0 <= res.feasibility_residual <= 1e-12 and 0.0 <= res.kkt_residual <= 1e-12, res
            np.testing.assert_allclose(res.weights, ref.weights, rtol=0, atol=1e-12)


def test_a_result_built_without_a_backend_names_the_reference():
    """``DirectionResult``'s ``backend`` defaults to ``"numpy"`` (the reference), documented as the solver that
    produced the result."""
    res = lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2), backend="numpy")
    fields = {f: getattr(res, f) for f in res.__dataclass_fields__ if f != "backend"}
    assert sd.DirectionResult(**fields).backend == "numpy"
