r"""Algorithm 1: clustering, Phase 1, Phase 2, new-client Pipelines 1 and 2, baselines
(docs/spec/algorithm.md#algorithm).

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

**Clustering** (docs/spec/algorithm.md#algorithm, docs/spec/open-points.md#o-17) at a reference model
``w_ref``: :func:`clustering_step` evaluates the population losses ``l_i(w_ref)`` and calls
:func:`sim.cluster.cluster_clients` (Stage 1: ordering of ``λ_i ⊙ l_i(w_ref)``; Stage 2: complete linkage on
``A_i^ref`` with a diameter threshold, or k-means). New clients are placed by :func:`assign_to_cluster`.

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

**Modules.** The package is layered, each module importing only those above it in this list:
:mod:`sim.algorithm.configs` (the configurations and their checks), :mod:`sim.algorithm.records` (the record
columns, the result types, the recorder), :mod:`sim.algorithm.evaluation` (checked inputs, the source's checked
evaluations, the batched directions, :class:`LPFailureError` and :class:`DivergenceError`),
:mod:`sim.algorithm.phases` (clustering, the shared iteration, Phase 1 and Phase 2),
:mod:`sim.algorithm.adaptation` (the preconditioners, Pipelines 1 and 2), :mod:`sim.algorithm.run` (the
baselines, :func:`run_algorithm`, Remark H.8's clustering comparison) and :mod:`sim.algorithm.scenario` (the
planted scenario). Every name is importable from ``sim.algorithm`` itself.
"""

from __future__ import annotations

from sim.algorithm.adaptation import (
    PreconditionerState,
    clip_shares,
    draw_batches,
    pipeline1,
    pipeline2,
    preconditioned_step,
    rmsprop_diagonal,
)
from sim.algorithm.configs import (
    CLIPPED_PRECONDITIONERS,
    AdaptConfig,
    AlgorithmConfig,
    ClusterConfig,
    Phase1Config,
    Phase2Config,
    Pipeline2Config,
)
from sim.algorithm.evaluation import DivergenceError, LPFailureError
from sim.algorithm.evaluation import _directions as _directions
from sim.algorithm.phases import _diagnostics as _diagnostics
from sim.algorithm.phases import _hull_diagnostics as _hull_diagnostics
from sim.algorithm.phases import (
    assign_to_cluster,
    clustering_step,
    lp_input_columns,
    phase1,
    phase2,
    shared_iteration,
)
from sim.algorithm.records import RECORD_COLUMNS, AdaptResult, AlgorithmResult, PhaseResult
from sim.algorithm.records import Progress as Progress
from sim.algorithm.records import RowSink as RowSink
from sim.algorithm.run import (
    CLUSTERING_NAMES,
    comparison_clusterings,
    fedavg,
    local_only,
    phase1_by_clustering,
    random_partition,
    run_algorithm,
    same_partition,
)
from sim.algorithm.run import _gap_at as _gap_at
from sim.algorithm.scenario import ProblemSpec, build_problem
from sim.direction import lp_direction as lp_direction
from sim.hull import near_active_set as near_active_set
from sim.source import ClientProblem, ClientSource, Evaluation, SampleData, Source, as_source

# Also reached through sim.algorithm, outside __all__: the callback types Progress and RowSink, the LP kernel and
# the near-active set that Algorithm 1's modules import, and the private steps the tests call. A test that replaces
# one of them (monkeypatch) replaces it in the module that looks it up (sim.algorithm.evaluation,
# sim.algorithm.phases, ...); replacing it here would change nothing.
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
