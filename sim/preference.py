r"""Preference functions of one client at one point, batched over leading axes.

Notation (THEOREMS.md §1.2-1.3). For a loss vector ``l`` in R^m_{>0} and a preference ``λ`` in the open
simplex:

.. math::

    Z        &= \sum_j λ_j l_j                                   \quad\text{(normaliser)}\\
    ĺ_j      &= λ_j l_j / Z                                      \quad\text{(normalized_losses)}\\
    β        &= \sum_j ĺ_j \log(m ĺ_j) = KL(ĺ \,\|\, 1/m)         \quad\text{(preference_uniformity)}\\
    a_j      &= λ_j(\log(m ĺ_j) - β)                              \quad\text{(adjustment, A)}\\
    ψ        &= \max_j λ_j l_j                                    \quad\text{(chebyshev)}\\
    q        &= ψ · λ^{-1}                                        \quad\text{(ray_point)}

Identities (checked in the tests): (I1) ``Σ_j a_j l_j = 0``; (I2) ``∇_l β = A / Z``; (I3) ``∇_w β = G A / Z``;
(I4) ``d/ds β(l(w - s v)) = -vᵀ G A / Z`` at ``s = 0``; (I5) ``β ≈ Σ ε_j² / 2m`` near uniformity.

Every function accepts arrays with any number of leading (batch) axes; the objective axis is the last one.
Inputs are validated: a bad value raises :class:`ValueError` naming the argument and the value.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "SIMPLEX_ATOL",
    "check_preferences",
    "check_losses",
    "check_gram",
    "check_shapes",
    "normalizer",
    "normalized_losses",
    "preference_uniformity",
    "adjustment",
    "uniformity_and_adjustment",
    "chebyshev",
    "bottleneck_set",
    "ray_point",
]

#: Absolute tolerance on ``|Σ_j λ_j - 1|`` for a preference to count as on the simplex.
SIMPLEX_ATOL = 1e-9
#: Relative tolerance for symmetry and positive semi-definiteness of a Gram matrix (round-off allowance).
GRAM_RTOL = 1e-10


def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    idx = np.argwhere(mask)[0]
    return tuple(int(i) for i in idx)


def _as_float_array(x, name: str, min_ndim: int) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric array; got {x!r}") from exc
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s); got shape {arr.shape}")
    if arr.shape[-1] == 0:
        raise ValueError(f"{name} has an empty objective axis (shape {arr.shape})")
    return arr


def check_preferences(prefs, name: str = "prefs") -> np.ndarray:
    """Return ``prefs`` as float64 after checking that every row lies in the open simplex.

    Raises ``ValueError`` for NaN/inf entries, entries ``<= 0`` (the open simplex is required: THEOREMS.md
    §1.1) and rows whose sum differs from 1 by more than :data:`SIMPLEX_ATOL`.
    """
    lam = _as_float_array(prefs, name, 1)
    bad = ~np.isfinite(lam)
    if bad.any():
        at = _first_bad(bad)
        raise ValueError(f"{name} contains a non-finite entry {float(lam[at])!r} at index {at}")
    bad = lam <= 0.0
    if bad.any():
        at = _first_bad(bad)
        raise ValueError(
            f"{name} must lie in the open simplex (every entry > 0); entry {at} is {float(lam[at])!r}"
        )
    s = lam.sum(axis=-1)
    off = np.abs(s - 1.0) > SIMPLEX_ATOL
    if off.any():
        at = _first_bad(off) if s.ndim else ()
        row = lam[at] if at else lam
        raise ValueError(
            f"{name} must sum to 1 (open simplex); row {at} = {np.array2string(np.asarray(row))} "
            f"sums to {float(s[at] if at else s)!r}"
        )
    return lam


def check_losses(losses, name: str = "losses") -> np.ndarray:
    """Return ``losses`` as float64 after checking that every entry is finite and strictly positive."""
    l = _as_float_array(losses, name, 1)
    bad = ~np.isfinite(l)
    if bad.any():
        at = _first_bad(bad)
        raise ValueError(f"{name} contains a non-finite entry {float(l[at])!r} at index {at}")
    bad = l <= 0.0
    if bad.any():
        at = _first_bad(bad)
        raise ValueError(f"{name} must be strictly positive; entry {at} is {float(l[at])!r}")
    return l


def check_gram(gram, name: str = "gram") -> np.ndarray:
    """Return ``gram`` as float64 after checking it is a finite, symmetric, positive semi-definite ``(..., m, m)``.

    Symmetry and semi-definiteness are checked up to round-off: ``|C - Cᵀ| <= 1e-10·max(1, max|C|)`` and
    ``λ_min(C) >= -1e-10·max(1, ‖C‖_∞)``.
    """
    C = _as_float_array(gram, name, 2)
    if C.shape[-1] != C.shape[-2]:
        raise ValueError(f"{name} must be square in its last two axes; got shape {C.shape}")
    bad = ~np.isfinite(C)
    if bad.any():
        at = _first_bad(bad)
        raise ValueError(f"{name} contains a non-finite entry {float(C[at])!r} at index {at}")
    scale = np.maximum(1.0, np.abs(C).max(axis=(-2, -1)))
    asym = np.abs(C - np.swapaxes(C, -1, -2)).max(axis=(-2, -1))
    bad = asym > GRAM_RTOL * scale
    if np.any(bad):
        at = _first_bad(np.atleast_1d(bad)) if bad.ndim else ()
        raise ValueError(
            f"{name} must be symmetric; instance {at} has max |C - Cᵀ| = {float(np.atleast_1d(asym)[at] if at else asym):.3e}"
        )
    # λ_min(C) >= -δ with δ = 1e-10·max(1, ‖C‖_∞) (‖C‖_∞ >= λ_max): a Cholesky factorisation of C + δI proves
    # it cheaply; only when that fails are the eigenvalues computed, to decide and to name the instance.
    delta = GRAM_RTOL * np.maximum(1.0, np.abs(C).sum(axis=-1).max(axis=-1))
    try:
        np.linalg.cholesky(C + delta[..., None, None] * np.eye(C.shape[-1]))
    except np.linalg.LinAlgError:
        lo = np.linalg.eigvalsh(C)[..., 0]
        bad = lo < -delta
        if np.any(bad):
            at = _first_bad(np.atleast_1d(bad)) if bad.ndim else ()
            val = float(np.atleast_1d(lo)[at] if at else lo)
            raise ValueError(
                f"{name} must be positive semi-definite; instance {at} has smallest eigenvalue {val:.3e}"
            ) from None
    return C


def check_shapes(losses: np.ndarray, prefs: np.ndarray, gram: np.ndarray | None = None) -> None:
    """Check that losses ``(..., m)``, prefs ``(..., m)`` and gram ``(..., m, m)`` agree."""
    if losses.shape[-1] != prefs.shape[-1]:
        raise ValueError(
            f"losses and prefs disagree on the number of objectives m: losses shape {losses.shape}, "
            f"prefs shape {prefs.shape}"
        )
    try:
        np.broadcast_shapes(losses.shape, prefs.shape)
    except ValueError as exc:
        raise ValueError(
            f"losses shape {losses.shape} and prefs shape {prefs.shape} do not broadcast"
        ) from exc
    if gram is not None:
        m = losses.shape[-1]
        if gram.shape[-2:] != (m, m):
            raise ValueError(f"gram must have shape (..., {m}, {m}) to match losses; got {gram.shape}")
        try:
            np.broadcast_shapes(losses.shape[:-1], gram.shape[:-2])
        except ValueError as exc:
            raise ValueError(
                f"gram batch shape {gram.shape[:-2]} does not match losses batch shape {losses.shape[:-1]}"
            ) from exc


def _prepare(losses, prefs, validate: bool) -> tuple[np.ndarray, np.ndarray]:
    if validate:
        l = check_losses(losses)
        lam = check_preferences(prefs)
        check_shapes(l, lam)
    else:
        l = np.asarray(losses, dtype=np.float64)
        lam = np.asarray(prefs, dtype=np.float64)
    return l, lam


def normalizer(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """``Z = Σ_j λ_j l_j`` (shape ``(...)``)."""
    l, lam = _prepare(losses, prefs, validate)
    return (lam * l).sum(axis=-1)


def normalized_losses(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """``ĺ_j = λ_j l_j / Σ_k λ_k l_k`` (shape ``(..., m)``), a point of the open simplex."""
    l, lam = _prepare(losses, prefs, validate)
    wl = lam * l
    return wl / wl.sum(axis=-1, keepdims=True)


def _beta_from_lhat(lhat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = lhat.shape[-1]
    log_ml = np.log(m * lhat)
    beta = (lhat * log_ml).sum(axis=-1)
    # KL divergence is >= 0; clip the -1e-17 round-off at the uniform point.
    return np.maximum(beta, 0.0), log_ml


def preference_uniformity(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """Preference Uniformity ``β = Σ_j ĺ_j log(m ĺ_j) = KL(ĺ ‖ 1/m)`` in ``[0, log m]``.

    ``β = 0`` iff ``λ ⊙ l ∝ 1`` (the loss vector lies on the preference ray). EPO: ``mu_rl``.
    """
    lhat = normalized_losses(losses, prefs, validate=validate)
    return _beta_from_lhat(lhat)[0]


def adjustment(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """Adjustment vector ``A`` with ``a_j = λ_j (log(m ĺ_j) - β)`` (shape ``(..., m)``). EPO: ``a``.

    ``∇_l β = A / Z`` and ``Σ_j a_j l_j = 0``; ``A = 0`` iff ``β = 0``.
    """
    l, lam = _prepare(losses, prefs, validate)
    lhat = normalized_losses(l, lam, validate=False)
    beta, log_ml = _beta_from_lhat(lhat)
    return lam * (log_ml - beta[..., None])


def uniformity_and_adjustment(losses, prefs, *, validate: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(β, A)`` computed together (one logarithm per entry); the LP kernels use this."""
    l, lam = _prepare(losses, prefs, validate)
    lhat = normalized_losses(l, lam, validate=False)
    beta, log_ml = _beta_from_lhat(lhat)
    return beta, lam * (log_ml - beta[..., None])


def chebyshev(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """Chebyshev value ``ψ = max_j λ_j l_j`` (no reference point; shape ``(...)``)."""
    l, lam = _prepare(losses, prefs, validate)
    return (lam * l).max(axis=-1)


def bottleneck_set(losses, prefs, *, tol: float = 0.0, validate: bool = True) -> np.ndarray:
    """Boolean mask of ``J* = {j : λ_j l_j >= ψ - tol·ψ}`` (``tol = 0``: exact ties, as the EPO code)."""
    l, lam = _prepare(losses, prefs, validate)
    if not (tol >= 0.0):
        raise ValueError(f"tol must be >= 0; got {tol!r}")
    wl = lam * l
    psi = wl.max(axis=-1, keepdims=True)
    return wl >= psi - tol * psi


def ray_point(psi, prefs, *, validate: bool = True) -> np.ndarray:
    """Ray point ``q = ψ · λ^{-1}`` (shape ``(..., m)``): the loss vector on the preference ray at level ψ.

    ``l <= q`` componentwise, with equality iff ``β = 0``.
    """
    lam = check_preferences(prefs) if validate else np.asarray(prefs, dtype=np.float64)
    psi = np.asarray(psi, dtype=np.float64)
    if validate:
        if not np.all(np.isfinite(psi)):
            raise ValueError(f"psi must be finite; got {psi!r}")
        if np.any(psi <= 0):
            raise ValueError(f"psi must be strictly positive; got {psi!r}")
    return psi[..., None] / lam
