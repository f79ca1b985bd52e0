r"""Shared helpers of the LP-level statements H.6, H.7 and H.11 (private: the registry skips ``_`` modules).

One *cluster instance* (docs/spec/statements.md#t-h6, docs/spec/statements.md#t-h7): an F1 cluster (common
objectives, so H.5 holds) of ``N`` planted clients with mixing spread ``s_u``, evaluated at ``w = w*(u_0) +
r·ξ/‖ξ‖`` with ``r ~ Unif(r_lo, r_hi)``; every client solves the EPO LP (:func:`sim.direction.lp_direction`, ``eps_mode = 0``: the theory's "β > 0") at
the common ``(l, C)``, and :func:`sim.constants.client_basis` classifies its optimal vertex in the LP matrix
form of docs/spec/lp.md#lp.

Duals. :func:`sim.constants.client_basis` computes the duals of the vertex (unique at a basis) and decides
strict complementarity; the dual feasibility doubles as an optimality certificate of the batched solver's
vertex. HiGHS is used as an independent oracle only for the LP at a blended adjustment
(:func:`solve_fixed_index_lp`), which no public kernel solves (the kernels take ``(l, λ, C)``, not ``A``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sim import cluster as cl
from sim import constants as K
from sim.constants import client_bases
from sim.direction import HIGHS_OPTIONS, lp_direction
from sim.preference import normalized_losses
from sim.problems import PlantedQuadraticCluster

#: |dual| above this counts as non-zero (H.6 checklist: "all active duals > 1e-10").
DUAL_TOL = 1e-10
#: eq 8 tolerance (H.6 checklist: ‖μ_i − M_B⁻¹ b_B(A_i)‖ ≤ 1e-9).
EQ8_TOL = 1e-9



@dataclass(frozen=True, eq=False)
class ClusterLP:
    """A cluster at one point ``w`` with every client's LP solved and classified.

    ``losses (m,)``, ``grads (n_w, m)``, ``gram (m, m)`` are common (H.5); ``grad_gap`` is the measured
    ``max_{i,j} ‖g_i^{(j)} − g_1^{(j)}‖`` from per-client evaluation; ``prefs, adjustment, weights (N, m)``;
    ``rho (N,)``; ``modes (N,)``; ``bases`` per client.
    """

    losses: np.ndarray
    grads: np.ndarray
    gram: np.ndarray
    grad_gap: float
    prefs: np.ndarray
    adjustment: np.ndarray
    weights: np.ndarray
    rho: np.ndarray
    modes: np.ndarray
    statuses: np.ndarray
    bases: tuple
    spread: float
    w: np.ndarray

    @property
    def all_balance(self) -> bool:
        return bool(np.all(self.modes == "balance"))

    @property
    def common_index_sets(self) -> bool:
        if not self.all_balance:
            return False
        keys = {(tuple(b.info.J.tolist()), tuple(b.info.J_star.tolist())) for b in self.bases}
        return len(keys) == 1

    @property
    def all_vertices(self) -> bool:
        return self.all_balance and all(b.vertex for b in self.bases)

    @property
    def common_basis(self) -> bool:
        """H.6: one basis, optimal and non-degenerate for every client (equal index sets and basis rows)."""
        return self.all_vertices and len({b.key for b in self.bases}) == 1

    @property
    def sigma_max(self) -> float:
        """``σ_max(C)``: the largest eigenvalue of ``C`` (O-28)."""
        return float(np.linalg.eigvalsh(self.gram)[-1])

    @property
    def directions(self) -> np.ndarray:
        return self.weights @ self.grads.T  # d_i = G μ_i, rows

    @property
    def dispersion(self) -> float:
        """``H_{C_n} = Σ ρ_i ‖d_i − d̄‖²`` from the directions (definition, O-3)."""
        return float(cl.dispersion(self.directions, self.rho))

    @property
    def dispersion_eq9(self) -> float:
        """``Σ ρ_i (μ_i − μ̄)ᵀ C (μ_i − μ̄)`` (eq 9)."""
        return float(cl.dispersion_from_weights(self.weights, self.gram, self.rho))

    @property
    def adjustment_variance(self) -> float:
        """``Σ ρ_i ‖A_i − Ā‖²``."""
        Abar = self.rho @ self.adjustment
        return float(self.rho @ np.sum((self.adjustment - Abar) ** 2, axis=1))

    @property
    def pref_spread(self) -> float:
        """``δ_λ = max_{i,i'} ‖λ_i − λ_i'‖₂``."""
        diff = self.prefs[:, None, :] - self.prefs[None, :, :]
        return float(np.linalg.norm(diff, axis=-1).max())

    def kappa_common(self) -> float:
        """``κ_LP = ‖M_B⁻¹‖‖C‖`` at the common basis (all clients share it, so client 0's value)."""
        return float(self.bases[0].info.kappa_lp)

    def kappa_max_own(self) -> float:
        """``max_i κ_LP`` over the clients' own bases (negative controls of H.7 / H.11)."""
        return float(max(b.info.kappa_lp for b in self.bases))

    def eq8_errors(self, basis_of: int = 0) -> np.ndarray:
        """``‖μ_i − M_B⁻¹ b_B(A_i)‖`` for every client with the basis of client ``basis_of`` (eq 8)."""
        info = self.bases[basis_of].info
        return np.array([np.linalg.norm(self.weights[i] - info.solve(self.adjustment[i]))
                         for i in range(len(self.prefs))])

    def l_adj(self) -> float:
        """``L_adj`` (eq 14) by :func:`sim.constants.adjustment_lipschitz` with the floor ``c`` of H.9 over the
        cluster's preferences at the common losses (:func:`sim.constants.floor_constant`)."""
        return float(K.adjustment_lipschitz(self.losses, self.prefs))

    def floor(self) -> float:
        return float(K.floor_constant(self.losses, self.prefs))

    def record(self) -> dict:
        """Data to reproduce the instance (counterexamples)."""
        return {
            "spread": self.spread, "w": self.w, "losses": self.losses, "gram": self.gram, "prefs": self.prefs,
            "rho": self.rho, "weights": self.weights, "modes": self.modes, "statuses": self.statuses,
            "bases": [None if b.key is None else [list(r) for r in b.key[2]] for b in self.bases],
        }


def analyse_cluster(problem: PlantedQuadraticCluster, w: np.ndarray, rho: np.ndarray) -> ClusterLP:
    """Solve and classify every client's balancing LP at ``w`` (``eps_mode = 0``)."""
    N = problem.n_clients
    l = problem.losses(w)
    G = problem.grads(w)
    C = problem.gram(w)
    Gi = problem.grads_per_client(np.broadcast_to(w, (N, w.shape[0])))  # per-client evaluation (H.5 check)
    gap = float(np.linalg.norm(Gi - Gi[:1], axis=1).max())
    res = lp_direction(np.broadcast_to(l, (N, l.shape[0])), problem.prefs, np.broadcast_to(C, (N,) + C.shape),
                       eps_mode=0.0)
    bases = client_bases(l, problem.prefs, C, res.weights, res.mode, dual_tol=DUAL_TOL)
    return ClusterLP(l, G, C, gap, problem.prefs.copy(), res.adjustment, res.weights, rho, res.mode, res.status,
                     bases, float(problem.spread), w)


def random_cluster(rng: np.random.Generator, spread: float, n_clients: int, m_choices, n_w_max: int,
                   radius: tuple[float, float], rho_conc: float = 5.0, kappa_Q: float = 3.0,
                   s_c: float = 1.0) -> ClusterLP:
    """T-H6/T-H7 instance: F1 cluster, ``w = w*(u_0) + r ξ/‖ξ‖``, ``ρ ~ Dirichlet(rho_conc·1)``."""
    m = int(rng.choice(np.asarray(m_choices)))
    n_w = int(rng.integers(m, n_w_max + 1))
    prob = PlantedQuadraticCluster.make(rng, m, n_w, n_clients, spread=spread, kappa_Q=kappa_Q, s_c=s_c)
    w0 = prob.planted_client(prob.u0)[1]
    xi = rng.standard_normal(n_w)
    w = w0 + rng.uniform(*radius) * xi / np.linalg.norm(xi)
    rho = rng.dirichlet(np.full(n_clients, rho_conc))
    return analyse_cluster(prob, w, rho)


def solve_fixed_index_lp(info: K.LPBasis, adjustment: np.ndarray) -> np.ndarray | None:
    """HiGHS: the balancing LP with the index sets (rows of ``M``) of ``info`` and the adjustment ``A'``:
    ``max (CA')ᵀμ s.t. Mμ ≥ b_const + S C A'`` (the equality row included). ``None`` if not solved."""
    from scipy.optimize import linprog

    C = info.gram
    CA = C @ adjustment
    b = info.b_const + info.S @ CA
    M = info.M
    m = M.shape[1]
    ineq = M[1 + m:]
    res = linprog(-CA, A_ub=-ineq if ineq.size else None, b_ub=-b[1 + m:] if ineq.size else None,
                  A_eq=M[:1], b_eq=b[:1], bounds=[(0, None)] * m, method="highs", options=HIGHS_OPTIONS)
    return res.x if res.status == 0 else None


def active_rows(info: K.LPBasis, adjustment: np.ndarray, mu: np.ndarray, tol: float = 1e-9) -> tuple:
    """Labels of the rows of ``M`` active at ``μ`` for rhs ``b(A')`` (same rule as :func:`sim.constants.lp_basis`)."""
    b = info.b_const + info.S @ (info.gram @ adjustment)
    slack = info.M @ mu - b
    m = mu.shape[0]
    act = np.zeros(len(info.rows), dtype=bool)
    act[0] = True
    act[1:1 + m] = mu <= tol
    act[1 + m:] = slack[1 + m:] <= tol * np.maximum(1.0, np.abs(b[1 + m:]))
    return tuple(info.rows[r] for r in np.flatnonzero(act))


def switch_pair_cluster(rng: np.random.Generator, gap: float = 1e-9, max_tries: int = 50) -> ClusterLP | None:
    """Two clients straddling an LP basis switch (negative controls of H.7 / H.11).

    Draw an F1 problem with two planted clients far apart (spread 1), and the path ``u(t)`` between their mixing
    weights; if the LP weights at ``t = 0`` and ``t = 1`` differ, bisect on ``t`` to the switch point ``t*`` and
    return the cluster of the two clients ``u(t* ∓ gap/2)`` (``ρ = (½, ½)``). Their preferences differ by
    ``O(gap)`` but their LP directions by ``O(1)``: different bases (H.6 fails) and ``H`` does not scale as
    ``δ_λ²``. ``None`` when no switch was found in ``max_tries`` draws.
    """
    for _ in range(max_tries):
        m = int(rng.choice([2, 3]))
        n_w = int(rng.integers(m, 5))
        prob = PlantedQuadraticCluster.make(rng, m, n_w, 2, spread=1.0)
        w0 = prob.planted_client(prob.u0)[1]
        xi = rng.standard_normal(n_w)
        w = w0 + rng.uniform(0.05, 0.5) * xi / np.linalg.norm(xi)
        l, C = prob.losses(w), prob.gram(w)
        u0, u1 = prob.mixing

        def mu_at(t, prob=prob, l=l, C=C, u0=u0, u1=u1):
            lam = prob.planted_client((1 - t) * u0 + t * u1)[0]
            return lp_direction(l, lam, C, eps_mode=0.0).weights

        lo, hi = 0.0, 1.0
        mlo, mhi = mu_at(lo), mu_at(hi)
        if np.linalg.norm(mlo - mhi) < 1e-3:
            continue
        while hi - lo > gap:
            mid = 0.5 * (lo + hi)
            mm = mu_at(mid)
            if np.linalg.norm(mm - mlo) < np.linalg.norm(mm - mhi):
                lo, mlo = mid, mm
            else:
                hi, mhi = mid, mm
        if np.linalg.norm(mlo - mhi) < 1e-3:  # continuous crossing (no jump): not a switch of the wanted kind
            continue
        u = np.stack([(1 - lo) * u0 + lo * u1, (1 - hi) * u0 + hi * u1])
        lam, w_star, psi_star = prob.planted_client(u)
        pair = replace(prob, mixing=u, prefs=lam, w_star=w_star, psi_star=psi_star)
        out = analyse_cluster(pair, w, np.array([0.5, 0.5]))
        if out.all_vertices:
            return out
    return None


def lhat_min(losses, prefs) -> float:
    """``min ĺ`` (H.9 floor before the factor m)."""
    return float(normalized_losses(losses, prefs).min())
