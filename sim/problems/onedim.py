r"""One-dimensional examples F4 (double well, H.18(a)) and F5 (kink, H.18(b)); docs/spec/problems.md#families.

F4: ``n_w = 1``, ``m = 1``, ``λ = 1``, ``l(w) = (w² - 1)² + w/4 + 3/2`` (> 0). Global minimum ``w ≈ -1.0299``,
``ψ* ≈ 1.246209``; spurious local minimum ``w ≈ 0.9676``, ``l ≈ 1.745964``. With ``m = 1`` the LP returns
``μ = 1`` and ``d = l'(w)``: EPO is gradient descent. Optimum by a dense grid (F-OPT step 3).

F5: ``n_w = 1``, ``m = 2``, ``λ = (½, ½)``, ``l_1 = 1 + w``, ``l_2 = 1 - w`` on ``|w| < 1``.
``ψ = (1 + |w|)/2``, ``ψ* = ½``, ``w* = 0``, ``L₀ = 0``, ``B = 1``, ``ε_act = η``;
``λ_1 l_1 - λ_2 l_2 = w`` so ``J*_ε = {1, 2}`` iff ``|w| ≤ ε_act``; ``0 ∈ conv{½, -½}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.preference import chebyshev, preference_uniformity
from sim.problems._quadratic import check_nonneg, check_points, gram_of
from sim.problems.fopt import GridMinima, grid_minimize_1d

__all__ = ["DoubleWell", "Kink"]


@dataclass(frozen=True, eq=False)
class DoubleWell:
    """F4: ``l(w) = (w² - 1)² + tilt·w + offset`` with ``tilt = 0.25``, ``offset = 1.5`` (defaults of
    docs/spec/problems.md#families)."""

    tilt: float = 0.25
    offset: float = 1.5

    n_params = 1
    n_objectives = 1

    def __post_init__(self):
        check_nonneg(self.offset, "offset", positive=True)
        if not np.isfinite(self.tilt):
            raise ValueError(f"tilt must be finite; got {self.tilt!r}")

    @property
    def prefs(self) -> np.ndarray:
        return np.array([1.0])

    def _scalar_loss(self, x: np.ndarray) -> np.ndarray:
        return (x**2 - 1.0) ** 2 + self.tilt * x + self.offset

    def losses(self, w) -> np.ndarray:
        """``(..., 1) -> (..., 1)``."""
        w = check_points(w, 1)
        l = self._scalar_loss(w)
        if np.any(l <= 0):
            raise ValueError("the double-well loss is not positive at some point (tilt/offset too extreme)")
        return l

    def grads(self, w) -> np.ndarray:
        """``l'(w) = 4w(w² - 1) + tilt``: ``(..., 1) -> (..., 1, 1)``."""
        w = check_points(w, 1)
        return (4.0 * w * (w**2 - 1.0) + self.tilt)[..., None]

    def gram(self, w) -> np.ndarray:
        return gram_of(self.grads(w))

    def chebyshev(self, w) -> np.ndarray:
        """``ψ(w) = l(w)`` (``λ = 1``), ``(...)``."""
        return chebyshev(self.losses(w), self.prefs)

    def minima(self, lo: float = -3.0, hi: float = 3.0, n_grid: int = 600_001) -> GridMinima:
        """All local minima on a dense grid of ``[lo, hi]`` (polished), global first; the second is spurious."""
        return grid_minimize_1d(self._scalar_loss, lo, hi, n_grid)


@dataclass(frozen=True, eq=False)
class Kink:
    """F5: ``l = (1 + w, 1 - w)`` on ``|w| < 1``, ``λ = (½, ½)``."""

    n_params = 1
    n_objectives = 2
    psi_star = 0.5
    L0 = 0.0
    B = 1.0

    @property
    def prefs(self) -> np.ndarray:
        return np.array([0.5, 0.5])

    @property
    def w_star(self) -> np.ndarray:
        return np.zeros(1)

    def losses(self, w) -> np.ndarray:
        """``(..., 1) -> (..., 2)``; raises ``ValueError`` outside the domain ``|w| < 1`` (positivity)."""
        w = check_points(w, 1)
        if np.any(np.abs(w) >= 1.0):
            raise ValueError(f"Kink is defined on |w| < 1 (positive losses); got max |w| = {np.abs(w).max()!r}")
        return np.concatenate([1.0 + w, 1.0 - w], axis=-1)

    def grads(self, w) -> np.ndarray:
        """``G = [[1, -1]]``: ``(..., 1) -> (..., 1, 2)``."""
        w = check_points(w, 1)
        return np.broadcast_to(np.array([[1.0, -1.0]]), w.shape[:-1] + (1, 2)).copy()

    def gram(self, w) -> np.ndarray:
        return gram_of(self.grads(w))

    def chebyshev(self, w) -> np.ndarray:
        """``ψ(w) = (1 + |w|)/2``, ``(...)``."""
        return chebyshev(self.losses(w), self.prefs)

    def beta(self, w) -> np.ndarray:
        return preference_uniformity(self.losses(w), self.prefs)

    def eps_act(self, eta) -> float:
        """``ε_act = 2 η λ_max B² = η``."""
        return check_nonneg(eta, "eta")
