"""Algorithm 1 at the kernel boundary (:mod:`sim.algorithm`, :mod:`sim.source`): the checked inputs (parameter
points, the generator, the aggregation weights), the source's losses and Gram matrices checked for shape, dtype and
finiteness (:class:`DivergenceError`), and one batched direction from ``(l, C)``: the EPO LP
(:class:`LPFailureError` when it has no solution), the linear scalarisation or the Chebyshev gradient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.algorithm.configs import _ADAPT_DIRECTIONS
from sim.cluster import aggregation_weights, check_aggregation_weights
from sim.direction import lp_direction
from sim.preference import bottleneck_set, uniformity_and_adjustment
from sim.source import Evaluation, Source, array_namespace, device, sample_counts

_FAILED = ("infeasible", "iteration_limit", "solver_error")


class LPFailureError(RuntimeError):
    """An LP of a training or adaptation step returned no weights (infeasible / iteration limit / solver error)."""


def _all_finite(a) -> bool:
    xp = array_namespace(a)
    return bool(xp.all(xp.isfinite(a)))


def _check_point(src: Source, w, name: str, rows: int | None = None):
    """``w`` as finite parameters of the source's array type (a new array): one vector ``(n_w,)``, or with
    ``rows=n`` start rows ``(n, n_w)`` from one point ``(n_w,)`` or one point per client."""
    n_w = src.n_params
    shapes = f"({n_w},)" + ("" if rows is None else f" or ({rows}, {n_w})")
    try:
        a = src.asarray(w)
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: a tensor needing grad
        raise ValueError(f"{name} must be a numeric array of shape {shapes}; got {w!r}") from exc
    if rows is not None and tuple(a.shape) == (n_w,):
        a = _rows(a, rows)
    if tuple(a.shape) != ((n_w,) if rows is None else (rows, n_w)) or not _all_finite(a):
        raise ValueError(f"{name} must be a finite array of shape {shapes}; got shape {tuple(a.shape)}")
    return a


def _rows(w, n: int):
    """``n`` copies of the parameter vector ``w`` as an ``(n, n_w)`` array of its namespace."""
    xp = array_namespace(w)
    return xp.asarray(xp.broadcast_to(w, (n,) + tuple(w.shape)), copy=True)


def _like(a, host, dtype=None):
    """The host array ``host`` in the namespace and on the device of ``a`` (dtype of ``a`` unless given)."""
    xp = array_namespace(a)
    return xp.asarray(host, dtype=a.dtype if dtype is None else dtype, device=device(a))


def _take(a, idx: np.ndarray):
    """Rows ``idx`` (host integers) of ``a``."""
    xp = array_namespace(a)
    return xp.take(a, xp.asarray(idx, device=device(a)), axis=0)


def _row_norms(src: Source, X) -> np.ndarray:
    """``‖X[c]‖`` per row, measured in the source's namespace; float64 host ``(n,)``."""
    xp = array_namespace(X)
    return src.to_host(xp.linalg.vector_norm(X, axis=1))


def _direction_spread(src: Source, D, rho: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """``‖d_i‖``, ``Δ_i = ‖d_i - d̄‖`` and ``H_{C_n} = Σ_i ρ_i Δ_i²`` (d̄ = Σ_i ρ_i d_i) of the directions ``D``
    ``(N, n_w)``: the centred directions are formed in the source's namespace and only their norms (the diagonal of
    their N×N Gram matrix) reach the host, exact where the directions agree (:func:`sim.cluster.deviations`,
    :func:`sim.cluster.dispersion` on numpy arrays)."""
    dev = _row_norms(src, D - _like(D, rho) @ D)
    return _row_norms(src, D), dev, float(rho @ dev**2)


def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    return rng


def _rho_for(src: Source, clients: np.ndarray, rho) -> np.ndarray:
    if rho is None:
        return aggregation_weights(N=clients.size)
    if isinstance(rho, str):
        if rho == "uniform":
            return aggregation_weights(N=clients.size)
        if rho == "samples":
            return aggregation_weights(n_samples=sample_counts(src, "rho='samples'")[clients])
        raise ValueError(f"rho must be an array, 'uniform' or 'samples'; got {rho!r}")
    r = check_aggregation_weights(rho)
    if r.shape != (clients.size,):
        raise ValueError(f"rho must have shape ({clients.size},) (one weight per client); got {r.shape}")
    return r


@dataclass(frozen=True, eq=False)
class _Dir:
    """Directions of one batched step: ``d`` (N, n_w) in the source's array type; ``weights`` μ (N, m),
    mode/status (N,), gain, beta on the host."""

    d: Any
    weights: np.ndarray
    mode: np.ndarray
    status: np.ndarray
    gain: np.ndarray
    beta: np.ndarray


class DivergenceError(ValueError):
    """A training or adaptation step produced non-finite losses or gradients (the iteration diverged), or the source
    refused a loss (raised ``FloatingPointError``, e.g. a loss at its floor); the message names the phase, round,
    step, client and objective."""


def _require_finite(l, C=None, *, where: str, clients, step_size=None) -> None:
    """Raise :class:`DivergenceError` naming the phase/round/step (``where``), the client, the objective and the step
    size when a loss or a Gram entry (non-finite gradients, or gradients whose inner products overflow) is not
    finite."""
    step = f" with step size {step_size!r}" if step_size is not None else ""
    bad = ~np.isfinite(l)
    if bad.any():
        row, j = (int(v) for v in np.argwhere(bad)[0])
        raise DivergenceError(
            f"{where}: client {int(clients[row])} has a non-finite loss ({float(l[row, j])!r}, objective {j}){step}: "
            f"the iteration diverged; reduce the step size"
        )
    if C is not None:
        bad = ~np.isfinite(C)
        if bad.any():
            row, j, k = (int(v) for v in np.argwhere(bad)[0])
            raise DivergenceError(
                f"{where}: client {int(clients[row])} has a non-finite gradient Gram entry C[{j}, {k}] = "
                f"{float(C[row, j, k])!r} (objectives {j}, {k}: its gradients are not finite or their inner products "
                f"overflow){step}: the iteration diverged; reduce the step size"
            )


def _host_shape(src: Source, what: str, arr, shape: tuple) -> None:
    if not (isinstance(arr, np.ndarray) and arr.dtype == np.float64 and arr.shape == shape):
        got = f"{type(arr).__name__} {getattr(arr, 'dtype', '')} {tuple(getattr(arr, 'shape', ()))}"
        raise ValueError(f"{type(src).__name__}.{what} must be a float64 numpy array of shape {shape}; got {got}")


def _source_loss_error(exc: FloatingPointError, where: str, step_size) -> DivergenceError:
    """A loss the source refused (``FloatingPointError``, e.g. one at its floor; its message names the client and
    the objective) as a :class:`DivergenceError` that adds the phase, round and step."""
    step = f" with step size {step_size!r}" if step_size is not None else ""
    return DivergenceError(f"{where}: {exc}{step}")


def _losses(src: Source, W, clients: np.ndarray, *, where: str, step_size=None) -> np.ndarray:
    """Population losses ``(n, m)`` of ``clients`` at the rows ``W``, checked (shape, dtype, finite)."""
    try:
        l = src.losses(W, clients)
    except FloatingPointError as exc:
        raise _source_loss_error(exc, where, step_size) from exc
    _host_shape(src, "losses", l, (clients.size, src.n_objectives))
    _require_finite(l, where=where, clients=clients, step_size=step_size)
    return l


def _evaluate(src: Source, W, clients: np.ndarray, batches, *, where: str, step_size=None) -> Evaluation:
    """``src.evaluate`` with its host arrays checked (shape, dtype, finite)."""
    try:
        ev = src.evaluate(W, clients, batches)
    except FloatingPointError as exc:
        raise _source_loss_error(exc, where, step_size) from exc
    n, m = clients.size, src.n_objectives
    _host_shape(src, "evaluate(...).losses", ev.losses, (n, m))
    _host_shape(src, "evaluate(...).gram", ev.gram, (n, m, m))
    _require_finite(ev.losses, ev.gram, where=where, clients=clients, step_size=step_size)
    return ev


def _directions(ev: Evaluation, lam, direction: str, cfg, *, where: str, clients) -> _Dir:
    """One batched direction from ``(l, C)``: the EPO LP (one :func:`lp_direction` call for all rows), the linear
    scalarisation ``μ = λ`` or the Chebyshev gradient ``μ = λ_{j*} e_{j*}`` (``j*`` = first maximiser of
    ``λ ⊙ l``); ``d = G μ`` is the source's combine."""
    l, C = ev.losses, ev.gram
    if direction == "lp":
        res = lp_direction(l, lam, C, eps_mode=cfg.eps_mode, descent=cfg.descent, on_infeasible=cfg.on_infeasible)
        failed = np.logical_or.reduce([res.status == s for s in _FAILED])  # (np.isin sorts the strings)
        if failed.any():
            r = int(np.argmax(failed))
            raise LPFailureError(
                f"{where}: the EPO LP returned no solution for client {int(clients[r])} (status {res.status[r]!r}, "
                f"mode {res.mode[r]!r}); status counts of this call: {res.status_counts()}"
            )
        return _Dir(ev.combine(res.weights), res.weights, res.mode, res.status, res.gain, res.beta)
    beta, A = uniformity_and_adjustment(l, lam)
    if direction == "linear":
        mu = np.array(lam, dtype=np.float64)
        mode = np.full(l.shape[0], "linear")
    elif direction == "chebyshev":
        j = np.argmax(bottleneck_set(l, lam), axis=-1)  # first maximiser, ties within the resolution
        mu = np.zeros_like(lam)
        mu[np.arange(l.shape[0]), j] = lam[np.arange(l.shape[0]), j]
        mode = np.full(l.shape[0], "chebyshev")
    else:  # pragma: no cover - configs validate
        raise ValueError(f"direction must be one of {_ADAPT_DIRECTIONS}; got {direction!r}")
    gain = np.einsum("nm,nmk,nk->n", mu, C, A)
    return _Dir(ev.combine(mu), mu, mode, np.full(l.shape[0], "none"), gain, beta)
