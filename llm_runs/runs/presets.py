r"""The presets of an LLM run (:data:`PRESETS`, ``python -m llm_runs run --preset NAME``), what a run of one
trains on and how many gradient evaluations it makes, and the check of a data file against one
(:func:`data_check`, ``python -m llm_runs data check PATH``).

A :class:`RunPreset` is the whole configuration of a run: the clients' design (:mod:`llm_runs.preferences.clients`),
Algorithm 1's configuration (:mod:`sim.algorithm`), the model's LoRA and precision, the conservative-DPO settings,
and the optional evaluations (generation rewards, personalisation, the shots curve of :mod:`llm_runs.runs.shots`).
The run itself is :func:`llm_runs.runs.run.run`.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from llm_runs.model.generate import GenerationSettings
from llm_runs.preferences.clients import ClientDesign, Federation, build_federation
from llm_runs.preferences.heldout import SHOTS_CLIENTS
from llm_runs.runs.evaluation import GenerationEval
from llm_runs.runs.shots import ShotsEval
from sim import cli
from sim.algorithm import (
    AdaptConfig,
    AlgorithmConfig,
    ClusterConfig,
    Phase1Config,
    Phase2Config,
    Pipeline2Config,
)

__all__ = ["AUTOCAST_CHOICES", "BF16_EXTENSIONS", "OBJECTIVES_3", "OBJECTIVES_4", "OBJECTIVES_CANDIDATES", "PRESETS",
           "QUICK_GENERATION", "SHRUNK_RESPONSE_TOKENS", "SHOTS_MIN_OBJECTIVES", "GateAdmission", "PersonalisationEval",
           "RunPreset", "data_check", "describe", "federation",
           "phase1_evaluations", "planned_gradient_evaluations", "resolve_autocast", "training_candidates"]

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
#: The positive-control gate chose among them: only formality passed its first round; its second round passed
#: formality, positivity and readability (``reports/llm-gate/``), which ``--gate`` admits to the shots presets.
OBJECTIVES_CANDIDATES = ("positivity", "second_person", "formality", "density")
#: The shots curve is pre-registered for at least three objectives that conflict (docs llm-study.md, "The
#: positive-control gate"): a preset with ``shots`` refuses fewer (:attr:`RunPreset.min_objectives`).
SHOTS_MIN_OBJECTIVES = 3


@dataclass(frozen=True)
class GateAdmission:
    """The positive-control gate that admitted a run's objectives (``--gate DIR`` of ``python -m llm_runs run`` and
    ``sweep``, checked by :func:`llm_runs.sweeps.gate.admit`): the gate folder (resolved), the SHA-256 of its
    ``gate.json`` and the objectives that passed it, in the gate's order. Part of the preset's configuration, so
    a run's ``summary.json`` and a sweep's ``params.json`` and ``llm_sweep.json`` record it (``preset_config.gate``);
    the run itself does not use it."""

    path: str
    sha256: str
    passed: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "passed", tuple(self.passed))


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
      (:meth:`~llm_runs.training.objectives.PreferenceModel.grouped_pair_losses`);
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
    (:class:`llm_runs.training.objectives.DPOSettings`); ``autocast``: ``"bfloat16"`` or None (float32) for the forward and
    backward passes; ``lora_r``/``lora_alpha``: the adapter; ``algorithm``: Algorithm 1's configuration;
    ``psi_star``: the Pipeline-2 run that estimates ``ψ_i*`` of every client before training;
    ``clustering_draws``: after Algorithm 1, Phase 1 is trained again for the Stage-1-only clusters and for this
    many random partitions with the Stage-1+2 cluster sizes (Remark H.8's comparison, ``clusterings.csv``); None:
    no comparison; ``generation``: responses sampled from every model of the run and scored by the objectives'
    rewards (``generations.csv``, :mod:`llm_runs.runs.evaluation`); None: none; ``personalisation``: the evaluation of
    :class:`PersonalisationEval`; None: none; ``shots``: the shots curve's evaluation (:mod:`llm_runs.runs.shots`:
    the separable federation on the study side, Algorithm 1 on the training clients, every method at every budget
    of :class:`~llm_runs.runs.shots.ShotsEval`); None: none; ``gate``: the positive-control gate that admitted the
    design's objectives (:class:`GateAdmission`, set by ``--gate``); None: the run was not gated (and its
    configuration, :meth:`to_dict`, has no ``gate`` entry)."""

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
    gate: GateAdmission | None = None
    template: str = field(default="", repr=False)

    def __post_init__(self):
        # the description states the configuration's numbers: a description with fields is a template (kept in
        # ``template``), rendered from the configuration here and again for every variant (quick, shrunk, other
        # objectives: ``replace`` passes the template on), so that no number can drift from the configuration's
        if "{" in self.description or not self.template:
            object.__setattr__(self, "template", self.description)
        object.__setattr__(self, "description", describe(self.template, self))
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
        if self.gate is not None and not set(self.design.objectives) <= set(self.gate.passed):
            raise ValueError(f"RunPreset {self.name!r}: objectives {list(self.design.objectives)} are not all among "
                             f"those that passed the gate {self.gate.path!r} ({list(self.gate.passed)})")

    @property
    def min_objectives(self) -> int:
        """The fewest objectives the design needs: :data:`SHOTS_MIN_OBJECTIVES` for the shots curve, 2 otherwise
        (:class:`~llm_runs.preferences.clients.ClientDesign`)."""
        return SHOTS_MIN_OBJECTIVES if self.shots is not None else 2

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
        """The configuration as recorded (``preset_config``); an ungated preset has no ``gate`` entry, so the folders
        of sweeps made before gates existed stay resumable."""
        d = asdict(self)
        d["algorithm"] = self.algorithm.to_dict()
        del d["template"]  # the description is its rendering
        if self.gate is None:
            del d["gate"]
        return d


class _Stated(string.Formatter):
    """:func:`describe`'s formatter: a field ``{x:~noun}`` renders as ``"1 noun"`` or ``"N nouns"``."""

    def format_field(self, value, format_spec):
        if format_spec.startswith("~"):
            noun = format_spec[1:]
            return f"{value} {noun if value == 1 else noun + 's'}"
        return super().format_field(value, format_spec)


def describe(template: str, preset: RunPreset) -> str:
    """``template`` with its fields (``str.format`` syntax, ``{x:~noun}`` for a count with its noun) taken from
    ``preset``'s configuration: ``p`` the preset, ``d`` its design, ``a`` its algorithm, ``g`` its generation
    evaluation, ``s`` its shots evaluation, ``T`` the response length, ``m`` the number of objectives, ``pool`` a
    shots client's pool (the largest budget), ``budgets`` the shots budgets as a list, ``per_centre`` the new
    clients per preference centre (``"3 per centre"``, or ``"over 2 centres"`` when they do not divide evenly) and
    ``one_per_objective`` (``" (one per objective)"`` when there are as many centres as objectives). Every number a
    preset's description states is such a field (tests/llm_runs/test_llm_presets.py)."""
    d, s = preset.design, preset.shots
    per = (f"{d.n_new // d.n_centres} per centre" if d.n_new % d.n_centres == 0 else f"over {d.n_centres} centres")
    return _Stated().format(template, p=preset, d=d, a=preset.algorithm, g=preset.generation, s=s,
                            T=preset.max_response_tokens, m=d.m, pool=None if s is None else max(s.budgets),
                            budgets=None if s is None else ", ".join(map(str, s.budgets)), per_centre=per,
                            one_per_objective=" (one per objective)" if d.n_centres == d.m else "")


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
        description="every code path in a few minutes on 2 CPU cores: {d.n_train:~training client} around "
                    "{d.n_centres:~preference centre} and {d.n_new:~new client}, {d.shots:~pair} per objective "
                    "({d.pool_pairs} in a new client's pool), responses cut at {T} tokens, {a.phase1.rounds:~round} "
                    "of Phase 1, {a.phase2.rounds} of Phase 2 and {a.fedavg.rounds} of FedAvg, "
                    "{a.adapt.K:~adaptation step}",
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
        description="a small study on 2 CPU cores (tens of minutes): {d.n_train:~training client} around "
                    "{d.n_centres:~preference centre} and {d.n_new:~new client}, {d.shots:~pair} per objective "
                    "({d.pool_pairs} in a new client's pool), responses cut at {T} tokens, "
                    "{a.phase1.rounds:~round} of Phase 1 and {a.fedavg.rounds} of FedAvg, {a.phase2.rounds} of "
                    "Phase 2 ({a.phase2.K:~inner step} on {a.phase2.S}-shot episodes), {a.adapt.K:~adaptation step}",
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
                    "{d.n_train:~training client} around {d.n_centres:~preference centre}{one_per_objective} and "
                    "{d.n_new:~new client} ({per_centre}), {d.shots:~pair} per objective ({d.pool_pairs} in a new "
                    "client's pool), responses cut at {T} tokens, {a.phase1.rounds:~round} of Phase 1 and "
                    "{a.fedavg.rounds} of FedAvg, {a.phase2.rounds} of Phase 2, {a.adapt.K:~adaptation step}; "
                    "{d.heldout_pairs:~held-out pair} per objective from at least {d.heldout_prompts:~prompt}, "
                    "margins of every personalised, local-only, FedAvg and the global uniform model; "
                    "{g.prompts:~prompt} x {g.settings.responses_per_prompt:~sample} of "
                    "{g.settings.max_new_tokens} tokens from the base and every personalised model",
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
        description="a GPU study (bf16): {d.n_train:~training client} around {d.n_centres:~preference centre} and "
                    "{d.n_new:~new client}, m = {m} objectives, {d.shots:~pair} per objective ({d.pool_pairs} in a "
                    "new client's pool), responses up to {T} tokens, {a.phase1.rounds:~round} of Phase 1 "
                    "({a.phase1.tau:~local step}) and {a.fedavg.rounds} of FedAvg, {a.phase2.rounds} of Phase 2 "
                    "({a.phase2.K:~inner step} on {a.phase2.S}-shot episodes), {a.adapt.K:~adaptation step} on "
                    "{a.adapt.S}-shot batches",
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
#: What the shots presets run, stated from their configuration (:func:`describe`).
_SHOTS_DESIGN = ("separable pairs on the study side, {d.n_train:~training client} of {d.shots:~pair} per objective "
                 "around {d.n_centres:~preference centre} and {d.n_new:~new client} ({per_centre}) with pools of "
                 "{pool}, {d.heldout_pairs:~held-out pair} per objective from at least {d.heldout_prompts:~prompt}, "
                 "responses cut at {T} tokens; Algorithm 1 with {a.phase1.rounds:~round} of Phase 1 and "
                 "{a.fedavg.rounds} of FedAvg, {a.phase2.rounds} of Phase 2; per budget {budgets} pairs per "
                 "objective: Pipeline 1 from w_II and w_I, local-only and FedAvg adapted, {a.adapt.K:~full-batch "
                 "step} each, Pipeline 2 of {a.pipeline2.max_steps:~step}; the base, global and per-client oracle "
                 "models ({s.oracle_pairs:~pair} per objective, {s.oracle_steps:~AdamW step})")

#: The shots curve (llm_runs.runs.shots): the study preset's loss, model, LoRA and response length on the separable
#: federation, Algorithm 1 with training clients of 8 pairs per objective and 4 rounds of Phase 1 and FedAvg, every
#: method at every budget. Sizing (docs/llm-study.md, "The shots curve: the run"): 6 new clients (2 per centre: the
#: within-cluster contrast needs two), K = 2 full-batch steps, Pipeline 2 of 1 step, oracles of 16 pairs per
#: objective and 12 AdamW steps, 40 held-out pairs per objective; about 8,900 CPU-s a seed extrapolated from
#: SmolLM2-135M's measured costs (llm_runs.runs.shots.seed_cpu_seconds), so 10 seeds, two at a time, in about 12.4 h on
#: 2 cores (9 seeds take as long: 5 rounds of 2 cells either way). Measured since with the gate's instrument (docs
#: llm-study.md, "The curve's oracle at its own budget"; reports/llm-gate-curve-oracle/): oracles of this size (16
#: pairs per objective, 12 steps) register for formality only, not for positivity or readability.
PRESETS["shots"] = replace(
    PRESETS["study"],
    name="shots",
    description="the shots curve, one seed (llm_runs.runs.shots; analysed by verification.llm.shots; seeds as cells of "
                "`python -m llm_runs sweep`): " + _SHOTS_DESIGN + "; no generation",
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
#: :func:`llm_runs.runs.shots.seed_gpu_seconds` for the random 0.5b Llama (478 M parameters, sequences of at most 111
#: tokens): about 7.8 minutes a seed on one H200 at its assumed rates (docs/llm-study.md, "The shots curve on a
#: GPU"). Not yet run on a GPU.
PRESETS["shots-gpu"] = replace(
    PRESETS["shots"],
    name="shots-gpu",
    description="the shots curve on one GPU, one seed sized for a few minutes (bf16; llm_runs/gpu_check.sh --study; "
                "llm_runs.runs.shots.seed_gpu_seconds): " + _SHOTS_DESIGN + " in chunks of {s.max_pairs} pairs; no "
                "generation",
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
    (:func:`llm_runs.runs.shots.shots_federation`) for a preset with ``shots``, else
    :func:`~llm_runs.preferences.clients.build_federation` of its design. The run, its usage checks and the GPU check's preflight
    draw them here. Raises :class:`~llm_runs.preferences.clients.DataShortageError` where the data cannot give them."""
    if preset.shots is not None:
        from llm_runs.runs.shots import shots_federation

        return shots_federation(cands, preset, rng)
    return build_federation(cands, preset.design, rng)


def training_candidates(preset: RunPreset, tokenizer, data=None, columns=None):
    """The data ``data`` (default: the shipped file; else any ``--data`` of :func:`llm_runs.preferences.formats.load_data`, with
    the column mapping ``columns``) as ``preset`` trains on it: ``(full, trained)``, the file's candidates and their
    trained texts (:func:`llm_runs.preferences.data.trained_candidates`: every response cut at the preset's
    ``max_response_tokens`` by ``tokenizer``, the objectives' rewards recomputed on that text, or an annotated
    response longer than that left out). Raises the data file's errors (:func:`llm_runs.preferences.data.check_pairs`: an
    objective without any pair on the trained text), or :class:`~llm_runs.preferences.data.UnknownObjectiveError` for an
    objective the file lacks."""
    from llm_runs.preferences.data import check_pairs, trained_candidates
    from llm_runs.preferences.formats import load_data

    full = load_data(data, columns=columns, objectives=preset.design.objectives)
    objectives = full.check_objectives(preset.design.objectives)
    trained = trained_candidates(full, tokenizer, preset.max_response_tokens, objectives)
    check_pairs(trained, objectives, margin=preset.design.margin)
    return full, trained


def phase1_evaluations(preset: RunPreset) -> int:
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
        total += (1 + preset.clustering_draws) * phase1_evaluations(preset)
    if preset.shots is not None:  # the global model; the new clients adapt per budget (llm_runs.runs.shots)
        from llm_runs.runs.shots import shots_gradient_evaluations

        return total + federated(fa.rounds, fa.tau, fa.batch_size is not None) + shots_gradient_evaluations(preset)
    if n:
        total += (5 if a.adamw is not None else 4) * a.adapt.K * n + a.pipeline2.max_steps * n
    if preset.personalisation is not None:  # the global uniform model, and every training client at w_ref once
        total += federated(fa.rounds, fa.tau, fa.batch_size is not None) + N
    return total



# ---------------------------------------------------------------------------------------------------- the check


def data_check(path, *, columns=None, objectives=None, preset="smoke", tokenizer=None, seed: int = 0) -> dict:
    """What a run of ``preset`` (a name of :data:`llm_runs.runs.presets.PRESETS` or a :class:`~llm_runs.runs.presets.RunPreset`, e.g.
    a ``shrunk()`` one) on the data ``path`` would use, computed without a model (``data check PATH``):
    the schema, prompts and responses, per objective the pairs on the full text and on the trained text (responses
    cut at the preset's ``max_response_tokens`` by ``tokenizer``: :func:`~llm_runs.preferences.data.trained_candidates`), the
    within-prompt rank agreement of the objectives and each one's within-prompt Kendall τ with the length
    (:func:`~llm_runs.preferences.data.agreement_table` on the trained text), and the clients dealt at ``seed``
    (:func:`~llm_runs.preferences.clients.build_federation`). Raises :class:`~llm_runs.preferences.data.DataFileError` (one line) for
    every fault of :func:`~llm_runs.preferences.formats.load_data`, an objective without any pair on the trained text, a file too small for the
    preset's clients, and a prompt text on two sides of the train / held-out / evaluation split. JSON-able, with
    ``text``."""
    from dataclasses import replace

    from llm_runs.preferences.clients import DataShortageError
    from llm_runs.preferences.data import (
        DataFileError,
        agreement_table,
        check_pairs,
        preference_pairs,
        trained_candidates,
    )
    from llm_runs.preferences.formats import load_data, normalised_text
    from llm_runs.runs.evaluation import evaluation_prompts

    if isinstance(preset, str):
        if preset not in PRESETS:
            raise DataFileError(f"preset {preset!r} is not one of {', '.join(sorted(PRESETS))}")
        preset = PRESETS[preset]
    p = preset
    full = load_data(path, columns=columns, objectives=objectives)
    if objectives is None and full.labels == "rewards":
        objectives = p.design.objectives
    names = full.check_objectives(objectives if objectives is not None else full.objectives)
    if len(names) < 2:
        raise DataFileError(f"data file {full.path}: one objective ({names[0]}); a run needs at least two")
    design = replace(p.design, objectives=names)
    T = p.max_response_tokens
    if tokenizer is None:
        from llm_runs.model.tokenizer import smollm2_tokenizer

        tokenizer = smollm2_tokenizer()
    trained = trained_candidates(full, tokenizer, T, names)
    check_pairs(trained, names, margin=design.margin)
    try:
        fed = build_federation(trained, design, np.random.default_rng(seed))
    except DataShortageError as exc:
        raise DataFileError(f"preset {p.name}: {exc}") from None
    text_of = dict(zip(full.prompt_ids, full.prompts, strict=True))
    sides = {"held-out": list(fed.heldout_prompt_ids),
             "train": [pid for i in fed.train for pid in fed.prompt_ids[i]],
             "new clients": [pid for i in fed.new for pid in fed.prompt_ids[i]],
             "evaluation": [pid for pid, _ in evaluation_prompts(fed, full, max(1, len(full.prompt_ids)))
                            if pid not in fed.heldout_prompt_ids]}
    seen: dict[str, tuple[str, str]] = {}
    for side, ids in sides.items():
        for pid in ids:
            key = normalised_text(text_of[pid])
            if key in seen and seen[key][0] != side:
                raise DataFileError(f"data file {full.path}: prompt {pid!r} is {text_of[pid][:60]!r}, the text of "
                                    f"prompt {seen[key][1]!r} again, on both the {seen[key][0]} and the {side} side "
                                    f"of the split (seed {seed}): a prompt may appear once")
            seen.setdefault(key, (side, pid))
    table = agreement_table(trained, names, margin=design.margin)
    per = {}
    for o in names:
        lab = trained.scores_of(o)
        per[o] = {"pairs_full_text": len(preference_pairs(full, o, margin=design.margin)),
                  "pairs_trained_text": len(preference_pairs(trained, o, margin=design.margin)),
                  "responses_labelled": int(np.isfinite(lab).sum()),
                  "tau_with_length": table["objectives"][o]["tau_with_length"]}
    here = full.present_mask
    cut = int((here & ~trained.finished).sum()) if full.labels == "annotations" else int((~trained.finished).sum())
    used = sum(len(ids) for ids in sides.values() if ids is not sides["evaluation"])
    head = [f"data {full.path}: schema {full.header.get('schema', 'candidates (shipped kind)')}, labels "
            f"{full.labels}; {len(full.prompt_ids)} prompts, {int(here.sum())} responses "
            f"({int(here.sum(axis=1).min())}-{int(here.sum(axis=1).max())} per prompt); objectives {', '.join(names)}",
            f"preset {p.name}: responses cut at {T} tokens ({cut} of {int(here.sum())} longer"
            + ("; their labels are left out)" if full.labels == "annotations" else "; rewards recomputed on the cut "
               "text)") + f", pair margin {design.margin} within-prompt sd; seed {seed}: {len(fed.heldout_prompt_ids)} "
            f"held-out prompts, {used - len(fed.heldout_prompt_ids)} client prompts, {len(sides['evaluation'])} "
            f"prompts left for evaluation",
            "",
            f"{'objective':<20} {'pairs full':>10} {'trained':>8} {'labelled':>8} {'tau(length)':>11}"]
    for o, v in per.items():
        head.append(f"{o:<20} {v['pairs_full_text']:>10d} {v['pairs_trained_text']:>8d} {v['responses_labelled']:>8d} "
                    f"{v['tau_with_length']:>+11.2f}")
    return {"path": full.path, "schema": full.header.get("schema", "candidates"), "labels": full.labels,
            "objectives": list(names), "prompts": len(full.prompt_ids), "responses": int(here.sum()),
            "preset": p.name, "max_response_tokens": T, "responses_cut": cut, "per_objective": per,
            "agreement": {k: v for k, v in table.items() if k != "text"},
            "split": {k: len(v) for k, v in sides.items()}, "clients": fed.describe(),
            "text": "\n".join(head) + "\n\n" + table["text"]}
