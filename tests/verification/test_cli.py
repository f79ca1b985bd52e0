"""Command lines: list, run with JSON output, usage errors (one line, exit 2, before any work), the results logs
written as statements finish, and --resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim import simulate
from verification.__main__ import main as cli_main

REPO = Path(__file__).resolve().parents[2]
SCHEMA = {"id", "name", "verdict", "tightness", "instances", "excluded", "negative_control", "counterexamples",
          "seconds"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verification", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def _in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """``python -m verification ARGS`` as this process runs it (the imports done once for the module; the real
    command line is run by test_usage_error_exit_status_of_the_real_command_lines and tests/verification/core/test_regression.py)."""
    capsys.readouterr()
    code = cli_main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["python", "-m", "verification", *args], code, out, err)


def test_list(capsys):
    res = _in_process(capsys, "list")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    rows = {ln.split()[0]: ln.split(None, 2) for ln in lines}
    for k in range(1, 27):
        assert f"S{k}" in rows
    assert rows["S4"][1] == "4" and "Euler" in rows["S4"][2]
    assert len(rows) == len(lines)  # one line per statement, unique ids


def test_run_json(tmp_path, capsys):
    out = tmp_path / "out.json"
    res = _in_process(capsys, "run", "S1", "S4", "--json", str(out), "--seed", "5")
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert [d["id"] for d in data] == ["S1", "S4"]
    for d in data:
        assert set(d) - {"details"} == SCHEMA | {"conclusions"}
        assert all({"name", "kind", "tightness", "instances", "excluded", "counterexamples", "power"} <= set(c)
                   for c in d["conclusions"])
        assert d["verdict"] == "holds" and d["negative_control"] == "none"
        assert isinstance(d["counterexamples"], int) and isinstance(d["seconds"], float)
    assert "S1" in res.stdout and "verdict" in res.stdout  # the table
    assert res.stderr.count("\n") >= 2  # one progress line per statement


def test_unknown_id(capsys, no_statement_runs):
    res = _in_process(capsys, "run", "S1", "NOPE.7")
    assert res.returncode != 0
    assert "NOPE.7" in res.stderr and "Valid ids" in res.stderr and "S26" in res.stderr


# ---------------------------------------------------------------------------------------------- usage errors

BAD_BASELINE_ROWS = {
    "list-tightness": ({"tightness": [0.5]}, "'tightness'"),
    "string-tightness": ({"tightness": "big"}, "'tightness'"),
    "negative-instances": ({"instances": -4}, "'instances'"),
    "negative-seconds": ({"seconds": -1.0}, "'seconds'"),
    "unknown-verdict": ({"verdict": "fine"}, "'verdict'"),
}


def _baseline(tmp_path: Path, **change) -> str:
    row = {"id": "H.9", "name": "H.9", "verdict": "holds", "tightness": 0.9, "instances": 60, "excluded": 0,
           "negative_control": "detected", "counterexamples": 0, "seconds": 0.1}
    p = tmp_path / "baseline.json"
    p.write_text(json.dumps([{"id": "S4", "verdict": "holds"}, {**row, **change}]))
    return str(p)


def _bad_command_lines(tmp_path: Path):
    """(command line, fragments its one error line must hold): every kind of bad argument."""
    afile = tmp_path / "afile"
    afile.write_text("a file where a directory is expected")
    (tmp_path / "adir").mkdir()
    cases = [
        (["run", "H.9", "--seed", "-1"], ["argument --seed", "'-1'"]),
        (["run", "H.9", "--seed", "1.5"], ["argument --seed", "'1.5'"]),
        (["report", "H.9", "--seed", "-3", "--out", str(tmp_path / "rep")], ["argument --seed", "'-3'"]),
        (["run", "H.9", "--tightness-rtol", "nan"], ["argument --tightness-rtol", "'nan'"]),
        (["run", "H.9", "--tightness-rtol", "-1"], ["argument --tightness-rtol", "'-1'"]),
        (["run", "H.9", "--tightness-rtol", "inf"], ["argument --tightness-rtol", "'inf'"]),
        (["run", "H.9", "--json", str(afile / "out.json")], ["argument --json", "afile", "not a directory"]),
        (["run", "H.9", "--json", str(tmp_path / "adir")], ["argument --json", "adir", "is a directory"]),
        (["report", "H.9", "--out", str(afile / "rep")], ["argument --out", "afile"]),
        (["report", "H.9", "--out", str(afile)], ["argument --out", "afile", "not a directory"]),
        (["run", "H.9", "--resume"], ["argument --resume", "--json"]),
        (["run", "H.9", "NOPE.7"], ["argument ID", "NOPE.7"]),
        (["report", "NOPE.7", "--out", str(tmp_path / "rep")], ["argument ID", "NOPE.7"]),
        (["run", "H.9", "--baseline", str(tmp_path / "missing.json")], ["argument --baseline", "missing.json"]),
    ]
    not_json = tmp_path / "notjson.json"
    not_json.write_text('[{"id": "H.9", "verdict": "holds"')
    cases.append((["run", "H.9", "--baseline", str(not_json)], ["argument --baseline", "notjson.json", "not JSON"]))
    for name, (change, field) in BAD_BASELINE_ROWS.items():
        sub = tmp_path / name
        sub.mkdir()
        cases.append((["run", "H.9", "--baseline", _baseline(sub, **change)],
                      ["argument --baseline", f"{name}/baseline.json", "statement 'H.9'", field]))
    return cases


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def test_every_bad_argument_is_one_line_exit_2_before_any_work(tmp_path, capsys, no_statement_runs):
    cases = _bad_command_lines(tmp_path)
    before = _files(tmp_path)
    for argv, fragments in cases:
        assert cli_main(argv) == 2, argv
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert len(lines) == 1 and out == "", (argv, err)
        assert lines[0].startswith(f"python -m verification {argv[0]}: error: argument "), lines[0]
        for frag in fragments:
            assert frag in lines[0], (argv, frag, lines[0])
    assert _files(tmp_path) == before  # nothing written, not even an output folder


@pytest.mark.e2e
def test_usage_error_exit_status_of_the_real_command_lines(tmp_path):
    res = _cli("run", "H.9", "--seed", "-1", "--json", str(tmp_path / "out.json"))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "python -m verification run: error: argument --seed: must be an integer >= 0 "
        "(numpy.random.default_rng takes no negative seed); got '-1'"]
    res = subprocess.run([sys.executable, "-m", "sim.simulate", "--seed", "-2", "--out", str(tmp_path / "sim")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("python -m sim.simulate: error: argument --seed") and "'-2'" in res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, fragment", [
    (["--seed", "-1"], "argument --seed"),
    (["--seed", "x"], "argument --seed"),
    (["--out", "{afile}/sim"], "argument --out"),
    (["--out", "{afile}"], "argument --out"),
    (["--preset", "huge"], "argument --preset"),
    (["--clients", "0"], "argument --clients"),
    (["--clients", "1e3"], "argument --clients"),
    (["--clients", "7"], "argument --clients: must be a multiple of the preset's 2 planted groups"),
])
def test_simulate_bad_arguments(tmp_path, capsys, monkeypatch, argv, fragment):
    afile = tmp_path / "afile"
    afile.write_text("")

    def fail(*args, **kwargs):
        raise AssertionError("work started after a usage error")

    monkeypatch.setattr(simulate, "build_problem", fail)
    argv = [a.format(afile=afile) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "sim")]
    assert simulate.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m sim.simulate: error: " + fragment), err
    assert list(tmp_path.iterdir()) == [afile]


# ------------------------------------------------------------------------------ results log and --resume

SUBSET = ["H.9", "H.14", "S4"]


def _without_seconds(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def _log_lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """An uninterrupted `run SUBSET --json` (rows and log)."""
    out = tmp_path_factory.mktemp("full") / "results.json"
    assert cli_main(["run", *SUBSET, "--json", str(out), "--seed", "3"]) == 0
    return json.loads(out.read_text()), _log_lines(out.parent / "results.json.jsonl")


def test_run_writes_a_results_log_as_it_goes(uninterrupted):
    rows, log = uninterrupted
    header, records = log[0], log[1:]
    assert header["log"] == "prefalign-verify results" and header["command"] == "run"
    assert header["ids"] == SUBSET and header["seed"] == 3 and header["scale"] == "default" and header["version"]
    assert [r["id"] for r in records] == SUBSET
    assert [r["row"] for r in records] == rows


def test_interrupted_run_resumes_to_the_same_rows(tmp_path, capsys, interrupt_after, uninterrupted):
    out = tmp_path / "results.json"
    log = tmp_path / "results.json.jsonl"
    argv = ["run", *SUBSET, "--json", str(out), "--seed", "3"]
    interrupt_after(1)
    assert cli_main(argv) == 130
    assert "interrupted after 1 of 3" in capsys.readouterr().err
    assert not out.exists()  # the final file is written only at the end ...
    assert [r["id"] for r in _log_lines(log)[1:]] == SUBSET[:1]  # ... what was finished is kept
    kept = _log_lines(log)[1]["row"]
    ran = interrupt_after(10)
    assert cli_main([*argv, "--resume"]) == 0
    assert ran == SUBSET[1:]  # the finished statement was not run again
    assert f"from {log}" in capsys.readouterr().err
    rows = json.loads(out.read_text())
    assert _without_seconds(rows) == _without_seconds(uninterrupted[0])
    assert rows[0] == kept  # the kept row itself, seconds included
    assert [r["id"] for r in _log_lines(log)[1:]] == SUBSET


def test_resume_ignores_a_truncated_last_line(tmp_path, capsys, interrupt_after, uninterrupted):
    out = tmp_path / "results.json"
    log = tmp_path / "results.json.jsonl"
    lines = (uninterrupted[1][0], *uninterrupted[1][1:3])
    log.write_text("".join(json.dumps(x) + "\n" for x in lines[:2]) + json.dumps(lines[2])[:40])
    ran = interrupt_after(10)
    assert cli_main(["run", *SUBSET, "--json", str(out), "--seed", "3", "--resume"]) == 0
    assert "truncated last line" in capsys.readouterr().err
    assert ran == SUBSET[1:]
    assert _without_seconds(json.loads(out.read_text())) == _without_seconds(uninterrupted[0])
    assert len(_log_lines(log)) == 4  # header and three whole records


@pytest.mark.parametrize("ids, seed, fragment", [
    (SUBSET, "4", "seed 3 in the log, 4 now"),
    (["H.9", "S4"], "3", "statements [H.9, H.14, S4] in the log, [H.9, S4] now"),
])
def test_resume_with_other_parameters_is_refused(tmp_path, capsys, no_statement_runs, uninterrupted, ids, seed,
                                                 fragment):
    out = tmp_path / "results.json"
    log = tmp_path / "results.json.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in uninterrupted[1][:2]))
    before = log.read_text()
    assert cli_main(["run", *ids, "--json", str(out), "--seed", seed, "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --resume" in err[0] and fragment in err[0], err
    assert log.read_text() == before and not out.exists()


def test_resume_refuses_a_corrupt_log(tmp_path, capsys, no_statement_runs):
    log = tmp_path / "results.json.jsonl"
    log.write_text('{"not": "a header"}\n')
    assert cli_main(["run", "H.9", "--json", str(tmp_path / "results.json"), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 1 is not the header" in err[0]
