r"""Algorithm 1: clustering, Phase 1, Phase 2, new-client Pipelines 1 and 2, baselines (THEOREMS.md §1.10).

Algorithm 1 runs at the kernel boundary (:mod:`sim.source`): a *source* supplies, for a set of clients at their
parameter rows (and sample batches), the losses ``l_i`` and Gram matrices ``C_i = G_iᵀG_i`` as float64 on the
host and applies ``d_i = G_i μ_i`` in its own array type. Everything here — the LP, β, A, ψ, the diagnostics — is
computed from ``l``, ``λ`` and ``C``; the parameter arithmetic (local steps, the ρ-weighted server update,
pseudo-gradients, the preconditioners) is written once against the array API namespace of the parameters
(:func:`sim.source.array_namespace`). So the same code drives the numpy problem families
(:class:`~sim.source.ClientSource`; a :class:`~sim.source.ClientProblem` or :class:`~sim.source.SampleData` is
wrapped automatically) and a torch LLM source on the device; returned models and trajectories are arrays of the
source's type. Records and LP decisions are float64 numpy; all randomness comes from a
``numpy.random.Generator`` passed in, so a run is deterministic given its seed. Nothing here prints: long runs
report through an optional ``progress`` callback.

**Clustering** (§1.10, O-17) at a reference model ``w_ref``: :func:`clustering_step` evaluates the population
losses ``l_i(w_ref)`` and calls :func:`sim.cluster.cluster_clients` (Stage 1: ordering of ``λ_i ⊙ l_i(w_ref)``;
Stage 2: complete linkage on ``A_i^ref`` with a diameter threshold, or k-means). New clients are placed by
:func:`assign_to_cluster`.

**Phase 1** (per cluster, from ``w_0``; :func:`phase1`)::

    for r in 0..R-1:
        w_{i,0} = w_r  for every client i of the cluster
        for k in 0..τ-1:   (l_i, C_i) at w_{i,k} (population, or a fresh minibatch of ``batch_size``)
                           μ_i = EPO LP(l_i, λ_i, C_i)     -- one batched lp_direction call for all clients
                           w_{i,k+1} = w_{i,k} - eta_local · G_i μ_i     -- G_i μ_i: the source's combine
        g_i = w_{i,τ} - w_r                                 (pseudo-gradient)
        w_{r+1} = w_r + alpha_server · Σ_i ρ_i g_i

With ``τ = 1`` and population gradients this is the shared iteration eq 55,
``w_{r+1} = w_r - eta_eff · Σ_i ρ_i d_i(w_r)`` with ``eta_eff = alpha_server·eta_local`` (:func:`shared_iteration`).

**Phase 2** (:func:`phase2`, Reptile-style; from ``w_I``): per round each client draws an S-shot episode
(``S`` distinct samples of its local data), takes ``K`` steps of the LP direction on that episode (balancing
mode; descent mode when ``β ≤ eps_mode``, which is the LP's own mode rule) with ``eta_meta_inner``, and the
server applies the same update. With ``K = 1`` and population gradients (``S=None``) the round map is eq 55
with ``eta_II = alpha_server·eta_meta_inner`` (O-16, O-27).

**New client** (:func:`pipeline1`, :func:`pipeline2`): Pipeline 1 takes ``K`` steps
``w_{k+1} = w_k - alpha_adapt·P_k d̃(w_k)`` (eq 88) with a fresh batch of ``S`` samples per step. The direction
``d̃`` is the LP direction on the batch (``direction="lp"``, the experiments' pipeline), the stochastic
Chebyshev gradient ``λ_{j*} g̃_{j*}`` on the batch bottleneck ``j*`` (``"chebyshev"``, the H.43/H.44
idealisation, O-25) or the linear scalarisation ``G̃ λ`` (``"linear"``, the FedAvg baseline). Preconditioners:
``identity`` (``P_k = I``), ``fixed`` (a given SPD ``P``), ``rmsprop_lagged`` (``P_k`` from ``v_{k-1}``, hence
``𝓕_k``-measurable, clipped to ``[p_-, p_+]``: H.41), ``adamw`` (as in the experiments: momentum, ``v_k`` with
the current sample, decoupled weight decay; Remark H.42) and ``sgd`` (torch SGD: coupled L2 weight decay,
optional heavy-ball momentum; with both 0 it is exactly ``identity``). Pipeline 2 is data-rich local training
(population gradients, LP direction with ``eps_mode = 0``, decaying step; the iterate of smallest ``ψ_new`` is
returned). Baselines: local-only training from
``w_ref`` on the same ``S·K`` samples, and FedAvg with linear scalarisation (weights ``λ_i``) instead of the LP.

**Lagged RMSprop, relative to the gradient's own scale.** With ``v_k = β₂v_{k-1} + (1-β₂)d̃_k²`` (per coordinate,
``v_{-1} = 0``), ``r_{k-1,j} = √v_{k-1,j}`` and the row's scale ``s_{k-1} = (1/n_w) Σ_j r_{k-1,j}`` (the mean
per-coordinate RMS of the directions so far), the preconditioner of step ``k ≥ 1`` is

    P_k = diag( clip( 1 / (r_{k-1,j}/s_{k-1} + eps), p_-, p_+ ) )   =  diag( clip( s/(r_j + eps·s), p_-, p_+ ) ),

``P_0 = clip(1, p_-, p_+)·I``. It is RMSprop's ``1/(√v̂ + eps)`` applied to the directions rescaled to unit mean
RMS: multiplying every direction by ``c ≠ 0`` leaves ``P_k`` unchanged (``v → c²v``, ``r/s`` invariant; ``eps``
is relative to ``s``), and so does the bias correction ``v̂ = v/(1-β₂^k)``, which cancels in ``r/s``. So ``P_k``
spreads its coordinates around the row's typical scale (a coordinate at the mean RMS gets ``1``, one at twice
it ``½``) instead of sitting at a clip whenever the directions are small or large in absolute terms (LoRA
gradients of size ``1e-3`` would give ``1/√v̂ ≈ 1e3``, i.e. ``P = p_+`` everywhere). A coordinate whose
``v_{k-1,j} = 0`` (no nonzero direction yet) gets ``1/eps``, clipped: ``p_+``; a row whose ``v_{k-1} = 0``
(every direction so far zero, so ``s = 0``) gets ``clip(1)·I``, as at ``k = 0``. ``rmsprop_current`` (the
negative control of H.41(a)) is the same rule built from ``v_k``, which includes the current ``d̃_k``. The
records carry ``p_min``, ``p_max`` (extreme diagonal entries; for ``fixed``, eigenvalues) and ``p_at_lower``,
``p_at_upper``: the share of coordinates with ``P_k,jj == p_-`` and ``== p_+`` (NaN for a row without a step and
for the preconditioners without clips).

**Records.** Every phase returns a tidy :class:`pandas.DataFrame` with one row per (phase, round, client); see
:data:`RECORD_COLUMNS`. Training rows hold *population* diagnostics at the round's start ``w_r`` (the final row
``round = R`` holds the phase output, and no step): ``ψ_i``, ``r_i = ψ_i - ψ_i*`` (``gap``), ``β_i``, the LP
gain ``γ_i*``, mode and status of the population LP at ``w_r``, ``‖d_i‖``, ``Δ_i``, ``H_{C_n}``, the H.19 margin
``min_{j∈J} λ_j d_iᵀg_j = min_{j∈J} λ_j (C_i μ_i)_j`` on ``J = J*`` and on ``J = J*_ε`` with
``ε_act = 2·eta_eff·λ_max·B²`` (:func:`sim.hull.eps_act`; ``B`` — column ``grad_bound`` — is the configured
gradient bound, or else the largest population gradient norm ``‖g_i^{(j)}‖ = √(C_i)_jj`` seen so far in the run,
the current point included), ``‖d_M‖`` (minimum-norm element of ``conv{λ_j g_j : j ∈ J*_ε}``, weights from the
Gram ``ΛCΛ`` by :func:`sim.hull.min_norm_weights_from_gram`, the point combined and measured by the source), and
the step sizes in force. ``Δ_i = ‖d_i - d̄‖`` and ``H_{C_n} = Σ_i ρ_i Δ_i²`` are measured on the centred directions
formed by the source's array namespace (exact where the directions agree). ``ε_act``, the ``J*``/``J*_ε`` sets,
the margins and ``d_M``'s weights are computed for the rounds of a phase in one batched call of each kernel when
the source's evaluations are host arrays (:class:`sim.source.GradientEvaluation`) and no ``on_rows`` streams the
rows (else round by round; the numbers are the same bit for bit, each instance computed on its own). The columns ``n_lp_steps``,
``n_optimal``, ``n_relaxed``, ``n_fallback``, ``n_infeasible``, ``n_iteration_limit``, ``n_solver_error`` and
``n_descent_steps`` count the statuses of every LP solved by the client's training steps in that round: no LP
fallback goes uncounted. ``lp_from_step`` says whether the row's ``lp_mode``/``lp_status``/``gain`` are those of
the round's first training step (population gradients) or of a separate diagnostic LP (minibatches, final rows).
Quantities that a phase does not define (``deviation`` for a new client, ``eta_local`` in Phase 2, …) are NaN.
An LP without a solution (status ``infeasible``/``iteration_limit``/``solver_error``: NaN weights) raises
:class:`LPFailureError`; it is never replaced silently. A non-finite loss or Gram entry raises
:class:`DivergenceError` naming the phase, round, step, client and step size.

``keep_trajectory=False`` (every phase and :func:`run_algorithm`) keeps no trajectory (``trajectory`` is None):
for sources with millions of parameters per client. ``on_rows`` (every phase and :func:`run_algorithm`) receives
the record rows of each round as a DataFrame as soon as they are made, so a long run can write its records as it
goes. A source with the optional ``record_metrics`` (:mod:`sim.source`) adds its columns after
:data:`RECORD_COLUMNS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from sim.cluster import (
    Clustering,
    aggregation_weights,
    check_aggregation_weights,
    cluster_clients,
    stage1_keys,
)
from sim.direction import STATUSES, lp_direction
from sim.hull import descent_margin_from_gram, eps_act, min_norm_weights_from_gram, near_active_set
from sim.preference import adjustment, bottleneck_set, uniformity_and_adjustment
from sim.problems import PlantedQuadraticCluster
from sim.problems.quadratic import planted_mixing
from sim.source import (
    ClientProblem,
    ClientSource,
    Evaluation,
    GradientEvaluation,
    SampleData,
    Source,
    array_namespace,
    as_source,
    check_batch_size,
    check_clients,
    check_psi_star,
    device,
    sample_counts,
)

__all__ = [
    "ProblemSpec",
    "build_problem",
    "ClientProblem",
    "SampleData",
    "ClientSource",
    "Source",
    "Evaluation",
    "as_source",
    "LPFailureError",
    "DivergenceError",
    "ClusterConfig",
    "Phase1Config",
    "Phase2Config",
    "AdaptConfig",
    "Pipeline2Config",
    "AlgorithmConfig",
    "PhaseResult",
    "AdaptResult",
    "AlgorithmResult",
    "RECORD_COLUMNS",
    "clustering_step",
    "lp_input_columns",
    "CLUSTERING_NAMES",
    "random_partition",
    "comparison_clusterings",
    "same_partition",
    "phase1_by_clustering",
    "assign_to_cluster",
    "shared_iteration",
    "phase1",
    "phase2",
    "fedavg",
    "pipeline1",
    "pipeline2",
    "local_only",
    "draw_batches",
    "PreconditionerState",
    "CLIPPED_PRECONDITIONERS",
    "rmsprop_diagonal",
    "clip_shares",
    "preconditioned_step",
    "run_algorithm",
]

Progress = Callable[[str, int, int], None]
#: Receives the record rows of each round as they are made (a DataFrame with the records' columns).
RowSink = Callable[[pd.DataFrame], None]

_DESCENT = ("restricted", "relaxed")
_ON_INFEASIBLE = ("relaxed", "fallback_preference", "raise")
_TRAIN_DIRECTIONS = ("lp", "linear")
_ADAPT_DIRECTIONS = ("lp", "chebyshev", "linear")
_PRECONDITIONERS = ("identity", "fixed", "rmsprop_lagged", "rmsprop_current", "adamw", "sgd")
#: The preconditioners whose diagonal is clipped to ``[p_minus, p_plus]`` (records: ``p_at_lower``, ``p_at_upper``).
CLIPPED_PRECONDITIONERS = ("rmsprop_lagged", "rmsprop_current")
_FAILED = ("infeasible", "iteration_limit", "solver_error")

#: Columns of every record DataFrame, in order.
RECORD_COLUMNS = (
    "phase", "round", "t", "cluster", "client", "rho",
    "psi", "psi_star", "gap", "beta", "gain", "lp_mode", "lp_status", "lp_from_step",
    "d_norm", "deviation", "dispersion", "margin_Jstar", "margin_Jeps", "dM_norm", "eps_act", "grad_bound", "n_Jeps",
    "n_lp_steps", "n_optimal", "n_relaxed", "n_fallback", "n_infeasible", "n_iteration_limit",
    "n_solver_error", "n_descent_steps",
    "local_steps", "batch_size", "eta_local", "eta_meta_inner", "alpha_server", "eta_eff", "alpha_adapt",
    "preconditioner", "p_min", "p_max", "p_at_lower", "p_at_upper",
)
_COUNT_COLUMNS = tuple(f"n_{s}" for s in STATUSES)


class LPFailureError(RuntimeError):
    """An LP of a training or adaptation step returned no weights (infeasible / iteration limit / solver error)."""




# ================================================================================================ configs


def _pos(v, name: str, owner: str) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: a tensor needing grad
        raise ValueError(f"{owner}.{name} must be a real number > 0; got {v!r}") from exc
    if not np.isfinite(f) or f <= 0:
        raise ValueError(f"{owner}.{name} must be a finite number > 0; got {v!r}")
    return f


def _nonneg(v, name: str, owner: str) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: a tensor needing grad
        raise ValueError(f"{owner}.{name} must be a real number >= 0; got {v!r}") from exc
    if not np.isfinite(f) or f < 0:
        raise ValueError(f"{owner}.{name} must be a finite number >= 0; got {v!r}")
    return f


def _int(v, name: str, owner: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{owner}.{name} must be an integer >= {lo}; got {v!r}")
    return int(v)


def _choice(v, name: str, owner: str, allowed) -> None:
    if v not in allowed:
        raise ValueError(f"{owner}.{name} must be one of {allowed}; got {v!r}")


def _check_lp(cfg, owner: str) -> None:
    _nonneg(cfg.eps_mode, "eps_mode", owner)
    _choice(cfg.descent, "descent", owner, _DESCENT)
    _choice(cfg.on_infeasible, "on_infeasible", owner, _ON_INFEASIBLE)


def _check_B(B, owner: str) -> None:
    if B is not None:
        _pos(B, "B", owner)


@dataclass(frozen=True)
class ClusterConfig:
    """Clustering (§1.10, O-17). ``key``: ``"ordering"`` (full ordering of ``λ_i ⊙ l_i(w_ref)``) or
    ``"bottleneck"``; ``stage2``: split Stage-1 groups by ``A_i^ref``; ``method``: ``"complete"`` (complete linkage,
    diameter ``threshold`` δ_A, or ``k`` clusters) or ``"kmeans"`` (``k``). Exactly one of ``threshold``/``k`` for
    ``"complete"``; ``k`` for ``"kmeans"``."""

    key: str = "ordering"
    stage2: bool = True
    method: str = "complete"
    threshold: float | None = 0.25
    k: int | None = None

    def __post_init__(self):
        o = "ClusterConfig"
        _choice(self.key, "key", o, ("ordering", "bottleneck"))
        _choice(self.method, "method", o, ("complete", "kmeans"))
        if not isinstance(self.stage2, bool):
            raise ValueError(f"{o}.stage2 must be a bool; got {self.stage2!r}")
        if self.threshold is not None:
            _nonneg(self.threshold, "threshold", o)
        if self.k is not None:
            _int(self.k, "k", o, 1)
        if self.stage2 and self.method == "complete" and (self.threshold is None) == (self.k is None):
            raise ValueError(f"{o}: method='complete' needs exactly one of threshold or k; "
                             f"got threshold={self.threshold!r}, k={self.k!r}")
        if self.stage2 and self.method == "kmeans" and (self.k is None or self.threshold is not None):
            raise ValueError(f"{o}: method='kmeans' needs k and no threshold; got threshold={self.threshold!r}, "
                             f"k={self.k!r}")


@dataclass(frozen=True)
class Phase1Config:
    """Phase 1 (federated shared iteration). ``rounds`` R, ``tau`` τ local steps of size ``eta_local``, server step
    ``alpha_server``; ``batch_size=None``: population gradients, else a fresh minibatch per local step.
    ``direction="linear"`` replaces the LP by the linear scalarisation ``μ_i = λ_i`` (FedAvg baseline). ``B``: the
    gradient bound used for ``ε_act`` (None: the largest gradient norm seen so far)."""

    rounds: int = 100
    tau: int = 1
    eta_local: float = 0.1
    alpha_server: float = 1.0
    eps_mode: float = 1e-4
    descent: str = "restricted"
    on_infeasible: str = "relaxed"
    batch_size: int | None = None
    direction: str = "lp"
    B: float | None = None

    def __post_init__(self):
        o = "Phase1Config"
        _int(self.rounds, "rounds", o, 0)
        _int(self.tau, "tau", o, 1)
        _pos(self.eta_local, "eta_local", o)
        _pos(self.alpha_server, "alpha_server", o)
        _check_lp(self, o)
        if self.batch_size is not None:
            _int(self.batch_size, "batch_size", o, 1)
        _choice(self.direction, "direction", o, _TRAIN_DIRECTIONS)
        _check_B(self.B, o)

    @property
    def eta_eff(self) -> float:
        """``eta_eff = alpha_server·eta_local`` (η_I of eq 55; O-16)."""
        return self.alpha_server * self.eta_local


@dataclass(frozen=True)
class Phase2Config:
    """Phase 2 (Reptile-style meta-learning). ``rounds`` R', ``S``-shot episodes (``S=None``: population
    gradients), ``K`` inner LP steps of size ``eta_meta_inner``, server step ``alpha_server``."""

    rounds: int = 50
    S: int | None = 8
    K: int = 5
    eta_meta_inner: float = 0.05
    alpha_server: float = 1.0
    eps_mode: float = 1e-4
    descent: str = "restricted"
    on_infeasible: str = "relaxed"
    direction: str = "lp"
    B: float | None = None

    def __post_init__(self):
        o = "Phase2Config"
        _int(self.rounds, "rounds", o, 0)
        if self.S is not None:
            _int(self.S, "S", o, 1)
        _int(self.K, "K", o, 1)
        _pos(self.eta_meta_inner, "eta_meta_inner", o)
        _pos(self.alpha_server, "alpha_server", o)
        _check_lp(self, o)
        _choice(self.direction, "direction", o, _TRAIN_DIRECTIONS)
        _check_B(self.B, o)

    @property
    def eta_eff(self) -> float:
        """``eta_II = alpha_server·eta_meta_inner`` (O-16)."""
        return self.alpha_server * self.eta_meta_inner


@dataclass(frozen=True)
class AdaptConfig:
    """New-client Pipeline 1: ``K`` steps with fresh batches of ``S`` samples, step ``alpha_adapt`` (eq 88).

    ``preconditioner``: ``"identity"``, ``"fixed"`` (SPD ``P``), ``"rmsprop_lagged"`` (lagged RMSprop relative to
    the directions' own scale, :func:`rmsprop_diagonal`: ``P_k = diag(clip(1/(r_j/s + eps), p_minus, p_plus))`` with
    ``r_j = √v_{k-1,j}``, ``s = mean_j r_j``, ``v_k = beta2 v_{k-1} + (1-beta2) d̃_k²``; ``P_0 = clip(1)·I``;
    unchanged when every direction is multiplied by a constant; ``p_plus`` on a coordinate with ``v_{k-1,j} = 0``,
    ``clip(1)`` on a row with ``v_{k-1} = 0``; ``eps`` is relative to ``s`` here), ``"rmsprop_current"`` (the same
    rule from ``v_k``, which includes the current direction: not 𝓕_k-measurable, a negative control of H.41(a)),
    ``"adamw"`` (``beta1``, ``beta2``, ``eps``, decoupled ``weight_decay``; bias-corrected, as torch.optim.AdamW)
    or ``"sgd"`` (torch.optim.SGD: coupled ``weight_decay``, heavy-ball ``momentum``). ``p_minus``, ``p_plus``: the
    clip ``[p_-, p_+]`` of the RMSprop rules, hence H.41(b)'s spectrum bounds (the step condition of H.43 reads
    ``alpha_adapt ≤ p_-/(L₀p_+²)``). ``direction``: ``"lp"``, ``"chebyshev"`` or ``"linear"``. ``P`` is excluded
    from equality comparisons."""

    K: int = 20
    S: int = 8
    alpha_adapt: float = 0.1
    preconditioner: str = "identity"
    p_minus: float = 0.5
    p_plus: float = 2.0
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    eps: float = 1e-8
    P: np.ndarray | None = field(default=None, compare=False)
    momentum: float = 0.0
    direction: str = "lp"
    eps_mode: float = 1e-4
    descent: str = "restricted"
    on_infeasible: str = "relaxed"

    def __post_init__(self):
        o = "AdaptConfig"
        _int(self.K, "K", o, 0)
        _int(self.S, "S", o, 1)
        _pos(self.alpha_adapt, "alpha_adapt", o)
        _choice(self.preconditioner, "preconditioner", o, _PRECONDITIONERS)
        _pos(self.p_minus, "p_minus", o)
        _pos(self.p_plus, "p_plus", o)
        if self.p_minus > self.p_plus:
            raise ValueError(f"{o}: p_minus={self.p_minus!r} must be <= p_plus={self.p_plus!r}")
        for name in ("beta1", "beta2", "momentum"):
            v = _nonneg(getattr(self, name), name, o)
            if v >= 1.0:
                raise ValueError(f"{o}.{name} must lie in [0, 1); got {v!r}")
        _nonneg(self.weight_decay, "weight_decay", o)
        _pos(self.eps, "eps", o)
        _choice(self.direction, "direction", o, _ADAPT_DIRECTIONS)
        _check_lp(self, o)
        if self.preconditioner == "fixed":
            if self.P is None:
                raise ValueError(f"{o}: preconditioner='fixed' needs an SPD matrix P; got P=None")
            P = np.array(self.P, dtype=np.float64)
            if P.ndim != 2 or P.shape[0] != P.shape[1] or not np.all(np.isfinite(P)):
                raise ValueError(f"{o}.P must be a finite square matrix; got shape {P.shape}")
            if np.abs(P - P.T).max() > 1e-12 * max(1.0, np.abs(P).max()):
                raise ValueError(f"{o}.P must be symmetric")
            if np.linalg.eigvalsh(P)[0] <= 0:
                raise ValueError(f"{o}.P must be positive definite; smallest eigenvalue {np.linalg.eigvalsh(P)[0]:.3e}")
            P.flags.writeable = False
            object.__setattr__(self, "P", P)
        elif self.P is not None:
            raise ValueError(f"{o}.P is only used with preconditioner='fixed'; got preconditioner={self.preconditioner!r}")


@dataclass(frozen=True)
class Pipeline2Config:
    """Pipeline 2: data-rich local training (population gradients, LP direction) from the given start, with the
    step ``eta_k = eta / (1 + k / decay_steps)`` (``decay_steps=None``: constant), for ``max_steps`` steps or until
    ``‖w_{k+1} - w_k‖ <= tol`` for every client. ``eps_mode`` defaults to the theory's rule "balancing iff
    ``β > 0``": with EPO's 1e-4 (or even 1e-12) the iteration stalls on the Pareto front slightly off the
    preference ray, where the descent LP returns ``d ≈ 0`` while ``ψ - ψ* ≈ 1e-6``. ``select``: return the iterate
    with the smallest ``ψ_new`` (``"best"``; the balancing LP direction is discontinuous near the ray and the
    iteration can be kicked out of a neighbourhood it had reached) or the last one (``"last"``)."""

    max_steps: int = 3000
    eta: float = 0.2
    decay_steps: float | None = 200.0
    tol: float = 1e-13
    eps_mode: float = 0.0
    descent: str = "restricted"
    on_infeasible: str = "relaxed"
    record_every: int = 50
    select: str = "best"

    def __post_init__(self):
        o = "Pipeline2Config"
        _int(self.max_steps, "max_steps", o, 0)
        _pos(self.eta, "eta", o)
        if self.decay_steps is not None:
            _pos(self.decay_steps, "decay_steps", o)
        _nonneg(self.tol, "tol", o)
        _check_lp(self, o)
        _int(self.record_every, "record_every", o, 1)
        _choice(self.select, "select", o, ("best", "last"))


@dataclass(frozen=True)
class AlgorithmConfig:
    """All of Algorithm 1. ``rho``: ``"uniform"`` (``1/N``) or ``"samples"`` (``ρ_i ∝ n_i``) within each cluster;
    ``fedavg``: the FedAvg baseline's training (``direction`` is forced to ``"linear"``; None: Phase 1's settings);
    ``adamw``: an optional second Pipeline-1 run with this config (e.g. the experiments' AdamW)."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    phase1: Phase1Config = field(default_factory=Phase1Config)
    phase2: Phase2Config = field(default_factory=Phase2Config)
    adapt: AdaptConfig = field(default_factory=AdaptConfig)
    pipeline2: Pipeline2Config = field(default_factory=Pipeline2Config)
    fedavg: Phase1Config | None = None
    adamw: AdaptConfig | None = None
    rho: str = "uniform"

    def __post_init__(self):
        o = "AlgorithmConfig"
        for name, typ in (("cluster", ClusterConfig), ("phase1", Phase1Config), ("phase2", Phase2Config),
                          ("adapt", AdaptConfig), ("pipeline2", Pipeline2Config)):
            if not isinstance(getattr(self, name), typ):
                raise ValueError(f"{o}.{name} must be a {typ.__name__}; got {type(getattr(self, name)).__name__}")
        if self.fedavg is not None and not isinstance(self.fedavg, Phase1Config):
            raise ValueError(f"{o}.fedavg must be a Phase1Config or None")
        if self.adamw is not None and not isinstance(self.adamw, AdaptConfig):
            raise ValueError(f"{o}.adamw must be an AdaptConfig or None")
        _choice(self.rho, "rho", o, ("uniform", "samples"))

    def to_dict(self) -> dict:
        """Plain-Python parameters (for records and JSON)."""
        def conv(x):
            if isinstance(x, np.ndarray):
                return x.tolist()
            if isinstance(x, dict):
                return {k: conv(v) for k, v in x.items()}
            return x
        return conv(asdict(self))


# ================================================================================================ results


@dataclass(frozen=True, eq=False)
class PhaseResult:
    """Output of :func:`phase1`, :func:`phase2` or :func:`fedavg` for one cluster.

    ``w``: the final model ``(n_w,)``; ``trajectory``: ``(R+1, n_w)`` server models ``w_0..w_R`` (None with
    ``keep_trajectory=False``), both in the source's array type; ``records``: the tidy DataFrame (rows
    ``round = 0..R``); ``step_status_counts``: statuses of every LP solved by training steps;
    ``diagnostic_status_counts``: statuses of the separate diagnostic LPs; ``B``: the gradient bound at the end."""

    w: Any
    trajectory: Any
    records: pd.DataFrame
    step_status_counts: dict
    diagnostic_status_counts: dict
    B: float


@dataclass(frozen=True, eq=False)
class AdaptResult:
    """Output of :func:`pipeline1` / :func:`pipeline2` / :func:`local_only` for a batch of new clients.

    ``w``: final models ``(n, n_w)``; ``trajectory``: ``(K+1, n, n_w)`` (None with ``keep_trajectory=False``), both
    in the source's array type; ``gap``: final ``ψ_i(w) - ψ_i*`` ``(n,)``; ``beta``: final ``β_i`` ``(n,)``;
    ``records``: DataFrame; ``step_status_counts``; ``steps``: steps taken."""

    w: Any
    trajectory: Any
    gap: np.ndarray
    beta: np.ndarray
    records: pd.DataFrame
    step_status_counts: dict
    steps: int


@dataclass(frozen=True, eq=False)
class AlgorithmResult:
    """Output of :func:`run_algorithm`. ``records``: every row of every phase; ``summary``: final gaps and counts;
    ``w_ref`` ``(n_w,)`` and ``w_I``, ``w_II``, ``w_fedavg`` ``(n_clusters, n_w)`` in the source's array type."""

    clustering: Clustering
    train_clients: np.ndarray
    new_clients: np.ndarray
    assignment: np.ndarray
    w_ref: Any
    w_I: Any
    w_II: Any
    w_fedavg: Any
    phases: dict
    adaptation: dict
    records: pd.DataFrame
    summary: dict




# ================================================================================================ helpers


def _zero_counts() -> dict:
    return {s: 0 for s in STATUSES}


def _add_counts(total: dict, status: np.ndarray) -> None:
    for s in STATUSES:
        total[s] += int(np.count_nonzero(status == s))


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


class _Recorder:
    """Collects per-round column arrays; builds one DataFrame at the end. ``extra`` columns of a row (the source's
    :func:`_record_metrics`) follow :data:`RECORD_COLUMNS` in the order first seen; ``sink`` receives the rows of
    every ``add`` as a DataFrame at once (records written as a run goes)."""

    def __init__(self, sink: RowSink | None = None):
        self.parts: list[dict] = []
        self.extra: list[str] = []
        self.sink = sink

    def add(self, extra: dict | None = None, **cols) -> None:
        n = next((int(v.shape[0]) for v in cols.values() if isinstance(v, np.ndarray) and v.ndim == 1), None)
        if n is None:
            raise ValueError(f"a record row needs a per-client column; got {sorted(cols)}")
        part = {k: (v if isinstance(v, np.ndarray) and v.ndim == 1 else np.full(n, v)) for k, v in cols.items()}
        for k, v in (extra or {}).items():
            part[k] = np.broadcast_to(np.asarray(v), (n,))
            if k not in self.extra:
                self.extra.append(k)
        self.parts.append(part)
        if self.sink is not None:
            self.sink(self._frame([part]))

    def _frame(self, parts: list[dict]) -> pd.DataFrame:
        cols = RECORD_COLUMNS + tuple(self.extra)
        if not parts:
            return pd.DataFrame({c: [] for c in cols})
        sizes = [len(next(iter(p.values()))) for p in parts]
        return pd.DataFrame({c: np.concatenate([p[c] if c in p else np.full(n, np.nan)
                                                for p, n in zip(parts, sizes, strict=True)]) for c in cols})

    def frame(self, params: dict) -> pd.DataFrame:
        df = self._frame(self.parts)
        df.attrs["params"] = params
        return df


def _record_metrics(src: Source, W, clients: np.ndarray, losses: np.ndarray) -> dict | None:
    """Extra record columns of the rows ``W`` from the source's optional ``record_metrics(W, clients, losses)``
    (``{name: (n,) float64}``, e.g. per-objective losses and held-out accuracy of an LLM source); None without."""
    fn = getattr(src, "record_metrics", None)
    return None if fn is None else fn(W, clients, losses)


_NAN_COLS = dict(deviation=np.nan, dispersion=np.nan, margin_Jstar=np.nan, margin_Jeps=np.nan, dM_norm=np.nan,
                 eps_act=np.nan, grad_bound=np.nan, n_Jeps=np.nan, rho=np.nan, eta_local=np.nan, eta_meta_inner=np.nan,
                 alpha_server=np.nan, eta_eff=np.nan, alpha_adapt=np.nan, preconditioner="none", p_min=np.nan,
                 p_max=np.nan, p_at_lower=np.nan, p_at_upper=np.nan, local_steps=np.nan, batch_size=np.nan)




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


def fedavg(source, clients, w0, config: Phase1Config, rng: np.random.Generator, *, rho=None, cluster: int = 0,
           progress: Progress | None = None, keep_trajectory: bool = True,
           on_rows: RowSink | None = None) -> PhaseResult:
    """FedAvg baseline: Phase 1 with the linear scalarisation ``d_i = G_i λ_i`` instead of the LP."""
    return phase1(source, clients, w0, replace(config, direction="linear"), rng, rho=rho, cluster=cluster,
                  progress=progress, phase="fedavg", keep_trajectory=keep_trajectory, on_rows=on_rows)


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


# ================================================================================================ new client


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


def local_only(source, clients, w_ref, config: AdaptConfig, rng: np.random.Generator | None = None, *,
               batches=None, cluster=-1, keep_trajectory: bool = True, on_rows: RowSink | None = None) -> AdaptResult:
    """Local-only baseline: Pipeline 1's optimiser from ``w_ref`` on the same ``S·K`` samples (pass ``batches``)."""
    return pipeline1(source, clients, w_ref, config, rng, batches=batches, phase="local_only", cluster=cluster,
                     keep_trajectory=keep_trajectory, on_rows=on_rows)


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


def _cfg_dict(cfg) -> dict:
    d = asdict(cfg)
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in d.items()}


# ================================================================================================ full run


def run_algorithm(source, config: AlgorithmConfig, rng: np.random.Generator, *, w_ref, train_clients,
                  new_clients=(), progress: Progress | None = None, keep_trajectory: bool = True,
                  on_rows: RowSink | None = None) -> AlgorithmResult:
    """Algorithm 1 end to end: clustering of ``train_clients`` at ``w_ref``; per cluster Phase 1 (``w_I``), Phase 2
    (``w_II``) and the FedAvg baseline (``w_FA``); every new client is assigned to a cluster and runs Pipeline 1
    from ``w_I`` and from ``w_II``, Pipeline 2, the local-only baseline from ``w_ref`` and FedAvg + adaptation
    (linear direction, from ``w_FA``), all on the same fresh batches. Random draws happen in this fixed order:
    clustering, then per cluster Phase 1, Phase 2, FedAvg, then the adaptation batches."""
    if not isinstance(config, AlgorithmConfig):
        raise ValueError(f"config must be an AlgorithmConfig; got {type(config).__name__}")
    src = as_source(source)
    rng = _check_rng(rng)
    train = check_clients(src, train_clients, "train_clients")
    new = np.asarray(new_clients, dtype=np.int64)
    if new.size:
        new = check_clients(src, new, "new_clients")
        if np.intersect1d(new, train).size:
            raise ValueError(f"new_clients must not take part in training; overlap {np.intersect1d(new, train).tolist()}")
    w_ref = _check_point(src, w_ref, "w_ref")
    xp = array_namespace(w_ref)
    cfg = config
    # validate every batch size against the data before running anything
    if cfg.phase1.batch_size is not None:
        check_batch_size(src, train, cfg.phase1.batch_size, "Phase1Config.batch_size")
    if cfg.phase2.S is not None:
        check_batch_size(src, train, cfg.phase2.S, "Phase2Config.S")
    if new.size:
        check_batch_size(src, new, cfg.adapt.S, "AdaptConfig.S")
        check_psi_star(src, new)
    check_psi_star(src, train)

    clus = clustering_step(src, train, w_ref, cfg.cluster, rng)
    keep: dict[str, Any]  # the keyword arguments every phase takes
    outputs: dict = {"w_I": [], "w_II": [], "w_FA": []}
    phases: dict = {}
    frames = []
    fa_cfg = cfg.phase1 if cfg.fedavg is None else cfg.fedavg
    keep = dict(progress=progress, keep_trajectory=keep_trajectory, on_rows=on_rows)
    for c, members in enumerate(clus.clusters):
        cl = train[members]
        rho = _rho_for(src, cl, cfg.rho)
        p1 = phase1(src, cl, w_ref, cfg.phase1, rng, rho=rho, cluster=c, **keep)
        p2 = phase2(src, cl, p1.w, cfg.phase2, rng, rho=rho, cluster=c, round_offset=cfg.phase1.rounds,
                    B_start=p1.B, **keep)
        fa = fedavg(src, cl, w_ref, fa_cfg, rng, rho=rho, cluster=c, **keep)
        for name, phase_res in (("w_I", p1), ("w_II", p2), ("w_FA", fa)):
            outputs[name].append(phase_res.w)
        phases[c] = dict(phase1=p1, phase2=p2, fedavg=fa)
        frames += [p1.records, p2.records, fa.records]
    w_I, w_II, w_FA = (xp.stack(outputs[name]) for name in ("w_I", "w_II", "w_FA"))

    adaptation: dict = {}
    assign = np.empty(0, dtype=np.int64)
    if new.size:
        assign = assign_to_cluster(src, new, w_ref, clus, train, key=cfg.cluster.key)
        batches = draw_batches(src, new, cfg.adapt.K, cfg.adapt.S, rng)
        lin = replace(cfg.adapt, direction="linear")
        runs = {
            "pipeline1_wI": (_take(w_I, assign), cfg.adapt),
            "pipeline1_wII": (_take(w_II, assign), cfg.adapt),
            "local_only": (xp.broadcast_to(w_ref, (new.size, src.n_params)), cfg.adapt),
            "fedavg_adapt": (_take(w_FA, assign), lin),
        }
        if cfg.adamw is not None:
            if cfg.adamw.K != cfg.adapt.K or cfg.adamw.S != cfg.adapt.S:
                raise ValueError("AlgorithmConfig.adamw must use the same K and S as AlgorithmConfig.adapt")
            runs["pipeline1_wII_adamw"] = (_take(w_II, assign), cfg.adamw)
        for name, (starts, acfg) in runs.items():
            if progress is not None:
                progress(name, 0, 1)
            res = pipeline1(src, new, starts, acfg, batches=batches, phase=name, cluster=assign,
                            keep_trajectory=keep_trajectory, on_rows=on_rows)
            adaptation[name] = res
            frames.append(res.records)
            if progress is not None:
                progress(name, 1, 1)
        if progress is not None:
            progress("pipeline2", 0, 1)
        p2res = pipeline2(src, new, _take(w_II, assign), cfg.pipeline2, cluster=assign,
                          keep_trajectory=keep_trajectory, on_rows=on_rows)
        adaptation["pipeline2"] = p2res
        frames.append(p2res.records)
        if progress is not None:
            progress("pipeline2", 1, 1)

    records = pd.concat(frames, ignore_index=True)
    records.attrs["params"] = cfg.to_dict()
    summary = _summary(src, train, new, assign, clus, w_ref, w_I, w_II, w_FA, phases, adaptation, records, cfg)
    return AlgorithmResult(clustering=clus, train_clients=train, new_clients=new, assignment=assign, w_ref=w_ref,
                           w_I=w_I, w_II=w_II, w_fedavg=w_FA, phases=phases, adaptation=adaptation,
                           records=records, summary=summary)


def _gap_at(src: Source, clients: np.ndarray, W) -> np.ndarray:
    l = _losses(src, W, clients, where="summary")
    return (src.prefs[clients] * l).max(axis=-1) - src.psi_star[clients]


def _summary(src, train, new, assign, clus, w_ref, w_I, w_II, w_FA, phases, adaptation, records, cfg) -> dict:
    def fl(a):
        return [float(x) for x in np.asarray(a).ravel()]

    clusters = []
    for c, members in enumerate(clus.clusters):
        cl = train[members]
        p1 = phases[c]["phase1"].records
        p2 = phases[c]["phase2"].records
        fa = phases[c]["fedavg"].records
        first = p1[p1["round"] == 0].set_index("client")["gap"]
        clusters.append(dict(
            cluster=c, clients=[int(i) for i in cl],
            gap_w_ref=fl(first.loc[cl]),
            gap_w_I=fl(p1[p1["round"] == p1["round"].max()].set_index("client")["gap"].loc[cl]),
            gap_w_II=fl(p2[p2["round"] == p2["round"].max()].set_index("client")["gap"].loc[cl]),
            gap_fedavg=fl(fa[fa["round"] == fa["round"].max()].set_index("client")["gap"].loc[cl]),
        ))
    counts = {s: int(records[f"n_{s}"].sum()) for s in STATUSES}
    out: dict = dict(
        n_train_clients=int(train.size), n_new_clients=int(new.size), n_clusters=clus.n_clusters,
        cluster_labels=[int(v) for v in clus.labels], clusters=clusters,
        lp_step_status_counts=counts,
        eta_I=cfg.phase1.eta_eff, eta_II=cfg.phase2.eta_eff,
    )
    if new.size:
        new_rows = []
        final = {name: res.gap for name, res in adaptation.items()}
        start = dict(w_ref=_gap_at(src, new, _rows(w_ref, new.size)),
                     w_I=_gap_at(src, new, _take(w_I, assign)), w_II=_gap_at(src, new, _take(w_II, assign)),
                     w_fedavg=_gap_at(src, new, _take(w_FA, assign)))
        for c, i in enumerate(new):
            new_rows.append(dict(client=int(i), cluster=int(assign[c]), psi_star=float(src.psi_star[i]),
                                 start_gap={k: float(v[c]) for k, v in start.items()},
                                 final_gap={k: float(v[c]) for k, v in final.items()}))
        out["new_clients"] = new_rows
        out["mean_final_gap"] = {k: float(np.mean(v)) for k, v in final.items()}
        out["mean_start_gap"] = {k: float(np.mean(v)) for k, v in start.items()}
        out["adaptation_samples_per_client"] = int(cfg.adapt.K * cfg.adapt.S)
    return out



# ------------------------------------------------------------------------------- clusterings compared (Remark H.8)

#: Clusterings of :func:`comparison_clusterings`, in order.
CLUSTERING_NAMES = ("stage1_stage2", "stage1_only", "random")


def random_partition(rng: np.random.Generator, sizes) -> list[np.ndarray]:
    """A uniformly random partition of the positions ``0 .. sum(sizes) - 1`` into groups of exactly ``sizes``
    (sorted index arrays; one ``rng.permutation``)."""
    sizes = list(sizes)
    if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1 for s in sizes):
        raise ValueError(f"sizes must be positive integers; got {sizes}")
    perm = rng.permutation(int(sum(sizes)))
    out, start = [], 0
    for s in sizes:
        out.append(np.sort(perm[start:start + s]))
        start += s
    return out


def comparison_clusterings(clustering: Clustering, rng: np.random.Generator,
                           n_random: int) -> list[tuple[str, int, list[np.ndarray]]]:
    """The clusterings that Remark H.8's design claim compares, as ``(name, draw, clusters)`` (positions in the
    clustered clients, as :attr:`~sim.cluster.Clustering.clusters`): Algorithm 1's Stage-1+2 ``clustering``
    (``stage1_stage2``), its Stage-1 groups alone (``stage1_only``; the clusters of ``stage2=False``, no draw) and
    ``n_random`` uniformly random partitions with the Stage-1+2 cluster sizes (``random``, draw ``0 ..
    n_random - 1``, in that order from ``rng``)."""
    if not isinstance(n_random, (int, np.integer)) or isinstance(n_random, bool) or n_random < 0:
        raise ValueError(f"n_random must be an integer >= 0; got {n_random!r}")
    s1 = np.asarray(clustering.stage1_labels)
    stage1 = [np.flatnonzero(s1 == g) for g in range(int(s1.max()) + 1)]
    sizes = [len(c) for c in clustering.clusters]
    parts = [("stage1_stage2", 0, [np.asarray(c) for c in clustering.clusters]), ("stage1_only", 0, stage1)]
    parts += [("random", d, random_partition(rng, sizes)) for d in range(int(n_random))]
    return parts


def same_partition(a, b) -> bool:
    """Whether two lists of index arrays are the same partition (cluster order ignored)."""
    key = lambda p: sorted(tuple(int(x) for x in np.sort(np.asarray(c))) for c in p)  # noqa: E731
    return key(a) == key(b)


def phase1_by_clustering(source, clients, w_ref, parts, config: Phase1Config, rng: np.random.Generator, *,
                         rho=None, progress: Progress | None = None, on_rows: RowSink | None = None) -> pd.DataFrame:
    """Phase 1 (``config``) from ``w_ref`` on every cluster of every clustering of ``parts`` (``(name, draw,
    clusters)``, e.g. from :func:`comparison_clusterings`; clusters index positions in ``clients``), in order, each
    cluster with its own server model: the comparison of Remark H.8 (``H_Cn(w^t)`` is the ``dispersion`` column).
    Returns the records of every run with the columns ``clustering`` and ``draw`` first (``on_rows`` receives them
    round by round, with those columns); ``rho``: ``"uniform"`` (default) or ``"samples"`` within each cluster, as
    :attr:`AlgorithmConfig.rho`."""
    if rho is not None and not (isinstance(rho, str) and rho in ("uniform", "samples")):
        raise ValueError(f"rho must be 'uniform' or 'samples' (one rule for every cluster); got {rho!r}")
    src = as_source(source)
    clients = check_clients(src, clients)
    frames = []
    for name, draw, clusters in parts:
        for c, members in enumerate(clusters):
            cl = clients[np.asarray(members, dtype=np.int64)]
            sink = None if on_rows is None else (
                lambda f, n=name, d=draw: on_rows(f.assign(clustering=n, draw=d)[["clustering", "draw", *f.columns]]))
            res = phase1(src, cl, w_ref, config, rng, rho=rho, cluster=c, progress=progress, keep_trajectory=False,
                         on_rows=sink)
            frames.append(res.records.assign(clustering=name, draw=int(draw)))
    if not frames:
        return pd.DataFrame(columns=["clustering", "draw", *RECORD_COLUMNS])
    out = pd.concat(frames, ignore_index=True)
    return out[["clustering", "draw", *[c for c in out.columns if c not in ("clustering", "draw")]]]

# ------------------------------------------------------------------------------- planted scenario


@dataclass(frozen=True)
class ProblemSpec:
    """Planted F1 scenario: ``n_groups`` groups of ``n_train`` training and ``n_new`` new clients each."""

    m: int = 3
    n_w: int = 5
    n_groups: int = 2
    n_train: int = 4
    n_new: int = 2
    spread: float = 0.05
    train_samples: int = 200
    new_samples: int = 4000
    noise_scale: float = 0.1
    w_ref_offset: float = 0.5



def build_problem(spec: ProblemSpec, rng: np.random.Generator):
    """Planted F1 problem with ``n_groups`` groups; returns ``(source, w_ref, train_clients, new_clients, groups)``.

    All groups share the objectives (H.5); group ``g`` draws ``u_0^g ~ Dirichlet(3·1)`` and ``n_train + n_new``
    mixings ``u_i`` with spread ``s_u`` around it; each client is planted (``λ_i``, ``w_i*``, ``ψ_i*``) by
    :meth:`PlantedQuadraticCluster.planted_client`. ``w_ref`` is the mean of the centres ``c_j`` shifted by
    ``w_ref_offset`` in every coordinate. Clients are ordered group by group, training clients first.
    """
    per = spec.n_train + spec.n_new
    base = PlantedQuadraticCluster.make(rng, m=spec.m, n_w=spec.n_w, n_clients=per, spread=spec.spread)
    mix, groups = [], []
    for g in range(spec.n_groups):
        u0 = base.u0 if g == 0 else rng.dirichlet(3.0 * np.ones(spec.m))
        mix.append(planted_mixing(rng, u0, per, spec.spread))
        groups += [g] * per
    u = np.concatenate(mix)
    lam, w_star, psi = base.planted_client(u)
    problem = replace(base, mixing=u, prefs=lam, w_star=w_star, psi_star=psi)
    idx = np.arange(u.shape[0]).reshape(spec.n_groups, per)
    train = idx[:, : spec.n_train].ravel()
    new = idx[:, spec.n_train :].ravel()
    counts = np.full(u.shape[0], spec.train_samples)
    counts[new] = spec.new_samples
    samples = problem.with_samples(rng, counts, spec.noise_scale)
    w_ref = problem.centres.mean(axis=0) + spec.w_ref_offset
    return ClientSource(problem, samples), w_ref, train, new, np.asarray(groups)
