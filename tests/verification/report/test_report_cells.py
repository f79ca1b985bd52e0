"""The report on Dask (python -m verification report --workers K | --scheduler ADDRESS): a 2-worker LocalCluster
(the session's, tests/conftest.py), three cheap statements at the default scale, no LLM section, no studies.

Its results.json equals the serial report's field by field apart from timings; a worker killed mid-report has its
cells run again, each written once; after a kill -9 of the report process, --resume computes only the cells not
finished; the scheduling arithmetic (critical path, predicted wall time) on a small graph."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from verification.core import registry
from verification.core.evidence import to_jsonable
from verification.core.search import Budget
from verification.engine.dask_engine import read_cell, run_cells
from verification.report import cells as report_cells
from verification.report.dashboard import build_report

IDS = ("H.9", "H.14", "S4")  # H.9 and H.14 with a search box (a search cell and a check cell), S4 a check cell only
ROOT = Path(__file__).resolve().parents[3]


def _report(out, **kw):
    return build_report(out, ids=list(IDS), studies=False, llm=False, progress=lambda _: None, **kw)


def _results(out) -> list:
    return json.loads((Path(out) / "results.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial") / "rep"
    _report(out)
    return out


@pytest.fixture
def client(dask_client_2_each):
    """The session's cluster of worker processes, both workers up before each test (a test kills one): for a
    killed worker and a scheduler reached from another process (the ``e2e`` tier)."""
    return dask_client_2_each


@pytest.fixture(scope="module")
def inprocess_client(dask_inprocess_client):
    """A cluster of threads in this process: the engine's cells, files and results without worker processes."""
    return dask_inprocess_client


def _cell_names(out) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in (Path(out) / "cells").rglob("*.json"))


WANT_CELLS = sorted([f"cells/{s}/check.json" for s in IDS] + [f"cells/{s}/search.json" for s in ("H.9", "H.14")])


def test_report_on_two_workers_equals_the_serial_report(serial, inprocess_client, tmp_path):
    out = tmp_path / "rep"
    res = _report(out, client=inprocess_client)
    assert report_cells.results_differences(_results(serial), _results(out)) == []
    assert _cell_names(out) == WANT_CELLS
    assert sorted(res.cells.written) == sorted(f"{s}/{k}" for s in IDS for k in ("check", "search")
                                              if k == "check" or s != "S4")
    # the statements' own files are the serial report's, byte for byte (instances.csv, worst/, figure data)
    for rel in ("instances.csv", "worst/H.9.json", "worst/H.14.json"):
        assert (out / rel).read_bytes() == (serial / rel).read_bytes(), rel
    for p in (serial / "data").rglob("*.csv"):
        assert (out / p.relative_to(serial)).read_bytes() == p.read_bytes(), p
    costs = report_cells.cell_costs(report_cells.report_cells(out, _stmts(), seed=registry.DEFAULT_SEED,
                                                              scale="default", budget="stored"))
    assert len(costs) == 5 and all(c["cpu_seconds"] >= 0 and c["wall_seconds"] > 0 for c in costs)


def _stmts():
    return registry.resolve(list(IDS))


@pytest.mark.e2e
def test_a_killed_worker_has_its_cells_run_again_once(serial, client, tmp_path):
    """A worker process killed while it runs a cell: the report completes, every cell written once, the results
    those of the serial report."""
    killed: dict = {}

    def kill_a_busy_worker():
        for _ in range(400):
            busy = {w: keys for w, keys in client.processing().items() if keys}
            if busy:
                addr, keys = next(iter(busy.items()))
                pid = client.run(os.getpid, workers=[addr])[addr]
                os.kill(pid, signal.SIGKILL)
                killed.update(addr=addr, keys=list(keys))
                return
            time.sleep(0.02)

    t = threading.Thread(target=kill_a_busy_worker)
    t.start()
    try:
        res = _report(tmp_path / "rep", client=client)
    finally:
        t.join()
    assert killed.get("keys"), "no worker was killed while it ran a cell"
    assert res.cells.complete and not res.cells.failed and not res.cells.kept
    assert len(res.cells.written) == len(set(res.cells.written)) == len(WANT_CELLS)
    assert _cell_names(tmp_path / "rep") == WANT_CELLS
    assert report_cells.results_differences(_results(serial), _results(tmp_path / "rep")) == []


@pytest.mark.e2e
def test_resume_after_kill_9_computes_only_the_unfinished_cells(serial, client, tmp_path):
    """The report process (the command line on the session's cluster) is killed with SIGKILL once its first cell
    is written; `--resume` keeps every cell written by then and computes the others, the results those of the
    serial report."""
    out = tmp_path / "rep"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "verification", "report", *IDS, "--no-llm", "--no-studies",
                             "--scheduler", client.scheduler.address, "--out", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not ((out / "cells").is_dir() and _cell_names(out)):
            assert proc.poll() is None, "the report ended before a cell was written"
            assert time.monotonic() < deadline, "no cell written in 120 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    finished = _cell_names(out)
    assert finished and not (out / "results.json").exists()
    res = _report(out, client=client, resume=True)
    kept = sorted(f"cells/{k}.json" for k in res.cells.kept)
    assert kept == finished  # nothing finished is computed again
    assert sorted(res.cells.kept + res.cells.written) == sorted(
        f"{s}/{k}" for s in IDS for k in ("check", "search") if k == "check" or s != "S4")
    assert report_cells.results_differences(_results(serial), _results(out)) == []


#: A search budget with a differential evolution, small enough for a test (two islands, two chains per statement).
TINY_DE = Budget("tiny DE", initial=4, refine=2, de_maxiter=1, de_popsize=2, max_refined=2)


@pytest.mark.e2e
def test_paper_scale_search_cells_on_two_workers_equal_the_serial_report(inprocess_client, tmp_path):
    """At the paper scale with a search budget, every statement's search is a design cell, one cell per island of
    its differential evolution and one per refinement chain (which waits for the design and the islands); on two
    workers, each check cell (result row, worst/ and counterexamples/ files, tables) equals the serial report's."""
    stmts = registry.resolve(["H.15", "H.9"])  # H.15 with a conclusion to refine, H.9 without
    cells = report_cells.report_cells(tmp_path, stmts, seed=registry.DEFAULT_SEED, scale="paper", budget=TINY_DE)
    names = ["search-design", "search-de-0", "search-de-1", "search-chain-0", "search-chain-1", "check"]
    assert sorted(c.key for c in cells) == sorted(f"{s.id}/{n}" for s in stmts for n in names)
    assert {c.key: c.deps for c in cells}["H.15/search-chain-1"] == (
        "H.15/search-design", "H.15/search-de-0", "H.15/search-de-1")
    run = run_cells(inprocess_client, cells, desc="report", progress=False)
    assert run.complete and not run.failed
    for s in stmts:
        serial = json.loads(json.dumps(to_jsonable(report_cells.run_statement(s, registry.DEFAULT_SEED, "paper",
                                                                             TINY_DE))))
        cell = read_cell(report_cells.cell_file(tmp_path, s.id, report_cells.CHECK_CELL))
        assert report_cells.results_differences(serial, cell, volatile=report_cells.VOLATILE_KEYS | {"cost"}) == []
        assert cell["row"]["details"]["search"]["budget"] == "tiny DE"


def test_critical_path_and_predicted_wall_time():
    costs = [{"key": "a/search", "deps": [], "cpu_seconds": 4.0}, {"key": "b/search", "deps": [], "cpu_seconds": 1.0},
             {"key": "a/check", "deps": ["a/search"], "cpu_seconds": 2.0},
             {"key": "b/check", "deps": ["b/search"], "cpu_seconds": 1.0},
             {"key": "c/check", "deps": [], "cpu_seconds": 3.0}]
    assert report_cells.critical_path(costs) == (6.0, ["a/search", "a/check"])
    assert report_cells.predicted_wall(costs, 1) == 11.0
    # two workers: a/search 0-4 | b/search 0-1, b/check 1-2, c/check 2-5; a/check 4-6
    assert report_cells.predicted_wall(costs, 2) == 6.0
    assert report_cells.predicted_wall(costs, 8) == 6.0
    with pytest.raises(ValueError, match="workers"):
        report_cells.predicted_wall(costs, 0)


def test_results_differences_names_each_field_and_ignores_timings():
    a = [{"id": "X", "seconds": 1.0, "details": {"cpu_seconds": 3, "v": [1, 2.0]}}]
    b = [{"id": "X", "seconds": 2.0, "details": {"cpu_seconds": 4, "v": [1, 2.5], "new": 1}}]
    assert report_cells.results_differences(a, b) == [
        "results.json[0].details.new: absent in the first, present in the second",
        "results.json[0].details.v[1]: 2.0 in the first, 2.5 in the second"]
    assert report_cells.results_differences(a, a) == []
