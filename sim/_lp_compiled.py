r"""Compiled twin of the EPO direction LP kernel (numba, ``cache=True``); the numpy code of :mod:`sim.direction`
is the reference and :mod:`sim.direction` is the only entry point (``lp_direction(..., backend="compiled")``).

This module mirrors, instance by instance, what the numpy reference does on a whole batch:

* the input checks of :mod:`sim.preference` in one pass per instance, ``O(m³)`` flops (finite and positive
  losses and preferences, ``|Σλ - 1| <= SIMPLEX_ATOL`` with ``λ`` then renormalised, a finite symmetric Gram matrix
  with ``C + δI`` Cholesky-factorisable). An instance that fails any of them is reported to the caller, which runs
  the numpy checks to name the bad value (and to decide the rare semi-definite case that needs eigenvalues);
* :class:`sim.preference.PreferenceParts` (``β``, ``A``, ``x = log(m ĺ)``, the spread, the resolutions of ``β``
  and ``A``) and the LP data builder ``sim.direction._build`` with the resolution rules (R1)-(R5), as stated in
  the docstring of :mod:`sim.direction`;
* the row scaling, the dual simplex (same start vertex, same Dantzig/Bland pivot rules, same tie breaking, same
  tolerances, same proof of infeasibility, so the same pivot sequence and verdict), the recovery of the weights
  with their certificate, the re-solve of an uncertified basis from the data, and the ``on_infeasible`` policy.

The simplex is bit-identical to the numpy reference on the same LP data (the tableau update is the same sequence
of rounded operations). The builder is equal to roundoff: sums over the objective axis follow numpy's pairwise
order, but ``log``/``expm1``/``log1p`` come from another math library than numpy's SIMD loops and ``einsum``'s
summation order is not reproduced, so values may differ in the last bits (the tests bound the difference).

Nothing here is public: constants are passed in by :mod:`sim.direction` (numba freezes module globals at compile
time and its cache would not see them change), so every tolerance is defined once, in :mod:`sim.direction`,
:mod:`sim.preference` and :mod:`sim.roundoff`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# Indices into the parameter vector built by sim.direction._compiled_params().
P_TIE, P_EPS, P_PRIMAL, P_PIVOT, P_RATIO, P_CERT, P_UNIQUE, P_SIMPLEX, P_GRAM, P_LN2, P_CENTRE = range(11)
N_PARAMS = 11

# Status codes: indices into sim.direction.STATUSES.
S_OPTIMAL, S_RELAXED, S_FALLBACK, S_INFEASIBLE, S_ITERLIMIT = 0, 1, 2, 3, 4
# on_infeasible policies.
POLICY_RELAXED, POLICY_FALLBACK, POLICY_RAISE = 0, 1, 2
# Input check failures (the caller names the value with the numpy checks).
CHECK_OK, CHECK_LOSSES, CHECK_PREFS, CHECK_GRAM, CHECK_PSD = 0, 1, 2, 3, 4

_NAN = np.nan
_INF = np.inf


# ------------------------------------------------------------------------------------------------ helpers


@njit(cache=True, error_model="numpy", inline="always")
def _pairwise_sum(a, lo, n):
    """``numpy.add.reduce`` of ``a[lo:lo+n]`` over a contiguous axis, in numpy's pairwise order (bit-identical).
    Below 8 terms numpy adds in order; longer sums: :func:`_pairwise_sum_long`. Inlined where it is called (a
    numba function that calls another is not inlined by LLVM, and a call costs more than a short sum)."""
    if n < 8:
        s = 0.0
        for i in range(lo, lo + n):
            s += a[i]
        return s
    return _pairwise_sum_long(a, lo, n)


@njit(cache=True, error_model="numpy")
def _pairwise_block(a, lo, n):
    """numpy's pairwise sum of ``a[lo:lo+n]`` for ``8 <= n <= 128`` (a leaf of its recursion): eight accumulators,
    combined pairwise, then the remainder in order."""
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    s = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        s += a[lo + i]
        i += 1
    return s


@njit(cache=True, error_model="numpy")
def _pairwise_sum_long(a, lo, n):
    """:func:`_pairwise_sum` for ``n >= 8``: blocks of at most 128 terms by :func:`_pairwise_block`, longer ones
    halved (at a multiple of 8) and the halves added, numpy's recursion unrolled on an explicit stack (numba's cache
    cannot hold recursive functions)."""
    if n <= 128:
        return _pairwise_block(a, lo, n)
    slo = np.empty(64, dtype=np.int64)
    sn = np.empty(64, dtype=np.int64)
    state = np.zeros(64, dtype=np.int64)  # 0: left half not summed yet, 1: right half pending, 2: both done
    left = np.empty(64)
    right = np.empty(64)
    sp = 0
    slo[0], sn[0], state[0] = lo, n, 0
    sp = 1
    total = 0.0
    while sp > 0:
        t = sp - 1
        cn = sn[t]
        if cn <= 128 or state[t] == 2:
            v = _pairwise_block(a, slo[t], cn) if cn <= 128 else left[t] + right[t]
            sp -= 1
            if sp == 0:
                total = v
            elif state[sp - 1] == 1:
                left[sp - 1] = v
            else:
                right[sp - 1] = v
            continue
        n2 = cn // 2
        n2 -= n2 % 8
        if state[t] == 0:
            state[t] = 1
            slo[sp], sn[sp], state[sp] = slo[t], n2, 0
        else:
            state[t] = 2
            slo[sp], sn[sp], state[sp] = slo[t] + n2, cn - n2, 0
        sp += 1
    return total


@njit(cache=True, error_model="numpy", inline="always")
def _np_sum(a):
    """``a.sum()`` of a contiguous 1-D array, bit-identical to numpy (its pairwise summation)."""
    return _pairwise_sum(a, 0, a.shape[0])


@njit(cache=True, error_model="numpy", inline="always")
def _dot(a, b, n, tmp):
    """``(a[:n] * b[:n]).sum()`` as numpy computes it (products, then its pairwise sum); ``tmp`` is scratch."""
    for i in range(n):
        tmp[i] = a[i] * b[i]
    return _pairwise_sum(tmp, 0, n)


@njit(cache=True, error_model="numpy")
def _nmax(a, b):
    """``numpy.maximum`` of two scalars (NaN propagates)."""
    if a != a or b != b:
        return _NAN
    return a if a >= b else b


# ------------------------------------------------------------------------------------------------ checks


@njit(cache=True, error_model="numpy")
def _check_instance(l, lam, C, t, P, L, row):
    """Input checks of instance ``t`` of ``l, λ, C`` ((N, m), (N, m), (N, m, m)); returns a CHECK_* code. ``L`` is an
    (m, m) workspace for the Cholesky factor, ``row`` an (m) one for ``Σλ``."""
    m = l.shape[1]
    for j in range(m):
        v = l[t, j]
        if not (v > 0.0 and v < _INF):
            return CHECK_LOSSES
    for j in range(m):
        v = lam[t, j]
        if not (v > 0.0 and v < _INF):
            return CHECK_PREFS
        row[j] = v
    if abs(_np_sum(row) - 1.0) > P[P_SIMPLEX]:
        return CHECK_PREFS
    cmax = 0.0
    for i in range(m):
        for j in range(m):
            v = C[t, i, j]
            if not (abs(v) < _INF):
                return CHECK_GRAM
            cmax = max(cmax, abs(v))
    scale = max(1.0, cmax)
    rowmax = 0.0
    for i in range(m):
        rs = 0.0
        for j in range(m):
            if abs(C[t, i, j] - C[t, j, i]) > P[P_GRAM] * scale:
                return CHECK_GRAM
            rs += abs(C[t, i, j])
        rowmax = max(rowmax, rs)
    # λ_min(C) >= -δ, δ = GRAM_RTOL·max(1, ‖C‖_∞): a Cholesky factorisation of C + δI proves it.
    delta = P[P_GRAM] * max(1.0, rowmax)
    for j in range(m):
        s = C[t, j, j] + delta
        for u in range(j):
            s -= L[j, u] * L[j, u]
        if not (s > 0.0):
            return CHECK_PSD
        d = math.sqrt(s)
        L[j, j] = d
        for i in range(j + 1, m):
            s = C[t, i, j]
            for u in range(j):
                s -= L[i, u] * L[j, u]
            L[i, j] = s / d
    return CHECK_OK


@njit(cache=True, error_model="numpy")
def check_inputs(l, lam, C, P):
    """Checks of every instance (shapes (N, m), (N, m), (N, m, m)); returns ``(first bad instance or -1, code)``."""
    N, m = l.shape
    L = np.zeros((m, m))
    row = np.empty(m)
    for n in range(N):
        code = _check_instance(l, lam, C, n, P, L, row)
        if code != CHECK_OK:
            return n, code
    return -1, CHECK_OK


# ------------------------------------------------------------------------------------------------ builder


# Rows of the builder's workspace ``w`` (one flat array of ``W_ROWS·m`` entries, row ``r`` at offset ``r·m``: the
# kernels index it instead of taking views, whose reference counting would cost more than the arithmetic).
W_Y, W_LHAT, W_X, W_A, W_RESA, W_T0, W_T1, W_T2, W_CA, W_ERRA = range(10)
W_ROWS = 10


@njit(cache=True, error_model="numpy")
def _preference_parts(l, lam, t, P, w):
    """:class:`sim.preference.PreferenceParts` of instance ``t`` of ``l, λ`` ((N, m)) into the rows of the flat
    workspace ``w``: ``y, lhat, x, A, res_A`` (rows ``W_Y..W_RESA``; ``W_T0..W_T2`` are scratch), ``err_A`` (row
    ``W_ERRA``, the roundoff part of ``res_A``: ``PreferenceParts.adjustment_roundoff``); returns
    ``(beta, spread, beta_resolution)``."""
    m = l.shape[1]
    y, lh, x, A, rA, t0, t1, t2, eA = W_Y * m, W_LHAT * m, W_X * m, W_A * m, W_RESA * m, W_T0 * m, W_T1 * m, \
        W_T2 * m, W_ERRA * m
    tie, eps = P[P_TIE], P[P_EPS]
    # y_j = log(λ_j l_j) - c with exact power-of-two rescaling (_log_weights)
    emax = -(2**62)
    for j in range(m):
        ma, ea = math.frexp(l[t, j])
        mb, eb = math.frexp(lam[t, j])
        w[t0 + j] = ma * mb
        ex = ea + eb
        w[t1 + j] = ex
        emax = max(emax, ex)
    ymax, ymin = -_INF, _INF
    for j in range(m):
        v = math.log(w[t0 + j]) + (w[t1 + j] - emax) * P[P_LN2]
        w[y + j] = v
        ymax = max(ymax, v)
        ymin = min(ymin, v)
    spread = ymax - ymin
    centre = _pairwise_sum(w, y, m) / m if spread <= P[P_CENTRE] else ymax
    for j in range(m):
        w[t0 + j] = w[y + j] - centre  # d
        w[t1 + j] = math.expm1(w[t0 + j])  # u
    S = _pairwise_sum(w, t1, m) / m
    Lg = math.log1p(S)
    for j in range(m):
        w[t1 + j] = 1.0 + w[t1 + j]  # ed
    den = m * (1.0 + S)
    for j in range(m):
        d = w[t0 + j]
        w[lh + j] = math.exp(d) / den  # e^d, as sim.preference: small entries keep their relative accuracy
        w[x + j] = d - Lg
        w[t2 + j] = w[t1 + j] * d
    first = (_pairwise_sum(w, t2, m) / m) / (1.0 + S)
    beta = max(first - Lg, 0.0)
    # A_j = λ_j Σ_k ĺ_k (y_j - y_k); its resolution (PreferenceParts.adjustment_resolution)
    lsum = _pairwise_sum(w, lh, m)
    for j in range(m):
        yj = w[y + j]
        for k in range(m):
            w[t0 + k] = (yj - w[y + k]) * w[lh + k]
        a = _pairwise_sum(w, t0, m)
        for k in range(m):
            w[t0 + k] = abs(yj - w[y + k]) * w[lh + k]
        sp = _pairwise_sum(w, t0, m)
        for k in range(m):
            off = 0.0 if k == j else 1.0
            yk = w[y + k]
            w[t0 + k] = (off * (abs(yj) + abs(yk) + abs(yj - yk))) * w[lh + k]
        rnd = _pairwise_sum(w, t0, m)
        lj = lam[t, j]
        w[A + j] = lj * a
        rest = max(lsum - w[lh + j], 0.0)
        w[rA + j] = lj * (2.0 * tie * (rest + sp) + 4.0 * m * eps * rnd)
        w[eA + j] = lj * (4.0 * m * eps * rnd)
    for j in range(m):
        w[t0 + j] = w[lh + j] * abs(w[x + j] - beta)
    res_beta = tie * _pairwise_sum(w, t0, m) + 8.0 * m * eps * beta
    return beta, spread, res_beta


@njit(cache=True, error_model="numpy")
def _build_instance(l, lam, C, t, eps_mode, restricted, tlog, P, w, c, D, e, active, flags, ft):
    """``sim.direction._build`` for instance ``t`` of ``l, λ, C`` ((N, m), (N, m), (N, m, m)): fills ``c (m),
    D (m+1, m), e (m+1), active (m+1)``, ``J`` and ``J*`` into ``flags[ft, :m]`` and ``flags[ft, m:2m]``, and the
    workspace rows of :func:`_preference_parts` (``A`` in row ``W_A``, ``CA`` in row ``W_CA``); ``tlog``: ``J*``'s
    tolerance in log units ``(widened, exact)`` (``sim.direction._jstar_tol``); returns ``(beta, balance,
    ambiguous)``."""
    m = l.shape[1]
    tie, eps = P[P_TIE], P[P_EPS]
    tw, tx = tlog[0], tlog[1]
    beta, spread, res_beta = _preference_parts(l, lam, t, P, w)
    x, A, rA, eA, tmp, CA = W_X * m, W_A * m, W_RESA * m, W_ERRA * m, W_T0 * m, W_CA * m
    # (R1) on the ray within the resolution: β = 0 and A = 0 exactly.
    if spread <= tie:
        beta = 0.0
        for j in range(m):
            w[A + j] = 0.0
    # (R2) J*: weighted losses within the resolution of the maximum are ties.
    xmax = -_INF
    for j in range(m):
        xmax = max(xmax, w[x + j])
    # Reported: every entry a rule changes, every decision within the resolution band of its threshold.
    amb = spread > 0.0 and spread <= 3.0 * tie
    for j in range(m):
        flags[ft, m + j] = w[x + j] >= xmax - tw
        xg = xmax - w[x + j]
        if xg > tx and xg <= tw + 2.0 * tie:
            amb = True
    # (R3) entries of CA whose computed value does not decide their sign are exactly 0.
    anyJ = False
    anyCA = False
    camax = -_INF
    for i in range(m):
        for j in range(m):
            w[tmp + j] = C[t, i, j] * w[A + j]
        s = _pairwise_sum(w, tmp, m)
        for j in range(m):
            w[tmp + j] = abs(C[t, i, j]) * (w[rA + j] + 4.0 * m * eps * abs(w[A + j]))
        r = _pairwise_sum(w, tmp, m)
        for j in range(m):
            w[tmp + j] = abs(C[t, i, j]) * (w[eA + j] + 4.0 * m * eps * abs(w[A + j]))
        err = _pairwise_sum(w, tmp, m)
        if abs(s) <= err:
            if s != 0.0:
                amb = True
            s = 0.0
        if s != 0.0 and abs(s) <= 3.0 * r:
            amb = True
        w[CA + i] = s
        flags[ft, i] = s > 0.0
        anyJ = anyJ or s > 0.0
        anyCA = anyCA or s != 0.0
        camax = max(camax, s)
    balance = beta > eps_mode
    if beta > 0.0 and abs(beta - eps_mode) <= res_beta:
        amb = True
    # Balancing mode: with J ≠ ∅, rows J̄ ∪ J* (rhs (CA)_j on J̄ ∖ J*, 0 on J*); with J = ∅, all rows, rhs 0.
    bal = balance and anyJ
    for i in range(m):
        js = flags[ft, m + i]
        active[i] = (not bal) or (not flags[ft, i]) or js
        e[i] = w[CA + i] if (bal and not js) else 0.0
        for j in range(m):
            D[i, j] = C[t, i, j]
    # Uniform-descent mode: the restricted LP adds μᵀCA >= min(max CA, 0), left out where CA = 0 (R4).
    active[m] = restricted and (not balance) and anyCA
    e[m] = min(camax, 0.0)
    for j in range(m):
        D[m, j] = w[CA + j]
    for i in range(m + 1):
        if not active[i]:
            for j in range(m):
                D[i, j] = 0.0
            e[i] = -1.0
    for j in range(m):
        if balance:
            c[j] = w[CA + j]
        else:  # C.sum(axis=1): the rows added in order
            s = C[t, 0, j]
            for i in range(1, m):
                s += C[t, i, j]
            c[j] = s
    return beta, balance, amb


@njit(cache=True, error_model="numpy")
def _scale(c, D, e, cs, Ds, es):
    """Rows and objective scaled to max-norm 1 (``sim.direction._scale_lp``)."""
    k, m = D.shape
    for i in range(k):
        r = abs(e[i])
        for j in range(m):
            r = max(r, abs(D[i, j]))
        if r == 0.0:
            r = 1.0
        for j in range(m):
            Ds[i, j] = D[i, j] / r
        es[i] = e[i] / r
    s = 0.0
    for j in range(m):
        s = max(s, abs(c[j]))
    if s == 0.0:
        s = 1.0
    for j in range(m):
        cs[j] = c[j] / s


# ------------------------------------------------------------------------------------------------ simplex


@njit(cache=True, error_model="numpy")
def _dual_simplex(c, D, e, max_iter, bland_after, P, T, basis, prow, f):
    """``sim.direction._dual_simplex`` for one instance (same tableau, same pivots); returns
    ``(code, iterations)`` with code 0 optimal, 1 infeasible, 2 iteration limit. The final tableau stays in ``T``
    (reduced costs in row ``p``, basic values in column ``n``) and the basis in ``basis``."""
    k, m = D.shape
    n, p = m + k, k + 1
    tie, ptol, pivtol, rtie = P[P_TIE], P[P_PRIMAL], P[P_PIVOT], P[P_RATIO]
    cmax = -_INF
    for j in range(m):
        cmax = max(cmax, c[j])
    kstar = 0
    for j in range(m):
        if c[j] >= cmax - tie:
            kstar = j
            break
    T[:, :] = 0.0
    for j in range(m):
        T[0, j] = 1.0
    T[0, n] = 1.0
    for i in range(k):
        dk = D[i, kstar]
        for j in range(m):
            T[1 + i, j] = dk - D[i, j]
        T[1 + i, m + i] = 1.0
        T[1 + i, n] = dk - e[i]
    for j in range(m):
        T[p, j] = c[j] - c[kstar]
    basis[0] = kstar
    for i in range(k):
        basis[1 + i] = m + i

    it = 0
    while it < max_iter:
        vmin = _INF
        for i in range(p):
            vmin = min(vmin, T[i, n])
        done = vmin >= -ptol
        r = 0
        if it >= bland_after:  # Bland: the infeasible basic variable with the smallest index leaves
            best = n + 1
            for i in range(p):
                key = basis[i] if T[i, n] < -ptol else n + 1
                if key < best:
                    best = key
                    r = i
        else:  # Dantzig: the most negative basic variable (ties within TIE_RTOL: the first row)
            thr = -vmin - tie
            for i in range(p):
                if -T[i, n] >= thr:
                    r = i
                    break
        anycand = False
        for j in range(n):
            if T[r, j] < -pivtol:
                anycand = True
                break
        if done:
            return 0, it
        if not anycand:  # a proof of infeasibility, or a violation below the resolution: choose again
            r, rc = _reselect(T, basis, D, e, it >= bland_after, P, f, prow)
            if rc >= 0:
                return rc, it
        rmin = _INF
        for j in range(n):
            if T[r, j] < -pivtol:
                rmin = min(rmin, min(T[p, j], 0.0) / T[r, j])
        lim = rmin + rtie
        q = 0
        for j in range(n):  # ratio ties within _RATIO_TIE: the smallest column index enters
            if T[r, j] < -pivtol and min(T[p, j], 0.0) / T[r, j] <= lim:
                q = j
                break
        piv = T[r, q]
        for j in range(n + 1):
            prow[j] = T[r, j] / piv
        for i in range(p + 1):
            f[i] = T[i, q]
        f[r] -= 1.0
        for i in range(p + 1):
            fi = f[i]
            for j in range(n + 1):
                T[i, j] -= fi * prow[j]
        basis[r] = q
        it += 1
    return 2, it


@njit(cache=True, error_model="numpy")
def _row_state(T, i, U, m, n, ptol, pivtol, tmp):
    """Row ``i`` of the tableau for ``sim.direction._reselect``: 0 feasible, 1 infeasible with a pivot entry,
    2 a proof of infeasibility, 3 infeasible within the resolution (no pivot, no proof)."""
    if not (T[i, n] < -ptol):
        return 0
    for j in range(n):
        if T[i, j] < -pivtol:
            return 1
    for j in range(n):
        tmp[j] = _nmax(-T[i, j], 0.0) * (1.0 if j < m else U[j - m])
    return 2 if T[i, n] + _pairwise_sum(tmp, 0, n) < -ptol else 3


@njit(cache=True, error_model="numpy", inline="always")
def _eligible(T, i, U, m, n, ptol, pivtol, tmp):
    """Row ``i`` may leave: infeasible with a pivot entry, or a proof of infeasibility."""
    st = _row_state(T, i, U, m, n, ptol, pivtol, tmp)
    return st == 1 or st == 2


@njit(cache=True, error_model="numpy")
def _reselect(T, basis, D, e, bland, P, U, tmp):
    """``sim.direction._reselect`` for one instance: ``(row, code)`` with code 1 (infeasible), 0 (no infeasible row
    can pivot) or -1 (continue with ``row``); ``U`` (k) and ``tmp`` (n) are scratch."""
    k, m = D.shape
    n, p = m + k, k + 1
    ptol, pivtol = P[P_PRIMAL], P[P_PIVOT]
    for i in range(k):  # upper bounds of the slacks: s_i <= max_j D_ij - e_i
        dmax = -_INF
        for j in range(m):
            dmax = max(dmax, D[i, j])
        U[i] = _nmax(dmax - e[i], 0.0)
    r = -1
    if bland:  # the eligible row whose basic variable has the smallest index
        best = n + 1
        for i in range(p):
            if _eligible(T, i, U, m, n, ptol, pivtol, tmp) and basis[i] < best:
                best = basis[i]
                r = i
    else:  # Dantzig among the eligible rows (ties within TIE_RTOL: the first row)
        vmin = _INF
        for i in range(p):
            if _eligible(T, i, U, m, n, ptol, pivtol, tmp):
                vmin = min(vmin, T[i, n])
        thr = -vmin - P[P_TIE]
        for i in range(p):
            if -T[i, n] >= thr and _eligible(T, i, U, m, n, ptol, pivtol, tmp):
                r = i
                break
    if r < 0:
        return 0, 0
    return r, (1 if _row_state(T, r, U, m, n, ptol, pivtol, tmp) == 2 else -1)


@njit(cache=True, error_model="numpy")
def _weights_from(xB, basis, m, mu):
    """``sim.direction._weights``: ``μ = max(x_{:m}, 0) / Σ``."""
    for j in range(m):
        mu[j] = 0.0
    for t in range(basis.shape[0]):
        if basis[t] < m:
            mu[basis[t]] = max(xB[t], 0.0)
    s = _np_sum(mu)
    for j in range(m):
        mu[j] = mu[j] / s


@njit(cache=True, error_model="numpy")
def _certificate(c, D, e, mu, y, tmp):
    """KKT residual ``max(max_j (c - Aᵀy)_j, max_i y_i, |cᵀμ - bᵀy|, 0)`` (``sim.direction._certificate``)."""
    k, m = D.shape
    zmax = -_INF
    for j in range(m):
        s = y[1] * D[0, j]  # (y[:, 1:, None] * D).sum(axis=1): the rows added in order
        for i in range(1, k):
            s += y[1 + i] * D[i, j]
        zmax = _nmax(zmax, c[j] - y[0] - s)
    ymax = -_INF
    for i in range(k):
        ymax = _nmax(ymax, y[1 + i])
    cm = _dot(c, mu, m, tmp)
    for i in range(k):
        tmp[i] = e[i] * y[1 + i]
    gap = abs(cm - y[0] - _pairwise_sum(tmp, 0, k))
    return _nmax(_nmax(zmax, ymax), _nmax(gap, 0.0))


@njit(cache=True, error_model="numpy")
def _feasibility(D, e, mu, tmp):
    """``sim.direction._feasibility_residual`` of one instance."""
    k, m = D.shape
    rows = -_INF
    for i in range(k):
        for j in range(m):  # (D[i] * mu).sum(): the products, then numpy's pairwise sum
            tmp[j] = D[i, j] * mu[j]
        rows = _nmax(rows, e[i] - _pairwise_sum(tmp, 0, m))
    mumin = _INF
    for j in range(m):
        mumin = -_nmax(-mumin, -mu[j])
    return _nmax(_nmax(rows, -mumin), _nmax(abs(_np_sum(mu) - 1.0), 0.0))


@njit(cache=True, error_model="numpy")
def _resolve_basis(D, e, basis, B, xB):
    """``B x_B = b`` from the data (``sim.direction._resolve_basis``, the same elimination as
    ``sim.direction._lu_solve``); returns False (and leaves ``xB`` meaningless) where ``B`` is exactly singular."""
    k, m = D.shape
    p = k + 1
    B[:, :] = 0.0
    xB[0] = 1.0
    for i in range(k):
        xB[1 + i] = e[i]
    for t in range(p):
        bt = basis[t]
        if bt < m:
            B[0, t] = 1.0
            for i in range(k):
                B[1 + i, t] = D[i, bt]
        else:
            B[1 + bt - m, t] = -1.0
    singular = False
    for j in range(p):
        piv = j
        best = abs(B[j, j])
        for i in range(j + 1, p):
            if abs(B[i, j]) > best:
                best = abs(B[i, j])
                piv = i
        for t in range(p):
            B[j, t], B[piv, t] = B[piv, t], B[j, t]
        xB[j], xB[piv] = xB[piv], xB[j]
        d = B[j, j]
        if d == 0.0:
            singular = True
            d = 1.0
        for i in range(j + 1, p):
            fi = B[i, j] / d
            for t in range(j + 1, p):
                B[i, t] -= fi * B[j, t]
            xB[i] -= fi * xB[j]
    if singular:
        return False
    for j in range(p - 1, -1, -1):
        s = xB[j]
        for t in range(j + 1, p):
            s -= B[j, t] * xB[t]
        xB[j] = s / B[j, j]
    return True


@njit(cache=True, error_model="numpy")
def _solve_lp(c, D, e, max_iter, P, T, basis, prow, f, y, xB, xr, B, tmp, mu):
    """Dual simplex, recovery and certificate of one scaled LP (``sim.direction._solve_batched`` per instance).

    Returns ``(code, iterations, kkt, unique, feasibility)`` (``feasibility``: :func:`_feasibility` of the
    returned weights, NaN unless code 0); the weights are in ``mu`` (NaN unless code 0)."""
    k, m = D.shape
    n, p = m + k, k + 1
    if max_iter < 0:
        max_iter = 50 * (m + p)
    code, iters = _dual_simplex(c, D, e, max_iter, 4 * p, P, T, basis, prow, f)
    if code != 0:
        for j in range(m):
            mu[j] = _NAN
        return code, iters, _NAN, False, _NAN
    for i in range(k):
        y[1 + i] = T[p, m + i]
    jb = basis[0]
    for t in range(p):
        if basis[t] < m:
            jb = basis[t]
            break
    for i in range(k):
        tmp[i] = y[1 + i] * D[i, jb]
    y[0] = c[jb] - _pairwise_sum(tmp, 0, k)
    for t in range(p):
        xB[t] = T[t, n]
    _weights_from(xB, basis, m, mu)
    feas = _feasibility(D, e, mu, tmp)
    kkt = _nmax(_certificate(c, D, e, mu, y, tmp), feas)
    if kkt > P[P_CERT]:
        if _resolve_basis(D, e, basis, B, xr):  # an exactly singular basis keeps the tableau's weights
            _weights_from(xr, basis, m, mu)
            feas = _feasibility(D, e, mu, tmp)
            kkt = _nmax(_certificate(c, D, e, mu, y, tmp), feas)
    unique = True
    for j in range(n):
        basic = False
        for t in range(p):
            if basis[t] == j:
                basic = True
                break
        if not basic and not (T[p, j] < -P[P_UNIQUE]):
            unique = False
            break
    return code, iters, kkt, unique, feas


# ------------------------------------------------------------------------------------------------ driver


# Columns of the outputs of directions(): floats F (N, 2m+5), flags B (N, 2m+4), integers I (N, 2).
#   F: weights [0, m), adjustment [m, 2m), then gain, beta, objective, feasibility residual, kkt residual.
#   B: J [0, m), J* [m, 2m), then balance, unique, ambiguous, restricted LP infeasible.
#   I: status (index into sim.direction.STATUSES), iterations.
F_GAIN, F_BETA, F_OBJ, F_FEAS, F_KKT = 0, 1, 2, 3, 4  # offsets from 2m
B_BALANCE, B_UNIQUE, B_AMBIGUOUS, B_REDO = 0, 1, 2, 3  # offsets from 2m


@njit(cache=True, error_model="numpy")
def _workspace(m):
    """Scratch arrays, allocated once per batch: the builder's flat workspace ``w`` (rows ``W_*``), vectors ``V``
    (rows: c, c scaled, e, e scaled, pivot row, pivot column, duals, basic values, re-solved values, scratch,
    weights), ``D`` and its scaled copy, the tableau, ``B``, the basis and the active rows."""
    k = m + 1
    n, p = m + k, k + 1
    return (np.empty(W_ROWS * m), np.empty((11, n + 1)), np.empty((k, m)), np.empty((k, m)), np.empty((p + 1, n + 1)),
            np.empty((p, p)), np.empty(p, dtype=np.int64), np.empty(k, dtype=np.bool_))


@njit(cache=True, error_model="numpy")
def instance_loop(l, lam, C, eps_mode, restricted, tlog, policy, max_iter, P, w, V, D, Ds, T, B, basis, active, F,
                  Fl, I):
    """The LP direction of every instance (``sim.direction._finish`` per instance) into its row of the outputs
    ``F, Fl, I`` (column layout above), with the scratch arrays of :func:`_workspace` and the outputs given (no
    checks). The scratch vectors are cut from ``V`` once for the whole batch and every kernel indexes its inputs and
    outputs by instance: no array view is made per instance (each would cost two atomic reference counts)."""
    m = l.shape[1]
    k = m + 1
    p = k + 1
    c, cs, e, es, prow, f, y, xB, xr, tmp, mu = V[0, :m], V[1, :m], V[2, :k], V[3, :k], V[4], V[5, : p + 1], \
        V[6, :p], V[7, :p], V[8, :p], V[9], V[10, :m]
    ca = W_CA * m
    for t in range(l.shape[0]):
        beta, balance, amb = _build_instance(l, lam, C, t, eps_mode, restricted, tlog, P, w, c, D, e, active, Fl, t)
        _scale(c, D, e, cs, Ds, es)
        code, iters, kkt, unique, fe = _solve_lp(cs, Ds, es, max_iter, P, T, basis, prow, f, y, xB, xr, B, tmp, mu)
        st = S_OPTIMAL if code == 0 else (S_INFEASIBLE if code == 1 else S_ITERLIMIT)
        redo = code == 1 and (not balance) and active[m]
        if redo:
            if policy == POLICY_RELAXED:  # drop the restriction row μᵀCA >= min(max CA, 0) and re-solve
                for j in range(m):
                    Ds[m, j] = 0.0
                es[m] = -1.0
                code2, it2, kkt, unique, fe = _solve_lp(cs, Ds, es, max_iter, P, T, basis, prow, f, y, xB, xr, B,
                                                        tmp, mu)
                iters += it2
                st = S_RELAXED if code2 == 0 else S_INFEASIBLE
            elif policy == POLICY_FALLBACK:  # the EPO training scripts' μ = λ / Σλ
                s = _np_sum(lam[t])
                for j in range(m):
                    mu[j] = lam[t, j] / s
                kkt = _NAN
                unique = False
                st = S_FALLBACK
                fe = _feasibility(Ds, es, mu, tmp)
        solved = True
        for j in range(m):
            if not (abs(mu[j]) < _INF):
                solved = False
        if solved:
            for j in range(m):  # _dot(mu, CA)
                tmp[j] = mu[j] * w[ca + j]
            g = _pairwise_sum(tmp, 0, m)
            ob = _dot(mu, c, m, tmp)
        else:
            g = ob = fe = _NAN
        for j in range(m):
            F[t, j] = mu[j]
            F[t, m + j] = w[W_A * m + j]
        F[t, 2 * m + F_GAIN] = g
        F[t, 2 * m + F_BETA] = beta
        F[t, 2 * m + F_OBJ] = ob
        F[t, 2 * m + F_FEAS] = fe
        F[t, 2 * m + F_KKT] = kkt
        Fl[t, 2 * m + B_BALANCE] = balance
        Fl[t, 2 * m + B_UNIQUE] = unique and solved
        Fl[t, 2 * m + B_AMBIGUOUS] = amb
        Fl[t, 2 * m + B_REDO] = redo
        I[t, 0] = st
        I[t, 1] = iters


@njit(cache=True, error_model="numpy")
def directions(l, lam, C, eps_mode, restricted, tlog, policy, max_iter, P, check):
    """Every instance of ``(l, λ, C)`` (shapes (N, m), (N, m), (N, m, m), C-contiguous float64).

    With ``check``, the inputs are checked first (:func:`check_inputs`) and ``λ`` is renormalised. Returns
    ``(bad, code, F, Fl, I)``: ``bad`` is the first instance that failed a check (-1: none; then nothing was solved
    and the outputs are empty) with its CHECK_* ``code``; ``F, Fl, I`` hold the results (column layout above).
    """
    N, m = l.shape
    if check:
        bad, code = check_inputs(l, lam, C, P)
        if bad >= 0:
            return bad, code, np.empty((0, 2 * m + 5)), np.empty((0, 2 * m + 4), dtype=np.bool_), \
                np.empty((0, 2), dtype=np.int64)
        lam = lam.copy()
        flat = lam.reshape(N * m)
        for t in range(N):
            s = _pairwise_sum(flat, t * m, m)  # _np_sum(lam[t])
            for j in range(m):
                lam[t, j] = lam[t, j] / s
    F = np.empty((N, 2 * m + 5))
    Fl = np.empty((N, 2 * m + 4), dtype=np.bool_)
    I = np.empty((N, 2), dtype=np.int64)
    w, V, D, Ds, T, B, basis, active = _workspace(m)
    instance_loop(l, lam, C, eps_mode, restricted, tlog, policy, max_iter, P, w, V, D, Ds, T, B, basis, active, F,
                  Fl, I)
    return -1, CHECK_OK, F, Fl, I


@njit(cache=True, error_model="numpy")
def build_lps(l, lam, C, eps_mode, restricted, tlog, P):
    """The compiled builder alone, batched: ``(c, D, e, active, beta, A, CA, J, J*, balance, ambiguous)`` as
    ``sim.direction._build`` returns them (for the twin tests)."""
    N, m = l.shape
    k = m + 1
    c, D, e = np.empty((N, m)), np.empty((N, k, m)), np.empty((N, k))
    active = np.empty((N, k), dtype=np.bool_)
    beta, A, CA = np.empty(N), np.empty((N, m)), np.empty((N, m))
    flags = np.empty((N, 2 * m), dtype=np.bool_)  # J, J*
    balance, amb = np.empty(N, dtype=np.bool_), np.empty(N, dtype=np.bool_)
    w = np.empty(W_ROWS * m)
    for t in range(N):
        beta[t], balance[t], amb[t] = _build_instance(l, lam, C, t, eps_mode, restricted, tlog, P, w, c[t], D[t],
                                                      e[t], active[t], flags, t)
        for j in range(m):
            A[t, j] = w[W_A * m + j]
            CA[t, j] = w[W_CA * m + j]
    return c, D, e, active, beta, A, CA, flags[:, :m], flags[:, m:], balance, amb


@njit(cache=True, error_model="numpy")
def solve_lps(c, D, e, max_iter, P):
    """The compiled solver alone on scaled LP data (shapes (N, m), (N, m+1, m), (N, m+1)), as
    ``sim.direction._solve_batched`` (for the twin tests): ``(weights, code, iterations, kkt, unique, basis)``
    with code 0 optimal, 1 infeasible, 2 iteration limit; ``max_iter < 0``: the default ``50·(2m+2)``."""
    N, k, m = D.shape
    n, p = m + k, k + 1
    mu = np.empty((N, m))
    code = np.empty(N, dtype=np.int8)
    iters = np.empty(N, dtype=np.int64)
    kkt = np.empty(N)
    unique = np.empty(N, dtype=np.bool_)
    basis = np.empty((N, p), dtype=np.int64)
    T, prow, f, y = np.empty((p + 1, n + 1)), np.empty(n + 1), np.empty(p + 1), np.empty(p)
    xB, xr, B, tmp = np.empty(p), np.empty(p), np.empty((p, p)), np.empty(p)
    for t in range(N):
        code[t], iters[t], kkt[t], unique[t], _ = _solve_lp(c[t], D[t], e[t], max_iter, P, T, basis[t], prow, f, y,
                                                             xB, xr, B, tmp, mu[t])
    return mu, code, iters, kkt, unique, basis
