r"""A torch source at the kernel boundary of Algorithm 1 (:mod:`sim.source`), and its LoRA objectives.

:class:`TorchSource` implements the :class:`sim.source.Source` protocol with ``Array = torch.Tensor``: every
client's parameters are one flat row (float32 or float64, on the model's device), and per call it asks its
*objectives* (a :class:`ClientObjectives`) for each client's loss vector ``l_c`` (m, float64 host) and
per-objective gradients ``G_c`` (n_w × m, on the device), stacks ``G`` ``(n, n_w, m)`` on the device, forms the
Gram ``C_c = G_cᵀG_c`` in float64 on the device and returns it with the losses to the host; ``combine(μ)`` is
``einsum("nwm,nm->nw", G, μ)`` on the device. Nothing of Algorithm 1 is here: the LP, β, A, ψ, ρ, d̄, Δ_i,
H_Cn, the H.19 margins, ``d_M``, the clustering and every update come from :mod:`sim.algorithm` through
:func:`sim.algorithm.run_algorithm`, which does the parameter arithmetic with torch through the array API.

**The loss vector Algorithm 1 sees is the excess over the floor.** The conservative-DPO loss ``l_j`` of an
objective is ``ln 2`` when the model is indifferent and never below its floor ``H(ε)``; the theory's losses are
positive functions whose ray ``λ_j l_j = const`` the LP steers onto (H.1–3). On the raw losses that ray asks the
least-weighted objective for ``l_j ≥ H(ε)·λ_max/λ_min``, above ``ln 2`` for most preferences: reaching it means
learning that objective's *rejected* responses. :class:`LoraObjectives` therefore hands Algorithm 1 the excess
losses ``l_j − H(ε)`` (its ``reference_point``, the floor): positive wherever the floor guard has not fired,
``ln 2 − H(ε)`` at the base model, and on their ray every objective improves on ``ln 2``, the more the larger its
``λ_j``. ψ, β, A, the LP and every record column of :mod:`sim.algorithm` are computed from the excess losses;
the ``loss_<objective>`` columns hold the raw losses (excess + ``reference_point``).

:class:`LoraObjectives` are the objectives of an LLM run: client ``c``'s row is copied into the LoRA
parameters of one :class:`~llm_runs.training.objectives.PreferenceModel` (a device-to-device copy) and
:func:`llm_runs.training.objectives.objective_gradients` computes ``l`` and ``G`` on the client's pairs of each objective
(:class:`llm_runs.preferences.clients.Federation`; a batch of sample indices picks those pairs). A loss that is not finite
or reaches its floor ``H(ε)`` within round-off raises :class:`~llm_runs.training.objectives.ObjectiveLossError` naming the
objective and the client; :mod:`sim.algorithm` re-raises it as a ``DivergenceError`` that adds the phase, round
and step.

**Record columns.** :meth:`TorchSource.record_metrics` (the optional member of the protocol) adds to every
record row the population loss of each objective (``loss_<objective>``) and, when the objectives have held-out
pairs, the held-out loss and preference accuracy of each objective at the row's parameters
(``heldout_loss_<objective>``, ``heldout_acc_<objective>``; rows with equal parameters, e.g. a cluster at its
server model, are evaluated once). The population-diagnostic rows of the federated phases also carry each client's
Gram and LP weights (``gram_<j>_<k>``, ``mu_<j>``; :mod:`sim.source`, ``record_lp_inputs``).

**Timing.** A :class:`StepTimer` accumulates the wall-clock time of each part of a step: ``forward`` (losses),
``backward`` (gradients), ``gram`` (``GᵀG`` in float64 and its transfer), ``lp`` (host time from the Gram's
return to the first ``combine`` of that evaluation: the algorithm's input checks and the batched LP solve),
``combine`` (``d = G μ``) and ``heldout`` (held-out evaluation). On CUDA each section ends with a device
synchronisation (one per section, never one per parameter), so the times are those of the work itself.
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from llm_runs.training.objectives import (
    ObjectiveLossError,
    PreferenceModel,
    objective_gradients,
    objective_losses,
)

__all__ = [
    "ClientObjectives",
    "default_layout",
    "LoraObjectives",
    "StepTimer",
    "TorchEvaluation",
    "TorchSource",
    "peak_memory",
]


class StepTimer:
    """Accumulated seconds and call counts per section; ``device``: CUDA sections end with a synchronisation."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def section(self, name: str):
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)
        self.calls[name] = self.calls.get(name, 0) + 1

    def report(self) -> dict:
        """``{section: {"seconds", "calls", "mean_seconds"}}``."""
        return {k: {"seconds": v, "calls": self.calls[k], "mean_seconds": v / self.calls[k]}
                for k, v in self.seconds.items()}


def peak_memory(device: torch.device | str = "cpu") -> dict:
    """Peak memory of this process: resident set size (bytes; ``ru_maxrss``) and, on CUDA, the peak allocated and
    reserved device memory (bytes)."""
    out = {"peak_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
    dev = torch.device(device)
    if dev.type == "cuda":
        out["cuda_peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(dev))
        out["cuda_peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(dev))
    return out


@runtime_checkable
class ClientObjectives(Protocol):
    """Per-client losses and gradients of ``m`` objectives over a flat parameter vector (rows of a TorchSource).

    ``losses(w, client)``: the population (all local data) losses ``(m,)`` float64 at the row ``w`` ``(n_w,)``;
    ``gradients(w, client, batch)``: losses ``(m,)`` float64 and gradients ``G`` ``(n_w, m)`` (a tensor on the
    device) on the samples ``batch`` (``None``: all); ``metrics(w, client, losses)``: extra record columns at
    ``w`` (``{name: float}``), optional (may be absent)."""

    objectives: tuple[str, ...]
    n_params: int
    dtype: torch.dtype
    device: torch.device

    def losses(self, w: torch.Tensor, client: int, timer: StepTimer | None = None) -> np.ndarray: ...

    def gradients(self, w: torch.Tensor, client: int, batch, timer: StepTimer | None = None
                  ) -> tuple[np.ndarray, torch.Tensor]: ...


@dataclass(eq=False)
class TorchEvaluation:
    """Losses and Grams on the host; the gradients ``G`` ``(n, n_w, m)`` stay on the device."""

    losses: np.ndarray
    gram: np.ndarray
    G: torch.Tensor = field(repr=False)
    timer: StepTimer | None = field(default=None, repr=False)
    returned: float = field(default_factory=time.perf_counter, repr=False)
    _combined: bool = field(default=False, repr=False)

    def combine(self, weights) -> torch.Tensor:
        """``d_c = G_c μ_c`` for every row, ``(n, n_w)`` on the device (``weights`` ``(n, m)`` host)."""
        if self.timer is None:
            return self._combine(weights)
        if not self._combined:
            self.timer.add("lp", time.perf_counter() - self.returned)
            self._combined = True
        with self.timer.section("combine"):
            return self._combine(weights)

    def _combine(self, weights) -> torch.Tensor:
        mu = torch.as_tensor(np.asarray(weights, dtype=np.float64), dtype=self.G.dtype, device=self.G.device)
        return torch.einsum("nwm,nm->nw", self.G, mu)


def gram_float64(G: torch.Tensor) -> np.ndarray:
    """``GᵀG`` per row of ``G`` ``(n, n_w, m)``, formed in float64 on the device, exactly symmetrised, on the host.

    A Gram accumulated in float32 is not positive semi-definite to the float64 round-off that the LP's input
    check allows once the gradients nearly cancel (:mod:`sim.source`)."""
    Gd = G.to(torch.float64)
    C = (Gd.mT @ Gd).cpu().numpy()
    return 0.5 * (C + np.swapaxes(C, -1, -2))


class TorchSource:
    """The :class:`sim.source.Source` of ``objectives`` (a :class:`ClientObjectives`) for ``N`` clients.

    ``prefs`` ``(N, m)``; ``n_samples`` ``(N,)`` local dataset sizes; ``psi_star`` ``(N,)`` (NaN: unknown; an LLM
    run sets its estimate). ``progress(n)`` is called after each client's gradients (``n`` = 1), e.g. to advance a
    progress bar; ``timer`` collects the time of each part of a step. ``record_lp_inputs``: the records carry each
    client's Gram and LP weights at the population-diagnostic rows (:mod:`sim.source`), since the Grams of an LLM
    run are not kept otherwise (a reader re-classifies the LP basis from them, e.g. H.6)."""

    record_lp_inputs = True

    def __init__(self, objectives: ClientObjectives, prefs, n_samples, *, psi_star=None,
                 timer: StepTimer | None = None, progress: Callable[[int], None] | None = None):
        from sim.preference import check_preferences

        self.objectives = objectives
        self.prefs = check_preferences(np.asarray(prefs, dtype=np.float64), "prefs")
        N, m = self.prefs.shape
        if m != len(objectives.objectives):
            raise ValueError(f"prefs has {m} objectives, the objectives {len(objectives.objectives)}")
        ns = np.asarray(n_samples)
        if ns.shape != (N,) or ns.dtype.kind not in "iu" or np.any(ns < 1):
            raise ValueError(f"n_samples must be {N} integers >= 1; got {n_samples!r}")
        self.n_samples = ns.astype(np.int64)
        self.psi_star = np.full(N, np.nan) if psi_star is None else np.asarray(psi_star, dtype=np.float64).copy()
        if self.psi_star.shape != (N,):
            raise ValueError(f"psi_star must have shape ({N},); got {self.psi_star.shape}")
        self.timer = timer
        self.progress = progress
        self.observer: Callable | None = None
        self.gradient_evaluations = 0

    @property
    def n_clients(self) -> int:
        return int(self.prefs.shape[0])

    @property
    def n_params(self) -> int:
        return int(self.objectives.n_params)

    @property
    def n_objectives(self) -> int:
        return int(self.prefs.shape[1])

    # ---- Source protocol

    def asarray(self, x) -> torch.Tensor:
        """A new tensor of ``x`` in the parameters' dtype, on their device."""
        return torch.as_tensor(x, dtype=self.objectives.dtype, device=self.objectives.device).clone()

    def to_host(self, x) -> np.ndarray:
        return x.detach().to(torch.float64).cpu().numpy()

    def losses(self, W: torch.Tensor, clients: np.ndarray) -> np.ndarray:
        return np.stack([self.objectives.losses(W[c], int(i), self.timer) for c, i in enumerate(clients)])

    def evaluate(self, W: torch.Tensor, clients: np.ndarray, batches=None) -> TorchEvaluation:
        ls, Gs = [], []
        for c, i in enumerate(clients):
            batch = None if batches is None else np.asarray(batches[c])
            l, G = self.objectives.gradients(W[c], int(i), batch, self.timer)
            ls.append(l)
            Gs.append(G)
            self.gradient_evaluations += 1
            if self.progress is not None:
                self.progress(1)
        G = torch.stack(Gs)
        del Gs
        timer = self.timer
        with timer.section("gram") if timer is not None else contextlib.nullcontext():
            C = gram_float64(G)
        ev = TorchEvaluation(np.stack(ls).astype(np.float64), C, G, timer)
        if self.observer is not None:
            self.observer(W, clients, batches, ev)
        return ev

    def episode(self, rng: np.random.Generator, client: int, size: int) -> np.ndarray:
        n = int(self.n_samples[client])
        if size > n:
            raise ValueError(f"an episode of {size} samples is larger than client {client}'s local dataset ({n})")
        return np.sort(rng.choice(n, size=int(size), replace=False))

    # ---- optional record columns

    def record_metrics(self, W: torch.Tensor, clients: np.ndarray, losses: np.ndarray) -> dict[str, np.ndarray]:
        """Extra record columns of the rows ``W`` (see the module docstring): ``loss_<objective>``, the raw losses
        (``losses`` + the objectives' ``reference_point``), and the objectives' own ``metrics`` at each distinct
        row."""
        names = self.objectives.objectives
        ref = float(getattr(self.objectives, "reference_point", 0.0))
        out = {f"loss_{o}": np.asarray(losses[:, j], dtype=np.float64) + ref for j, o in enumerate(names)}
        metrics = getattr(self.objectives, "metrics", None)
        if metrics is None:
            return out
        seen: list[tuple[torch.Tensor, dict]] = []
        rows = []
        for c in range(W.shape[0]):
            hit = next((m for w, m in seen if torch.equal(w, W[c])), None)
            if hit is None:
                hit = metrics(W[c], self.timer)
                seen.append((W[c], hit))
            rows.append(hit)
        for k in rows[0]:
            out[k] = np.array([r[k] for r in rows], dtype=np.float64)
        return out


def default_layout(device) -> str:
    """The gradient layout of :func:`objective_gradients` for ``device``: ``"sequence"`` on a CPU (one forward and
    backward per distinct sequence: the objectives' pairs share their responses, and a CPU gains nothing from
    batching them; ``tests/llm_runs/test_llm_bench.py`` compares the layouts), ``"separate"`` on a GPU (each objective's
    pairs in one batch, which a GPU runs in about the time of one sequence)."""
    return "sequence" if torch.device(device).type == "cpu" else "separate"


class LoraObjectives:
    """The m per-objective conservative-DPO losses of every client of a :class:`~llm_runs.preferences.clients.Federation` over
    the LoRA parameters of ``pm`` (see the module docstring); ``layout``: see :func:`objective_gradients` (default:
    :func:`default_layout` of the model's device). ``losses`` and ``gradients`` return the excess losses
    ``l_j − reference_point`` with ``reference_point = H(ε)``, the floor of the loss; ``min_losses`` tracks the raw
    losses. Population losses are computed in the gradients' layout and precision
    (:func:`~llm_runs.training.objectives.objective_losses`), held-out metrics in float32."""

    def __init__(self, pm: PreferenceModel, federation, *, layout: str | None = None, heldout: bool = True):
        self.pm = pm
        self.federation = federation
        self.objectives = tuple(federation.objectives)
        self.layout = layout or default_layout(pm.device)
        self.n_params = pm.n_params
        self.dtype = pm.dtype
        self.device = pm.device
        self.heldout = federation.heldout_batches() if heldout else None
        self.min_losses = np.full(len(self.objectives), np.inf)  # the smallest raw loss of each objective computed
        #: what Algorithm 1's loss vector is measured from: the excess losses l_j - H(eps) are handed to it
        self.reference_point = float(pm.settings.floor)

    def initial(self) -> torch.Tensor:
        """The model's current LoRA parameters as one flat row (at the LoRA initialisation: the base model)."""
        return self.pm.flat_params().clone()

    def load(self, w: torch.Tensor) -> None:
        """Copy the row ``w`` into the LoRA parameters (on the device)."""
        if tuple(w.shape) != (self.n_params,):
            raise ValueError(f"a parameter row must have shape ({self.n_params},); got {tuple(w.shape)}")
        with torch.no_grad():
            for p, chunk in zip(self.pm.params, torch.split(w.detach(), self.pm.sizes), strict=True):
                p.copy_(chunk.view_as(p))

    def _named(self, client: int, exc: ObjectiveLossError) -> ObjectiveLossError:
        return ObjectiveLossError(exc.objective, exc.value, exc.floor, exc.reason, client=client)

    def losses(self, w: torch.Tensor, client: int, timer: StepTimer | None = None) -> np.ndarray:
        self.load(w)
        with timer.section("forward") if timer else contextlib.nullcontext():
            out = objective_losses(self.pm, self.federation.batch(client), layout=self.layout)
        for o, v in zip(self.objectives, out, strict=True):
            try:
                self.pm.check_loss(o, float(v))
            except ObjectiveLossError as exc:
                raise self._named(client, exc) from None
        np.minimum(self.min_losses, out, out=self.min_losses)
        return out - self.reference_point

    def gradients(self, w: torch.Tensor, client: int, batch, timer: StepTimer | None = None
                  ) -> tuple[np.ndarray, torch.Tensor]:
        self.load(w)
        try:
            res = objective_gradients(self.pm, self.federation.batch(client, batch), layout=self.layout, timer=timer,
                                      gram=False)
        except ObjectiveLossError as exc:
            raise self._named(client, exc) from None
        np.minimum(self.min_losses, res.losses, out=self.min_losses)
        return res.losses - self.reference_point, res.G

    def metrics(self, w: torch.Tensor, timer: StepTimer | None = None) -> dict[str, float]:
        """Held-out loss and preference accuracy of every objective at ``w`` (nothing without held-out pairs)."""
        if not self.heldout:
            return {}
        self.load(w)
        with timer.section("heldout") if timer else contextlib.nullcontext():
            ev = self.pm.evaluate(self.heldout)
        out = {}
        for o in self.objectives:
            out[f"heldout_loss_{o}"] = ev[o]["loss"]
            out[f"heldout_acc_{o}"] = ev[o]["accuracy"]
        return out
