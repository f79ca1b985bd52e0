"""Sweeps on Dask (python -m verification sweep / grid): a 2-worker LocalCluster, small cells; in the default tier
its workers are threads of the test process, in the e2e tier (the killed worker, the workers' environment) the
session's worker processes.

A sweep's cells equal the serial `run` of the same (statement, seed); a rerun recomputes nothing; a worker killed
mid-sweep loses no cell and duplicates none; a scheduler that cannot be reached is a clear usage error within
seconds; the summary's counts and Clopper–Pearson bounds; the grid of Algorithm 1 runs on the same engine."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import time

import numpy as np
import pytest
from scipy import stats

from sim.simulate import PRESETS, preset_variant, simulate
from verification.__main__ import main as cli_main
from verification.core import registry, regression
from verification.engine import dask_engine, sweep
from verification.engine.dask_engine import WORKER_ENV, run_cells

FAST = ("H.9", "S4")  # statements whose cells take a fraction of a second
SEEDS = (0, 1)


def _without_seconds(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "seconds"}


@pytest.fixture(scope="module")
def client(dask_inprocess_client):
    """A LocalCluster of 2 one-thread workers in this process (tests/conftest.py): the engine's cells, files and
    resumption in the default tier."""
    return dask_inprocess_client


@pytest.fixture(scope="module")
def process_client(dask_client_2):
    """The session's LocalCluster of 2 worker processes (as `sweep --workers 2` starts, tests/conftest.py) and its
    client, both workers up: the tests of the worker processes themselves (the e2e tier)."""
    return dask_client_2


@pytest.fixture(scope="module")
def swept(client, tmp_path_factory):
    """The folder of `sweep H.9 S4 --seeds 0:2`, run through --scheduler on the module's cluster."""
    out = tmp_path_factory.mktemp("sweep") / "sw"
    rc = cli_main(["sweep", *FAST, "--seeds", "0:2", "--scheduler", client.scheduler.address, "--out", str(out),
                   "--quiet"])
    assert rc == 0
    return out


def _no_cluster(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a Dask cluster was started")

    monkeypatch.setattr(dask_engine, "dask_client", fail)


@pytest.mark.e2e
def test_local_cluster_pins_threads(process_client):
    client = process_client
    assert sorted(client.nthreads().values()) == [1, 1]
    envs = client.run(lambda: {k: os.environ.get(k) for k in WORKER_ENV})
    assert len(envs) == 2 and all(e == WORKER_ENV for e in envs.values())


def test_sweep_cells_equal_serial_run(swept, tmp_path):
    for seed in SEEDS:
        path = tmp_path / f"run{seed}.json"
        assert cli_main(["run", *FAST, "--seed", str(seed), "--json", str(path)]) == 0
        for row in json.loads(path.read_text()):
            cell = json.loads(sweep.cell_path(swept, row["id"], seed).read_text())
            assert _without_seconds(cell) == _without_seconds(row)
    files = sorted(p.relative_to(swept).as_posix() for p in (swept / "cells").rglob("*"))
    assert files == ["cells/H.9", "cells/H.9/0.json", "cells/H.9/1.json", "cells/S4", "cells/S4/0.json",
                     "cells/S4/1.json"]


def test_sweep_summary_files(swept):
    summary = json.loads((swept / "sweep.json").read_text())
    assert summary["ids"] == list(FAST) and summary["seeds"] == [0, 2] and summary["scale"] == "default"
    assert summary["cells"] == {"requested": 4, "finished": 4}
    by_id = {p["id"]: p for p in summary["statements"]}
    rows = {(sid, s): json.loads(sweep.cell_path(swept, sid, s).read_text()) for sid in FAST for s in SEEDS}
    h9 = by_id["H.9"]
    t = [rows["H.9", s]["tightness"] for s in SEEDS]
    assert h9["verdicts"]["holds"] == 2 and h9["negative_control"]["detected"] == 2
    assert (h9["tightness"]["min"], h9["tightness"]["max"]) == (min(t), max(t))
    assert h9["tightness"]["median"] == pytest.approx(np.median(t), rel=1e-15)
    assert h9["by_seed"]["seed"] == list(SEEDS) and h9["by_seed"]["tightness"] == t
    assert by_id["S4"]["negative_control"]["none"] == 2 and by_id["S4"]["tightness"]["max"] is None
    assert "monte_carlo" not in h9 and "monte_carlo" not in summary
    csv = (swept / "sweep.csv").read_text().splitlines()
    assert csv[0].split(",")[:3] == ["id", "name", "seeds"] and len(csv) == 3


def test_rerun_recomputes_nothing(swept, monkeypatch, capsys):
    stamps = {p: p.stat().st_mtime_ns for p in (swept / "cells").rglob("*.json")}
    _no_cluster(monkeypatch)
    monkeypatch.setattr(registry, "run_statement", lambda *a, **k: pytest.fail("a statement ran on a resume"))
    rc = cli_main(["sweep", *FAST, "--seeds", "0:2", "--workers", "2", "--out", str(swept), "--quiet"])
    assert rc == 0
    assert "4 cells, 0 computed, 4 already in" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (swept / "cells").rglob("*.json")} == stamps
    assert json.loads((swept / "sweep.json").read_text())["last_run"]["computed"] == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_scheduler_is_a_clear_usage_error(tmp_path, capsys, no_statement_runs):
    address = f"tcp://127.0.0.1:{_closed_port()}"
    t0 = time.perf_counter()
    rc = cli_main(["sweep", "H.9", "--seeds", "0:1", "--scheduler", address, "--out", str(tmp_path / "o")])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and took < 15
    assert err[-1].startswith("python -m verification sweep: error: argument --scheduler: cannot reach a Dask "
                              f"scheduler at '{address}' within 5 s")
    assert not list((tmp_path / "o").rglob("*.json"))


USAGE_ERRORS = {
    "empty seed range": (["sweep", "H.9", "--seeds", "4:4"], "argument --seeds: must be A:B"),
    "not a range": (["sweep", "H.9", "--seeds", "7"], "argument --seeds: must be A:B"),
    "negative seed": (["sweep", "H.9", "--seeds=-1:3"], "argument --seeds: must be A:B"),
    "no workers": (["sweep", "H.9", "--seeds", "0:2", "--workers", "0"], "argument --workers: must be an integer >= 1"),
    "both clusters": (["sweep", "H.9", "--seeds", "0:2", "--workers", "2", "--scheduler", "tcp://h:1"],
                      "argument --scheduler: not allowed with argument --workers"),
    "ids and --mc": (["sweep", "H.9", "--mc", "--seeds", "0:2"], "argument --mc: give statement ids or --mc"),
    "unknown id": (["sweep", "H.999", "--seeds", "0:2"], "argument ID: unknown statement id(s): H.999"),
    "bad timeout": (["sweep", "H.9", "--seeds", "0:2", "--connect-timeout", "0"], "argument --connect-timeout"),
    "grid axis": (["grid", "T=1,2", "--seeds", "0:2"], "unknown grid axis 'T'"),
    "grid K": (["grid", "K=0,4", "--seeds", "0:2"], "K: values must be >= 1; got 0"),
    "grid S": (["grid", "S=5000", "--seeds", "0:2"], "S: 5000 exceeds the 4000 samples"),
    "grid spread": (["grid", "delta_lambda=nan", "--seeds", "0:2"], "delta_lambda: values must be finite"),
    "grid twice": (["grid", "K=1", "K=2", "--seeds", "0:2"], "grid axis K given twice"),
}


@pytest.mark.parametrize("argv,message", USAGE_ERRORS.values(), ids=USAGE_ERRORS)
def test_usage_errors_before_any_work(argv, message, tmp_path, capsys, monkeypatch, no_statement_runs):
    _no_cluster(monkeypatch)
    rc = cli_main([*argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err


def test_a_sweep_summary_that_is_missing_unreadable_or_of_another_sweep_is_named(tmp_path):
    """The statement sweep's and the LLM sweep's summaries are read by one reader (dask_engine.read_summary_file):
    each failure names the file, and the folder the command wants."""
    from llm_runs.sweeps import sweep as llm_sweep

    for mod, want in ((sweep, "a finished sweep"), (llm_sweep, "`python -m llm_runs sweep`")):
        p = tmp_path / mod.SUMMARY_JSON
        with pytest.raises(dask_engine.CellFolderError, match=f"does not exist: DIR must be the --out folder of {want}"):
            mod.read_summary(tmp_path)
        p.write_text("{not json")
        with pytest.raises(dask_engine.CellFolderError, match=f"cannot read '{p}'"):
            mod.read_summary(tmp_path)
        other = llm_sweep if mod is sweep else sweep
        p.write_text(json.dumps({"sweep": other.SWEEP_KIND, "statements": [], "run_dirs": []}))
        with pytest.raises(dask_engine.CellFolderError, match="is not the summary of an? (statement|LLM) sweep"):
            mod.read_summary(tmp_path)
        key = "statements" if mod is sweep else "run_dirs"
        p.write_text(json.dumps({"sweep": mod.SWEEP_KIND, key: {}}))
        with pytest.raises(dask_engine.CellFolderError, match="is not the summary"):
            mod.read_summary(tmp_path)
        p.write_text(json.dumps({"sweep": mod.SWEEP_KIND, key: []}))
        assert mod.read_summary(tmp_path) == {"sweep": mod.SWEEP_KIND, key: []}
        p.unlink()


def test_other_parameters_or_bad_cells_are_refused(swept, tmp_path, capsys, monkeypatch, no_statement_runs):
    _no_cluster(monkeypatch)
    assert cli_main(["sweep", "H.9", "--seeds", "0:2", "--scale", "paper", "--out", str(swept)]) == 2
    assert "holds cells made with other parameters: scale 'default' there, 'paper' now" in capsys.readouterr().err
    assert cli_main(["grid", "--seeds", "0:2", "--out", str(swept)]) == 2  # a statement sweep's folder
    assert "sweep 'prefalign-verify statement sweep' there" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "params.json").write_text(json.dumps(sweep.sweep_params("default")))
    sweep.cell_path(bad, "H.9", 1).parent.mkdir(parents=True)
    sweep.cell_path(bad, "H.9", 1).write_text('{"id": "H.9"}')
    assert cli_main(["sweep", "H.9", "--seeds", "0:2", "--out", str(bad)]) == 2
    assert "1.json' is not a result row" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- summary


def _row(sid: str, verdict="holds", tightness=0.5, cex=0, control="detected", mc=None) -> dict:
    row = {"id": sid, "name": sid, "verdict": verdict, "tightness": tightness, "instances": 10, "excluded": 0,
           "negative_control": control, "counterexamples": cex, "seconds": 1.0}
    if mc is not None:
        row["details"] = {"mc_assertions": {"count": len(mc), "delta_each": 1e-4,
                                            "assertions": [{"label": f"a{k}", "failed": f} for k, f in enumerate(mc)]}}
    return row


def test_clopper_pearson_against_scipy_exact_interval():
    for k, n in [(0, 200), (1, 200), (3, 17), (17, 17), (5, 1000)]:
        lo, up = sweep.clopper_pearson(k, n, alpha=0.05)
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.90, method="exact")  # two 5% tails
        assert lo == pytest.approx(ci.low, abs=1e-12) and up == pytest.approx(ci.high, abs=1e-12)
    assert sweep.clopper_pearson(0, 200)[1] == pytest.approx(1 - 0.05 ** (1 / 200), rel=1e-12)
    st = sweep.budget_status(0, 200, 1e-4)
    assert st["status"] == "not resolved" and st["seeds_to_confirm"] == math.ceil(math.log(0.05) / math.log1p(-1e-4))
    assert sweep.budget_status(0, 40000, 1e-4)["status"] == "confirmed"
    assert sweep.budget_status(3, 200, 1e-4)["status"] == "exceeded"
    with pytest.raises(ValueError, match="k=3, n=2"):
        sweep.clopper_pearson(3, 2)


def test_summary_counts_and_monte_carlo():
    stmts = [registry.Statement("X.1", "1", "one", run=None), registry.Statement("X.2", "2", "two", run=None)]
    rows = {
        "X.1": {0: _row("X.1", tightness=0.25), 1: _row("X.1", "violated", "inf", cex=2, control="missed"),
                2: _row("X.1", tightness=None, cex=1)},
        "X.2": {s: _row("X.2", mc=[s == 1, s in (1, 2)]) for s in range(3)},
    }
    summary = sweep.summarize(stmts, [0, 1, 2], rows)
    x1, x2 = summary["statements"]
    assert x1["verdicts"]["holds"] == 2 and x1["verdicts"]["violated"] == 1
    assert x1["tightness"] == {"min": 0.25, "median": "inf", "max": "inf", "seeds": 2}
    assert x1["counterexamples"]["total"] == 3 and x1["counterexamples"]["seeds"] == [1, 2]
    assert x1["negative_control"] == {"detected": 2, "missed": 1, "none": 0}
    mc = x2["monte_carlo"]
    assert [(a["name"], a["failures"], a["seeds"], a["failure_seeds"]) for a in mc["assertions"]] == [
        ("a0", 1, 3, [1]), ("a1", 2, 3, [1, 2])]
    assert mc["any"]["failures"] == 2 and mc["any"]["budget"] == pytest.approx(2e-4)
    assert summary["monte_carlo"]["statements"] == ["X.2"] and summary["monte_carlo"]["failure_seeds"] == [1, 2]
    assert sweep.failed(summary, None)  # a violated verdict and a missed control fail the sweep
    csv = {r["id"]: r for r in sweep.csv_rows(summary)}
    assert csv["X.2"]["mc_failures"] == 2 and csv["X.1"]["counterexample_seeds"] == "1 2"


def test_monte_carlo_assertions_from_conclusions():
    row = _row("X.3")
    row["conclusions"] = [{"name": "eq 91", "kind": "bound", "counterexamples": 0},
                          {"name": "eq 90", "kind": "monte_carlo", "counterexamples": 1}]
    assert sweep.monte_carlo_assertions(row) == [{"name": "eq 90", "failed": True, "delta": None}]
    row["conclusions"] = row["conclusions"][:1]
    assert sweep.monte_carlo_assertions(row) is None


def test_monte_carlo_statements_are_those_whose_rows_carry_assertions():
    baseline = json.loads(regression.shipped_baseline().read_text())
    with_mc = [r["id"] for r in baseline if sweep.monte_carlo_assertions(r) is not None]
    assert [s.id for s in sweep.monte_carlo_statements()] == with_mc == ["H.17", "H.39-41", "H.43", "H.44", "H.45", "ThmA"]


def test_report_sweep_section(swept, tmp_path, capsys):
    out = tmp_path / "rep"
    assert cli_main(["report", "S4", "--no-studies", "--no-llm", "--sweep", str(swept), "--out", str(out)]) == 0
    md = (out / "README.md").read_text()
    assert "## Sweep over seeds" in md and "| H.9 | 2 | holds 2 |" in md
    assert (out / "figures" / "sweep_tightness.png").stat().st_size > 0
    page = (out / "index.html").read_text()
    assert "Sweep over seeds" in page and "<i>confirmed</i>" in page and "`" not in page  # Markdown written as HTML
    capsys.readouterr()
    assert cli_main(["report", "S4", "--sweep", str(tmp_path), "--out", str(out)]) == 2
    assert "argument --sweep:" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- grid


def test_grid_cells_figure_and_resume(client, tmp_path, capsys, monkeypatch):
    out = tmp_path / "grid"
    argv = ["grid", "K=4", "S=8", "--seeds", "0:2", "--scheduler", client.scheduler.address, "--out", str(out),
            "--quiet"]  # one point, two seeds (a cell is a whole smoke run of Algorithm 1)
    assert cli_main(argv) == 0
    (p,) = json.loads((out / "grid.json").read_text())["points"]
    assert (p["K"], p["S"], p["delta_lambda"], p["seeds"], p["errors"]) == (4, 8, 0.05, 2, 0)
    gaps = [json.loads((out / "cells" / "K=4,S=8,delta_lambda=0.05" / f"{s}.json").read_text())["gap_wII"]
            for s in (0, 1)]
    half = stats.t.ppf(0.975, 1) * np.std(gaps, ddof=1) / np.sqrt(2)
    assert p["gap_wII_mean"] == pytest.approx(np.mean(gaps), rel=1e-12)
    assert (p["gap_wII_ci_low"], p["gap_wII_ci_high"]) == pytest.approx((np.mean(gaps) - half, np.mean(gaps) + half))
    assert (out / "figures" / "pipeline_gap.png").stat().st_size > 0
    cell = json.loads((out / "cells" / "K=4,S=8,delta_lambda=0.05" / "1.json").read_text())
    _, serial = simulate(preset_variant(PRESETS["smoke"], K=4, S=8, spread=0.05), 1)
    assert cell["mean_final_gap"] == serial["mean_final_gap"] and cell["delta_lambda"] == serial["delta_lambda"]
    assert cell["gap_wII"] == serial["mean_final_gap"]["pipeline1_wII"] - serial["mean_final_gap"]["pipeline2"]
    capsys.readouterr()
    _no_cluster(monkeypatch)
    assert cli_main(argv) == 0
    assert "2 cells, 0 computed, 2 already in" in capsys.readouterr().out


def _echo(i: int) -> dict:
    time.sleep(0.01 * (i % 3))
    return {"i": i}


def test_cells_start_in_the_given_order_whatever_their_keys(client, tmp_path):
    """Cells of several statements (whose ids Dask would split into different task groups) run in submission order:
    a cell is written at most a few places (the cells in flight) after its place in the list."""
    ids = ["H.39-41", "H.43", "ThmA"]
    cells = [dask_engine.Cell(f"{ids[i % 3]}/{i // 3}", tmp_path / f"{i}.json", _echo, (i,)) for i in range(45)]
    run = run_cells(client, cells, progress=False)
    index = {c.key: i for i, c in enumerate(cells)}
    order = [index[k] for k in run.written]
    assert sorted(order) == list(range(45))
    assert max(i - place for place, i in enumerate(order)) <= 4, order


def test_run_cells_records_a_failed_cell_and_goes_on(client, tmp_path):
    def boom(x):
        if x == 1:
            raise RuntimeError("cell 1 fails")
        return {"x": x}

    cells = [dask_engine.Cell(f"c{x}", tmp_path / f"{x}.json", boom, (x,)) for x in range(3)]
    run = run_cells(client, cells, progress=False)
    assert sorted(run.written) == ["c0", "c2"] and list(run.failed) == ["c1"] and "cell 1 fails" in run.failed["c1"]
    assert not run.complete and not (tmp_path / "1.json").exists()
    assert json.loads((tmp_path / "2.json").read_text()) == {"x": 2}


@pytest.mark.e2e
def test_worker_killed_mid_sweep_loses_and_duplicates_no_cell(process_client, tmp_path):
    """Last of the module: its cluster goes on with the worker the nanny restarted."""
    seeds = range(6)
    stmt = registry.get_statement("H.9")
    killed: dict = {}
    c = process_client

    def kill_busy_worker(cell, result):
        if killed:
            return
        for _ in range(50):  # the first cell is written: the other worker is running one; kill its process
            busy = {w: keys for w, keys in c.processing().items() if keys}
            if busy:
                break
            time.sleep(0.05)
        addr, keys = max(busy.items(), key=lambda kv: len(kv[1]))
        pid = c.run(os.getpid, workers=[addr])[addr]
        os.kill(pid, signal.SIGKILL)
        killed.update(addr=addr, keys=list(keys), pid=pid)

    run = sweep.run_sweep(c, tmp_path, [stmt], seeds, progress=False, on_written=kill_busy_worker)
    assert killed["keys"], "no cell was in flight on the killed worker"
    assert run.complete and not run.failed and not run.kept
    assert sorted(run.written) == sorted(f"H.9/{s}" for s in seeds)  # every cell written, each once
    assert len(run.written) == len(set(run.written))
    assert sorted(p.name for p in (tmp_path / "cells" / "H.9").iterdir()) == sorted(f"{s}.json" for s in seeds)
    for s in seeds:  # the cells re-run after the kill hold the same rows as a serial run
        serial = registry.run_statement_row(stmt, s)[1]
        assert _without_seconds(json.loads(sweep.cell_path(tmp_path, "H.9", s).read_text())) == _without_seconds(serial)


def test_monte_carlo_budget_counts_tests_not_conclusions():
    """A statement's "any" budget is δ times the tests the budget table gives it, however many conclusions carry
    them (H.17: 12 tests in 2 conclusions; H.44: 5 tests, each also read as a [soft] conclusion), so the Monte
    Carlo statements together spend the family-wise budget the dashboard states."""
    from verification.core import montecarlo
    from verification.engine.sweep import _mc_summary, mc_budget

    budget = mc_budget()

    def rows(names, failed_at=()):
        return {seed: {"conclusions": [{"name": n, "kind": "monte_carlo", "counterexamples": int(seed in failed_at)}
                                       for n in names]} for seed in range(3)}

    h17 = _mc_summary("H.17", rows(["gamma", "d_bal"]), budget)
    assert h17["tests"] == 12 and h17["any"]["budget"] == pytest.approx(12 * budget["delta"])
    h44 = _mc_summary("H.44", rows([f"c{k}" for k in range(5)] + [f"c{k} [soft]" for k in range(5)], {1}), budget)
    assert h44["tests"] == 5 and h44["any"]["budget"] == pytest.approx(5 * budget["delta"])
    assert h44["any"]["failures"] == 1 and len(h44["assertions"]) == 10
    total = sum(_mc_summary(sid, rows(["a"]), budget)["any"]["budget"] for sid in montecarlo.ASSERTIONS)
    assert total == pytest.approx(budget["family_wise"])
    other = _mc_summary("X.1", rows(["a", "b"]), budget)  # outside the table: the conclusions' own levels
    assert other["tests"] == 2 and other["any"]["budget"] == pytest.approx(2 * budget["delta"])


# ------------------------------------------------------------------------------ the falsification search on Dask

SEARCH_FAST = ("H.17", "H.34")  # boxes whose evaluations take a fraction of a second


@pytest.fixture(scope="module")
def searched(client, tmp_path_factory):
    """The folder of `search H.17 H.34 --budget 12`, run through --scheduler on the module's cluster."""
    out = tmp_path_factory.mktemp("search") / "se"
    rc = cli_main(["search", *SEARCH_FAST, "--budget", "12", "--scheduler", client.scheduler.address,
                   "--out", str(out), "--quiet"])
    assert rc == 0
    return out


def test_search_cells_and_results(searched):
    from verification.core import search

    summary = json.loads((searched / "search.json").read_text())
    assert summary["budget"] == 12 and set(summary["statements"]) == set(SEARCH_FAST)
    for sid in SEARCH_FAST:
        stmt = registry.get_statement(sid)
        rec = json.loads((searched / "worst" / f"{sid}.json").read_text())
        assert rec["box"] == stmt.search.describe() and rec["budget"] == 12 and rec["date"]
        assert 0 < rec["evaluations"] <= 12  # the design's repeated points are taken from the cache
        cells = searched / "cells" / sid / search.check_code(stmt.module)["digest"][:16]  # the check's code of today
        assert (cells / "design-0.json").is_file() and (cells / "refine.json").is_file()
        assert rec["code_digest"] == search.check_code(stmt.module)["digest"]
        # each best record reproduces: the stored Config at the stored seed gives the stored ratio
        name, best = max(((k, v) for k, v in rec["conclusions"].items() if v["best_ratio"] is not None),
                         key=lambda kv: kv[1]["best_ratio"])
        ev = stmt.run(stmt.search.make_config(best["params"]), np.random.default_rng(best["seed"]))
        assert ev.conclusion(name).detect_factor == pytest.approx(best["best_ratio"], rel=1e-12)
        # the same cells in one process give the same best ratios (the design, then the plan's chains)
        d = search.merge_records([search.design_cell(sid, 0, 0, search.design_size(12))])
        starts, steps = search.refine_plan(d, 12)
        merged = search.merge_records([d, search.refine_cell(sid, 0, starts, steps)])
        assert {k: v["best_ratio"] for k, v in merged["best"].items()} == rec["best_ratio"]


def test_search_rerun_recomputes_nothing_and_stores(searched, tmp_path, monkeypatch, capsys):
    from verification.core import search

    stamps = {p: p.stat().st_mtime_ns for p in (searched / "cells").rglob("*.json")}
    _no_cluster(monkeypatch)
    store = tmp_path / "store"
    rc = cli_main(["search", *SEARCH_FAST, "--budget", "12", "--workers", "2", "--out", str(searched), "--quiet",
                   "--store", str(store)])
    assert rc == 0
    assert {p: p.stat().st_mtime_ns for p in (searched / "cells").rglob("*.json")} == stamps
    assert sorted(p.name for p in store.iterdir()) == sorted([f"{s}.json" for s in SEARCH_FAST] + ["search.json"])
    stmt = registry.get_statement("H.17")
    rec, why = search.load_stored(stmt, store)
    assert rec is not None and why == ""
    res = search.refine_stored(stmt, rec)
    assert res.stored["evaluations"] == rec["evaluations"] and res.stored["date"] == rec["date"]
    assert res.evaluations == rec["evaluations"] + res.stored["refinement_evaluations"]
    for name, r in rec["best_ratio"].items():  # the refinement starts at the stored points: never below them
        assert r is None or res.best[name]["best_ratio"] >= r
    # a store made for another box is stale: refused with the reason
    rec["box"] = ["m in [2, 3] (int)"]
    (store / "H.17.json").write_text(json.dumps(rec))
    assert search.load_stored(stmt, store)[0] is None and "another box" in search.load_stored(stmt, store)[1]


@pytest.mark.parametrize(("argv", "message"), [
    (["search", "H.17", "--budget", "0", "--out", "{tmp}/o"], "--budget"),
    (["search", "S4", "--out", "{tmp}/o"], "declare(s) no search box"),
    (["search", "H.99", "--out", "{tmp}/o"], "H.99"),
])
def test_search_usage_errors_before_any_work(argv, message, tmp_path, capsys, monkeypatch, no_statement_runs):
    _no_cluster(monkeypatch)
    rc = cli_main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err


def test_search_into_a_folder_of_another_budget_is_refused(searched, capsys, monkeypatch, no_statement_runs):
    _no_cluster(monkeypatch)
    assert cli_main(["search", *SEARCH_FAST, "--budget", "40", "--out", str(searched), "--quiet"]) == 2
    assert "argument --out" in capsys.readouterr().err
