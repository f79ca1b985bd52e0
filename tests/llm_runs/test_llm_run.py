"""Algorithm 1 on LoRA fine-tuning through the torch source (tiny random Llama, float64): the kernel boundary,
the records, the command line, clients with data deficiency; the SmolLM2 smoke run in the ``llm`` tier.

* The torch source satisfies :func:`sim.source.check_source` (float64, to 1e-10); its Gram is ``GᵀG`` of the
  flattened per-objective autograd gradients and ``combine(μ)`` is the autograd gradient of ``Σ_j μ_j l_j`` of
  each client at its own row.
* The LP receives exactly the source's ``l``, ``C`` and the clients' ``λ`` (re-solved by HiGHS); with m identical
  objectives the step is the single-objective gradient; one server round is ``w + α Σ_i ρ_i Δw_i``.
* A torch quadratic (float64) and the numpy family source give the same Phase 1, Phase 2 and run_algorithm to
  1e-10.
* A run: same seed, same records; every sim column plus the LLM columns; records written as the run goes; a loss
  at its floor stops it naming objective, client, phase and round; bad input exits 2 with one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import sim.algorithm as al  # noqa: E402
import sim.algorithm.evaluation as al_evaluation  # noqa: E402
from llm_runs.model.models import save_random_llama  # noqa: E402
from llm_runs.preferences.clients import (  # noqa: E402
    ClientDesign,
    DataShortageError,
    Federation,
    build_federation,
    calibration_split,
)
from llm_runs.preferences.data import DEFAULT_DATA_FILE, UnknownObjectiveError, load_candidates  # noqa: E402
from llm_runs.runs.presets import PRESETS, planned_gradient_evaluations, resolve_autocast  # noqa: E402
from llm_runs.runs.records import rebase_psi_star  # noqa: E402
from llm_runs.runs.run import run  # noqa: E402
from llm_runs.training.objectives import DPOSettings, objective_gradients  # noqa: E402
from llm_runs.training.source import LoraObjectives, TorchSource  # noqa: E402
from sim import cli  # noqa: E402
from sim.direction import lp_direction_reference  # noqa: E402
from sim.problems import PlantedQuadraticCluster  # noqa: E402
from sim.source import ClientSource, check_source  # noqa: E402
from tests.llm_helpers import make_pairs, tiny_preference_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ORDERS = {"first": ((0, 1), (0, 2)), "second": ((1, 0), (2, 1)), "third": ((2, 0), (1, 2))}
PREFS = np.array([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5]])


def hand_federation(orders=ORDERS, prefs=PREFS) -> Federation:
    """Three clients over the hand-written pairs of llm_helpers: client c holds pair c and c+1 (mod 4) of every
    objective (2 samples), the held-out pairs are pair 0 and 3."""
    names = tuple(orders)
    pairs = {o: make_pairs(o, orders[o]) for o in names}  # 4 pairs each
    data = tuple(tuple(tuple(pairs[o][k % 4] for k in (c, c + 1)) for o in names) for c in range(len(prefs)))
    design = ClientDesign(objectives=names, n_train=len(prefs) - 1, n_new=1, n_centres=1, shots=2, pool_pairs=2,
                          heldout_pairs=2)
    return Federation(design=design, prefs=np.asarray(prefs, dtype=np.float64), centres=np.asarray(prefs[:1]),
                      centre=np.zeros(len(prefs), dtype=np.int64), data=data,
                      heldout=tuple(tuple(pairs[o][k] for k in (0, 3)) for o in names),
                      prompt_ids=tuple(("p0", "p1") for _ in prefs), heldout_prompt_ids=("p0", "p1"))


def lora_source(fed=None, settings=None, seed=0):
    pm = tiny_preference_model(settings=settings, seed=seed)
    fed = fed or hand_federation()
    obj = LoraObjectives(pm, fed)
    return TorchSource(obj, fed.prefs, fed.n_samples, psi_star=np.zeros(fed.n_clients)), obj


@pytest.fixture(scope="module")
def src_obj():
    return lora_source()


# ------------------------------------------------------------------------------------------- the boundary


def test_torch_source_conforms_to_the_protocol(src_obj):
    src, obj = src_obj
    check_source(src, obj.initial(), np.arange(3), np.random.default_rng(0), batch_size=1, rtol=1e-10)


def test_gram_and_combine_are_the_autograd_gradients_of_each_client(src_obj):
    """Two clients at different rows: C_c = G_cᵀG_c of the flattened autograd gradients, and combine(μ)_c is the
    autograd gradient of Σ_j μ_j l_j at client c's row, to 1e-6 relative to the largest entry (the source's CPU
    layout runs each sequence alone, the reference here in padded batches, and the model's RMSNorm computes in
    float32 even in a float64 model: float32 round-off, measured 7e-8)."""
    src, obj = src_obj
    w0 = obj.initial()
    W = torch.stack([w0, w0 + 1e-2 * torch.sin(torch.arange(w0.numel(), dtype=w0.dtype))])
    clients = np.array([0, 2])
    ev = src.evaluate(W, clients)
    mu = np.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])
    d = ev.combine(mu)
    pm = obj.pm
    for c, i in enumerate(clients):
        obj.load(W[c])
        batch = obj.federation.batch(i)
        losses = [pm.pair_losses(batch[o])[0].mean() for o in obj.objectives]
        G = torch.stack([pm.flat_grad(torch.autograd.grad(l, pm.params, retain_graph=True, allow_unused=True))
                         for l in losses], 1)
        raw = np.array([float(l.detach()) for l in losses])
        np.testing.assert_allclose(ev.losses[c], raw - obj.reference_point, rtol=1e-12)  # the excess losses
        C = (G.T @ G).numpy()
        np.testing.assert_allclose(ev.gram[c], C, rtol=0, atol=1e-6 * np.abs(C).max())
        total = sum(float(m) * l for m, l in zip(mu[c], losses, strict=True))
        g = pm.flat_grad(torch.autograd.grad(total, pm.params, allow_unused=True))
        np.testing.assert_allclose(d[c].numpy(), g.numpy(), rtol=0, atol=1e-6 * float(g.abs().max()))
    assert not np.allclose(ev.gram[0], ev.gram[1])  # the rows really differ


def test_lp_receives_exactly_the_source_losses_grams_and_preferences(src_obj, monkeypatch):
    """Phase 1 with two local steps: every LP call gets the (l, C) the source returned, bit for bit, and λ of its
    clients; HiGHS on the recorded inputs gives the same status, mode and optimal value."""
    src, obj = src_obj
    calls, returned = [], []
    lp = al_evaluation.lp_direction

    def spy_lp(l, lam, C, **kw):
        res = lp(l, lam, C, **kw)
        calls.append((np.array(l), np.array(lam), np.array(C), kw, res))
        return res

    evaluate = src.evaluate

    def spy_eval(W, clients, batches=None):
        ev = evaluate(W, clients, batches)
        returned.append((np.array(clients), ev.losses.copy(), ev.gram.copy()))
        return ev

    monkeypatch.setattr(al_evaluation, "lp_direction", spy_lp)
    monkeypatch.setattr(src, "evaluate", spy_eval)
    clients = np.arange(3)
    al.phase1(src, clients, obj.initial(), al.Phase1Config(rounds=2, tau=2, eta_local=0.5),
              np.random.default_rng(0))
    assert len(calls) == len(returned) >= 4
    for (l, lam, C, kw, res), (cl, l_src, C_src) in zip(calls, returned, strict=True):
        assert np.array_equal(l, l_src) and np.array_equal(C, C_src)
        assert np.array_equal(lam, src.prefs[cl])
        ref = lp_direction_reference(l, lam, C, **kw)
        np.testing.assert_array_equal(res.status, ref.status)
        np.testing.assert_array_equal(res.mode, ref.mode)
        np.testing.assert_allclose(res.objective, ref.objective, rtol=1e-8, atol=1e-12 * np.abs(C).max())


def test_identical_objectives_step_along_the_single_objective_gradient():
    """m = 3 objectives with the same pairs: whatever μ the LP picks, d = Gμ is the single objective's gradient
    (computed in the source's layout)."""
    same = {"a": ORDERS["first"], "b": ORDERS["first"], "c": ORDERS["first"]}
    src, obj = lora_source(hand_federation(same))
    W = torch.stack([obj.initial()])
    ev = src.evaluate(W, np.array([1]))
    assert np.all(ev.losses == ev.losses[0, 0])
    res = al.lp_direction(ev.losses, src.prefs[[1]], ev.gram)
    d = ev.combine(res.weights)[0]
    obj.load(W[0])
    single = objective_gradients(obj.pm, {"a": obj.federation.batch(1)["a"]}, layout=obj.layout)  # as a run would
    g = single.G[:, 0]
    assert single.losses[0] - obj.reference_point == ev.losses[0, 0]  # the source hands on the excess loss
    np.testing.assert_allclose(d.numpy(), g.numpy(), rtol=0, atol=1e-12 * float(g.abs().max()))


def test_one_server_round_is_w_plus_alpha_weighted_pseudo_gradients(src_obj):
    src, obj = src_obj
    clients, w0 = np.arange(3), obj.initial()
    rho = np.array([0.5, 0.3, 0.2])
    cfg = al.Phase1Config(rounds=1, tau=2, eta_local=0.7, alpha_server=0.6)
    res = al.phase1(src, clients, w0, cfg, np.random.default_rng(0), rho=rho)
    deltas = []
    for i in clients:
        w = w0.clone()
        for _ in range(cfg.tau):
            ev = src.evaluate(w[None], np.array([i]))
            mu = al.lp_direction(ev.losses, src.prefs[[i]], ev.gram).weights
            w = w - cfg.eta_local * ev.combine(mu)[0]
        deltas.append(w - w0)
    expect = w0 + cfg.alpha_server * sum(float(r) * dw for r, dw in zip(rho, deltas, strict=True))
    np.testing.assert_allclose(res.trajectory[1].numpy(), expect.numpy(), rtol=0, atol=1e-12)
    assert float((res.trajectory[1] - w0).abs().max()) > 0


# --------------------------------------------------------------------- a quadratic in torch vs the numpy source


class TorchQuadratic:
    """The F1 quadratic clients ``½(w − c_ij)ᵀQ_j(w − c_ij) + b_j`` (samples: centre shifted by ξ, offset b − κ)
    written in torch (float64); gradients by autograd, one objective at a time."""

    def __init__(self, problem, samples):
        t = lambda a: torch.as_tensor(np.array(a, dtype=np.float64))  # noqa: E731
        self.c, self.Q, self.b = t(problem._centres_all()), t(problem.hessians), t(problem.offsets)
        self.xi = [t(x) for x in samples.noise]
        self.kappa = t(samples.kappa)
        self.objectives = tuple(f"q{j}" for j in range(problem.n_objectives))
        self.n_params, self.dtype, self.device = problem.n_params, torch.float64, torch.device("cpu")

    def _loss(self, w, client, batch):
        if batch is None:
            e = w - self.c[client]
            return 0.5 * torch.einsum("jw,jwv,jv->j", e, self.Q, e) + self.b
        e = w - self.c[client] - self.xi[client][torch.as_tensor(batch)]
        return (0.5 * torch.einsum("sjw,jwv,sjv->sj", e, self.Q, e)).mean(0) + self.b - self.kappa[client]

    def losses(self, w, client, timer=None):
        with torch.no_grad():
            return self._loss(w, client, None).numpy()

    def gradients(self, w, client, batch, timer=None):
        w = w.detach().clone().requires_grad_(True)
        l = self._loss(w, client, batch)
        G = torch.stack([torch.autograd.grad(l[j], w, retain_graph=True)[0] for j in range(l.numel())], 1)
        return l.detach().numpy(), G


@pytest.fixture(scope="module")
def quad_pair():
    p = PlantedQuadraticCluster.make(np.random.default_rng(3), m=3, n_w=7, n_clients=6, spread=0.05)
    s = p.with_samples(np.random.default_rng(4), np.r_[np.full(4, 30), np.full(2, 60)], 0.1)
    tq = TorchSource(TorchQuadratic(p, s), p.prefs, s.n_samples, psi_star=p.psi_star)
    return ClientSource(p, s), tq, p.centres.mean(axis=0) + 0.5


def _same(a, b, what, rtol=1e-10):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, what
    np.testing.assert_allclose(b, a, rtol=0, atol=rtol * max(1.0, float(np.nanmax(np.abs(a)))), err_msg=what)


def _same_records(a: pd.DataFrame, b: pd.DataFrame, what: str) -> None:
    assert tuple(a.columns) == al.RECORD_COLUMNS and tuple(b.columns[: len(al.RECORD_COLUMNS)]) == al.RECORD_COLUMNS
    assert len(a) == len(b), what
    for col in al.RECORD_COLUMNS:
        if a[col].dtype.kind in "fiu":
            x, y = a[col].to_numpy(np.float64), b[col].to_numpy(np.float64)
            assert np.array_equal(np.isnan(x), np.isnan(y)), f"{what}: NaN pattern of {col}"
            if (~np.isnan(x)).any():
                _same(x[~np.isnan(x)], y[~np.isnan(x)], f"{what}: {col}")
        else:
            assert (a[col].astype(str) == b[col].astype(str)).all(), f"{what}: {col}"


def test_torch_quadratic_source_matches_the_numpy_source(quad_pair):
    """Phase 1 (population, τ = 2), Phase 2 (episodes) and run_algorithm through both sources agree to 1e-10."""
    fam, tq, w = quad_pair
    check_source(tq, w, np.arange(6), np.random.default_rng(0), batch_size=3, rtol=1e-10)
    clients = np.arange(4)
    kw = dict(rho=None)
    p1a = al.phase1(fam, clients, w, al.Phase1Config(rounds=12, tau=2, eta_local=0.05), np.random.default_rng(1), **kw)
    p1b = al.phase1(tq, clients, w, al.Phase1Config(rounds=12, tau=2, eta_local=0.05), np.random.default_rng(1), **kw)
    _same(p1a.trajectory, p1b.trajectory.numpy(), "phase 1 trajectory")
    _same_records(p1a.records, p1b.records, "phase 1")
    cfg2 = al.Phase2Config(rounds=6, S=4, K=2, eta_meta_inner=0.05)
    p2a = al.phase2(fam, clients, p1a.w, cfg2, np.random.default_rng(2))
    p2b = al.phase2(tq, clients, p1b.w, cfg2, np.random.default_rng(2))
    _same(p2a.trajectory, p2b.trajectory.numpy(), "phase 2 trajectory")
    _same_records(p2a.records, p2b.records, "phase 2")
    cfg = al.AlgorithmConfig(phase1=al.Phase1Config(rounds=4, tau=2), phase2=al.Phase2Config(rounds=2, S=4, K=2),
                             adapt=al.AdaptConfig(K=3, S=5, preconditioner="rmsprop_lagged"),
                             adamw=al.AdaptConfig(K=3, S=5, preconditioner="adamw", weight_decay=0.01),
                             pipeline2=al.Pipeline2Config(max_steps=30, record_every=10))
    ka = dict(w_ref=w, train_clients=clients, new_clients=np.array([4, 5]))
    a = al.run_algorithm(fam, cfg, np.random.default_rng(5), **ka)
    b = al.run_algorithm(tq, cfg, np.random.default_rng(5), keep_trajectory=False, **ka)
    _same_records(a.records, b.records, "run_algorithm")
    lp_inputs = list(al.lp_input_columns(np.zeros((1, 3, 3)), np.zeros((1, 3))))  # gram_<j>_<k>, mu_<j>
    assert [c for c in b.records.columns if c not in al.RECORD_COLUMNS] == ["loss_q0", "loss_q1", "loss_q2",
                                                                           *lp_inputs]


# ------------------------------------------------------------------------------------------------ records


def test_rows_stream_as_made_and_losses_become_columns(src_obj):
    src, obj = src_obj
    seen = []
    res = al.phase1(src, np.arange(2), obj.initial(), al.Phase1Config(rounds=2, eta_local=0.5),
                    np.random.default_rng(0), on_rows=seen.append)
    assert len(seen) == 3  # one frame per round, as it ends
    streamed = pd.concat(seen, ignore_index=True)
    pd.testing.assert_frame_equal(streamed, res.records, check_dtype=False)
    extra = [c for c in res.records.columns if c not in al.RECORD_COLUMNS]
    assert extra == [f"{k}_{o}" for k in ("loss",) for o in ORDERS] + [
        f"heldout_{k}_{o}" for o in ORDERS for k in ("loss", "acc")] + list(
        al.lp_input_columns(np.zeros((1, len(ORDERS), len(ORDERS))), np.zeros((1, len(ORDERS)))))
    lam = src.prefs[res.records["client"].to_numpy()]
    L = res.records[[f"loss_{o}" for o in ORDERS]].to_numpy()  # the raw losses
    assert obj.reference_point == pytest.approx(0.3250829733914482) == obj.pm.settings.floor
    # psi (and beta, the LP) see the excess losses l - H(eps)
    np.testing.assert_allclose(res.records["psi"], (lam * (L - obj.reference_point)).max(axis=1), rtol=1e-12)
    assert res.records[[f"heldout_acc_{o}" for o in ORDERS]].stack().between(0, 1).all()


def test_the_source_hands_algorithm_1_the_excess_losses(src_obj):
    src, obj = src_obj
    w = obj.initial()
    raw = np.array([obj.pm.pair_losses(p)[0].mean().item() for p in hand_federation().batch(0).values()])
    np.testing.assert_allclose(src.losses(w[None], np.array([0]))[0], raw - obj.pm.settings.floor, rtol=1e-12)
    ev = src.evaluate(w[None], np.array([0]))
    np.testing.assert_allclose(ev.losses[0], raw - obj.pm.settings.floor, rtol=1e-12)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_ray_of_the_excess_losses_asks_every_objective_to_improve(preset):
    """On the ray of the excess losses ``e = l - H(eps)`` there are points where every raw loss is below ln 2 (the
    indifferent model) for every client of every preset: from the base model (every ``e_j = ln 2 - H``) the ray
    point at ``psi = lambda_min (ln 2 - H)`` lowers every objective, the larger ``lambda_j`` the more. On the ray of the
    raw losses (``l >= H``) the least-weighted objective has ``l >= H lambda_max / lambda_min``: above ln 2 for
    most clients (learning that objective's rejected responses), which the first check cannot see."""
    from llm_runs.preferences.clients import _draw_prefs, preference_centres
    from sim.preference import ray_point

    p = PRESETS[preset]
    d = p.design
    lam, _ = _draw_prefs(d, preference_centres(d.m, d.n_centres, d.centre_weight), np.random.default_rng(0))
    H = DPOSettings(label_smoothing=p.label_smoothing).floor
    e0 = np.log(2.0) - H
    q = ray_point(lam.min(axis=1) * e0, lam)  # excess ray points at the level where the largest entry is e0
    assert np.all(q + H <= np.log(2.0) + 1e-12)
    assert np.all((lam * q).max(axis=1) < (lam * e0).max(axis=1))  # a lower psi than at the base model
    order = np.argsort(lam, axis=1)
    assert np.all(np.diff(np.take_along_axis(q, order, axis=1), axis=1) <= 1e-15)  # larger lambda_j, lower e_j
    raw_least = H * lam.max(axis=1) / lam.min(axis=1)  # the smallest raw loss of the least-weighted objective
    assert np.mean(raw_least > np.log(2.0)) > 0.5  # the raw vector's ray demanded anti-learning for most clients


def test_the_objective_with_the_larger_preference_ends_with_the_smaller_training_loss():
    """Two clients on the same training pairs with lambda = (.6, .2, .2) and (.2, .6, .2), 10 LP steps from the base
    model: each of the first two objectives ends lower (in excess loss) for the client that weighs it more."""
    prefs = np.array([[0.6, 0.2, 0.2], [0.2, 0.6, 0.2]])
    base = hand_federation(prefs=np.vstack([prefs, prefs[:1]]))
    same = replace(base, data=(base.data[0], base.data[0], base.data[0]))
    pm = tiny_preference_model(perturb=0.0)
    obj = LoraObjectives(pm, same, heldout=False)
    src = TorchSource(obj, same.prefs, same.n_samples, psi_star=np.zeros(3))
    res = al.pipeline2(src, np.array([0, 1]), obj.initial(), al.Pipeline2Config(max_steps=10, eta=2.0, tol=0.0,
                                                                             decay_steps=None, select="last"))
    e = src.losses(res.w, np.array([0, 1]))
    assert e[0, 0] < e[1, 0] and e[1, 1] < e[0, 1], e


def test_a_loss_at_its_floor_stops_the_run_naming_objective_client_phase_and_round():
    src, obj = lora_source(settings=DPOSettings(max_response_tokens=24, floor_rtol=10.0))
    with pytest.raises(al.DivergenceError, match=r"phase1 cluster 0 round 0 step 0: client 0, objective 'first': "
                                                 r"loss .* reached its floor"):
        al.phase1(src, np.arange(3), obj.initial(), al.Phase1Config(rounds=1), np.random.default_rng(0))


def test_rebasing_psi_star_never_raises_it_and_keeps_gaps_nonnegative():
    rec = pd.DataFrame({"client": [0, 0, 1, 1], "phase": ["a", "b", "a", "b"], "round": [0, 1, 0, 1],
                        "psi": [1.0, 0.4, 0.9, 0.8], "psi_star": 0.0, "gap": 0.0})
    summary = {"new_clients": [{"client": 1, "psi_star": 0.85, "start_gap": {"x": 0.05}, "final_gap": {"x": -0.05}}],
               "mean_final_gap": {"x": -0.05}, "mean_start_gap": {"x": 0.05}}
    out, s, info = rebase_psi_star(rec, summary, np.array([0.5, 0.85]))
    assert out["psi_star"].tolist() == [0.4, 0.4, 0.8, 0.8] and (out["gap"] >= 0).all()
    assert s["new_clients"][0]["final_gap"]["x"] == pytest.approx(0.0) and s["mean_start_gap"]["x"] == pytest.approx(0.1)
    assert info[0]["attained_in"] == "b round 1" and info[1]["final"] == 0.8
    extra = pd.DataFrame({"clustering": ["random"], "draw": [0], "client": [1], "phase": ["phase1"], "round": [2],
                          "psi": [0.7], "psi_star": 0.0, "gap": 0.0})
    out, s, info = rebase_psi_star(rec, summary, np.array([0.5, 0.85]), extra=extra)
    assert info[1]["final"] == 0.7 and info[1]["attained_in"] == "phase1 round 2 (random clustering, draw 0)"
    assert out["psi_star"].tolist() == [0.4, 0.4, 0.7, 0.7]


# ------------------------------------------------------------------------------------------------ clients


@pytest.fixture(scope="module")
def cands():
    if not DEFAULT_DATA_FILE.exists():
        pytest.skip("the shipped data file is not built")
    return load_candidates()


def test_clients_have_disjoint_prompts_few_shots_and_preferences_around_centres(cands):
    d = ClientDesign(objectives=("conciseness", "informativeness", "positivity"), n_train=6, n_new=2, n_centres=2,
                     shots=2, pool_pairs=5, heldout_pairs=3)
    fed = build_federation(cands, d, np.random.default_rng(0))
    assert fed.n_samples.tolist() == [2] * 6 + [5] * 2
    ids = [set(p) for p in fed.prompt_ids] + [set(fed.heldout_prompt_ids)]
    assert sum(len(s) for s in ids) == len(set().union(*ids))  # disjoint
    for i in range(fed.n_clients):
        for j, pairs in enumerate(fed.data[i]):
            assert all(p.objective == d.objectives[j] and p.prompt_id in fed.prompt_ids[i] for p in pairs)
    assert np.all(fed.prefs >= d.lambda_min) and np.allclose(fed.prefs.sum(1), 1)
    for g in range(2):  # each client's largest preference is its centre's main objective (concentration 40)
        assert np.all(np.argmax(fed.prefs[fed.centre == g], axis=1) == g)
    again = build_federation(cands, d, np.random.default_rng(0))
    assert np.array_equal(again.prefs, fed.prefs) and again.prompt_ids == fed.prompt_ids
    batch = fed.batch(0, [1])
    assert [len(v) for v in batch.values()] == [1, 1, 1]


def test_the_calibration_split_is_a_property_of_each_prompt_id(cands):
    """A prompt's side depends on its id alone: the split of the file equals the split of any subset, in any order;
    about a third of the shipped prompts calibrate; a federation dealt from the study side never sees one of them."""
    cal, study = calibration_split(cands.prompt_ids)
    assert set(cal).isdisjoint(study) and sorted(cal + study) == sorted(cands.prompt_ids)
    assert 60 <= len(cal) <= 100  # 240 prompts, share 1/3: 80 expected, binomial sd 7.3
    subset = list(reversed(cands.prompt_ids[::3]))
    sub_cal, sub_study = calibration_split(subset)
    assert set(sub_cal) == set(cal) & set(subset) and set(sub_study) == set(study) & set(subset)
    assert calibration_split(["explain-00"], share=0.999)[0] == ("explain-00",)
    for bad in (0, 1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="calibration share must lie in"):
            calibration_split(cands.prompt_ids, share=bad)
    with pytest.raises(ValueError, match="'a' appears more than once"):
        calibration_split(["a", "b", "a"])
    d = replace(PRESETS["study"].design)
    fed = build_federation(cands, d, np.random.default_rng(3), prompt_ids=study)
    seen = set(fed.heldout_prompt_ids).union(*map(set, fed.prompt_ids))
    assert seen <= set(study)
    with pytest.raises(ValueError, match="'nope' is not in the data file"):
        build_federation(cands, d, np.random.default_rng(3), prompt_ids=["nope", *study])


def test_presets_fit_the_data_file_and_plan_their_evaluations(cands):
    for name, p in PRESETS.items():
        build_federation(cands, p.design, np.random.default_rng(0))  # no DataShortageError
        assert planned_gradient_evaluations(p) > planned_gradient_evaluations(p.quick()) > 0, name
    with pytest.raises(DataShortageError, match="runs out of prompts"):
        build_federation(cands, replace(PRESETS["smoke"].design, n_train=500), np.random.default_rng(0))


@pytest.mark.parametrize("kw, err, match", [
    (dict(objectives=("conciseness", "nonsense")), UnknownObjectiveError, "unknown objective 'nonsense'"),
])
def test_unknown_objective_is_named(cands, kw, err, match):
    with pytest.raises(err, match=match):
        build_federation(cands, ClientDesign(**kw), np.random.default_rng(0))


@pytest.mark.parametrize("kw, match", [
    (dict(objectives=("a",)), "at least two"), (dict(objectives=("a", "a")), "distinct"),
    (dict(objectives=("a", "b"), shots=0), "shots"), (dict(objectives=("a", "b"), centre_weight=0.3), "centre_weight"),
    (dict(objectives=("a", "b"), lambda_min=0.5), "lambda_min"),
])
def test_bad_client_design_is_named(kw, match):
    with pytest.raises(ValueError, match=match):
        ClientDesign(**kw)


@pytest.mark.parametrize("prefs, match", [([[0.5, 0.6, -0.1]] * 3, "prefs"), ([[0.5, 0.3, 0.3]] * 3, "sum to 1")])
def test_preferences_off_the_simplex_are_refused(prefs, match):
    pm = tiny_preference_model()
    fed = hand_federation()
    with pytest.raises(ValueError, match=match):
        TorchSource(LoraObjectives(pm, fed), prefs, fed.n_samples)


# ------------------------------------------------------------------------------------------------ a whole run


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_random_llama(tmp_path_factory.mktemp("model") / "tiny", "tiny", dtype="float32")[0]


def _tiny_preset():
    """The smoke preset at float32 (bf16 autocast is slow on small CPU matrices) with one round per phase, 3
    training clients and 1 new client."""
    p = replace(PRESETS["smoke"], autocast=None).quick()
    return replace(p, design=replace(p.design, n_train=3, n_new=1))


@pytest.fixture(scope="module")
def tiny_runs(tiny_dir, cands, tmp_path_factory):
    outs = [tmp_path_factory.mktemp(f"run{k}") for k in range(2)]
    sums = [run(_tiny_preset(), o, model_dir=tiny_dir, device="cpu", seed=3, progress=False) for o in outs]
    return outs, sums


@pytest.mark.e2e
def test_run_writes_every_column_and_a_complete_summary(tiny_runs):
    (out, _), (s, _) = tiny_runs
    rec = pd.read_csv(out / "trajectory.csv")
    assert list(rec.columns[: len(al.RECORD_COLUMNS)]) == list(al.RECORD_COLUMNS)
    objs = s["objectives"]
    for o in objs:
        for k in ("loss", "heldout_loss", "heldout_acc"):
            assert f"{k}_{o}" in rec.columns
    assert s["status"] == "complete" and (out / "figure.png").stat().st_size > 0
    assert s["gradient_evaluations"]["done"] == s["gradient_evaluations"]["planned"]
    assert (rec["gap"] >= 0).all() and (rec["psi_star"] <= rec["psi"]).all()
    assert set(rec["phase"]) >= {"psi_star_estimate", "phase1", "phase2", "fedavg", "pipeline1_wI", "pipeline1_wII",
                                 "pipeline1_wII_adamw", "local_only", "fedavg_adapt", "pipeline2"}
    for o in objs:
        assert s["min_loss"][o]["min_any_loss"] > s["min_loss"][o]["floor"] > 0
    assert sum(s["lp_step_status_counts"].values()) > 0
    conflict = s["gradient_conflict_at_base_model"]
    assert len(conflict["per_client"]) == _tiny_preset().design.n_clients
    assert {"forward", "backward", "gram", "lp", "combine", "heldout"} <= set(s["timing"]["sections"])
    assert s["memory"]["peak_rss_bytes"] > 0 and s["timing"]["tokens"] > 0
    assert len(s["new_clients"]) == 1 and "pipeline2" in s["new_clients"][0]["final_gap"]
    assert "under-estimates" in s["psi_star_note"]


@pytest.mark.e2e
def test_same_seed_same_records(tiny_runs):
    (a, b), _ = tiny_runs
    assert (a / "trajectory.csv").read_bytes() == (b / "trajectory.csv").read_bytes()
    if (a / "clusterings.csv").exists():
        assert (a / "clusterings.csv").read_bytes() == (b / "clusterings.csv").read_bytes()


@pytest.mark.e2e
def test_run_scores_responses_generated_by_every_model(tiny_runs):
    """generations.csv: every model of the run (base, cluster models, each new client's adapted models) answers the
    same evaluation prompts, none of them trained on, and each response carries every objective's reward."""
    (out, other), (s, _) = tiny_runs
    gen = pd.read_csv(out / "generations.csv", keep_default_na=False)
    info = s["generation_rewards"]
    assert gen.groupby(["model", "cluster", "clients"]).ngroups == info["models"]
    n_clusters = len(s["algorithm"]["clusters"])
    assert info["models"] == 1 + 3 * n_clusters + 6 * len(s["new_clients"])
    assert {f"reward_{o}" for o in s["objectives"]} <= set(gen.columns)
    trained_on = {p for c in s["clients"]["clients"] for p in c["prompts"]}
    assert set(gen["prompt_id"]) == set(info["prompts"]) and not set(info["prompts"]) & trained_on
    assert gen.groupby("model")["prompt_id"].nunique().eq(len(info["prompts"])).all()
    assert (out / "generations.csv").read_bytes() == (other / "generations.csv").read_bytes()  # same seed


@pytest.mark.e2e
def test_the_gpu_checks_report_reads_a_complete_and_a_failed_run(tiny_runs, tmp_path):
    """llm_runs/gpu_check.py's report in this process, on this module's run (the script's own run and its report:
    tests/llm_runs/test_gpu_check.py): the rates of both stages of a complete run; a run
    that failed in generation names the stage and says why it has no generation rate."""
    import re

    from llm_runs.gpu import check as gpu_check

    (out, _), _ = tiny_runs
    text, ok = gpu_check.report(out, check_seconds=12.0)
    assert ok and text.endswith("whole check 12 s; status complete"), text
    for what in ("training", "generation"):
        m = re.search(rf"^{what} tokens/s: (\d+) \((\d+) ", text, re.M)
        assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, text
    assert re.search(r"^seconds per stage: .*algorithm_1 \d+\.\d.*generation_rewards \d+\.\d", text, re.M), text
    assert "steps/s: " in text and "peak memory: " in text
    failed = tmp_path / "run"
    failed.mkdir()
    s = json.loads((out / "summary.json").read_text())
    s["stage_seconds"].pop("generation_rewards")
    s.pop("generation_rewards")
    s.update(status="failed", error="RuntimeError: boom")
    (failed / "summary.json").write_text(json.dumps(s))
    text, ok = gpu_check.report(failed)
    assert not ok and text.endswith("status failed: RuntimeError: boom"), text
    assert re.search(r"generation_rewards \d+\.\d \(failed there\)", text)
    assert "generation tokens/s: n/a (the run failed in generation after " in text


@pytest.mark.e2e
def test_run_records_the_lp_inputs_and_the_clustering_comparison(tiny_runs):
    """The Grams and LP weights at the federated phases' population rows re-solve to the recorded weights, and
    the clustering comparison (Remark H.8) is recorded as the summary describes it."""
    from sim.direction import lp_direction

    (out, _), (s, _) = tiny_runs
    rec = pd.read_csv(out / "trajectory.csv")
    m = len(s["objectives"])
    mus = [f"mu_{j}" for j in range(m)]
    fed = rec[rec["phase"].isin(["phase1", "phase2", "fedavg"])]
    assert set(mus) <= set(rec.columns) and fed[mus].notna().all().all()
    prefs = {c["client"]: c["prefs"] for c in s["clients"]["clients"]}
    ph1 = fed[fed["phase"] == "phase1"]
    C = np.empty((len(ph1), m, m))
    for j in range(m):
        for k in range(j, m):
            C[:, j, k] = C[:, k, j] = ph1[f"gram_{j}_{k}"]
    raw = ph1[[f"loss_{o}" for o in s["objectives"]]].to_numpy()
    lam = np.array([prefs[int(i)] for i in ph1["client"]])
    l = raw - s["loss_vector"]["reference_point"]  # the LP saw the excess losses
    np.testing.assert_array_equal(lp_direction(l, lam, C).weights, ph1[mus].to_numpy())
    assert not np.array_equal(lp_direction(raw, lam, C).weights, ph1[mus].to_numpy())  # the raw ones differ
    info = s["clustering_comparison"]
    names = [(c["clustering"], c["draw"]) for c in info["clusterings"]]
    assert names[:2] == [("stage1_stage2", 0), ("stage1_only", 0)] and ("random", 0) in names
    trained = [c for c in info["clusterings"] if c["clustering"] != "stage1_stage2" and c["trained"]]
    if trained:
        comp = pd.read_csv(out / "clusterings.csv")
        assert list(comp.columns[:2]) == ["clustering", "draw"]
        assert set(zip(comp["clustering"], comp["draw"], strict=True)) == {(c["clustering"], c["draw"]) for c in trained}
        assert (comp["gap"] >= 0).all() and set(comp["phase"]) == {"phase1"}
        for c in trained:
            got = comp[(comp["clustering"] == c["clustering"]) & (comp["draw"] == c["draw"])]
            assert sorted(sorted(g["client"].unique().tolist()) for _, g in got.groupby("cluster")) == sorted(
                sorted(x) for x in c["clusters"])
    for c in info["clusterings"]:
        if not c["trained"]:
            assert c["same_as"] == "stage1_stage2"


def test_an_interrupted_run_keeps_its_records(tiny_dir, cands, tmp_path, monkeypatch):
    """A run stopped part of the way (here: a KeyboardInterrupt in the 10th client evaluation) leaves the rows it
    made in trajectory.csv and a summary that says so."""
    count = {"n": 0}
    grads = LoraObjectives.gradients

    def stop(self, *a, **k):
        count["n"] += 1
        if count["n"] == 10:
            raise KeyboardInterrupt
        return grads(self, *a, **k)

    monkeypatch.setattr(LoraObjectives, "gradients", stop)
    with pytest.raises(KeyboardInterrupt):
        run(_tiny_preset(), tmp_path, model_dir=tiny_dir, device="cpu", seed=3, progress=False)
    rec = pd.read_csv(tmp_path / "trajectory.csv")
    assert len(rec) > 0 and set(rec["phase"]) >= {"psi_star_estimate"}
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["gradient_evaluations"]["done"] == 9


# ------------------------------------------------------------------------------------------- command line


def _main(capsys, *args) -> tuple[int, list[str]]:
    """``python -m llm_runs`` in this process (a usage error returns before the re-exec and before any work)."""
    from llm_runs.__main__ import main

    code = main(list(args))
    return code, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


@pytest.mark.parametrize("args, match", [
    (["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
    (["--model", "/nonexistent/model"], "argument --model: model directory '/nonexistent/model' does not exist"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--seed", "-1"], "argument --seed"),
])
def test_usage_errors_exit_2_with_one_line_before_any_work(tmp_path, capsys, args, match):
    out = tmp_path / "out"
    code, lines = _main(capsys, "run", "--out", str(out), *args)
    assert code == 2 and len(lines) == 1 and match in lines[0], lines
    assert not (out / "summary.json").exists()


def test_random_model_sizes_of_the_parser_are_the_model_shapes():
    from llm_runs.__main__ import RANDOM_MODEL_SIZES
    from llm_runs.gpu.check import BUILD_SIZES
    from llm_runs.model.models import RANDOM_LLAMA_SIZES

    assert sorted(RANDOM_MODEL_SIZES) == sorted(RANDOM_LLAMA_SIZES) == sorted(BUILD_SIZES)


def test_bad_model_dir_corrupt_data_and_missing_cuda_are_usage_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, lines = _main(capsys, "run", "--out", str(tmp_path / "o"), "--model", str(tmp_path / "empty"))
    assert code == 2 and len(lines) == 1 and "argument --model:" in lines[0] and "no config.json" in lines[0]
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip")
    code, lines = _main(capsys, "run", "--out", str(tmp_path / "o"), "--data", str(bad))
    assert code == 2 and len(lines) == 1 and "argument --data: data file" in lines[0] and "corrupt" in lines[0]
    if not torch.cuda.is_available():
        code, lines = _main(capsys, "run", "--out", str(tmp_path / "o"), "--device", "cuda")
        assert code == 2 and "argument --device: 'cuda' requested but CUDA is not available" in lines[0]


# ------------------------------------------------------------------------------------- the default model


@pytest.mark.llm
def test_smoke_preset_with_the_default_model(tmp_path):
    """`python -m llm_runs run --preset smoke` with SmolLM2-135M-Instruct: trajectory.csv has every sim column and
    the LLM columns, the run completes, the losses stay above their floor, and no LP fails."""
    res = subprocess.run([sys.executable, "-m", "llm_runs", "run", "--preset", "smoke", "--out", str(tmp_path),
                          "--no-progress"], capture_output=True, text=True, timeout=1800, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    rec = pd.read_csv(tmp_path / "trajectory.csv")
    assert list(rec.columns[: len(al.RECORD_COLUMNS)]) == list(al.RECORD_COLUMNS)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "complete" and s["model"]["name"] == "SmolLM2-135M-Instruct"
    for o in s["objectives"]:
        assert f"loss_{o}" in rec.columns and f"heldout_acc_{o}" in rec.columns
        assert s["min_loss"][o]["min_any_loss"] > s["min_loss"][o]["floor"]
    counts = s["lp_step_status_counts"]
    assert counts["infeasible"] == counts["iteration_limit"] == counts["solver_error"] == 0


def _cpu_preset_model(seed=0):
    """SmolLM2-135M with the cpu preset's LoRA adapter and DPO settings (loaded anew: LoRA wraps it in place)."""
    from llm_runs.model.models import LoraSettings, add_lora, load_model
    from llm_runs.training.objectives import PreferenceModel

    p = PRESETS["cpu"]
    model, tok = load_model(None, device="cpu")
    settings = DPOSettings(beta=p.beta, label_smoothing=p.label_smoothing, max_response_tokens=p.max_response_tokens,
                           autocast=None if p.autocast is None else getattr(torch, p.autocast))
    return p, PreferenceModel(add_lora(model, LoraSettings(r=p.lora_r, alpha=p.lora_alpha, seed=seed)), tok, settings)


def _cpu_federation(pm, p, seed=0):
    from llm_runs.preferences.data import trained_candidates

    cands = trained_candidates(load_candidates(), pm.tokenizer, p.max_response_tokens, p.design.objectives)
    return build_federation(cands, p.design, np.random.default_rng(seed))


@pytest.mark.llm
def test_at_the_base_model_every_loss_is_ln2_on_the_default_model():
    """SmolLM2-135M at the LoRA initialisation, the cpu preset's settings (48 tokens, its precision): a client's
    training losses (in the CPU layout) and the held-out losses (float32) are ln 2 to 1e-4. The negative control: a
    reference computed as the old cache did (one padded batch under bf16 autocast) against the policy as the preset
    runs it (per sequence, its own precision) is off by more than 1e-4. The layout alone (per sequence against one
    padded batch, both in bf16) depends on the CPU's bf16 kernels: it gave exactly 0 on an AMD EPYC with AVX512_BF16
    (2026-12-02), so it cannot be the control."""
    from llm_runs.training.objectives import _pair_key

    p, pm = _cpu_preset_model()
    fed = _cpu_federation(pm, p)
    lobj = LoraObjectives(pm, fed)
    src = TorchSource(lobj, fed.prefs, fed.n_samples, psi_star=np.zeros(fed.n_clients))
    w = lobj.initial()
    excess = src.evaluate(w[None], np.array([0])).losses[0]
    np.testing.assert_allclose(excess + lobj.reference_point, np.log(2.0), rtol=0, atol=1e-4)
    held = pm.evaluate(fed.heldout_batches())
    for o, v in held.items():
        assert abs(v["loss"] - np.log(2.0)) <= 1e-4, (o, v)
    every = [k for i in range(fed.n_clients) for pairs in fed.batch(i).values() for q in pairs for k in _pair_key(q)]
    by_length = {len(pm._encode(k)[0]): k for k in every}  # sequences of different lengths: a padded batch
    keys = list(by_length.values())[:16]
    assert len(keys) >= 4
    assert pm.settings.autocast is None  # the cpu preset's precision: float32
    with torch.no_grad():
        alone = torch.stack([pm.sequence_logps([k])[0] for k in keys])
        pm.settings = replace(pm.settings, autocast=torch.bfloat16)
        with pm.model.disable_adapter():
            padded = pm.sequence_logps(keys)
    assert float((alone - padded).abs().max()) > 1e-4


@pytest.mark.llm
def test_the_larger_preference_ends_with_the_smaller_training_loss_on_the_default_model():
    """Two clients on the same training pairs of the cpu preset (2 per objective) with lambda = (.6, .2, .2) and
    (.2, .6, .2), 10 LP steps of the preset's step size from the base model: each of the first two objectives ends
    with the smaller excess training loss for the client that weighs it more."""
    p, pm = _cpu_preset_model()
    fed = _cpu_federation(pm, p)
    prefs = np.array([[0.6, 0.2, 0.2], [0.2, 0.6, 0.2]])
    same = replace(fed, prefs=prefs, data=(fed.data[0], fed.data[0]), centre=np.zeros(2, dtype=np.int64),
                   prompt_ids=(fed.prompt_ids[0], fed.prompt_ids[0]),
                   design=replace(fed.design, n_train=2, n_new=0))
    obj = LoraObjectives(pm, same, heldout=False)
    src = TorchSource(obj, prefs, same.n_samples, psi_star=np.zeros(2))
    eta = p.algorithm.phase1.eta_local
    res = al.pipeline2(src, np.array([0, 1]), obj.initial(), al.Pipeline2Config(max_steps=10, eta=eta, tol=0.0,
                                                                             decay_steps=None, select="last"))
    e = src.losses(res.w, np.array([0, 1]))
    assert e[0, 0] < e[1, 0] and e[1, 1] < e[0, 1], e


@pytest.mark.parametrize("extensions, device, expected", [
    ((), "cpu", None),  # bf16 emulated: float32
    (("avx2", "fma"), "cpu", None),
    (("avx2", "avx512f", "avx512_bf16"), "cpu", "bfloat16"),
    (("avx2", "amx_tile", "amx_bf16"), "cpu", "bfloat16"),
    ((), "cuda", "bfloat16"),
])
def test_autocast_auto_takes_bf16_where_the_device_has_native_bf16_matrix_instructions(
        monkeypatch, extensions, device, expected):
    monkeypatch.setattr(cli, "cpu_extensions", lambda: extensions)
    assert resolve_autocast("auto", device) == expected
    assert resolve_autocast("none", device) is None and resolve_autocast("bfloat16", device) == "bfloat16"


def test_autocast_auto_is_resolved_into_the_preset_the_run_records(monkeypatch):
    from llm_runs.__main__ import _preset_of, build_parser

    monkeypatch.setattr(cli, "cpu_extensions", lambda: ())
    args = build_parser().parse_args(["run", "--preset", "smoke", "--autocast", "auto", "--device", "cpu",
                                      "--out", "x"])
    assert _preset_of(args).autocast is None
    monkeypatch.setattr(cli, "cpu_extensions", lambda: ("avx512_bf16",))
    assert _preset_of(args).autocast == "bfloat16"
    with pytest.raises(ValueError, match="autocast must be one of .*got 'fp16'"):
        resolve_autocast("fp16")
