"""Measure the report on Dask: wall time, CPU time and efficiency on W workers, and the predicted wall time on more.

    python tools/bench_report.py [--scale default|paper] [--workers 1 2] [--out DIR] [--json PATH] [--keep-runs] [ID ...]

For each W of ``--workers`` it runs ``python -m verification report [ID ...] --scale S --workers W --no-llm
--no-studies --out DIR/w<W>`` as a child process and records its wall time and CPU time (user + sys of the whole
process tree: the report process, its cluster's nannies and workers, all waited for), and the efficiency
``CPU / (W · wall)``. From the cells' recorded costs (``cost.cpu_seconds`` of every cell of the last run measured,
:mod:`verification.report.cells`) it computes the critical path and the wall time predicted on 8, 32 and 128
workers (:func:`verification.report.cells.predicted_wall`), the largest cell's share of the total, and whether the
runs' ``results.json`` agree field by field apart from timings (:func:`verification.report.cells.results_differences`).
Each run also records when it started and the load average before and after it; ``--keep-runs`` measures the W
given again and keeps the file's runs of the other W (their folders under ``--out`` are compared too).
The JSON (default ``reports/report_scaling_<scale>.json``) is what the Performance page shows
(``tools/docs_hooks.py``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PREDICT = (8, 32, 128)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_once(ids: list[str], scale: str, workers: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "verification", "report", *ids, "--scale", scale, "--workers", str(workers),
           "--no-llm", "--no-studies", "--out", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0, started = os.getloadavg()[0], datetime.datetime.now().isoformat(timespec="seconds")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"workers": workers, "exit": proc.returncode, "wall_seconds": wall, "cpu_seconds": cpu,
            "efficiency": cpu / (workers * wall), "command": " ".join(cmd[1:]), "started": started,
            "load_before": load0, "load_after": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    from verification.core import registry
    from verification.report import cells as rc
    from verification.report.dashboard import SEARCH_BUDGET

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", metavar="ID")
    ap.add_argument("--scale", choices=registry.SCALES, default="default")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-report")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep-runs", action="store_true",
                    help="keep the runs of the existing --json file for the W not measured now (the same scale and "
                         "CPU; their folders under --out must still hold their results.json): to measure one W again")
    args = ap.parse_args(argv)
    stmts = registry.resolve(args.ids)
    dest = args.json or ROOT / "reports" / f"report_scaling_{args.scale}.json"
    kept: list[dict] = []
    if args.keep_runs and dest.is_file():
        old = json.loads(dest.read_text(encoding="utf-8"))
        if old.get("scale") != args.scale or old.get("cpu") != cpu_name():
            ap.error(f"--keep-runs: {dest} was measured at scale {old.get('scale')!r} on {old.get('cpu')!r}")
        kept = [r for r in old["runs"] if r["workers"] not in args.workers]
        missing = [r["workers"] for r in kept if not (args.out / f"w{r['workers']}" / "results.json").is_file()]
        if missing:
            ap.error(f"--keep-runs: no results.json of W={missing} under {args.out}")
    runs = kept + [run_once(args.ids, args.scale, w, args.out / f"w{w}") for w in args.workers]
    workers = [r["workers"] for r in runs]
    last = args.out / f"w{args.workers[-1]}"
    cells = rc.report_cells(last, stmts, seed=registry.DEFAULT_SEED, scale=args.scale,
                            budget=SEARCH_BUDGET[args.scale])
    costs = rc.cell_costs(cells)
    total = sum(c["cpu_seconds"] for c in costs)
    path_len, path = rc.critical_path(costs)
    largest = max(costs, key=lambda c: c["cpu_seconds"])
    results = [json.loads((args.out / f"w{w}" / "results.json").read_text(encoding="utf-8")) for w in workers]
    diffs = [d for r in results[1:] for d in rc.results_differences(results[0], r)]
    rec = {
        "scale": args.scale, "statements": len(stmts), "date": datetime.date.today().isoformat(), "cpu": cpu_name(),
        "cores": os.cpu_count(), "runs": runs, "cells": len(costs), "cells_cpu_seconds": total,
        "critical_path": {"cpu_seconds": path_len, "cells": path},
        "largest_cell": {"key": largest["key"], "cpu_seconds": largest["cpu_seconds"],
                         "share": largest["cpu_seconds"] / total if total else 0.0},
        "predicted_wall_seconds": {str(w): rc.predicted_wall(costs, w) for w in PREDICT},
        "results_equal": not diffs, "differences": diffs[:20],
        "by_cell": sorted(costs, key=lambda c: -c["cpu_seconds"])[:10],
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    for r in runs:
        print(f"W={r['workers']}: wall {r['wall_seconds']:.1f} s, CPU {r['cpu_seconds']:.1f} s, "
              f"efficiency {r['efficiency']:.2f} (exit {r['exit']})")
    print(f"cells {len(costs)}, {total:.1f} CPU-s; critical path {path_len:.1f} s; largest {largest['key']} "
          f"{100 * rec['largest_cell']['share']:.1f} %; predicted wall "
          + ", ".join(f"W={w}: {v:.1f} s" for w, v in rec["predicted_wall_seconds"].items())
          + f"; results equal: {rec['results_equal']}; wrote {dest}")
    return 0 if not diffs and all(r["exit"] in (0, 1) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
