r"""Preference functions of one client at one point, batched over leading axes.

Notation (docs/spec/notation.md#uniformity, docs/spec/notation.md#chebyshev). For a loss vector ``l`` in
R^m_{>0} and a preference ``λ`` in the open simplex:

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

**Computation.** Nothing overflows or underflows, whatever the magnitude of the losses (``1e300`` and ``1e-300`` in
one vector, subnormal numbers): the weighted losses are rescaled exactly, by powers of two, and handled through
their logarithms ``y_j = log(λ_j l_j) - c`` (``c`` a per-row constant; ``ĺ`` is the softmax of ``y``). ``β`` is
computed from the centred logarithms ``d_j = y_j - ȳ`` as ``β = Σ_j ĺ_j d_j - log((1/m) Σ_j e^{d_j})`` with
``expm1``/``log1p``: its error is below ``ε·(β + √β + s)``, with ``s`` the spread ``log(max_j λ_j l_j / min_j λ_j
l_j)`` (measured against 60-digit arithmetic on 3,000 instances each of spreads 1e-14..1 near the ray, spreads up to
10, and magnitudes 1e-200..1e200: at most 0.97 of it; near the ray that is a few ``ε√β``, the limit set by the
rounding of the products ``λ_j l_j``), where the textbook ``Σ ĺ_j log(m ĺ_j)`` has an error of order ``ε`` and is pure
roundoff below ``β ≈ 1e-16``. ``log(m ĺ_j) =
d_j - log((1/m) Σ_k e^{d_k})`` is accurate to a few ulps in absolute terms.

**Preferences** of any floating dtype are accepted (float32 from a torch tensor, say): a row must sum to 1 within
``max(SIMPLEX_ATOL, 2·m·ε_dtype)``, the accuracy of a row normalised in its own precision, and every row is then
renormalised in float64 (``λ / Σλ``), so all kernels see the same point of the simplex.
"""

from __future__ import annotations

import numpy as np

from sim.roundoff import EPS, TIE_RTOL
from sim.roundoff import libm as _libm_math

__all__ = [
    "SIMPLEX_ATOL",
    "check_preferences",
    "simplex_tolerance",
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
    "log_ratios",
    "log_spread",
    "preference_parts",
    "PreferenceParts",
    "jstar_log_tolerance",
    "bottleneck_from_log_ratios",
]

#: Absolute tolerance on ``|Σ_j λ_j - 1|`` for a preference to count as on the simplex.
SIMPLEX_ATOL = 1e-9
#: Relative tolerance for symmetry and positive semi-definiteness of a Gram matrix (round-off allowance).
GRAM_RTOL = 1e-10


def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    idx = np.argwhere(mask)[0]
    return tuple(int(i) for i in idx)


def _input_dtype(x) -> np.dtype:
    """The dtype ``x`` arrives in (numpy arrays and scalars, array-likes such as CPU torch tensors, lists)."""
    try:
        return np.asarray(x).dtype
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a torch tensor that requires grad
        return np.dtype(object)


def _grad_hint(x) -> str:
    """The hint for a torch tensor that numpy cannot read because it requires grad."""
    return " (a tensor that requires grad: pass tensor.detach())" if getattr(x, "requires_grad", False) else ""


def _as_float_array(x, name: str, min_ndim: int) -> np.ndarray:
    kind = _input_dtype(x).kind
    if kind == "c":
        raise ValueError(f"{name} must be real; got a complex array {np.asarray(x)!r}")
    if kind == "b":
        raise ValueError(f"{name} must be a real numeric array, not booleans; got {np.asarray(x)!r}")
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} must be a numeric array{_grad_hint(x)}; got {x!r}") from exc
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s); got shape {arr.shape}")
    if arr.shape[-1] == 0:
        raise ValueError(f"{name} has an empty objective axis (shape {arr.shape})")
    return arr


def simplex_tolerance(dtype, m: int) -> float:
    """Tolerance on ``|Σ_j λ_j - 1|`` for preferences given in ``dtype``: ``max(SIMPLEX_ATOL, 2·m·ε_dtype)``.

    A row normalised in its own precision (float32: ``ε = 1.2e-7``) sums to 1 only within a few ulps of that
    precision; float64 rows (and integers, lists) get :data:`SIMPLEX_ATOL`.
    """
    dt = np.dtype(dtype)
    eps = float(np.finfo(dt).eps) if dt.kind == "f" else 0.0
    return max(SIMPLEX_ATOL, 2.0 * m * eps)


def check_preferences(prefs, name: str = "prefs") -> np.ndarray:
    """Return ``prefs`` as float64 rows of the open simplex, renormalised in float64 (``λ / Σλ``).

    Raises ``ValueError`` for complex or NaN/inf entries, entries ``<= 0`` (the open simplex is required:
    docs/spec/notation.md#clients) and rows whose sum differs from 1 by more than :func:`simplex_tolerance` of
    the input dtype (:data:`SIMPLEX_ATOL` for float64). Every check names the first bad row, whatever the
    other rows hold.
    """
    dtype = _input_dtype(prefs)
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
    tol = simplex_tolerance(dtype, lam.shape[-1])
    off = np.abs(s - 1.0) > tol
    if off.any():
        at = _first_bad(off) if s.ndim else ()
        row = lam[at] if at else lam
        where = f"row {at} = " if at else ""
        raise ValueError(
            f"{name} must sum to 1 (open simplex, tolerance {tol:.1e} for {np.dtype(dtype).name} input); {where}"
            f"{np.array2string(np.asarray(row), precision=17, separator=', ')} sums to {float(s[at] if at else s)!r}"
        )
    return lam / s[..., None]


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


_LN2 = float(np.log(2.0))
#: Spread (in log units) up to which the logarithms are centred on their mean (best accuracy near the ray); above
#: it they are centred on their maximum (no overflow in ``e^d``). Both give the same values up to roundoff.
_MEAN_CENTRE_MAX_SPREAD = 50.0


def _numpy_math(name: str, x):
    return getattr(np, name)(x)


def _log_weights(l: np.ndarray, lam: np.ndarray, fn=_numpy_math) -> np.ndarray:
    """``y_j = log(λ_j l_j) - c`` with a per-row constant ``c`` (a power of two), without overflow or underflow.

    ``l = a·2^p``, ``λ = b·2^q`` (``frexp``: exact); ``λ_j l_j = (a_j b_j)·2^{p_j+q_j}`` with ``a_j b_j ∈ [1/4, 1)``
    rounded once; ``y_j = log(a_j b_j) + (p_j + q_j - max_k(p_k + q_k))·log 2``. ``fn(name, x)`` applies the
    elementary function ``name`` (numpy's ufuncs, or :func:`sim.roundoff.libm`).
    """
    ma, ea = np.frexp(l)
    mb, eb = np.frexp(lam)
    e = ea + eb
    e = e - e.max(axis=-1, keepdims=True)
    return fn("log", ma * mb) + e * _LN2


class PreferenceParts:
    """Everything the preference functions compute from one ``(l, λ)``, computed once (module docstring).

    Attributes (batch shape ``(...)``):
        lhat:   ``ĺ`` ``(..., m)``.
        x:      ``log(m ĺ_j)`` ``(..., m)``.
        beta:   ``β`` ``(...)``.
        spread: ``log(max_j λ_j l_j / min_j λ_j l_j)`` ``(...)``, 0 exactly on the ray.
        adjustment: ``A`` ``(..., m)``, computed as ``a_j = λ_j Σ_k ĺ_k (y_j - y_k)`` (``= λ_j (x_j - β)``): a sum
            of terms of one sign where ``ĺ_j ≈ 1``, so a dominant objective's tiny ``a_j`` keeps its relative
            accuracy (``λ_j (x_j - β)`` would be the difference of two numbers near ``log m``).
        beta_resolution: ``TIE_RTOL·Σ_k ĺ_k |x_k - β| + 8mε·β``: the first-order change of ``β`` under relative
            perturbations of the weighted losses of size ``TIE_RTOL`` (:mod:`sim.roundoff`), plus its roundoff.
        adjustment_resolution: ``(..., m)``, the same for ``a_j``:
            ``λ_j (2·TIE_RTOL((1 - ĺ_j) + Σ_k ĺ_k |y_j - y_k|) + 4mε Σ_{k≠j} ĺ_k (|y_j| + |y_k| + |y_j - y_k|))``.
        adjustment_roundoff: ``(..., m)``, its roundoff part alone, ``λ_j 4mε Σ_{k≠j} ĺ_k (|y_j| + |y_k| +
            |y_j - y_k|)``: a bound on the error of the computed ``a_j`` against the exact ``a_j`` of the float
            data (the rounding of ``y`` and of the sum), without any perturbation of the data.

    ``libm=True`` computes the logarithms and exponentials with the C math library's scalar functions
    (:func:`sim.roundoff.libm`) instead of numpy's SIMD ufuncs: the LP data builder does, so that the numpy reference
    and the compiled twin (which calls the same functions) build bit-identical LP data.
    """

    __slots__ = ("lhat", "x", "beta", "spread", "_y", "_lam", "_terms")

    def __init__(self, l: np.ndarray, lam: np.ndarray, libm: bool = False):
        fn = _libm_math if libm else _numpy_math
        y = _log_weights(l, lam, fn)
        m = y.shape[-1]
        ymax = y.max(axis=-1, keepdims=True)
        self.spread = ymax[..., 0] - y.min(axis=-1)
        centre = np.where((self.spread <= _MEAN_CENTRE_MAX_SPREAD)[..., None], y.mean(axis=-1, keepdims=True), ymax)
        d = y - centre
        u = fn("expm1", d)
        S = u.mean(axis=-1, keepdims=True)  # (1/m) Σ e^d - 1
        L = fn("log1p", S)  # log((1/m) Σ e^d)
        ed = 1.0 + u
        self.lhat = fn("exp", d) / (m * (1.0 + S))  # e^d, not 1 + expm1(d): small entries keep their relative accuracy
        self.x = d - L
        first = (ed * d).mean(axis=-1) / (1.0 + S[..., 0])
        # β = Σ ĺ_j d_j - log((1/m) Σ e^{d_j}) >= 0 (a KL divergence); clip the last-ulp roundoff below 0.
        self.beta = np.maximum(first - L[..., 0], 0.0)
        self._y = y
        self._lam = lam
        self._terms: tuple[np.ndarray, np.ndarray] | None = None

    def _pairs(self) -> np.ndarray:
        return self._y[..., :, None] - self._y[..., None, :]  # y_j - y_k

    # Sums over the objective axis are written as products summed along the last axis (numpy's pairwise order, the
    # same on every CPU; einsum's order depends on the SIMD width), so that the compiled twin of the LP data builder
    # (sim._lp_compiled) can perform the same rounded operations.

    @property
    def adjustment(self) -> np.ndarray:
        return self._lam * (self._pairs() * self.lhat[..., None, :]).sum(axis=-1)

    @property
    def beta_resolution(self) -> np.ndarray:
        m = self.x.shape[-1]
        dev = np.abs(self.x - self.beta[..., None])
        return TIE_RTOL * (self.lhat * dev).sum(axis=-1) + 8.0 * m * EPS * self.beta

    def _adjustment_terms(self) -> tuple[np.ndarray, np.ndarray]:
        """``(1 - ĺ_j) + Σ_k ĺ_k |y_j - y_k|`` and ``Σ_{k≠j} ĺ_k (|y_j| + |y_k| + |y_j - y_k|)``, ``(..., m)`` each
        (computed once: the LP builder reads both the resolution and the roundoff of ``A``)."""
        if self._terms is not None:
            return self._terms
        m = self.x.shape[-1]
        P = self._pairs()
        lh = self.lhat
        rest = np.maximum(lh.sum(axis=-1, keepdims=True) - lh, 0.0)  # 1 - ĺ_j without cancellation near ĺ_j = 1
        lk = lh[..., None, :]
        spread_j = (np.abs(P) * lk).sum(axis=-1)
        off = 1.0 - np.eye(m)
        ay = np.abs(self._y)
        rnd = ((off * (ay[..., :, None] + ay[..., None, :] + np.abs(P))) * lk).sum(axis=-1)
        self._terms = (rest + spread_j, rnd)
        return self._terms

    @property
    def adjustment_resolution(self) -> np.ndarray:
        m = self.x.shape[-1]
        sens, rnd = self._adjustment_terms()
        return self._lam * (2.0 * TIE_RTOL * sens + 4.0 * m * EPS * rnd)

    @property
    def adjustment_roundoff(self) -> np.ndarray:
        m = self.x.shape[-1]
        _, rnd = self._adjustment_terms()
        return self._lam * (4.0 * m * EPS * rnd)


def normalized_losses(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """``ĺ_j = λ_j l_j / Σ_k λ_k l_k`` (shape ``(..., m)``), a point of the open simplex (entries of a vector whose
    weighted losses span more than ~700 orders of magnitude can underflow to 0)."""
    l, lam = _prepare(losses, prefs, validate)
    return PreferenceParts(l, lam).lhat


def log_ratios(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """``x_j = log(m ĺ_j)`` (shape ``(..., m)``), accurate to a few ulps in absolute terms for any magnitudes."""
    l, lam = _prepare(losses, prefs, validate)
    return PreferenceParts(l, lam).x


def log_spread(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """``log(max_j λ_j l_j / min_j λ_j l_j) >= 0`` (shape ``(...)``): 0 iff the losses lie on the preference ray.

    The LP data builder treats a spread ``<= TIE_RTOL`` as exactly on the ray (:mod:`sim.direction`)."""
    l, lam = _prepare(losses, prefs, validate)
    return PreferenceParts(l, lam).spread


def preference_uniformity(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """Preference Uniformity ``β = Σ_j ĺ_j log(m ĺ_j) = KL(ĺ ‖ 1/m)`` in ``[0, log m]``.

    ``β = 0`` iff ``λ ⊙ l ∝ 1`` (the loss vector lies on the preference ray). EPO: ``mu_rl``. Error below
    ``ε·(β + √β + spread)``, for any magnitudes of the losses (see the module docstring).
    """
    l, lam = _prepare(losses, prefs, validate)
    return PreferenceParts(l, lam).beta


def adjustment(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """Adjustment vector ``A`` with ``a_j = λ_j (log(m ĺ_j) - β)`` (shape ``(..., m)``). EPO: ``a``.

    ``∇_l β = A / Z`` and ``Σ_j a_j l_j = 0``; ``A = 0`` iff ``β = 0``.
    """
    l, lam = _prepare(losses, prefs, validate)
    return PreferenceParts(l, lam).adjustment


def uniformity_and_adjustment(losses, prefs, *, validate: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(β, A)`` computed together; the LP kernels use this."""
    l, lam = _prepare(losses, prefs, validate)
    parts = PreferenceParts(l, lam)
    return parts.beta, parts.adjustment


def preference_parts(losses, prefs, *, validate: bool = True, libm: bool = False) -> PreferenceParts:
    """:class:`PreferenceParts` of ``(l, λ)``: ``β``, ``A``, ``x = log(m ĺ)``, the spread and the resolutions of
    ``β`` and ``A`` computed together (the LP data builder uses all of them, with ``libm=True``)."""
    l, lam = _prepare(losses, prefs, validate)
    return PreferenceParts(l, lam, libm=libm)


def jstar_log_tolerance(tol, *, widen: bool = True) -> np.ndarray:
    """Tolerance in log units of ``J* = {j : λ_j l_j >= ψ - tol·ψ}``, widened to the resolution: ties within
    ``TIE_RTOL`` are ties whatever ``tol`` is (``tol = 0``: ties to within roundoff, as the EPO code's exact ties
    on exact data). ``tol >= 1`` admits every objective (``inf``). ``widen=False``: ``-log(1 - tol)`` itself, the
    tolerance the exact data would use (an objective between the two is a tie only by rule (R2), and the LP
    builder flags it ``ambiguous``)."""
    t = np.asarray(tol, dtype=np.float64)
    below = t < 1.0
    exact = np.where(below, -np.log1p(-np.where(below, t, 0.0)), np.inf)
    return np.maximum(exact, TIE_RTOL) if widen else exact


def chebyshev(losses, prefs, *, validate: bool = True) -> np.ndarray:
    """Chebyshev value ``ψ = max_j λ_j l_j`` (no reference point; shape ``(...)``)."""
    l, lam = _prepare(losses, prefs, validate)
    return (lam * l).max(axis=-1)


def bottleneck_from_log_ratios(x, tol=0.0) -> np.ndarray:
    """``J*`` from ``x_j = log(m ĺ_j)`` (or any per-row shift of ``log(λ_j l_j)``): ``x_j >= max_k x_k - t`` with
    ``t`` = :func:`jstar_log_tolerance` ``(tol)``; ``tol`` broadcasts against the batch shape."""
    x = np.asarray(x, dtype=np.float64)
    return x >= x.max(axis=-1, keepdims=True) - jstar_log_tolerance(tol)[..., None]


def bottleneck_set(losses, prefs, *, tol: float = 0.0, validate: bool = True) -> np.ndarray:
    """Boolean mask of ``J* = {j : λ_j l_j >= ψ - tol·ψ}``, ties within the resolution ``TIE_RTOL`` included.

    ``tol = 0``: the maximisers, with weighted losses that agree to within ``TIE_RTOL`` (relative) counted as ties
    (:mod:`sim.roundoff`): on the preference ray ``J* = [m]`` however the losses were rounded.
    """
    l, lam = _prepare(losses, prefs, validate)
    try:
        ok = float(tol) >= 0.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"tol must be a number >= 0; got {tol!r}")
    return bottleneck_from_log_ratios(_log_weights(l, lam), tol)


def ray_point(psi, prefs, *, validate: bool = True) -> np.ndarray:
    """Ray point ``q = ψ · λ^{-1}`` (shape ``(..., m)``): the loss vector on the preference ray at level ψ.

    ``l <= q`` componentwise, with equality iff ``β = 0``.
    """
    lam = check_preferences(prefs) if validate else np.asarray(prefs, dtype=np.float64)
    try:
        psi = np.asarray(psi, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"psi must be a numeric array{_grad_hint(psi)}; got {psi!r}") from exc
    if validate:
        try:
            np.broadcast_shapes(psi.shape + (1,), lam.shape)
        except ValueError:
            raise ValueError(f"psi of shape {psi.shape} does not broadcast against prefs of shape {lam.shape} "
                             f"(psi carries one value per preference vector: shape {lam.shape[:-1]})") from None
        for bad, what in ((~np.isfinite(psi), "finite"), (psi <= 0, "strictly positive")):
            if bad.any():
                at = _first_bad(bad)
                where = f"entry {at} is" if at else "got"
                raise ValueError(f"psi must be {what}; {where} {float(psi[at])!r}")
    with np.errstate(over="ignore"):
        q = psi[..., None] / lam
    if validate and not np.all(np.isfinite(q)):
        at = _first_bad(~np.isfinite(q))
        raise ValueError(
            f"ray_point overflows: psi / prefs is not representable in float64 at index {at} "
            f"(psi = {float(np.broadcast_to(psi[..., None], q.shape)[at])!r}, prefs entry "
            f"{float(np.broadcast_to(lam, q.shape)[at])!r})"
        )
    return q
