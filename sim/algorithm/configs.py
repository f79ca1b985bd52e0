"""Algorithm 1's configuration (:mod:`sim.algorithm`): one frozen dataclass per stage — the clustering, Phase 1,
Phase 2, Pipeline 1, Pipeline 2 and the whole run — each validated as it is made (a bad value raises
``ValueError`` naming the class, the field and the value), and the choices they accept."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

_DESCENT = ("restricted", "relaxed")
_ON_INFEASIBLE = ("relaxed", "fallback_preference", "raise")
_TRAIN_DIRECTIONS = ("lp", "linear")
_ADAPT_DIRECTIONS = ("lp", "chebyshev", "linear")
_PRECONDITIONERS = ("identity", "fixed", "rmsprop_lagged", "rmsprop_current", "adamw", "sgd")
#: The preconditioners whose diagonal is clipped to ``[p_minus, p_plus]`` (records: ``p_at_lower``, ``p_at_upper``).
CLIPPED_PRECONDITIONERS = ("rmsprop_lagged", "rmsprop_current")


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
    """Clustering (docs/spec/algorithm.md#algorithm, docs/spec/open-points.md#o-17). ``key``: ``"ordering"`` (full ordering of ``λ_i ⊙ l_i(w_ref)``) or
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


def _cfg_dict(cfg) -> dict:
    d = asdict(cfg)
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in d.items()}
