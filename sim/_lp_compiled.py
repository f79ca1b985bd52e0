r"""Compiled twin of the EPO direction LP kernel (numba, ``cache=True``); the numpy code of :mod:`sim.direction`
is the reference and :mod:`sim.direction` is the only entry point (``lp_direction(..., backend="compiled")``).

This module performs, instance by instance, the rounded operations the numpy reference performs on a whole batch;
the checks and the builder run on blocks of 64 instances, one SIMD lane per instance (so per instance the same
operations in the same order: a result does not depend on the batch around it), the solver one instance at a time:

* the input checks of :mod:`sim.preference`, ``O(m³)`` flops per instance (finite and positive
  losses and preferences, ``|Σλ - 1| <= SIMPLEX_ATOL`` with ``λ`` then renormalised, a finite symmetric Gram matrix
  with ``C + δI`` Cholesky-factorisable). An instance that fails any of them is reported to the caller, which runs
  the numpy checks to name the bad value (and to decide the rare semi-definite case that needs eigenvalues);
* :class:`sim.preference.PreferenceParts` (``β``, ``A``, ``x = log(m ĺ)``, the spread, the resolutions of ``β``
  and ``A``) and the LP data builder ``sim.direction._build`` with the resolution rules (R1)-(R5), as stated in
  the docstring of :mod:`sim.direction`;
* the row scaling, the dual simplex (same start vertex, same Dantzig/Bland pivot rules, same tie breaking, same
  tolerances, same proof of infeasibility, so the same pivot sequence and verdict), the recovery of the weights
  with their certificate, the re-solve of an uncertified basis from the data, the post-solve check
  (in :func:`_feasibility`) and the ``on_infeasible`` policy.

The simplex is bit-identical to the numpy reference on the same LP data (the tableau update is the same sequence
of rounded operations), and so is the builder: sums over the objective axis follow numpy's pairwise order, and
``math.log``/``exp``/``expm1``/``log1p`` compile to calls of the C math library, which the reference calls too
(:func:`sim.roundoff.libm`; numpy's own SIMD ufuncs differ from it in the last bit). So both backends return the same
bits, hence the same status and flags, on every instance, however ill-conditioned.

Nothing here is public: constants are passed in by :mod:`sim.direction` (numba freezes module globals at compile
time and its cache would not see them change), so every tolerance is defined once, in :mod:`sim.direction`,
:mod:`sim.preference` and :mod:`sim.roundoff`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# Indices into the parameter vector built by sim.direction._compiled_params().
P_TIE, P_EPS, P_PRIMAL, P_PIVOT, P_RATIO, P_CERT, P_UNIQUE, P_SIMPLEX, P_GRAM, P_LN2, P_CENTRE, P_FEAS = range(12)
N_PARAMS = 12

# Status codes: indices into sim.direction.STATUSES.
S_OPTIMAL, S_RELAXED, S_FALLBACK, S_INFEASIBLE, S_ITERLIMIT = 0, 1, 2, 3, 4
# on_infeasible policies.
POLICY_RELAXED, POLICY_FALLBACK, POLICY_RAISE = 0, 1, 2
# Input check failures (the caller names the value with the numpy checks); CHECK_OVERFLOW: the LP data built from
# finite inputs are not finite (C·A or Σ_i C_ij overflow float64), found by the builder.
CHECK_OK, CHECK_LOSSES, CHECK_PREFS, CHECK_GRAM, CHECK_PSD, CHECK_OVERFLOW = 0, 1, 2, 3, 4, 5

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


@njit(cache=True, error_model="numpy", inline="always")
def _nmax(a, b):
    """``numpy.maximum`` of two scalars (NaN propagates)."""
    if a != a or b != b:
        return _NAN
    return a if a >= b else b


# ------------------------------------------------------------------------------------------------ checks


@njit(cache=True, error_model="numpy")
def _check_block(l, lam, C, t0, nb, P, L, W, code):
    """Input checks of the instances ``t0 .. t0+nb-1`` of ``l, λ, C`` ((N, m), (N, m), (N, m, m)), one SIMD lane per
    instance: ``code[b]`` is the CHECK_* code of instance ``t0 + b``, the first check it fails in the order losses,
    preferences (positive, finite, ``|Σλ - 1| <= SIMPLEX_ATOL``), Gram entries (finite, symmetric), positive
    semi-definiteness. ``L`` (m·m, BLOCK) holds the Cholesky factors, ``W`` (4, BLOCK) scalars per lane."""
    m = l.shape[1]
    SUM, CMAX, ROWMAX, RS = 0, 1, 2, 3
    for b in range(nb):
        code[b] = CHECK_OK
        W[SUM, b] = 0.0
        W[CMAX, b] = 0.0
        W[ROWMAX, b] = 0.0
    for b in range(nb):
        t = t0 + b
        for j in range(m):
            v = l[t, j]
            if not (v > 0.0 and v < _INF):
                code[b] = CHECK_LOSSES
    for j in range(m):  # Σλ in order (numpy's sum below 8 terms); longer: numpy's pairwise order below
        for b in range(nb):
            v = lam[t0 + b, j]
            if not (v > 0.0 and v < _INF) and code[b] == CHECK_OK:
                code[b] = CHECK_PREFS
            W[SUM, b] += v
    for b in range(nb):
        if m >= 8:
            W[SUM, b] = _np_sum(lam[t0 + b])
        if abs(W[SUM, b] - 1.0) > P[P_SIMPLEX] and code[b] == CHECK_OK:
            code[b] = CHECK_PREFS
    for i in range(m):
        for j in range(m):
            for b in range(nb):
                v = C[t0 + b, i, j]
                if not (abs(v) < _INF) and code[b] == CHECK_OK:
                    code[b] = CHECK_GRAM
                W[CMAX, b] = max(W[CMAX, b], abs(v))
    for i in range(m):
        for b in range(nb):
            W[RS, b] = 0.0
        for j in range(m):
            for b in range(nb):
                t = t0 + b
                if abs(C[t, i, j] - C[t, j, i]) > P[P_GRAM] * max(1.0, W[CMAX, b]) and code[b] == CHECK_OK:
                    code[b] = CHECK_GRAM
                W[RS, b] += abs(C[t, i, j])
        for b in range(nb):
            W[ROWMAX, b] = max(W[ROWMAX, b], W[RS, b])
    # λ_min(C) >= -δ, δ = GRAM_RTOL·max(1, ‖C‖_∞): a Cholesky factorisation of C + δI proves it.
    for j in range(m):
        for b in range(nb):
            s = C[t0 + b, j, j] + P[P_GRAM] * max(1.0, W[ROWMAX, b])
            for u in range(j):
                s -= L[j * m + u, b] * L[j * m + u, b]
            if not (s > 0.0):  # the lane fails here (if it has not failed before); its factor is not used
                if code[b] == CHECK_OK:
                    code[b] = CHECK_PSD
                s = 1.0
            L[j * m + j, b] = math.sqrt(s)
        for i in range(j + 1, m):
            for b in range(nb):
                s = C[t0 + b, i, j]
                for u in range(j):
                    s -= L[i * m + u, b] * L[j * m + u, b]
                L[i * m + j, b] = s / L[j * m + j, b]


@njit(cache=True, error_model="numpy")
def check_inputs(l, lam, C, P):
    """Checks of every instance (shapes (N, m), (N, m), (N, m, m)), a block at a time (:func:`_check_block`);
    returns ``(first bad instance or -1, code)``."""
    N, m = l.shape
    width = max(1, min(N, BLOCK))  # a single instance: no block-sized scratch
    L, W = np.zeros((m * m, width)), np.zeros((4, width))
    code = np.empty(width, dtype=np.int64)
    for t0 in range(0, N, width):
        nb = min(width, N - t0)
        _check_block(l, lam, C, t0, nb, P, L, W, code)
        for b in range(nb):
            if code[b] != CHECK_OK:
                return t0 + b, code[b]
    return -1, CHECK_OK


# ------------------------------------------------------------------------------------------------ builder


# The builder runs on blocks of up to BLOCK instances at once: its scratch ``S`` holds one row per quantity (per
# objective j: row ``R_*·m + j``; the Gram entries: row ``R_C·m + i·m + j``; per instance: rows ``Q_*`` after them)
# and one column per instance of the block, so that every step of the preference parts and of the resolution rules is a
# loop over the instances (SIMD lanes) performing, per instance, the rounded operations of sim.direction._build in
# its order. Sums over the objective axis are numpy's: below 8 terms added in order (lane by lane), longer ones by
# numpy's pairwise order (_pairwise_sum_long, per instance). The result of an instance does not depend on its block.
BLOCK = 64
R_L, R_LAM, R_Y, R_LH, R_X, R_A, R_RA, R_EA, R_D, R_U, R_T, R_CA, R_C = range(13)
(Q_EMAX, Q_YMAX, Q_YMIN, Q_SPREAD, Q_CENTRE, Q_S, Q_LG, Q_DEN, Q_BETA, Q_LSUM, Q_SUM, Q_SP, Q_RND, Q_RESB, Q_XMAX,
 Q_CAMAX, Q_R, Q_ERR) = range(18)
N_Q = 18
# Flag rows of the block: ambiguous, J ≠ ∅, CA ≠ 0, balancing mode, then J (m rows) and J* (m rows).
G_AMB, G_ANYJ, G_ANYCA, G_BAL, G_J = range(5)


@njit(cache=True, error_model="numpy")
def _block_scratch(m, width):
    """The builder's block scratch for blocks of ``width`` instances: ``S`` (rows above, width) and the flags ``G``
    (4 + 2m, width)."""
    return np.empty(((R_C + m) * m + N_Q, width)), np.empty((G_J + 2 * m, width), dtype=np.bool_)


@njit(cache=True, error_model="numpy")
def _lane_sum(S, r0, n, nb, out, vec):
    """``S[out, b]`` = numpy's sum of ``S[r0 : r0 + n, b]`` for the lanes ``b < nb`` (``vec``: n scratch)."""
    if n < 8:
        for b in range(nb):
            S[out, b] = 0.0
        for j in range(n):
            for b in range(nb):
                S[out, b] += S[r0 + j, b]
    else:
        for b in range(nb):
            for j in range(n):
                vec[j] = S[r0 + j, b]
            S[out, b] = _pairwise_sum_long(vec, 0, n)


@njit(cache=True, error_model="numpy")
def _build_block(l, lam, C, t0, nb, eps_mode, tlog, P, S, G, vec):
    """:class:`sim.preference.PreferenceParts` and the resolution rules (R1)-(R3) of ``sim.direction._build`` for
    the instances ``t0 .. t0+nb-1`` of ``l, λ, C`` ((N, m), (N, m), (N, m, m)), into the block scratch ``S, G``
    (lane ``b``: instance ``t0 + b``): ``β`` (row ``Q_BETA``), ``A`` (rows ``R_A``), ``CA`` (rows ``R_CA``), its
    maximum (``Q_CAMAX``), ``J``, ``J*``, the mode and ``ambiguous`` (flags ``G``); ``tlog``: ``J*``'s tolerance in
    log units ``(widened, exact)`` (``sim.direction._jstar_tol``); ``vec``: m scratch."""
    m = l.shape[1]
    tie, eps, ln2 = P[P_TIE], P[P_EPS], P[P_LN2]
    tw, tx = tlog[0], tlog[1]
    rl, rlam, y, lh, x, A, rA, eA, d, u, tm, CA, rc = R_L * m, R_LAM * m, R_Y * m, R_LH * m, R_X * m, R_A * m, \
        R_RA * m, R_EA * m, R_D * m, R_U * m, R_T * m, R_CA * m, R_C * m
    q = rc + m * m
    EMAX, YMAX, YMIN, SPREAD, CENTRE, SS, LG, DEN, BETA = q + Q_EMAX, q + Q_YMAX, q + Q_YMIN, q + Q_SPREAD, \
        q + Q_CENTRE, q + Q_S, q + Q_LG, q + Q_DEN, q + Q_BETA
    LSUM, SUM, SP, RND, RESB, XMAX, CAMAX, RR, ERR = q + Q_LSUM, q + Q_SUM, q + Q_SP, q + Q_RND, q + Q_RESB, \
        q + Q_XMAX, q + Q_CAMAX, q + Q_R, q + Q_ERR
    J, JS = G_J, G_J + m
    for b in range(nb):  # the block's data, one column per instance
        t = t0 + b
        for j in range(m):
            S[rl + j, b] = l[t, j]
            S[rlam + j, b] = lam[t, j]
        for i in range(m):
            for j in range(m):
                S[rc + i * m + j, b] = C[t, i, j]
    # y_j = log(λ_j l_j) - c with exact power-of-two rescaling (sim.preference._log_weights)
    for b in range(nb):
        S[EMAX, b] = -(2.0**62)
    for j in range(m):
        for b in range(nb):
            ma, ea = math.frexp(S[rl + j, b])
            mb, eb = math.frexp(S[rlam + j, b])
            S[d + j, b] = ma * mb
            ex = ea + eb
            S[u + j, b] = ex
            S[EMAX, b] = max(S[EMAX, b], S[u + j, b])
    for b in range(nb):
        S[YMAX, b] = -_INF
        S[YMIN, b] = _INF
    for j in range(m):
        for b in range(nb):
            v = math.log(S[d + j, b]) + (S[u + j, b] - S[EMAX, b]) * ln2
            S[y + j, b] = v
            S[YMAX, b] = max(S[YMAX, b], v)
            S[YMIN, b] = min(S[YMIN, b], v)
    _lane_sum(S, y, m, nb, CENTRE, vec)
    for b in range(nb):
        S[SPREAD, b] = S[YMAX, b] - S[YMIN, b]
        S[CENTRE, b] = S[CENTRE, b] / m if S[SPREAD, b] <= P[P_CENTRE] else S[YMAX, b]
    for j in range(m):
        for b in range(nb):
            dv = S[y + j, b] - S[CENTRE, b]
            S[d + j, b] = dv
            S[u + j, b] = math.expm1(dv)
    _lane_sum(S, u, m, nb, SS, vec)
    for b in range(nb):
        S[SS, b] = S[SS, b] / m
        S[LG, b] = math.log1p(S[SS, b])
        S[DEN, b] = m * (1.0 + S[SS, b])
    for j in range(m):
        for b in range(nb):
            dv = S[d + j, b]
            ed = 1.0 + S[u + j, b]
            S[lh + j, b] = math.exp(dv) / S[DEN, b]  # e^d, as sim.preference: small entries keep their accuracy
            S[x + j, b] = dv - S[LG, b]
            S[tm + j, b] = ed * dv
    _lane_sum(S, tm, m, nb, SUM, vec)
    for b in range(nb):
        first = (S[SUM, b] / m) / (1.0 + S[SS, b])
        S[BETA, b] = max(first - S[LG, b], 0.0)
    # A_j = λ_j Σ_k ĺ_k (y_j - y_k); its resolution (PreferenceParts.adjustment_resolution) and roundoff
    _lane_sum(S, lh, m, nb, LSUM, vec)
    for j in range(m):
        for k in range(m):
            for b in range(nb):
                S[tm + k, b] = (S[y + j, b] - S[y + k, b]) * S[lh + k, b]
        _lane_sum(S, tm, m, nb, SUM, vec)
        for k in range(m):
            for b in range(nb):
                S[tm + k, b] = abs(S[y + j, b] - S[y + k, b]) * S[lh + k, b]
        _lane_sum(S, tm, m, nb, SP, vec)
        for k in range(m):
            off = 0.0 if k == j else 1.0
            for b in range(nb):
                yj, yk = S[y + j, b], S[y + k, b]
                S[tm + k, b] = (off * (abs(yj) + abs(yk) + abs(yj - yk))) * S[lh + k, b]
        _lane_sum(S, tm, m, nb, RND, vec)
        for b in range(nb):
            lj = S[rlam + j, b]
            S[A + j, b] = lj * S[SUM, b]
            rest = max(S[LSUM, b] - S[lh + j, b], 0.0)
            S[rA + j, b] = lj * (2.0 * tie * (rest + S[SP, b]) + 4.0 * m * eps * S[RND, b])
            S[eA + j, b] = lj * (4.0 * m * eps * S[RND, b])
    for j in range(m):
        for b in range(nb):
            S[tm + j, b] = S[lh + j, b] * abs(S[x + j, b] - S[BETA, b])
    _lane_sum(S, tm, m, nb, RESB, vec)
    for b in range(nb):
        S[RESB, b] = tie * S[RESB, b] + 8.0 * m * eps * S[BETA, b]
    # (R1) on the ray within the resolution: β = 0 and A = 0 exactly.
    for b in range(nb):
        sp = S[SPREAD, b]
        if sp <= tie:
            S[BETA, b] = 0.0
        # Reported: every entry a rule changes, every decision within the resolution band of its threshold.
        G[G_AMB, b] = sp > 0.0 and sp <= 3.0 * tie
        S[XMAX, b] = -_INF
    for j in range(m):
        for b in range(nb):
            if S[SPREAD, b] <= tie:
                S[A + j, b] = 0.0
            S[XMAX, b] = max(S[XMAX, b], S[x + j, b])
    # (R2) J*: weighted losses within the resolution of the maximum are ties.
    for j in range(m):
        for b in range(nb):
            G[JS + j, b] = S[x + j, b] >= S[XMAX, b] - tw
            xg = S[XMAX, b] - S[x + j, b]
            if xg > tx and xg <= tw + 2.0 * tie:
                G[G_AMB, b] = True
    # (R3) entries of CA whose computed value does not decide their sign are exactly 0.
    for b in range(nb):
        G[G_ANYJ, b] = False
        G[G_ANYCA, b] = False
        S[CAMAX, b] = -_INF
    for i in range(m):
        ci = rc + i * m
        for j in range(m):
            for b in range(nb):
                S[tm + j, b] = S[ci + j, b] * S[A + j, b]
        _lane_sum(S, tm, m, nb, SUM, vec)
        for j in range(m):
            for b in range(nb):
                S[tm + j, b] = abs(S[ci + j, b]) * (S[rA + j, b] + 4.0 * m * eps * abs(S[A + j, b]))
        _lane_sum(S, tm, m, nb, RR, vec)
        for j in range(m):
            for b in range(nb):
                S[tm + j, b] = abs(S[ci + j, b]) * (S[eA + j, b] + 4.0 * m * eps * abs(S[A + j, b]))
        _lane_sum(S, tm, m, nb, ERR, vec)
        for b in range(nb):
            s = S[SUM, b]
            if abs(s) <= S[ERR, b]:
                if s != 0.0:
                    G[G_AMB, b] = True
                s = 0.0
            if s != 0.0 and abs(s) <= 3.0 * S[RR, b]:
                G[G_AMB, b] = True
            S[CA + i, b] = s
            G[J + i, b] = s > 0.0
            G[G_ANYJ, b] = G[G_ANYJ, b] or s > 0.0
            G[G_ANYCA, b] = G[G_ANYCA, b] or s != 0.0
            S[CAMAX, b] = max(S[CAMAX, b], s)
    for b in range(nb):
        beta = S[BETA, b]
        G[G_BAL, b] = beta > eps_mode
        if beta > 0.0 and abs(beta - eps_mode) <= S[RESB, b]:
            G[G_AMB, b] = True


@njit(cache=True, error_model="numpy", inline="always")
def _lp_rows(C, t, S, G, b, restricted, c, D, e, active):
    """The LP data of instance ``t`` (lane ``b`` of the block built by :func:`_build_block`): ``c (m), D (m+1, m),
    e (m+1), active (m+1)`` as ``sim.direction._build`` builds them."""
    m = C.shape[1]
    CA = R_CA * m
    balance = G[G_BAL, b]
    # Balancing mode: with J ≠ ∅, rows J̄ ∪ J* (rhs (CA)_j on J̄ ∖ J*, 0 on J*); with J = ∅, all rows, rhs 0.
    bal = balance and G[G_ANYJ, b]
    for i in range(m):
        js = G[G_J + m + i, b]
        active[i] = (not bal) or (not G[G_J + i, b]) or js
        e[i] = S[CA + i, b] if (bal and not js) else 0.0
        for j in range(m):
            D[i, j] = C[t, i, j]
    # Uniform-descent mode: the restricted LP adds μᵀCA >= min(max CA, 0), left out where CA = 0 (R4).
    active[m] = restricted and (not balance) and G[G_ANYCA, b]
    e[m] = min(S[R_C * m + m * m + Q_CAMAX, b], 0.0)
    for j in range(m):
        D[m, j] = S[CA + j, b]
    for i in range(m + 1):
        if not active[i]:
            for j in range(m):
                D[i, j] = 0.0
            e[i] = -1.0
    for j in range(m):
        if balance:
            c[j] = S[CA + j, b]
        else:  # C.sum(axis=1): the rows added in order
            s = C[t, 0, j]
            for i in range(1, m):
                s += C[t, i, j]
            c[j] = s


@njit(cache=True, error_model="numpy", inline="always")
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


@njit(cache=True, error_model="numpy", inline="always")
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


@njit(cache=True, error_model="numpy", inline="always")
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


@njit(cache=True, error_model="numpy", inline="always")
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


@njit(cache=True, error_model="numpy", inline="always")
def _feasibility(D, e, mu, rtol, tmp):
    """``sim.direction._feasibility_residual`` of one instance, and in the same pass the post-solve check
    ``sim.direction._uncertified`` (some row has ``e_j - D_j μ > rtol·(max_k |D_jk|·Σ_k μ_k + |e_j|)``): returns
    ``(residual, uncertified)`` with the same rounded operations as the two numpy functions."""
    k, m = D.shape
    s = _np_sum(mu)
    rows = -_INF
    uncertified = False
    for i in range(k):
        dmax = 0.0
        for j in range(m):  # (D[i] * mu).sum(): the products, then numpy's pairwise sum
            tmp[j] = D[i, j] * mu[j]
            dmax = max(dmax, abs(D[i, j]))
        v = e[i] - _pairwise_sum(tmp, 0, m)
        rows = _nmax(rows, v)
        if v > rtol * (dmax * s + abs(e[i])):
            uncertified = True
    mumin = _INF
    for j in range(m):
        mumin = -_nmax(-mumin, -mu[j])
    return _nmax(_nmax(rows, -mumin), _nmax(abs(s - 1.0), 0.0)), uncertified


@njit(cache=True, error_model="numpy", inline="always")
def _loosened(D, e, rtol, out):
    """``sim.direction._loosened`` of one instance into ``out``: ``e_i - rtol·(max_j |D_ij| + |e_i|)``."""
    k, m = D.shape
    for i in range(k):
        dmax = 0.0
        for j in range(m):
            dmax = max(dmax, abs(D[i, j]))
        out[i] = e[i] - rtol * (dmax + abs(e[i]))


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

    Returns ``(code, iterations, kkt, unique, feasibility, uncertified)`` (:func:`_feasibility` of the returned
    weights: NaN and False unless code 0); the weights are in ``mu`` (NaN unless code 0).

    Not inlined (unlike the short helpers): :func:`instance_loop` calls it at two places, and inlining it there
    (with :func:`_dual_simplex` inside) made the first compilation of :func:`directions` 60 CPU-s instead of 37,
    for no measurable gain per instance (``make bench``, AMD EPYC, 2026-12-02)."""
    k, m = D.shape
    n, p = m + k, k + 1
    if max_iter < 0:
        max_iter = 50 * (m + p)
    code, iters = _dual_simplex(c, D, e, max_iter, 4 * p, P, T, basis, prow, f)
    if code != 0:
        for j in range(m):
            mu[j] = _NAN
        return code, iters, _NAN, False, _NAN, False
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
    feas, uncertified = _feasibility(D, e, mu, P[P_FEAS], tmp)
    kkt = _nmax(_certificate(c, D, e, mu, y, tmp), feas)
    if kkt > P[P_CERT]:
        if _resolve_basis(D, e, basis, B, xr):  # an exactly singular basis keeps the tableau's weights
            _weights_from(xr, basis, m, mu)
            feas, uncertified = _feasibility(D, e, mu, P[P_FEAS], tmp)
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
    return code, iters, kkt, unique, feas, uncertified


# ------------------------------------------------------------------------------------------------ driver


# Columns of the outputs of directions(): floats F (N, 2m+5), flags B (N, 2m+4), integers I (N, 2).
#   F: weights [0, m), adjustment [m, 2m), then gain, beta, objective, feasibility residual, kkt residual.
#   B: J [0, m), J* [m, 2m), then balance, unique, ambiguous, restricted LP infeasible.
#   I: status (index into sim.direction.STATUSES), iterations.
F_GAIN, F_BETA, F_OBJ, F_FEAS, F_KKT = 0, 1, 2, 3, 4  # offsets from 2m
B_BALANCE, B_UNIQUE, B_AMBIGUOUS, B_REDO = 0, 1, 2, 3  # offsets from 2m


@njit(cache=True, error_model="numpy")
def _workspace(m, width=BLOCK):
    """Scratch arrays, allocated once per batch: the builder's block scratch ``S, G`` for blocks of ``width``
    instances (:func:`_block_scratch`),
    vectors ``V`` (rows: c, c scaled, e, e scaled, pivot row, pivot column, duals, basic values, re-solved values,
    scratch, weights, loosened right-hand sides), ``D`` and its scaled copy, the tableau, ``B``, the basis and the active rows."""
    k = m + 1
    n, p = m + k, k + 1
    S, G = _block_scratch(m, width)
    return (S, G, np.empty((12, n + 1)), np.empty((k, m)), np.empty((k, m)), np.empty((p + 1, n + 1)),
            np.empty((p, p)), np.empty(p, dtype=np.int64), np.empty(k, dtype=np.bool_))


@njit(cache=True, error_model="numpy")
def instance_loop(l, lam, C, eps_mode, restricted, tlog, policy, max_iter, P, S, G, V, D, Ds, T, B, basis, active,
                  F, Fl, I):
    """The LP direction of every instance (``sim.direction._finish`` per instance) into its row of the outputs
    ``F, Fl, I`` (column layout above), with the scratch arrays of :func:`_workspace` and the outputs given (no
    checks). The LP data are built a block of instances at a time (:func:`_build_block`), then each LP is scaled,
    solved and certified. The scratch vectors are cut from ``V`` once for the whole batch and every kernel indexes its
    inputs and outputs by instance: no array view is made per instance (each would cost two atomic reference
    counts). Returns -1, or the first instance whose LP data (``CA``, ``c``) are not finite: the outputs are then
    filled up to that instance only."""
    N, m = l.shape
    k = m + 1
    p = k + 1
    c, cs, e, es, prow, f, y, xB, xr, tmp, mu = V[0, :m], V[1, :m], V[2, :k], V[3, :k], V[4], V[5, : p + 1], \
        V[6, :p], V[7, :p], V[8, :p], V[9], V[10, :m]
    el = V[11, :k]  # right-hand sides loosened by the post-solve check's tolerance
    ra, ca, beta_row = R_A * m, R_CA * m, R_C * m + m * m + Q_BETA
    width = S.shape[1]  # instances per block
    for t0 in range(0, N, width):
        nb = min(width, N - t0)
        _build_block(l, lam, C, t0, nb, eps_mode, tlog, P, S, G, tmp)
        for b in range(nb):
            t = t0 + b
            _lp_rows(C, t, S, G, b, restricted, c, D, e, active)
            for j in range(m):
                if not (abs(c[j]) < _INF and abs(S[ca + j, b]) < _INF):
                    return t
            balance = G[G_BAL, b]
            _scale(c, D, e, cs, Ds, es)
            code, iters, kkt, unique, fe, unc = _solve_lp(cs, Ds, es, max_iter, P, T, basis, prow, f, y, xB, xr, B, tmp,
                                                     mu)
            st = S_OPTIMAL if code == 0 else (S_INFEASIBLE if code == 1 else S_ITERLIMIT)
            undecided = False
            if code == 1:  # a verdict of infeasibility is decided only where no point passes the post-solve check
                _loosened(Ds, es, P[P_FEAS], el)
                undecided = _solve_lp(cs, Ds, el, max_iter, P, T, basis, prow, f, y, xB, xr, B, tmp, mu)[0] == 0
                for j in range(m):
                    mu[j] = _NAN
            redo = code == 1 and (not balance) and active[m]
            if redo:
                if policy == POLICY_RELAXED:  # drop the restriction row μᵀCA >= min(max CA, 0) and re-solve
                    for j in range(m):
                        Ds[m, j] = 0.0
                    es[m] = -1.0
                    code2, it2, kkt, unique, fe, unc = _solve_lp(cs, Ds, es, max_iter, P, T, basis, prow, f, y, xB, xr,
                                                            B, tmp, mu)
                    iters += it2
                    st = S_RELAXED if code2 == 0 else S_INFEASIBLE
                elif policy == POLICY_FALLBACK:  # the EPO training scripts' μ = λ / Σλ
                    s = _np_sum(lam[t])
                    for j in range(m):
                        mu[j] = lam[t, j] / s
                    kkt = _NAN
                    unique = False
                    st = S_FALLBACK
                    fe = _feasibility(Ds, es, mu, P[P_FEAS], tmp)[0]
            solved = True
            for j in range(m):
                if not (abs(mu[j]) < _INF):
                    solved = False
            if solved:
                for j in range(m):  # _dot(mu, CA)
                    tmp[j] = mu[j] * S[ca + j, b]
                g = _pairwise_sum(tmp, 0, m)
                ob = _dot(mu, c, m, tmp)
            else:
                g = ob = fe = _NAN
            for j in range(m):
                F[t, j] = mu[j]
                F[t, m + j] = S[ra + j, b]
                Fl[t, j] = G[G_J + j, b]
                Fl[t, m + j] = G[G_J + m + j, b]
            F[t, 2 * m + F_GAIN] = g
            F[t, 2 * m + F_BETA] = S[beta_row, b]
            F[t, 2 * m + F_OBJ] = ob
            F[t, 2 * m + F_FEAS] = fe
            F[t, 2 * m + F_KKT] = kkt
            Fl[t, 2 * m + B_BALANCE] = balance
            Fl[t, 2 * m + B_UNIQUE] = unique and solved
            # the post-solve check of an LP solution (optimal or relaxed) on the data it solved
            uncert = solved and (st == S_OPTIMAL or st == S_RELAXED) and unc
            Fl[t, 2 * m + B_AMBIGUOUS] = G[G_AMB, b] or uncert or undecided
            Fl[t, 2 * m + B_REDO] = redo
            I[t, 0] = st
            I[t, 1] = iters
    return -1


@njit(cache=True, error_model="numpy")
def directions(l, lam, C, eps_mode, restricted, tlog, policy, max_iter, P, check):
    """Every instance of ``(l, λ, C)`` (shapes (N, m), (N, m), (N, m, m), C-contiguous float64).

    With ``check``, the inputs are checked first (:func:`check_inputs`) and ``λ`` is renormalised. Returns
    ``(bad, code, F, Fl, I)``: ``bad`` is the first instance that failed a check, or whose LP data overflow
    (``CHECK_OVERFLOW``, checked with or without ``check``), with its CHECK_* ``code`` (-1 and CHECK_OK: none; else
    the outputs are empty); ``F, Fl, I`` hold the results (column layout above).
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
    S, G, V, D, Ds, T, B, basis, active = _workspace(m, max(1, min(N, BLOCK)))
    ovf = instance_loop(l, lam, C, eps_mode, restricted, tlog, policy, max_iter, P, S, G, V, D, Ds, T, B, basis,
                        active, F, Fl, I)
    if ovf >= 0:
        return ovf, CHECK_OVERFLOW, F[:0], Fl[:0], I[:0]
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
    J, Js = np.empty((N, m), dtype=np.bool_), np.empty((N, m), dtype=np.bool_)
    balance, amb = np.empty(N, dtype=np.bool_), np.empty(N, dtype=np.bool_)
    width = max(1, min(N, BLOCK))
    S, G = _block_scratch(m, width)
    vec = np.empty(m)
    for t0 in range(0, N, width):
        nb = min(width, N - t0)
        _build_block(l, lam, C, t0, nb, eps_mode, tlog, P, S, G, vec)
        for b in range(nb):
            t = t0 + b
            _lp_rows(C, t, S, G, b, restricted, c[t], D[t], e[t], active[t])
            beta[t] = S[R_C * m + m * m + Q_BETA, b]
            balance[t] = G[G_BAL, b]
            amb[t] = G[G_AMB, b]
            for j in range(m):
                A[t, j] = S[R_A * m + j, b]
                CA[t, j] = S[R_CA * m + j, b]
                J[t, j] = G[G_J + j, b]
                Js[t, j] = G[G_J + m + j, b]
    return c, D, e, active, beta, A, CA, J, Js, balance, amb


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
        code[t], iters[t], kkt[t], unique[t], _, _ = _solve_lp(c[t], D[t], e[t], max_iter, P, T, basis[t], prow, f, y,
                                                             xB, xr, B, tmp, mu[t])
    return mu, code, iters, kkt, unique, basis
