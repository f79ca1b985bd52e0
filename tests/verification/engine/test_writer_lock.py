"""One writer per folder for the commands that fill an --out folder (sweep, search, grid, report): two real
command lines on one folder, the second refused with one line naming the first, which finishes intact; each
command refuses a held folder before any work; the lock goes on an error and on Ctrl-C; a stale lock is taken over
with a note."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sim.folder_lock import LOCK_NAME, FolderLock
from verification.__main__ import main as cli_main
from verification.engine import dask_engine, sweep

REPO = Path(__file__).resolve().parents[3]
FAST = ("H.9", "S4")  # statements whose cells take a fraction of a second


@pytest.fixture(scope="module")
def client(dask_client_2):
    """The session's LocalCluster of 2 worker processes and its client (tests/conftest.py): a sweep process of its
    own reaches its scheduler (the e2e tier)."""
    return dask_client_2


@pytest.fixture(scope="module")
def inprocess_client(dask_inprocess_client):
    """A LocalCluster of 2 one-thread workers in this process (tests/conftest.py), for the default tier."""
    return dask_inprocess_client


def _no_cluster(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a Dask cluster was started")

    monkeypatch.setattr(dask_engine, "dask_client", fail)


def _line(stream, timeout: float = 120.0) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"no line within {timeout} s"
    return stream.readline()


@pytest.mark.e2e
def test_a_second_sweep_on_a_folder_being_written_exits_2_naming_the_first(client, tmp_path):
    """The first sweep is paused (SIGSTOP) once it has said what it computes, so that the second surely starts
    while the first is at work; the second exits 2 with one line naming the first; the first, resumed, finishes
    with all its cells and its summary, and leaves no lock file."""
    out = tmp_path / "sw"
    argv = [sys.executable, "-m", "verification", "sweep", *FAST, "--seeds", "0:2", "--scheduler",
            client.scheduler.address, "--out", str(out), "--quiet"]
    first = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = _line(first.stderr)
        assert said.startswith("sweep of 2 statement(s) x 2 seed(s) at scale default = 4 cells: 4 to compute"), said
        os.kill(first.pid, signal.SIGSTOP)
        second = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=300)
    err = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(err) == 1 and second.stdout == "", second.stderr
    holder = f"pid {first.pid} on host {socket.gethostname()} since "
    assert err[0].startswith(f"python -m verification sweep: error: argument --out: {str(out)!r} is being written "
                             f"by {holder}"), err[0]
    assert err[0].endswith(f" (python -m verification sweep {' '.join(FAST)} --seeds 0:2 --scheduler "
                           f"{client.scheduler.address} --out {out} --quiet): one writer per folder (lock file "
                           f"{str(out / LOCK_NAME)!r})"), err[0]
    assert first.returncode == 0, stderr
    summary = json.loads((out / sweep.SUMMARY_JSON).read_text())
    assert summary["cells"] == {"requested": 4, "finished": 4} and summary["last_run"]["computed"] == 4
    assert all(sweep.cell_path(out, sid, s).is_file() for sid in FAST for s in (0, 1))
    assert "4 cells, 4 computed, 0 already in" in stdout
    assert not (out / LOCK_NAME).exists()


COMMANDS = {
    "sweep": ["sweep", "H.9", "--seeds", "0:2", "--workers", "1"],
    "search": ["search", "H.17", "--budget", "12", "--workers", "1"],
    "grid": ["grid", "K=1", "--seeds", "0:1", "--workers", "1"],
    "report": ["report", "S4", "--no-studies", "--no-llm"],
}


@pytest.mark.parametrize("argv", COMMANDS.values(), ids=COMMANDS)
def test_each_command_refuses_a_folder_held_by_another_writer_before_any_work(argv, tmp_path, capsys, monkeypatch,
                                                                              no_statement_runs):
    _no_cluster(monkeypatch)
    out = tmp_path / "o"
    out.mkdir()
    with FolderLock(out, command="prefalign verify sweep --out o"):
        rc = cli_main([*argv, "--out", str(out)])
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written
    stdout, stderr = capsys.readouterr()
    err = stderr.strip().splitlines()
    assert rc == 2 and len(err) == 1 and stdout == "", stderr
    assert err[0].startswith(f"python -m verification {argv[0]}: error: argument --out: {str(out)!r} is being "
                             f"written by pid {os.getpid()} on host {socket.gethostname()} since "), err[0]
    assert "(prefalign verify sweep --out o): one writer per folder" in err[0]


def test_the_lock_goes_on_a_usage_error_under_it_and_on_ctrl_c(tmp_path, capsys, monkeypatch, interrupt_after):
    _no_cluster(monkeypatch)
    out = tmp_path / "o"
    out.mkdir()
    (out / "params.json").write_text(json.dumps(sweep.sweep_params("paper")))
    assert cli_main(["sweep", "H.9", "--seeds", "0:1", "--workers", "1", "--out", str(out)]) == 2
    assert "made with other parameters" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["params.json"]
    rep = tmp_path / "rep"
    interrupt_after(0)
    assert cli_main(["report", "S4", "--no-studies", "--no-llm", "--out", str(rep)]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert not (rep / LOCK_NAME).exists()


def test_a_stale_lock_is_taken_over_with_a_note(inprocess_client, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = {"lock": "prefalign-verify writer lock", "pid": dead.pid, "host": socket.gethostname(),
             "started": "2026-01-01T00:00:00+00:00", "command": "prefalign verify sweep S4 --seeds 0:1 --out o"}
    (out / LOCK_NAME).write_text(json.dumps(stale))
    assert cli_main(["sweep", "S4", "--seeds", "0:1", "--scheduler", inprocess_client.scheduler.address, "--out",
                     str(out), "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"note: taking over the stale lock of {str(out)!r} left by pid {dead.pid} on host "
                      f"{socket.gethostname()} since 2026-01-01T00:00:00+00:00 (prefalign verify sweep S4 --seeds 0:1 "
                      "--out o): it ended without releasing it"), err
    assert sweep.cell_path(out, "S4", 0).is_file() and not (out / LOCK_NAME).exists()
