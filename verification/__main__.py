"""Command line of the verification suite.

    python -m verification list
    python -m verification run [ID ...] [--json PATH [--resume]] [--seed N] [--baseline PATH]
    python -m verification report [ID ...] [--out DIR] [--scale default|paper] [--seed N] [--resume]

``run`` prints one progress line per statement on stderr as it finishes, then a table on stdout. With
``--json PATH`` it appends each finished statement's result object (``Evidence.to_dict``) to the results log
``PATH.jsonl`` as it goes (:mod:`verification.resultlog`) and writes the JSON list of them to PATH at the end
(atomically); ``--resume`` reads that log, skips the statements it holds and runs the rest.

``report`` runs the checks and the studies and writes the dashboard and figures (:mod:`verification.report`),
logging each statement to ``DIR/results.jsonl`` as it finishes; ``--resume`` finishes an interrupted report.

Exit status: 0 iff no verdict is "violated" or "vacuous", no negative control is "missed", no check raised and
(with ``--baseline``) no bound regressed against the earlier results (:mod:`verification.regression`); 1
otherwise; 2 on a usage error, found before any statement runs and printed as one line naming the argument (a
bad seed or tolerance, unknown ids, an unreadable or malformed baseline, an output path that cannot be written, a
results log that cannot be resumed); 130 when interrupted (the finished statements stay in the log).

New subcommands (a later ``report``) are added by writing ``_add_<name>(subparsers)`` that sets
``func=_cmd_<name>`` and appending it to ``_SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from sim import cli
from sim.cli import UsageError

from . import registry, regression, resultlog
from .evidence import to_jsonable

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, cli.EXIT_USAGE, 130


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
    try:
        return to_jsonable(registry.run_statement(stmt, seed=seed, jitter=jitter, jitter_seed=jitter_seed).to_dict())
    except Exception as exc:  # noqa: BLE001 - reported, counted as a failure, the run continues
        traceback.print_exc(file=sys.stderr)
        return to_jsonable(resultlog.error_row(stmt, exc))


def _cmd_run(args: argparse.Namespace) -> int:
    # every usage error is found here, before the first statement runs
    if args.resume and not args.json:
        raise UsageError("argument --resume: needs --json PATH (the results log to resume is PATH.jsonl)")
    stmts = _resolve(args.ids)
    try:
        baseline = regression.load_results(args.baseline) if args.baseline else None
    except ValueError as exc:
        raise UsageError(f"argument --baseline: {exc}") from None
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
            else:
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
    p = sub.add_parser("list", help="list the statements: id, number, name")
    p.set_defaults(func=_cmd_list)


def _add_seed(p) -> None:
    p.add_argument("--seed", type=cli.seed, default=registry.DEFAULT_SEED,
                   help="RNG seed, an integer >= 0 (default %(default)s)")


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run checks and negative controls")
    p.add_argument("ids", nargs="*", metavar="ID", help="statement ids (default: all)")
    p.add_argument("--json", metavar="PATH",
                   help="write the results as a JSON list to PATH at the end, and each statement's result to the "
                        "results log PATH.jsonl as it finishes")
    _add_seed(p)
    p.add_argument("--baseline", metavar="PATH",
                   help="compare with an earlier results.json; exit 1 if a verdict regresses from holds, a negative "
                        "control stops being detected, or a tightness moves past the tolerance")
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
    from .report import LOG_NAME, build_report

    stmts = _resolve(args.ids)
    out = cli.check_writable_dir(args.out, "--out")
    try:
        res = build_report(out, ids=[s.id for s in stmts], scale=args.scale, seed=args.seed,
                           studies=not args.no_studies, resume=args.resume)
    except resultlog.ResultLogError as exc:
        raise UsageError(f"argument --resume: {exc}") from None
    except KeyboardInterrupt:
        _note(f"interrupted: the finished statements are in {out / LOG_NAME}; finish with the same command and "
              "--resume")
        return EXIT_INTERRUPTED
    print(res.summary())
    return EXIT_FAIL if res.failed else EXIT_OK


def _add_report(sub) -> None:
    from .report import SCALES

    p = sub.add_parser("report", help="run the checks and the studies; write the dashboard and figures")
    p.add_argument("ids", nargs="*", metavar="ID", help="statement ids (default: all)")
    p.add_argument("--out", default="reports", metavar="DIR", help="output folder (default %(default)s)")
    p.add_argument("--scale", choices=SCALES, default="default",
                   help="default: every check in seconds; paper: the larger presets where a check has one")
    _add_seed(p)
    p.add_argument("--no-studies", action="store_true", help="skip the reported studies")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted report: keep the statements already in DIR/results.jsonl (and their "
                        "files under DIR) and run the rest (needs the same ids, scale and seed)")
    p.set_defaults(func=_cmd_report)


_SUBCOMMANDS = [_add_list, _add_run, _add_report]


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m verification", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        return args.func(args)
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
