r"""Batched quadratic objectives ``l_j(w) = ½(w - c_j)ᵀQ_j(w - c_j) + b_j`` and shared helpers
(docs/spec/problems.md#families).

Shapes: points ``w`` are ``(..., n_w)``; centres ``c`` are ``(*C, m, n_w)``; Hessians ``Q`` ``(m, n_w, n_w)``;
offsets ``b`` ``(*C, m)``. Broadcasting follows numpy: ``losses(w[..., None, :], c)`` with ``c`` of shape
``(N, m, n_w)`` evaluates all ``N`` clients at every point.
"""

from __future__ import annotations

import numpy as np

from sim.preference import check_preferences


def check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    return rng


def check_int(value, name: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer; got {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng_txt = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {rng_txt}; got {value!r}")
    return int(value)


def check_nonneg(value, name: str, *, positive: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real number; got {value!r}") from exc
    if not np.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(f"{name} must be finite and {'> 0' if positive else '>= 0'}; got {value!r}")
    return v


def check_points(w, n_w: int, name: str = "w") -> np.ndarray:
    """Return points ``(..., n_w)`` as float64 after checking shape and finiteness."""
    try:
        arr = np.asarray(w, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric array; got {w!r}") from exc
    if arr.ndim < 1 or arr.shape[-1] != n_w:
        raise ValueError(f"{name} must have shape (..., {n_w}); got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains a non-finite entry")
    return arr


def normalize(x, axis: int = -1) -> np.ndarray:
    """``x / Σ x`` along ``axis``."""
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum(axis=axis, keepdims=True)


def interior_preferences(rng: np.random.Generator, size, m: int) -> np.ndarray:
    """Random interior preferences ``0.95·Dirichlet(1) + 0.05/m`` (F6), shape ``size + (m,)``."""
    size = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    return 0.95 * rng.dirichlet(np.ones(m), size=size) + 0.05 / m


def with_min_entry(prefs, lambda_min: float) -> np.ndarray:
    """``prefs`` (``(..., m)``, on the simplex) with its smallest entry set to ``lambda_min`` and the others scaled
    to keep the sum 1 (preferences with a tiny ``λ_min`` for the search's stress corner); ``0 < lambda_min < 1/m``."""
    p = np.asarray(prefs, dtype=np.float64)
    m = p.shape[-1]
    if not (np.isfinite(lambda_min) and 0.0 < lambda_min < 1.0 / m):
        raise ValueError(f"lambda_min must lie in (0, 1/m) = (0, {1.0 / m:g}); got {lambda_min!r}")
    j = np.argmin(p, axis=-1)[..., None]
    rest = p.copy()
    np.put_along_axis(rest, j, 0.0, axis=-1)
    out = rest * (1.0 - lambda_min) / rest.sum(axis=-1, keepdims=True)
    np.put_along_axis(out, j, lambda_min, axis=-1)
    return out


def random_orthogonal(rng: np.random.Generator, n: int, size=()) -> np.ndarray:
    """Haar-distributed orthogonal matrices ``(*size, n, n)`` (QR of a Gaussian with the sign fix)."""
    size = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    A = rng.standard_normal(size + (n, n))
    Qm, R = np.linalg.qr(A)
    s = np.sign(np.diagonal(R, axis1=-2, axis2=-1))
    s = np.where(s == 0, 1.0, s)
    return Qm * s[..., None, :]


def random_quadratics(
    rng: np.random.Generator,
    m: int,
    n_w: int,
    *,
    size=(),
    s_c: float = 1.0,
    kappa_Q: float = 3.0,
    b_min: float = 0.3,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """F1 objectives: ``c_j ~ N(0, s_c² I)``, ``Q_j = U_j diag(exp(Unif(0, log κ_Q))) U_jᵀ``, ``b_j = b_min + Unif(0,1)``.

    Returns ``(centres (*size, m, n_w), hessians (*size, m, n_w, n_w), offsets (*size, m))``.
    """
    size = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    c = s_c * rng.standard_normal(size + (m, n_w))
    U = random_orthogonal(rng, n_w, size + (m,))
    ev = np.exp(rng.uniform(0.0, np.log(kappa_Q), size + (m, n_w)))
    Q = (U * ev[..., None, :]) @ np.swapaxes(U, -1, -2)
    Q = 0.5 * (Q + np.swapaxes(Q, -1, -2))
    b = b_min + rng.uniform(0.0, 1.0, size + (m,))
    return c, Q, b


def quad_losses(w: np.ndarray, centres: np.ndarray, hessians: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``l_j(w) = ½(w - c_j)ᵀQ_j(w - c_j) + b_j``; ``w`` ``(..., n_w)`` against centres ``(..., m, n_w)``."""
    e = w[..., None, :] - centres
    Qe = (hessians @ e[..., None])[..., 0]
    return 0.5 * np.einsum("...a,...a->...", e, Qe) + offsets


def quad_grads(w: np.ndarray, centres: np.ndarray, hessians: np.ndarray) -> np.ndarray:
    """``G = [Q_j(w - c_j)]_j`` with columns as gradients: shape ``(..., n_w, m)``."""
    e = w[..., None, :] - centres
    return np.swapaxes((hessians @ e[..., None])[..., 0], -1, -2)


def gram_of(G: np.ndarray) -> np.ndarray:
    """``C = GᵀG`` for ``G`` ``(..., n_w, m)``, symmetrised exactly."""
    C = np.swapaxes(G, -1, -2) @ G
    return 0.5 * (C + np.swapaxes(C, -1, -2))


def planted_point(u: np.ndarray, centres: np.ndarray, hessians: np.ndarray) -> np.ndarray:
    """``w(u) = (Σ_j u_j Q_j)^{-1} Σ_j u_j Q_j c_j`` (Pareto-optimal point; docs/spec/problems.md#f1,
    docs/spec/identities.md#s26).

    ``u`` ``(..., m)``, centres ``(..., m, n_w)``, Hessians ``(..., m, n_w, n_w)``; returns ``(..., n_w)``.
    """
    H = np.einsum("...j,...jab->...ab", u, hessians)
    rhs = np.einsum("...j,...jab,...jb->...a", u, hessians, centres)
    return np.linalg.solve(H, rhs[..., None])[..., 0]


def planted_preferences(losses_at_opt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``λ = normalize(1/l(w*))`` and ``ψ* = λ_j l_j(w*)`` (equal for every j; the mean is returned)."""
    lam = normalize(1.0 / losses_at_opt)
    psi = (lam * losses_at_opt).mean(axis=-1)
    check_preferences(lam, "planted prefs")
    return lam, psi
