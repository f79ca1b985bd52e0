r"""The kernel boundary of Algorithm 1: client sources (docs/spec/iteration.md#iteration, docs/spec/iteration.md#new-client, docs/spec/algorithm.md#algorithm; DESIGN "The kernel boundary").

Algorithm 1 (:mod:`sim.algorithm`) never touches a gradient. Per client and step it needs the loss vector
``l_i`` (m), the Gram matrix ``C_i = G_iᵀG_i`` (m×m) — everything the EPO LP, ``β``, ``A``, ``ψ``, the H.19
margins, the minimum-norm element and the gradient bound are computed from — and a way to apply ``d_i = G_i μ_i``
to the client's parameters. A **source** supplies them, for a set of clients at once, and keeps the parameter
arithmetic in its own array type: numpy for the problem families (:class:`ClientSource`), torch on the device for
an LLM with a million LoRA parameters. No parameter-sized array has to leave the source's device.

**The protocol** (:class:`Source`, :class:`Evaluation`). ``Array`` is the source's parameter array type (numpy
``ndarray``, ``torch.Tensor``, or any array of the Python array API standard); ``n`` is the number of clients of
one call, ``N`` the source's total, ``m`` the objectives, ``n_w`` the parameters::

    class Source:
        prefs: np.ndarray                  # (N, m) float64 preferences λ_i (open simplex)
        psi_star: np.ndarray               # (N,) float64 ψ_i* (NaN where unknown; records need it)
        n_clients: int                     # N
        n_params: int                      # n_w
        n_objectives: int                  # m
        n_samples: np.ndarray | None       # (N,) local dataset sizes n_i; None: population only (no batches)

        def asarray(self, x) -> Array                          # parameters (host array or Array) in the source's
                                                               # array type, dtype and device (a new array)
        def to_host(self, x: Array) -> np.ndarray              # float64 numpy copy of a small array
        def losses(self, W: Array, clients: np.ndarray) -> np.ndarray
                                                               # (n, n_w) rows, client c at W[c] -> (n, m) float64
                                                               # population losses (full local data)
        def evaluate(self, W: Array, clients: np.ndarray, batches=None) -> Evaluation
                                                               # batches: None (population) or one 1-D integer
                                                               # index array per client (sample indices)
        def episode(self, rng: np.random.Generator, client: int, size: int) -> np.ndarray
                                                               # ``size`` distinct sample indices of ``client``

    class Evaluation:                      # of n clients, each at its own row of W, on its own batch
        losses: np.ndarray                 # (n, m) float64, host
        gram: np.ndarray                   # (n, m, m) float64, host, C_c = G_cᵀG_c (symmetric)
        def combine(self, weights: np.ndarray) -> Array        # (n, m) float64 host -> (n, n_w) Array: row c is
                                                               # G_c weights_c (the gradients stay on the device)

``clients`` are integer numpy index arrays into ``0..N-1``; ``W`` rows are in the order of ``clients``; random
draws (batches, episodes) happen on the host with the run's ``numpy.random.Generator``, so a run is reproducible
for any source. An :class:`Evaluation` is used only within one step (and the round's diagnostics); the algorithm
may call ``combine`` several times on it (the step direction, the minimum-norm element ``d_M``). A non-finite loss
or Gram entry is reported by the algorithm as a divergence naming the phase, round, client and step size, so a
source returns what it computed and does not need to check. A source that refuses a loss (e.g. an LLM loss at its
floor) raises ``FloatingPointError`` naming the client and objective; the algorithm re-raises it as its
``DivergenceError`` with the phase, round and step added.

**Optional: extra record columns.** A source may have ``record_metrics(W, clients, losses) -> dict[str,
np.ndarray]``: the algorithm calls it at every record row with the row's parameters ``W`` ``(n, n_w)``, clients
and population losses ``(n, m)``, and each entry (``(n,)`` float64) becomes a column after
:data:`sim.algorithm.RECORD_COLUMNS` (an LLM source: per-objective losses, held-out accuracy).

**Optional: the LP inputs in the records.** A source with a true attribute ``record_lp_inputs`` gets, at every
population-diagnostic row of Phase 1, Phase 2 and FedAvg, the client's Gram ``C_i`` (columns ``gram_<j>_<k>``,
``j ≤ k``, objective indices) and the weights ``μ_i`` of its population LP (``mu_<j>``) after those columns:
with the per-objective losses and ``λ_i`` they let a reader re-solve and classify the LP (e.g. the common basis of
H.6) from the records alone, when the Grams themselves cannot be kept (an LLM run).

:func:`check_source` verifies a source against this contract (shapes, dtypes, a symmetric PSD Gram,
``‖combine(μ)‖² = μᵀCμ``, linearity of ``combine``, episodes).

**What a torch source implements.** The members above, with ``Array = torch.Tensor`` (float32 or float64 LoRA
parameters, flattened per client, on the model's device). ``evaluate`` runs the ``m`` per-objective backward passes
per client, stacks the flattened gradients ``G`` ``(n, n_w, m)`` on the device, returns ``losses`` and the Gram
formed in float64 on the device, ``Gd = G.double(); (Gd.mT @ Gd).cpu().numpy()`` (a Gram accumulated in float32 is
not positive semi-definite to the float64 round-off that the LP's input check allows once the gradients nearly
cancel), and ``combine(μ)`` is ``einsum("nwm,nm->nw", G, torch.as_tensor(μ, dtype=G.dtype, device=G.device))``.
``asarray`` is ``torch.as_tensor(x, dtype=..., device=...).clone()``, ``to_host`` is
``x.detach().double().cpu().numpy()``. Nothing else: the phases, the server update, the preconditioners (identity,
fixed, lagged RMSprop, AdamW, SGD) and the diagnostics are written once against the array namespace of ``W``.

**Parameter arithmetic: the array API standard.** :func:`array_namespace` returns numpy itself for numpy arrays
(NumPy ≥ 2 implements the standard, so the numpy families' parameter updates are plain numpy, bit for bit those of
a numpy-only loop) and otherwise the namespace of :mod:`array_api_compat` (``array_api_compat.torch`` for tensors; any library with
``__array_namespace__``). The standard is the one interface numpy and torch both satisfy without a hand-kept
shim: the phases use only its functions (``asarray``, ``broadcast_to``, ``stack``, ``take``, ``where``, ``clip``,
``sqrt``, ``zeros``/``ones``/``full``, ``matmul``, ``linalg.vector_norm``, ``min``/``max``, ``isfinite``/``all``),
create every new array on the device and dtype of the parameters, and move to the host only per-client scalars
(losses, Grams, norms, the preconditioner's extremes). The tests run Algorithm 1 on a source whose parameters are
``array_api_strict`` arrays on a non-default device, where any numpy call on parameters fails, and whose
``to_host`` refuses every array with a parameter-sized axis.

**Diagnostics from Grams** (:mod:`sim.algorithm` records). With ``d_i = G_i μ_i``: ``(G_iᵀd_i)_j = (C_i μ_i)_j``, so
the H.19 margin is ``min_{j∈J} λ_j (C_i μ_i)_j`` (:func:`sim.hull.descent_margin_from_gram`); the gradient bound is
``B² = max_{i,j} (C_i)_jj``; ``d_M = G_i (λ_i ⊙ u_i)`` with ``u_i`` from :func:`sim.hull.min_norm_weights_from_gram`
on the Gram ``Λ_i C_i Λ_i`` of ``{λ_j g_j}``, and ``‖d_M‖`` is measured on the device. ``Δ_i`` and ``H_{C_n}``
come from the norms of the centred directions ``d_i − d̄`` formed on the device (the diagonal of their N×N Gram
matrix), which keeps them exact where the directions agree; ``‖d_i‖`` likewise.

**The numpy families.** :class:`ClientSource` is the source of the problem families: a :class:`ClientProblem`
(population level, e.g. F1 :class:`~sim.problems.PlantedQuadraticCluster`, F2
:class:`~sim.problems.PerturbedClients`) and optionally its :class:`SampleData` (e.g.
:class:`~sim.problems.ClientSamples`). It also keeps the gradient-level views :meth:`ClientSource.population`
and :meth:`ClientSource.minibatch` that the studies use on numpy problems.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import array_api_compat
import numpy as np

__all__ = [
    "array_namespace",
    "Evaluation",
    "Source",
    "GradientEvaluation",
    "ClientProblem",
    "SampleData",
    "ClientSource",
    "as_source",
    "check_clients",
    "check_psi_star",
    "check_batch_size",
    "check_source",
]


def array_namespace(*xs):
    """The array API namespace of ``xs``: numpy itself for numpy arrays (NumPy ≥ 2 implements the standard), else
    :func:`array_api_compat.array_namespace` (e.g. ``array_api_compat.torch``). Raises ``TypeError`` for mixed or
    unsupported array types."""
    if all(isinstance(x, np.ndarray) for x in xs):
        return np
    return array_api_compat.array_namespace(*xs)


def device(x):
    """The device of ``x`` (``"cpu"`` for numpy), for creating arrays next to it."""
    return array_api_compat.device(x)


# ================================================================================================ protocol


@runtime_checkable
class Evaluation(Protocol):
    """Losses, Gram matrices and the combine ``d = G μ`` of ``n`` clients (see the module docstring). The members
    are read-only: a frozen dataclass such as :class:`GradientEvaluation` implements them."""

    @property
    def losses(self) -> np.ndarray: ...

    @property
    def gram(self) -> np.ndarray: ...

    def combine(self, weights: np.ndarray) -> Any: ...


class _Clients(Protocol):
    """Members shared by :class:`Source` and :class:`ClientProblem`: preferences, optima and sizes (read-only)."""

    @property
    def prefs(self) -> np.ndarray: ...

    @property
    def psi_star(self) -> np.ndarray: ...

    @property
    def n_clients(self) -> int: ...

    @property
    def n_params(self) -> int: ...

    @property
    def n_objectives(self) -> int: ...


@runtime_checkable
class Source(_Clients, Protocol):
    """A client source at the kernel boundary of Algorithm 1 (see the module docstring for the contract)."""

    @property
    def n_samples(self) -> np.ndarray | None: ...

    def asarray(self, x) -> Any: ...

    def to_host(self, x) -> np.ndarray: ...

    def losses(self, W, clients: np.ndarray) -> np.ndarray: ...

    def evaluate(self, W, clients: np.ndarray, batches=None) -> Evaluation: ...

    def episode(self, rng: np.random.Generator, client: int, size: int) -> np.ndarray: ...


@dataclass(frozen=True, eq=False)
class GradientEvaluation:
    """:class:`Evaluation` from explicit numpy gradients ``G`` ``(n, n_w, m)`` (columns are the objective gradients).

    ``gram`` is ``GᵀG`` symmetrised exactly (overflow gives ``inf``, which the algorithm reports as a divergence);
    ``combine(μ)`` is ``einsum("nwm,nm->nw", G, μ)``, the formula of :meth:`sim.direction.DirectionResult.direction`."""

    losses: np.ndarray
    grads: np.ndarray
    gram: np.ndarray = field(init=False)

    def __post_init__(self):
        G = self.grads
        with np.errstate(over="ignore", invalid="ignore"):
            C = np.swapaxes(G, -1, -2) @ G
            C = 0.5 * (C + np.swapaxes(C, -1, -2))
        object.__setattr__(self, "gram", C)

    def combine(self, weights) -> np.ndarray:
        return np.einsum("nwm,nm->nw", self.grads, np.asarray(weights, dtype=np.float64))


# ================================================================================================ numpy families


@runtime_checkable
class ClientProblem(_Clients, Protocol):
    """Population level of a client family (F1 :class:`~sim.problems.PlantedQuadraticCluster`, F2
    :class:`~sim.problems.PerturbedClients`): every client ``i`` evaluated at its own point.

    ``losses_per_client(W)``: ``(..., N, n_w) -> (..., N, m)``; ``grads_per_client(W)``: ``-> (..., N, n_w, m)``
    (columns are the objective gradients); ``prefs`` ``(N, m)``; ``psi_star`` ``(N,)`` (NaN where unknown).
    """

    def losses_per_client(self, w) -> np.ndarray: ...

    def grads_per_client(self, w) -> np.ndarray: ...


@runtime_checkable
class SampleData(Protocol):
    """Sample level (:class:`~sim.problems.ClientSamples`): finite local datasets whose mean loss is the population
    loss. ``sample_losses(w, i, idx)`` ``-> (m,)`` and ``sample_grads(w, i, idx)`` ``-> (n_w, m)`` are the means over
    the samples ``idx`` of client ``i``; ``n_samples`` ``(N,)``; ``episode(rng, i, S)`` draws ``S`` distinct indices."""

    @property
    def problem(self) -> Any: ...

    @property
    def n_samples(self) -> np.ndarray: ...

    def sample_losses(self, w, client, idx=None) -> np.ndarray: ...

    def sample_grads(self, w, client, idx=None) -> np.ndarray: ...

    def episode(self, rng, client, size: int) -> np.ndarray: ...


_NO_SAMPLES = "this source has no sample-level data (a ClientSource needs samples=ClientSamples)"


class ClientSource:
    """The numpy :class:`Source` of a :class:`ClientProblem` and (optionally) its :class:`SampleData`.

    ``psi_star`` overrides the problem's ``ψ_i*`` (shape ``(N,)``); records need ``ψ_i*`` of every client they
    cover and raise ``ValueError`` where it is unknown (NaN). Parameters are float64 numpy arrays.
    """

    def __init__(self, problem: ClientProblem, samples: SampleData | None = None, *, psi_star=None):
        if not isinstance(problem, ClientProblem):
            raise ValueError(
                f"problem must provide losses_per_client/grads_per_client/prefs/psi_star (ClientProblem); "
                f"got {type(problem).__name__}"
            )
        if samples is not None and not isinstance(samples, SampleData):
            raise ValueError(f"samples must be a SampleData (e.g. ClientSamples); got {type(samples).__name__}")
        if samples is not None and samples.problem is not problem:
            raise ValueError("samples.problem is not the given problem")
        self.problem = problem
        self.samples = samples
        N = problem.n_clients
        ps = np.asarray(problem.psi_star if psi_star is None else psi_star, dtype=np.float64)
        if ps.shape != (N,):
            raise ValueError(f"psi_star must have shape ({N},); got {ps.shape}")
        self.psi_star = ps
        self.prefs = np.asarray(problem.prefs, dtype=np.float64)

    @property
    def n_clients(self) -> int:
        return int(self.problem.n_clients)

    @property
    def n_params(self) -> int:
        return int(self.problem.n_params)

    @property
    def n_objectives(self) -> int:
        return int(self.problem.n_objectives)

    @property
    def n_samples(self) -> np.ndarray | None:
        return None if self.samples is None else np.asarray(self.samples.n_samples)

    # ---- Source protocol

    def asarray(self, x) -> np.ndarray:
        """A float64 copy of ``x``."""
        return np.array(x, dtype=np.float64)

    def to_host(self, x) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)

    def losses(self, W: np.ndarray, clients: np.ndarray) -> np.ndarray:
        """Population losses ``(n, m)`` of ``clients`` at their points ``W``."""
        return np.asarray(self.problem.losses_per_client(self._full(W, clients)))[clients]

    def evaluate(self, W: np.ndarray, clients: np.ndarray, batches=None) -> GradientEvaluation:
        """Population (``batches=None``) or minibatch losses, Grams and combine of ``clients`` at ``W``."""
        l, G = self.population(W, clients) if batches is None else self.minibatch(W, clients, batches)
        return GradientEvaluation(l, G)

    def episode(self, rng: np.random.Generator, client: int, size: int) -> np.ndarray:
        if self.samples is None:
            raise ValueError(f"episodes: {_NO_SAMPLES}")
        return self.samples.episode(rng, int(client), int(size))

    # ---- gradient-level views (numpy problems only)

    def _full(self, W, clients) -> np.ndarray:
        full = np.broadcast_to(W[0], (self.n_clients, self.n_params)).copy()
        full[clients] = W
        return full

    def population(self, W: np.ndarray, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Population losses ``(n, m)`` and gradients ``(n, n_w, m)`` of ``clients`` at their points ``W``."""
        full = self._full(W, clients)
        return (np.asarray(self.problem.losses_per_client(full))[clients],
                np.asarray(self.problem.grads_per_client(full))[clients])

    def minibatch(self, W: np.ndarray, clients: np.ndarray, batches) -> tuple[np.ndarray, np.ndarray]:
        """Mean losses and gradients over ``batches[c]`` (sample indices) of client ``clients[c]`` at ``W[c]``."""
        if self.samples is None:
            raise ValueError(f"minibatches: {_NO_SAMPLES}")
        l = np.stack([self.samples.sample_losses(W[c], int(i), batches[c]) for c, i in enumerate(clients)])
        G = np.stack([self.samples.sample_grads(W[c], int(i), batches[c]) for c, i in enumerate(clients)])
        return l, G


def as_source(source) -> Source:
    """Coerce to a :class:`Source`: a :class:`Source` is returned as is; a :class:`SampleData` (its ``problem`` is
    used) or a :class:`ClientProblem` is wrapped in a :class:`ClientSource`."""
    if isinstance(source, ClientSource):
        return source
    if isinstance(source, SampleData) and not isinstance(source, ClientProblem):
        return ClientSource(source.problem, source)
    if isinstance(source, ClientProblem):
        return ClientSource(source)
    if isinstance(source, Source):
        return source
    raise ValueError(
        f"source must be a Source (prefs, psi_star, n_clients, n_params, n_objectives, n_samples, asarray, to_host, "
        f"losses, evaluate, episode), a ClientProblem or a SampleData; got {type(source).__name__}"
    )


# ================================================================================================ validation


def check_clients(source: Source, clients, name: str = "clients") -> np.ndarray:
    """``clients`` as a non-empty 1-D int64 array of distinct indices into ``0..N-1``."""
    c = np.asarray(clients)
    if c.ndim != 1 or c.size == 0 or c.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a non-empty 1-D integer array of client indices; got {clients!r}")
    if c.min() < 0 or c.max() >= source.n_clients:
        raise ValueError(f"{name} must lie in [0, {source.n_clients - 1}]; got {c.tolist()}")
    if np.unique(c).size != c.size:
        raise ValueError(f"{name} contains a repeated client: {c.tolist()}")
    return c.astype(np.int64)


def check_psi_star(source: Source, clients) -> np.ndarray:
    """``ψ_i*`` of ``clients``; raises ``ValueError`` naming the clients where it is unknown (NaN)."""
    ps = np.asarray(source.psi_star, dtype=np.float64)[clients]
    if not np.all(np.isfinite(ps)):
        bad = [int(i) for i in np.asarray(clients)[~np.isfinite(ps)]]
        raise ValueError(
            f"psi_star is unknown for client(s) {bad}; solve the optima (F-OPT) or pass psi_star= to ClientSource"
        )
    return ps


def sample_counts(source: Source, what: str) -> np.ndarray:
    """``n_i`` of every client; raises ``ValueError`` (``what`` needs sample-level data) if the source has none."""
    n = source.n_samples
    if n is None:
        raise ValueError(f"{what}: {_NO_SAMPLES}")
    return np.asarray(n)


def check_batch_size(source: Source, clients, S: int, name: str) -> None:
    """Raise ``ValueError`` if a batch of ``S`` samples is larger than a client's local dataset."""
    n = sample_counts(source, name)[clients]
    if np.any(S > n):
        i = int(np.asarray(clients)[np.argmax(S > n)])
        raise ValueError(f"{name}={S} is larger than client {i}'s local dataset (n_i={int(n[np.argmax(S > n)])})")


# ================================================================================================ conformance


def check_source(source: Source, w, clients, rng: np.random.Generator, *, batch_size: int | None = None,
                 rtol: float = 1e-10) -> None:
    """Check ``source`` against the :class:`Source` contract at the point ``w`` (``(n_w,)``, any array) for
    ``clients``; raises ``AssertionError`` naming the first violation.

    Checked: the attributes and their shapes; ``asarray`` and ``to_host`` (of a small array); ``losses`` and ``evaluate``
    shapes and dtypes (float64 host), equal population losses from both; the Gram symmetric with a non-negative
    diagonal; ``combine`` returns the source's array type on the parameters' device with shape ``(n, n_w)``, is
    linear in ``μ`` and satisfies ``‖combine(μ)‖² = μᵀCμ`` and ``combine(e_j)ᵀcombine(e_k) = C_jk`` (relative to
    ``max_j C_jj``, within ``rtol``: 1e-10 suits float64 sources, about 1e-5 float32 ones); with ``batch_size``,
    episodes are distinct in-range indices and minibatch evaluations have the same contract."""
    def need(cond, msg):
        if not cond:
            raise AssertionError(f"{type(source).__name__}: {msg}")

    need(isinstance(source, Source), "does not implement the Source protocol (see sim.source)")
    N, n_w, m = int(source.n_clients), int(source.n_params), int(source.n_objectives)
    prefs = np.asarray(source.prefs)
    need(prefs.shape == (N, m) and prefs.dtype == np.float64, f"prefs must be float64 (N, m) = ({N}, {m})")
    need(np.asarray(source.psi_star).shape == (N,), f"psi_star must have shape ({N},)")
    clients = check_clients(source, clients)
    n = clients.size
    w_x = source.asarray(w)
    xp = array_namespace(w_x)
    need(tuple(w_x.shape) == (n_w,), f"asarray(w) must have shape ({n_w},); got {tuple(w_x.shape)}")
    host = source.to_host(xp.stack([xp.min(w_x), xp.max(w_x)]))
    need(isinstance(host, np.ndarray) and host.dtype == np.float64 and host.shape == (2,),
         "to_host must return a float64 numpy array of the array's shape")
    W = xp.asarray(xp.broadcast_to(w_x, (n, n_w)), copy=True)
    l = source.losses(W, clients)
    need(isinstance(l, np.ndarray) and l.dtype == np.float64 and l.shape == (n, m),
         f"losses must return float64 numpy (n, m) = ({n}, {m})")
    batch_sets: list[list[np.ndarray] | None] = [None]
    if batch_size is not None:
        counts = sample_counts(source, "check_source(batch_size=...)")
        episodes = []
        for i in clients:
            idx = np.asarray(source.episode(rng, int(i), batch_size))
            need(idx.shape == (batch_size,) and idx.dtype.kind in "iu", f"episode must return {batch_size} integers")
            need(np.unique(idx).size == batch_size and idx.min() >= 0 and idx.max() < counts[i],
                 f"episode of client {int(i)} must hold distinct indices in [0, {int(counts[i]) - 1}]")
            episodes.append(idx)
        batch_sets.append(episodes)
    for batches in batch_sets:
        what = "population" if batches is None else "minibatch"
        ev = source.evaluate(W, clients, batches)
        need(isinstance(ev, Evaluation), f"evaluate ({what}) must return an Evaluation")
        L, C = ev.losses, ev.gram
        need(isinstance(L, np.ndarray) and L.dtype == np.float64 and L.shape == (n, m),
             f"{what} losses must be float64 numpy (n, m)")
        need(isinstance(C, np.ndarray) and C.dtype == np.float64 and C.shape == (n, m, m),
             f"{what} gram must be float64 numpy (n, m, m)")
        need(bool(np.all(np.isfinite(L)) and np.all(np.isfinite(C))), f"{what} losses and gram must be finite here")
        if batches is None:
            need(np.allclose(L, l, rtol=rtol, atol=0), "evaluate(batches=None).losses must equal losses()")
        need(np.array_equal(C, np.swapaxes(C, -1, -2)), f"{what} gram must be exactly symmetric")
        diag = np.diagonal(C, axis1=-2, axis2=-1)
        need(bool(np.all(diag >= 0)), f"{what} gram must have a non-negative diagonal")
        scale = np.maximum(diag.max(axis=-1), np.finfo(np.float64).tiny)
        mu = rng.dirichlet(np.ones(m), size=n)
        nu = rng.dirichlet(np.ones(m), size=n)
        d = ev.combine(mu)
        need(array_namespace(d) is xp and tuple(d.shape) == (n, n_w),
             f"combine must return ({n}, {n_w}) arrays of the parameters' namespace")
        need(device(d) == device(w_x), "combine must return arrays on the parameters' device")
        lin = source.to_host(xp.linalg.vector_norm(ev.combine(0.3 * mu + 0.7 * nu)
                                                   - (0.3 * d + 0.7 * ev.combine(nu)), axis=1))
        dn = source.to_host(xp.linalg.vector_norm(d, axis=1))
        need(bool(np.all(lin <= rtol * np.sqrt(scale))), f"{what} combine must be linear")
        quad = np.einsum("nj,njk,nk->n", mu, C, mu)
        need(bool(np.all(np.abs(dn**2 - quad) <= rtol * scale)), f"{what}: ‖combine(μ)‖² must equal μᵀCμ")
        for j in range(m):
            e_j = np.zeros((n, m))
            e_j[:, j] = 1.0
            g_j = ev.combine(e_j)
            for k in range(m):
                e_k = np.zeros((n, m))
                e_k[:, k] = 1.0
                c_jk = source.to_host(xp.sum(g_j * ev.combine(e_k), axis=1))
                need(bool(np.all(np.abs(c_jk - C[:, j, k]) <= rtol * scale)),
                     f"{what} gram[:, {j}, {k}] must equal combine(e_{j})ᵀcombine(e_{k})")
