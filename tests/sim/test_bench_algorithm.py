"""Algorithm 1 on many clients: time per round of Phase 1 and Phase 2 against the number of clients N
(pytest-benchmark; ``make bench``).

The planted F1 problem of ``python -m sim.simulate --preset smoke --clients N`` (two planted groups, ``m = 3``,
``n_w = 5``) with N training clients in one cluster, and the smoke preset's phase configurations: Phase 1 with
``τ = 2`` local LP steps on population gradients, Phase 2 with ``K = 5`` inner LP steps on ``S = 8``-shot episodes.
A round solves one batched LP per local step for all N clients (``sim.direction.lp_direction``), plus the
population diagnostics; nothing in it is quadratic in N, so its time should grow linearly.

The time per round is ``(T(R2) - T(R1)) / (R2 - R1)``: two runs of the same phase with ``R1 = 1`` and ``R2`` rounds
(``ROUNDS``), so that setup and the final diagnostic row cancel. ``test_bench_algorithm_table`` fits
``t(N) = a + b·N`` (least squares over N in ``NS``) and prints the slope ``b`` (µs per client per round), the
intercept, and the per-client cost at the largest N over that at 10³ (1 for exactly linear growth).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.algorithm import phase1, phase2
from sim.simulate import PRESETS, build_problem

pytestmark = pytest.mark.bench

NS = (1_000, 3_000, 10_000)
ROUNDS = {"phase1": (1, 3), "phase2": (1, 2)}  # (R1, R2); a Phase 2 round takes seconds at N = 10^4
TIMES: dict[tuple[str, int, int], float] = {}
_PROBLEMS: dict[int, tuple] = {}


def _problem(N: int):
    if N not in _PROBLEMS:
        problem = PRESETS["smoke"].problem
        spec = replace(problem, n_train=N // problem.n_groups, n_new=0)
        src, w_ref, train, _, _ = build_problem(spec, np.random.default_rng(0))
        _PROBLEMS.clear()  # one problem in memory at a time
        _PROBLEMS[N] = (src, w_ref, train)
    return _PROBLEMS[N]


def _run(phase: str, N: int, rounds: int):
    src, w_ref, train = _problem(N)
    cfg = PRESETS["smoke"].config
    if phase == "phase1":
        c = replace(cfg.phase1, rounds=rounds)
        return lambda: phase1(src, train, w_ref, c, np.random.default_rng(1))
    c = replace(cfg.phase2, rounds=rounds)
    return lambda: phase2(src, train, w_ref, c, np.random.default_rng(1))


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("phase", ["phase1", "phase2"])
@pytest.mark.parametrize("N", NS)
def test_bench_algorithm_rounds(benchmark, N, phase, which):
    rounds = ROUNDS[phase][which]
    fn = _run(phase, N, rounds)
    res = benchmark.pedantic(fn, rounds=3 if phase == "phase1" else 2, iterations=1,
                             warmup_rounds=1 if phase == "phase1" else 0)
    assert res.records["client"].nunique() == N
    if benchmark.stats is not None:
        TIMES[phase, N, rounds] = benchmark.stats.stats.min
        benchmark.extra_info.update(N=N, phase=phase, rounds=rounds)


def test_bench_algorithm_table(benchmark):
    """Prints the per-round times, the fitted slope in N and the linearity ratio of this run."""
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    if benchmark.stats is None:
        return
    lines = ["Algorithm 1, seconds per round (best run) against the number of clients N"]
    for phase in ("phase1", "phase2"):
        R1, R2 = ROUNDS[phase]
        if not all((phase, N, r) in TIMES for N in NS for r in (R1, R2)):
            continue
        per = np.array([(TIMES[phase, N, R2] - TIMES[phase, N, R1]) / (R2 - R1) for N in NS])
        b, a = np.polyfit(np.array(NS, dtype=float), per, 1)
        lin = (per[-1] / NS[-1]) / (per[0] / NS[0])
        cells = ", ".join(f"N={N}: {t:.3g} s" for N, t in zip(NS, per, strict=True))
        lines.append(f"  {phase}: {cells}; slope {b * 1e6:.1f} µs per client per round, intercept {a * 1e3:.1f} ms; "
                     f"per-client cost at N={NS[-1]} / at N={NS[0]}: {lin:.2f}")
    print("\n" + "\n".join(lines))
