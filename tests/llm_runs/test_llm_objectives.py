"""Per-objective DPO losses, gradients over the LoRA parameters, Gram matrix and d = G mu (tiny random Llama)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llm_runs.model.models import add_lora, tiny_llama  # noqa: E402
from llm_runs.training.objectives import (  # noqa: E402
    LAYOUTS,
    DPOSettings,
    ObjectiveLossError,
    PreferenceModel,
    binary_entropy,
    dpo_step,
    objective_gradients,
    objective_losses,
    weighted_gradient,
)
from sim.direction import lp_direction  # noqa: E402
from tests.llm_helpers import make_pairs, tiny_preference_model  # noqa: E402

ORDERS = {
    "first": ((0, 1), (0, 2)),
    "second": ((1, 0), (2, 1)),
    "third": ((2, 0), (1, 2)),
}


@pytest.fixture(scope="module")
def pm():
    return tiny_preference_model()


@pytest.fixture(scope="module")
def batches():
    return {name: make_pairs(name, order) for name, order in ORDERS.items()}


@pytest.fixture(scope="module")
def res(pm, batches):
    return objective_gradients(pm, batches)


def _autograd_grad(pm, loss):
    return pm.flat_grad(torch.autograd.grad(loss, pm.params, allow_unused=True))


def test_columns_are_per_objective_autograd_gradients_and_gram_is_GtG(pm, batches, res):
    assert res.G.shape == (pm.n_params, 3) and res.G.dtype == torch.float64
    for j, (name, pairs) in enumerate(batches.items()):
        loss = pm.pair_losses(pairs)[0].mean()
        assert res.losses[j] == pytest.approx(loss.item(), rel=1e-12)
        np.testing.assert_allclose(res.G[:, j].numpy(), _autograd_grad(pm, loss).numpy(), rtol=0, atol=1e-12)
        assert np.linalg.norm(res.G[:, j].numpy()) > 0, name
    G = res.G.numpy()
    np.testing.assert_allclose(res.gram, G.T @ G, rtol=1e-12, atol=0)
    assert res.gram.dtype == np.float64 and res.losses.dtype == np.float64


@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay != "separate"])
def test_layouts_give_the_same_losses_and_gradients(pm, batches, res, layout):
    """Equal to 1e-10 where the sequences run in the same padded batches; the ``sequence`` layout runs each
    sequence alone, and the model's RMSNorm computes in float32 even in a float64 model, so its gradients agree to
    float32 round-off (1e-6 relative; measured 9e-8)."""
    other = objective_gradients(pm, batches, layout=layout)
    np.testing.assert_allclose(other.losses, res.losses, rtol=1e-12)
    scale = float(res.G.abs().max())
    tol = 1e-6 if layout == "sequence" else 1e-10
    np.testing.assert_allclose(other.G.numpy(), res.G.numpy(), rtol=0, atol=tol * scale)


def test_direction_is_the_gradient_of_the_mu_weighted_loss(pm, batches, res):
    """d = G mu equals the autograd gradient of sum_j mu_j l_j (to 1e-6 relative: the model's RMSNorm computes
    in float32 even in a float64 model, so the backward is linear to float32 round-off only)."""
    lam = np.array([0.2, 0.3, 0.5])
    lp = lp_direction(res.losses, lam, res.gram)
    for mu in (lp.weights, np.array([0.25, 0.25, 0.5]), np.array([1.0, 0.0, 0.0])):
        d = res.direction(mu)
        total = sum(float(w) * pm.pair_losses(p)[0].mean() for w, p in zip(mu, batches.values(), strict=True))
        g = _autograd_grad(pm, total)
        np.testing.assert_allclose(d.numpy(), g.numpy(), rtol=0, atol=1e-6 * float(g.abs().max()))


def test_identical_objectives_give_the_single_objective_gradient(pm, batches):
    pairs = batches["first"]
    same = {"a": pairs, "b": pairs, "c": pairs}
    res = objective_gradients(pm, same, layout="shared")
    single = _autograd_grad(pm, pm.pair_losses(pairs)[0].mean())
    assert np.allclose(res.losses, res.losses[0], rtol=0, atol=0)
    lp = lp_direction(res.losses, [0.2, 0.3, 0.5], res.gram)
    d = res.direction(lp.weights)
    np.testing.assert_allclose(d.numpy(), single.numpy(), rtol=0, atol=1e-12 * float(single.abs().max()))


def test_weighted_sum_gradient_matches_direction(pm, batches, res):
    lam = np.array([0.5, 0.3, 0.2])
    total, g = weighted_gradient(pm, batches, lam)
    assert total == pytest.approx(float(lam @ res.losses), rel=1e-12)
    np.testing.assert_allclose(g.numpy(), res.direction(lam).numpy(), rtol=0, atol=1e-6 * float(g.abs().max()))


@pytest.mark.parametrize("max_pairs", [1, 1000])
def test_weighted_sum_in_chunks_is_the_full_batch_loss_and_gradient(pm, batches, max_pairs):
    """Chunks of at most ``max_pairs`` pairs (across objectives), each forward and backward on its own: the same loss
    and gradient as one pass over every pair, up to roundoff, and the same floor check."""
    lam = np.array([0.5, 0.3, 0.2])
    total, g = weighted_gradient(pm, batches, lam)
    t2, g2 = weighted_gradient(pm, batches, lam, max_pairs=max_pairs)
    assert t2 == pytest.approx(total, rel=1e-6)
    np.testing.assert_allclose(g2.numpy(), g.numpy(), rtol=0, atol=1e-5 * float(g.abs().max()))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_pairs must be a positive integer"):
            weighted_gradient(pm, batches, lam, max_pairs=bad)


def test_combine_steps_the_lora_parameters_along_minus_d(batches):
    pm = tiny_preference_model()
    first = objective_gradients(pm, batches, layout="shared")
    before = pm.flat_params().clone()
    mu = np.array([0.5, 0.5, 0.0])
    d = first.combine(mu, step_size=0.1)
    np.testing.assert_allclose(pm.flat_params().numpy(), (before - 0.1 * d).numpy(), rtol=0, atol=1e-15)
    opt = torch.optim.SGD(pm.params, lr=0.2)
    res2 = objective_gradients(pm, batches, layout="shared")
    before = pm.flat_params().clone()
    d2 = res2.combine(mu, optimizer=opt)
    np.testing.assert_allclose(pm.flat_params().numpy(), (before - 0.2 * d2).numpy(), rtol=0, atol=1e-15)
    assert all(p.grad is None for p in pm.params)


@pytest.mark.parametrize(
    "mu, match",
    [
        ([0.5, 0.6, -0.1], "entries >= 0"),
        ([0.5, 0.2, 0.2], "sum to 1"),
        ([0.5, 0.5], r"shape \(3,\)"),
        ([np.nan, 0.5, 0.5], "non-finite"),
    ],
)
def test_mu_off_the_simplex_is_rejected(res, mu, match):
    with pytest.raises(ValueError, match=match):
        res.direction(mu)


@pytest.mark.parametrize("lam, match", [([0.5, 0.5, 0.0], "open simplex"), ([0.6, 0.3, 0.3], "sum to 1")])
def test_weighted_sum_preference_off_the_simplex_is_rejected(pm, batches, lam, match):
    with pytest.raises(ValueError, match=match):
        weighted_gradient(pm, batches, lam)


def test_base_model_loss_is_ln2_and_only_B_matrices_get_gradient(batches):
    pm = tiny_preference_model(perturb=0.0)
    res = objective_gradients(pm, batches, layout="shared")
    np.testing.assert_allclose(res.losses, math.log(2), rtol=0, atol=1e-12)
    names = [n for n, p in sorted(pm.model.named_parameters()) if p.requires_grad]
    offsets = np.cumsum([0, *pm.sizes])
    G = res.G.numpy()
    for n, a, b in zip(names, offsets[:-1], offsets[1:], strict=True):
        if "lora_A" in n:
            assert np.all(G[a:b] == 0), n
        else:
            assert np.any(G[a:b] != 0), n


def test_loss_floor_is_binary_entropy_and_holds_along_training(batches):
    eps = 0.1
    settings = DPOSettings(label_smoothing=eps, beta=5.0, max_response_tokens=24)
    pm = tiny_preference_model(settings=settings)
    floor = binary_entropy(eps)
    assert settings.floor == floor
    assert floor == pytest.approx(-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)), rel=1e-15)
    # the per-pair loss is minimal at sigma(z) = 1 - eps, where it equals H(eps)
    z = torch.linspace(-20, 20, 4001, dtype=torch.float64)
    lz = -(1 - eps) * torch.nn.functional.logsigmoid(z) - eps * torch.nn.functional.logsigmoid(-z)
    assert float(lz.min()) >= floor - 1e-15
    z_star = math.log((1 - eps) / eps)
    lstar = -(1 - eps) * math.log(1 / (1 + math.exp(-z_star))) - eps * math.log(1 / (1 + math.exp(z_star)))
    assert lstar == pytest.approx(floor, rel=1e-14)
    opt = torch.optim.Adam(pm.params, lr=0.05)
    losses = [dpo_step(pm, batches["first"], opt, "first") for _ in range(6)]
    assert losses[-1] < losses[0]
    assert min(losses) > floor


def test_loss_at_its_floor_raises_naming_the_objective(pm, batches):
    floor = pm.settings.floor
    pm.check_loss("positivity", floor + 0.1)  # fine
    with pytest.raises(ObjectiveLossError, match="'positivity'.*floor"):
        pm.check_loss("positivity", floor * (1 + 1e-9))
    with pytest.raises(ObjectiveLossError, match="'relevance'.*not finite"):
        pm.check_loss("relevance", float("nan"))
    plain = tiny_preference_model(settings=DPOSettings(label_smoothing=0.0, max_response_tokens=24))
    with pytest.raises(ObjectiveLossError, match="'x'"):
        plain.check_loss("x", 0.0)


def test_nonfinite_loss_in_a_step_raises_naming_the_objective(batches):
    pm = tiny_preference_model()
    with torch.no_grad():
        pm.params[0].fill_(float("nan"))
    with pytest.raises(ObjectiveLossError, match="'first'.*not finite"):
        objective_gradients(pm, batches)


def test_reference_logps_are_cached_per_batch_and_adapter_independent(batches):
    pm = tiny_preference_model()
    keys = [(p.prompt, p.chosen) for p in batches["first"]]
    ref = pm.reference_map([keys])
    with torch.no_grad(), pm.model.disable_adapter():
        direct = pm.sequence_logps(keys)
    np.testing.assert_array_equal(torch.stack([ref[k] for k in keys]).numpy(), direct.numpy())
    with torch.no_grad():
        pol = pm.sequence_logps(keys)
    assert not torch.equal(pol, direct)  # the perturbed adapter changes the policy, not the reference
    n_cached = len(pm._ref)
    with torch.no_grad():
        for p in pm.params:
            p.mul_(2.0)
    again = pm.reference_map([keys])
    assert len(pm._ref) == n_cached  # the same batch is not run again
    np.testing.assert_array_equal(torch.stack([again[k] for k in keys]).numpy(), direct.numpy())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_at_the_lora_initialisation_every_loss_is_ln2_in_every_layout_under_bf16_autocast(batches, layout):
    """Policy and reference run the same batches in the same precision: at B = 0 every training loss is ln 2 (to
    1e-4; it is exact here) under bf16 autocast, and every held-out loss (float32) likewise."""
    model, tok = tiny_llama(seed=3)
    pm = PreferenceModel(add_lora(model), tok, DPOSettings(max_response_tokens=24, autocast=torch.bfloat16))
    res = objective_gradients(pm, batches, layout=layout)
    np.testing.assert_allclose(res.losses, math.log(2.0), rtol=0, atol=1e-4)
    np.testing.assert_allclose(objective_losses(pm, batches, layout=layout), math.log(2.0), rtol=0, atol=1e-4)
    for v in pm.evaluate(batches).values():
        assert abs(v["loss"] - math.log(2.0)) <= 1e-4 and v["accuracy"] == 0.5


@pytest.mark.parametrize("layout", LAYOUTS)
def test_population_losses_equal_the_gradient_evaluations_losses(pm, batches, layout):
    res = objective_gradients(pm, batches, layout=layout)
    np.testing.assert_array_equal(objective_losses(pm, batches, layout=layout), res.losses)


def test_evaluate_reports_loss_and_accuracy_per_objective(batches):
    pm = tiny_preference_model(perturb=0.0)
    ev = pm.evaluate(batches)
    for name in batches:
        assert ev[name]["loss"] == pytest.approx(math.log(2), abs=1e-12)
        assert ev[name]["accuracy"] == 0.5  # every margin is exactly 0 at the initialisation: ties
        assert ev[name]["pairs"] == len(batches[name])


def test_bad_arguments_are_rejected(pm, batches):
    with pytest.raises(ValueError, match="unknown layout"):
        objective_gradients(pm, batches, layout="fast")
    with pytest.raises(ValueError, match="empty batch"):
        objective_gradients(pm, {"a": batches["first"], "b": []})
    with pytest.raises(ValueError, match="label_smoothing"):
        DPOSettings(label_smoothing=0.5)
    with pytest.raises(ValueError, match="beta"):
        DPOSettings(beta=0.0)
    model, tok = tiny_llama()
    with pytest.raises(TypeError, match="peft model"):
        PreferenceModel(model, tok)
    with pytest.raises(ValueError, match="target modules"):
        add_lora(model, __import__("llm_runs.model.models", fromlist=["LoraSettings"]).LoraSettings(target_modules=("nope",)))


def test_grouped_logps_run_each_prompt_once_and_agree_with_the_padded_batch(pm, batches):
    """The held-out evaluation's prompt-grouped pass (one key-value cache per prompt, its responses continued from
    it) gives the padded batch's log-probabilities up to float32 round-off, and fewer tokens."""
    keys = list(dict.fromkeys(k for pairs in batches.values() for p in pairs for k in (
        (p.prompt, p.chosen), (p.prompt, p.rejected))))
    with torch.no_grad():
        full = pm.sequence_logps(keys, evaluation=True)
    t0 = pm.tokens_processed
    grouped = pm.grouped_logps(keys)
    assert grouped.dtype == torch.float64 and grouped.shape == (len(keys),)
    np.testing.assert_allclose(grouped.numpy(), full.numpy(), rtol=0, atol=1e-5)
    assert pm.tokens_processed - t0 < sum(len(pm._encode(k)[0]) for k in keys)


def test_grouped_margins_are_exactly_zero_at_the_lora_initialisation_and_move_after_a_step(batches):
    model = tiny_preference_model(dtype=torch.float32, perturb=0.0)
    out = model.grouped_pair_losses(batches)
    for loss, z in out.values():
        assert torch.equal(z, torch.zeros_like(z))
        np.testing.assert_array_equal(loss.numpy(), np.full(len(z), math.log(2.0)))
    with torch.no_grad():
        for p in model.params:
            p.add_(0.05 * torch.randn_like(p))
    moved = model.grouped_pair_losses(batches)
    assert any(float(z.abs().max()) > 0 for _, z in moved.values())
    with torch.no_grad():  # the padded-batch margins of the same model agree with the grouped ones
        ref = model.batch_pair_losses(batches, evaluation=True)
    for name in batches:
        np.testing.assert_allclose(moved[name][1].numpy(), ref[name][1].numpy(), rtol=0, atol=1e-5)
