r"""Shared helpers of the cluster statements H.13–H.17 (private: the leading underscore keeps this module out of
statement discovery, see :mod:`verification.core.registry`).

Conventions used by the helpers:

* Client LP directions ``d_i = G_i μ_i`` and balancing directions ``d_bal,i = G_i A_i`` are rows ``(N, n_w)``.
* ``losses_fn(W)`` evaluates **every client at the same points** ``W (..., n_w)`` and returns ``(..., N, m)``;
  :func:`cluster_losses_fn` builds it for F1 (common objectives, H.5) and F2 (client centre shifts).
* A step grid ``s ∈ {2^{-k}}`` is used for "β decreases along ``-d̄``" (docs/spec/statements.md#t-h13). A float64
  evaluation of ``β`` carries an absolute rounding error of a few ``eps`` (``β ≤ log m`` is a sum of ``m`` terms
  of size ``≤ 1``), so a grid value whose predicted first-order change ``s·|dβ/ds|`` is below
  :data:`BETA_NOISE` cannot be resolved and is not used (and is counted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.direction import DirectionResult, lp_direction
from sim.preference import normalizer, preference_uniformity
from sim.problems import PerturbedClients, PlantedQuadraticCluster
from verification.core.evidence import FD_RTOL, FD_STEP_PARAMS

EPS = float(np.finfo(np.float64).eps)
#: Absolute rounding allowance of one float64 evaluation of β (256·eps ≈ 5.7e-14; β is a sum of m terms ≤ 1).
BETA_NOISE = 256.0 * EPS


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """``n`` independent uniformly distributed unit vectors in ``R^dim`` (shape ``(n, dim)``)."""
    xi = rng.standard_normal((n, dim))
    return xi / np.linalg.norm(xi, axis=1, keepdims=True)


def draw_dims(rng: np.random.Generator, m_choices, n_w_max: int) -> tuple[int, int]:
    """``m`` uniformly from ``m_choices`` and ``n_w`` uniformly from ``{m, …, n_w_max}``
    (docs/spec/problems.md#f1)."""
    m = int(m_choices[int(rng.integers(0, len(m_choices)))])
    n_w = int(rng.integers(m, max(m, n_w_max) + 1))
    return m, n_w


def cluster_losses_fn(P, prefs_count: int | None = None):
    """``W (..., n_w) -> (..., N, m)``: every client of ``P`` evaluated at the same points.

    F1 (:class:`PlantedQuadraticCluster`) has common objectives: the common losses are broadcast to the
    ``N = prefs_count`` clients (default ``P.n_clients``). F2 (:class:`PerturbedClients`): each client's own losses.
    """
    if isinstance(P, PerturbedClients):
        return lambda W: P.losses(W)
    if isinstance(P, PlantedQuadraticCluster):
        N = P.n_clients if prefs_count is None else int(prefs_count)

        def f(W):
            L = P.losses(W)
            return np.broadcast_to(L[..., None, :], L.shape[:-1] + (N, L.shape[-1]))

        return f
    raise ValueError(f"cluster_losses_fn: unsupported problem type {type(P).__name__}")


def cluster_grads(P, w0, N: int) -> np.ndarray:
    """Client gradients at one point ``w0``: ``(N, n_w, m)`` (F1: the common ``G(w0)`` repeated)."""
    if isinstance(P, PerturbedClients):
        return P.grads(w0)
    G = P.grads(w0)
    return np.broadcast_to(G, (N,) + G.shape).copy()


@dataclass(frozen=True)
class ClientLP:
    """The LP of every client of a cluster at one point ``w0`` and the derived directions.

    res: the :class:`DirectionResult` (batched over clients).  d: ``(N, n_w)`` LP directions.  dbal: ``(N, n_w)``
    balancing directions ``G_i A_i``.  dbal_norm, gamma (``γ* = d_iᵀd_bal,i``), beta, Z: ``(N,)``.
    """

    res: DirectionResult
    d: np.ndarray
    dbal: np.ndarray
    dbal_norm: np.ndarray
    gamma: np.ndarray
    beta: np.ndarray
    Z: np.ndarray
    solved: np.ndarray


def client_lp(losses, prefs, grads, *, eps_mode: float, on_infeasible: str = "relaxed") -> ClientLP:
    """Solve the EPO LP of every client (``losses (N, m)``, ``prefs (N, m)``, ``grads (N, n_w, m)``)."""
    losses = np.asarray(losses, dtype=np.float64)
    G = np.asarray(grads, dtype=np.float64)
    C = np.einsum("nwa,nwb->nab", G, G)
    C = 0.5 * (C + np.swapaxes(C, -1, -2))
    res = lp_direction(losses, prefs, C, eps_mode=eps_mode, on_infeasible=on_infeasible)
    solved = np.isin(res.status, ("optimal", "relaxed"))
    mu = np.where(solved[:, None], res.weights, 0.0)
    d = np.einsum("nwm,nm->nw", G, mu)
    dbal = np.einsum("nwm,nm->nw", G, res.adjustment)
    return ClientLP(
        res=res, d=d, dbal=dbal, dbal_norm=np.linalg.norm(dbal, axis=1), gamma=np.where(solved, res.gain, np.nan),
        beta=res.beta, Z=normalizer(losses, prefs), solved=solved,
    )


def step_grid(k_lo: int, k_hi: int) -> np.ndarray:
    """The geometric step grid ``{2^{-k} : k = k_lo..k_hi}``, in decreasing order."""
    return 2.0 ** -np.arange(int(k_lo), int(k_hi) + 1, dtype=np.float64)


def beta_along(losses_fn, prefs, w0, direction, s) -> np.ndarray:
    """``β_i(l_i(w0 − s·direction))`` for every grid value and client: shape ``(S, N)``."""
    W = np.asarray(w0)[None, :] - np.asarray(s)[:, None] * np.asarray(direction)[None, :]
    return preference_uniformity(losses_fn(W), prefs)


@dataclass(frozen=True)
class DecreaseCheck:
    """Per client: is β decreasing along ``-d̄`` on the grid (resolvable grid values only)?

    ok_small: β decreases at the ``n_smallest`` smallest resolvable grid values (False if none is resolvable).
    up_small: β increases at the ``n_smallest`` smallest resolvable grid values (the negative-control pattern).
    whole: β decreases at every resolvable grid value.  s0_hat: the largest grid value below which β decreases at
    every resolvable grid value (0 if it fails at the smallest).  n_resolved: resolvable grid values.
    """

    ok_small: np.ndarray
    up_small: np.ndarray
    whole: np.ndarray
    s0_hat: np.ndarray
    n_resolved: np.ndarray


def decrease_check(beta0, beta_grid, slope, s, n_smallest: int) -> DecreaseCheck:
    """Evaluate the β-decrease conclusion (see :class:`DecreaseCheck`).

    ``beta0 (N,)``, ``beta_grid (S, N)`` on the decreasing grid ``s (S,)``, ``slope (N,)`` the analytic derivative
    ``d/ds β(w0 − s d̄)|_0 = −d̄ᵀd_bal/Z``; a grid value is resolvable iff ``s·|slope| ≥ BETA_NOISE``.
    """
    beta0 = np.asarray(beta0)
    diff = beta_grid - beta0[None, :]
    resolved = (s[:, None] * np.abs(slope)[None, :]) >= BETA_NOISE
    dec = diff < 0.0
    inc = diff > 0.0
    S, N = diff.shape
    ok_small = np.zeros(N, bool)
    up_small = np.zeros(N, bool)
    whole = np.zeros(N, bool)
    s0 = np.zeros(N)
    n_res = resolved.sum(axis=0)
    for i in range(N):
        idx = np.flatnonzero(resolved[:, i])[::-1]  # increasing s
        if idx.size == 0:
            continue
        small = idx[: int(n_smallest)]
        ok_small[i] = bool(dec[small, i].all())
        up_small[i] = bool(inc[small, i].all())
        whole[i] = bool(dec[idx, i].all())
        good = dec[idx, i]
        n_ok = int(np.argmin(good)) if not good.all() else good.size
        s0[i] = s[idx[n_ok - 1]] if n_ok > 0 else 0.0
    return DecreaseCheck(ok_small, up_small, whole, s0, n_res)


def fd_directional(losses_fn, prefs, w0, direction, analytic) -> tuple[np.ndarray, np.ndarray]:
    """Central finite difference of ``s ↦ β_i(w0 − s·direction)`` at 0 against ``analytic (N,)`` (identity I4).

    Step: ``FD_STEP_PARAMS`` in parameter space (``h = FD_STEP_PARAMS/‖direction‖`` in ``s``). Accepted iff
    ``|fd − analytic| ≤ FD_RTOL·|analytic| + 2·BETA_NOISE/(2h)`` (the second term is the rounding floor of the
    difference quotient). Returns ``(ok (N,), relative error (N,))``.
    """
    nd = float(np.linalg.norm(direction))
    if nd == 0.0:
        N = np.shape(analytic)[0]
        return np.zeros(N, bool), np.full(N, np.inf)
    h = FD_STEP_PARAMS / nd
    b = beta_along(losses_fn, prefs, w0, direction, np.array([h, -h]))
    fd = (b[0] - b[1]) / (2.0 * h)
    err = np.abs(fd - analytic)
    ok = err <= FD_RTOL * np.abs(analytic) + BETA_NOISE / h
    rel = err / np.maximum(np.abs(analytic), np.finfo(np.float64).tiny)
    return ok, rel


def problem_record(P) -> dict:
    """The data that reproduces a quadratic cluster (F1 or F2): objectives, shifts and preferences."""
    rec = {
        "family": "F2" if isinstance(P, PerturbedClients) else "F1",
        "centres": P.centres,
        "hessians": P.hessians,
        "offsets": P.offsets,
        "prefs": P.prefs,
    }
    if isinstance(P, PerturbedClients):
        rec["shifts"] = P.shifts
    return rec


def summary(x) -> dict:
    """min / median / max of a finite array (``None`` entries when empty)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"n": 0, "min": None, "median": None, "max": None}
    return {"n": int(x.size), "min": float(x.min()), "median": float(np.median(x)), "max": float(x.max())}
