"""Data stays where it is put: a command writes no file outside its ``--out`` (docs/your-data.md, "Where files
go"). Each command runs as a subprocess whose home, cache, temporary and matplotlib folders are fresh empty folders
(``HOME``, ``XDG_CACHE_HOME``, ``TMPDIR``, ``MPLCONFIGDIR``; ``HF_HOME`` and ``HF_DATASETS_CACHE`` unset, so that
the datasets library would use its default cache under ``XDG_CACHE_HOME``), from an empty working folder, on a copy
of a shipped data file; afterwards every file there is listed. The only file allowed outside ``--out`` is
matplotlib's font list (``fontlist-v<version>.json`` in ``MPLCONFIGDIR``: the names of the system's fonts, no user
data). Empty folders are allowed (torch leaves an empty ``torchinductor_<user>`` in the temporary folder).

On the code before this was fixed, ``data check`` left the datasets library's Arrow copy of the data (and its lock
files) under ``XDG_CACHE_HOME/huggingface/datasets``, and a sweep left ``dask-scratch-space`` with its lock files in
``TMPDIR``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sim

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "byo_data"
#: The one file a command may leave outside --out: matplotlib's font cache, MPLCONFIGDIR/fontlist-v<version>.json.
FONT_LIST = re.compile(r"mpl/fontlist-v[0-9]+(\.[0-9]+)*\.json")
#: Variables that would send a cache somewhere else than the folders the test watches.
_REDIRECTS = ("HF_", "HUGGINGFACE", "TRANSFORMERS_CACHE", "XDG_", "DASK_", "TORCHINDUCTOR_", "MPLCONFIGDIR",
              "PREFALIGN_CACHE_DIR", "TMP", "TEMP")


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}


@pytest.fixture
def sandbox(tmp_path):
    """``(root, data, run)``: a root of fresh folders, the copied fixture data folder inside it, and ``run(*args)``,
    which runs ``python *args`` there (``{out}`` in an argument is the root's ``out`` folder) and returns the
    completed process."""
    root = tmp_path / "root"
    for name in ("home", "cache", "tmp", "mpl", "cwd", "data"):
        (root / name).mkdir(parents=True)
    data = root / "data"
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(_REDIRECTS)}
    env.update(HOME=str(root / "home"), XDG_CACHE_HOME=str(root / "cache"), TMPDIR=str(root / "tmp"),
               MPLCONFIGDIR=str(root / "mpl"))
    # the packages this test imports (sim's checkout) in the subprocess, whatever its working folder
    repo = str(Path(sim.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([repo, *filter(None, [os.environ.get("PYTHONPATH")])])

    def run(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, *(a.replace("{out}", str(root / "out")) for a in args)]
        return subprocess.run(argv, cwd=root / "cwd", env=env, capture_output=True, text=True, timeout=300)

    return root, data, run


def _written_outside_out(root: Path, inputs: set[str]) -> list[str]:
    """The files under ``root`` (all but ``out``) that are not the inputs put there and not matplotlib's font
    list."""
    found = _files(root) - {f"data/{f}" for f in inputs}
    return sorted(f for f in found if not f.startswith("out/") and not FONT_LIST.fullmatch(f))


def test_reading_a_data_file_leaves_no_copy_in_the_datasets_cache(tmp_path, monkeypatch):
    """In this process: the datasets library's default cache and the temporary folder hold no file after a data
    file is read (the default tier's test of what the subprocess test below checks end to end)."""
    import tempfile

    datasets = pytest.importorskip("datasets")
    from llm_runs.preferences import formats

    cache, tmp = tmp_path / "datasets-cache", tmp_path / "tmp"
    cache.mkdir()
    tmp.mkdir()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    rows = formats.read_rows(FIXTURES / "pku_saferlhf.csv")
    assert len(rows) > 10
    assert _files(cache) == set() and _files(tmp) == set()


@pytest.mark.e2e
def test_data_check_and_a_dask_sweep_write_nothing_outside_out(sandbox):
    """``python -m llm_runs data check`` on a CSV file (read through the datasets library, which converts it to an
    Arrow file in a cache) and ``python -m verification sweep`` on a 1-worker Dask LocalCluster (the scheduler's
    and the worker's scratch space): no file outside ``--out`` (about 8 CPU-s)."""
    root, data, run = sandbox
    shutil.copy(FIXTURES / "pku_saferlhf.csv", data)
    inputs = _files(data)
    res = run("-m", "llm_runs", "data", "check", str(data / "pku_saferlhf.csv"))
    assert res.returncode == 0, res.stderr
    assert "better" in res.stdout and "safer" in res.stdout  # the report of the file's objectives
    res = run("-m", "verification", "sweep", "H.9", "--seeds", "0:2", "--workers", "1", "--out", "{out}/sweep",
              "--quiet")
    assert res.returncode == 0, res.stderr
    assert {"sweep/sweep.json", "sweep/sweep.csv", "sweep/cells/H.9/0.json"} <= _files(root / "out")
    assert _files(data) == inputs
    assert _written_outside_out(root, inputs) == []


@pytest.mark.slow
def test_an_llm_run_writes_nothing_outside_out(sandbox):
    """``python -m llm_runs run --preset smoke --shrink`` on a tiny random Llama and a CSV file: the datasets
    library, torch, transformers, peft and matplotlib (the run's figure) all loaded; no file outside ``--out`` but
    matplotlib's font list (about 12 CPU-s)."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from llm_runs.model.models import save_random_llama

    root, data, run = sandbox
    shutil.copy(FIXTURES / "pku_saferlhf.csv", data)
    save_random_llama(data / "tiny", "tiny", dtype="float32")
    inputs = _files(data)
    res = run("-m", "llm_runs", "run", "--preset", "smoke", "--shrink", "--autocast", "none", "--device", "cpu",
              "--data", str(data / "pku_saferlhf.csv"), "--model", str(data / "tiny"), "--out", "{out}/run",
              "--no-progress")
    assert res.returncode == 0, res.stderr
    assert {"run/summary.json", "run/figure.png"} <= _files(root / "out")
    assert _files(data) == inputs
    assert _written_outside_out(root, inputs) == []
