"""Speed of the batched LP solver against the HiGHS reference, in the same process (pytest-benchmark).

Run with ``make bench`` (``pytest -m bench --benchmark-enable``). Each benchmark times ``lp_direction`` on a
batch of N = 1024 instances; the HiGHS reference is timed in the same run on a subset of the same instances
(it solves them one by one, so its time per instance does not depend on the batch). The ratio of the two
times per instance is stored in ``extra_info`` and printed; the README's table is copied from this output.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from sim.direction import lp_direction, lp_direction_reference
from sim.problems.generic import lp_instance_family

pytestmark = pytest.mark.bench

N_BATCH = 1024
N_REFERENCE = 128  # HiGHS instances timed (about 0.1 s at ~1 ms each)
RESULTS: dict[int, dict[str, float]] = {}


def _reference_seconds_per_instance(losses, prefs, gram, repeats=3):
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        lp_direction_reference(losses[:N_REFERENCE], prefs[:N_REFERENCE], gram[:N_REFERENCE])
        best = min(best, (time.perf_counter() - t0) / N_REFERENCE)
    return best


@pytest.mark.parametrize("m", [2, 3, 5, 10])
def test_bench_batched_vs_highs(benchmark, m):
    rng = np.random.default_rng(m)
    losses, prefs, _, gram = lp_instance_family("gaussian", rng, N_BATCH, m)
    lp_direction_reference(losses[:4], prefs[:4], gram[:4])  # warm up scipy's import and HiGHS
    ref = _reference_seconds_per_instance(losses, prefs, gram)
    res = benchmark(lp_direction, losses, prefs, gram)
    assert np.all(res.status == "optimal")
    if benchmark.stats is None:  # --benchmark-disable: nothing was timed
        return
    ours = benchmark.stats.stats.min / N_BATCH
    ratio = ref / ours
    benchmark.extra_info.update(
        m=m, batch=N_BATCH, highs_us_per_instance=ref * 1e6, batched_us_per_instance=ours * 1e6, speedup=ratio
    )
    RESULTS[m] = dict(highs=ref * 1e6, batched=ours * 1e6, speedup=ratio)
    print(f"\nm={m:2d}: HiGHS {ref * 1e6:8.1f} us/LP, batched {ours * 1e6:6.2f} us/LP, speed-up {ratio:6.0f}x")
