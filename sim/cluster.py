r"""Aggregation, dispersion, mixed clusters and the two-stage clustering of clients
(docs/spec/aggregation.md#aggregation, docs/spec/algorithm.md#algorithm).

A cluster ``C_n`` has ``N`` clients on a leading axis. With aggregation weights ``ρ`` (Definition H.12:
``ρ_i > 0``, ``Σ_i ρ_i = 1``) and client directions ``d_i = G_i μ_i`` (rows of ``directions``, shape ``(N, n_w)``):

.. math::

    \bar d        &= \sum_i ρ_i d_i                                    \quad\text{(shared_direction, eq 38/55)}\\
    Δ_i           &= \|\bar d - d_i\|                                   \quad\text{(deviations)}\\
    H_{C_n}       &= \sum_i ρ_i \|d_i - \bar d\|^2                      \quad\text{(dispersion, O-3)}\\
                  &= \sum_i ρ_i (μ_i - \bar μ)^T C (μ_i - \bar μ)        \quad\text{(dispersion_from_weights, eq 9, H.5)}\\
    δ_g           &= \max_i \max_j \sum_{i'} ρ_{i'} \|g_i^{(j)} - g_{i'}^{(j)}\|   \quad\text{(gradient_dissimilarity, eq 40)}\\
    δ_g^{max}     &= \max_{i,i',j} \|g_i^{(j)} - g_{i'}^{(j)}\|         \quad\text{(gradient_dissimilarity_max)}

Corollary H.14 (``Δ_i ≤ √(H/ρ_i) ≤ √(H/ρ_min)``) follows from ``ρ_i Δ_i² ≤ H``.

Mixed clusters (eq 39, 43): ``C^+ = {i : β_i > 0}`` (balancing mode), ``C^0`` the rest; block masses ``ρ^±``,
block means ``d̄^±`` with ``d̄ = ρ^+ d̄^+ + ρ^0 d̄^0`` and ``D̄_bal^+ = Σ_{C^+} (ρ_i/ρ^+) ‖d_bal,i‖``.

Clustering (docs/spec/algorithm.md#algorithm, docs/spec/open-points.md#o-17): Stage 1 groups clients by the
ordering key ``argsort_desc(λ_i ⊙ l_i(w_ref))`` (or its first entry, the bottleneck); Stage 2 splits each
Stage-1 group by the Euclidean proximity of the adjustment vectors ``A_i^ref = A(l_i(w_ref), λ_i)`` (complete
linkage with a diameter threshold, or k-means with given k). No theorem depends on the clustering; it is
configuration (O-17).

All functions are pure, float64, and raise :class:`ValueError` naming the argument and the value on bad input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage

from sim._checks import as_array
from sim.preference import (
    SIMPLEX_ATOL,
    adjustment,
    check_gram,
    check_losses,
    check_preferences,
    check_shapes,
)
from sim.roundoff import TIE_RTOL, first_max, first_min, order_desc

__all__ = [
    "check_aggregation_weights",
    "aggregation_weights",
    "shared_direction",
    "deviations",
    "dispersion",
    "dispersion_from_weights",
    "MixedClusterBlocks",
    "mixed_cluster_blocks",
    "gradient_dissimilarity",
    "gradient_dissimilarity_max",
    "stage1_keys",
    "stage1_groups",
    "stage2_split",
    "Clustering",
    "cluster_clients",
]


# ----------------------------------------------------------------------------------------------- helpers


def _finite_array(x, name: str, ndim: int | None = None, min_ndim: int | None = None) -> np.ndarray:
    return as_array(x, name, ndim=ndim, min_ndim=min_ndim or 0, nonempty=False)


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


def _canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Renumber labels ``0, 1, …`` in order of first appearance along the client axis."""
    out = np.empty(labels.shape[0], dtype=np.int64)
    seen: dict = {}
    for i, lab in enumerate(labels.tolist()):
        if lab not in seen:
            seen[lab] = len(seen)
        out[i] = seen[lab]
    return out


def _directions_and_rho(directions, rho, name: str = "directions") -> tuple[np.ndarray, np.ndarray]:
    d = _finite_array(directions, name, min_ndim=2)
    r = check_aggregation_weights(rho)
    if r.shape[-1] != d.shape[-2]:
        raise ValueError(
            f"rho has {r.shape[-1]} weights but {name} has {d.shape[-2]} clients (shape {d.shape}); "
            "clients are the second-to-last axis of directions"
        )
    try:
        np.broadcast_shapes(r.shape[:-1], d.shape[:-2])
    except ValueError as exc:
        raise ValueError(
            f"rho batch shape {r.shape[:-1]} does not broadcast with {name} batch shape {d.shape[:-2]}"
        ) from exc
    return d, r


# ----------------------------------------------------------------------------------------- aggregation


def check_aggregation_weights(rho, name: str = "rho") -> np.ndarray:
    """Return ``rho`` as float64 after checking Definition H.12: ``ρ_i > 0`` and ``Σ_i ρ_i = 1``.

    The client axis is the last one (leading batch axes allowed). The sum must equal 1 within
    :data:`sim.preference.SIMPLEX_ATOL`.
    """
    r = _finite_array(rho, name, min_ndim=1)
    if r.shape[-1] == 0:
        raise ValueError(f"{name} must hold at least one client weight; got shape {r.shape}")
    bad = r <= 0.0
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} must be strictly positive (Definition H.12); {name}{list(at)} = {r[at]!r}")
    s = r.sum(axis=-1)
    off = np.abs(s - 1.0) > SIMPLEX_ATOL
    if np.any(off):
        val = float(np.atleast_1d(s)[np.argmax(np.atleast_1d(off))])
        raise ValueError(f"{name} must sum to 1 (Definition H.12); it sums to {val!r}")
    return r


def aggregation_weights(n_samples=None, N: int | None = None) -> np.ndarray:
    """Aggregation weights ``ρ`` of Definition H.12 (shape ``(N,)``).

    * ``n_samples`` given: ``ρ_i = n_i / Σ_k n_k`` (proportional to the local sample counts ``n_i > 0``); if ``N``
      is also given it must equal ``len(n_samples)``.
    * only ``N`` given: uniform ``ρ_i = 1/N``.

    Exact by construction.
    """
    if n_samples is None and N is None:
        raise ValueError("aggregation_weights needs n_samples or N; got n_samples=None and N=None")
    if N is not None:
        if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 1:
            raise ValueError(f"N must be a positive integer; got N={N!r}")
    if n_samples is None and N is not None:  # (both None was refused above)
        return np.full(int(N), 1.0 / int(N), dtype=np.float64)
    n = _finite_array(n_samples, "n_samples", ndim=1)
    if n.shape[0] == 0:
        raise ValueError("n_samples must hold at least one client; got an empty array")
    bad = n <= 0.0
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"n_samples must be strictly positive; n_samples[{i}] = {n[i]!r}")
    if N is not None and int(N) != n.shape[0]:
        raise ValueError(f"N={N!r} disagrees with len(n_samples)={n.shape[0]}")
    return n / n.sum()


def shared_direction(directions, rho) -> np.ndarray:
    """Shared direction ``d̄ = Σ_i ρ_i d_i`` (eq 38/55).

    ``directions``: ``(..., N, n_w)`` (row ``i`` is ``d_i = G_i μ_i``); ``rho``: ``(N,)`` or ``(..., N)``.
    Returns ``(..., n_w)``. Exact.
    """
    d, r = _directions_and_rho(directions, rho)
    return np.einsum("...i,...ik->...k", r, d)


def deviations(directions, rho) -> np.ndarray:
    """Deviations ``Δ_i = ‖d̄ - d_i‖`` (shape ``(..., N)``). Exact.

    Corollary H.14: ``Δ_i ≤ √(H_{C_n}/ρ_i) ≤ √(H_{C_n}/ρ_min)``.
    """
    d, r = _directions_and_rho(directions, rho)
    dbar = np.einsum("...i,...ik->...k", r, d)
    return np.linalg.norm(d - dbar[..., None, :], axis=-1)


def dispersion(directions, rho) -> np.ndarray:
    """Direction dispersion ``H_{C_n} = Σ_i ρ_i ‖d_i - d̄‖²`` (O-3; shape ``(...)``). Exact."""
    d, r = _directions_and_rho(directions, rho)
    dbar = np.einsum("...i,...ik->...k", r, d)
    diff = d - dbar[..., None, :]
    return np.einsum("...i,...ik,...ik->...", r, diff, diff)


def dispersion_from_weights(mu, gram, rho) -> np.ndarray:
    """Eq 9 form of the dispersion under H.5: ``Σ_i ρ_i (μ_i - μ̄)ᵀ C (μ_i - μ̄)`` with ``μ̄ = Σ_i ρ_i μ_i``.

    ``mu``: ``(..., N, m)`` LP weights of the clients; ``gram``: the common Gram matrix ``C = GᵀG``,
    ``(m, m)`` or ``(..., m, m)``; ``rho``: ``(N,)`` or ``(..., N)``. Equals :func:`dispersion` of the directions
    ``d_i = G μ_i`` exactly (``d_i - d̄ = G(μ_i - μ̄)``), so callers holding only ``C`` can evaluate ``H_{C_n}``.
    """
    w = _finite_array(mu, "mu", min_ndim=2)
    C = check_gram(gram)
    r = check_aggregation_weights(rho)
    m = w.shape[-1]
    if C.shape[-1] != m:
        raise ValueError(f"gram must have shape (..., {m}, {m}) to match mu shape {w.shape}; got {C.shape}")
    if r.shape[-1] != w.shape[-2]:
        raise ValueError(f"rho has {r.shape[-1]} weights but mu has {w.shape[-2]} clients (shape {w.shape})")
    try:
        np.broadcast_shapes(w.shape[:-2], C.shape[:-2], r.shape[:-1])
    except ValueError as exc:
        raise ValueError(
            f"batch shapes do not broadcast: mu {w.shape[:-2]}, gram {C.shape[:-2]}, rho {r.shape[:-1]}"
        ) from exc
    mubar = np.einsum("...i,...ij->...j", r, w)
    diff = w - mubar[..., None, :]
    quad = ((diff @ C) * diff).sum(axis=-1)  # C symmetric: row i is (μ_i - μ̄)ᵀ C (μ_i - μ̄)
    return np.einsum("...i,...i->...", r, quad)


# -------------------------------------------------------------------------------------- mixed clusters


@dataclass(frozen=True, eq=False)
class MixedClusterBlocks:
    """Blocks of a mixed cluster (eq 39, 43) and the quantities of Lemma H.16.

    Attributes
    ----------
    balancing : (N,) bool, membership of ``C^+`` (balancing clients).
    rho_plus, rho_zero : block masses ``ρ^+ = Σ_{C^+} ρ_i`` and ``ρ^0 = Σ_{C^0} ρ_i`` (``ρ^+ + ρ^0 = 1``).
    dbar_plus, dbar_zero : block means ``d̄^+ = Σ_{C^+} (ρ_i/ρ^+) d_i`` and ``d̄^0 = Σ_{C^0} (ρ_i/ρ^0) d_i``;
        an empty block has mass 0 and mean **zeros** (it is irrelevant in ``d̄ = ρ^+ d̄^+ + ρ^0 d̄^0``); see
        ``plus_empty`` / ``zero_empty``.
    dbar : the shared direction ``d̄ = ρ^+ d̄^+ + ρ^0 d̄^0``.
    D_bal_plus : ``D̄_bal^+ = Σ_{C^+} (ρ_i/ρ^+) ‖d_bal,i‖`` (0.0 when ``C^+`` is empty).
    dist_plus, dist_zero : (N,) ``‖d̄^+ - d_i‖`` and ``‖d̄^0 - d_i‖`` (terms of eq 45/47; the distance to an empty
        block's zero mean is finite and carries weight 0).
    deviation_bound : (N,) the eq 45 bound ``ρ^+ ‖d̄^+ - d_i‖ + ρ^0 ‖d̄^0 - d_i‖ ≥ Δ_i``.
    n_plus, n_zero : block sizes; plus_empty, zero_empty : flags for empty blocks.
    """

    balancing: np.ndarray
    rho_plus: float
    rho_zero: float
    dbar_plus: np.ndarray
    dbar_zero: np.ndarray
    dbar: np.ndarray
    D_bal_plus: float
    dist_plus: np.ndarray
    dist_zero: np.ndarray
    deviation_bound: np.ndarray
    n_plus: int
    n_zero: int
    plus_empty: bool
    zero_empty: bool


def _bool_mask(mask, name: str, N: int) -> np.ndarray:
    arr = np.asarray(mask)
    if arr.shape != (N,):
        raise ValueError(f"{name} must have shape ({N},); got shape {arr.shape}")
    if arr.dtype == bool:
        return arr.copy()
    try:
        f = arr.astype(np.float64)
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: a tensor needing grad
        raise ValueError(f"{name} must be a boolean mask; got {mask!r}") from exc
    if not np.all((f == 0.0) | (f == 1.0)):
        raise ValueError(f"{name} must be a boolean mask (entries 0/1); got {mask!r}")
    return f == 1.0


def mixed_cluster_blocks(directions, d_bal, rho, balancing_mask) -> MixedClusterBlocks:
    """Split a cluster into ``C^+`` (``balancing_mask``; in code the LP mode ``β_i > ε_mode``) and ``C^0``.

    ``directions``: ``(N, n_w)`` LP directions ``d_i``; ``d_bal``: ``(N, n_w)`` balancing directions
    ``d_bal,i = G_i A_i`` (only the ``C^+`` rows are used); ``rho``: ``(N,)``. Exact; see
    :class:`MixedClusterBlocks` for the quantities and the empty-block convention.
    """
    d = _finite_array(directions, "directions", ndim=2)
    db = _finite_array(d_bal, "d_bal", ndim=2)
    if db.shape != d.shape:
        raise ValueError(f"d_bal must have the shape of directions {d.shape}; got {db.shape}")
    r = check_aggregation_weights(rho)
    if r.shape != (d.shape[0],):
        raise ValueError(f"rho must have shape ({d.shape[0]},) to match directions; got {r.shape}")
    plus = _bool_mask(balancing_mask, "balancing_mask", d.shape[0])
    zero = ~plus
    rho_plus = float(r[plus].sum())
    rho_zero = float(r[zero].sum())
    n_w = d.shape[1]
    dbar_plus = (r[plus] @ d[plus]) / rho_plus if plus.any() else np.zeros(n_w)
    dbar_zero = (r[zero] @ d[zero]) / rho_zero if zero.any() else np.zeros(n_w)
    D_bal_plus = float(r[plus] @ np.linalg.norm(db[plus], axis=1) / rho_plus) if plus.any() else 0.0
    dist_plus = np.linalg.norm(dbar_plus[None, :] - d, axis=1)
    dist_zero = np.linalg.norm(dbar_zero[None, :] - d, axis=1)
    return MixedClusterBlocks(
        balancing=_readonly(plus),
        rho_plus=rho_plus,
        rho_zero=rho_zero,
        dbar_plus=_readonly(dbar_plus),
        dbar_zero=_readonly(dbar_zero),
        dbar=_readonly(r @ d),
        D_bal_plus=D_bal_plus,
        dist_plus=_readonly(dist_plus),
        dist_zero=_readonly(dist_zero),
        deviation_bound=_readonly(rho_plus * dist_plus + rho_zero * dist_zero),
        n_plus=int(plus.sum()),
        n_zero=int(zero.sum()),
        plus_empty=not bool(plus.any()),
        zero_empty=not bool(zero.any()),
    )


# ------------------------------------------------------------------------------ gradient dissimilarity


def _pairwise_gradient_distances(grads) -> np.ndarray:
    """``D[..., i, i', j] = ‖g_i^{(j)} - g_{i'}^{(j)}‖`` for grads ``(..., N, n_w, m)`` (one client at a time)."""
    g = _finite_array(grads, "grads", min_ndim=3)
    N = g.shape[-3]
    if N == 0:
        raise ValueError(f"grads must hold at least one client; got shape {g.shape}")
    rows = [np.linalg.norm(g[..., i : i + 1, :, :] - g, axis=-2) for i in range(N)]
    return np.stack(rows, axis=-3)


def gradient_dissimilarity(grads, rho) -> np.ndarray:
    """``δ_g = max_i max_j Σ_{i'} ρ_{i'} ‖g_i^{(j)} - g_{i'}^{(j)}‖`` (eq 40, O-11; shape ``(...)``).

    ``grads``: ``(..., N, n_w, m)`` (client ``i``'s ``G_i``, columns are gradients); ``rho``: ``(N,)`` or
    ``(..., N)``. Exact at the given point. ``δ_g ≤ δ_g^max``, and ``δ_g = 0`` under H.5.
    """
    D = _pairwise_gradient_distances(grads)
    r = check_aggregation_weights(rho)
    if r.shape[-1] != D.shape[-2]:
        raise ValueError(f"rho has {r.shape[-1]} weights but grads has {D.shape[-2]} clients")
    avg = np.einsum("...ikj,...k->...ij", D, r)
    return avg.max(axis=(-2, -1))


def gradient_dissimilarity_max(grads) -> np.ndarray:
    """``δ_g^max = max_{i,i',j} ‖g_i^{(j)} - g_{i'}^{(j)}‖`` (the larger, also valid, form of eq 40). Exact."""
    D = _pairwise_gradient_distances(grads)
    return D.max(axis=(-3, -2, -1))


# ------------------------------------------------------------------------------------------ clustering

_KEYS = ("ordering", "bottleneck")


def _client_losses_prefs(losses_ref, prefs) -> tuple[np.ndarray, np.ndarray]:
    l = check_losses(losses_ref, "losses_ref")
    if l.ndim != 2:
        raise ValueError(f"losses_ref must have shape (N, m); got {l.shape}")
    if l.shape[0] == 0:
        raise ValueError(f"losses_ref must hold at least one client; got shape {l.shape}")
    lam = check_preferences(prefs)
    check_shapes(l, lam)
    if lam.ndim > 2:
        raise ValueError(f"prefs must have shape (N, m) or (m,); got {lam.shape}")
    return l, np.broadcast_to(lam, l.shape).astype(np.float64)


def stage1_keys(losses_ref, prefs, key: str = "ordering") -> np.ndarray:
    """Stage-1 key of every client: ``π_i = argsort_desc(λ_i ⊙ l_i(w_ref))``
    (docs/spec/algorithm.md#algorithm, docs/spec/open-points.md#o-17).

    ``key="ordering"`` returns the full ordering ``(N, m)``; ``key="bottleneck"`` only its first entry
    ``(N, 1)``, the bottleneck index.

    Ties: weighted losses whose ratio differs from 1 by at most the resolution ``TIE_RTOL`` (:mod:`sim.roundoff`)
    are tied and ordered by ascending objective index (:func:`sim.roundoff.order_desc`), so the bottleneck key of a
    client with several maximisers is the lowest such index, and losses that differ by rounding only give the same
    key (a client on its preference ray has the key ``(0, 1, …, m-1)``).
    """
    if key not in _KEYS:
        raise ValueError(f"key must be one of {_KEYS}; got key={key!r}")
    l, lam = _client_losses_prefs(losses_ref, prefs)
    order = order_desc(lam * l, TIE_RTOL)
    return order if key == "ordering" else order[:, :1]


def stage1_groups(losses_ref, prefs, key: str = "ordering") -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
    """Stage 1: clients with identical keys (:func:`stage1_keys`) form a group.

    Returns ``(labels, group_keys)``: ``labels`` (N,) ints numbered ``0, 1, …`` in order of first appearance
    along the client axis, and ``group_keys[g]`` the key tuple shared by group ``g``.
    """
    keys = stage1_keys(losses_ref, prefs, key=key)
    tuples = [tuple(int(v) for v in row) for row in keys]
    index: dict[tuple[int, ...], int] = {}
    labels = np.empty(len(tuples), dtype=np.int64)
    for i, t in enumerate(tuples):
        if t not in index:
            index[t] = len(index)
        labels[i] = index[t]
    return labels, tuple(index.keys())


def _kmeans(X: np.ndarray, k: int, rng: np.random.Generator, n_init: int, max_iter: int) -> np.ndarray:
    """Lloyd's algorithm with k-means++ seeding; best of ``n_init`` restarts (lowest inertia).

    Decisions on nearly equal numbers follow :mod:`sim.roundoff`: a point equidistant (within ``TIE_RTOL``) from two
    centres goes to the lower-numbered one, and a restart replaces the best so far only if its inertia is lower by
    more than ``TIE_RTOL`` (relative), so roundoff never decides between restarts of equal quality."""
    N = X.shape[0]
    best_labels: np.ndarray | None = None
    best_inertia = np.inf
    for _ in range(n_init):
        centers = np.empty((k, X.shape[1]))
        centers[0] = X[rng.integers(N)]
        d2 = ((X - centers[0]) ** 2).sum(axis=1)
        for c in range(1, k):
            total = d2.sum()
            idx = int(rng.choice(N, p=d2 / total)) if total > 0 else int(rng.integers(N))
            centers[c] = X[idx]
            d2 = np.minimum(d2, ((X - centers[c]) ** 2).sum(axis=1))
        labels = np.full(N, -1, dtype=np.int64)
        for _it in range(max_iter):
            dist = ((X[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
            # nearest centre; distances within the resolution of each other are ties, broken by index
            new = first_min(dist, TIE_RTOL * dist.max(axis=1))
            # re-seed each empty cluster with the point farthest from its centre among the clusters that keep
            # another member (one exists while k <= N), so no cluster is emptied in turn; deterministic: the
            # lowest index among points equally far within the resolution
            for c in range(k):
                if not np.any(new == c):
                    movable = np.bincount(new, minlength=k)[new] > 1
                    dn = dist[np.arange(N), new]
                    far = int(first_max(np.where(movable, dn, -np.inf), TIE_RTOL * dn.max()))
                    new[far] = c
            if np.array_equal(new, labels):
                break
            labels = new
            for c in range(k):
                centers[c] = X[labels == c].mean(axis=0)
        inertia = float(((X - centers[labels]) ** 2).sum())
        if best_labels is None or inertia < best_inertia * (1.0 - TIE_RTOL):  # better by more than the resolution:
            best_inertia, best_labels = inertia, labels.copy()                  # the first restart wins ties
    if best_labels is None:
        raise ValueError(f"n_init must be a positive integer; got n_init={n_init!r}")
    return best_labels


def stage2_split(
    adjustments,
    method: str = "complete",
    threshold: float | None = None,
    k: int | None = None,
    rng: np.random.Generator | None = None,
    *,
    n_init: int = 10,
    max_iter: int = 300,
) -> np.ndarray:
    """Stage 2: split clients by the Euclidean proximity of their adjustment vectors ``A_i^ref``
    (docs/spec/algorithm.md#algorithm).

    ``adjustments``: ``(N, m)``. Returns labels ``(N,)`` numbered in order of first appearance.

    * ``method="complete"``: agglomerative clustering with complete linkage (scipy.cluster.hierarchy). With
      ``threshold = δ_A ≥ 0`` the tree is cut at cophenetic distance ``δ_A``; under complete linkage the
      cophenetic distance is the largest pairwise distance, so **every cluster has diameter ≤ δ_A**. With ``k``
      instead, the tree is cut into at most ``k`` clusters (``criterion="maxclust"``). Give exactly one of the two.
      Deterministic; ``rng`` is not used. Roundoff: a pairwise distance within roundoff of ``δ_A``, or two merge
      distances equal up to roundoff, can change the cut; these are genuine thresholds of the method, not ties
      (they do not occur in the planted problems of this package, whose clusters are separated by far more).
    * ``method="kmeans"``: k-means (Lloyd, k-means++ seeding, best of ``n_init`` restarts by inertia) with the
      given ``k`` (``1 ≤ k ≤ N``); requires ``rng`` (a ``numpy.random.Generator``) and is deterministic given it.
      Empty clusters are re-seeded with the point farthest from its centre.
    """
    X = _finite_array(adjustments, "adjustments", ndim=2)
    N = X.shape[0]
    if N == 0:
        raise ValueError("adjustments must hold at least one client; got shape (0, m)")
    if method not in ("complete", "kmeans"):
        raise ValueError(f"method must be 'complete' or 'kmeans'; got method={method!r}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
        raise ValueError(f"k must be a positive integer; got k={k!r}")
    if threshold is not None:
        t = float(threshold)
        if not np.isfinite(t) or t < 0.0:
            raise ValueError(f"threshold must be a finite number >= 0; got threshold={threshold!r}")
    if method == "complete":
        if (threshold is None) == (k is None):
            raise ValueError(
                f"method='complete' needs exactly one of threshold or k; got threshold={threshold!r}, k={k!r}"
            )
        if N == 1:
            return np.zeros(1, dtype=np.int64)
        Z = linkage(X, method="complete", metric="euclidean")
        if threshold is not None:
            raw = fcluster(Z, t=float(threshold), criterion="distance")
        elif k is not None:  # exactly one of the two is given (checked above)
            raw = fcluster(Z, t=int(k), criterion="maxclust")
        return _canonical_labels(np.asarray(raw))
    # kmeans
    if k is None:
        raise ValueError("method='kmeans' needs the number of clusters k; got k=None")
    if threshold is not None:
        raise ValueError(f"method='kmeans' takes k, not threshold; got threshold={threshold!r}")
    if k > N:
        raise ValueError(f"k must be <= the number of clients N={N}; got k={k!r}")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"method='kmeans' needs rng, a numpy.random.Generator; got rng={rng!r}")
    if n_init < 1 or max_iter < 1:
        raise ValueError(f"n_init and max_iter must be >= 1; got n_init={n_init!r}, max_iter={max_iter!r}")
    return _canonical_labels(_kmeans(X, int(k), rng, int(n_init), int(max_iter)))


@dataclass(frozen=True, eq=False)
class Clustering:
    """Result of :func:`cluster_clients` (Stage 1 then Stage 2, docs/spec/algorithm.md#algorithm).

    Attributes
    ----------
    labels : (N,) int, final cluster of each client, numbered in order of first appearance.
    clusters : list of sorted index arrays, ``clusters[n]`` = clients of cluster ``C_n``.
    stage1_labels : (N,) int, Stage-1 group of each client (order of first appearance).
    keys : (N, k) int, the Stage-1 key of each client (``k = m`` for the ordering, 1 for the bottleneck).
    adjustments_ref : (N, m) ``A_i^ref = A(l_i(w_ref), λ_i)``, the Stage-2 features.
    """

    labels: np.ndarray
    clusters: list
    stage1_labels: np.ndarray
    keys: np.ndarray
    adjustments_ref: np.ndarray

    @property
    def n_clusters(self) -> int:
        return len(self.clusters)


def cluster_clients(
    losses_ref,
    prefs,
    *,
    key: str = "ordering",
    stage2: bool = True,
    method: str = "complete",
    threshold: float | None = None,
    k: int | None = None,
    rng: np.random.Generator | None = None,
) -> Clustering:
    """Two-stage clustering of clients (docs/spec/algorithm.md#algorithm, docs/spec/open-points.md#o-17).

    ``losses_ref``: ``(N, m)`` losses ``l_i(w_ref)``; ``prefs``: ``(N, m)`` (or ``(m,)``) preferences ``λ_i``.
    Stage 1 groups by :func:`stage1_keys` (``key``); if ``stage2`` each Stage-1 group is split by
    :func:`stage2_split` on ``A_i^ref`` (``method``, ``threshold``, ``k``, ``rng``). With ``k``, each group of size
    ``s`` is split into ``min(k, s)`` clusters at most. Groups are processed in Stage-1 label order, so with a
    given ``rng`` the result is deterministic.
    """
    l, lam = _client_losses_prefs(losses_ref, prefs)
    keys = stage1_keys(l, lam, key=key)
    s1, _ = stage1_groups(l, lam, key=key)
    A_ref = adjustment(l, lam)
    if not isinstance(stage2, bool):
        raise ValueError(f"stage2 must be a bool; got stage2={stage2!r}")
    final = np.empty(l.shape[0], dtype=np.int64)
    if not stage2:
        final[:] = s1
    else:
        if method == "complete" and (threshold is None) == (k is None):
            raise ValueError(
                f"method='complete' needs exactly one of threshold or k; got threshold={threshold!r}, k={k!r}"
            )
        nxt = 0
        for g in range(int(s1.max()) + 1):
            idx = np.flatnonzero(s1 == g)
            kk = None if k is None else min(int(k), idx.size)
            sub = stage2_split(A_ref[idx], method=method, threshold=threshold, k=kk, rng=rng)
            final[idx] = sub + nxt
            nxt += int(sub.max()) + 1
    labels = _canonical_labels(final)
    clusters = [np.flatnonzero(labels == c) for c in range(int(labels.max()) + 1)]
    for c in clusters:
        c.flags.writeable = False
    return Clustering(
        labels=_readonly(labels),
        clusters=clusters,
        stage1_labels=_readonly(s1),
        keys=_readonly(keys),
        adjustments_ref=_readonly(A_ref),
    )
