r"""Seeds of an LLM run as cells of the Dask sweep engine (``python -m llm_runs sweep``, ``prefalign llm sweep``).

.. code-block:: text

    python -m llm_runs sweep --preset PRESET --seeds A:B [--workers K | --scheduler ADDRESS] [--threads T]
                             [--model DIR] [--data PATH [--columns C=COL,...]] [--objectives A,B,...]
                             [--device auto|cpu|cuda] [--quick | --shrink]
                             [--layout L] [--autocast bfloat16|none] [--gate DIR] --out DIR

**Cells.** Every seed ``A, A+1, ..., B-1`` is one cell of :mod:`verification.engine.dask_engine`, the engine of
``python -m verification sweep`` (no second engine): a Dask task that runs :func:`llm_runs.runs.run.run` with the preset
(and its ``--quick`` / ``--shrink`` / ``--autocast`` variant, as ``python -m llm_runs run`` makes it), the seed,
the model, the data file and the device, ``progress=False``, after ``torch.set_num_threads(T)`` (``--threads``,
default 1: the engine pins the BLAS / OpenMP pools of a local worker to one thread, so torch's intra-op threads are
set explicitly inside the cell). The folder ``DIR`` holds

* ``runs/<seed>/``: the run directory of the seed (``trajectory.csv``, ``summary.json``, ``clusterings.csv``,
  ``generations.csv``, ``figure.png``: :mod:`llm_runs.runs.run`), written by the worker as the run goes;
* ``cells/<preset>/<seed>.json``: the cell's result (:func:`llm_cell`), written atomically by the engine on the
  client when the cell finishes (a temporary file renamed over the path): the seed, the preset, ``status``
  (``complete``, or ``failed`` with ``error``), ``run_dir`` (relative to ``DIR``), ``seconds``, ``cpu_seconds``,
  ``gradient_evaluations``, the host and CPU (:func:`sim.cli.cpu_name`) and a few small entries of the run's
  summary (model, layout, LP status counts, the new clients' mean final gaps, timing, memory). The full summary
  stays in ``runs/<seed>/summary.json``. ``<preset>`` is the name of the variant run (``smoke-shrunk`` for
  ``--preset smoke --shrink``);
* ``params.json``: what every cell depends on besides its seed (:func:`sweep_params`): the preset's name and full
  configuration (:meth:`~llm_runs.runs.presets.RunPreset.to_dict`), the model directory (or ``embedded default``), the data
  file (its path, or ``shipped: <name>`` for the shipped file, and the sha256 of the bytes a run reads: for a folder
  its data files, for a saved dataset its metadata and the Arrow files its ``state.json`` names; the ``--columns``
  mapping when given; ``--objectives`` is part of the preset's configuration, and so is the positive-control gate
  that admitted them with ``--gate DIR``: ``preset_config.gate``, :func:`llm_runs.sweeps.gate.admit`), the device,
  the threads, the layout and the package version;
* ``llm_sweep.json``: the summary (:func:`summarize`): per seed its status, seconds and CPU-seconds, the
  CPU-seconds and seconds per seed (mean and max), the wall time of the last invocation, and ``run_dirs``: the
  complete runs' directories (relative to ``DIR``), for the aggregation across seeds.

**Atomicity, retries, resume.** As for the statement sweep (:mod:`verification.engine.dask_engine`): a cell file exists
only for a finished cell and is never half written; a cell whose worker dies (killed, out of memory) is re-run by
the Dask scheduler on another worker, up to ``distributed.scheduler.allowed-failures`` deaths (3 by default), and
written once; the run directory a killed cell left half done is removed and run again from the start when the
cell is retried (:func:`llm_cell`). The same command again recomputes nothing: cells whose file exists are kept
(and with every cell present no cluster is started and the model and data are not loaded); an interrupted sweep
loses only the cells in flight, and the same command computes the rest. Other seeds may be added to a folder.

**Failures.** A run that raises gives a cell with ``status: failed`` and ``error`` (``"Type: message"``; the
traceback goes to the worker's stderr), written like any result, as ``python -m verification sweep`` writes an
``error`` row for a check that raised: a rerun keeps it (remove the cell file to run the seed again). A cell whose
worker died more often than the scheduler allows has no file (the next invocation tries it again). Either makes the
command exit 1; the screen summary names the seeds.

**Parameters.** A sweep into a folder whose ``params.json`` differs (another preset or variant, model, data file,
device, threads, layout or package version) is refused before any work with the engine's message naming every
difference (:func:`verification.engine.dask_engine.check_params`; a preset configuration by its differing fields,
:func:`check_params`; exit 2). A cell file that is not a result of this preset and seed is refused the same way.

**Exit status.** 0 when every requested cell is present and its run complete; 1 when a cell failed or is missing;
2 on a usage error (a bad ``--seeds``, an unknown preset, ``--workers`` < 1, both ``--workers`` and
``--scheduler``, a folder made with other parameters, a missing model directory or data file, CUDA requested on a
machine without it for a local cluster, a scheduler that cannot be reached, a folder that another running command
writes: one writer per folder, :func:`sim.cli.writer_lock`), printed as one line naming the argument before any
work; 130 when interrupted.

**Where the cells run.** ``--workers K`` starts a ``distributed.LocalCluster`` of K worker processes, one task at a
time each (:func:`verification.engine.dask_engine.dask_client`; default ``max(1, CPUs // T)``, and 1 with ``--device
cuda``, since the workers of one machine share its first GPU): K seeds run at once, each with T torch threads, so
``K x T`` should not exceed the cores (each worker also holds its own copy of the model: about 1 GB for
SmolLM2-135M on a CPU). ``--scheduler ADDRESS`` uses an existing cluster::

    dask scheduler                                        # on one node: prints tcp://HOST:8786
    MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000 OMP_WAIT_POLICY=PASSIVE \
        dask worker tcp://HOST:8786 --nworkers 1 --nthreads 1          # on each node, once per GPU or core group
    python -m llm_runs sweep --preset gpu --seeds 0:8 --scheduler tcp://HOST:8786 --device cuda --threads 4 \
        --out /shared/sweeps/gpu

(or through ``dask-jobqueue`` / ``dask-kubernetes``). Dask sends that cluster pickled tasks and unpickles the
results it sends back, so the cluster, and everyone who can reach its scheduler, must be trusted as much as the
local user. With the ``gpu`` preset give each worker one GPU and one thread (``--nthreads 1``, so that one run
holds the device at a time): on a node with several GPUs start one
``dask worker`` per GPU with ``CUDA_VISIBLE_DEVICES=i`` (or ``dask cuda worker``, one worker per GPU), pass
``--device cuda`` (the client machine need not have a GPU: with ``--scheduler`` CUDA is checked by the runs) and
``--threads`` for the CPU-side work of each run (tokenizing, the LP, the rewards). The workers need the package,
the model and the data file at the paths given, and write the run directories under ``DIR``: put ``--out`` on a
file system the workers share with the client (the cell files are written by the client, the run directories by
the workers). The workers of a local cluster inherit the malloc and OpenMP settings the command line sets
(:mod:`llm_runs.__main__`); start the workers of a cluster with them, as above.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sim import cli
from sim.cli import atomic_write_text
from verification.core.evidence import to_jsonable
from verification.engine import dask_engine
from verification.engine.dask_engine import (
    CELLS_DIR,
    Cell,
    CellFolderError,
    CellRun,
    folder_params,
    read_cell,
    read_summary_file,
)

__all__ = ["SWEEP_KIND", "SUMMARY_JSON", "RUNS_DIR", "cell_path", "run_dir", "sweep_params", "check_params", "llm_cell",
           "sweep_cells", "read_cells", "pending_seeds", "run_sweep", "summarize", "write_summary", "read_summary",
           "screen", "failed", "default_workers", "command", "data_entry", "locked", "on_cluster", "where",
           "last_run", "write_json", "model_entry"]

#: Identifies an LLM sweep's folder (params.json) and summary (llm_sweep.json).
SWEEP_KIND = "prefalign-verify llm sweep"
SUMMARY_JSON = "llm_sweep.json"
RUNS_DIR = "runs"
#: The keys every cell file holds.
CELL_KEYS = ("seed", "preset", "status", "run_dir", "seconds", "cpu_seconds", "gradient_evaluations")


# ------------------------------------------------------------------------------------------------ the cells


def cell_path(out: str | Path, preset_name: str, seed: int) -> Path:
    """``DIR/cells/<preset>/<seed>.json``."""
    if not preset_name or any(not (ch.isalnum() or ch in "-_.") for ch in preset_name) or preset_name[0] == ".":
        raise ValueError(f"preset name {preset_name!r} cannot name a folder")
    return Path(out) / CELLS_DIR / preset_name / f"{int(seed)}.json"


def run_dir(out: str | Path, seed: int) -> Path:
    """``DIR/runs/<seed>``: the run directory of a seed."""
    return Path(out) / RUNS_DIR / str(int(seed))


def _sha256(path: Path) -> str:
    """The SHA-256 of the bytes the data ``path`` is read from (:func:`llm_runs.preferences.formats.data_files`: a file; a
    folder's data files; a saved dataset's metadata and the Arrow files its ``state.json`` names), each file's path
    relative to ``path`` before its contents, in that order. Raises :class:`~llm_runs.preferences.data.DataFileError` for a
    saved dataset that names a file outside its folder, ``OSError`` for a file that cannot be read."""
    from llm_runs.preferences.formats import data_files

    h = hashlib.sha256()
    for f in data_files(path):
        if path.is_dir():
            h.update(f.relative_to(path).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def sweep_params(preset, *, model_dir: str | None = None, data: str | Path | None = None, device: str = "auto",
                 threads: int = 1, layout: str | None = None, columns: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``params.json`` of an LLM sweep: everything its cells depend on besides the seed (module docstring).
    Raises ``OSError`` when the data file cannot be read."""
    return folder_params(
        SWEEP_KIND, preset=preset.name, preset_config=preset.to_dict(), model=model_entry(model_dir),
        data=data_entry(data, columns), device=device, threads=int(threads), layout=layout)


def model_entry(model_dir: str | Path | None) -> str:
    """The ``model`` entry of a folder's ``params.json`` (a sweep's, a gate's): ``embedded default``, or the model
    directory's resolved path."""
    return "embedded default" if model_dir is None else str(Path(model_dir).expanduser().resolve())


def data_entry(data: str | Path | None = None, columns: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``data`` entry of a folder's ``params.json``: the data file's path (``shipped: <name>`` for the shipped
    file), the SHA-256 of the bytes a run reads (:func:`_sha256`) and the ``--columns`` mapping when given. Raises
    ``OSError`` when the data file cannot be read."""
    from llm_runs.preferences.data import DEFAULT_DATA_FILE

    data_path = Path(data if data is not None else DEFAULT_DATA_FILE).expanduser().resolve()
    shipped = data_path == Path(DEFAULT_DATA_FILE).resolve()
    return {"path": f"shipped: {data_path.name}" if shipped else str(data_path), "sha256": _sha256(data_path),
            **({"columns": dict(sorted(columns.items()))} if columns else {})}


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _flat(val, f"{prefix}{key}.").items()}
    return {prefix[:-1]: obj}


def check_params(out: str | Path, params: dict[str, Any]) -> None:
    """:func:`verification.engine.dask_engine.check_params`, the engine's refusal of a folder made with other parameters,
    with a preset configuration that differs named by its differing fields (``design.n_train 2 there, 4 now``)
    instead of both configurations whole."""
    try:
        dask_engine.check_params(out, params)
    except CellFolderError as exc:
        try:
            found = json.loads((Path(out) / dask_engine.PARAMS_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise exc from None
        if not isinstance(found, dict) or found.get("preset_config") == params["preset_config"]:
            raise
        absent = "(absent)"
        diffs = [f"{k} {found.get(k, absent)!r} there, {params.get(k, absent)!r} now"
                 for k in dict.fromkeys([*params, *found])
                 if k != "preset_config" and found.get(k, absent) != params.get(k, absent)]
        a, b = _flat(found.get("preset_config")), _flat(params["preset_config"])
        fields = [f"{k} {a.get(k, absent)!r} there, {b.get(k, absent)!r} now"
                  for k in dict.fromkeys([*b, *a]) if a.get(k, absent) != b.get(k, absent)]
        more = f", and {len(fields) - 8} more" if len(fields) > 8 else ""
        diffs.append(f"preset_config {', '.join(fields[:8])}{more}")
        raise CellFolderError(f"{str(out)!r} holds cells made with other parameters: {'; '.join(diffs)} (use another "
                              "--out, or remove the folder to start again)") from None


def _small_entries(s: dict[str, Any]) -> dict[str, Any]:
    """The entries of a run's summary that a cell keeps (the full summary stays in the run directory)."""
    model = s.get("model") or {}
    timing = s.get("timing") or {}
    return {
        "model": {k: model.get(k) for k in ("name", "device", "parameters", "lora_parameters", "dtype", "autocast")},
        "layout": s.get("layout"),
        "torch_threads": (s.get("environment") or {}).get("threads"),
        "stage_seconds": s.get("stage_seconds"),
        "lp_step_status_counts": s.get("lp_step_status_counts"),
        "n_clusters": (s.get("algorithm") or {}).get("n_clusters"),
        "mean_final_gap": (s.get("algorithm") or {}).get("mean_final_gap"),
        "gradient_evaluations_per_second": timing.get("gradient_evaluations_per_second"),
        "tokens_per_second": timing.get("tokens_per_second"),
        "memory": s.get("memory"),
    }


def llm_cell(preset, seed: int, out: str, *, model_dir: str | None = None, data: str | None = None,
             device: str = "auto", threads: int = 1, layout: str | None = None,
             cache_dir: str | None = None, columns: dict[str, str] | None = None) -> dict[str, Any]:
    """The result of the run of ``preset`` at ``seed`` into ``run_dir(out, seed)`` (runs on a worker; ``out`` an
    absolute path the worker can write): the keys of :data:`CELL_KEYS`, the host, the CPU and the small entries of
    the run's summary; ``status: failed`` with ``error`` when the run raised (the traceback on the worker's
    stderr). A run directory already there (left by a killed cell) is removed first: the retried cell runs the
    seed from the start."""
    import shutil
    import traceback

    import torch

    from llm_runs.runs.run import run

    torch.set_num_threads(int(threads))
    rd = run_dir(out, seed)
    if rd.exists():
        shutil.rmtree(rd)
    row: dict[str, Any] = {"seed": int(seed), "preset": preset.name, "status": "failed",
                           "run_dir": rd.relative_to(out).as_posix(), "seconds": None, "cpu_seconds": None,
                           "gradient_evaluations": None, "host": socket.gethostname(), "cpu": cli.cpu_name(),
                           "threads": int(threads)}
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        s = run(preset, rd, model_dir=model_dir, device=device, seed=int(seed), data=data, cache_dir=cache_dir,
                progress=False, layout=layout, columns=columns or None)
    except Exception as exc:  # noqa: BLE001 - a failed run is a result: the cell says why
        traceback.print_exception(exc, file=sys.stderr)
        row.update(error=" ".join(f"{type(exc).__name__}: {exc}".split()), seconds=time.perf_counter() - wall0,
                   cpu_seconds=time.process_time() - cpu0)
        try:  # what the run recorded before it failed
            row["gradient_evaluations"] = json.loads((rd / "summary.json").read_text()).get("gradient_evaluations")
        except (OSError, ValueError):
            pass
        return to_jsonable(row)
    row.update(status=s["status"], seconds=s["seconds"], cpu_seconds=s["cpu_seconds"],
               gradient_evaluations=s["gradient_evaluations"], **_small_entries(s))
    return to_jsonable(row)


def sweep_cells(out: str | Path, preset, seeds: Sequence[int], **run_kw: Any) -> list[Cell]:
    """The cells of a sweep, in seed order (they start in this order). ``run_kw``: the keywords of
    :func:`llm_cell` besides the preset, the seed and ``out``."""
    absolute = str(Path(out).resolve())
    return [Cell(f"{preset.name}/{int(s)}", cell_path(out, preset.name, s), _call_llm_cell,
                 (preset, int(s), absolute, run_kw)) for s in seeds]


def _call_llm_cell(preset, seed: int, out: str, run_kw: dict[str, Any]) -> dict[str, Any]:
    return llm_cell(preset, seed, out, **run_kw)


def read_cells(out: str | Path, preset_name: str, seeds: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The finished cells among ``seeds``: ``{seed: result}``. Raises :class:`CellFolderError` for a cell file that is
    not a result of this preset and seed."""
    found: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        p = cell_path(out, preset_name, seed)
        if not p.is_file():
            continue
        row = read_cell(p)
        if not isinstance(row, dict) or any(k not in row for k in CELL_KEYS):
            raise CellFolderError(f"{str(p)!r} is not the result of an LLM run (it needs the keys "
                                  f"{', '.join(CELL_KEYS)}): remove it to compute the cell again")
        if row["seed"] != int(seed) or row["preset"] != preset_name:
            raise CellFolderError(f"{str(p)!r} holds the run of preset {row['preset']!r} at seed {row['seed']!r}, not "
                                  f"of {preset_name!r} at {int(seed)}: remove it to compute the cell again")
        found[int(seed)] = row
    return found


def run_sweep(client, out: str | Path, preset, seeds: Sequence[int], *, model_dir: str | None = None,
              data: str | None = None, device: str = "auto", threads: int = 1, layout: str | None = None,
              cache_dir: str | None = None, progress: bool = True, columns: dict[str, str] | None = None,
              on_written: Callable[[Cell, Any], None] | None = None) -> CellRun:
    """Run the seeds of ``seeds`` whose cell is not yet in ``out`` on the cluster of ``client`` (``params.json``
    first, after :func:`~verification.engine.dask_engine.check_params`; a bad cell file is refused before any work). With
    every cell present ``client`` may be None. The summary is :func:`summarize` / :func:`write_summary`."""
    out = Path(out)
    model_dir = None if model_dir is None else str(Path(model_dir).expanduser().resolve())
    data = None if data is None else str(Path(data).expanduser().resolve())
    params = sweep_params(preset, model_dir=model_dir, data=data, device=device, threads=threads, layout=layout,
                          columns=columns)
    check_params(out, params)
    dask_engine.write_params(out, params)
    read_cells(out, preset.name, seeds)
    cells = sweep_cells(out, preset, seeds, model_dir=model_dir, data=data, device=device, threads=int(threads),
                        layout=layout, cache_dir=cache_dir, columns=columns or None)
    return dask_engine.run_cells(client, cells, desc="llm-sweep", progress=progress, on_written=on_written)


# ------------------------------------------------------------------------------------------------ summary


def _stats(values: list[float]) -> dict[str, float | None]:
    return {"mean": sum(values) / len(values) if values else None, "max": max(values) if values else None,
            "total": sum(values)}


def summarize(params: dict[str, Any], seeds: Sequence[int], rows: dict[int, dict[str, Any]],
              run: CellRun | None = None) -> dict[str, Any]:
    """The summary of a sweep (the object of ``llm_sweep.json``) from its finished cells ``{seed: result}``."""
    seeds = [int(s) for s in seeds]
    done = [rows[s] for s in seeds if s in rows]
    complete = [r for r in done if r["status"] == "complete"]
    timed = [r for r in done if isinstance(r.get("cpu_seconds"), (int, float))]
    by_seed = []
    for s in seeds:
        r = rows.get(s)
        if r is None:
            by_seed.append({"seed": s, "status": "missing"})
            continue
        entry = {k: r.get(k) for k in ("seed", "status", "seconds", "cpu_seconds", "gradient_evaluations", "run_dir")}
        if r.get("error"):
            entry["error"] = r["error"]
        by_seed.append(entry)
    summary: dict[str, Any] = {
        "sweep": SWEEP_KIND, "params": params, "preset": params["preset"],
        "seeds": [seeds[0], seeds[-1] + 1] if seeds else [],
        "cells": {"requested": len(seeds), "finished": len(done), "complete": len(complete),
                  "failed": len(done) - len(complete), "missing": len(seeds) - len(done)},
        "by_seed": by_seed,
        "totals": {"cpu_seconds_per_seed": _stats([float(r["cpu_seconds"]) for r in timed]),
                   "seconds_per_seed": _stats([float(r["seconds"]) for r in timed])},
        "run_dirs": [r["run_dir"] for r in complete],
    }
    if run is not None:
        summary["last_run"] = last_run(run)
    return to_jsonable(summary)


def last_run(run: CellRun) -> dict[str, Any]:
    """What the last invocation did: cells computed, kept, failed (key -> why), its wall seconds."""
    return {"computed": len(run.written), "kept": len(run.kept), "failed": run.failed, "wall_seconds": run.seconds}


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (a temporary file renamed over it); returns the path."""
    atomic_write_text(Path(path), json.dumps(to_jsonable(obj), indent=1, allow_nan=False) + "\n")
    return Path(path)


def write_summary(out: str | Path, summary: dict[str, Any]) -> Path:
    """Write ``llm_sweep.json`` to ``out`` (atomically); returns its path."""
    return write_json(Path(out) / SUMMARY_JSON, summary)


def read_summary(out: str | Path) -> dict[str, Any]:
    """The ``llm_sweep.json`` of folder ``out``; :class:`CellFolderError` when there is none or it is not one."""
    return read_summary_file(Path(out) / SUMMARY_JSON, kind=SWEEP_KIND, list_key="run_dirs",
                             what="the summary of an LLM sweep", folder="the --out folder of `python -m llm_runs sweep`")


def _num(v: Any, fmt: str = ".1f") -> str:
    return "-" if not isinstance(v, (int, float)) else format(v, fmt)


def screen(summary: dict[str, Any], out: Path, run: CellRun | None) -> str:
    """The short summary the command line prints."""
    lines = []
    cells = Path(out) / CELLS_DIR / summary["preset"]
    if run is not None:
        lines += run.screen_lines(f"llm sweep of preset {summary['preset']}", cells)
    lines.append("  seed  status    seconds  CPU s  grad. evals  run dir")
    for e in summary["by_seed"]:
        g = e.get("gradient_evaluations") or {}
        ge = f"{g.get('done')}/{g.get('planned')}" if g else "-"
        lines.append(f"  {e['seed']:>4}  {e['status']:<8}  {_num(e.get('seconds')):>7}  {_num(e.get('cpu_seconds')):>5}"
                     f"  {ge:>11}  {e.get('run_dir') or '-'}")
        if e.get("error"):
            lines.append(f"        {e['error']} (remove {cells / (str(e['seed']) + '.json')} to run it again)")
    t = summary["totals"]
    lines.append(f"  CPU seconds per seed: mean {_num(t['cpu_seconds_per_seed']['mean'])}, max "
                 f"{_num(t['cpu_seconds_per_seed']['max'])}; seconds per seed: mean "
                 f"{_num(t['seconds_per_seed']['mean'])}, max {_num(t['seconds_per_seed']['max'])}"
                 + (f"; wall {run.seconds:.1f} s" if run is not None else ""))
    lines.append(f"  {summary['cells']['complete']} of {summary['cells']['requested']} runs complete; wrote "
                 f"{Path(out) / SUMMARY_JSON}")
    return "\n".join(lines)


def failed(summary: dict[str, Any], run: CellRun | None) -> bool:
    """True iff the sweep fails: a cell is missing or failed, or its run did not complete."""
    return (run is not None and not run.complete) or summary["cells"]["complete"] < summary["cells"]["requested"]


# ------------------------------------------------------------------------------------------------ command line


def default_workers(threads: int) -> int:
    """Workers of a local cluster when ``--workers`` is not given: ``max(1, CPUs // threads)``."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, n // max(1, int(threads)))


def _note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pending_seeds(args, preset) -> list[int]:
    """The seeds of ``args.seeds`` whose cell file is not in ``args.out`` (read only: nothing is created or hashed).
    Raises :class:`sim.cli.UsageError` for a cell file that is not a result of this preset and seed."""
    try:
        rows = read_cells(args.out, preset.name, args.seeds)
    except CellFolderError as exc:
        raise cli.UsageError(f"argument --out: {exc}") from None
    return [s for s in args.seeds if s not in rows]


def check_folder(args, preset) -> tuple[dict[str, Any], list[int]]:
    """The usage checks of the folder (``args.out``: writable, made with these parameters, its cell files results of
    this preset); returns the parameters and the seeds still to run. Raises :class:`sim.cli.UsageError`."""
    out = cli.check_writable_dir(args.out, "--out")
    try:
        params = sweep_params(preset, model_dir=args.model, data=args.data, device=args.device,
                              threads=args.threads, layout=args.layout, columns=args.columns)
    except OSError as exc:
        raise cli.UsageError(f"argument --data: cannot read data file {str(args.data)!r}: {exc}") from None
    except ValueError as exc:  # a DataFileError: a saved dataset that names a file outside its folder
        raise cli.UsageError(f"argument --data: {exc}") from None
    try:
        check_params(out, params)
        rows = read_cells(out, preset.name, args.seeds)
    except CellFolderError as exc:
        raise cli.UsageError(f"argument --out: {exc}") from None
    return params, [s for s in args.seeds if s not in rows]


def command(args, preset, params: dict[str, Any], prog: str = "python -m llm_runs") -> int:
    """``sweep`` after the usage checks (:mod:`llm_runs.__main__`): under the folder's writer lock
    (:func:`sim.cli.writer_lock`: a folder another running command writes is a usage error naming it), run the cells
    still missing, write and print the summary; returns the exit status (a scheduler that cannot be reached, or a
    folder changed by another command since it was checked: a usage error, printed)."""
    return locked(args, lambda: _command(args, preset, params, prog), prog)


def locked(args, body: Callable[[], int], prog: str) -> int:
    """``body()`` under the writer lock of the folder ``args.out`` (:func:`sim.cli.writer_lock`: a folder another
    running command writes is a usage error naming it); a folder changed by another command since it was checked
    (:class:`CellFolderError`) or another usage error is printed as one line; returns the exit status."""
    try:
        with cli.writer_lock(args.out, "--out"):
            return body()
    except CellFolderError as exc:  # the cells' runner checks the folder again, now under the lock
        return cli.print_usage_error(cli.UsageError(f"argument --out: {exc}"), prog)
    except cli.UsageError as exc:
        return cli.print_usage_error(exc, prog)


def where(args, pending: int) -> str:
    """Where ``pending`` cells will run (``args``: ``--workers``, ``--scheduler``, ``--device``, ``--threads``)."""
    if not pending:
        return ""
    workers = args.workers or (1 if args.device == "cuda" else default_workers(args.threads))
    at = f"the scheduler at {args.scheduler}" if args.scheduler else f"a local cluster of {workers} worker(s)"
    return f" on {at}, {args.threads} torch thread(s) each"


def on_cluster(args, pending: int, go: Callable[[Any], CellRun], prog: str) -> CellRun | int:
    """``go(client)`` on the cluster of ``args`` (a local cluster of ``--workers`` workers, default
    :func:`default_workers`, or the one at ``--scheduler``), or ``go(None)`` when no cell is ``pending`` (no
    cluster is started); the exit status instead of a run when the scheduler cannot be reached (a usage error,
    printed) or on an interrupt (the finished cells stay)."""
    workers = args.workers or (1 if args.device == "cuda" else default_workers(args.threads))
    try:
        if not pending:
            return go(None)
        with dask_engine.dask_client(None if args.scheduler else workers, args.scheduler,
                                     connect_timeout=args.connect_timeout) as client:
            return go(client)
    except dask_engine.SchedulerUnreachable as exc:
        return cli.print_usage_error(cli.UsageError(f"argument --scheduler: {exc}"), prog)
    except KeyboardInterrupt:
        _note(f"interrupted: the finished cells are in {Path(args.out) / CELLS_DIR}; the same command computes the "
              "rest")
        return cli.EXIT_INTERRUPTED


def _command(args, preset, params: dict[str, Any], prog: str) -> int:
    out = Path(args.out)
    seeds = list(args.seeds)
    pending = sum(not cell_path(out, preset.name, s).is_file() for s in seeds)
    _note(f"llm sweep of preset {preset.name} x {len(seeds)} seed(s) = {len(seeds)} cells: {pending} to compute"
          + where(args, pending) + f", results in {out}")

    def go(client):
        return run_sweep(client, out, preset, seeds, model_dir=args.model, data=args.data, device=args.device,
                         threads=args.threads, layout=args.layout, cache_dir=args.cache_dir,
                         progress=not args.quiet, columns=args.columns)

    run = on_cluster(args, pending, go, prog)
    if isinstance(run, int):
        return run
    summary = summarize(params, seeds, read_cells(out, preset.name, seeds), run=run)
    write_summary(out, summary)
    print(screen(summary, out, run))
    return cli.EXIT_FAIL if failed(summary, run) else cli.EXIT_OK
