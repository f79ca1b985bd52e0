"""The installed package (marker ``installed``, ``make test-installed``): the wheel built from the tracked files,
installed into a fresh virtual environment outside the checkout, and ``prefalign`` run from a temporary directory.

This catches what only exists in the checkout: package data missing from the wheel (the shipped baseline, the LLM
data file and tokenizer assets), paths relative to the repository, a console script that is not installed, and
imports that the wheel's dependencies do not provide (the environment has no torch: the llm extra is not
installed, so ``prefalign llm data stats`` running there also shows that it imports no torch)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import sim

pytestmark = pytest.mark.installed

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DATA = ["verification/data/baseline_results.json", "llm_runs/data/candidates.jsonl.gz",
                "llm_runs/assets/smollm2_tokenizer/tokenizer.json.gz", "sim/py.typed", "verification/py.typed",
                "llm_runs/py.typed", "prefalign/py.typed"]


def _run(cmd, cwd, timeout=900, env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return proc


def _setuptools_at_least(major: int) -> bool:
    try:
        from importlib.metadata import version

        return int(version("setuptools").split(".")[0]) >= major
    except Exception:  # noqa: BLE001 - not installed, or a version string without a number
        return False


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(bin directory of the fresh environment, wheel, a working directory outside the checkout)``."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the wheel is built from the files git tracks)")
    base = tmp_path_factory.mktemp("installed")
    src = base / "src"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():  # a file deleted in the working tree is not part of it
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    dist = base / "dist"
    # build with this environment's setuptools when it has a recent one (no download), else in pip's isolated build
    isolation = ["--no-build-isolation"] if _setuptools_at_least(68) else []
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", dist, src], base)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = dist.glob("prefalign_verify-*.whl")
    env_dir = base / "env"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    bin_dir = env_dir / "bin"
    proc = _run([bin_dir / "python", "-m", "pip", "install", "--quiet", "-c", src / "constraints.txt", wheel], base)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    work = base / "work"
    work.mkdir()
    return bin_dir, wheel, work


def test_wheel_holds_the_package_data(installed):
    _, wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [p for p in PACKAGE_DATA if p not in names] == []
    assert not any(n.startswith(("tests/", "docs/", "tools/")) for n in names)
    entry_points = zipfile.ZipFile(wheel).read(f"prefalign_verify-{sim.__version__}.dist-info/entry_points.txt")
    assert b"prefalign = prefalign.__main__:main" in entry_points


def test_modules_come_from_the_environment_not_the_checkout(installed):
    bin_dir, _, work = installed
    proc = _run([bin_dir / "python", "-c", "import sim, verification, llm_runs, prefalign; "
                 "print(sim.__version__); print(sim.__file__); print(verification.__file__)"], work)
    assert proc.returncode == 0, proc.stderr
    version, *paths = proc.stdout.split()
    assert version == sim.__version__
    assert all(Path(p).is_relative_to(bin_dir.parent) for p in paths), paths
    assert _run([bin_dir / "prefalign", "--version"], work).stdout.strip() == f"prefalign {sim.__version__}"


def test_verify_run_against_the_shipped_baseline(installed):
    bin_dir, _, work = installed
    proc = _run([bin_dir / "prefalign", "verify", "run", "H.9", "H.14", "--json", "out.json", "--shipped-baseline"],
                work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 statement(s) compared, 0 regression(s)" in proc.stdout
    rows = json.loads((work / "out.json").read_text())
    assert [(r["id"], r["verdict"], r["negative_control"]) for r in rows] == [("H.9", "holds", "detected"),
                                                                              ("H.14", "holds", "detected")]
    assert (work / "out.json.jsonl").is_file()


def test_simulate_smoke(installed):
    bin_dir, _, work = installed
    proc = _run([bin_dir / "prefalign", "simulate", "--preset", "smoke", "--out", "sim", "--quiet"], work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((work / "sim" / "summary.json").read_text())
    assert summary["preset"] == "smoke" and summary["n_new_clients"] > 0
    assert (work / "sim" / "trajectory.csv").stat().st_size > 0
    # the python -m form of the same command line
    proc = _run([bin_dir / "python", "-m", "sim.simulate", "--seed", "-1", "--out", "x"], work)
    assert proc.returncode == 2 and proc.stderr.startswith("python -m sim.simulate: error: argument --seed")


def test_report_draws_its_figures(installed):
    bin_dir, _, work = installed
    proc = _run([bin_dir / "prefalign", "verify", "report", "H.16", "--out", "rep", "--no-studies", "--no-llm"], work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (work / "rep" / "figures" / "mixed_cluster_penalty.png").stat().st_size > 10_000
    assert "FINDING" in (work / "rep" / "index.html").read_text()


def test_llm_data_file_is_shipped_and_needs_no_torch(installed):
    bin_dir, _, work = installed
    assert _run([bin_dir / "python", "-c", "import torch"], work).returncode != 0  # the llm extra is not installed
    proc = _run([bin_dir / "prefalign", "--help"], work)  # lists the llm actions from llm_runs' parser
    assert proc.returncode == 0 and "data build|stats" in proc.stdout, proc.stderr
    proc = _run([bin_dir / "prefalign", "llm", "data", "stats", "--json"], work)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    assert {"positivity", "density", "readability", "conciseness"} <= set(stats["full_text"]["objectives"])
    assert "trained_text" not in stats and "tokenizers is missing" in proc.stderr  # says why, no traceback
    assert "Traceback" not in proc.stderr
    where = _run([bin_dir / "python", "-c", "import llm_runs.preferences.data as d; print(d.DEFAULT_DATA_FILE)"], work).stdout
    assert Path(where.strip()).is_relative_to(bin_dir.parent)  # the shipped file, read from the environment
