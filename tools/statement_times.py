"""CPU seconds of every statement (check + negative control) at default scale, in registry order, one process.

    python tools/statement_times.py OUT.json [--seed N]

Run from a checkout's root (its ``sim`` and ``verification`` are imported from the working directory), so two
checkouts are compared with the same interpreter. CPU time (``time.process_time``, every thread of the process)
rather than wall time: on a shared machine the wall time of a statement moves with the load, its CPU time much
less. A trajectory memoised for several statements counts in the first statement that builds it, in both
checkouts alike. Used for the before/after table of the suite's speed in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.getcwd())
    import importlib

    registry = importlib.import_module("verification.core.registry")
    cpu: dict[str, float] = {}
    for stmt in registry.all_statements():
        t0 = time.process_time()
        registry.run_statement(stmt, seed=args.seed)
        cpu[stmt.id] = time.process_time() - t0
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump({"cwd": os.getcwd(), "seed": args.seed, "cpu_seconds": cpu}, fh, indent=1)
    print(f"{len(cpu)} statements, {sum(cpu.values()):.1f} CPU s in all -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
