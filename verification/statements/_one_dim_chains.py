r"""The one-dimensional negative controls of the shared-iteration statements (private module): the H.18
examples F4 (double well) and F5 (kink), where H.19 and ``w ∈ 𝒩`` fail.

* :func:`double_well_chain`, :func:`kink_chain` — the examples run through
  :func:`sim.algorithm.shared_iteration` via a one-client adapter (:class:`OneClient`), with the constants the
  T-H31(e) design prescribes (strict ``c_d`` on the claimed region; ``B``, ``L₀`` on the visited interval);
* :func:`one_dim_rows`, :func:`one_dim_figure`, :func:`one_dim_control` — their rows, figure table and the shared
  negative control of the chain statements.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sim.algorithm import shared_iteration
from sim.constants import (
    gradient_bound,
    smoothness_hessian_max,
    strict_descent_constant,
)
from sim.problems import DoubleWell, Kink
from verification.statements._chains import (
    H_GRAD,
    H_H19,
    H_POS,
    H_REGION,
    H_STEP,
    ChainConfig,
    lp_at_points,
    margins_at_points,
)
from verification.statements._trajectory_rows import RowSet, downsample

# ============================================================================================ 1-D controls


class OneClient:
    """A one-client :class:`sim.algorithm.ClientProblem` over a 1-D example (F4 :class:`DoubleWell`, F5
    :class:`Kink`): ``losses_per_client``/``grads_per_client`` evaluate the example at each client's point."""

    n_clients = 1
    n_params = 1

    def __init__(self, example, psi_star: float):
        self.example = example
        self.prefs = np.asarray(example.prefs, dtype=np.float64)[None]
        self.psi_star = np.array([float(psi_star)])
        self.n_objectives = int(example.n_objectives)

    def losses_per_client(self, w):
        return self.example.losses(w)

    def grads_per_client(self, w):
        return self.example.grads(w)


@dataclass(frozen=True, eq=False)
class OneDimChain:
    """A 1-D example run through the shared iteration with the T-H31(e) constants (single client, ``Δ = 0``).

    ``w`` (T+1,), ``gap`` (T+1,), ``margin`` (T+1,) (with ``ε_act = 2ηλ_max B²``), ``c_d`` strict on the claimed
    region, ``b = 0``, ``B``/``L0`` as described by ``method``; ``region_margin`` (T+1,) ``≥ 0`` iff ``w^t ∈ 𝒩``;
    ``eps0`` the band radius eq 64; ``lam_min``; ``q_star`` (m,) the ray point of the optimum."""

    family: str
    eta: float
    w: np.ndarray
    gap: np.ndarray
    psi: np.ndarray
    margin: np.ndarray
    losses: np.ndarray
    grad_norm: np.ndarray
    c_d: float
    b: float
    B: float
    L0: float
    eps0: float
    region_margin: np.ndarray
    lam_max: float
    lam_min: float
    q_star: np.ndarray
    w_star: float
    mu_qg: float | None
    method: str
    extra: dict

    @property
    def q(self) -> float:
        return 1.0 - self.eta * self.c_d

    def summary(self) -> dict:
        return dict(family=self.family, eta=self.eta, c_d=self.c_d, b=self.b, B=self.B, L0=self.L0, eps0=self.eps0,
                    eta_c_d=self.eta * self.c_d, final_w=float(self.w[-1]), final_gap=float(self.gap[-1]),
                    iterates_outside_region=int((self.region_margin < 0).sum()), iterates=int(self.w.size),
                    method=self.method, **self.extra)


def _fd_second_derivative(example, x: np.ndarray, h: float = 1e-5) -> np.ndarray:
    """``l''`` by central differences of the example's gradient (F4's gradient is a cubic: error ``4h²``)."""
    xp, xm = (x + h)[:, None], (x - h)[:, None]
    return ((example.grads(xp) - example.grads(xm))[:, 0, 0] / (2 * h))


@lru_cache(maxsize=16)
def double_well_chain(eta: float, w0: float, steps: int, region: tuple, n_region: int, eps_mode: float) -> OneDimChain:
    """F4 from ``w0`` with step ``eta`` (T-H31(e)). ``ψ*`` and ``w*`` by the dense grid of F-OPT step 3; strict
    ``c_d = min l'(w)²/r(w)`` on a uniform grid of the claimed region (left well); ``B = max |l'|`` and
    ``L₀ = max |l''|`` (central differences of ``l'``) on a dense grid of the visited interval (its convex hull,
    which contains every segment)."""
    dw = DoubleWell()
    mins = dw.minima()
    w_star, psi_star = mins.global_w, mins.global_value
    src = OneClient(dw, psi_star)
    traj = shared_iteration(src, np.array([0]), np.array([w0]), None, eta, steps, eps_mode=eps_mode)
    lo, hi = float(traj.min()), float(traj.max())
    hull = np.linspace(lo, hi, 4001)
    B = float(gradient_bound(dw.grads(np.concatenate([hull, traj[:, 0]])[:, None])))
    L0 = float(smoothness_hessian_max(_fd_second_derivative(dw, hull)[:, None, None]))
    rlo, rhi = region
    Wr = np.linspace(rlo, rhi, n_region)[:, None]
    pr = lp_at_points(src, Wr, src.psi_star, eps_mode=eps_mode)
    mr, _, _ = margins_at_points(pr, eta, B)
    strict = strict_descent_constant(mr[:, 0], np.maximum(pr.gap[:, 0], 0.0))
    pl = lp_at_points(src, traj, src.psi_star, eps_mode=eps_mode)
    mt, _, _ = margins_at_points(pl, eta, B)
    c_d = strict.c_d
    eps0 = (1.0 / c_d) * (0.5 * L0 * B * B * eta)  # eq 64 with λ_max = 1, Δ̄ = 0 (one client), b = 0
    lp_is_gd = bool(np.allclose(pl.d[:, 0, 0], dw.grads(traj)[:, 0, 0], rtol=0, atol=1e-12))
    mu_qg = float(_fd_second_derivative(dw, np.array([w_star]))[0])
    return OneDimChain(
        family="F4 double well", eta=eta, w=traj[:, 0], gap=pl.gap[:, 0], psi=pl.psi[:, 0], margin=mt[:, 0],
        losses=pl.losses[:, 0], grad_norm=pl.grad_norm[:, 0].max(axis=-1), c_d=c_d, b=0.0, B=B, L0=L0, eps0=eps0,
        region_margin=np.minimum(traj[:, 0] - rlo, rhi - traj[:, 0]), lam_max=1.0, lam_min=1.0,
        q_star=np.array([psi_star]), w_star=w_star, mu_qg=mu_qg,
        method=(f"strict c_d = min m/r on a uniform grid of the claimed region N = [{rlo:g}, {rhi:g}] (left well); B = max|l'| "
                "and L0 = max|l''| (central differences of l') on the visited interval; eps0 = L0 B^2 eta/(2 c_d); "
                "QG constant mu = l''(w*) (left well)"),
        extra=dict(w_star=w_star, psi_star=psi_star, spurious_minimum=[float(mins.w[1]), float(mins.values[1])],
                   lp_is_gradient_descent=lp_is_gd),
    )


@lru_cache(maxsize=16)
def kink_chain(eta: float, w0: float, steps: int, region: tuple, n_region: int, eps_mode: float) -> OneDimChain:
    """F5 from ``w0`` with step ``eta`` (``ε_act = η``); strict ``c_d = min m/r`` on a uniform grid of the claimed
    region ``𝒩 = {region[0] ≤ |w| ≤ region[1]}`` (outside the ``ε_act`` band); ``B = 1``, ``L₀ = 0`` exact."""
    kink = Kink()
    src = OneClient(kink, kink.psi_star)
    traj = shared_iteration(src, np.array([0]), np.array([w0]), None, eta, steps, eps_mode=eps_mode)
    rlo, rhi = region
    half = np.linspace(rlo, rhi, n_region // 2)
    Wr = np.concatenate([-half[::-1], half])[:, None]
    pr = lp_at_points(src, Wr, src.psi_star, eps_mode=eps_mode)
    mr, _, _ = margins_at_points(pr, eta, kink.B)
    strict = strict_descent_constant(mr[:, 0], np.maximum(pr.gap[:, 0], 0.0))
    pl = lp_at_points(src, traj, src.psi_star, eps_mode=eps_mode)
    mt, ea, mask = margins_at_points(pl, eta, kink.B)
    c_d = strict.c_d
    lam_max = float(kink.prefs.max())
    eps0 = (lam_max / c_d) * (0.5 * kink.L0 * kink.B**2 * eta)  # = 0: L0 = 0, Δ̄ = 0, b = 0
    w = traj[:, 0]
    band = (np.abs(w) > 0) & (np.abs(w) < ea[:, 0])
    return OneDimChain(
        family="F5 kink", eta=eta, w=w, gap=pl.gap[:, 0], psi=pl.psi[:, 0], margin=mt[:, 0], losses=pl.losses[:, 0],
        grad_norm=pl.grad_norm[:, 0].max(axis=-1), c_d=c_d, b=0.0, B=kink.B, L0=kink.L0, eps0=eps0,
        region_margin=np.minimum(np.abs(w) - rlo, rhi - np.abs(w)), lam_max=lam_max, lam_min=float(kink.prefs.min()),
        q_star=kink.psi_star / kink.prefs, w_star=0.0, mu_qg=None,
        method=(f"strict c_d = min m/r on a uniform grid of the claimed region N = {{{rlo:g} <= |w| <= {rhi:g}}} (outside the "
                "eps_act band); B = 1, L0 = 0 exact (linear losses); eps0 = 0"),
        extra=dict(iterates_in_eps_act_band=int(band.sum()),
                   both_objectives_near_active_in_band=bool(mask[band, 0].all()) if band.any() else None,
                   min_margin_in_band=float(mt[band, 0].min()) if band.any() else None),
    )


def one_dim_controls(cfg: ChainConfig) -> list[OneDimChain]:
    """The F4 runs (every ``dw_etas``) and the F5 run of :class:`ChainConfig`."""
    out = [double_well_chain(float(e), float(cfg.dw_w0), int(cfg.dw_steps), tuple(cfg.dw_region),
                             int(cfg.n_region_1d), float(cfg.eps_mode)) for e in cfg.dw_etas]
    out.append(kink_chain(float(cfg.kink_eta), float(cfg.kink_w0), int(cfg.kink_steps), tuple(cfg.kink_region),
                          int(cfg.n_region_1d), float(cfg.eps_mode)))
    return out


H_QG = "H.34 quadratic growth at the final iterate: psi_i - psi_i* >= (mu_i/2)||w - w_i*||^2"


def one_dim_step_hyps(c: OneDimChain) -> dict[str, np.ndarray]:
    """Hypothesis margins at every step ``t = 0..T−1`` of a 1-D control run (``≥ 0`` where held)."""
    r, T = np.maximum(c.gap, 0.0), c.w.size - 1
    minloss = c.losses.min(axis=-1)
    return {
        H_REGION: c.region_margin[:-1],
        H_H19: c.b - (c.c_d * r[:-1] - c.margin[:-1]) + 1e-12,
        H_STEP: np.full(T, 1.0 - c.eta * c.c_d),
        H_POS: np.minimum(minloss[:-1], minloss[1:]),
        H_GRAD: c.B - np.maximum(c.grad_norm[:-1], c.grad_norm[1:]),
    }


def one_dim_rows(rows: RowSet, c: OneDimChain, checks, *, tail: int = 50) -> None:
    """Rows of the chain conclusions for a 1-D control run (``t0 = 0``, one client, ``Δ = 0``).

    ``checks`` ⊆ {"eq 62", "eq 63", "eq 65", "eq 66", "H.31 item 1", "eq 72", "eq 73"}; each check is named
    ``"<check> [<family> eta=<η>]"`` so that a control can require every family to show the failure."""
    tag = f"[{c.family} eta={c.eta:g}]"
    r = np.maximum(c.gap, 0.0)
    T = c.w.size - 1
    q = c.q
    hs = one_dim_step_hyps(c)
    win = {k: np.minimum.accumulate(v) for k, v in hs.items()}  # steps 0..T'-1 for T' = 1..T
    tt = np.arange(T)
    repro = dict(c.summary(), w0=float(c.w[0]), steps=int(T))
    quad = c.lam_max * 0.5 * c.L0 * c.B**2 * c.eta
    if "eq 62" in checks:
        rows.add(f"eq 62 {tag}", r[1:], q * r[:-1] + c.eta * (quad + c.b), hyps=hs,
                 info={"t": tt, "w": c.w[:-1], "r": r[:-1]}, repro=repro)
    if "eq 63" in checks:
        slack = c.eta * np.maximum(quad + c.b - c.c_d * r[:-1], 0.0)
        rows.add(f"eq 63 {tag}", c.psi[1:] - c.psi[:-1], slack, hyps=hs, info={"t": tt, "w": c.w[:-1]},
                 repro=repro)
    if "eq 65" in checks:
        rows.add(f"eq 65 {tag}", r[1:], q * r[:-1] + c.eta * c.c_d * c.eps0, hyps=hs,
                 info={"t": tt, "w": c.w[:-1], "r": r[:-1]}, repro=repro)
    Ts = np.arange(1, T + 1)
    qT = q ** Ts
    if "eq 66" in checks:
        rows.add(f"eq 66 {tag}", r[1:], qT * r[0] + (1 - qT) * c.eps0, hyps=win,
                 info={"T": Ts, "w_T": c.w[1:]}, repro=repro)
    if "H.31 item 1" in checks:
        rows.add(f"H.31 item 1 {tag}", r[1:], qT * r[0] + c.eps0, hyps=win, info={"T": Ts, "w_T": c.w[1:]},
                 repro=repro)
    if "eq 72" in checks:
        sel = np.arange(max(1, T - tail + 1), T + 1)
        m = c.losses.shape[-1]
        lhs = c.losses[sel] - c.q_star[None]
        rhs = ((q ** sel) * r[0] + c.eps0)[:, None] / c.lam_min
        rows.add(f"eq 72 {tag}", lhs, np.broadcast_to(rhs, lhs.shape),
                 hyps={k: np.repeat(v[sel - 1], m) for k, v in win.items()},
                 info={"T": np.repeat(sel, m), "j": np.tile(np.arange(m), sel.size)}, repro=repro)
    if "eq 73" in checks and c.mu_qg is not None:
        dist2 = (c.w[-1] - c.w_star) ** 2
        hyps = {k: v[-1] for k, v in win.items()}
        hyps[H_QG] = r[-1] - 0.5 * c.mu_qg * dist2 + 1e-12
        rows.add(f"eq 73 {tag}", dist2, (2.0 / c.mu_qg) * (q**T * r[0] + c.eps0), hyps=hyps,
                 info={"T": T, "w_T": c.w[-1], "mu": c.mu_qg}, repro=repro)


def one_dim_figure(controls) -> dict:
    """Figure table of the double-well control(s): ``t, eta, r, band (claimed ε_0), bound (q^t r^0 + ε_0)``."""
    cols = {"t": [], "eta": [], "r": [], "band": [], "bound": []}
    for c in controls:
        if not c.family.startswith("F4"):
            continue
        t = np.arange(c.w.size)
        cols["t"].append(t)
        cols["eta"].append(np.full(t.size, c.eta))
        cols["r"].append(np.maximum(c.gap, 0.0))
        cols["band"].append(np.full(t.size, c.eps0))
        cols["bound"].append(c.q**t * max(c.gap[0], 0.0) + c.eps0)
    if not cols["t"]:
        return {}
    tab = {k: np.concatenate(v) for k, v in cols.items()}
    return downsample(tab, 2000)


# ============================================================================================ evidence assembly


def one_dim_control(stmt_id: str, name: str, cfg: ChainConfig, checks, *, tail: int = 50):
    """The shared negative control of the chain statements: F4 double well and F5 kink, where H.19 (and
    ``w ∈ 𝒩``) fail; ``checks`` are the conclusions of the statement evaluated on those runs."""
    controls = one_dim_controls(cfg)
    rows = RowSet()
    for c in controls:
        one_dim_rows(rows, c, checks, tail=tail)
    details = dict(controls=[c.summary() for c in controls], figure_data={"double_well": one_dim_figure(controls)})
    return rows.control(stmt_id, name, [H_REGION, H_H19], details, groups=("F4 double well", "F5 kink"))
