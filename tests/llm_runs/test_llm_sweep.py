"""``python -m llm_runs sweep`` (``prefalign llm sweep``): seeds of an LLM run as cells of the Dask sweep engine, on
the tiny random Llama (preset ``smoke --shrink`` at float32, about 20 s a run alone on 2 cores).

* 2 seeds on a 2-worker cluster, one worker killed while both runs are in flight: every cell is written once, as
  valid JSON, each run directory holds a complete summary, ``params.json`` names the preset, its configuration,
  the model, the data file's sha256, the device and the threads; the killed worker's cell is retried by the
  scheduler and its half-done run directory run again;
* the same command again recomputes nothing and starts no cluster;
* another preset (or variant) into the folder is refused with exit 2, as are a bad ``--seeds``, an unknown preset,
  ``--workers 0`` and both ``--workers`` and ``--scheduler``, before any work;
* a run that raises is a ``failed`` cell with its error, and the sweep exits 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("distributed")

from llm_runs.__main__ import main  # noqa: E402
from llm_runs.preferences.data import DEFAULT_DATA_FILE  # noqa: E402
from llm_runs.runs.presets import PRESETS  # noqa: E402
from llm_runs.sweeps import sweep  # noqa: E402
from tests.llm_helpers import kill_a_busy_worker, run_cli, runs_running, tiny_model_dir  # noqa: E402
from verification.core.evidence import to_jsonable  # noqa: E402
from verification.engine import dask_engine  # noqa: E402

SEEDS = (0, 1)
#: The preset of the cells: smoke --shrink at float32 (bf16 autocast is slow on small CPU matrices).
PRESET_ARGS = ["--preset", "smoke", "--shrink", "--autocast", "none", "--device", "cpu", "--threads", "1"]
CELLS = "smoke-shrunk"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def client(dask_client_2):
    """The session's LocalCluster of 2 worker processes (as `sweep --workers 2` starts, tests/conftest.py) and its
    client, both workers up."""
    return dask_client_2


_cli = run_cli


@pytest.fixture(scope="module")
def swept(client, tiny_dir, tmp_path_factory):
    """`python -m llm_runs sweep --seeds 0:2` through --scheduler on the module's 2-worker cluster, one worker killed
    while both runs are in flight."""
    out = tmp_path_factory.mktemp("llm-sweep") / "sw"
    killed: dict = {}
    killer = threading.Thread(target=kill_a_busy_worker, args=(client, killed),
                              kwargs={"ready": runs_running(out, SEEDS)}, daemon=True)
    killer.start()
    t0 = time.perf_counter()
    code, screen = _cli("sweep", *PRESET_ARGS, "--model", str(tiny_dir), "--seeds", "0:2",
                        "--scheduler", client.scheduler.address, "--out", str(out), "--quiet")
    killer.join(timeout=5)
    return {"out": out, "code": code, "screen": screen, "killed": killed, "seconds": time.perf_counter() - t0,
            "model": tiny_dir}


@pytest.mark.e2e
def test_two_seeds_on_two_workers_write_every_cell_run_and_params(swept):
    out = swept["out"]
    assert swept["code"] == 0, swept["screen"]
    files = sorted(p.relative_to(out).as_posix() for p in (out / "cells").rglob("*"))
    assert files == [f"cells/{CELLS}", f"cells/{CELLS}/0.json", f"cells/{CELLS}/1.json"]  # no temporary file left
    for s in SEEDS:
        cell = json.loads(sweep.cell_path(out, CELLS, s).read_text())
        assert cell["seed"] == s and cell["preset"] == CELLS and cell["status"] == "complete"
        assert cell["run_dir"] == f"runs/{s}" and cell["cpu"] and cell["threads"] == 1 == cell["torch_threads"]
        assert cell["seconds"] > 0 and cell["cpu_seconds"] > 0
        assert cell["gradient_evaluations"]["done"] == cell["gradient_evaluations"]["planned"] > 0
        assert cell["model"]["name"] == "tiny" and cell["model"]["device"] == "cpu"
        summary = json.loads((out / cell["run_dir"] / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["seed"] == s
        assert (out / cell["run_dir"] / "trajectory.csv").is_file()
        assert "preset_config" not in cell  # the full summary stays in the run directory
    params = json.loads((out / "params.json").read_text())
    preset = replace(PRESETS["smoke"].shrunk(), autocast=None)
    assert params["sweep"] == sweep.SWEEP_KIND and params["preset"] == CELLS
    assert params["preset_config"] == to_jsonable(preset.to_dict())
    assert params["model"] == str(Path(swept["model"]).resolve())
    assert params["data"] == {"path": f"shipped: {DEFAULT_DATA_FILE.name}",
                              "sha256": hashlib.sha256(DEFAULT_DATA_FILE.read_bytes()).hexdigest()}
    assert params["device"] == "cpu" and params["threads"] == 1 and "version" in params
    summary = json.loads((out / sweep.SUMMARY_JSON).read_text())
    assert summary["cells"] == {"requested": 2, "finished": 2, "complete": 2, "failed": 0, "missing": 0}
    assert summary["run_dirs"] == ["runs/0", "runs/1"] and summary["seeds"] == [0, 2]
    assert [e["status"] for e in summary["by_seed"]] == ["complete", "complete"]
    assert summary["totals"]["cpu_seconds_per_seed"]["max"] >= summary["totals"]["cpu_seconds_per_seed"]["mean"] > 0
    assert "2 computed, 0 already in" in swept["screen"] and "2 of 2 runs complete" in swept["screen"]


@pytest.mark.e2e
def test_a_killed_workers_cell_is_retried_and_written_once(swept):
    killed, out = swept["killed"], swept["out"]
    assert killed.get("keys"), "no cell was in flight on the killed worker"
    summary = json.loads((out / sweep.SUMMARY_JSON).read_text())
    assert summary["last_run"]["computed"] == 2 and summary["last_run"]["failed"] == {}
    # the killed cell's run directory was run again from the start: both runs finished after the kill
    for s in SEEDS:
        assert (sweep.run_dir(out, s) / "summary.json").stat().st_mtime > killed["at"]
        assert json.loads((sweep.run_dir(out, s) / "summary.json").read_text())["status"] == "complete"


@pytest.mark.e2e
def test_the_same_command_again_recomputes_nothing(swept, monkeypatch):
    out = swept["out"]

    def no_cluster(*args, **kwargs):
        raise AssertionError("a Dask cluster was started")

    monkeypatch.setattr(dask_engine, "dask_client", no_cluster)
    before = {p: p.stat().st_mtime_ns for p in [*(out / "cells").rglob("*.json"), *(out / "runs").rglob("*")]}
    code, screen = _cli("sweep", *PRESET_ARGS, "--model", str(swept["model"]), "--seeds", "0:2", "--workers", "2",
                        "--out", str(out), "--quiet")
    assert code == 0, screen
    assert "2 cells, 0 computed, 2 already in" in screen
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert json.loads((out / sweep.SUMMARY_JSON).read_text())["last_run"]["computed"] == 0


OTHER_PARAMETERS = pytest.mark.parametrize("args, match", [
    (["--preset", "cpu", "--shrink", "--autocast", "none"], "preset 'smoke-shrunk' there, 'cpu-shrunk' now"),
    (["--preset", "smoke", "--quick", "--autocast", "none"], "design.n_train 2 there, 4 now"),
    (["--preset", "smoke", "--shrink", "--autocast", "none", "--threads", "2"], "threads 1 there, 2 now"),
])


def _refused(out: Path, model, capsys, args) -> str:
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    code = main(["sweep", *args, "--model", str(model), "--device", "cpu", "--seeds", "0:3", "--workers", "1",
                 "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and "argument --out:" in err[0], err
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before  # nothing written, nothing run
    return err[0]


@pytest.mark.e2e
@OTHER_PARAMETERS
def test_other_parameters_into_the_folder_are_refused(swept, capsys, args, match):
    assert match in _refused(swept["out"], swept["model"], capsys, args)


@OTHER_PARAMETERS
def test_other_parameters_into_a_folder_of_these_params_are_refused(tiny_dir, tmp_path, capsys, args, match):
    """The refusal above in the default tier, on a folder whose params.json is the one `sweep` of PRESET_ARGS writes
    before its first cell (the e2e tier's test refuses the folder of a finished sweep)."""
    out = tmp_path / "sw"
    preset = replace(PRESETS["smoke"].shrunk(), autocast=None)
    dask_engine.write_params(out, sweep.sweep_params(preset, model_dir=str(tiny_dir), device="cpu", threads=1))
    assert match in _refused(out, tiny_dir, capsys, args)


@pytest.mark.parametrize("args, match", [
    (["--preset", "smoke", "--seeds", "3:1"], "argument --seeds: must be A:B with integers 0 <= A < B (the seeds "
                                              "A, ..., B-1); got '3:1'"),
    (["--preset", "smoke", "--seeds", "a:b"], "argument --seeds: must be A:B"),
    (["--preset", "smoke", "--seeds=-1:2"], "argument --seeds: must be A:B"),
    (["--preset", "huge", "--seeds", "0:2"], "argument --preset: invalid choice: 'huge'"),
    (["--preset", "smoke", "--seeds", "0:2", "--workers", "0"], "argument --workers: must be an integer >= 1; "
                                                                "got '0'"),
    (["--preset", "smoke", "--seeds", "0:2", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"],
     "argument --scheduler: not allowed with argument --workers"),
])
def test_usage_errors_exit_2_naming_the_value_before_any_work(tmp_path, capsys, args, match):
    out = tmp_path / "sw"
    code = main(["sweep", *args, "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and match in err[0], err
    assert not out.exists()


def test_a_folder_held_by_another_writer_is_refused_before_any_work(tiny_dir, tmp_path, capsys, monkeypatch):
    """A second `llm sweep` on a folder another command writes (here: this process holds its lock) exits 2 with one
    line naming the holder, and starts no cluster, writes no params.json, removes no run directory."""
    from sim.folder_lock import LOCK_NAME, FolderLock

    monkeypatch.setattr(dask_engine, "dask_client", lambda *a, **k: pytest.fail("a Dask cluster was started"))
    out = tmp_path / "sw"
    in_flight = sweep.run_dir(out, 0) / "trajectory.csv"  # the holder's run directory of seed 0, being written
    in_flight.parent.mkdir(parents=True)
    in_flight.write_text("step,loss\n")
    with FolderLock(out, command="prefalign llm sweep --preset smoke --seeds 0:2 --out sw"):
        code, screen = _cli("sweep", *PRESET_ARGS, "--model", str(tiny_dir), "--seeds", "0:2", "--workers", "1",
                            "--out", str(out))
        assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [LOCK_NAME, "runs", "runs/0",
                                                                                 "runs/0/trajectory.csv"]
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and screen == "" and len(err) == 1, err
    assert err[0].startswith(f"python -m llm_runs: error: argument --out: {str(out)!r} is being written by pid "
                             f"{os.getpid()} on host "), err[0]
    assert err[0].endswith("(prefalign llm sweep --preset smoke --seeds 0:2 --out sw): one writer per folder (lock "
                           f"file {str(out / LOCK_NAME)!r})"), err[0]
    assert in_flight.read_text() == "step,loss\n" and not (out / LOCK_NAME).exists()


def test_prefalign_llm_lists_and_runs_sweep(tmp_path, capsys):
    from prefalign.__main__ import COMMANDS
    from prefalign.__main__ import main as prefalign_main

    assert "sweep" in COMMANDS["llm"].actions()
    code = prefalign_main(["llm", "sweep", "--preset", "smoke", "--seeds", "2:2", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["prefalign llm sweep: error: argument --seeds: must be A:B with integers 0 <= A < B "
                                 "(the seeds A, ..., B-1); got '2:2'"]


def test_a_run_that_raises_is_a_failed_cell_and_the_sweep_fails(tmp_path):
    """In this process: the cell of a run that raises says why; a stale run directory is removed first."""
    preset = PRESETS["smoke"].shrunk()
    stale = sweep.run_dir(tmp_path, 0) / "trajectory.csv"
    stale.parent.mkdir(parents=True)
    stale.write_text("left by a killed cell\n")
    row = sweep.llm_cell(preset, 0, str(tmp_path), model_dir=str(tmp_path / "no-model"), device="cpu")
    assert row["status"] == "failed" and row["seed"] == 0 and row["run_dir"] == "runs/0"
    assert "no-model" in row["error"] and row["seconds"] >= 0
    assert not stale.exists()  # the run started again from an empty directory
    path = sweep.cell_path(tmp_path, preset.name, 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(row))
    rows = sweep.read_cells(tmp_path, preset.name, [0, 1])
    summary = sweep.summarize({"preset": preset.name}, [0, 1], rows)
    assert summary["cells"] == {"requested": 2, "finished": 1, "complete": 0, "failed": 1, "missing": 1}
    assert summary["run_dirs"] == [] and sweep.failed(summary, None)
    text = sweep.screen(summary, tmp_path, None)
    assert row["error"] in text and "to run it again" in text and "missing" in text
