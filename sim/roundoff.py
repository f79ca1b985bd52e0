r"""Roundoff resolution: when two computed numbers are treated as equal, and how ties are broken.

The kernels of :mod:`sim` take decisions on floating-point data: which objectives are bottlenecks (``J*``), which
entries of ``CA`` are positive (``J``), whether a client lies on its preference ray (``A = 0``), which mode the LP
uses (``β > eps_mode``), which vertex the simplex starts from and which variable it pivots on, the order of the
weighted losses (Stage-1 keys), the best of several k-means restarts. Data that differ only by roundoff — the same
losses computed by another BLAS kernel, another summation order, a float32 round trip — must give the same
decisions. Two rules make them do so.

**The resolution** :data:`TIE_RTOL` ``= 1e-12``. Two weighted losses ``λ_j l_j`` and ``λ_k l_k`` whose ratio differs
from 1 by at most ``TIE_RTOL`` are *ties*; a quantity whose magnitude is below the bound on its error that a
relative perturbation of the data by ``TIE_RTOL`` can cause is *zero*. ``TIE_RTOL`` is about ``4500·ε`` (machine
epsilon ``ε = 2.2e-16``): it covers the roundoff that the inputs themselves carry from the computations that
produced them (losses and Gram matrices summed over thousands of terms, float32 models), with room to spare, and it
is still far below any difference a statement or a training run resolves (the tolerances of the verification suite
are ``1e-9`` relative). Every rule that uses it is stated where it is used (:mod:`sim.preference`,
:mod:`sim.direction`, :mod:`sim.hull`, :mod:`sim.cluster`).

**Ties are broken by index.** Where several candidates are tied within the resolution, the one with the smallest
index wins (the first maximiser, a stable order). A decision then changes only when the data cross a resolution
boundary, not when roundoff reorders nearly equal numbers.

Every entry a rule changes (the LP solved is then not the exact LP of the float data) and every decision that
remains sensitive — data that sit within the resolution of a threshold that is not a tie, such as ``β`` within its
own resolution of ``eps_mode`` — are *reported* (:attr:`sim.direction.DirectionResult.ambiguous`), not hidden. A
rule never overrides a sign that the float data decide (an entry is set to 0 only where its error bound reaches its
magnitude).

:class:`JitteredGenerator` is the instrument that checks all this end to end: a ``numpy.random.Generator`` whose
continuous draws are multiplied by ``1 + rel·u`` (``u ~ U(-1, 1)`` from an independent stream), so that every
problem built from it is perturbed by the relative amount ``rel`` (``python -m verification run --jitter 1e-14``).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "TIE_RTOL",
    "EPS",
    "gamma",
    "tie_mask_max",
    "first_max",
    "first_min",
    "order_desc",
    "zero_below",
    "libm",
    "JitteredGenerator",
]

#: Relative resolution of every decision taken on floating-point data (see the module docstring).
TIE_RTOL = 1e-12
#: Machine epsilon of float64.
EPS = float(np.finfo(np.float64).eps)


def gamma(n: int) -> float:
    """``γ_n = nε/(1 − nε)``: the standard bound on the relative rounding error of a sum or dot product of ``n``
    terms (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1): ``|fl(xᵀy) − xᵀy| ≤ γ_n |x|ᵀ|y|``."""
    n = int(n)
    if n < 0 or n * EPS >= 1.0:
        raise ValueError(f"n must satisfy 0 <= n < 1/eps; got {n}")
    return n * EPS / (1.0 - n * EPS)


def tie_mask_max(values, atol, axis: int = -1) -> np.ndarray:
    """Boolean mask of the entries within ``atol`` of the maximum along ``axis``: ``v_j >= max v - atol``.

    ``atol`` broadcasts against ``values`` with ``axis`` removed (a per-row tolerance) or is a scalar.
    """
    v = np.asarray(values, dtype=np.float64)
    vmax = v.max(axis=axis, keepdims=True)
    tol = np.expand_dims(np.asarray(atol, dtype=np.float64), axis) if np.ndim(atol) else atol
    return v >= vmax - tol


def first_max(values, atol, axis: int = -1) -> np.ndarray:
    """Index of the first entry within ``atol`` of the maximum along ``axis`` (ties within ``atol`` go to the
    smallest index)."""
    return np.argmax(tie_mask_max(values, atol, axis=axis), axis=axis)


def first_min(values, atol, axis: int = -1) -> np.ndarray:
    """Index of the first entry within ``atol`` of the minimum along ``axis``."""
    return first_max(-np.asarray(values, dtype=np.float64), atol, axis=axis)


def order_desc(values, rtol: float = TIE_RTOL) -> np.ndarray:
    """Descending order of every row of ``values`` (shape ``(..., m)``, entries > 0), ties broken by index.

    Two entries are tied when their ratio differs from 1 by at most ``rtol``; tied entries keep ascending index
    order. The order is built greedily: at each position the smallest-index entry among the remaining ones that is
    tied with the remaining maximum is taken, so the result changes only where a ratio crosses ``1 ± rtol``, never
    when roundoff reorders numbers that agree to within ``rtol``. Cost ``O(m²)`` per row (``m`` is the number of
    objectives).
    """
    v = np.asarray(values, dtype=np.float64)
    shape = v.shape
    v = v.reshape(-1, shape[-1]).copy()
    n, m = v.shape
    out = np.empty((n, m), dtype=np.int64)
    rows = np.arange(n)
    for k in range(m):
        vmax = v.max(axis=1)
        j = np.argmax(v >= (vmax - rtol * np.abs(vmax))[:, None], axis=1)
        out[:, k] = j
        v[rows, j] = -np.inf
    return out.reshape(shape)


def zero_below(values, resolution) -> np.ndarray:
    """``values`` with every entry of magnitude ``<= resolution`` (broadcast) replaced by an exact 0."""
    v = np.asarray(values, dtype=np.float64)
    return np.where(np.abs(v) <= resolution, 0.0, v)


_LIBM = {"log": (math.log, np.log), "exp": (math.exp, np.exp), "expm1": (math.expm1, np.expm1),
         "log1p": (math.log1p, np.log1p)}


def libm(name: str, x) -> np.ndarray:
    """The C math library's ``name`` (``"log"``, ``"exp"``, ``"expm1"`` or ``"log1p"``) applied to every entry of
    ``x``: the scalar function that Python's :mod:`math` and numba's compiled code both call, so that a numpy
    computation and its compiled twin (:mod:`sim._lp_compiled`) round alike, bit for bit. numpy's own ufuncs use SIMD
    implementations on CPUs that have them (AVX-512: Intel's SVML), which differ from the C library in the last bit
    for about 1 in 1,000 (``log``) to 1 in 12 (``expm1``) arguments, and from one CPU to another. About 0.1-0.4 µs
    per entry (a Python-level loop); entries whose numpy value is not finite keep it (``math`` would raise)."""
    scalar, vector = _LIBM[name]
    out = vector(np.asarray(x, dtype=np.float64))
    fin = np.isfinite(out)
    if fin.all():
        flat = np.asarray(x, dtype=np.float64).ravel()
        return np.fromiter(map(scalar, flat.tolist()), np.float64, flat.size).reshape(out.shape)
    src = np.broadcast_to(np.asarray(x, dtype=np.float64), out.shape)[fin]
    out[fin] = np.fromiter(map(scalar, src.tolist()), np.float64, src.size)
    return out


# ------------------------------------------------------------------------------------------------ jitter

#: Continuous distributions of ``numpy.random.Generator`` whose draws are jittered (every other method —
#: integers, choice, permutation, shuffle — is discrete and left unchanged).
_CONTINUOUS = (
    "random", "uniform", "standard_normal", "normal", "lognormal", "exponential", "standard_exponential",
    "gamma", "standard_gamma", "beta", "dirichlet", "chisquare", "laplace", "logistic", "multivariate_normal",
    "standard_t", "standard_cauchy", "gumbel", "weibull", "pareto", "rayleigh", "triangular", "vonmises", "wald",
    "f", "noncentral_chisquare", "noncentral_f", "power",
)


class JitteredGenerator(np.random.Generator):
    """A ``numpy.random.Generator`` whose continuous draws carry a relative perturbation of size ``rel``.

    It draws exactly what ``numpy.random.default_rng(seed)`` draws (the same bit stream, so discrete draws and the
    structure of every problem are unchanged), then multiplies each continuous draw ``x`` by ``1 + rel·u`` with
    ``u ~ U(-1, 1)`` taken from an independent generator seeded by ``jitter_seed``. A problem built from it is the
    problem of the plain seed with its data perturbed by the relative amount ``rel`` — what another CPU's roundoff
    does to the same computation — and it stays internally consistent (planted optima are planted on the perturbed
    data). ``rel = 0`` reproduces the plain generator exactly.

    :meth:`child` derives a new jittered generator from this one (for code that seeds a sub-generator from a draw).
    """

    def __init__(self, seed, rel: float, jitter_seed: int = 0):
        rel = float(rel)
        if not np.isfinite(rel) or rel < 0:
            raise ValueError(f"jitter rel must be a finite number >= 0; got {rel!r}")
        super().__init__(np.random.PCG64(seed))
        self.rel = rel
        self.jitter_seed = jitter_seed
        self._jitter = np.random.default_rng(jitter_seed)

    def child(self, seed) -> JitteredGenerator:
        """A jittered generator seeded by ``seed``, with a jitter stream drawn from this one's."""
        return JitteredGenerator(seed, self.rel, int(self._jitter.integers(0, 2**63 - 1)))

    def _perturb(self, x):
        if self.rel == 0.0:
            return x
        arr = np.asarray(x, dtype=np.float64)
        out = arr * (1.0 + self.rel * self._jitter.uniform(-1.0, 1.0, arr.shape))
        return out if isinstance(x, np.ndarray) else float(out)


def _jittered(name):
    base = getattr(np.random.Generator, name)

    def method(self, *args, **kwargs):
        if kwargs.get("out") is not None:
            base(self, *args, **kwargs)
            kwargs["out"][...] = self._perturb(kwargs["out"])
            return kwargs["out"]
        return self._perturb(base(self, *args, **kwargs))

    method.__name__ = name
    method.__doc__ = f"``numpy.random.Generator.{name}`` with the relative jitter applied."
    return method


for _name in _CONTINUOUS:
    setattr(JitteredGenerator, _name, _jittered(_name))
del _name


def generator_state(rng: np.random.Generator):
    """The full state of ``rng`` (the jitter stream included for a :class:`JitteredGenerator`)."""
    if isinstance(rng, JitteredGenerator):
        return (rng.bit_generator.state, rng._jitter.bit_generator.state)
    return rng.bit_generator.state


def set_generator_state(rng: np.random.Generator, state) -> None:
    """Restore a state taken by :func:`generator_state`."""
    if isinstance(rng, JitteredGenerator):
        rng.bit_generator.state, rng._jitter.bit_generator.state = state
    else:
        rng.bit_generator.state = state


def child_generator(rng: np.random.Generator) -> np.random.Generator:
    """A new generator seeded by one draw of ``rng``; jittered like ``rng`` when ``rng`` is jittered."""
    seed = int(rng.integers(0, 2**63 - 1))
    if isinstance(rng, JitteredGenerator):
        return rng.child(seed)
    return np.random.default_rng(seed)


__all__ += ["child_generator", "generator_state", "set_generator_state"]
