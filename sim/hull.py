r"""Near-active set, minimum-norm element of a gradient hull, and the H.19 descent margin
(docs/spec/near-active.md#near-active).

Notation (one client, one point ``w``; the subscript ``i`` is dropped):

.. math::

    ε_{act}      &= 2 η λ_{max} B^2                                     \quad\text{(eps_act)}\\
    J^*_ε(w)     &= \{ j : λ_j l_j(w) \ge ψ(w) - ε_{act} \} \supseteq J^*(w)   \quad\text{(near_active_set)}\\
    𝒢_ε(w)       &= conv\{ λ_j g_j(w) : j ∈ J^*_ε(w) \}\\
    d_M(w)       &= \arg\min_{v ∈ 𝒢_ε(w)} \|v\|                          \quad\text{(min_norm_element)}\\
    m(w)         &= \min_{j ∈ J^*_ε(w)} λ_j\, d(w)^\top g_j(w)             \quad\text{(descent_margin, H.19)}\\
                 &= \min_{j ∈ J^*_ε(w)} λ_j\, (C μ)_j \quad (d = Gμ,\ C = G^\top G)  \quad\text{(descent_margin_from_gram)}

The minimum-norm point ``p = d_M`` of ``conv{v_1..v_k}`` is characterised by the KKT property
``v_jᵀp ≥ ‖p‖²`` for every generator ``j`` (then ``qᵀp ≥ ‖p‖²`` for every ``q`` in the hull, so ``‖q‖ ≥ ‖p‖``).

Algorithms (:func:`min_norm_element`, :func:`min_norm_weights_from_gram`):

* ``k ≤ 8`` generators: exact support enumeration. For every support ``S`` solve the KKT system
  ``[K_S 1; 1ᵀ 0][u; ν] = [0; 1]`` (``K = VᵀV`` the Gram matrix of the generators); keep the candidates with
  ``u ≥ 0``; each is a point of the hull, so the candidate of smallest norm is the minimum-norm point (the
  support of the true minimiser is among those enumerated). Batched over instances.
* ``k > 8``: Wolfe's (1976) minimum-norm-point algorithm, an exact finite active-set QP that needs only inner
  products, run per instance.

The Gram versions (:func:`min_norm_weights_from_gram`, :func:`descent_margin_from_gram`) work from ``C = GᵀG``
alone, so they serve callers (Algorithm 1 at the kernel boundary, LLM runs) that never form ``G`` in numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from sim.preference import bottleneck_set, check_gram, check_losses, check_preferences, check_shapes

__all__ = [
    "ENUMERATION_MAX_K",
    "KKT_TOL",
    "WOLFE_MAX_ITER",
    "MinNormResult",
    "WolfeNotConvergedError",
    "eps_act",
    "near_active_set",
    "min_norm_element",
    "min_norm_weights_from_gram",
    "descent_margin",
    "descent_margin_from_gram",
]

#: Largest number of generators solved by exact support enumeration (2^k - 1 supports); above it, Wolfe's method.
ENUMERATION_MAX_K = 8
#: A candidate weight counts as non-negative if ``u_j >= -_U_TOL``.
_U_TOL = 1e-10


#: Wolfe's iteration stops when the KKT residual ``‖d_M‖² − min_j v_jᵀd_M`` is at most ``KKT_TOL · max_j ‖v_j‖²``:
#: the resolution of a computed minimum-norm point (a residual below it is zero for a check of the KKT property).
KKT_TOL = 1e-12

#: Wolfe's method runs at most this many major cycles (each adds a generator to the corral) per instance; an instance
#: not converged by then raises :class:`WolfeNotConvergedError` instead of returning a point that is not the minimiser.
#: In exact arithmetic a corral never repeats (‖p‖ strictly decreases), so with ``k <= 13`` active generators the
#: limit (above ``2^13 - 1`` corrals) cannot be reached.
WOLFE_MAX_ITER = 10_000


class WolfeNotConvergedError(RuntimeError):
    """Wolfe's minimum-norm-point algorithm did not converge within :data:`WOLFE_MAX_ITER` major cycles."""


@dataclass(frozen=True, eq=False)
class MinNormResult:
    """Minimum-norm element of ``conv{v_j : j ∈ mask}``.

    Attributes (batch shape ``(...)``):
        point:        ``d_M = Σ_j u_j v_j``, shape ``(..., n)``.
        weights:      convex weights ``u`` over all ``k`` generators (zero outside the mask), shape ``(..., k)``.
        norm:         ``‖d_M‖``, shape ``(...)``.
        kkt_residual: ``max_{j ∈ mask} (‖d_M‖² - v_jᵀ d_M)_+``, shape ``(...)``; 0 up to round-off at the optimum.
        scale:        ``max_{j ∈ mask} ‖v_j‖²``, shape ``(...)``: the unit of the KKT residual (Wolfe's iteration
                      stops at a residual ``≤`` :data:`KKT_TOL` ``· scale``; the enumeration stops at the first
                      support size whose candidate has a residual that small, exact up to the roundoff of its small
                      solves).
    """

    point: np.ndarray
    weights: np.ndarray
    norm: np.ndarray
    kkt_residual: np.ndarray
    scale: np.ndarray


# ----------------------------------------------------------------------------------------------------------------
# near-active set and eps_act


def eps_act(eta, prefs, B) -> np.ndarray:
    """``ε_act = 2 η λ_max B²`` (docs/spec/near-active.md#near-active, qualification (b) of H.31); shape
    ``(...)`` of ``prefs[..., 0]``.

    ``eta`` (η, the local step size) and ``B`` (gradient bound) must be finite and ``>= 0``.
    """
    lam = check_preferences(prefs)
    eta_a = np.asarray(eta, dtype=np.float64)
    B_a = np.asarray(B, dtype=np.float64)
    if not np.all(np.isfinite(eta_a)) or np.any(eta_a < 0):
        raise ValueError(f"eta must be finite and >= 0; got {eta!r}")
    if not np.all(np.isfinite(B_a)) or np.any(B_a < 0):
        raise ValueError(f"B must be finite and >= 0; got {B!r}")
    return 2.0 * eta_a * lam.max(axis=-1) * B_a**2


def near_active_set(losses, prefs, eps_act) -> np.ndarray:
    """Boolean mask ``J*_ε = {j : λ_j l_j ≥ ψ - ε_act}`` with ``ψ = max_k λ_k l_k``; shape ``(..., m)``.

    ``eps_act`` (ε_act ≥ 0) is a scalar or broadcasts against the batch shape ``(...)``. It always contains the
    bottleneck set ``J*`` of :func:`sim.preference.bottleneck_set` (``eps_act = 0`` gives exactly ``J*``: the
    maximisers, ties within the resolution ``TIE_RTOL`` included, as in the LP).
    """
    l = check_losses(losses)
    lam = check_preferences(prefs)
    check_shapes(l, lam)
    eps = np.asarray(eps_act, dtype=np.float64)
    if not np.all(np.isfinite(eps)) or np.any(eps < 0):
        raise ValueError(f"eps_act must be finite and >= 0; got {eps_act!r}")
    wl = lam * l
    psi = wl.max(axis=-1)
    try:
        thr = psi - eps
    except ValueError as exc:
        raise ValueError(
            f"eps_act shape {eps.shape} does not broadcast against the batch shape {psi.shape}"
        ) from exc
    return (wl >= thr[..., None]) | bottleneck_set(l, lam, validate=False)


# ----------------------------------------------------------------------------------------------------------------
# minimum-norm element


def _check_mask(mask, k: int, batch: tuple[int, ...], name: str = "mask") -> np.ndarray:
    if mask is None:
        return np.ones(batch + (k,), dtype=bool)
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        raise ValueError(f"{name} must be a boolean array; got dtype {arr.dtype}")
    if arr.shape[-1:] != (k,):
        raise ValueError(f"{name} must have last axis of length k={k}; got shape {arr.shape}")
    try:
        arr = np.broadcast_to(arr, batch + (k,))
    except ValueError as exc:
        raise ValueError(f"{name} shape {arr.shape} does not broadcast to the batch shape {batch}") from exc
    empty = ~arr.any(axis=-1)
    if np.any(empty):
        at = tuple(int(i) for i in np.argwhere(np.atleast_1d(empty))[0]) if empty.ndim else ()
        raise ValueError(f"{name} selects no generator for instance {at}: the hull is empty")
    return arr


def _kkt_tolerance(K: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``KKT_TOL · max_{j ∈ mask} K_jj`` per instance of a flat batch ``K`` (b, k, k): the KKT residual at which
    Wolfe's iteration and the support enumeration take a candidate as the minimum-norm point."""
    return KKT_TOL * np.maximum(np.where(mask, np.einsum("bii->bi", K), -np.inf).max(axis=1), np.finfo(float).tiny)


def _kkt_solve(Ks: np.ndarray) -> np.ndarray:
    """Solve ``[K_S 1; 1ᵀ 0][u; ν] = [0; 1]`` for a stack ``(b, s, s)``; returns ``u`` ``(b, s)`` (NaN if singular).

    Each system is solved on its own (LAPACK per matrix), so a system's solution does not depend on the others in
    the stack; a stack holding a singular system is split in halves until the singular ones stand alone."""
    b, s, _ = Ks.shape
    M = np.zeros((b, s + 1, s + 1))
    M[:, :s, :s] = Ks
    M[:, :s, s] = 1.0
    M[:, s, :s] = 1.0
    rhs = np.zeros((b, s + 1, 1))
    rhs[:, s] = 1.0
    sol = np.empty((b, s + 1))
    _solve_split(M, rhs, sol, 0, b)
    return sol[:, :s]


def _solve_split(M: np.ndarray, rhs: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
    """``out[lo:hi]`` = the solutions of the systems ``M[lo:hi]``, NaN for a singular one (affinely dependent
    support: a smaller support gives the same point)."""
    try:
        out[lo:hi] = np.linalg.solve(M[lo:hi], rhs[lo:hi])[..., 0]
    except np.linalg.LinAlgError:
        if hi - lo == 1:
            out[lo] = np.nan
            return
        mid = (lo + hi) // 2
        _solve_split(M, rhs, out, lo, mid)
        _solve_split(M, rhs, out, mid, hi)


#: (instance, support) pairs solved per batched call of :func:`_enumerate`; its instances are taken in blocks of at
#: most this many pairs of the size with the most supports, so that its memory is bounded whatever the batch.
_ENUM_CHUNK = 1 << 14


def _enumerate_in_blocks(K: np.ndarray, mask: np.ndarray, V: np.ndarray | None, max_size: int) -> np.ndarray:
    """:func:`_enumerate` on a batch of any size, in blocks of instances: a block holds at most ``_ENUM_CHUNK``
    (instance, support) pairs of the size with the most supports, so that the dense ``(instances × supports)``
    arrays of a call are bounded whatever the batch. An instance's weights do not depend on its block."""
    b, k, _ = K.shape
    most = max((math.comb(k, size) for size in range(1, max_size + 1)), default=1)
    block = max(1, _ENUM_CHUNK // most)
    if b <= block:
        return _enumerate(K, mask, V, max_size)
    return np.concatenate([_enumerate(K[lo:lo + block], mask[lo:lo + block],
                                      None if V is None else V[lo:lo + block], max_size)
                           for lo in range(0, b, block)])


def _enumerate(K: np.ndarray, mask: np.ndarray, V: np.ndarray | None, max_size: int, *,
               exhaustive: bool = False) -> np.ndarray:
    """Exact support enumeration on a flat batch: ``K`` (b, k, k), ``mask`` (b, k), optional ``V`` (b, n, k).

    All supports of one size are solved in one batched call over (instance, support); per instance the kept
    candidate is the first support, in the order of :func:`itertools.combinations` by size, of smallest norm.
    Sizes are taken in increasing order, and an instance leaves the enumeration after the first size at which its
    kept candidate ``u`` has the KKT property of the minimum-norm point, ``(K u)_j ≥ uᵀK u − KKT_TOL · scale`` for
    every ``j`` of its mask (``scale = max_j K_jj``): the minimum-norm point is unique, so a larger support can
    only give it again (an equal norm, which never replaces the kept candidate) or a larger norm. Only a tie
    within roundoff between the kept candidate and one of a larger support could have been resolved otherwise;
    ``exhaustive`` (for tests) tries every size for every instance. On the statements' search boxes the exit
    halves the (instance, support) pairs solved (H.19) with the same weights, bit for bit.

    Every operation is per instance (batched solves and matrix products, row sums), so an instance's weights do not
    depend on the other instances of the batch. Its arrays are dense over (instances × supports of one size):
    callers take it through :func:`_enumerate_in_blocks`."""
    b, k, _ = K.shape
    best = np.full(b, np.inf)
    best_u = np.zeros((b, k))
    live = np.ones(b, dtype=bool)  # instances whose kept candidate is not yet known to be the minimiser
    tol = _kkt_tolerance(K, mask)
    for size in range(1, max_size + 1):
        if not live.any():
            break
        supports = np.array(list(combinations(range(k), size)), dtype=np.intp)  # (n_s, size)
        rows, which = np.nonzero(mask[:, supports].all(axis=2) & live[:, None])  # the supports inside each mask
        if rows.size == 0:
            continue
        vals = np.full((b, supports.shape[0]), np.inf)
        us = np.zeros((b, supports.shape[0], size))
        for lo in range(0, rows.size, _ENUM_CHUNK):
            r, w = rows[lo:lo + _ENUM_CHUNK], which[lo:lo + _ENUM_CHUNK]
            S = supports[w]
            Ks = K[r[:, None, None], S[:, :, None], S[:, None, :]]
            if size == 1:
                u = np.ones((r.size, 1))
            else:
                u = _kkt_solve(Ks)
                ok = np.all(np.isfinite(u), axis=1) & np.all(u >= -_U_TOL, axis=1)
                r, w, S, Ks, u = r[ok], w[ok], S[ok], Ks[ok], u[ok]
                if r.size == 0:
                    continue
                u = np.maximum(u, 0.0)
                u = u / u.sum(axis=1, keepdims=True)
            if V is not None:
                Vs = V[r[:, None, None], np.arange(V.shape[1])[None, :, None], S[:, None, :]]
                p = np.einsum("bnk,bk->bn", Vs, u)
                val = np.einsum("bn,bn->b", p, p)
            else:
                val = ((Ks @ u[:, :, None])[:, :, 0] * u).sum(axis=1)  # uᵀK_S u, per instance
            vals[r, w] = val
            us[r, w] = u
        first = np.argmin(vals, axis=1)  # the first support of the smallest norm of this size
        val = vals[np.arange(b), first]
        better = np.flatnonzero(val < best)
        if better.size:
            best[better] = val[better]
            best_u[better] = 0.0
            best_u[better[:, None], supports[first[better]]] = us[better, first[better]]
        if not exhaustive:
            r = np.flatnonzero(live & np.isfinite(best))
            Ku = (K[r] @ best_u[r, :, None])[:, :, 0]
            slack = np.where(mask[r], (Ku * best_u[r]).sum(axis=1)[:, None] - Ku, -np.inf).max(axis=1)
            live[r[slack <= tol[r]]] = False
    return best_u


def _wolfe(K: np.ndarray, active: np.ndarray, batch: tuple = ()) -> np.ndarray:
    """Wolfe's minimum-norm-point algorithm on a flat batch of Gram matrices ``K`` (b, k, k), each restricted to
    its ``active`` (b, k) generators, the instances in lockstep: one batched ``K u`` per major step, one batched
    KKT solve per support size and minor step. Each instance follows its own support ``S`` (in the order its
    generators entered) exactly as the one-instance algorithm does.

    Raises :class:`WolfeNotConvergedError` naming the first instance (its index in the batch shape ``batch`` of
    the caller) not converged after :data:`WOLFE_MAX_ITER` major cycles."""
    b, k, _ = K.shape
    u = np.zeros((b, k))
    if b == 0:
        return u
    diag = np.einsum("bii->bi", K)
    tol = _kkt_tolerance(K, active)
    rows = np.arange(b)
    j0 = np.argmin(np.where(active, diag, np.inf), axis=1)
    S = np.zeros((b, k), dtype=np.intp)  # S[r, :size[r]]: the support, in entry order
    S[:, 0] = j0
    size = np.ones(b, dtype=np.intp)
    u[rows, j0] = 1.0
    major = np.ones(b, dtype=bool)  # still iterating
    for _ in range(WOLFE_MAX_ITER):
        r = np.flatnonzero(major)
        if r.size == 0:
            break
        Ku = (K[r] @ u[r][:, :, None])[:, :, 0]
        pp = (u[r][:, None, :] @ Ku[:, :, None])[:, 0, 0]
        cand = np.argmin(np.where(active[r], Ku, np.inf), axis=1)
        in_S = np.any((S[r] == cand[:, None]) & (np.arange(k) < size[r][:, None]), axis=1)
        stop = (pp - Ku[np.arange(r.size), cand] <= tol[r]) | in_S
        major[r[stop]] = False
        r, cand = r[~stop], cand[~stop]
        S[r, size[r]] = cand
        size[r] += 1
        limit = size[r] + k + 1  # the minor steps of this major step
        minor = r
        for step in range(int(limit.max()) if r.size else 0):
            minor = minor[step < limit[np.searchsorted(r, minor)]]
            if minor.size == 0:
                break
            leave = np.zeros(minor.size, dtype=bool)
            for s in np.unique(size[minor]):
                g = np.flatnonzero(size[minor] == s)
                q = minor[g]
                Sq = S[q, :s]
                y = _kkt_solve(K[q[:, None, None], Sq[:, :, None], Sq[:, None, :]])
                bad = ~np.all(np.isfinite(y), axis=1)  # affinely dependent (round-off only): keep the point
                size[q[bad]] -= 1
                major[q[bad]] = False
                pos = np.all(y > 0.0, axis=1) & ~bad
                u[q[pos]] = 0.0
                u[q[pos][:, None], Sq[pos]] = y[pos]
                leave[g[bad | pos]] = True
                step_ = ~(bad | pos)
                if not step_.any():
                    continue
                q, Sq, y = q[step_], Sq[step_], y[step_]
                uS = u[q[:, None], Sq]
                neg = y <= 0.0
                theta = np.where(neg, uS / np.where(neg, uS - y, 1.0), np.inf).min(axis=1)
                uS = uS + theta[:, None] * (y - uS)
                keep = uS > 1e-15
                keep[np.arange(q.size), np.argmin(np.where(neg, uS, np.inf), axis=1)] = False
                u[q] = 0.0
                n_keep = keep.sum(axis=1)
                for n in np.unique(n_keep):
                    h = np.flatnonzero(n_keep == n)
                    kept = Sq[h][keep[h]].reshape(h.size, n)
                    val = uS[h][keep[h]].reshape(h.size, n)
                    S[q[h], :n] = kept
                    size[q[h]] = n
                    u[q[h][:, None], kept] = val / val.sum(axis=1, keepdims=True)
            minor = minor[~leave]
    if major.any():
        at = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(major)[0]), batch)) if batch else ()
        raise WolfeNotConvergedError(
            f"Wolfe's minimum-norm-point algorithm did not converge within WOLFE_MAX_ITER = {WOLFE_MAX_ITER} "
            f"major cycles at instance {at}"
        )
    return u


def _solve(K: np.ndarray, mask: np.ndarray, V: np.ndarray | None, method: str) -> np.ndarray:
    k = K.shape[-1]
    batch = K.shape[:-2]
    Kf = K.reshape((-1, k, k))
    mf = mask.reshape((-1, k))
    Vf = None if V is None else V.reshape((-1,) + V.shape[-2:])
    if method == "auto":
        method = "enumerate" if k <= ENUMERATION_MAX_K else "wolfe"
    if method == "enumerate":
        # Carathéodory: the minimiser lies in the relative interior of an affinely independent face of at most
        # n + 1 generators, so supports larger than n + 1 never need to be tried.
        max_size = k if V is None else min(k, V.shape[-2] + 1)
        u = _enumerate_in_blocks(Kf, mf, Vf, max_size)
    elif method == "wolfe":
        u = _wolfe(Kf, mf, batch)
    else:
        raise ValueError(f"method must be 'auto', 'enumerate' or 'wolfe'; got {method!r}")
    return u.reshape(batch + (k,))


def min_norm_element(vectors, mask=None, *, method: str = "auto") -> MinNormResult:
    """Exact minimum-norm point ``d_M`` of ``conv{v_j : mask_j}``; generators are the columns of ``vectors``.

    Args:
        vectors: ``(n, k)`` or batched ``(..., n, k)``; column ``j`` is ``v_j`` (e.g. ``λ_j g_j``).
        mask: optional boolean ``(..., k)`` selecting the generators (e.g. :func:`near_active_set`); every
            instance must select at least one.
        method: ``"auto"`` (enumeration for ``k ≤ 8``, Wolfe above), ``"enumerate"`` or ``"wolfe"``.

    Raises:
        WolfeNotConvergedError: Wolfe's method has not converged within 10 000 major cycles
            (:data:`WOLFE_MAX_ITER`) on an instance; the message names it.

    Returns:
        :class:`MinNormResult` with ``point = V u``, the weights ``u`` (zero outside the mask), ``‖d_M‖`` and the
        KKT residual ``max_{j∈mask}(‖d_M‖² - v_jᵀd_M)_+``.
    """
    try:
        V = np.asarray(vectors, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: a tensor needing grad
        raise ValueError(f"vectors must be a numeric array; got {vectors!r}") from exc
    if V.ndim < 2 or V.shape[-1] == 0 or V.shape[-2] == 0:
        raise ValueError(f"vectors must have shape (..., n, k) with n, k >= 1; got {V.shape}")
    if not np.all(np.isfinite(V)):
        raise ValueError("vectors contains a non-finite entry")
    k = V.shape[-1]
    batch = V.shape[:-2]
    msk = _check_mask(mask, k, batch)
    K = np.swapaxes(V, -1, -2) @ V
    K = 0.5 * (K + np.swapaxes(K, -1, -2))
    u = _solve(K, msk, V, method)
    p = (V @ u[..., None])[..., 0]
    pp = np.einsum("...n,...n->...", p, p)
    vp = (np.swapaxes(V, -1, -2) @ p[..., None])[..., 0]
    res = np.where(msk, pp[..., None] - vp, -np.inf).max(axis=-1)
    scale = np.where(msk, np.einsum("...ii->...i", K), -np.inf).max(axis=-1)
    return MinNormResult(point=p, weights=u, norm=np.sqrt(pp), kkt_residual=np.maximum(res, 0.0), scale=scale)


def min_norm_weights_from_gram(gram, mask=None, *, method: str = "auto") -> np.ndarray:
    """Convex weights ``u`` (``(..., k)``) of the minimum-norm point of ``conv{g_j}`` given only ``C = GᵀG``.

    ``u = argmin_{u ≥ 0, 1ᵀu = 1} uᵀ C u`` (MGDA weights ``μ_M``; ``d_M = G u`` is formed by the caller).
    ``gram`` is a symmetric PSD ``(..., k, k)`` array; ``mask`` as in :func:`min_norm_element`. Because only ``C``
    is used, ``‖d_M‖`` is resolved to about ``sqrt(machine eps)·max_j‖g_j‖``.
    """
    C = check_gram(gram)
    k = C.shape[-1]
    msk = _check_mask(mask, k, C.shape[:-2])
    C = 0.5 * (C + np.swapaxes(C, -1, -2))
    return _solve(C, msk, None, method)


# ----------------------------------------------------------------------------------------------------------------
# H.19 margin


def descent_margin(d, grads, prefs, mask) -> np.ndarray:
    """H.19 margin ``m(w) = min_{j ∈ mask} λ_j dᵀ g_j`` (docs/spec/near-active.md#near-active); shape
    ``(...)``.

    Args:
        d: direction ``(..., n_w)`` (the update is ``w ← w - η d``).
        grads: ``G`` of shape ``(..., n_w, m)``, columns ``g_j``.
        prefs: ``λ`` ``(..., m)`` in the open simplex.
        mask: boolean ``(..., m)``, typically ``J*_ε`` from :func:`near_active_set`; non-empty per instance.
    """
    dd = np.asarray(d, dtype=np.float64)
    G = np.asarray(grads, dtype=np.float64)
    lam = check_preferences(prefs)
    if G.ndim < 2:
        raise ValueError(f"grads must have shape (..., n_w, m); got {G.shape}")
    if dd.ndim < 1 or dd.shape[-1] != G.shape[-2]:
        raise ValueError(f"d must have shape (..., n_w) with n_w={G.shape[-2]}; got {dd.shape}")
    if lam.shape[-1] != G.shape[-1]:
        raise ValueError(f"prefs has m={lam.shape[-1]} objectives but grads has m={G.shape[-1]}")
    if not (np.all(np.isfinite(dd)) and np.all(np.isfinite(G))):
        raise ValueError("d and grads must be finite")
    dg = (dd[..., None, :] @ G)[..., 0, :]
    vals = lam * dg
    msk = _check_mask(mask, G.shape[-1], vals.shape[:-1])
    return np.where(msk, vals, np.inf).min(axis=-1)


def descent_margin_from_gram(weights, gram, prefs, mask, *, validate: bool = True) -> np.ndarray:
    """H.19 margin of the direction ``d = G μ`` from the Gram matrix alone: ``min_{j ∈ mask} λ_j (C μ)_j``, since
    ``g_jᵀ d = (GᵀG μ)_j``; equal to :func:`descent_margin` ``(G μ, G, λ, mask)`` up to round-off. Shape ``(...)``.

    Args:
        weights: ``μ`` ``(..., m)`` (e.g. the LP weights of :func:`sim.direction.lp_direction`).
        gram: ``C = GᵀG`` ``(..., m, m)``.
        prefs: ``λ`` ``(..., m)`` in the open simplex.
        mask: boolean ``(..., m)``, typically ``J*_ε`` from :func:`near_active_set`; non-empty per instance.
        validate: ``False`` skips the checks of ``gram`` (symmetric PSD) and ``prefs`` (simplex), for callers that
            have validated them already (e.g. the LP that produced ``weights`` from the same ``gram``).
    """
    mu = np.asarray(weights, dtype=np.float64)
    C = check_gram(gram) if validate else np.asarray(gram, dtype=np.float64)
    lam = check_preferences(prefs) if validate else np.asarray(prefs, dtype=np.float64)
    m = C.shape[-1]
    if mu.shape[-1:] != (m,) or lam.shape[-1] != m:
        raise ValueError(f"weights {mu.shape} and prefs {lam.shape} must have m={m} entries like gram {C.shape}")
    if not np.all(np.isfinite(mu)):
        raise ValueError("weights must be finite")
    vals = lam * (C @ mu[..., None])[..., 0]
    msk = _check_mask(mask, m, vals.shape[:-1])
    return np.where(msk, vals, np.inf).min(axis=-1)
