"""Algorithm 1's training (:mod:`sim.algorithm`): the clustering at ``w_ref`` and the placement of new clients,
the reference shared iteration (eq 55), and Phase 1 and Phase 2 — one federated engine with the population
diagnostics of every round (its hull diagnostics computed for a stack of rounds in one call of each kernel)."""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.algorithm.configs import ClusterConfig, Phase1Config, Phase2Config, _int
from sim.algorithm.evaluation import (
    DivergenceError,
    _check_point,
    _check_rng,
    _Dir,
    _direction_spread,
    _directions,
    _evaluate,
    _like,
    _losses,
    _rho_for,
    _row_norms,
    _rows,
)
from sim.algorithm.records import (
    PhaseResult,
    Progress,
    RowSink,
    _add_counts,
    _record_metrics,
    _Recorder,
    _zero_counts,
)
from sim.cluster import Clustering, cluster_clients, stage1_keys
from sim.direction import STATUSES
from sim.hull import descent_margin_from_gram, eps_act, min_norm_weights_from_gram, near_active_set
from sim.preference import adjustment
from sim.source import (
    Evaluation,
    GradientEvaluation,
    Source,
    array_namespace,
    as_source,
    check_batch_size,
    check_clients,
    check_psi_star,
)

# ================================================================================================ clustering


def clustering_step(source, clients, w_ref, config: ClusterConfig | None = None,
                    rng: np.random.Generator | None = None) -> Clustering:
    """Algorithm 1's clustering at ``w_ref``: population losses ``l_i(w_ref)`` of ``clients`` and
    :func:`sim.cluster.cluster_clients` with ``config``. Labels and clusters index positions in ``clients``."""
    src = as_source(source)
    cfg = ClusterConfig() if config is None else config
    clients = check_clients(src, clients)
    w_ref = _check_point(src, w_ref, "w_ref")
    l = _losses(src, _rows(w_ref, clients.size), clients, where="clustering at w_ref")
    return cluster_clients(l, src.prefs[clients], key=cfg.key, stage2=cfg.stage2, method=cfg.method,
                           threshold=cfg.threshold if cfg.stage2 else None,
                           k=cfg.k if cfg.stage2 else None, rng=rng)


def assign_to_cluster(source, new_clients, w_ref, clustering: Clustering, train_clients,
                      key: str = "ordering") -> np.ndarray:
    """Cluster of each new client: among the clusters holding a training client with the new client's Stage-1 key
    (all clusters if none does), the one with the training client whose ``A_i^ref`` is nearest to ``A_new^ref``."""
    src = as_source(source)
    new = check_clients(src, new_clients, "new_clients")
    train = check_clients(src, train_clients, "train_clients")
    if clustering.labels.shape != (train.size,):
        raise ValueError(f"clustering has {clustering.labels.size} clients but train_clients has {train.size}")
    w_ref = _check_point(src, w_ref, "w_ref")
    l_new = _losses(src, _rows(w_ref, new.size), new, where="cluster assignment at w_ref")
    lam_new = src.prefs[new]
    k_new = stage1_keys(l_new, lam_new, key=key)
    A_new = adjustment(l_new, lam_new)
    k_tr = np.asarray(clustering.keys)
    if k_tr.shape[1] != k_new.shape[1]:
        raise ValueError(f"key={key!r} does not match the clustering's keys (width {k_tr.shape[1]})")
    out = np.empty(new.size, dtype=np.int64)
    for c in range(new.size):
        same = np.all(k_tr == k_new[c], axis=1)
        cand = same if same.any() else np.ones(train.size, dtype=bool)
        dist = np.where(cand, np.linalg.norm(clustering.adjustments_ref - A_new[c], axis=1), np.inf)
        out[c] = clustering.labels[int(np.argmin(dist))]
    return out


# ================================================================================================ training


def shared_iteration(source, clients, w0, rho, eta_eff, rounds: int, *, eps_mode: float = 1e-4,
                     descent: str = "restricted", on_infeasible: str = "relaxed"):
    """Reference shared iteration eq 55: ``w_{t+1} = w_t - eta_eff_t · Σ_i ρ_i d_i(w_t)`` (population LP directions).

    ``eta_eff``: a scalar or ``(rounds,)`` per-round step sizes. Returns the trajectory ``(rounds+1, n_w)`` in the
    source's array type."""
    src = as_source(source)
    clients = check_clients(src, clients)
    w = _check_point(src, w0, "w0")
    rounds = _int(rounds, "rounds", "shared_iteration", 0)
    r = _rho_for(src, clients, rho)
    steps = np.broadcast_to(np.asarray(eta_eff, dtype=np.float64), (rounds,))
    if not np.all(np.isfinite(steps)) or np.any(steps <= 0):
        raise ValueError(f"eta_eff must be finite and > 0; got {eta_eff!r}")
    cfg = Phase1Config(eps_mode=eps_mode, descent=descent, on_infeasible=on_infeasible)
    lam = src.prefs[clients]
    rho_x = _like(w, r)
    traj = [w]
    for t in range(rounds):
        where, eta = f"shared_iteration round {t}", float(steps[t])
        ev = _evaluate(src, _rows(w, clients.size), clients, None, where=where, step_size=eta)
        d = _directions(ev, lam, "lp", cfg, where=where, clients=clients).d
        w = w - eta * (rho_x @ d)
        traj.append(w)
    return array_namespace(w).stack(traj)


def _diagnostics(src: Source, ev: Evaluation, clients, lam, psi_star, rho, eta_eff, B_cfg, B_seen,
                 step_dir: _Dir | None, cfg, direction,
                 where) -> tuple[dict, float, dict | None, dict[str, np.ndarray] | None, tuple]:
    """Population diagnostics at the server model ``w_r`` (the population evaluation ``ev`` of every client there),
    all from ``(l, C)`` and the source's combine; ``step_dir``: the round's first step when it is this LP.

    Returns the round's columns but those of :func:`_hull_diagnostics` (ε_act, the margins, ``‖d_M‖``, ``|J*_ε|``),
    whose inputs come last (``(l, C, μ, B, ev)``): :func:`_hull_diagnostics` computes them for a stack of rounds
    in one call."""
    N = clients.size
    l, C = ev.losses, ev.gram
    gnorm = np.sqrt(np.diagonal(C, axis1=-2, axis2=-1))  # ‖g_ij‖ = √(C_i)_jj
    B_seen = max(B_seen, float(gnorm.max()))
    B = B_seen if B_cfg is None else float(B_cfg)
    with np.errstate(over="ignore"):
        if not np.isfinite(2.0 * eta_eff * B * B):
            c = int(np.asarray(clients)[np.unravel_index(np.argmax(gnorm), gnorm.shape)[0]])
            raise DivergenceError(
                f"{where}: client {c} has a gradient of norm {B:.3e}, so ε_act = 2·η·λ_max·B² overflows with step "
                f"size {eta_eff!r}: the iteration diverged; reduce the step size"
            )
    diag_counts = None
    if step_dir is None:
        dr = _directions(ev, lam, direction, cfg, where=where, clients=clients)
        diag_counts = _zero_counts()
        if direction == "lp":
            _add_counts(diag_counts, dr.status)
    else:
        dr = step_dir
    psi = (lam * l).max(axis=-1)
    d_norm, dev, H = _direction_spread(src, dr.d, rho)
    cols = dict(
        client=clients, rho=rho, psi=psi, psi_star=psi_star, gap=psi - psi_star, beta=dr.beta, gain=dr.gain,
        lp_mode=dr.mode, lp_status=dr.status, lp_from_step=np.full(N, step_dir is not None),
        d_norm=d_norm, deviation=dev, dispersion=np.full(N, H), grad_bound=np.full(N, B),
    )
    lp_inputs = lp_input_columns(C, dr.weights) if getattr(src, "record_lp_inputs", False) else None
    return cols, B_seen, diag_counts, lp_inputs, (l, C, dr.weights, B, ev)


def _hull_diagnostics(src: Source, lam, eta_eff, rounds: list[tuple]) -> list[dict]:
    """The columns ``eps_act``, ``margin_Jstar``, ``margin_Jeps``, ``dM_norm`` and ``n_Jeps`` of a stack of rounds
    (the inputs ``(l, C, μ, B, ev)`` that :func:`_diagnostics` returns, one per round): one call of each kernel for
    all rounds and clients (each instance's numbers do not depend on the others in the stack); ``d_M`` is formed by
    each round's combine. A kernel that refuses the stack is called round by round, so the error is the first
    round's, as if the rounds had come one at a time."""
    if len(rounds) > 1:
        try:
            return _hull_diagnostics_stack(src, lam, eta_eff, rounds)
        except ValueError:
            return [c for r in rounds for c in _hull_diagnostics_stack(src, lam, eta_eff, [r])]
    return _hull_diagnostics_stack(src, lam, eta_eff, rounds)


def _hull_diagnostics_stack(src: Source, lam, eta_eff, rounds: list[tuple]) -> list[dict]:
    if len(rounds) == 1:  # one round: its own (N, ...) arrays, so that a kernel's error names the client alone
        l, C, mu, B = rounds[0][:4]
    else:
        l = np.stack([r[0] for r in rounds])  # (R, N, m)
        C = np.stack([r[1] for r in rounds])  # (R, N, m, m)
        mu = np.stack([r[2] for r in rounds])
        B = np.array([r[3] for r in rounds])[:, None]  # (R, 1)
    lam_r = np.broadcast_to(lam, l.shape)
    ea = eps_act(eta_eff, lam_r, B)
    m_eps, m_star = near_active_set(l, lam_r, np.stack([ea, np.zeros_like(ea)]))  # J*_ε and J* in one call
    u = min_norm_weights_from_gram(lam_r[..., :, None] * C * lam_r[..., None, :], m_eps)  # Gram of {λ_j g_j}; checks C
    margin_star = descent_margin_from_gram(mu, C, lam_r, m_star, validate=False)
    margin_eps = descent_margin_from_gram(mu, C, lam_r, m_eps, validate=False)
    n_eps = m_eps.sum(axis=-1)
    if len(rounds) == 1:
        ea, u, margin_star, margin_eps, n_eps = (a[None] for a in (ea, u, margin_star, margin_eps, n_eps))
    return [dict(margin_Jstar=margin_star[k], margin_Jeps=margin_eps[k],
                 dM_norm=_row_norms(src, r[4].combine(lam * u[k])), eps_act=ea[k], n_Jeps=n_eps[k])
            for k, r in enumerate(rounds)]


#: Gradient entries (rounds × clients × parameters × objectives) of host evaluations that Algorithm 1 keeps while
#: the rounds' hull diagnostics wait for one call (:func:`_hull_diagnostics`); beyond it they are computed.
_PENDING_GRADIENTS = 1 << 21


def lp_input_columns(gram, weights) -> dict[str, np.ndarray]:
    """The record columns of :mod:`sim.source`'s ``record_lp_inputs``: ``gram_<j>_<k>`` (``j ≤ k``) of ``gram``
    ``(n, m, m)`` and ``mu_<j>`` of ``weights`` ``(n, m)``, float64."""
    C = np.asarray(gram, dtype=np.float64)
    mu = np.asarray(weights, dtype=np.float64)
    m = C.shape[-1]
    out = {f"gram_{j}_{k}": C[:, j, k].copy() for j in range(m) for k in range(j, m)}
    out.update({f"mu_{j}": mu[:, j].copy() for j in range(m)})
    return out


def _federated(src: Source, clients, w0, rho, rng, *, phase: str, rounds: int, local_steps: int,
               eta_inner: float, alpha_server: float, batch: int | None, episodic: bool, cfg, direction: str,
               cluster: int, round_offset: int, B_cfg, B_start: float, progress: Progress | None,
               step_cols: dict, keep_trajectory: bool, on_rows: RowSink | None = None) -> PhaseResult:
    """Shared engine of Phase 1 (fresh minibatch per local step), Phase 2 (one episode per round) and FedAvg."""
    lam = src.prefs[clients]
    psi_star = check_psi_star(src, clients)
    N = clients.size
    eta_inner, alpha_server = float(eta_inner), float(alpha_server)
    eta_eff = alpha_server * eta_inner
    rho_x = _like(w0, rho)
    w = w0
    traj = [w] if keep_trajectory else None
    rec = _Recorder(on_rows)
    step_counts, diag_counts = _zero_counts(), _zero_counts()
    B_seen = B_start
    params = dict(phase=phase, cluster=cluster, clients=clients.tolist(), rho=rho.tolist(), **step_cols)
    pending: list[dict[str, Any]] = []  # rounds whose hull diagnostics wait for one call (_hull_diagnostics)
    held = 0

    def flush():  # the waiting rounds' hull diagnostics in one call, then their record rows in round order
        nonlocal held
        waiting = [p for p in pending if p["hull"] is None]
        for p, hc in zip(waiting, _hull_diagnostics(src, lam, eta_eff, [p["hull_in"] for p in waiting]) if waiting
                         else [], strict=True):
            p["hull"] = hc
        for p in pending:
            rec.add(p["extra"], **p["row"], **p["hull"])
        pending.clear()
        held = 0

    try:
        for r in range(rounds + 1):
            final = r == rounds
            where = f"{phase} cluster {cluster} round {r}"
            # batches of this round (drawn before any step; none on the final row)
            batches = None
            if not final and batch is not None:
                if episodic:
                    ep = [src.episode(rng, int(i), batch) for i in clients]
                    batches = [ep] * local_steps
                else:
                    batches = [[src.episode(rng, int(i), batch) for i in clients] for _ in range(local_steps)]
            W = _rows(w, N)
            # the population evaluation at w_r; with population gradients its LP is also the round's first step
            first_step = not final and batch is None
            ev = _evaluate(src, W, clients, None, where=where + (" step 0" if first_step else " diagnostic"),
                           step_size=eta_inner if first_step else eta_eff)
            first = _directions(ev, lam, direction, cfg, where=where + " step 0", clients=clients) if first_step else None
            cols, B_seen, dc, lp_inputs, hull_in = _diagnostics(src, ev, clients, lam, psi_star, rho, eta_eff, B_cfg,
                                                                B_seen, first, cfg, direction, where + " diagnostic")
            # host gradients wait for one hull call over the rounds; a device's are used now and released
            keep = on_rows is None and isinstance(ev, GradientEvaluation)
            row: dict[str, Any] = {"hull_in": hull_in if keep else None, "row": cols, "extra": None,
                   "hull": None if keep else _hull_diagnostics(src, lam, eta_eff, [hull_in])[0]}
            pending.append(row)
            held += ev.grads.size if keep else 0  # type: ignore[attr-defined]  # keep: a GradientEvaluation
            del hull_in
            row["extra"] = extra = _record_metrics(src, W, clients, ev.losses)
            if lp_inputs is not None:
                row["extra"] = {**(extra or {}), **lp_inputs}
            del ev  # the source may hold the gradients of every client on its device
            if dc is not None:
                for s in STATUSES:
                    diag_counts[s] += dc[s]
            counts = {s: np.zeros(N, dtype=np.int64) for s in STATUSES}
            n_desc = np.zeros(N, dtype=np.int64)
            if not final:
                for k in range(local_steps):
                    if k == 0 and first is not None:
                        dr = first
                    else:
                        ev = _evaluate(src, W, clients, None if batches is None else batches[k],
                                       where=f"{where} step {k}", step_size=eta_inner)
                        dr = _directions(ev, lam, direction, cfg, where=f"{where} step {k}", clients=clients)
                        del ev
                    if direction == "lp":
                        for s in STATUSES:
                            counts[s] += dr.status == s
                        n_desc += dr.mode == "descent"
                    W = W - eta_inner * dr.d
                g = W - w  # pseudo-gradients (N, n_w)
                w = w + alpha_server * (rho_x @ g)
                if traj is not None:
                    traj.append(w)
                for s in STATUSES:
                    step_counts[s] += int(counts[s].sum())
            row["row"] = dict(
                phase=phase, round=r, t=r + round_offset, cluster=cluster, **cols,
                n_lp_steps=sum(counts[s] for s in STATUSES), **{f"n_{s}": counts[s] for s in STATUSES},
                n_descent_steps=n_desc, local_steps=0 if final else local_steps,
                batch_size=np.nan if batch is None else float(batch), eta_eff=eta_eff, alpha_server=alpha_server,
                alpha_adapt=np.nan, preconditioner="none", p_min=np.nan, p_max=np.nan, p_at_lower=np.nan,
                p_at_upper=np.nan, **step_cols)
            if not keep or final or held > _PENDING_GRADIENTS:
                flush()
            if progress is not None:
                progress(f"{phase} cluster {cluster}", r, rounds)
    except Exception:
        # the waiting rounds' hull diagnostics first: an error of theirs is raised as if they had come one by one
        waiting = [p["hull_in"] for p in pending if p["hull"] is None]
        if waiting:
            _hull_diagnostics(src, lam, eta_eff, waiting)
        raise
    return PhaseResult(w=w, trajectory=None if traj is None else array_namespace(w).stack(traj),
                       records=rec.frame(params), step_status_counts=step_counts,
                       diagnostic_status_counts=diag_counts, B=B_seen)


def _phase_inputs(source, clients, w0, rng, rho):
    src = as_source(source)
    clients = check_clients(src, clients)
    w0 = _check_point(src, w0, "w0")
    rng = _check_rng(rng)
    return src, clients, w0, rng, _rho_for(src, clients, rho)


def phase1(source, clients, w0, config: Phase1Config, rng: np.random.Generator, *, rho=None, cluster: int = 0,
           round_offset: int = 0, B_start: float = 0.0, progress: Progress | None = None,
           phase: str = "phase1", keep_trajectory: bool = True, on_rows: RowSink | None = None) -> PhaseResult:
    """Phase 1 on the cluster ``clients`` from ``w0`` (see the module docstring); ``rho``: weights ``(N,)``,
    ``"uniform"`` (default) or ``"samples"``. Records ``round = 0..R``, the last row holding ``w_I``; ``on_rows``
    receives each round's rows as they are made."""
    if not isinstance(config, Phase1Config):
        raise ValueError(f"config must be a Phase1Config; got {type(config).__name__}")
    src, clients, w0, rng, r = _phase_inputs(source, clients, w0, rng, rho)
    if config.batch_size is not None:
        check_batch_size(src, clients, config.batch_size, "Phase1Config.batch_size")
    return _federated(src, clients, w0, r, rng, phase=phase, rounds=config.rounds, local_steps=config.tau,
                      eta_inner=config.eta_local, alpha_server=config.alpha_server, batch=config.batch_size,
                      episodic=False, cfg=config, direction=config.direction, cluster=cluster,
                      round_offset=round_offset, B_cfg=config.B, B_start=B_start, progress=progress,
                      step_cols=dict(eta_local=config.eta_local, eta_meta_inner=np.nan),
                      keep_trajectory=keep_trajectory, on_rows=on_rows)


def phase2(source, clients, w0, config: Phase2Config, rng: np.random.Generator, *, rho=None, cluster: int = 0,
           round_offset: int = 0, B_start: float = 0.0, progress: Progress | None = None,
           keep_trajectory: bool = True, on_rows: RowSink | None = None) -> PhaseResult:
    """Phase 2 (Reptile over S-shot episodes) on ``clients`` from ``w0`` (normally ``w_I``). ``round_offset`` sets
    the global round index ``t`` (Phase 1's ``R``) and ``B_start`` carries Phase 1's gradient bound."""
    if not isinstance(config, Phase2Config):
        raise ValueError(f"config must be a Phase2Config; got {type(config).__name__}")
    src, clients, w0, rng, r = _phase_inputs(source, clients, w0, rng, rho)
    if config.S is not None:
        check_batch_size(src, clients, config.S, "Phase2Config.S")
    return _federated(src, clients, w0, r, rng, phase="phase2", rounds=config.rounds, local_steps=config.K,
                      eta_inner=config.eta_meta_inner, alpha_server=config.alpha_server, batch=config.S,
                      episodic=True, cfg=config, direction=config.direction, cluster=cluster,
                      round_offset=round_offset, B_cfg=config.B, B_start=B_start, progress=progress,
                      step_cols=dict(eta_local=np.nan, eta_meta_inner=config.eta_meta_inner),
                      keep_trajectory=keep_trajectory, on_rows=on_rows)
