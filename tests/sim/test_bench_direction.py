"""Speed of the LP kernel, as ratios to references timed in the same process (pytest-benchmark; ``make bench``).

For each m, on ``N_BATCH = 1024`` instances of the ``gaussian`` family:

* ``highs``     — :func:`lp_direction_reference` (``scipy.optimize.linprog(method="highs")``, one LP at a time) on
  ``N_REFERENCE`` instances per round, each round the next ones: the reference every ratio is taken against;
* ``numpy``     — ``lp_direction(..., backend="numpy")`` on the whole batch (the vectorised reference solver);
* ``compiled``  — ``lp_direction(..., backend="compiled")`` on the whole batch;
* ``loop``      — a straight compiled loop over the same instances (:func:`straight_loop`: the compiled twin's loop
  over the instances — the builder a block of instances at a time, the solver per instance — called once from Python,
  outputs preallocated, no input checks, no result assembly): the limit of this design, which the batched call should
  stay within 2x of;
* ``single``    — ``lp_direction(l_i, λ_i, C_i)`` one instance per call (``auto``: the compiled twin), over
  ``N_SINGLE`` instances: how a training loop calls the kernel for one client at a time;
* ``single_numpy`` — the same with ``backend="numpy"``.

Every time is the best round of pytest-benchmark divided by the number of LP instances in the round (µs per LP;
input validation included everywhere except ``loop``); every round lasts a few milliseconds (see ``N_REFERENCE``). ``test_bench_table`` prints the table with the ratios
``highs / compiled`` (target >= 1000 at m = 3 and 5), ``highs / single`` (target >= 40) and ``compiled / loop``
(target <= 2), the CPU and the date; the recorded table of docs/performance.md is copied from it, and the JSON
that ``make bench`` writes (``reports/bench.json``) is rendered there by ``make docs``. Other processes share the CPU: run it
several times and report the spread; only ratios within one run are comparable.
"""

from __future__ import annotations

import datetime

import numpy as np
import pytest

from sim import cli
from sim.direction import lp_direction, lp_direction_reference
from sim.problems.generic import lp_instance_family

pytestmark = pytest.mark.bench

MS = (2, 3, 5, 10)
N_BATCH = 1024
# Every variant is timed in rounds of a few milliseconds, and the best round counts: on a shared CPU a short round
# can run undisturbed, a long one cannot, so rounds of equal length keep the ratios fair.
N_REFERENCE = 4  # HiGHS instances per round (about 1 ms each)
N_SINGLE = 256  # single calls per round
N_SINGLE_NUMPY = 8
ROUNDS = {"highs": 60, "single_numpy": 40}  # others: 15
VARIANTS = ("highs", "numpy", "compiled", "loop", "single", "single_numpy")
TARGETS = {"batch": 1000.0, "single": 40.0, "loop": 2.0}
RESULTS: dict[tuple[int, str], dict[str, float]] = {}


def _instances(m):
    rng = np.random.default_rng(m)
    return lp_instance_family("gaussian", rng, N_BATCH, m)


def straight_loop(l, lam, C):
    """The compiled twin's loop over every instance (``instance_loop``: no checks, no result assembly), with its
    outputs and scratch arrays allocated once: the reference of the batched call."""
    from sim import _lp_compiled as kern
    from sim.direction import _compiled_params, _jstar_tol

    N, m = l.shape
    out = (np.empty((N, 2 * m + 5)), np.empty((N, 2 * m + 4), dtype=bool), np.empty((N, 2), dtype=np.int64))
    ws = kern._workspace(m)
    args = (1e-4, True, _jstar_tol(0.0), 0, -1, _compiled_params())
    return lambda: kern.instance_loop(l, lam, C, *args, *ws, *out)


def _runner(variant, m):
    inst = _instances(m)
    l, lam, C = (np.ascontiguousarray(a) for a in (inst.losses, inst.prefs, inst.gram))
    if variant == "highs":
        start = iter(range(0, N_BATCH, N_REFERENCE))

        def highs():
            i = next(start, 0)
            lp_direction_reference(l[i : i + N_REFERENCE], lam[i : i + N_REFERENCE], C[i : i + N_REFERENCE])

        return highs, N_REFERENCE
    if variant in ("numpy", "compiled"):
        return (lambda: lp_direction(l, lam, C, backend=variant)), N_BATCH
    if variant == "loop":
        return straight_loop(l, lam, C), N_BATCH
    n = N_SINGLE if variant == "single" else N_SINGLE_NUMPY
    backend = "auto" if variant == "single" else "numpy"

    def singles():
        for i in range(n):
            lp_direction(l[i], lam[i], C[i], backend=backend)

    return singles, n


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("m", MS)
def test_bench_lp_kernel(benchmark, m, variant):
    fn, n = _runner(variant, m)
    fn()  # warm up: imports, HiGHS, the compiled kernels' cache
    benchmark.pedantic(fn, rounds=ROUNDS.get(variant, 15), iterations=1, warmup_rounds=1)
    if benchmark.stats is None:  # --benchmark-disable: nothing was timed
        return
    st = benchmark.stats.stats
    RESULTS[m, variant] = dict(best=st.min / n * 1e6, median=st.median / n * 1e6)
    benchmark.extra_info.update(m=m, variant=variant, instances_per_round=n, us_per_lp=st.min / n * 1e6)


def _table() -> list[str]:
    cpu = cli.cpu_name()
    lines = [f"LP kernel, µs per LP (best round; median in brackets), {cpu}, {datetime.date.today().isoformat()}",
             "| m | HiGHS | numpy batch | compiled batch | straight loop | single call | single numpy | "
             "HiGHS/compiled | HiGHS/single | compiled/loop |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in MS:
        r = {v: RESULTS.get((m, v)) for v in VARIANTS}
        if any(x is None for x in r.values()):
            continue
        cell = {v: f"{r[v]['best']:.3g} ({r[v]['median']:.3g})" for v in VARIANTS}
        hb = r["highs"]["best"]
        batch, single, loop = hb / r["compiled"]["best"], hb / r["single"]["best"], \
            r["compiled"]["best"] / r["loop"]["best"]
        flag = m in (3, 5)
        lines.append(
            f"| {m} | {cell['highs']} | {cell['numpy']} | {cell['compiled']} | {cell['loop']} | {cell['single']} | "
            f"{cell['single_numpy']} | {batch:.0f}x{' (target 1000x: ' + ('met' if batch >= TARGETS['batch'] else 'MISSED') + ')' if flag else ''} | "
            f"{single:.0f}x (target 40x: {'met' if single >= TARGETS['single'] else 'MISSED'}) | "
            f"{loop:.2f} (target <= 2: {'met' if loop <= TARGETS['loop'] else 'MISSED'}) |")
    return lines


def test_bench_table(benchmark):
    """Prints the ratio table of this run (after every test_bench_lp_kernel case)."""
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    if benchmark.stats is None:
        return
    print("\n" + "\n".join(_table()))
