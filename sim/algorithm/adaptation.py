"""Algorithm 1's new clients (:mod:`sim.algorithm`): the adaptation batches, the preconditioners of eq 88 (the
optimiser buffers, the scale-relative RMSprop diagonal, the shares of coordinates at its clips, one preconditioned
step) and Pipelines 1 and 2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.algorithm.configs import (
    _PRECONDITIONERS,
    CLIPPED_PRECONDITIONERS,
    AdaptConfig,
    Pipeline2Config,
    _cfg_dict,
    _int,
)
from sim.algorithm.evaluation import (
    _check_point,
    _check_rng,
    _directions,
    _evaluate,
    _like,
    _losses,
    _row_norms,
)
from sim.algorithm.records import (
    _NAN_COLS,
    AdaptResult,
    RowSink,
    _add_counts,
    _record_metrics,
    _Recorder,
    _zero_counts,
)
from sim.direction import STATUSES
from sim.preference import uniformity_and_adjustment
from sim.source import array_namespace, as_source, check_batch_size, check_clients, check_psi_star, device


def draw_batches(source, clients, K: int, S: int, rng: np.random.Generator) -> np.ndarray:
    """Fresh batches for ``K`` adaptation steps: ``(n_clients, K, S)`` sample indices (``S`` distinct per batch)."""
    src = as_source(source)
    clients = check_clients(src, clients)
    K = _int(K, "K", "draw_batches", 0)
    S = _int(S, "S", "draw_batches", 1)
    check_batch_size(src, clients, S, "S")
    rng = _check_rng(rng)
    out = np.empty((clients.size, K, S), dtype=np.int64)
    for c, i in enumerate(clients):
        for k in range(K):
            out[c, k] = src.episode(rng, int(i), S)
    return out


def _adapt_records(rec, phase, k, clients, psi, psi_star, beta, dr, counts, n_desc, cluster, *, d_norm=None,
                   extra=None, **cols):
    """One row per new client at adaptation step ``k``; ``cols`` override the NaN defaults of :data:`_NAN_COLS`
    (every caller names ``local_steps``: 1 on a step's row, 0 on a last row); ``d_norm``: ``‖d_i‖`` of the step's
    directions ``dr`` (host)."""
    n = clients.size
    base = dict(_NAN_COLS)
    base.update(cols)
    rec.add(extra, phase=phase, round=k, t=k, cluster=cluster, client=clients, psi=psi, psi_star=psi_star,
            gap=psi - psi_star, beta=beta,
            gain=np.full(n, np.nan) if dr is None else dr.gain,
            lp_mode=np.full(n, "none") if dr is None else dr.mode,
            lp_status=np.full(n, "none") if dr is None else dr.status,
            lp_from_step=np.full(n, dr is not None),
            d_norm=np.full(n, np.nan) if dr is None else d_norm,
            n_lp_steps=sum(counts[s] for s in STATUSES), **{f"n_{s}": counts[s] for s in STATUSES},
            n_descent_steps=n_desc, **base)


@dataclass
class PreconditionerState:
    """Optimiser buffers of a Pipeline-1 run: ``m1`` (AdamW first moment / SGD momentum), ``v`` (second moment);
    arrays of the parameters' namespace."""

    m1: Any
    v: Any

    @classmethod
    def zeros(cls, shape) -> PreconditionerState:
        """Zero float64 numpy buffers of ``shape``."""
        return cls(np.zeros(shape), np.zeros(shape))

    @classmethod
    def zeros_like(cls, W) -> PreconditionerState:
        """Zero buffers of the shape, namespace, dtype and device of the parameters ``W``."""
        xp = array_namespace(W)
        return cls(*(xp.zeros(tuple(W.shape), dtype=W.dtype, device=device(W)) for _ in range(2)))


def rmsprop_diagonal(v, p_minus: float, p_plus: float, eps: float = 1e-8):
    r"""Diagonal of the RMSprop preconditioner from the second moments ``v`` (n, n_w), per row, relative to the
    row's own scale (the rule of ``rmsprop_lagged`` and ``rmsprop_current``):

    .. math::

        r_j = \sqrt{v_j},\qquad s = \frac{1}{n_w}\sum_j r_j,\qquad
        P_{jj} = \operatorname{clip}\Big(\frac{1}{r_j/s + \varepsilon},\ p_-,\ p_+\Big)
              = \operatorname{clip}\Big(\frac{s}{r_j + \varepsilon s},\ p_-,\ p_+\Big).

    ``P`` depends on ``v`` only through the ratios ``r_j/s``, so it is unchanged when ``v`` is multiplied by a
    constant ``c² > 0`` (directions ``× c``), e.g. by the bias correction ``v̂ = v/(1 − β₂^k)``. Zero
    coordinates: ``v_j = 0`` in a row with ``s > 0`` gives ``1/ε``, clipped to ``p_+`` (the limit ``r_j → 0``); a
    row with ``v = 0`` (``s = 0``) gets ``clip(1, p_-, p_+)`` on every coordinate (no information: the ``P_0`` of
    the lagged rule). Every entry lies in ``[p_-, p_+]``. Arrays of any array API namespace; returns one of
    ``v``'s shape and namespace."""
    xp = array_namespace(v)
    r = xp.sqrt(v)
    s = xp.mean(r, axis=1, keepdims=True)
    pos = s > 0.0
    one = xp.ones_like(s)
    u = r / xp.where(pos, s, one)  # r_j / s in [0, n_w]: finite, no division by zero
    p = xp.where(pos, 1.0 / (u + float(eps)), xp.ones_like(u))
    return xp.clip(p, float(p_minus), float(p_plus))


def clip_shares(pdiag, p_minus: float, p_plus: float):
    """Per row of the diagonal ``pdiag`` (n, n_w): the shares of coordinates at the lower and at the upper clip,
    ``(mean_j [P_jj == p_-], mean_j [P_jj == p_+])``, each (n,) in ``[0, 1]`` in ``pdiag``'s namespace (with
    ``p_- = p_+`` every coordinate counts at both). Exact comparisons: a clipped entry *is* the bound."""
    xp = array_namespace(pdiag)
    lo = xp.mean(xp.astype(pdiag == float(p_minus), pdiag.dtype), axis=1)
    hi = xp.mean(xp.astype(pdiag == float(p_plus), pdiag.dtype), axis=1)
    return lo, hi


def preconditioned_step(W, g, k: int, state: PreconditionerState, *, preconditioner: str, alpha: float,
                        P=None, p_minus: float = 0.5, p_plus: float = 2.0, beta1: float = 0.9,
                        beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                        momentum: float = 0.0):
    """One adaptation step ``w_{k+1} = w_k − α P_k d̃_k`` (eq 88) for rows ``W`` (n, n_w) with directions ``g``.

    ``W``, ``g`` and the ``state`` buffers are arrays of one array API namespace (numpy, torch, …); ``k`` is the
    step index (0-based); ``state`` holds the optimiser buffers and is updated in place. Rules:

    * ``identity``: ``P_k = I``; ``fixed``: the SPD matrix ``P`` (host, ``(n_w, n_w)``);
    * ``rmsprop_lagged``: ``P_k = diag(clip(1/(r_j/s + eps), p_-, p_+))`` with ``r_j = √v_{k-1,j}`` and the row's
      scale ``s = mean_j r_j`` (:func:`rmsprop_diagonal`; ``v_k = β₂v_{k-1} + (1-β₂)d̃_k²``), ``P_0 = clip(1)``:
      built from ``v_{k-1}`` only, hence 𝓕_k-measurable (H.41(a)), every entry in ``[p_-, p_+]`` (H.41(b));
      ``v`` is updated with ``d̃_k`` after the step is formed. Scale-invariant: directions ``× c`` give the same
      ``P_k`` (``eps`` is relative to ``s``; the bias correction of ``v`` cancels). A coordinate with
      ``v_{k-1,j} = 0`` gets ``p_+``; a row with ``v_{k-1} = 0`` gets ``clip(1)`` (as ``P_0``);
    * ``rmsprop_current``: the same rule built from ``v_k``, which includes the current ``d̃_k``: not
      𝓕_k-measurable (breaks H.41(a); a negative control);
    * ``adamw``: torch.optim.AdamW: bias-corrected moments, ``v_k`` includes the current ``d̃_k`` (not
      measurable), ``P = 1/(√v̂_k + eps)`` with an absolute ``eps``, decoupled weight decay
      ``w ← w(1 − α·weight_decay)`` (Remark H.42);
    * ``sgd``: torch.optim.SGD (L2 weight decay added to the direction, momentum with dampening 0).

    Returns the new rows and the diagonal of ``P_k`` per row (for ``fixed``, its extreme eigenvalues), in the
    namespace of ``W`` (for the clipped rules, :func:`clip_shares` of it gives the records' ``p_at_lower``,
    ``p_at_upper``).
    """
    xp = array_namespace(W, g)
    n, n_w = W.shape
    alpha, beta1, beta2, eps = float(alpha), float(beta1), float(beta2), float(eps)
    if preconditioner == "identity":
        return W - alpha * g, xp.ones((n, n_w), dtype=W.dtype, device=device(W))
    if preconditioner == "fixed":
        Ph = np.asarray(P, dtype=np.float64)
        ev = np.linalg.eigvalsh(Ph)
        return W - alpha * (g @ _like(g, Ph)), xp.broadcast_to(_like(W, np.array([ev[0], ev[-1]])), (n, 2))
    if preconditioner == "rmsprop_lagged":
        if k == 0:
            pdiag = xp.full((n, n_w), float(np.clip(1.0, p_minus, p_plus)), dtype=W.dtype, device=device(W))
        else:
            pdiag = rmsprop_diagonal(state.v, p_minus, p_plus, eps)  # v_{k-1}: before this step's direction
        state.v = beta2 * state.v + (1.0 - beta2) * g**2
        return W - alpha * (pdiag * g), pdiag
    if preconditioner == "rmsprop_current":
        state.v = beta2 * state.v + (1.0 - beta2) * g**2  # includes the current sample
        pdiag = rmsprop_diagonal(state.v, p_minus, p_plus, eps)
        return W - alpha * (pdiag * g), pdiag
    if preconditioner == "adamw":
        state.m1 = beta1 * state.m1 + (1.0 - beta1) * g
        state.v = beta2 * state.v + (1.0 - beta2) * g**2  # includes the current sample
        mhat = state.m1 / (1.0 - beta1 ** (k + 1))
        vhat = state.v / (1.0 - beta2 ** (k + 1))
        pdiag = 1.0 / (xp.sqrt(vhat) + eps)
        W = W * (1.0 - alpha * float(weight_decay))  # decoupled weight decay
        return W - alpha * (mhat * pdiag), pdiag
    if preconditioner == "sgd":  # torch.optim.SGD, dampening 0, no Nesterov
        gg = g + float(weight_decay) * W
        if momentum > 0:
            state.m1 = gg if k == 0 else float(momentum) * state.m1 + gg
            gg = state.m1
        return W - alpha * gg, xp.ones((n, n_w), dtype=W.dtype, device=device(W))
    raise ValueError(f"preconditioner must be one of {_PRECONDITIONERS}; got {preconditioner!r}")


def pipeline1(source, clients, w0, config: AdaptConfig, rng: np.random.Generator | None = None, *,
              batches=None, phase: str = "pipeline1", cluster=-1, keep_trajectory: bool = True,
              on_rows: RowSink | None = None) -> AdaptResult:
    """Pipeline 1 for the new clients ``clients`` (batched; one LP call per step for all of them) from ``w0``
    (``(n_w,)`` or one start per client ``(n, n_w)``): ``K`` steps of eq 88 with the configured preconditioner.

    ``batches``: ``(n, K, S)`` sample indices (e.g. from :func:`draw_batches`, to reuse the same samples across
    pipelines); otherwise fresh batches are drawn from ``rng``. ``cluster``: the new clients' clusters (records)."""
    if not isinstance(config, AdaptConfig):
        raise ValueError(f"config must be an AdaptConfig; got {type(config).__name__}")
    src = as_source(source)
    clients = check_clients(src, clients)
    n, n_w, K, S = clients.size, src.n_params, config.K, config.S
    W = _check_point(src, w0, "w0", rows=n)
    xp = array_namespace(W)
    idx = np.asarray(draw_batches(src, clients, K, S, _check_rng(rng)) if batches is None else batches)
    if idx.shape != (n, K, S):
        raise ValueError(f"batches must have shape (n={n}, K={K}, S={S}); got {idx.shape}")
    check_batch_size(src, clients, S, "AdaptConfig.S")
    if config.preconditioner == "fixed" and config.P is not None and config.P.shape != (n_w, n_w):
        raise ValueError(f"AdaptConfig.P must have shape ({n_w}, {n_w}); got {config.P.shape}")
    lam = src.prefs[clients]
    psi_star = check_psi_star(src, clients)
    pre = config.preconditioner
    state = PreconditionerState.zeros_like(W)
    rec = _Recorder(on_rows)
    traj = [W] if keep_trajectory else None
    total = _zero_counts()
    a = config.alpha_adapt
    for k in range(K + 1):
        lp_ = _losses(src, W, clients, where=f"{phase} step {k}", step_size=a)
        psi = (lam * lp_).max(axis=-1)
        beta = uniformity_and_adjustment(lp_, lam)[0]
        extra = _record_metrics(src, W, clients, lp_)
        counts = {s: np.zeros(n, dtype=np.int64) for s in STATUSES}
        n_desc = np.zeros(n, dtype=np.int64)
        if k == K:
            _adapt_records(rec, phase, k, clients, psi, psi_star, beta, None, counts, n_desc, cluster,
                           alpha_adapt=a, preconditioner=pre, batch_size=float(S), local_steps=0, extra=extra)
            break
        ev = _evaluate(src, W, clients, idx[:, k, :], where=f"{phase} step {k}", step_size=a)
        dr = _directions(ev, lam, config.direction, config, where=f"{phase} step {k}", clients=clients)
        del ev
        if config.direction == "lp":
            for s in STATUSES:
                counts[s] += dr.status == s
            _add_counts(total, dr.status)
            n_desc += dr.mode == "descent"
        W, pdiag = preconditioned_step(
            W, dr.d, k, state, preconditioner=pre, alpha=a, P=config.P, p_minus=config.p_minus,
            p_plus=config.p_plus, beta1=config.beta1, beta2=config.beta2, eps=config.eps,
            weight_decay=config.weight_decay, momentum=config.momentum,
        )
        if pre in CLIPPED_PRECONDITIONERS:
            at_lo, at_hi = (src.to_host(x) for x in clip_shares(pdiag, config.p_minus, config.p_plus))
        else:
            at_lo = at_hi = np.full(n, np.nan)
        _adapt_records(rec, phase, k, clients, psi, psi_star, beta, dr, counts, n_desc, cluster,
                       d_norm=_row_norms(src, dr.d), alpha_adapt=a, preconditioner=pre,
                       p_min=src.to_host(xp.min(pdiag, axis=1)), p_max=src.to_host(xp.max(pdiag, axis=1)),
                       p_at_lower=at_lo, p_at_upper=at_hi, batch_size=float(S), local_steps=1, extra=extra)
        if traj is not None:
            traj.append(W)
    params = dict(phase=phase, clients=clients.tolist(), **_cfg_dict(config))
    return AdaptResult(w=W, trajectory=None if traj is None else xp.stack(traj), gap=psi - psi_star, beta=beta,
                       records=rec.frame(params), step_status_counts=total, steps=K)


def pipeline2(source, clients, w0, config: Pipeline2Config | None = None, *, cluster=-1,
              keep_trajectory: bool = True, phase: str = "pipeline2", on_rows: RowSink | None = None) -> AdaptResult:
    """Pipeline 2: data-rich local training of each new client (population gradients, LP direction, batched over
    clients) from ``w0``; the gap is measured against the planted ``ψ*_new``. ``phase`` names the records' phase
    (e.g. an estimate of ``ψ_i*`` where none is planted).

    Runs ``max_steps`` steps (or stops when every step is below ``tol``) and returns, per client, the iterate with
    the smallest ``ψ_new`` (``select="best"``: model selection on abundant data) or the last one. Records: one
    row every ``record_every`` steps (its ``n_*`` columns count the LP statuses of all steps up to the next row) and
    a last row (``lp_mode = "none"``) holding the returned models."""
    cfg = Pipeline2Config() if config is None else config
    if not isinstance(cfg, Pipeline2Config):
        raise ValueError(f"config must be a Pipeline2Config; got {type(cfg).__name__}")
    src = as_source(source)
    clients = check_clients(src, clients)
    n = clients.size
    W = _check_point(src, w0, "w0", rows=n)
    xp = array_namespace(W)
    lam = src.prefs[clients]
    psi_star = check_psi_star(src, clients)
    rec = _Recorder(on_rows)
    total = _zero_counts()
    traj = [W] if keep_trajectory else None
    best_W, best_psi = W, np.full(n, np.inf)
    pending: tuple[dict[str, Any], dict[str, np.ndarray], np.ndarray] | None = None  # the open record row:
    # (row kwargs, counts, n_desc)

    def flush():
        if pending is not None:
            kw, cnt, nd = pending
            _adapt_records(rec, phase, kw.pop("k"), clients, counts=cnt, n_desc=nd, cluster=cluster, **kw)

    def keep_best(W, psi):
        nonlocal best_W, best_psi
        better = psi < best_psi
        best_psi = np.where(better, psi, best_psi)
        best_W = xp.where(_like(W, better[:, None], dtype=xp.bool), W, best_W)

    k = 0
    while True:
        eta = cfg.eta if cfg.decay_steps is None else cfg.eta / (1.0 + k / cfg.decay_steps)
        where = f"{phase} step {k}"
        if k == cfg.max_steps:
            keep_best(W, (lam * _losses(src, W, clients, where=where, step_size=eta)).max(axis=-1))
            break
        ev = _evaluate(src, W, clients, None, where=where, step_size=eta)
        losses = ev.losses
        psi = (lam * losses).max(axis=-1)
        keep_best(W, psi)
        dr = _directions(ev, lam, "lp", cfg, where=where, clients=clients)
        del ev
        _add_counts(total, dr.status)
        if k % cfg.record_every == 0:
            flush()
            pending = (dict(k=k, psi=psi, psi_star=psi_star, beta=dr.beta, dr=dr, d_norm=_row_norms(src, dr.d),
                            eta_eff=eta, local_steps=1, extra=_record_metrics(src, W, clients, losses)),
                       {s: np.zeros(n, dtype=np.int64) for s in STATUSES}, np.zeros(n, dtype=np.int64))
        assert pending is not None  # a row is opened at k = 0
        for s in STATUSES:
            pending[1][s] += dr.status == s
        pending[2][...] += dr.mode == "descent"
        step = float(eta) * dr.d
        W = W - step
        k += 1
        if traj is not None:
            traj.append(W)
        if _row_norms(src, step).max() <= cfg.tol:
            keep_best(W, (lam * _losses(src, W, clients, where=f"{phase} step {k}", step_size=eta)).max(axis=-1))
            break
    flush()
    W_out = best_W if cfg.select == "best" else W
    l = _losses(src, W_out, clients, where=f"{phase} output")
    psi = (lam * l).max(axis=-1)
    beta = uniformity_and_adjustment(l, lam)[0]
    _adapt_records(rec, phase, k, clients, psi, psi_star, beta, None,
                   {s: np.zeros(n, dtype=np.int64) for s in STATUSES}, np.zeros(n, dtype=np.int64), cluster,
                   local_steps=0, extra=_record_metrics(src, W_out, clients, l))
    params = dict(phase=phase, clients=clients.tolist(), **_cfg_dict(cfg))
    return AdaptResult(w=W_out, trajectory=None if traj is None else xp.stack(traj), gap=psi - psi_star, beta=beta,
                       records=rec.frame(params), step_status_counts=total, steps=k)
