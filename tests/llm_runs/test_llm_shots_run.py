"""The shots curve's run (:mod:`llm_runs.runs.shots`, preset ``shots``): nested budgets, the secant ``L0_hat``, the
preset's sizing, and, in the ``e2e`` tier, two seeds of the shrunk preset as cells of ``python -m llm_runs sweep`` on
two worker processes (one killed while both run): the four record files of :mod:`verification.llm.shots` with every
method at every budget, read and analysed by it, the killed cell run again, a rerun computing nothing."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_runs.preferences.clients import ClientDesign, Federation  # noqa: E402
from llm_runs.runs.presets import PRESETS  # noqa: E402
from llm_runs.runs.shots import TRAJECTORY, _Secants, budget_federation, seed_cpu_seconds  # noqa: E402
from tests.llm_helpers import make_pairs  # noqa: E402
from verification.llm.shots import ADAPTATION, CLIENTS, CROSS, METHODS, SCORES, read_records, shots_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _federation(pool: int = 4) -> Federation:
    """One training client of 1 pair per objective and two new clients with pools of ``pool`` pairs per objective
    (hand-written pairs, distinct per position)."""
    objs = ("a", "b")
    pairs = {o: make_pairs(o, ((0, 1), (0, 2), (1, 2), (2, 1))) for o in objs}  # 8 pairs per objective
    design = ClientDesign(objectives=objs, n_train=1, n_new=2, n_centres=1, shots=1, pool_pairs=pool, heldout_pairs=1)
    data = (tuple((pairs[o][0],) for o in objs),
            tuple(tuple(pairs[o][:pool]) for o in objs),
            tuple(tuple(pairs[o][8 - pool:]) for o in objs))
    return Federation(design=design, prefs=np.full((3, 2), 0.5), centres=np.full((1, 2), 0.5), centre=np.zeros(3, int),
                      data=data, heldout=tuple((pairs[o][0],) for o in objs), prompt_ids=(("p0",),) * 3,
                      heldout_prompt_ids=("p1",))


def test_a_budget_is_the_first_samples_of_every_new_clients_pool_and_nests():
    fed = _federation(pool=4)
    cut = {b: budget_federation(fed, b) for b in (1, 2, 4)}
    for b, f in cut.items():
        assert f.n_samples.tolist() == [1, b, b]
        assert f.data[0] == fed.data[0] and f.heldout == fed.heldout  # training clients and held-out pairs kept
        for i in fed.new:
            assert f.batch(i) == fed.batch(i, range(b))  # the first b samples of the pool
    for i in fed.new:  # budget 1 within budget 2 within budget 4
        for o in fed.objectives:
            assert cut[2].batch(i)[o][:1] == cut[1].batch(i)[o] and cut[4].batch(i)[o][:2] == cut[2].batch(i)[o]
    for bad in (0, 5, 1.5):
        with pytest.raises(ValueError, match="budget"):
            budget_federation(fed, bad)


def test_the_secant_is_the_largest_over_the_steps_of_the_active_objectives_gradient():
    """``L0_hat = max_k ‖g_{k+1} − g_k‖ / ‖w_{k+1} − w_k‖`` with ``g = λ_{j*} ∇l_{j*}``, ``j*`` the active objective
    of ψ at each iterate (it may change between steps), a step that does not move skipped."""
    rng = np.random.default_rng(0)
    prefs = np.array([[0.7, 0.3], [0.2, 0.8]])
    W = [rng.normal(size=(2, 5)) for _ in range(4)]
    W[2][1] = W[1][1]  # client 1 does not move at the second step
    G = [rng.normal(size=(2, 5, 2)) for _ in range(4)]
    L = [rng.uniform(0.1, 1.0, size=(2, 2)) for _ in range(4)]
    sec = _Secants(prefs)
    for w, g, l in zip(W, G, L, strict=True):
        sec(torch.tensor(w), np.arange(2), None, SimpleNamespace(losses=l, G=torch.tensor(g)))
    for c in range(2):
        act = [int(np.argmax(prefs[c] * l[c])) for l in L]
        gk = [prefs[c, j] * g[c, :, j] for g, j in zip(G, act, strict=True)]
        ratios = [np.linalg.norm(gk[k + 1] - gk[k]) / np.linalg.norm(W[k + 1][c] - W[k][c]) for k in range(3)
                  if np.linalg.norm(W[k + 1][c] - W[k][c]) > 0]
        assert len(ratios) == (3 if c == 0 else 2)
        assert sec.best[c] == pytest.approx(max(ratios), rel=1e-12)


def test_the_shots_preset_is_the_pre_registered_grid_and_fits_the_overnight_run():
    p = PRESETS["shots"]
    assert p.shots.budgets == (1, 2, 4, 8, 16) and p.generation is None and p.personalisation is None
    assert p.design.n_new >= 2 * p.design.n_centres  # two new clients per centre: the within-cluster contrast
    make = (ROOT / "Makefile").read_text()
    target = re.search(r"^llm-study:.*\n((?:\t.*\n)+)", make, flags=re.M).group(1)
    seeds = re.search(r"--preset shots --seeds 0:(\d+) --workers 2 --threads 1", target)
    assert seeds is not None, target
    n_seeds = int(seeds.group(1))
    assert n_seeds >= 9  # Holm over 25 tests needs 2^-S < 0.05/25
    waves = -(-n_seeds // 2)  # two cells at a time
    assert waves * seed_cpu_seconds(p)["total"] / 3600 <= 12.5
    assert "llm-study-v1:" in make and "--preset study --seeds 0:8" in make
    # the curve's objectives are those the positive-control gate admits; GATE=none is the documented ungated run
    assert "$(if $(filter none,$(GATE)),,--gate $(GATE))" in target and "\nGATE ?= reports/llm-gate\n" in make


# --------------------------------------------------------------------------------------------- e2e: the sweep

SEEDS = (0, 1)
PRESET_ARGS = ["--preset", "shots", "--shrink", "--device", "cpu", "--threads", "1"]
CELLS = "shots-shrunk"


@pytest.fixture(scope="module")
def shots_swept(dask_client_2, tmp_path_factory):
    """``python -m llm_runs sweep --preset shots --shrink --seeds 0:2`` on the 2-worker cluster, one worker killed
    while both seeds run (as tests/llm_runs/test_llm_sweep.py kills one)."""
    from tests.llm_helpers import kill_a_busy_worker, run_cli, runs_running, tiny_model_dir

    model = tiny_model_dir(tmp_path_factory)
    out = tmp_path_factory.mktemp("llm-shots") / "sw"
    killed: dict = {}
    killer = threading.Thread(target=kill_a_busy_worker, args=(dask_client_2, killed),
                              kwargs={"ready": runs_running(out, SEEDS)}, daemon=True)
    killer.start()
    code, screen = run_cli("sweep", *PRESET_ARGS, "--model", str(model), "--seeds", "0:2", "--scheduler",
                           dask_client_2.scheduler.address, "--out", str(out), "--quiet")
    killer.join(timeout=5)
    return {"out": out, "code": code, "screen": screen, "killed": killed, "model": model}


@pytest.mark.e2e
def test_shots_seeds_write_the_records_the_pre_registered_analysis_reads(shots_swept):
    out = shots_swept["out"]
    assert shots_swept["code"] == 0, shots_swept["screen"]
    budgets = list(PRESETS["shots"].shrunk().shots.budgets)
    assert budgets == [1, 2]
    dirs = [out / "runs" / str(s) for s in SEEDS]
    for d in dirs:
        for name in (CLIENTS, SCORES, ADAPTATION, CROSS):
            assert (d / name).is_file()
        scores = pd.read_csv(d / SCORES)
        clients = sorted(set(pd.read_csv(d / CLIENTS)["client"]))
        grid = scores.groupby(["budget", "method", "client"]).size()
        assert len(grid) == len(budgets) * len(METHODS) * len(clients) and set(grid) == {3}  # 3 objectives each
        adapt = pd.read_csv(d / ADAPTATION)
        assert set(adapt["method"]) == {"pipeline1_wII", "pipeline1_wI", "local", "fedavg"}
        assert (adapt["L0_hat"] > 0).all() and (adapt["alpha"] > 0).all()
        traj = pd.read_csv(d / TRAJECTORY)
        steps = traj[traj["phase"] != "pipeline2"]
        assert set(steps["phase"]) == {"pipeline1_wII", "pipeline1_wI", "local_only", "fedavg_adapt"}
        assert (steps["batch_size"] == steps["budget"]).all()  # every step on all b samples of the budget
        assert set(traj["budget"]) == set(budgets)
        summary = json.loads((d / "summary.json").read_text())
        assert summary["status"] == "complete"
        assert summary["gradient_evaluations"]["done"] == summary["gradient_evaluations"]["planned"]
    report = shots_report(read_records(dirs), seeds=list(SEEDS), budgets=budgets, n_perm=99, n_boot=50)
    assert report["family_size"] == 5 * len(budgets)  # gains, slopes and own-vs-mates at every budget
    assert report["adaptation"]["n_adaptations"] == 4 * len(budgets) * len(clients) * len(SEEDS)


@pytest.mark.e2e
def test_a_killed_shots_cell_is_run_again_and_a_rerun_recomputes_nothing(shots_swept, monkeypatch):
    from tests.llm_helpers import run_cli
    from verification.engine import dask_engine

    out, killed = shots_swept["out"], shots_swept["killed"]
    assert killed.get("keys"), "no cell was in flight on the killed worker"
    summary = json.loads((out / "llm_sweep.json").read_text())
    assert summary["last_run"]["computed"] == 2 and summary["last_run"]["failed"] == {}
    for s in SEEDS:
        assert (out / "runs" / str(s) / SCORES).stat().st_mtime > killed["at"]

    def no_cluster(*args, **kwargs):
        raise AssertionError("a Dask cluster was started")

    monkeypatch.setattr(dask_engine, "dask_client", no_cluster)
    before = {p: p.stat().st_mtime_ns for p in [*(out / "cells").rglob("*.json"), *(out / "runs").rglob("*")]}
    code, screen = run_cli("sweep", *PRESET_ARGS, "--model", str(shots_swept["model"]), "--seeds", "0:2",
                           "--workers", "2", "--out", str(out), "--quiet")
    assert code == 0, screen
    assert f"2 cells, 0 computed, 2 already in {out / 'cells' / CELLS}" in screen
    assert {p: p.stat().st_mtime_ns for p in before} == before
