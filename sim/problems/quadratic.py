r"""Quadratic cluster families F1 (planted, common objectives) and F2 (perturbed clients);
docs/spec/problems.md#families.

Objectives ``l_j(w) = ½(w - c_j)ᵀQ_j(w - c_j) + b_j`` (F1, common to all clients, so H.5 holds) and
``l_i^{(j)}(w) = ½(w - c_j - e_ij)ᵀQ_j(w - c_j - e_ij) + b_j`` (F2, client centre shifts ``e_ij``, H.5 fails).

Planting (F1; F2 with the client's own centres): ``u_i = normalize(|u_0 ⊙ (1 + s_u ξ_i)|)`` with
``u_0 ~ Dirichlet(3·1)``, ``ξ_i ~ N(0, I)``; ``w_i* = (Σ_j u_ij Q_j)^{-1} Σ_j u_ij Q_j c_j`` (Pareto optimal);
``λ_i = normalize(1/l(w_i*))``; then ``λ_ij l_j(w_i*) = ψ_i*`` for every ``j``, so ``w_i*`` is the unique
Chebyshev minimiser, ``β_i(w_i*) = 0`` and ``q_i* = l(w_i*)``.

Constants: ``L₀ = max_j ‖Q_j‖`` (exact), quadratic growth ``μ_i = min_j λ_ij λ_min(Q_j)`` (``ψ_i`` is
``μ_i``-strongly convex), ``B`` on a ball ``‖w - w̄‖ ≤ R``: ``max_j ‖Q_j‖ (R + ‖w̄ - c_j‖)``.
F2: ``g_i^{(j)} - g_{i'}^{(j)} = -Q_j(e_ij - e_i'j)`` is constant in ``w``, so
``δ_g = max_i max_j Σ_i' ρ_i' ‖Q_j(e_ij - e_i'j)‖`` is exact (docs/spec/aggregation.md#aggregation,
docs/spec/constants.md#constants).

Shapes: points ``w`` ``(..., n_w)``; ``losses`` ``(..., m)``, ``grads`` ``(..., n_w, m)`` (columns are
gradients), ``gram`` ``(..., m, m)``. ``*_per_client(w)`` takes one point per client, ``w`` ``(..., N, n_w)``,
and returns ``(..., N, m)`` etc.; it has the same meaning for F1 and F2 (algorithm code uses it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sim.preference import chebyshev, check_preferences, preference_uniformity
from sim.problems._quadratic import (
    check_int,
    check_nonneg,
    check_points,
    check_rng,
    gram_of,
    normalize,
    planted_point,
    planted_preferences,
    quad_grads,
    quad_losses,
    random_quadratics,
)

__all__ = ["PlantedQuadraticCluster", "PerturbedClients", "ClientSamples", "planted_mixing"]


def planted_mixing(rng: np.random.Generator, u0: np.ndarray, n_clients: int, spread: float) -> np.ndarray:
    """``u_i = normalize(|u_0 ⊙ (1 + s_u ξ_i)|)``, ``ξ_i ~ N(0, I_m)``; shape ``(n_clients, m)``."""
    xi = rng.standard_normal((n_clients, u0.shape[-1]))
    u = np.abs(u0 * (1.0 + spread * xi))
    u = np.maximum(u, 1e-12)
    return normalize(u)


def _client_index(client, n_clients: int) -> int:
    return check_int(client, "client", 0, n_clients - 1)


class _ClusterCommon:
    """Methods shared by F1 and F2 (needs ``prefs``, ``hessians``, ``offsets``, ``_centres_all``)."""

    prefs: np.ndarray
    hessians: np.ndarray
    offsets: np.ndarray

    @property
    def n_objectives(self) -> int:
        return int(self.hessians.shape[0])

    @property
    def n_params(self) -> int:
        return int(self.hessians.shape[-1])

    @property
    def n_clients(self) -> int:
        return int(self.prefs.shape[0])

    @property
    def L0(self) -> float:
        """``L₀ = max_j ‖Q_j‖₂`` (exact smoothness constant of every objective)."""
        return float(np.linalg.eigvalsh(self.hessians)[..., -1].max())

    @property
    def mu_qg(self) -> np.ndarray:
        """Quadratic-growth constants ``μ_i = min_j λ_ij λ_min(Q_j)``, shape ``(N,)``."""
        lmin = np.linalg.eigvalsh(self.hessians)[..., 0]
        return (self.prefs * lmin).min(axis=-1)

    def _centres_all(self) -> np.ndarray:  # (N, m, n_w)
        raise NotImplementedError

    def gradient_bound(self, center, radius: float) -> float:
        """``B = max_{i,j} ‖Q_j‖ (R + ‖w̄ - c_ij‖)`` bounds every gradient on the ball ``‖w - w̄‖ ≤ R``."""
        wbar = check_points(center, self.n_params, "center")
        if wbar.ndim != 1:
            raise ValueError(f"center must be one point of shape ({self.n_params},); got {wbar.shape}")
        R = check_nonneg(radius, "radius")
        qn = np.linalg.eigvalsh(self.hessians)[..., -1]  # (m,)
        dist = np.linalg.norm(wbar - self._centres_all(), axis=-1)  # (N, m)
        return float((qn * (R + dist)).max())

    def losses_per_client(self, w) -> np.ndarray:
        """Client ``i`` evaluated at its own point ``w[..., i, :]``: ``(..., N, n_w) -> (..., N, m)``."""
        w = self._check_client_points(w)
        return quad_losses(w, self._centres_all(), self.hessians, self.offsets)

    def grads_per_client(self, w) -> np.ndarray:
        """``(..., N, n_w) -> (..., N, n_w, m)``."""
        w = self._check_client_points(w)
        return quad_grads(w, self._centres_all(), self.hessians)

    def gram_per_client(self, w) -> np.ndarray:
        """``(..., N, n_w) -> (..., N, m, m)``."""
        return gram_of(self.grads_per_client(w))

    def _check_client_points(self, w) -> np.ndarray:
        w = check_points(w, self.n_params)
        if w.ndim < 2 or w.shape[-2] != self.n_clients:
            raise ValueError(f"w must have shape (..., N={self.n_clients}, {self.n_params}); got {w.shape}")
        return w

    def _prefs_for(self, client) -> np.ndarray:
        return self.prefs if client is None else self.prefs[_client_index(client, self.n_clients)]

    def _all_client_losses(self, w) -> np.ndarray:
        """``(..., n_w) -> (..., N, m)``: every client at every point."""
        w = check_points(w, self.n_params)
        return quad_losses(w[..., None, :], self._centres_all(), self.hessians, self.offsets)

    def chebyshev(self, w, client=None) -> np.ndarray:
        """``ψ_i(w) = max_j λ_ij l_i^{(j)}(w)``: ``(..., N)`` for ``client=None``, else ``(...)``."""
        L = self._all_client_losses(w)
        if client is None:
            return chebyshev(L, self.prefs)
        i = _client_index(client, self.n_clients)
        return chebyshev(L[..., i, :], self.prefs[i])

    def beta(self, w, client=None) -> np.ndarray:
        """Preference Uniformity ``β_i(w)``: ``(..., N)`` for ``client=None``, else ``(...)``."""
        L = self._all_client_losses(w)
        if client is None:
            return preference_uniformity(L, self.prefs)
        i = _client_index(client, self.n_clients)
        return preference_uniformity(L[..., i, :], self.prefs[i])

    def with_samples(self, rng, n_samples, noise_scale: float = 0.1) -> ClientSamples:
        """Sample-level version of this family: see :class:`ClientSamples`."""
        return ClientSamples.make(rng, self, n_samples, noise_scale)


# ----------------------------------------------------------------------------------------------------------------
# F1


@dataclass(frozen=True, eq=False)
class PlantedQuadraticCluster(_ClusterCommon):
    """F1 — planted quadratic cluster with common objectives (docs/spec/problems.md#families).

    Attributes:
        centres: ``c_j``, ``(m, n_w)``.  hessians: ``Q_j``, ``(m, n_w, n_w)``.  offsets: ``b_j``, ``(m,)``.
        u0: cluster mixing centre ``u_0`` ``(m,)``.  mixing: ``u_i`` ``(N, m)``.  spread: ``s_u``.
        prefs: ``λ_i`` ``(N, m)``.  w_star: ``w_i*`` ``(N, n_w)``.  psi_star: ``ψ_i*`` ``(N,)``.
    """

    centres: np.ndarray
    hessians: np.ndarray
    offsets: np.ndarray
    u0: np.ndarray
    mixing: np.ndarray
    prefs: np.ndarray
    w_star: np.ndarray
    psi_star: np.ndarray
    spread: float

    @classmethod
    def make(
        cls,
        rng: np.random.Generator,
        m: int = 3,
        n_w: int = 4,
        n_clients: int = 4,
        *,
        spread: float = 0.1,
        s_c: float = 1.0,
        kappa_Q: float = 3.0,
        b_min: float = 0.3,
    ) -> PlantedQuadraticCluster:
        """Draw objectives and ``n_clients`` planted clients with mixing spread ``s_u = spread``."""
        rng = check_rng(rng)
        m = check_int(m, "m", 1)
        n_w = check_int(n_w, "n_w", 1)
        n_clients = check_int(n_clients, "n_clients", 1)
        spread = check_nonneg(spread, "spread")
        s_c = check_nonneg(s_c, "s_c")
        if not (np.isfinite(kappa_Q) and kappa_Q >= 1.0):
            raise ValueError(f"kappa_Q must be finite and >= 1; got {kappa_Q!r}")
        b_min = check_nonneg(b_min, "b_min", positive=True)
        c, Q, b = random_quadratics(rng, m, n_w, s_c=s_c, kappa_Q=kappa_Q, b_min=b_min)
        u0 = rng.dirichlet(3.0 * np.ones(m))
        u = planted_mixing(rng, u0, n_clients, spread)
        return cls._from_mixing(c, Q, b, u0, u, spread)

    @classmethod
    def _from_mixing(cls, c, Q, b, u0, u, spread) -> PlantedQuadraticCluster:
        w_star = planted_point(u, c, Q)
        lam, psi = planted_preferences(quad_losses(w_star, c, Q, b))
        return cls(c, Q, b, u0, u, lam, w_star, psi, float(spread))

    def planted_client(self, u) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A new planted client with mixing weights ``u`` (``(..., m)``, positive): ``(λ, w*, ψ*)``."""
        u = check_preferences(normalize(np.asarray(u, dtype=np.float64)), "u")
        w_star = planted_point(u, self.centres, self.hessians)
        lam, psi = planted_preferences(quad_losses(w_star, self.centres, self.hessians, self.offsets))
        return lam, w_star, psi

    def new_client(self, rng: np.random.Generator, spread: float | None = None):
        """Draw one new planted client around ``u_0`` (spread defaults to this cluster's): ``(u, λ, w*, ψ*)``."""
        s = self.spread if spread is None else check_nonneg(spread, "spread")
        u = planted_mixing(check_rng(rng), self.u0, 1, s)[0]
        return (u,) + self.planted_client(u)

    @property
    def q_star(self) -> np.ndarray:
        """Ray points ``q_i* = ψ_i* λ_i^{-1} = l(w_i*)``, ``(N, m)``."""
        return self.psi_star[:, None] / self.prefs

    def _centres_all(self) -> np.ndarray:
        return np.broadcast_to(self.centres, (self.n_clients,) + self.centres.shape)

    def losses(self, w, client=None) -> np.ndarray:
        """Common losses ``l(w)``, ``(..., n_w) -> (..., m)`` (``client`` is only validated: H.5 holds)."""
        if client is not None:
            _client_index(client, self.n_clients)
        w = check_points(w, self.n_params)
        return quad_losses(w, self.centres, self.hessians, self.offsets)

    def grads(self, w, client=None) -> np.ndarray:
        """``G(w) = [Q_j(w - c_j)]_j``, ``(..., n_w) -> (..., n_w, m)``."""
        if client is not None:
            _client_index(client, self.n_clients)
        w = check_points(w, self.n_params)
        return quad_grads(w, self.centres, self.hessians)

    def gram(self, w, client=None) -> np.ndarray:
        """``C(w) = GᵀG``, ``(..., m, m)``."""
        return gram_of(self.grads(w, client))

    def loss_fn(self, client=None):
        """``(losses_fn, grads_fn)`` of one client for :func:`sim.problems.fopt.chebyshev_optimum`."""
        return (lambda w: self.losses(w, client)), (lambda w: self.grads(w, client))


# ----------------------------------------------------------------------------------------------------------------
# F2


@dataclass(frozen=True, eq=False)
class PerturbedClients(_ClusterCommon):
    """F2 — clients with shifted centres ``c_j + e_ij`` (docs/spec/problems.md#families); H.5 fails when ``s_e
    > 0``.

    Attributes:
        centres ``(m, n_w)``, hessians ``(m, n_w, n_w)``, offsets ``(m,)``: the base objectives.
        shifts: ``e_ij``, ``(N, m, n_w)``.  shift_scale: ``s_e``.  prefs: ``λ_i`` ``(N, m)``.
        w_star ``(N, n_w)``, psi_star ``(N,)``: client optima where ``known_optimum[i]`` (planted with the
        client's own centres, or solved by F-OPT); NaN elsewhere (use :meth:`optimum`, which raises).
    """

    centres: np.ndarray
    hessians: np.ndarray
    offsets: np.ndarray
    shifts: np.ndarray
    shift_scale: float
    prefs: np.ndarray
    w_star: np.ndarray
    psi_star: np.ndarray
    known_optimum: np.ndarray

    @classmethod
    def make(
        cls,
        rng: np.random.Generator,
        m: int = 3,
        n_w: int = 4,
        n_clients: int = 4,
        *,
        shift: float = 0.02,
        prefs: str = "planted",
        spread: float = 0.1,
        s_c: float = 1.0,
        kappa_Q: float = 3.0,
        b_min: float = 0.3,
    ) -> PerturbedClients:
        """Draw base objectives, shifts ``e_ij ~ N(0, shift² I)`` and preferences.

        ``prefs="planted"``: per-client planted optimum with the client's own centres (mixing spread
        ``spread`` around ``u_0 ~ Dirichlet(3·1)``). ``prefs="random"``: interior ``0.95·Dirichlet + 0.05/m``,
        optima unknown (see :meth:`solve_optima`).
        """
        rng = check_rng(rng)
        m = check_int(m, "m", 1)
        n_w = check_int(n_w, "n_w", 1)
        n_clients = check_int(n_clients, "n_clients", 1)
        shift = check_nonneg(shift, "shift")
        spread = check_nonneg(spread, "spread")
        if not (np.isfinite(kappa_Q) and kappa_Q >= 1.0):
            raise ValueError(f"kappa_Q must be finite and >= 1; got {kappa_Q!r}")
        c, Q, b = random_quadratics(rng, m, n_w, s_c=check_nonneg(s_c, "s_c"), kappa_Q=kappa_Q,
                                    b_min=check_nonneg(b_min, "b_min", positive=True))
        e = shift * rng.standard_normal((n_clients, m, n_w))
        ci = c + e
        if prefs == "planted":
            u0 = rng.dirichlet(3.0 * np.ones(m))
            u = planted_mixing(rng, u0, n_clients, spread)
            w_star = planted_point(u, ci, Q)
            lam, psi = planted_preferences(quad_losses(w_star, ci, Q, b))
            known = np.ones(n_clients, dtype=bool)
        elif prefs == "random":
            lam = 0.95 * rng.dirichlet(np.ones(m), size=n_clients) + 0.05 / m
            w_star = np.full((n_clients, n_w), np.nan)
            psi = np.full(n_clients, np.nan)
            known = np.zeros(n_clients, dtype=bool)
        else:
            raise ValueError(f"prefs must be 'planted' or 'random'; got {prefs!r}")
        return cls(c, Q, b, e, shift, lam, w_star, psi, known)

    @property
    def client_centres(self) -> np.ndarray:
        """``c_ij = c_j + e_ij``, ``(N, m, n_w)``."""
        return self.centres + self.shifts

    def _centres_all(self) -> np.ndarray:
        return self.client_centres

    def losses(self, w, client=None) -> np.ndarray:
        """``l_i(w)``: ``(..., n_w) -> (..., N, m)`` for ``client=None`` (every client), else ``(..., m)``."""
        if client is None:
            return self._all_client_losses(w)
        i = _client_index(client, self.n_clients)
        w = check_points(w, self.n_params)
        return quad_losses(w, self.client_centres[i], self.hessians, self.offsets)

    def grads(self, w, client=None) -> np.ndarray:
        """``G_i(w)``: ``(..., N, n_w, m)`` for ``client=None``, else ``(..., n_w, m)``."""
        w = check_points(w, self.n_params)
        if client is None:
            return quad_grads(w[..., None, :], self.client_centres, self.hessians)
        i = _client_index(client, self.n_clients)
        return quad_grads(w, self.client_centres[i], self.hessians)

    def gram(self, w, client=None) -> np.ndarray:
        """``C_i(w) = G_iᵀG_i``: ``(..., N, m, m)`` or ``(..., m, m)``."""
        return gram_of(self.grads(w, client))

    def loss_fn(self, client):
        """``(losses_fn, grads_fn)`` of client ``client`` for :func:`sim.problems.fopt.chebyshev_optimum`."""
        i = _client_index(client, self.n_clients)
        return (lambda w: self.losses(w, i)), (lambda w: self.grads(w, i))

    def delta_g(self, rho=None) -> float:
        """Exact ``δ_g = max_i max_j Σ_i' ρ_i' ‖Q_j(e_ij - e_i'j)‖`` (constant in ``w``); ``ρ`` defaults to ``1/N``."""
        D = self._pairwise_gradient_gaps()  # (N, N, m)
        r = self._rho(rho)
        return float(np.einsum("k,ikj->ij", r, D).max())

    def delta_g_max(self) -> float:
        """``δ_g^max = max_{i,i',j} ‖Q_j(e_ij - e_i'j)‖`` (the larger, pairwise alternative)."""
        return float(self._pairwise_gradient_gaps().max())

    def _pairwise_gradient_gaps(self) -> np.ndarray:
        de = self.shifts[:, None, :, :] - self.shifts[None, :, :, :]  # (N, N, m, n_w)
        return np.linalg.norm((self.hessians @ de[..., None])[..., 0], axis=-1)

    def _rho(self, rho) -> np.ndarray:
        if rho is None:
            return np.full(self.n_clients, 1.0 / self.n_clients)
        r = check_preferences(rho, "rho")
        if r.shape != (self.n_clients,):
            raise ValueError(f"rho must have shape ({self.n_clients},); got {r.shape}")
        return r

    def optimum(self, client) -> tuple[np.ndarray, float]:
        """``(w_i*, ψ_i*)``; raises ``ValueError`` if client ``i``'s optimum is not known (see :meth:`solve_optima`)."""
        i = _client_index(client, self.n_clients)
        if not self.known_optimum[i]:
            raise ValueError(f"the optimum of client {i} is not known; call solve_optima() first")
        return self.w_star[i], float(self.psi_star[i])

    def with_prefs(self, prefs) -> PerturbedClients:
        """Same objectives with new preferences ``(N, m)``; every optimum becomes unknown."""
        lam = check_preferences(prefs)
        if lam.shape != self.prefs.shape:
            raise ValueError(f"prefs must have shape {self.prefs.shape}; got {lam.shape}")
        n = self.n_clients
        return replace(self, prefs=lam.copy(), w_star=np.full((n, self.n_params), np.nan),
                       psi_star=np.full(n, np.nan), known_optimum=np.zeros(n, dtype=bool))

    def with_uniform_client(self, client, w0) -> PerturbedClients:
        """Make client ``i`` *uniform at* ``w0``: ``λ_i := normalize(1/l_i(w0))``, so ``β_i(w0) = 0`` to rounding.

        Its optimum becomes unknown (the other clients keep theirs). Use ``ε_mode = 1e-12`` for dom mode.
        """
        i = _client_index(client, self.n_clients)
        w0 = check_points(w0, self.n_params, "w0")
        if w0.ndim != 1:
            raise ValueError(f"w0 must be one point of shape ({self.n_params},); got {w0.shape}")
        lam = self.prefs.copy()
        lam[i] = normalize(1.0 / self.losses(w0, i))
        w_star, psi, known = self.w_star.copy(), self.psi_star.copy(), self.known_optimum.copy()
        w_star[i], psi[i], known[i] = np.nan, np.nan, False
        return replace(self, prefs=lam, w_star=w_star, psi_star=psi, known_optimum=known)

    def solve_optima(self, w0s=None, *, clients=None) -> PerturbedClients:
        """Fill unknown optima by F-OPT (SLSQP + KKT certificate); raises if a certificate fails.

        ``w0s``: starts ``(n_starts, n_w)``; default: the cluster mean of the centres and each ``c_j``.
        ``clients``: indices to (re)solve; default: those whose optimum is unknown.
        """
        from sim.problems.fopt import chebyshev_optimum  # local import: fopt imports sim.hull only

        if w0s is None:
            w0s = np.vstack([self.centres.mean(axis=0)[None], self.centres])
        todo = np.flatnonzero(~self.known_optimum) if clients is None else [
            _client_index(c, self.n_clients) for c in np.atleast_1d(clients)]
        w_star, psi, known = self.w_star.copy(), self.psi_star.copy(), self.known_optimum.copy()
        for i in todo:
            lf, gf = self.loss_fn(int(i))
            res = chebyshev_optimum(lf, gf, self.prefs[i], w0s)
            if not res.certified:
                raise ValueError(f"F-OPT could not certify the optimum of client {i} (KKT norm {res.kkt_norm:.3e})")
            w_star[i], psi[i], known[i] = res.w, res.psi, True
        return replace(self, w_star=w_star, psi_star=psi, known_optimum=known)


# ----------------------------------------------------------------------------------------------------------------
# sample level


@dataclass(frozen=True, eq=False)
class ClientSamples:
    r"""Sample-level version of F1/F2: a finite dataset per client whose empirical mean loss is the population loss.

    Client ``i`` holds ``n_i`` samples ``ξ_{i,s} = (ξ_{i,s,1}, …, ξ_{i,s,m})``, ``ξ_{i,s,j} ∈ R^{n_w}``, centred
    so that ``Σ_s ξ_{i,s,j} = 0`` exactly (up to rounding); ``Σ̂_ij = (1/n_i) Σ_s ξ ξᵀ`` is the empirical covariance.
    Per-sample loss:

    .. math::
        l_i^{(j)}(w; ξ) = ½(w - c_ij - ξ_j)ᵀQ_j(w - c_ij - ξ_j) + b_j - κ_ij,
        \qquad κ_ij = ½ tr(Q_j Σ̂_ij) = (1/n_i)Σ_s ½ ξ_{s,j}ᵀQ_jξ_{s,j}

    so the mean over the whole dataset equals the population loss ``½(w - c_ij)ᵀQ_j(w - c_ij) + b_j``.
    Every sample loss is ``≥ b_j - κ_ij > 0`` (checked at construction). The mean over a subset ``idx`` is
    ``½(w - c_ij - ξ̄_j)ᵀQ_j(w - c_ij - ξ̄_j) + b_j - κ_ij + ½ mean_idx(ξᵀQ_jξ) - ½ξ̄_jᵀQ_jξ̄_j`` with gradient
    ``Q_j(w - c_ij - ξ̄_j)``, ``ξ̄ = mean_idx ξ``.

    Attributes: ``problem`` (the F1/F2 instance), ``noise`` (tuple of ``(n_i, m, n_w)`` arrays), ``kappa``
    ``(N, m)``, ``noise_scale``.
    """

    problem: PlantedQuadraticCluster | PerturbedClients
    noise: tuple
    kappa: np.ndarray
    noise_scale: float

    @classmethod
    def make(cls, rng, problem, n_samples, noise_scale: float = 0.1) -> ClientSamples:
        """Draw ``ξ ~ N(0, noise_scale² I)`` per client/sample/objective and centre each client's set exactly."""
        rng = check_rng(rng)
        if not isinstance(problem, (PlantedQuadraticCluster, PerturbedClients)):
            raise ValueError(f"problem must be a PlantedQuadraticCluster or PerturbedClients; got {type(problem)}")
        N, m, n_w = problem.n_clients, problem.n_objectives, problem.n_params
        try:
            given = np.broadcast_to(np.asarray(n_samples), (N,))
        except ValueError as exc:
            raise ValueError(f"n_samples must be an int or have length N={N}; got {n_samples!r}") from exc
        counts = [check_int(c.item() if isinstance(c, np.generic) else c, "n_samples", 2) for c in given]
        s = check_nonneg(noise_scale, "noise_scale")
        noise, kappa = [], np.empty((N, m))
        for i, n_i in enumerate(counts):
            xi = s * rng.standard_normal((n_i, m, n_w))
            xi = xi - xi.mean(axis=0, keepdims=True)
            qf = 0.5 * np.einsum("sja,jab,sjb->sj", xi, problem.hessians, xi)
            kappa[i] = qf.mean(axis=0)
            xi.setflags(write=False)
            noise.append(xi)
        bad = kappa >= problem.offsets
        if np.any(bad):
            i, j = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(
                f"noise_scale={noise_scale!r} too large: client {i}, objective {j} has κ = ½tr(QΣ̂) = "
                f"{kappa[i, j]:.4g} >= b_j = {problem.offsets[j]:.4g}, so a sample loss could be <= 0"
            )
        return cls(problem, tuple(noise), kappa, s)

    @property
    def n_samples(self) -> np.ndarray:
        """``n_i`` per client, ``(N,)``."""
        return np.array([x.shape[0] for x in self.noise])

    def _centres(self, i: int) -> np.ndarray:
        return self.problem._centres_all()[i]

    def noise_covariance(self, client) -> np.ndarray:
        """Empirical covariance ``Σ̂_ij = (1/n_i) Σ_s ξ_{s,j} ξ_{s,j}ᵀ``, shape ``(m, n_w, n_w)``."""
        xi = self.noise[_client_index(client, self.problem.n_clients)]
        return np.einsum("sja,sjb->jab", xi, xi) / xi.shape[0]

    def _select(self, client, idx):
        i = _client_index(client, self.problem.n_clients)
        xi = self.noise[i]
        if idx is None:
            idx = np.arange(xi.shape[0])
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu" or idx.ndim < 1 or idx.shape[-1] == 0:
            raise ValueError(f"idx must be a non-empty integer array (..., S); got {idx!r}")
        if np.any(idx < 0) or np.any(idx >= xi.shape[0]):
            raise ValueError(f"idx must lie in [0, {xi.shape[0] - 1}] for client {i}; got min {idx.min()}, max {idx.max()}")
        return i, xi[idx]  # (..., S, m, n_w)

    def sample_losses(self, w, client, idx=None) -> np.ndarray:
        """Mean per-sample loss over samples ``idx`` (``(S,)`` or batched ``(..., S)``) of client ``client``.

        ``w`` ``(..., n_w)`` broadcasts against the batch of ``idx``; returns ``(..., m)``. ``idx=None`` uses the
        whole dataset, which gives the population loss.
        """
        w = check_points(w, self.problem.n_params)
        i, xi = self._select(client, idx)
        Q = self.problem.hessians
        xbar = xi.mean(axis=-3)
        qf = 0.5 * np.einsum("...sja,jab,...sjb->...sj", xi, Q, xi).mean(axis=-2)
        qbar = 0.5 * np.einsum("...ja,jab,...jb->...j", xbar, Q, xbar)
        return quad_losses(w, self._centres(i) + xbar, Q, self.problem.offsets - self.kappa[i]) + qf - qbar

    def sample_grads(self, w, client, idx=None) -> np.ndarray:
        """Gradient of :meth:`sample_losses`: ``[Q_j(w - c_ij - ξ̄_j)]_j``, ``(..., n_w, m)``."""
        w = check_points(w, self.problem.n_params)
        i, xi = self._select(client, idx)
        return quad_grads(w, self._centres(i) + xi.mean(axis=-3), self.problem.hessians)

    def sample_gram(self, w, client, idx=None) -> np.ndarray:
        """``GᵀG`` of :meth:`sample_grads`, ``(..., m, m)``."""
        return gram_of(self.sample_grads(w, client, idx))

    def per_sample_losses(self, w, client) -> np.ndarray:
        """Every individual sample loss of client ``client``: ``(..., n_w) -> (..., n_i, m)``."""
        w = check_points(w, self.problem.n_params)
        i = _client_index(client, self.problem.n_clients)
        c = self._centres(i)[None] + self.noise[i]  # (n_i, m, n_w)
        return quad_losses(w[..., None, :], c, self.problem.hessians, self.problem.offsets - self.kappa[i])

    def episode(self, rng, client, size: int) -> np.ndarray:
        """``size`` distinct sample indices of client ``client`` drawn uniformly (an S-shot episode)."""
        i = _client_index(client, self.problem.n_clients)
        n_i = self.noise[i].shape[0]
        size = check_int(size, "size", 1, n_i)
        return np.sort(check_rng(rng).choice(n_i, size=size, replace=False))
