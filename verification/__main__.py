"""Command line of the verification suite.

    python -m verification list
    python -m verification run [ID ...] [--json PATH] [--seed N] [--baseline PATH]
    python -m verification report [--out DIR] [--scale default|paper] [--seed N]
    python -m verification power [ID ...] [--factor 0.5] [--seed N] [--search default|paper|none] [--json PATH]

``run`` prints one progress line per statement on stderr as it finishes, then a table on stdout, and writes
the JSON list of result objects (``Evidence.to_dict``) to PATH. Exit status: 0 iff no verdict is
"violated" or "vacuous", no negative control is "missed", no check raised and (with ``--baseline``) no bound
regressed against the earlier results (:mod:`verification.regression`); 1 otherwise; 2 on usage errors (e.g.
unknown ids, an unreadable baseline).

``report`` runs every check and the studies and writes the dashboard and figures (:mod:`verification.report`).

``power`` re-runs the checks with every numeric bound scaled to ``rhs − (1 − f)|rhs|`` and reports per conclusion
whether that is detected, with the falsification search's best ratio and the stated reason for a weak one
(:mod:`verification.power`); it exits 1 when a weak conclusion has no reason or a prediction disagrees.

New subcommands (a later ``report``) are added by writing ``_add_<name>(subparsers)`` that sets
``func=_cmd_<name>`` and appending it to ``_SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

from . import registry, regression
from .evidence import to_jsonable

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _fmt_tightness(t) -> str:
    return "-" if t is None else f"{t:.4g}"


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


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        stmts = registry.resolve(args.ids)
        baseline = regression.load_results(args.baseline) if args.baseline else None
    except (registry.UnknownStatementError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    rows: list[dict] = []
    failed = False
    n = len(stmts)
    for k, s in enumerate(stmts, 1):
        try:
            ev = registry.run_statement(s, seed=args.seed)
        except Exception as exc:  # noqa: BLE001 - reported, counted as a failure, the run continues
            traceback.print_exc(file=sys.stderr)
            row = {
                "id": s.id, "name": s.name, "verdict": "error", "tightness": None, "instances": 0,
                "excluded": 0, "negative_control": "none", "counterexamples": 0, "seconds": 0.0,
                "details": {"error": repr(exc)},
            }
            failed = True
        else:
            row = ev.to_dict()
            failed |= ev.failed
        rows.append(row)
        print(
            f"[{k}/{n}] {s.id}: {row['verdict']} (negative control: {row['negative_control']}, "
            f"{row['seconds']:.2f} s)",
            file=sys.stderr,
            flush=True,
        )
    print(_table(rows))
    if args.json:
        path = Path(args.json)
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(to_jsonable(rows), indent=2, allow_nan=False) + "\n")
    if baseline is not None:
        reg = regression.compare(to_jsonable(rows), baseline, rtol=args.tightness_rtol)
        print(reg.summary())
        failed |= not reg.ok
    return EXIT_FAIL if failed else EXIT_OK


def _add_list(sub) -> None:
    p = sub.add_parser("list", help="list the statements: id, number, name")
    p.set_defaults(func=_cmd_list)


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run checks and negative controls")
    p.add_argument("ids", nargs="*", metavar="ID", help="statement ids (default: all)")
    p.add_argument("--json", metavar="PATH", help="write the results as a JSON list to PATH")
    p.add_argument("--seed", type=int, default=registry.DEFAULT_SEED, help="RNG seed (default %(default)s)")
    p.add_argument("--baseline", metavar="PATH",
                   help="compare with an earlier results.json; exit 1 if a verdict regresses from holds, a negative "
                        "control stops being detected, or a tightness moves past the tolerance")
    p.add_argument("--tightness-rtol", type=float, default=regression.TIGHTNESS_RTOL,
                   help="relative tolerance on tightness changes against the baseline (default %(default)s)")
    p.set_defaults(func=_cmd_run)


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import build_report

    try:
        res = build_report(args.out, scale=args.scale, seed=args.seed, studies=not args.no_studies)
    except registry.UnknownStatementError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(res.summary())
    return EXIT_FAIL if res.failed else EXIT_OK


def _add_report(sub) -> None:
    from .report import SCALES

    p = sub.add_parser("report", help="run every check and the studies; write the dashboard and figures")
    p.add_argument("--out", default="reports", metavar="DIR", help="output folder (default %(default)s)")
    p.add_argument("--scale", choices=SCALES, default="default",
                   help="default: every check in seconds; paper: the larger presets where a check has one")
    p.add_argument("--seed", type=int, default=registry.DEFAULT_SEED, help="RNG seed (default %(default)s)")
    p.add_argument("--no-studies", action="store_true", help="skip the reported studies")
    p.set_defaults(func=_cmd_report)


def _cmd_power(args: argparse.Namespace) -> int:
    from .power import power_report

    try:
        rep = power_report(args.ids, factor=args.factor, seed=args.seed, search=args.search)
    except (registry.UnknownStatementError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(rep.table())
    print(rep.summary())
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rep.to_json(), indent=2, allow_nan=False) + "\n")
    return EXIT_OK if rep.ok else EXIT_FAIL


def _factor(text: str) -> float:
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--factor must be a number in (0, 1]; got {text!r}") from None
    if not 0.0 < f <= 1.0:
        raise argparse.ArgumentTypeError(f"--factor must lie in (0, 1]; got {text!r}")
    return f


def _add_power(sub) -> None:
    from .search import BUDGETS

    p = sub.add_parser("power", help="re-run the checks with every numeric bound weakened; report per conclusion "
                                     "whether that is detected")
    p.add_argument("ids", nargs="*", metavar="ID", help="statement ids (default: all)")
    p.add_argument("--factor", type=_factor, default=0.5,
                   help="bounds become rhs - (1 - f)|rhs| (default %(default)s: a bound too small by half)")
    p.add_argument("--seed", type=int, default=registry.DEFAULT_SEED, help="RNG seed (default %(default)s)")
    p.add_argument("--search", choices=[*BUDGETS, "none"], default="default",
                   help="falsification-search budget for statements with a weak conclusion (default %(default)s)")
    p.add_argument("--json", metavar="PATH", help="write the power rows as a JSON list to PATH")
    p.set_defaults(func=_cmd_power)


_SUBCOMMANDS = [_add_list, _add_run, _add_report, _add_power]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verification", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except registry.StatementImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into a reader that closed early (e.g. `| head`)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at interpreter exit
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
