"""The Dask engine of the sweeps (``python -m verification sweep`` and ``grid``): every cell is a Dask task, and
its result is written to its own JSON file as soon as it finishes.

A *cell* is one unit of work with a result file: one statement at one seed (:mod:`verification.engine.sweep`), one
point of a simulation grid at one seed (:mod:`verification.engine.grid`). :func:`run_cells` submits every cell whose file
does not exist yet to a Dask cluster, and, on the client, writes each result atomically (a temporary file renamed
over the cell's path, :func:`sim.cli.atomic_write_text`) as the cell finishes. So

* re-running the same cells skips the finished ones (their files exist): a resume recomputes nothing;
* a cell whose worker dies (killed, out of memory) is re-run by the Dask scheduler on another worker (up to its
  ``distributed.scheduler.allowed-failures`` deaths, 3 by default) and written once, when it finishes;
* an interrupted sweep loses only the cells in flight; no half-written file is left (a temporary file of a
  process killed while writing is removed by the next run).

The results are written by the client, so a cluster whose workers do not share a file system with it works the
same. The cluster is Dask's own, never a scheduler of ours: :func:`dask_client` starts a
``distributed.LocalCluster`` of ``workers`` processes with one thread each and the BLAS / OpenMP thread pools
pinned to one thread (:data:`WORKER_ENV`), or connects to the scheduler of an existing cluster (``dask
scheduler`` and ``dask worker`` on a SLURM, PBS or Kubernetes cluster, through ``dask-jobqueue`` or
``dask-kubernetes``), failing within ``connect_timeout`` seconds when it cannot be reached.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.cli import atomic_write_text

__all__ = ["WORKER_ENV", "CONNECT_TIMEOUT", "PARAMS_NAME", "CELLS_DIR", "SchedulerUnreachable", "CellFolderError",
           "Cell", "CellRun", "dask_client", "run_cells", "read_cell", "read_summary_file", "folder_params",
           "check_params", "write_params"]

#: Environment of every worker process of a local cluster, set before the process starts (so that numpy's BLAS
#: reads it): one thread per BLAS / OpenMP pool, the worker process itself having one thread.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "VECLIB_MAXIMUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1"}
#: Seconds allowed to reach the scheduler of an existing cluster.
CONNECT_TIMEOUT = 5.0
#: In a cell folder: the parameters every cell depends on (:func:`folder_params`), and the cells' sub-folder.
PARAMS_NAME = "params.json"
CELLS_DIR = "cells"
FOLDER_FORMAT = 1


class SchedulerUnreachable(ConnectionError):
    """No Dask scheduler answered at the given address within the time allowed."""


class CellFolderError(ValueError):
    """A cell folder that cannot be used: made with other parameters, or a cell file that is not a result."""


def folder_params(kind: str, **params: Any) -> dict[str, Any]:
    """The ``params.json`` of a cell folder: the kind of sweep, the format, the package version and ``params``
    (everything a cell's result depends on besides the cell's own coordinates, which name its file)."""
    from verification.core.evidence import to_jsonable
    from verification.core.resultlog import package_version

    return to_jsonable({"sweep": kind, "format": FOLDER_FORMAT, "version": package_version(), **params})


def check_params(out: str | Path, params: dict[str, Any]) -> None:
    """Refuse (:class:`CellFolderError`, every difference named) a folder ``out`` whose ``params.json`` differs from
    ``params``, or that holds a ``cells/`` folder without one. Nothing is written. Other cells (other statements,
    seeds or grid points) may be added to a folder; other parameters may not."""
    out = Path(out)
    p = out / PARAMS_NAME
    if not p.exists():
        if (out / CELLS_DIR).exists():
            raise CellFolderError(f"{str(out)!r} holds a {CELLS_DIR}/ folder but no {PARAMS_NAME}: not a sweep folder "
                                  "of this program (use another --out)")
        return
    try:
        found = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CellFolderError(f"cannot read {str(p)!r}: {exc}") from None
    if not isinstance(found, dict):
        raise CellFolderError(f"{str(p)!r} is not the parameter file of a sweep")
    absent = "(absent)"
    diffs = [f"{k} {found.get(k, absent)!r} there, {params.get(k, absent)!r} now"
             for k in dict.fromkeys([*params, *found]) if found.get(k, absent) != params.get(k, absent)]
    if diffs:
        raise CellFolderError(f"{str(out)!r} holds cells made with other parameters: {'; '.join(diffs)} (use another "
                              "--out, or remove the folder to start again)")


def write_params(out: str | Path, params: dict[str, Any]) -> None:
    """:func:`check_params`, then create ``out`` and write its ``params.json`` if it has none."""
    check_params(out, params)
    p = Path(out) / PARAMS_NAME
    if not p.exists():
        atomic_write_text(p, json.dumps(params, indent=2) + "\n")


@dataclass(frozen=True)
class Cell:
    """One cell: ``func(*args, *results)`` runs on a worker and returns a JSON-ready object, written to ``path``;
    ``results`` are the results of the cells named by ``deps`` (their keys, cells earlier in the same
    :func:`run_cells` call), so that a cell may start from what others computed.

    ``key`` names the cell in the progress bar and the messages (``"H.9/3"``)."""

    key: str
    path: Path
    func: Callable[..., Any]
    args: tuple = ()
    deps: tuple[str, ...] = ()


@dataclass
class CellRun:
    """What :func:`run_cells` did: ``kept`` the cells whose file existed, ``written`` the cells it wrote in the
    order they finished, ``failed`` the cells that produced no result (key -> why)."""

    total: int
    kept: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return len(self.kept) + len(self.written) == self.total

    def screen_lines(self, what: str, cells: Path | str) -> list[str]:
        """The lines a command prints about this run of ``what`` (e.g. ``"sweep"``) whose cell files are under
        ``cells``: the counts and the seconds, then one line per failed cell."""
        return [f"{what}: {self.total} cells, {len(self.written)} computed, {len(self.kept)} already in {cells}, "
                f"{len(self.failed)} failed, in {self.seconds:.1f} s",
                *(f"  cell {k} failed: {why}" for k, why in self.failed.items())]


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None, *,
                connect_timeout: float = CONNECT_TIMEOUT) -> Iterator[Any]:
    """A ``distributed.Client``: of a new ``LocalCluster`` with ``workers`` worker processes (one thread each, the
    thread pools of :data:`WORKER_ENV` pinned to one thread; ``None``: one per CPU; their local directory a temporary
    folder removed on exit), or of the existing cluster whose scheduler listens at ``scheduler`` (e.g.
    ``tcp://10.0.0.5:8786``). The cluster (if started here) and the client are closed on exit.

    Raises :class:`SchedulerUnreachable` when no scheduler answers at ``scheduler`` within ``connect_timeout``
    seconds, and ``ValueError`` for ``workers < 1``."""
    import dask
    from distributed import Client, LocalCluster

    if scheduler is not None:
        try:
            client = Client(scheduler, timeout=connect_timeout, set_as_default=False)
        except Exception as exc:  # noqa: BLE001 - refused, timed out, a malformed address, a non-Dask peer
            why = " ".join(f"{type(exc).__name__}: {exc}".split())
            raise SchedulerUnreachable(f"cannot reach a Dask scheduler at {scheduler!r} within {connect_timeout:g} s "
                                       f"({why})") from None
        with client:
            yield client
        return
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1; got {workers!r}")
    # The nanny sets its pre-spawn environment before it starts a worker process (and again when it restarts a
    # dead one); a variable already in os.environ would take precedence over the configuration, hence _environ.
    env = {**dask.config.get("distributed.nanny.pre-spawn-environ"), **WORKER_ENV}
    # The scheduler's and the workers' scratch space (spilled data, lock files) in a fresh temporary folder removed
    # on exit, not in a dask-scratch-space folder left behind in the system temp
    with tempfile.TemporaryDirectory(prefix="prefalign-dask-") as scratch:
        with dask.config.set({"distributed.nanny.pre-spawn-environ": env, "temporary-directory": scratch}), \
                _environ(WORKER_ENV):
            cluster = LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True,
                                   dashboard_address=":0", silence_logs=logging.ERROR, local_directory=scratch)
        with cluster, Client(cluster, set_as_default=False) as client:
            yield client


def read_cell(path: Path) -> Any:
    """The result stored in cell file ``path``; :class:`CellFolderError` naming the file when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise CellFolderError(f"cannot read {str(path)!r} ({exc}): remove it to compute the cell again") from None


def read_summary_file(path: Path, *, kind: str, list_key: str, what: str, folder: str) -> dict[str, Any]:
    """The summary a sweep wrote to ``path``: a JSON object whose ``sweep`` is ``kind`` and whose ``list_key`` is a
    list. :class:`CellFolderError` naming the file when there is none (DIR must be ``folder``), when it cannot be
    read, or when it is not ``what``."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CellFolderError(f"{str(path)!r} does not exist: DIR must be {folder}") from None
    except (OSError, ValueError) as exc:
        raise CellFolderError(f"cannot read {str(path)!r}: {exc}") from None
    if not isinstance(summary, dict) or summary.get("sweep") != kind or not isinstance(summary.get(list_key), list):
        raise CellFolderError(f"{str(path)!r} is not {what}")
    return summary


def _remove_stale_temporaries(cells: Sequence[Cell]) -> None:
    """Remove the temporary files that a run killed while writing a cell left (``.<name>.*.tmp``)."""
    for d in {c.path.parent for c in cells}:
        if d.is_dir():
            names = {c.path.name for c in cells if c.path.parent == d}
            for tmp in d.glob(".*.tmp"):
                if any(tmp.name.startswith(f".{n}.") for n in names):
                    tmp.unlink(missing_ok=True)


def _write(path: Path, result: Any) -> None:
    atomic_write_text(path, json.dumps(result, indent=1, allow_nan=False) + "\n")


def run_cells(client, cells: Sequence[Cell], *, desc: str = "cells", progress: bool = True,
              on_written: Callable[[Cell, Any], None] | None = None) -> CellRun:
    """Run every cell of ``cells`` whose file does not exist on the cluster of ``client`` and write each result
    to its file as it finishes (atomically). Cells start in the given order (explicit task priorities; with two
    workers or more they finish roughly in that order). ``on_written(cell, result)`` is called after each write. A progress bar over all the cells goes
    to stderr unless ``progress`` is False.

    A cell with ``deps`` gets their results as its last arguments: the finished cells' files read back
    (:func:`read_cell`), the others' results passed from worker to worker by Dask (the cell starts when they are
    done; when one of them fails, so does the cell).

    With every cell finished already, nothing is submitted and ``client`` may be None.
    A cell whose task raised, or whose worker died more often than the scheduler allows, is reported in
    :attr:`CellRun.failed` and not written (a rerun tries it again); the other cells go on. On an interrupt
    (``KeyboardInterrupt``) the cells not yet finished are cancelled and the interrupt propagates: every cell
    written so far stays."""
    from distributed import as_completed
    from tqdm import tqdm

    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        raise ValueError("cells must have distinct keys")
    for k, c in enumerate(cells):
        if not set(c.deps) <= set(keys[:k]):
            raise ValueError(f"cell {c.key!r} depends on {sorted(set(c.deps) - set(keys[:k]))}, not cells before it")
    t0 = time.perf_counter()
    run = CellRun(total=len(cells))
    _remove_stale_temporaries(cells)
    pending = [c for c in cells if not c.path.is_file()]
    run.kept = [c.key for c in cells if c.path.is_file()]
    if not pending:  # nothing to run: the client is not needed (it may be None)
        run.seconds = time.perf_counter() - t0
        return run
    token = uuid.uuid4().hex[:8]
    bar = tqdm(total=len(cells), initial=len(run.kept), desc=desc, unit="cell", file=sys.stderr,
               disable=not progress, dynamic_ncols=True, mininterval=0.5)
    futures: dict[Any, Cell] = {}  # the cells in flight; a future is dropped (and released) once handled
    by_key = {c.key: c for c in cells}
    submitted: dict[str, Any] = {}  # key -> future, what a dependent cell is given for a cell not finished yet
    try:
        # One task group for all the cells ("<desc>-<token>-<k>": Dask groups keys by their prefix), so that the
        # scheduler treats them alike: with many cells it queues them and hands each worker the next cell when
        # it has a free thread, in the order of the explicit priorities (first cell first). Cells in separate
        # groups would be sent to the workers' own queues up front, and a large group starved behind them.
        for k, c in enumerate(pending):
            deps = [submitted[d] if d in submitted else read_cell(by_key[d].path) for d in c.deps]
            fut = client.submit(c.func, *c.args, *deps, key=f"{desc}-{token}-{k}", pure=False,
                                priority=len(pending) - k)
            futures[fut] = c
            submitted[c.key] = fut
        for fut in as_completed(list(futures), loop=client.loop):
            cell = futures.pop(fut)
            submitted.pop(cell.key, None)
            try:
                result = fut.result()
            except Exception as exc:  # noqa: BLE001 - a task that raised or a worker that died too often
                run.failed[cell.key] = " ".join(f"{type(exc).__name__}: {exc}".split())
                bar.update(1)
                continue
            cell.path.parent.mkdir(parents=True, exist_ok=True)
            _write(cell.path, result)
            run.written.append(cell.key)
            if on_written is not None:
                on_written(cell, result)
            bar.set_postfix_str(cell.key, refresh=False)
            bar.update(1)
    finally:
        bar.close()
        if futures:
            client.cancel(list(futures))
        run.seconds = time.perf_counter() - t0
    return run
