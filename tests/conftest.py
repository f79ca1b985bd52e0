"""Fixtures shared by the command-line and report tests: statements that must not run, and a run interrupted
as Ctrl-C would interrupt it."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import resource
import sys
import warnings
from collections import defaultdict

import pytest

from verification.core import registry

# OpenMP threads that spin on a CPU shared with other jobs multiply torch's CPU time many times over (see
# llm_runs/__main__.py, OMP_ENV); set before any test module imports torch. A value set by the caller is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_RUN_STATEMENT = registry.run_statement


_DEFAULT_RUNS: dict = {}


@pytest.fixture(scope="session")
def default_run():
    """``default_run(stmt_id, seed=registry.DEFAULT_SEED)``: :func:`verification.core.registry.run_statement` of the
    registered statement with its default Config (no jitter, no bound factor), computed once per session, keyed by
    (id, seed), and handed out as a deep copy: the statement tests and the search and power tests that read the same
    default run share one. A test that checks determinism (two runs, same numbers) or that runs under a changed
    context (``bound_factor``, a monkeypatched kernel) calls ``registry.run_statement`` itself."""

    def get(stmt_id: str, seed: int = registry.DEFAULT_SEED):
        key = (stmt_id, seed)
        if key not in _DEFAULT_RUNS:
            _DEFAULT_RUNS[key] = _RUN_STATEMENT(registry.get_statement(stmt_id), seed=seed)
        return copy.deepcopy(_DEFAULT_RUNS[key])

    return get


@pytest.fixture
def no_statement_runs(monkeypatch):
    """Fail the test if any statement runs (a usage error must be found before any work)."""

    def fail(*args, **kwargs):
        raise AssertionError("a statement ran after a usage error")

    monkeypatch.setattr(registry, "run_statement", fail)


@pytest.fixture
def interrupt_after(monkeypatch):
    """``interrupt_after(k)``: from now on the (k+1)-th statement to run raises KeyboardInterrupt (as Ctrl-C
    would); returns the list of the ids that ran, filled as they run. Each call starts a new count."""

    def arm(k: int) -> list[str]:
        ran: list[str] = []

        def run(stmt, *args, **kwargs):
            if len(ran) == k:
                raise KeyboardInterrupt
            ran.append(stmt.id)
            return _RUN_STATEMENT(stmt, *args, **kwargs)

        monkeypatch.setattr(registry, "run_statement", run)
        return ran

    return arm


_CLUSTER_FIXTURE = "_dask_session_client"
_CLUSTER_STACK: list[contextlib.ExitStack] = []  # the open cluster's context, closed after its last test


@pytest.fixture(scope="session")
def _dask_session_client():
    """One LocalCluster of 2 worker processes (as `sweep --workers 2` starts) and its client for the whole session:
    the tests of the worker processes themselves (the ``e2e`` tier: the verification and LLM sweeps with a worker
    killed, the workers' pinned environment, a sweep process of its own) share it instead of starting a cluster
    each. Their modules run one after the other (:func:`pytest_collection_modifyitems`) and the cluster closes
    after the last test that uses it (:func:`pytest_runtest_teardown`), not at the session's end: an idle cluster
    costs CPU (its scheduler's event loop in this process, its nannies' and workers' heartbeats). Yields a list
    holding the current client: :func:`dask_client_2` replaces it when a killed worker does not come back."""
    pytest.importorskip("distributed")
    holder = [_open_cluster()]
    yield holder
    _close_cluster()


def _open_cluster():
    from verification.engine.dask_engine import dask_client

    stack = contextlib.ExitStack()
    c = stack.enter_context(dask_client(2))
    _CLUSTER_STACK.append(stack)
    return c


def _close_cluster() -> None:
    """Close the shared cluster if it is open; its worker processes' CPU time is the children's, counted as it
    closes: --cpu-times names it instead of charging it to the test after which it closes."""
    while _CLUSTER_STACK:
        start = _cpu()
        _CLUSTER_STACK.pop().close()
        _SESSION_CPU[_CLUSTER_KEY] = _SESSION_CPU.get(_CLUSTER_KEY, 0.0) + _cpu() - start


def _uses_cluster(item) -> bool:
    return _CLUSTER_FIXTURE in getattr(item, "fixturenames", ())


#: The test modules that build, train and sample LLMs: they run after all the others. Their tensors and tokenizers
#: leave this process's C heap in a state in which the small allocations of the numerical tests cost more (measured
#: on a 2-core Intel Xeon: HiGHS's option set-up 42 -> 53 us, tests/sim/test_direction.py 17 -> 23 CPU-s after
#: tests/llm_runs/test_llm_objectives.py, with or without the malloc settings of LLM_ENV; malloc_trim does not
#: restore it).
LLM_TESTS = "tests/llm_runs/"


def _is_llm(item) -> bool:
    return item.nodeid.startswith(LLM_TESTS)


_TORCH_THREADS: list[int] = []  # torch's own thread count, before the first LLM test set it to one


def pytest_runtest_setup(item):
    """The tests of :data:`LLM_TESTS` run with one torch thread (their tiny Llama's matrices are too small for a
    second thread to pay: llm_runs/gpu_check.sh measured 22.7 -> 20.3 CPU-s with one), except the ``bench`` and
    ``llm`` tests, which run with torch's own count (the benchmarks time both threads). In the default tier the
    LLM sweep's test set it as a side effect (``sweep --threads 1`` in this process) until that test went to the
    ``e2e`` tier."""
    torch = sys.modules.get("torch")
    if torch is None or not _is_llm(item):
        return
    if not _TORCH_THREADS:
        _TORCH_THREADS.append(torch.get_num_threads())
    own = item.get_closest_marker("bench") is not None or item.get_closest_marker("llm") is not None
    want = _TORCH_THREADS[0] if own else 1
    if torch.get_num_threads() != want:
        torch.set_num_threads(want)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """The order of the session, each module's tests in their order: the other modules, then the modules whose
    tests use the shared cluster one after the other (so that it is not kept open, idle, across the modules in
    between), then the modules of :data:`LLM_TESTS`."""
    users = {i.module for i in items if _uses_cluster(i)}

    def tier(item) -> int:
        return 1 if getattr(item, "module", None) in users else 2 if _is_llm(item) else 0

    items.sort(key=tier)  # stable: the collection order within each tier


_LAST_CLUSTER_USER: list = []  # [the last item of the session that uses the shared cluster, or None]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if not _LAST_CLUSTER_USER:  # the session's items are final once tests run
        _LAST_CLUSTER_USER.append(next((i for i in reversed(item.session.items) if _uses_cluster(i)), None))
    if item is _LAST_CLUSTER_USER[0]:
        _close_cluster()


@pytest.fixture(scope="module")
def dask_inprocess_client():
    """A LocalCluster of 2 workers of one thread each in this process (``processes=False``) and its client: the
    engine's scheduling, cells, files and resumption as on the worker processes of :func:`dask_client_2`, without
    their start-up and heartbeats (about 9 CPU-s a session). Its scheduler's address is ``inproc://``, reachable
    from this process only. What needs worker processes (their pinned environment, a killed worker, a scheduler
    reached from another process) is tested on :func:`dask_client_2` in the ``e2e`` tier."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        yield client


#: How long a test module waits for a worker killed by an earlier module to be back (its nanny starts a new
#: process; the scheduler registers it) before it replaces the cluster. Seen once in CI: after a SIGKILL the nanny's
#: new worker never registered (1 of 2 workers after 120 s, three modules failing at set-up).
RESTART_WAIT = 60.0


@pytest.fixture(scope="module")
def dask_client_2(_dask_session_client):
    """The session's 2-worker cluster, for a test module, with both workers up (:func:`_two_workers`)."""
    return _two_workers(_dask_session_client)


@pytest.fixture
def dask_client_2_each(_dask_session_client):
    """The session's 2-worker cluster, for one test, with both workers up (:func:`_two_workers`): for a module
    whose tests each kill a worker, so that a test after a kill does not depend on the nanny's restart."""
    return _two_workers(_dask_session_client)


def _two_workers(holder: list):
    """The shared cluster's client once both workers are up. A worker killed by an earlier test is restarted by
    its nanny and registered again by the scheduler; if it is not back within :data:`RESTART_WAIT` seconds, the
    cluster is closed and a new one started, with a warning that names the workers the scheduler had: the test
    needs two workers, not the nanny's restart."""
    try:
        holder[0].wait_for_workers(2, timeout=RESTART_WAIT)
    except TimeoutError:
        info = holder[0].scheduler_info().get("workers", {})
        states = {addr: w.get("status") for addr, w in info.items()}
        warnings.warn(f"the shared Dask cluster had {len(info)} of 2 workers after {RESTART_WAIT:g} s "
                      f"({states}): a new cluster replaces it", stacklevel=1)
        _close_cluster()
        holder[0] = _open_cluster()
        holder[0].wait_for_workers(2, timeout=120)
    return holder[0]


# --cpu-times FILE: the CPU seconds (user + sys, this process and its waited-for children) of each test file,
# its collection (the module's imports) and its tests' set-up, call and tear-down (a module or session fixture is
# charged to the file whose test first sets it up or last tears it down; the shared Dask cluster's tear-down, where
# its worker processes' CPU time is counted, to itself), written to FILE as JSON.
def pytest_addoption(parser):
    parser.addoption("--cpu-times", metavar="FILE", default=None,
                     help="write each test file's CPU seconds (user + sys, with children) to FILE as JSON")


_CPU: dict[str, float] = defaultdict(float)
_TESTS: dict[str, float] = {}
_SESSION_CPU: dict[str, float] = {}  # a session fixture's tear-down in the current test, charged to itself
_CLUSTER_KEY = "(the shared Dask cluster: its worker processes, tests/verification/engine/test_sweep.py and tests/llm_runs/test_llm_sweep.py)"


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    start = _cpu()
    yield
    if isinstance(collector, pytest.Module) and collector.config.getoption("--cpu-times"):
        _CPU[collector.nodeid] += _cpu() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = _cpu()
    yield
    if item.config.getoption("--cpu-times"):
        _TESTS[item.nodeid] = _cpu() - start - sum(_SESSION_CPU.values())
        _CPU[item.nodeid.split("::")[0]] += _TESTS[item.nodeid]
        for k, v in _SESSION_CPU.items():
            _CPU[k] += v
        _SESSION_CPU.clear()


def pytest_sessionfinish(session):
    path = session.config.getoption("--cpu-times")
    if path:
        with open(path, "w") as f:
            json.dump({"total": _cpu(), "files": dict(sorted(_CPU.items(), key=lambda kv: -kv[1])),
                       "tests": dict(sorted(_TESTS.items(), key=lambda kv: -kv[1]))}, f, indent=1)
