"""The study preset's personalisation evaluation on the tiny random Llama: the held-out margins of every evaluated
model (the base model's exactly 0), H_Cn at the base model by partition, the global uniform-preference model, the
generation study restricted to the base and personalised models, and the pre-registered analysis reading it all
(:mod:`verification.llm.personalisation`)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_runs.model.models import save_random_llama  # noqa: E402
from llm_runs.preferences.clients import build_federation  # noqa: E402
from llm_runs.preferences.data import DEFAULT_DATA_FILE, load_candidates  # noqa: E402
from llm_runs.runs.evaluation import GenerationEval  # noqa: E402
from llm_runs.runs.presets import PRESETS, planned_gradient_evaluations  # noqa: E402
from llm_runs.runs.run import run  # noqa: E402
from verification.llm.personalisation import seed_statistics  # noqa: E402

N_TRAIN, N_NEW, PAIRS, PROMPTS, DRAWS = 3, 3, 8, 4, 3


def _preset():
    """The study preset with its phases cut to one round (``quick``), 3 training and 3 new clients, 8 held-out
    pairs per objective from at least 4 prompts, 3 random partitions and 8 generation prompts x 2 samples."""
    p = PRESETS["study"].quick()
    return replace(p, design=replace(p.design, n_train=N_TRAIN, n_new=N_NEW, heldout_pairs=PAIRS,
                                     heldout_prompts=PROMPTS),
                   generation=GenerationEval(
                       prompts=8, settings=replace(PRESETS["study"].generation.settings, responses_per_prompt=2)),
                   personalisation=replace(p.personalisation, hcn_draws=DRAWS))


@pytest.fixture(scope="module")
def study_run(tmp_path_factory):
    if not DEFAULT_DATA_FILE.exists():
        pytest.skip("the shipped data file is not built")
    model = save_random_llama(tmp_path_factory.mktemp("model") / "tiny", "tiny", dtype="float32")[0]
    out = tmp_path_factory.mktemp("study")
    summary = run(_preset(), out, model_dir=model, device="cpu", seed=5, progress=False)
    return out, summary


def test_held_out_pairs_come_from_at_least_the_prompts_asked_for():
    if not DEFAULT_DATA_FILE.exists():
        pytest.skip("the shipped data file is not built")
    design = PRESETS["study"].design
    fed = build_federation(load_candidates(), design, np.random.default_rng(0))
    assert len(fed.heldout_prompt_ids) >= design.heldout_prompts == 25
    assert all(len(p) == design.heldout_pairs == 100 for p in fed.heldout)
    assert {p.prompt_id for pairs in fed.heldout for p in pairs} <= set(fed.heldout_prompt_ids)


@pytest.mark.e2e
def test_every_evaluated_model_has_the_same_held_out_pairs_and_the_base_margins_are_zero(study_run):
    out, summary = study_run
    assert summary["status"] == "complete"
    t = pd.read_csv(out / "heldout_margins.csv")
    assert set(t["model"]) == {"w_ref", "w_fedavg", "global_uniform", "pipeline1_wII", "local_only"}
    base = t[t["model"] == "w_ref"]
    assert len(base) == 3 * PAIRS and (base["margin"] == 0.0).all()
    np.testing.assert_allclose(base["loss"], np.log(2.0), rtol=0, atol=0)
    key = ["objective", "pair", "prompt_id"]
    ref = base[key].sort_values(key).to_numpy()
    for (label, client, _cluster), g in t.groupby(["model", "client", "cluster"]):
        np.testing.assert_array_equal(g[key].sort_values(key).to_numpy(), ref, err_msg=f"{label} {client}")
    adapted = t[t["model"].isin(["pipeline1_wII", "local_only"])]
    assert sorted(set(adapted["client"])) == list(range(N_TRAIN, N_TRAIN + N_NEW))
    assert (t[t["model"] != "w_ref"]["margin"].abs() > 0).any()  # the trained models moved
    p = summary["personalisation"]
    assert len(p["heldout"]["prompts"]) >= PROMPTS and p["heldout"]["pairs_per_objective"] == PAIRS
    assert [c["client"] for c in p["new_clients"]] == list(range(N_TRAIN, N_TRAIN + N_NEW))


@pytest.mark.e2e
def test_hcn_at_the_base_model_for_each_partition(study_run):
    _, summary = study_run
    h = summary["personalisation"]["hcn_at_w_ref"]
    assert len(h["random"]) == DRAWS and all(v >= 0 for v in h["random"])
    assert h["stage1_stage2"] >= 0 and h["stage1_only"] >= 0
    assert [c["clustering"] for c in h["clusterings"]] == ["stage1_stage2", "stage1_only"] + ["random"] * DRAWS
    # the Stage-1+2 value is Phase 1's own round-0 dispersion of those clusters (the same evaluation at w_ref)
    assert isinstance(h["stage1_only_same_partition"], bool)


@pytest.mark.e2e
def test_the_run_counts_the_evaluations_it_planned_and_samples_only_the_listed_models(study_run):
    out, summary = study_run
    assert summary["gradient_evaluations"]["done"] == summary["gradient_evaluations"]["planned"] == \
        planned_gradient_evaluations(_preset())
    gen = pd.read_csv(out / "generations.csv")
    assert set(gen["model"]) == {"w_ref", "pipeline1_wII"}
    assert (out / "global_uniform.csv").exists()
    g = pd.read_csv(out / "global_uniform.csv")
    assert set(g["phase"]) == {"global_uniform"} and sorted(set(g["client"])) == list(range(N_TRAIN))
    assert json.loads((out / "summary.json").read_text())["personalisation"]["generation_models"] == \
        ["w_ref", "pipeline1_wII"]


@pytest.mark.e2e
def test_the_pre_registered_analysis_reads_the_run(study_run):
    out, _ = study_run
    s = seed_statistics(out)
    assert s["n_personalised"] == N_NEW
    assert np.isfinite(s["b"]) and s["generation"] is not None
    assert set(s["matrix"]) >= {"fedavg", "local_only", "base", "global_uniform", "other_personalised", "all"}
