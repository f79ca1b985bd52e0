"""Command line of the verification suite.

    python -m verification list
    python -m verification run [ID ...] [--json PATH [--resume]] [--seed N] [--baseline PATH]
    python -m verification report [ID ...] [--out DIR] [--scale default|paper] [--seed N] [--resume] [--sweep DIR]
                                  [--llm-run DIR ... | --llm-sweep DIR | --no-llm] [--llm-gate DIR]
                                  [--workers K | --scheduler ADDRESS]
    python -m verification power [ID ...] [--factor 0.5] [--seed N] [--search stored|default|paper|none] [--json PATH]
    python -m verification search [ID ...] [--budget N] [--seed N] [--store [DIR]]
                                  [--workers K | --scheduler ADDRESS] --out DIR
    python -m verification sweep [ID ... | --mc] --seeds A:B [--scale default|paper]
                                 [--workers K | --scheduler ADDRESS] --out DIR
    python -m verification llm-regression RUN_DIR [RUN_DIR ...] --baseline PATH [--write]
    python -m verification mc-calibration [--replications R] [--os-replications R] [--seed N] [--json PATH]
    python -m verification grid [K=1,4,16,64] [S=4,16,64] [delta_lambda=0.02,0.05,0.2] --seeds A:B
                                [--preset smoke|paper] [--workers K | --scheduler ADDRESS] --out DIR

``run`` prints one progress line per statement on stderr as it finishes, then a table on stdout. With
``--json PATH`` it appends each finished statement's result object (``Evidence.to_dict``) to the results log
``PATH.jsonl`` as it goes (:mod:`verification.core.resultlog`) and writes the JSON list of them to PATH at the end
(atomically); ``--resume`` reads that log, skips the statements it holds and runs the rest.

``report`` runs the checks and the studies and writes the dashboard and figures (:mod:`verification.report.dashboard`),
logging each statement to ``DIR/results.jsonl`` as it finishes; ``--resume`` finishes an interrupted report;
``--sweep DIR`` adds the summary of a sweep to the dashboard. The dashboard's "LLM run" section
(:mod:`verification.report.llm_section`) runs the LLM smoke preset (``python -m llm_runs run --preset smoke --out
DIR/llm-run``) unless ``--llm-run DIR`` names an earlier run directory (repeat it for runs at several S) or
``--no-llm`` skips the section; a ``--llm-run`` that is not a run directory is a usage error. ``--llm-sweep DIR``
reads an LLM sweep folder (``python -m llm_runs sweep --out DIR``: one run directory per seed in
``DIR/runs/<seed>/``): the section opens with one line per pre-registered statistic (estimate, interval,
p-value, minimum detectable effect, verdict) and the hypotheses of the run studies across the seeds (mean and
95 % t-interval, beside the synthetic value; :mod:`verification.llm.sweep`), then shows the first seed's run in
detail; when the seeds' runs hold the shots records, the shots curve comes first (its figure, one line per
pre-registered statistic, the ψ-raise flags, w_II − w_I, the adaptation at each budget;
:mod:`verification.llm.answer`). ``--llm-gate DIR`` (a folder of ``python -m llm_runs gate``) opens the section with
the gate's table (objective × budget: margin change, accuracy, intervals, p-values, pass) and the objectives that
entered; the report keeps a copy of its ``gate.json`` in ``OUT/llm-gate/``. A DIR without a readable ``gate.json``
is a usage error, as is ``--llm-gate`` with ``--no-llm``. It is one LLM source, so it is a usage error with ``--llm-run`` or ``--no-llm``, as is a DIR without
``runs/``, with no run in it or no complete one, or with a ``runs/<seed>`` that is not an LLM run directory.

``sweep`` runs every (statement, seed) cell as a Dask task, on a local cluster of K worker processes or on the
cluster of an existing scheduler, writes each cell's result row to ``DIR/cells/<id>/<seed>.json`` as it finishes
and the summary to ``DIR/sweep.json`` and ``DIR/sweep.csv`` (:mod:`verification.engine.sweep`); the same command again
computes only the cells still missing. A scheduler that cannot be reached is a usage error. ``search`` runs the falsification search
(:mod:`verification.core.search`) on the same engine: per statement with a box, ``--budget`` evaluations (a design in
cells of 50 points, then one refinement cell), results in ``DIR/worst/<id>.json`` and ``DIR/search.json``; it exits
1 when it finds a counterexample that no documented finding covers; ``--store`` copies the results to the store (``verification/data/search``) that
``report`` and ``power`` refine from. ``grid`` runs Algorithm
1 (``sim.simulate``) over a grid of the new clients' budget K x S and the preference spread on the same engine
(:mod:`verification.engine.grid`) and writes the Pipeline 1 vs Pipeline 2 gap with confidence bands and its figure.

Exit status: 0 iff no verdict is "violated" or "vacuous", no negative control is "missed", no check raised and
(with ``--baseline``) no bound regressed against the earlier results (:mod:`verification.core.regression`); 1
otherwise (a "finding" is a result, not a failure: a literal statement shown false with its repaired form holding,
or an assumption whose documented ``SEARCH_FINDINGS`` the falsification search refutes on part of its box;
``report`` exits 1 only for what :func:`verification.report.dashboard.report_problems` lists, each in its
summary); 2 on a usage error, found before any statement runs and printed as one line naming the argument (a
bad seed or tolerance, unknown ids, an unreadable or malformed baseline, an output path that cannot be written, a
results log that cannot be resumed), and when the ``--out`` folder of ``sweep``, ``search``, ``grid`` or ``report``
is being written by another running command (one writer per folder: the command holds the folder's lock from
after its argument checks to its end, :func:`sim.cli.writer_lock`; the line names the other command's pid, host,
start and command line); 130 when interrupted (the finished statements stay in the log).

``power`` re-runs the checks with every numeric bound scaled to ``rhs − (1 − f)|rhs|`` and reports per conclusion
whether that is detected, with the falsification search's best ratio and the stated reason for a weak one
(:mod:`verification.core.power`); it exits 1 when a weak conclusion has no reason or a prediction disagrees.

``llm-regression`` compares the records of LLM runs (``python -m llm_runs run --out RUN_DIR``) with a baseline of
their summary quantities (:mod:`verification.llm.regression`; exit 1 on a regression); with ``--write`` it makes
that baseline from two or more runs of one preset and seed, the tolerances measured from their spread.

``mc-calibration`` measures the false-failure rate of every budgeted confidence-level assertion at its boundary
(:mod:`verification.engine.mc_calibration`): each assertion's own estimator, sample size and ``δ`` on synthetic draws whose
mean is exactly its bound, R times (H.17's order-statistic tests ``--os-replications`` times, default 4,000,000
at the default R of 300,000, in proportion otherwise), with
the one-sided Clopper–Pearson upper bounds and the exact rates where they are known, and the family-wise sum against
the budget ``1e-3``; ``--json PATH`` writes the result (the committed one is
``verification/data/mc_calibration.json``, the defaults). It exits 1 when that sum does not show the budget or a
replicated rate disagrees with its exact one.

New subcommands (a later ``report``) are added by writing ``_add_<name>(subparsers)`` that sets
``func=_cmd_<name>`` and appending it to ``_SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from sim import cli
from sim.cli import UsageError
from verification.core import registry, regression, resultlog

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = cli.EXIT_OK, cli.EXIT_FAIL, cli.EXIT_USAGE, cli.EXIT_INTERRUPTED

#: When each sub-command exits 1 (its ``--help`` lists every exit status, :func:`sim.cli.exit_status_help`).
FAIL_WHEN = {
    "list": None,
    "run": "a verdict is violated, vacuous or error, a negative control is missed, or (--baseline) a bound "
           "regressed",
    "report": "the dashboard was written and needs acting on: a verdict is violated (a counterexample no "
              "documented finding covers), vacuous or error, a negative control is missed, the confidence-level "
              "assertions exceed the family-wise budget, or the LLM run failed; a finding (H.16's eq 48, H.19's "
              "search counterexamples) is a result, shown with its counterexamples, and exits 0",
    "power": "a weak conclusion has no stated reason, or the plain run's prediction disagrees with the re-run",
    "sweep": "a cell failed, a verdict is violated, vacuous or error, or a negative control is missed at any seed",
    "grid": "a cell raised or the grid is incomplete",
    "search": "the search found a counterexample (a contract conclusion beyond its bound with every hypothesis held) "
              "that the statement does not document as a finding (SEARCH_FINDINGS; H.19's eq 51 is one: shown, "
              "exit 0), or a cell failed or is missing",
    "mc-calibration": "the summed Clopper-Pearson upper bounds do not show the family-wise false-failure rate <= the "
                      "budget 1e-3, or a replicated rate disagrees with its exact one",
}


def _epilog(command: str | None = None) -> str:
    if command is None:
        return cli.exit_status_help("a check failed: see each command's --help")
    return cli.exit_status_help(FAIL_WHEN[command])


def _fmt_tightness(t) -> str:
    if t is None:
        return "-"
    return t if isinstance(t, str) else f"{t:.4g}"


def _cmd_list(args: argparse.Namespace) -> int:
    for s in registry.all_statements():
        print(f"{s.id:<10} {s.number:<8} {s.name}")
    return EXIT_OK


_COLUMNS = ("id", "name", "verdict", "tightness", "instances", "excluded", "neg.control", "cex", "seconds")


def _table(rows: list[dict]) -> str:
    cells = [
        [
            r["id"],
            (r["name"][:47] + "...") if len(r["name"]) > 50 else r["name"],
            r["verdict"],
            _fmt_tightness(r["tightness"]),
            str(r["instances"]),
            str(r["excluded"]),
            r["negative_control"],
            str(r["counterexamples"]),
            f"{r['seconds']:.2f}",
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(c[k]) for c in cells)) if cells else len(h) for k, h in enumerate(_COLUMNS)]
    numeric = {3, 4, 5, 7, 8}

    def line(vals):
        return "  ".join(v.rjust(w) if k in numeric else v.ljust(w) for k, (v, w) in enumerate(zip(vals, widths, strict=True)))

    return "\n".join([line(_COLUMNS), line(["-" * w for w in widths])] + [line(c) for c in cells])


def _resolve(ids) -> list[registry.Statement]:
    try:
        return registry.resolve(ids)
    except registry.UnknownStatementError as exc:
        raise UsageError(f"argument ID: {exc}") from None


def _note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run_row(stmt: registry.Statement, seed: int, jitter: float = 0.0, jitter_seed: int = 0) -> dict:
    """The (JSON-ready) result row of one statement; a check that raises is an ``error`` row, with the traceback
    on stderr, and the run goes on."""
    return registry.run_statement_row(stmt, seed, jitter=jitter, jitter_seed=jitter_seed,
                                      on_error=registry.print_traceback)[1]


#: The ``--baseline`` value that ``--shipped-baseline`` stores; resolved to the package's file when the run starts.
_SHIPPED = object()


def _cmd_run(args: argparse.Namespace) -> int:
    # every usage error is found here, before the first statement runs
    args.baseline_is_shipped = args.baseline is _SHIPPED
    if args.baseline_is_shipped:
        try:
            args.baseline = str(regression.shipped_baseline())
        except FileNotFoundError as exc:
            raise UsageError(f"argument --shipped-baseline: {exc}") from None
    if args.resume and not args.json:
        raise UsageError("argument --resume: needs --json PATH (the results log to resume is PATH.jsonl)")
    stmts = _resolve(args.ids)
    try:
        baseline = regression.load_results(args.baseline) if args.baseline else None
    except ValueError as exc:
        option = "--shipped-baseline" if args.baseline_is_shipped else "--baseline"
        raise UsageError(f"argument {option}: {exc}") from None
    header = resultlog.log_header("run", args, [s.id for s in stmts])
    log, done = None, {}
    if args.json:
        cli.check_writable_file(args.json, "--json")
        cli.check_writable_file(resultlog.log_path(args.json), "--json")
        try:
            log, kept = resultlog.open_log(resultlog.log_path(args.json), header, resume=args.resume, note=_note)
        except resultlog.ResultLogError as exc:
            raise UsageError(f"argument --resume: {exc}") from None
        done = {r["id"]: r["row"] for r in kept}
    rows: list[dict] = []
    n = len(stmts)
    try:
        for k, s in enumerate(stmts, 1):
            row = done.get(s.id)
            if row is None:
                row = _run_row(s, args.seed, args.jitter, args.jitter_seed)
                took = f"{row['seconds']:.2f} s"
                if log is not None:
                    log.append({"id": s.id, "row": row})
            else:  # kept from the log of an earlier run (--resume)
                assert log is not None
                took = f"from {log.path}"
            rows.append(row)
            _note(f"[{k}/{n}] {s.id}: {row['verdict']} (negative control: {row['negative_control']}, {took})")
    except KeyboardInterrupt:
        kept_msg = (f"the {len(rows)} finished statement(s) are in {log.path}; finish with the same command and "
                    "--resume") if log is not None else "nothing was kept (no --json PATH)"
        _note(f"interrupted after {len(rows)} of {n} statements: {kept_msg}")
        return EXIT_INTERRUPTED
    print(_table(rows))
    if args.json:
        cli.atomic_write_text(args.json, json.dumps(rows, indent=2, allow_nan=False) + "\n")
    failed = any(map(resultlog.row_failed, rows))
    if baseline is not None:
        reg = regression.compare(rows, baseline, rtol=args.tightness_rtol)
        print(reg.summary())
        failed |= not reg.ok
    return EXIT_FAIL if failed else EXIT_OK


def _jitter_value(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1e-3); got {text!r}") from None
    if not (0.0 <= v < 1e-3):
        raise argparse.ArgumentTypeError(f"must be a relative size in [0, 1e-3); got {text!r}")
    return v


def _add_list(sub) -> None:
    p = sub.add_parser("list", help="list the statements: id, number, name", epilog=_epilog("list"))
    p.set_defaults(func=_cmd_list)


def _add_seed(p) -> None:
    p.add_argument("--seed", type=cli.seed, default=registry.DEFAULT_SEED,
                   help="RNG seed, an integer >= 0 (default %(default)s)")


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run checks and negative controls", epilog=_epilog("run"))
    p.add_argument("ids", nargs="*", metavar="ID", help="statement ids (default: all)")
    p.add_argument("--json", metavar="PATH",
                   help="write the results as a JSON list to PATH at the end, and each statement's result to the "
                        "results log PATH.jsonl as it finishes")
    _add_seed(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--baseline", metavar="PATH",
                       help="compare with an earlier results.json; exit 1 if a verdict regresses from holds, a "
                            "negative control stops being detected, or a tightness moves past the tolerance")
    which.add_argument("--shipped-baseline", dest="baseline", action="store_const", const=_SHIPPED,
                       help="compare with the baseline shipped in the package (the default run of every statement, "
                            "seed 0, at the pinned versions), e.g. to check that an installation reproduces it")
    p.add_argument("--tightness-rtol", type=cli.nonnegative_float, default=regression.TIGHTNESS_RTOL,
                   help="relative tolerance on tightness changes against the baseline, a finite number >= 0 "
                        "(default %(default)s)")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted run: keep the statements already in PATH.jsonl and run the rest "
                        "(needs --json PATH and the same ids and seed)")
    p.add_argument("--jitter", type=_jitter_value, default=0.0, metavar="REL",
                   help="roundoff-sensitivity mode: perturb every problem's data by the relative amount REL (e.g. "
                        "1e-14; every continuous random draw x becomes x(1 + REL·u), u ~ U(-1, 1)); with --baseline, "
                        "verdicts, negative controls, counterexample counts and tightness must not move (default 0)")
    p.add_argument("--jitter-seed", type=cli.seed, default=1, metavar="N",
                   help="seed of the jitter stream, an integer >= 0 (independent of --seed; default %(default)s)")
    p.set_defaults(func=_cmd_run)


def _cmd_report(args: argparse.Namespace) -> int:
    from verification.report.dashboard import LOG_NAME, SEARCH_BUDGET, ReportCellsFailed, build_report

    stmts = _resolve(args.ids)
    sweep_summary = None
    if args.sweep is not None:
        from verification.engine.dask_engine import CellFolderError
        from verification.engine.sweep import read_summary

        try:
            sweep_summary = read_summary(args.sweep)
        except CellFolderError as exc:
            raise UsageError(f"argument --sweep: {exc}") from None
    llm_runs = None
    if args.llm_sweep is not None:
        for other, given in (("--llm-run", args.llm_run), ("--no-llm", args.no_llm)):
            if given:
                raise UsageError(f"argument --llm-sweep: not allowed with argument {other} (the sweep is the "
                                 "section's LLM source)")
        from verification.llm.sweep import read_sweep

        try:
            read_sweep(args.llm_sweep)
        except ValueError as exc:
            raise UsageError(f"argument --llm-sweep: {exc}") from None
    if args.llm_gate is not None:
        if args.no_llm:
            raise UsageError("argument --llm-gate: not allowed with argument --no-llm (the gate opens the LLM "
                             "section)")
        from verification.llm.answer import read_gate

        try:
            read_gate(args.llm_gate)
        except ValueError as exc:
            raise UsageError(f"argument --llm-gate: {exc}") from None
    if args.llm_run:
        if args.no_llm:
            raise UsageError("argument --no-llm: not allowed with argument --llm-run")
        from verification.llm.records import load_run

        for d in args.llm_run:
            try:
                run = load_run(d)
            except ValueError as exc:
                raise UsageError(f"argument --llm-run: {exc}") from None
            if run.kind != "llm":
                raise UsageError(f"argument --llm-run: {d!r} is a synthetic run (sim.simulate), not an LLM run "
                                 "(python -m llm_runs run)")
        llm_runs = list(args.llm_run)
    on_dask = args.workers is not None or args.scheduler is not None
    with cli.writer_lock(args.out, "--out") as out, contextlib.ExitStack() as stack:
        client = None
        if on_dask:
            from verification.engine.dask_engine import CellFolderError, SchedulerUnreachable, dask_client
            from verification.report import cells

            try:
                cells.prepare_folder(out, cells.report_params(seed=args.seed, scale=args.scale,
                                                              budget=SEARCH_BUDGET[args.scale]), resume=args.resume)
            except CellFolderError as exc:
                raise UsageError(f"argument --out: {exc}") from None
            try:
                client = stack.enter_context(dask_client(args.workers, args.scheduler,
                                                         connect_timeout=args.connect_timeout))
            except SchedulerUnreachable as exc:
                raise UsageError(f"argument --scheduler: {exc}") from None
        try:
            res = build_report(out, ids=[s.id for s in stmts], scale=args.scale, seed=args.seed,
                               studies=not args.no_studies, resume=args.resume, sweep=sweep_summary,
                               llm=not args.no_llm, llm_runs=llm_runs, llm_sweep=args.llm_sweep,
                               llm_gate=args.llm_gate, client=client)
        except resultlog.ResultLogError as exc:
            raise UsageError(f"argument --resume: {exc}") from None
        except ReportCellsFailed as exc:
            _note(str(exc))
            return EXIT_FAIL
        except KeyboardInterrupt:
            finished = f"{out / LOG_NAME}" + (f" and {out}/cells" if on_dask else "")
            _note(f"interrupted: the finished statements are in {finished}; finish with the same command and "
                  "--resume")
            return EXIT_INTERRUPTED
    print(res.summary())
    return EXIT_FAIL if res.failed else EXIT_OK


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="run the checks and the studies; write the dashboard and figures",
                       epilog=_epilog("report"))
    p.add_argument("ids", nargs="*", metavar="ID", help="statement ids (default: all)")
    p.add_argument("--out", default="reports", metavar="DIR", help="output folder (default %(default)s)")
    p.add_argument("--scale", choices=registry.SCALES, default="default",
                   help="default: every check in seconds; paper: the larger presets where a check has one")
    _add_seed(p)
    p.add_argument("--no-studies", action="store_true", help="skip the reported studies")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted report: keep the statements already in DIR/results.jsonl (and their "
                        "files under DIR) and run the rest (needs the same ids, scale and seed)")
    p.add_argument("--sweep", metavar="DIR",
                   help="add the sweep in DIR (the --out folder of `python -m verification sweep`) to the dashboard: "
                        "verdicts and tightness spread over its seeds, Monte Carlo failure rates, one figure")
    p.add_argument("--llm-run", action="append", metavar="DIR",
                   help="the LLM section reads this run directory of `python -m llm_runs run` (trajectory.csv, "
                        "summary.json) instead of running the smoke preset; repeat for runs at several S")
    p.add_argument("--llm-sweep", metavar="DIR",
                   help="the LLM section reads the LLM sweep in DIR (`python -m llm_runs sweep --out DIR`, one run "
                        "directory per seed in DIR/runs/<seed>/): the pre-registered statistics and the hypotheses "
                        "across seeds first, then the first seed's run in detail; when its runs hold the shots "
                        "records, the shots curve and its pre-registered statistics before them; not with --llm-run "
                        "or --no-llm")
    p.add_argument("--llm-gate", metavar="DIR",
                   help="the LLM section opens with the positive-control gate in DIR (`python -m llm_runs gate --out "
                        "DIR`, its gate.json): objective x budget -> margin change, accuracy, intervals, p-values, "
                        "pass, and the objectives that entered; a copy is kept in OUT/llm-gate/; not with --no-llm")
    p.add_argument("--no-llm", action="store_true",
                   help="skip the LLM section (by default it runs `python -m llm_runs run --preset smoke` on the "
                        "embedded model, and says so when torch or the model is not installed)")
    _add_where(p, workers_default="no cluster: the statements one after the other in this process")
    p.set_defaults(func=_cmd_report)


def _on_dask(args: argparse.Namespace, what: str, n_cells: int, pending: int, out, run):
    """``run(client)`` on the cluster the arguments name (started only when ``pending`` cells are left; else
    ``run(None)``); a scheduler that cannot be reached is a usage error."""
    from verification.engine.dask_engine import SchedulerUnreachable, dask_client

    where = (f"the scheduler at {args.scheduler}" if args.scheduler
             else f"a local cluster of {args.workers or 'one per CPU'} worker(s)")
    _note(f"{what} = {n_cells} cells: {pending} to compute" + (f" on {where}" if pending else "")
          + f", results in {out}")
    try:
        if not pending:
            return run(None)
        with dask_client(args.workers, args.scheduler, connect_timeout=args.connect_timeout) as client:
            return run(client)
    except SchedulerUnreachable as exc:
        raise UsageError(f"argument --scheduler: {exc}") from None


@contextlib.contextmanager
def _cell_folder(args: argparse.Namespace, params: dict, read_cells=None) -> Iterator[Path]:
    """The ``--out`` folder of a command whose cells run on Dask, locked for this command until the block ends
    (:func:`sim.cli.writer_lock`: a folder another running command writes is a usage error naming it); under the
    lock its ``params.json`` is checked against ``params`` and ``read_cells(out)`` reads its cells, so that a
    folder made with other parameters or holding a bad cell file is a usage error, and none of it changes before
    the work starts."""
    from verification.engine.dask_engine import CellFolderError, check_params

    with cli.writer_lock(args.out, "--out") as out:
        try:
            check_params(out, params)
            if read_cells is not None:
                read_cells(out)
        except CellFolderError as exc:
            raise UsageError(f"argument --out: {exc}") from None
        yield out


def _interrupted(out) -> int:
    _note(f"interrupted: the finished cells are in {out}/cells; the same command computes the rest")
    return EXIT_INTERRUPTED


def _cmd_sweep(args: argparse.Namespace) -> int:
    from verification.engine import sweep

    # every usage error is found here, before any cell runs or any cluster starts
    try:
        stmts = sweep.parse_ids_or_mc(args.ids, args.mc)
    except registry.UnknownStatementError as exc:
        raise UsageError(f"argument ID: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"argument --mc: {exc}") from None
    seeds = list(args.seeds)
    ids = [s.id for s in stmts]
    with _cell_folder(args, sweep.sweep_params(args.scale), lambda out: sweep.read_cells(out, ids, seeds)) as out:
        cells = sweep.sweep_cells(out, stmts, seeds, args.scale)
        pending = sum(not c.path.is_file() for c in cells)
        try:
            run = _on_dask(args, f"sweep of {len(stmts)} statement(s) x {len(seeds)} seed(s) at scale {args.scale}",
                           len(cells), pending, out,
                           lambda client: sweep.run_sweep(client, out, stmts, seeds, scale=args.scale,
                                                          progress=not args.quiet))
        except KeyboardInterrupt:
            return _interrupted(out)
        summary = sweep.summarize(stmts, seeds, sweep.read_cells(out, ids, seeds), scale=args.scale, run=run)
        sweep.write_summary(out, summary)
    print(sweep.screen(summary, out, run))
    return EXIT_FAIL if sweep.failed(summary, run) else EXIT_OK


def _add_dask_options(p, what: str, seeds: bool = True) -> None:
    """The options of a command whose cells run on Dask: seeds, where, output folder."""
    if seeds:
        p.add_argument("--seeds", type=cli.seed_range, required=True, metavar="A:B",
                       help="the seeds A, A+1, ..., B-1 (integers 0 <= A < B)")
    _add_where(p)
    p.add_argument("--out", required=True, metavar="DIR", help=what)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_where(p, workers_default: str = "one per CPU") -> None:
    """The options that say which Dask cluster runs the cells: ``--workers``, ``--scheduler``, ``--connect-timeout``."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=cli.positive_int, metavar="K",
                       help="start a local Dask cluster of K worker processes, one thread each, BLAS pinned to one "
                            f"thread (default: {workers_default})")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="use the existing Dask cluster whose scheduler listens at ADDRESS (e.g. "
                            "tcp://10.0.0.5:8786). Dask sends it pickled tasks and unpickles the results it sends "
                            "back: trust the cluster, and everyone who can reach its scheduler, as much as your own "
                            "account")
    p.add_argument("--connect-timeout", type=cli.positive_float, default=5.0, metavar="S",
                   help="seconds allowed to reach the --scheduler (default %(default)s)")


def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run statements x seeds as Dask tasks; one result file per cell, a summary",
                       epilog=_epilog("sweep"))
    p.add_argument("ids", nargs="*", metavar="ID", help="statement ids (default: all)")
    p.add_argument("--mc", action="store_true",
                   help="sweep the statements with Monte Carlo assertions (instead of IDs)")
    p.add_argument("--scale", choices=registry.SCALES, default="default",
                   help="default: every check in seconds; paper: the larger presets where a check has one")
    _add_dask_options(p, "the sweep folder: cells/<id>/<seed>.json, params.json, sweep.json, sweep.csv")
    p.set_defaults(func=_cmd_sweep)


def _cmd_search(args: argparse.Namespace) -> int:
    from verification.core import search
    from verification.engine import search_cells

    stmts = _resolve(args.ids)  # every usage error is found here, before any cell runs or any cluster starts
    boxless = [s.id for s in stmts if s.search is None]
    if boxless and args.ids:
        raise UsageError(f"argument ID: {', '.join(boxless)} declare(s) no search box (SEARCH); the statements "
                         "with one: " + " ".join(s.id for s in registry.all_statements() if s.search is not None))
    stmts = [s for s in stmts if s.search is not None]
    if args.store is not None:
        cli.check_writable_dir(args.store, "--store")
    with _cell_folder(args, search_cells.search_params(args.budget, args.seed)) as out:
        pending = search_cells.pending_cells(out, stmts, args.budget, args.seed)
        n_cells = len(search_cells.design_cells(out, stmts, args.budget, args.seed)) + len(stmts)
        try:
            runs = _on_dask(args, f"falsification search of {len(stmts)} statement(s), {args.budget} evaluations "
                                  f"each (seed {args.seed})", n_cells, pending, out,
                            lambda client: search_cells.run_search(client, out, stmts, evaluations=args.budget,
                                                                   seed=args.seed, progress=not args.quiet))
        except KeyboardInterrupt:
            return _interrupted(out)
        summary = search_cells.write_results(out, stmts, args.budget, args.seed)
        failed = {k: v for r in (runs or ()) if r is not None for k, v in r.failed.items()}
        print(search.screen(summary))
        for key, why in failed.items():
            _note(f"cell {key} failed: {why}")
        if args.store is not None and not failed:  # copied from the folder while it is locked
            copied = search.store_results(out, args.store)
            _note(f"stored the results of {len(copied)} statement(s) in {args.store}")
    incomplete = [sid for sid, v in summary["statements"].items() if not v["complete"]]
    findings = {sid: v["findings"] for sid, v in summary["statements"].items() if v.get("findings")}
    if findings:
        _note("findings (documented counterexamples, not a failure): "
              + "; ".join(f"{sid}: {', '.join(names)}" for sid, names in findings.items()))
    for sid, names in summary["undocumented"].items():
        _note(f"to act on (exit status 1): {sid}: counterexamples of {', '.join(names)}")
    return EXIT_FAIL if summary["undocumented"] or failed or incomplete else EXIT_OK


def _add_search(sub) -> None:
    from verification.core.search import DEFAULT_EVALUATIONS, STORE

    p = sub.add_parser("search", help="the falsification search as Dask cells: try to break every numeric "
                                      "conclusion on its family box; worst/<id>.json per statement",
                       epilog=_epilog("search"))
    p.add_argument("ids", nargs="*", metavar="ID", help="statement ids (default: every statement with a box)")
    p.add_argument("--budget", type=cli.positive_int, default=DEFAULT_EVALUATIONS, metavar="N",
                   help="evaluations of the check per statement: half a scrambled Halton design of the box, half "
                        "refinement chains from each conclusion's best point (default %(default)s)")
    _add_seed(p)
    p.add_argument("--store", metavar="DIR", nargs="?", const=str(STORE), default=None,
                   help="after a complete run, copy the results into DIR, the store the report refines from "
                        f"(without DIR: {STORE.relative_to(STORE.parents[2])})")
    _add_dask_options(p, "the search folder: cells/<id>/design-<k>.json and refine.json, params.json, "
                         "search.json, worst/<id>.json", seeds=False)
    p.set_defaults(func=_cmd_search)


def _cmd_grid(args: argparse.Namespace) -> int:
    from verification.engine import grid

    try:
        axes = grid.parse_axes(args.axes, args.preset)
    except grid.GridError as exc:
        raise UsageError(f"argument AXIS=VALUES: {exc}") from None
    points = grid.grid_points(axes)
    seeds = list(args.seeds)
    with _cell_folder(args, grid.grid_params(args.preset),
                      lambda out: grid.read_grid_cells(out, points, seeds)) as out:
        cells = grid.grid_cells(out, args.preset, points, seeds)
        pending = sum(not c.path.is_file() for c in cells)
        shape = " x ".join(f"{len(v)} {a}" for a, v in axes.items())
        try:
            run = _on_dask(args, f"grid of {shape} (preset {args.preset}) x {len(seeds)} seed(s)", len(cells),
                           pending, out, lambda client: grid.run_grid(client, out, args.preset, points, seeds,
                                                                      progress=not args.quiet))
        except KeyboardInterrupt:
            return _interrupted(out)
        table = grid.summarize_grid(grid.read_grid_cells(out, points, seeds))
        grid.write_grid(out, table, preset=args.preset, seeds=seeds, run=run)
        from verification.report import figures  # plotting is imported only when a figure is drawn

        drawn, missing = figures.draw_grid(out, table)
    print(grid.screen(table, out, run, drawn, missing))
    return EXIT_OK if run.complete and not table["errors"].any() else EXIT_FAIL


def _add_grid(sub) -> None:
    from sim.simulate import PRESETS
    from verification.engine.grid import AXES

    p = sub.add_parser("grid", help="Algorithm 1 over a grid of K, S and preference spread x seeds, as Dask tasks: "
                                    "the Pipeline 1 vs Pipeline 2 gap with confidence bands", epilog=_epilog("grid"))
    p.add_argument("axes", nargs="*", metavar="AXIS=VALUES",
                   help="grid axes, e.g. K=1,4,16,64 S=4,16,64 delta_lambda=0.02,0.05,0.2 ("
                        + "; ".join(f"{a}: {d}" for a, d in AXES.items()) + "); an axis left out keeps the preset's "
                        "value")
    p.add_argument("--preset", choices=sorted(PRESETS), default="smoke",
                   help="the sim.simulate preset the grid varies (default %(default)s)")
    _add_dask_options(p, "the grid folder: cells/<point>/<seed>.json, params.json, grid.csv, grid.json, figures/")
    p.set_defaults(func=_cmd_grid)


def _cmd_power(args: argparse.Namespace) -> int:
    from verification.core.power import power_report

    stmts = _resolve(args.ids)  # every usage error is found here, before the first statement runs
    if args.json:
        cli.check_writable_file(args.json, "--json")
    try:
        rep = power_report([s.id for s in stmts], factor=args.factor, seed=args.seed, search=args.search)
    except KeyboardInterrupt:
        _note("interrupted: nothing was kept (the power report writes its results at the end)")
        return EXIT_INTERRUPTED
    print(rep.table())
    print(rep.summary())
    if args.json:
        cli.atomic_write_text(args.json, json.dumps(rep.to_json(), indent=2, allow_nan=False) + "\n")
    return EXIT_OK if rep.ok else EXIT_FAIL


def _factor(text: str) -> float:
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1]; got {text!r}") from None
    if not 0.0 < f <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1]; got {text!r}")
    return f


def _add_power(sub) -> None:
    from verification.core.search import BUDGETS, STORED

    p = sub.add_parser("power", help="re-run the checks with every numeric bound weakened; report per conclusion "
                                     "whether that is detected", epilog=_epilog("power"))
    p.add_argument("ids", nargs="*", metavar="ID", help="statement ids (default: all)")
    p.add_argument("--factor", type=_factor, default=0.5,
                   help="bounds become rhs - (1 - f)|rhs| (default %(default)s: a bound too small by half)")
    _add_seed(p)
    p.add_argument("--search", choices=[STORED, *BUDGETS, "none"], default=STORED,
                   help="falsification search for statements with a weak conclusion: 'stored' refines the stored "
                        "results of 'search --store', a budget runs that search here (default %(default)s)")
    p.add_argument("--json", metavar="PATH", help="write the power rows as a JSON list to PATH")
    p.set_defaults(func=_cmd_power)


def _cmd_llm_regression(args: argparse.Namespace) -> int:
    from verification.llm import regression as LR
    from verification.llm.records import load_run

    runs = []
    for d in args.runs:
        try:
            runs.append(load_run(d))
        except ValueError as exc:
            raise UsageError(f"argument RUN_DIR: {exc}") from None
    if args.write:
        cli.check_writable_file(args.baseline, "--baseline")
        try:
            base = LR.make_baseline(runs, notes=args.notes or "")
        except ValueError as exc:
            raise UsageError(f"argument RUN_DIR: {exc}") from None
        cli.atomic_write_text(args.baseline, json.dumps(base, indent=1, allow_nan=False) + "\n")
        print(LR.baseline_text(base))
        if base["unstable_not_compared"]:
            print(f"  unstable between the runs, not compared: {', '.join(base['unstable_not_compared'])}")
        return EXIT_OK
    try:
        base = LR.load_baseline(args.baseline)
    except ValueError as exc:
        raise UsageError(f"argument --baseline: {exc}") from None
    ok = True
    for run in runs:
        reg = LR.compare_run(run, base)
        print(f"{run.path}: " + LR.regression_text(reg))
        ok &= reg.ok
    return EXIT_OK if ok else EXIT_FAIL


def _add_llm_regression(sub) -> None:
    p = sub.add_parser("llm-regression", help="compare LLM runs' summary quantities with a baseline (or write one "
                                              "from repeated runs with --write)")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories of `python -m llm_runs run`")
    p.add_argument("--baseline", required=True, metavar="PATH", help="the baseline JSON to compare with (or write)")
    p.add_argument("--write", action="store_true",
                   help="write the baseline from the runs (>= 2 runs of one preset and seed; tolerances from their "
                        "spread) instead of comparing")
    p.add_argument("--notes", default=None, help="with --write: how the runs were made (stored in the baseline)")
    p.set_defaults(func=_cmd_llm_regression)


def _cmd_mc_calibration(args: argparse.Namespace) -> int:
    from verification.core.evidence import to_jsonable
    from verification.engine import mc_calibration as MC

    if args.json:
        cli.check_writable_file(args.json, "--json")

    def progress(i: int, n: int, row: dict) -> None:
        _note(f"[{i}/{n}] {row['statement']}: {row['label'][:60]} (upper {row['upper']:.3g}, "
              f"{row['cpu_seconds']:.1f} CPU s)")

    try:
        res = MC.run_calibration(replications=args.replications, order_statistic_replications=args.os_replications,
                                 seed=args.seed, progress=progress)
    except KeyboardInterrupt:
        _note("interrupted: nothing was kept (the calibration writes its result at the end)")
        return EXIT_INTERRUPTED
    print(MC.table(res))
    rt = res["runtime"]
    print(f"{rt['cpu_seconds']:.0f} CPU seconds ({rt['cpu_model']})")
    if args.json:
        cli.atomic_write_text(args.json, json.dumps(to_jsonable(res), indent=1, allow_nan=False) + "\n")
    fw = res["family_wise"]
    return EXIT_OK if fw["status"] == "shown <= 1e-3" and fw["replications_agree_with_exact"] else EXIT_FAIL


def _add_mc_calibration(sub) -> None:
    from verification.engine.mc_calibration import (
        DEFAULT_ORDER_STATISTIC_REPLICATIONS,
        DEFAULT_REPLICATIONS,
        DEFAULT_SEED,
    )

    p = sub.add_parser("mc-calibration", help="measure the false-failure rate of every budgeted confidence-level "
                                              "assertion at its boundary, and the family-wise sum",
                       epilog=_epilog("mc-calibration"))
    p.add_argument("--replications", type=cli.positive_int, default=DEFAULT_REPLICATIONS, metavar="R",
                   help="replications per mean-claim assertion, an integer >= 1 (default %(default)s, those of "
                        "the committed verification/data/mc_calibration.json)")
    p.add_argument("--os-replications", type=cli.positive_int, default=None, metavar="R",
                   help="replications per order-statistic test of H.17, an integer >= 1 (default "
                        f"{DEFAULT_ORDER_STATISTIC_REPLICATIONS} at the default --replications, those of the committed "
                        "file; in proportion to --replications otherwise)")
    p.add_argument("--seed", type=cli.seed, default=DEFAULT_SEED,
                   help="seed of the calibration's draws, an integer >= 0 (default %(default)s; the statements' own "
                        "samples come from their default run, seed 0)")
    p.add_argument("--json", metavar="PATH", help="write the calibration as JSON to PATH")
    p.set_defaults(func=_cmd_mc_calibration)


_SUBCOMMANDS = [_add_list, _add_run, _add_report, _add_power, _add_sweep, _add_search, _add_grid,
                _add_llm_regression, _add_mc_calibration]


def build_parser(prog: str = "python -m verification") -> argparse.ArgumentParser:
    """The parser of this command line (``prog``: the name its messages give it, e.g. ``prefalign verify``)."""
    parser = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=_epilog())
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m verification") -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser(prog)
    args = None
    try:
        args = parser.parse_args(argv)
        with cli.interrupts_recorded():  # a Ctrl-C that Python swallows in a lazy import is raised between statements
            return cli.exit_status(args.func(args), prog)
    except UsageError as exc:
        return cli.print_usage_error(exc, parser.prog + (f" {args.command}" if args is not None else ""))
    except registry.StatementImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into a reader that closed early (e.g. `| head`)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at interpreter exit
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
