r"""The shots curve's run: one seed of the ``shots`` preset (``python -m llm_runs sweep --preset shots --seeds A:B``)
writes the records that the pre-registered analysis :mod:`verification.llm.shots` reads.

**One seed** (:func:`llm_runs.runs.run.run` with a preset whose ``shots`` is a :class:`ShotsEval`):

1. the shots federation (:func:`llm_runs.preferences.heldout.build_shots_federation`) on the *study* side of
   :func:`llm_runs.preferences.clients.calibration_split`: training clients of ``design.shots`` separable pairs per objective,
   new clients with a pool of ``max(budgets)`` separable pairs per objective, one shared separable held-out set;
2. Algorithm 1 once (:func:`sim.algorithm.run_algorithm` on the training clients: clustering, Phase 1, Phase 2 and
   each cluster's FedAvg model), ``ψ̂_i*`` of the training clients only (the curve does not use a new client's), and
   the global uniform-preference model (FedAvg over every training client at ``λ = 1/m``, as the ``study`` preset);
3. each new client assigned to a cluster (:func:`sim.algorithm.assign_to_cluster`, at the base model);
4. the budget-free models, scored once: the base model, the global model, each cluster's FedAvg model, and per new
   client an *oracle* trained at its ``λ_i`` from the base model on ``oracle_pairs`` separable pairs per objective
   drawn from the prompts of all clients (never a held-out prompt), by the gate's training
   (:func:`llm_runs.runs.oracle.train_oracle`: ``oracle_steps`` full-batch AdamW steps of rate ``oracle_lr``);
5. per budget ``b`` (nested: the first ``b`` samples of every new client's pool, ``Federation.batch(i, range(b))``),
   from the same Algorithm-1 run and with the same ``K`` steps of :attr:`~sim.algorithm.AlgorithmConfig.adapt` on full batches
   of the ``b`` samples (``S = b``; every step sees all of them): Pipeline 1 from the cluster's ``w_II``
   (``pipeline1_wII``, the primary) and ``w_I`` (``pipeline1_wI``), local-only from the base model (``local``),
   the cluster's FedAvg model adapted as :func:`~sim.algorithm.run_algorithm` adapts it (its ``fedavg_adapt``: the
   same steps with the linear direction ``G_i λ_i``; ``fedavg``), and Pipeline 2 from ``w_II``
   (:func:`sim.algorithm.pipeline2` with :attr:`~sim.algorithm.AlgorithmConfig.pipeline2` on the ``b`` pairs; ``pipeline2``),
   each model scored on the held-out pairs.

Every phase is :mod:`sim.algorithm`'s; nothing here re-implements one. No model generates text (no generation
evaluation: so no baseline needs to generate either).

**Scores.** Every model is scored once on the shared held-out pairs
(:meth:`~llm_runs.training.objectives.PreferenceModel.grouped_pair_losses`, as the ``study`` preset scores): per objective
the share of pairs whose margin is positive, a margin within :data:`~llm_runs.training.objectives.TIE_ATOL` of 0 counting 1/2
(:func:`~llm_runs.training.objectives.pair_accuracy`), and the mean margin change against the base model (whose margins must
be exactly 0: a run where they are not fails). A client's λ-weighted score of any model is a reweighting of these,
so the cross table (the model of client ``k`` on client ``i``'s pairs) costs nothing.

**ψ and the secant.** ``psi0``/``psiK`` are the adaptation's records' ``ψ_i = max_j λ_ij l_ij`` at ``w_0`` and
``w_K`` on the client's ``b`` pairs per objective, with the losses Algorithm 1 sees (the excess conservative-DPO
losses ``l_j − H(ε)``, :mod:`llm_runs.training.source`). ``L0_hat`` is the largest secant
``‖g_{k+1} − g_k‖ / ‖w_{k+1} − w_k‖`` of ``g_k = λ_{ij*} ∇l_{ij*}(w_k)`` (``j*`` the active objective of ψ at
``w_k``) over the LoRA parameters: ``g_0 … g_{K−1}`` are the full-batch gradients the adaptation's own steps
compute (read from the source as it computes them), ``g_K`` costs one more gradient evaluation per client and
adaptation (``1/K`` of the adaptation's gradients). ``alpha``, ``p_minus``, ``p_plus``: the adaptation's step size
and clip range. Pipeline 2 (a different step rule, its best iterate kept) has no adaptation rows: the analysis
accepts a method recorded at every (client, budget) or at none.

**Files** (in the run directory, appended as the run goes; a killed cell's directory is removed and the seed run
again from the start by the sweep, :func:`llm_runs.sweeps.sweep.llm_cell`): the analysis' ``shots_clients.csv``,
``shots_scores.csv`` (every method of :data:`verification.llm.shots.METHODS` at every budget; ``base``,
``global`` and ``oracle`` repeated at each), ``shots_adaptation.csv``, ``shots_cross.csv`` (``pipeline1_wII``,
every ordered pair of distinct new clients of one cluster); and ``shots_models.csv``, the budget-free models' scores
(``model``: ``w_ref``, ``global_uniform``, ``w_fedavg`` per cluster — the unadapted FedAvg model, which the analysis'
methods do not hold —, ``oracle`` per client), and ``shots_trajectory.csv``, the record rows of every adaptation
with its ``budget``.

**Cost and sizing.** :func:`seed_work` counts one seed's work (gradient and loss evaluations in pairs per
objective, oracle steps, held-out scorings) and :func:`seed_cpu_seconds` prices it with the CPU costs measured for
SmolLM2-135M on a 2-core AMD EPYC at 16 tokens (:data:`SMOLLM2_CPU_SECONDS`): an extrapolation, not a measurement of
the curve itself (docs/llm-study.md, "The shots curve: the run"); :func:`seed_gpu_seconds` prices the same work for a
GPU from FLOP (``6 x parameters`` a token of a gradient evaluation, ``2 x`` of a forward pass) at an assumed
sustained rate plus host time per evaluation (:data:`GPU_ASSUMPTIONS`): the sizing of the ``shots-gpu`` preset
(docs/llm-study.md, "The shots curve on a GPU"), an estimate that no GPU has checked yet.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from verification.llm.shots import ADAPTATION, CLIENTS, COLUMNS, CROSS, METHODS, PRIMARY, SCORES

__all__ = ["GPU_ASSUMPTIONS", "ShotsEval", "SMOLLM2_CPU_SECONDS", "SMOLLM2_GRADIENT", "MODELS", "TRAJECTORY", "budget_federation",
           "gradient_cpu_seconds",
           "oracle_batches", "run_shots", "seed_cpu_seconds", "seed_gpu_seconds", "seed_work", "shots_federation",
           "shots_gradient_evaluations"]

MODELS = "shots_models.csv"
TRAJECTORY = "shots_trajectory.csv"
#: The oracle's pairs are drawn from ``numpy.random.default_rng([seed, ORACLE_STREAM])`` (not the run's generator:
#: the oracle's draw changes nothing else of the seed).
ORACLE_STREAM = 1

#: Adapting methods of the analysis -> the phase name of :func:`sim.algorithm.run_algorithm`'s run of it.
_PHASES = {"pipeline1_wII": "pipeline1_wII", "pipeline1_wI": "pipeline1_wI", "local": "local_only",
           "fedavg": "fedavg_adapt"}


@dataclass(frozen=True)
class ShotsEval:
    """The shots curve's evaluation (module docstring): the nested ``budgets`` (pairs per objective of a new
    client; its pool holds ``max(budgets)``), and the oracle: ``oracle_pairs`` separable pairs per objective,
    ``oracle_steps`` full-batch AdamW steps of rate ``oracle_lr`` at the client's ``λ_i``, a step's pairs forward and
    backward in chunks of at most ``max_pairs`` (all objectives together; None: one pass) with their gradients
    summed (:func:`llm_runs.runs.oracle.train_oracle`: the same step, in the memory of one chunk's activations)."""

    budgets: tuple[int, ...] = (1, 2, 4, 8, 16)
    oracle_pairs: int = 16
    oracle_steps: int = 16
    oracle_lr: float = 5e-4
    max_pairs: int | None = None

    def __post_init__(self):
        from llm_runs.preferences.heldout import _budgets

        object.__setattr__(self, "budgets", _budgets(self.budgets))
        for name in ("oracle_pairs", "oracle_steps", "max_pairs"):
            v = getattr(self, name)
            if v is None and name == "max_pairs":
                continue
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                none = " or None" if name == "max_pairs" else ""
                raise ValueError(f"ShotsEval.{name} must be an integer >= 1{none}; got {v!r}")
        if not (self.oracle_lr > 0 and math.isfinite(self.oracle_lr)):
            raise ValueError(f"ShotsEval.oracle_lr must be a finite number > 0; got {self.oracle_lr!r}")


def shots_federation(cands, preset, rng: np.random.Generator):
    """The seed's federation: :func:`~llm_runs.preferences.heldout.build_shots_federation` of ``preset.design`` with the
    budgets of ``preset.shots``, dealt from the study side of :func:`~llm_runs.preferences.clients.calibration_split`."""
    from llm_runs.preferences.clients import calibration_split
    from llm_runs.preferences.heldout import ShotsDesign, build_shots_federation

    design = ShotsDesign(preset.design, preset.shots.budgets)
    return build_shots_federation(cands, design, rng, prompt_ids=calibration_split(cands.prompt_ids)[1])


def oracle_batches(cands, fed, pairs: int, rng: np.random.Generator) -> dict[str, list]:
    """``pairs`` separable pairs per objective (:func:`~llm_runs.preferences.heldout.separable_pairs`) of the prompts of every
    client of ``fed`` (none held out): the oracles' training data, shared by every new client's oracle."""
    from llm_runs.preferences.clients import pairs_by_prompt
    from llm_runs.preferences.heldout import separable_pairs

    pools = pairs_by_prompt(cands, fed.objectives, fed.design.margin)
    ids = [pid for client in fed.prompt_ids for pid in client]
    merged = [[p for pid in ids for p in pools[pid][j]] for j in range(len(fed.objectives))]
    chosen = separable_pairs(merged, int(pairs), rng, objectives=fed.objectives, where="the oracles' pairs")
    return {o: list(p) for o, p in zip(fed.objectives, chosen, strict=True)}


def budget_federation(fed, budget: int):
    """``fed`` with every new client's data cut to its first ``budget`` samples (``budget`` pairs per objective:
    the nested budgets of :class:`~llm_runs.preferences.heldout.ShotsDesign`); training clients and held-out pairs unchanged.
    Raises ``ValueError`` for a budget larger than a new client's pool."""
    n_train = fed.design.n_train
    short = [int(i) for i in fed.new if fed.n_samples[i] < budget]
    if isinstance(budget, bool) or int(budget) != budget or budget < 1 or short:
        raise ValueError(f"budget {budget!r} must be an integer from 1 to every new client's pool "
                         f"({int(fed.n_samples[fed.new].min())} pairs per objective)")
    return replace(fed, data=tuple(d if i < n_train else tuple(p[:budget] for p in d) for i, d in enumerate(fed.data)))


def shots_gradient_evaluations(preset) -> int:
    """Client gradient evaluations (one client's m gradients) of the shots evaluation through the run's sources:
    per budget and new client, ``K`` steps of each of the 4 Pipeline-1 runs plus the secant's last gradient, and
    Pipeline 2's steps (the global model and the oracles are counted elsewhere)."""
    a, n = preset.algorithm, preset.design.n_new
    return len(preset.shots.budgets) * n * (4 * (a.adapt.K + 1) + a.pipeline2.max_steps)


# ------------------------------------------------------------------------------------------------ the cost


#: CPU seconds of SmolLM2-135M (float32, 16-token responses, 2-core AMD EPYC, 2026-12): one gradient evaluation
#: (forward and backward) over ``p`` preference pairs in all, measured at 3 pairs (a client of 1 pair per objective
#: of 3 objectives: 2.3 s), 16 pairs (a 16-pair oracle step: 150–170 s for 16 steps) and 64 (380–460 s for 16
#: steps); between the points linear, below 3 in proportion, above 64 with the last slope.
SMOLLM2_GRADIENT = ((3, 2.3), (16, 10.0), (64, 26.0))
#: The other measured costs: a forward pass only (the population losses) taken as a third of a gradient evaluation;
#: one held-out scoring (17 s for 300 pairs), per held-out pair; loading the model and the data.
SMOLLM2_CPU_SECONDS = {"forward_share": 1.0 / 3.0, "heldout_pair": 17.0 / 300, "model_load": 30.0}


def gradient_cpu_seconds(pairs, points=SMOLLM2_GRADIENT) -> float:
    """CPU seconds of one gradient evaluation over ``pairs`` pairs in all (:data:`SMOLLM2_GRADIENT`)."""
    x, y = np.array(points, dtype=np.float64).T
    p = float(pairs)
    if p <= x[0]:
        return y[0] * p / x[0]
    if p >= x[-1]:
        return y[-1] + (p - x[-1]) * (y[-1] - y[-2]) / (x[-1] - x[-2])
    return float(np.interp(p, x, y))


def seed_work(preset) -> dict[str, list[tuple[str, int, int]]]:
    """One seed's work per part: a list of ``(kind, pairs, count)``: ``count`` evaluations of kind ``gradient``
    (forward and backward) or ``forward`` (the population losses) over ``pairs`` pairs in all (every objective), or
    ``heldout`` scorings of one model over ``pairs`` held-out pairs. Counted from the configuration."""
    d, a, s = preset.design, preset.algorithm, preset.shots
    m, N, n, K = d.m, d.n_train, d.n_new, a.adapt.K
    fa = a.phase1 if a.fedavg is None else a.fedavg
    pop = m * d.shots

    def federated(cfg):  # per client a population gradient per round and at the end, and the batched local steps
        if cfg.batch_size is None:
            return [("gradient", pop, N * (cfg.rounds * cfg.tau + 1))]
        return [("gradient", pop, N * (cfg.rounds + 1)), ("gradient", m * cfg.batch_size, N * cfg.rounds * cfg.tau)]

    p2 = a.phase2
    phase2 = ([("gradient", pop, N * (p2.rounds * (p2.K + 1) + 1))] if p2.S is None else
              [("gradient", pop, N * (p2.rounds + 1)), ("gradient", m * p2.S, N * p2.rounds * p2.K)])
    adapt = []
    for b in s.budgets:
        adapt += [("gradient", m * b, n * (4 * (K + 1) + a.pipeline2.max_steps)),
                  ("forward", m * b, n * (4 * (K + 1) + 1))]
    models = 2 + d.n_centres + n + len(s.budgets) * n * 5
    return {
        "algorithm_1_and_global": [("gradient", pop, preset.psi_star.max_steps * N), *federated(a.phase1), *phase2,
                                   *federated(fa), *federated(fa)],
        "adaptations": adapt,
        "oracles": [("gradient", m * s.oracle_pairs, n * s.oracle_steps)],
        "heldout_scoring": [("heldout", m * d.heldout_pairs, models)],
    }


def seed_cpu_seconds(preset, points=SMOLLM2_GRADIENT, costs: dict[str, float] | None = None) -> dict[str, float]:
    """:func:`seed_work` priced by ``points`` and ``costs`` (default: SmolLM2-135M's, :data:`SMOLLM2_GRADIENT`,
    :data:`SMOLLM2_CPU_SECONDS`): CPU seconds per part, ``model_load`` and ``total``. An extrapolation from those
    measurements, not a measurement of the curve."""
    c = SMOLLM2_CPU_SECONDS if costs is None else costs
    price = {"gradient": lambda p: gradient_cpu_seconds(p, points),
             "forward": lambda p: c["forward_share"] * gradient_cpu_seconds(p, points),
             "heldout": lambda p: c["heldout_pair"] * p}
    out = {"model_load": float(c["model_load"])}
    for part, work in seed_work(preset).items():
        out[part] = float(sum(count * price[kind](pairs) for kind, pairs, count in work))
    out["total"] = float(sum(out.values()))
    return out


#: The assumptions of :func:`seed_gpu_seconds`, those of ``llm_runs/gpu_check.sh``'s estimate: a sustained
#: ``flop_per_s`` of 100 TFLOP/s in bf16 (about a tenth of an H200's dense bf16 peak, for batches of tens of sequences
#: of 100-200 tokens), ``host_per_gradient`` 0.2 s of host time (LP, Gram, Python, kernel launches) per client
#: gradient evaluation or oracle step, ``host_per_forward`` 0.05 s per forward-only evaluation (a client's population
#: losses, one model's held-out scoring), and ``start`` 90 s for everything before the first step (the preflight
#: about 20 s, building the random 0.5b Llama 25 s and loading it 9 s as measured on 2 CPU cores, the data at the
#: preset's response length, the sweep's one-worker Dask cluster and its imports). Not measured on a GPU.
GPU_ASSUMPTIONS = {"flop_per_s": 100e12, "host_per_gradient": 0.2, "host_per_forward": 0.05, "start": 90.0}


def seed_gpu_seconds(preset, params: float, tokens_per_sequence: float,
                     assumptions: dict[str, float] | None = None) -> dict[str, float]:
    """:func:`seed_work` priced for a GPU: seconds per part, ``start`` and ``total``, for a model of ``params``
    parameters whose sequences (prompt and response, as padded in a batch) hold ``tokens_per_sequence`` tokens, at
    :data:`GPU_ASSUMPTIONS` (or ``assumptions``). A pair is two sequences; a gradient evaluation costs
    ``6 x params`` FLOP per token (an upper bound: the frozen base needs no weight gradients, and the cached
    reference passes are forward only), a forward pass or a held-out scoring ``2 x params``; each evaluation adds
    its host time. An estimate from assumed rates, not a measurement (``llm_runs/gpu_check.sh --study`` prints the
    achieved ones)."""
    c = GPU_ASSUMPTIONS if assumptions is None else {**GPU_ASSUMPTIONS, **assumptions}
    flop = {"gradient": 6.0, "forward": 2.0, "heldout": 2.0}
    host = {"gradient": c["host_per_gradient"], "forward": c["host_per_forward"], "heldout": c["host_per_forward"]}
    out = {"start": float(c["start"])}
    for part, work in seed_work(preset).items():
        out[part] = float(sum(count * (flop[kind] * params * 2 * pairs * tokens_per_sequence / c["flop_per_s"]
                                       + host[kind]) for kind, pairs, count in work))
    out["total"] = float(sum(out.values()))
    return out


# ------------------------------------------------------------------------------------------------ the run


class _Secants:
    """An observer of a :class:`~llm_runs.training.source.TorchSource` (its ``observer``): per client, the largest secant
    ``‖g_{k+1} − g_k‖ / ‖w_{k+1} − w_k‖`` of the active objective's λ-weighted gradient over the evaluations it sees
    (module docstring), steps with ``w_{k+1} = w_k`` skipped."""

    def __init__(self, prefs: np.ndarray):
        self.prefs = prefs
        self.prev: tuple | None = None
        self.best: np.ndarray | None = None

    def __call__(self, W, clients, batches, ev) -> None:
        import torch

        lam = self.prefs[np.asarray(clients)]
        act = np.argmax(lam * ev.losses, axis=1)
        rows = torch.arange(len(act), device=ev.G.device)
        weight = torch.as_tensor(lam[np.arange(len(act)), act], dtype=ev.G.dtype, device=ev.G.device)
        g = (ev.G[rows, :, torch.as_tensor(act, device=ev.G.device)] * weight[:, None]).detach()
        if self.best is None:
            self.best = np.zeros(len(act))
        if self.prev is not None:
            w0, g0 = self.prev
            dw = (W.detach() - w0).double().norm(dim=1).cpu().numpy()
            dg = (g - g0).double().norm(dim=1).cpu().numpy()
            moved = dw > 0
            self.best[moved] = np.maximum(self.best[moved], dg[moved] / dw[moved])
        self.prev = (W.detach().clone(), g.clone())


def _scores(lobj, w, batches, beta: float) -> dict[str, np.ndarray]:
    """The held-out margins per objective of the model ``w`` (float64)."""
    pm = lobj.pm
    lobj.load(w)
    was_training = pm.model.training
    pm.model.eval()
    try:
        ev = pm.grouped_pair_losses(batches)
    finally:
        pm.model.train(was_training)
    return {o: z.numpy().astype(np.float64) for o, (_, z) in ev.items()}


def _summary(margins: dict[str, np.ndarray], base: dict[str, np.ndarray], beta: float) -> dict[str, tuple]:
    """Per objective ``(n_pairs, acc, z)``: the accuracy with ties 1/2 and the mean margin change against base."""
    from llm_runs.training.objectives import pair_accuracy

    out = {}
    for o, z in margins.items():
        change = z - base[o]
        out[o] = (len(change), float(np.mean(pair_accuracy(change / beta))), float(np.mean(change)))
    return out


def _psi(records, clients: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """``ψ`` at the first and the last iterate of an adaptation's records, per client in ``clients``' order."""
    r = records.set_index(["round", "client"])["psi"]
    return (np.array([r.loc[(0, int(i))] for i in clients], dtype=np.float64),
            np.array([r.loc[(K, int(i))] for i in clients], dtype=np.float64))


def run_shots(lobj, fed, cands, res, preset, *, seed: int, out: Path, w_ref, global_w, timer=None, progress=None,
              stage=None) -> dict[str, Any]:
    """The shots evaluation of one seed (module docstring, steps 3–5) after Algorithm 1's run ``res`` on the
    training clients of ``fed`` (the federation of :func:`shots_federation`) and the global model ``global_w``;
    writes the record files into ``out`` as it goes and returns the summary entry."""
    import pandas as pd
    import torch

    from llm_runs.runs.oracle import train_oracle
    from llm_runs.runs.records import RecordWriter
    from llm_runs.training.source import LoraObjectives, TorchSource
    from sim.algorithm import assign_to_cluster, local_only, pipeline1, pipeline2

    spec, a = preset.shots, preset.algorithm
    pm = lobj.pm
    beta = float(pm.settings.beta)
    out = Path(out)
    objectives = list(fed.objectives)
    new, N = fed.new, fed.n_clients
    n, K = len(new), a.adapt.K
    t0 = time.perf_counter()
    evaluations = 0

    def mark(name, done=0, total=1):
        if stage is not None:
            stage(name, done, total)

    full = TorchSource(lobj, fed.prefs, fed.n_samples, psi_star=np.zeros(N), timer=timer, progress=progress)
    assign = np.asarray(assign_to_cluster(full, new, w_ref, res.clustering, res.train_clients, key=a.cluster.key))
    rows = [{"seed": seed, "client": int(i), "cluster": int(assign[k]), "objective": o, "lam": float(fed.prefs[i, j])}
            for k, i in enumerate(new) for j, o in enumerate(objectives)]
    pd.DataFrame(rows, columns=COLUMNS[CLIENTS]).to_csv(out / CLIENTS, index=False)

    batches = fed.heldout_batches()
    models_w = RecordWriter(out / MODELS)
    scores_w, adapt_w, cross_w = (RecordWriter(out / name) for name in (SCORES, ADAPTATION, CROSS))
    traj_w = RecordWriter(out / TRAJECTORY)
    n_scored = 0
    cpu = {"heldout_scoring": 0.0, "oracles": 0.0, "adaptations": 0.0}  # CPU seconds of this process per part

    def score(w):
        nonlocal n_scored
        n_scored += 1
        c0 = time.process_time()
        with timer.section("shots_heldout") if timer is not None else _null():
            out = _scores(lobj, w, batches, beta)
        cpu["heldout_scoring"] += time.process_time() - c0
        return out

    mark("shots: budget-free models")
    base = score(w_ref)
    for o, z in base.items():
        if not np.all(z == 0.0):
            raise AssertionError(f"the base model's held-out margins of {o!r} are not exactly 0 (max |z| "
                                 f"{np.abs(z).max():.3g}): policy and reference were not the same computation")

    def model_rows(label, cluster, client, summ):
        return pd.DataFrame([{"model": label, "cluster": cluster, "client": client, "objective": o, "n_pairs": s[0],
                              "acc": s[1], "z": s[2]} for o, s in summ.items()])

    fixed: dict[str, list[dict]] = {}  # method -> per new client {objective: (n, acc, z)}
    base_s = _summary(base, base, beta)
    models_w(model_rows("w_ref", -1, -1, base_s))
    fixed["base"] = [base_s] * n
    glob_s = _summary(score(global_w), base, beta)
    models_w(model_rows("global_uniform", -1, -1, glob_s))
    fixed["global"] = [glob_s] * n
    for c in range(len(res.clustering.clusters)):
        models_w(model_rows("w_fedavg", c, -1, _summary(score(res.w_fedavg[c]), base, beta)))
    obatches = oracle_batches(cands, fed, spec.oracle_pairs, np.random.default_rng([int(seed), ORACLE_STREAM]))
    fixed["oracle"] = []
    oracle_loss = []
    for k, i in enumerate(new):
        mark("shots: oracles", k, n)
        lobj.load(w_ref)
        c0 = time.process_time()
        hist = train_oracle(pm, obatches, fed.prefs[i], steps=spec.oracle_steps, lr=spec.oracle_lr,
                            max_pairs=spec.max_pairs)
        cpu["oracles"] += time.process_time() - c0
        w = pm.flat_params().clone()
        oracle_loss.append([hist[0], hist[-1]])
        s = _summary(score(w), base, beta)
        models_w(model_rows("oracle", int(assign[k]), int(i), s))
        fixed["oracle"].append(s)

    assign_t = torch.as_tensor(assign, device=w_ref.device)
    starts = {"pipeline1_wII": res.w_II[assign_t], "pipeline1_wI": res.w_I[assign_t],
              "local": w_ref.expand(n, -1).clone(), "fedavg": res.w_fedavg[assign_t]}
    raised = 0
    for q, b in enumerate(spec.budgets):
        mark(f"shots: budget {b}", q, len(spec.budgets))
        fed_b = budget_federation(fed, b)
        lobj_b = LoraObjectives(pm, fed_b, layout=lobj.layout, heldout=False)
        src = TorchSource(lobj_b, fed.prefs, fed_b.n_samples, psi_star=np.zeros(N), timer=timer, progress=progress)
        src.record_lp_inputs = False
        every = np.broadcast_to(np.arange(b), (n, K, b)).copy()  # full batches: every step sees all b samples

        def sink(frame, b=b):
            traj_w(frame.assign(budget=b))

        adapted: dict[str, list] = {}
        for method, phase in _PHASES.items():
            cfg = replace(a.adapt, S=b, **({"direction": "linear"} if method == "fedavg" else {}))
            sec = _Secants(fed.prefs)
            src.observer = sec
            c0 = time.process_time()
            if method == "local":
                r = local_only(src, new, starts[method], cfg, batches=every, cluster=assign, keep_trajectory=False,
                               on_rows=sink)
            else:
                r = pipeline1(src, new, starts[method], cfg, batches=every, phase=phase, cluster=assign,
                              keep_trajectory=False, on_rows=sink)
            src.evaluate(r.w, new, every[:, 0, :])  # g_K, for the last secant
            src.observer = None
            cpu["adaptations"] += time.process_time() - c0
            psi0, psiK = _psi(r.records, new, K)
            raised += int(np.sum(psiK > psi0))
            adapt_w(pd.DataFrame({"seed": seed, "client": new.astype(int), "budget": b, "method": method,
                                  "psi0": psi0, "psiK": psiK, "alpha": float(cfg.alpha_adapt),
                                  "p_minus": float(cfg.p_minus), "p_plus": float(cfg.p_plus),
                                  "L0_hat": sec.best}, columns=COLUMNS[ADAPTATION]))
            adapted[method] = [_summary(score(r.w[k]), base, beta) for k in range(n)]
        c0 = time.process_time()
        r2 = pipeline2(src, new, starts["pipeline1_wII"], a.pipeline2, cluster=assign, keep_trajectory=False,
                       on_rows=sink)
        cpu["adaptations"] += time.process_time() - c0
        adapted["pipeline2"] = [_summary(score(r2.w[k]), base, beta) for k in range(n)]
        evaluations += src.gradient_evaluations
        by_method = {**adapted, **fixed}
        scores_w(pd.DataFrame([{"seed": seed, "client": int(i), "budget": b, "method": method, "objective": o,
                                "n_pairs": s[0], "acc": s[1], "z": s[2]}
                               for method in METHODS for k, i in enumerate(new)
                               for o, s in by_method[method][k].items()], columns=COLUMNS[SCORES]))
        cross_w(pd.DataFrame([{"seed": seed, "budget": b, "method": PRIMARY, "model_client": int(new[k]),
                               "pairs_client": int(i), "objective": o, "acc": s[1]}
                              for p, i in enumerate(new) for k in range(n) if k != p and assign[k] == assign[p]
                              for o, s in adapted[PRIMARY][k].items()], columns=COLUMNS[CROSS]))
    if cross_w.rows == 0:  # no cluster holds two new clients: the header alone, so every seed writes the file
        pd.DataFrame(columns=COLUMNS[CROSS]).to_csv(out / CROSS, index=False)
    return {
        "files": [CLIENTS, SCORES, ADAPTATION, CROSS, MODELS, TRAJECTORY],
        "budgets": list(spec.budgets), "methods": list(METHODS), "objectives": objectives,
        "new_clients": [{"client": int(i), "cluster": int(assign[k]), "prefs": fed.prefs[i].tolist(),
                         "centre": int(fed.centre[i])} for k, i in enumerate(new)],
        "heldout": {"pairs_per_objective": len(fed.heldout[0]), "prompts": list(fed.heldout_prompt_ids)},
        "oracle": {"pairs_per_objective": spec.oracle_pairs, "steps": spec.oracle_steps, "lr": spec.oracle_lr,
                   "max_pairs": spec.max_pairs,
                   "weighted_loss_first_last": oracle_loss,
                   "prompts": sorted({p.prompt_id for ps in obatches.values() for p in ps})},
        "adaptation": {"K": K, "batch": "full: every step on all b samples of the budget", "psi_raised": raised,
                       "fedavg": "the cluster's FedAvg model adapted as run_algorithm's fedavg_adapt (linear "
                                 "direction, the same steps, preconditioner and samples)",
                       "pipeline2": "sim.algorithm.pipeline2 from w_II on the b pairs (no adaptation rows)"},
        "models_scored": n_scored, "gradient_evaluations": int(evaluations),
        "seconds": time.perf_counter() - t0, "cpu_seconds": cpu,
        "generation": "none: no model of the shots preset generates text, so no baseline generates either",
    }


def _null():
    import contextlib

    return contextlib.nullcontext()
