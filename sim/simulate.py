r"""Command line: Algorithm 1 end to end on a planted F1 cluster problem with a sample-level version.

.. code-block:: text

    python -m sim.simulate --preset smoke|paper --out DIR [--seed 0] [--clients N] [--quiet]

Builds a planted F1 problem (common quadratic objectives, docs/spec/problems.md#families) whose clients come
from ``n_groups`` planted groups (each group: mixing weights around its own ``u_0``, spread ``s_u``), draws a
finite dataset per client (:class:`~sim.problems.ClientSamples`; held-out new clients get a large pool from
which fresh batches are drawn), and runs :func:`sim.algorithm.run_algorithm`: clustering at ``w_ref``, Phase
1, Phase 2, the FedAvg baseline, and for every new client Pipeline 1 (from ``w_I`` and from ``w_II``, lagged
RMSprop, and AdamW from ``w_II``), Pipeline 2 and the local-only baseline. Writes

* ``DIR/trajectory.csv`` — every record row (:data:`sim.algorithm.RECORD_COLUMNS`);
* ``DIR/summary.json`` — final gaps of Pipeline 1 vs Pipeline 2 vs the baselines, per-cluster gaps, LP status
  counts, the realised preference spread ``delta_lambda`` of the new clients (:func:`preference_spread`), the
  parameters, the seed and the run time.

``--clients N`` sets the number of training clients (``N`` a multiple of the preset's number of planted groups,
``N / n_groups`` per group; default: the preset's); every round of Phase 1, Phase 2 and FedAvg is one batched LP
call over a cluster's clients, so its cost grows linearly in ``N`` (``make bench`` measures the slope).

Progress lines go to stderr; a one-screen summary goes to stdout. The library modules never print. A bad
argument (a seed that is not an integer >= 0, an ``--out`` that cannot be created or written) is reported on one
line naming it, with exit status 2, before any work (:mod:`sim.cli`); both files are written atomically.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sim import cli
from sim.algorithm import (
    AdaptConfig,
    AlgorithmConfig,
    ClusterConfig,
    Phase1Config,
    Phase2Config,
    Pipeline2Config,
    ProblemSpec,
    build_problem,
    run_algorithm,
)

__all__ = ["ProblemSpec", "Preset", "PRESETS", "build_problem", "preset_variant", "preference_spread", "simulate",
           "write_run", "build_parser", "main"]


@dataclass(frozen=True)
class Preset:
    problem: ProblemSpec
    config: AlgorithmConfig = field(default_factory=AlgorithmConfig)


_ADAPT_SMOKE = AdaptConfig(K=10, S=16, alpha_adapt=0.05, preconditioner="rmsprop_lagged", p_minus=0.5, p_plus=1.0)
_ADAPT_PAPER = AdaptConfig(K=100, S=32, alpha_adapt=0.01, preconditioner="rmsprop_lagged", p_minus=0.5, p_plus=1.0)

PRESETS: dict[str, Preset] = {
    "smoke": Preset(
        ProblemSpec(),
        AlgorithmConfig(
            cluster=ClusterConfig(threshold=0.25),
            phase1=Phase1Config(rounds=100, tau=2, eta_local=0.05, alpha_server=1.0),
            phase2=Phase2Config(rounds=50, S=8, K=5, eta_meta_inner=0.02, alpha_server=1.0),
            adapt=_ADAPT_SMOKE,
            adamw=replace(_ADAPT_SMOKE, preconditioner="adamw", alpha_adapt=0.02, weight_decay=0.01),
            pipeline2=Pipeline2Config(max_steps=2000),
        ),
    ),
    "paper": Preset(
        ProblemSpec(m=4, n_w=10, n_groups=3, n_train=8, n_new=4, spread=0.05, train_samples=1000,
                    new_samples=20000),
        AlgorithmConfig(
            cluster=ClusterConfig(threshold=0.25),
            phase1=Phase1Config(rounds=500, tau=5, eta_local=0.02, alpha_server=1.0),
            phase2=Phase2Config(rounds=300, S=16, K=5, eta_meta_inner=0.01, alpha_server=1.0),
            adapt=_ADAPT_PAPER,
            adamw=replace(_ADAPT_PAPER, preconditioner="adamw", alpha_adapt=0.005, weight_decay=0.01),
            pipeline2=Pipeline2Config(max_steps=5000),
        ),
    ),
}


def preset_variant(preset: Preset, *, K: int | None = None, S: int | None = None,
                   spread: float | None = None) -> Preset:
    """``preset`` with the new clients' budget ``K`` steps of ``S`` samples (Pipeline 1, and its AdamW run) and the
    planted preference spread ``spread`` (the mixing spread ``s_u`` of :func:`build_problem`) replaced where given."""
    budget: dict[str, int] = {k: v for k, v in (("K", K), ("S", S)) if v is not None}
    adapt = replace(preset.config.adapt, **budget)  # type: ignore[arg-type]  # K and S are the int fields
    adamw = preset.config.adamw
    if adamw is not None:
        adamw = replace(adamw, K=adapt.K, S=adapt.S)
    problem = preset.problem if spread is None else replace(preset.problem, spread=float(spread))
    return Preset(problem, replace(preset.config, adapt=adapt, adamw=adamw))


def preference_spread(prefs: np.ndarray, res) -> float:
    """The preference spread ``δ_λ`` of the new clients of run ``res`` (docs/spec/notation.md#notation,
    Preference spread): the largest ``‖λ_new − λ_i‖₂`` over the new clients and the training clients ``i`` of
    the cluster each is assigned
    to (NaN without new clients)."""
    if res.new_clients.size == 0:
        return float("nan")
    out = 0.0
    for c, i in enumerate(res.new_clients):
        members = res.train_clients[res.clustering.clusters[int(res.assignment[c])]]
        out = max(out, float(np.linalg.norm(prefs[members] - prefs[i], axis=1).max()))
    return out


def simulate(preset: Preset, seed: int, *, progress=None):
    """Algorithm 1 on the planted problem of ``preset`` with ``numpy.random.default_rng(seed)``: ``(the
    AlgorithmResult, the summary of summary.json)``; the summary adds ``delta_lambda`` (:func:`preference_spread`),
    the problem, the planted groups and the parameters (the caller adds the preset's name, the seed and the
    time)."""
    rng = np.random.default_rng(seed)
    src, w_ref, train, new, groups = build_problem(preset.problem, rng)
    res = run_algorithm(src, preset.config, rng, w_ref=w_ref, train_clients=train, new_clients=new,
                        progress=progress)
    summary = dict(res.summary)
    summary.update(delta_lambda=preference_spread(src.prefs, res), problem=preset.problem.__dict__,
                   planted_groups=[int(g) for g in groups], params=preset.config.to_dict())
    return res, summary


def write_run(out: Path, res, summary: dict) -> None:
    """Write the run directory ``out`` (created if missing): ``trajectory.csv`` (the records of ``res``) and
    ``summary.json`` (``summary``), each atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cli.atomic_write_text(out / "trajectory.csv", res.records.to_csv(index=False))
    cli.atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))


class _Progress:
    """Throttled progress lines on stderr (at most one per stage every ``every`` seconds, plus stage ends)."""

    def __init__(self, quiet: bool, every: float = 2.0):
        self.quiet, self.every = quiet, every
        self.last: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.quiet:
            return
        now = time.perf_counter()
        first = stage not in self.last
        if first or done >= total or now - self.last[stage] >= self.every:
            self.last[stage] = now
            pct = 100.0 * done / total if total else 100.0
            print(f"[{now - self.t0:7.1f}s] {stage:<28s} {done:>5d}/{total:<5d} ({pct:5.1f}%)", file=sys.stderr,
                  flush=True)


def _screen(summary: dict, out: Path, seconds: float) -> str:
    lines = [f"Algorithm 1 on planted F1 ({summary['n_train_clients']} training clients, "
             f"{summary['n_clusters']} cluster(s), {summary['n_new_clients']} new clients) in {seconds:.1f}s"]
    for c in summary["clusters"]:
        lines.append(f"  cluster {c['cluster']} clients {c['clients']}: mean r_i  w_ref {np.mean(c['gap_w_ref']):.4g}"
                     f"  w_I {np.mean(c['gap_w_I']):.4g}  w_II {np.mean(c['gap_w_II']):.4g}"
                     f"  FedAvg {np.mean(c['gap_fedavg']):.4g}")
    if summary.get("new_clients"):
        lines.append(f"  new clients (K·S = {summary['adaptation_samples_per_client']} samples each), "
                     "mean gap psi_new - psi*_new:")
        for k, v in summary["mean_start_gap"].items():
            lines.append(f"    start at {k:<24s} {v:.4g}")
        for k, v in summary["mean_final_gap"].items():
            lines.append(f"    after {k:<27s} {v:.4g}")
    lines.append(f"  LP step statuses: {summary['lp_step_status_counts']}")
    lines.append(f"  wrote {out / 'trajectory.csv'} and {out / 'summary.json'}")
    return "\n".join(lines)


def build_parser(prog: str = "python -m sim.simulate") -> cli.ArgumentParser:
    """The parser of this command line (``prog``: the name its messages give it, e.g. ``prefalign simulate``)."""
    ap = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=cli.exit_status_help())
    ap.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    ap.add_argument("--out", required=True, type=Path, help="output directory (created if missing)")
    ap.add_argument("--seed", type=cli.seed, default=0, help="RNG seed, an integer >= 0 (default %(default)s)")
    ap.add_argument("--clients", type=cli.positive_int, default=None, metavar="N",
                    help="training clients in total, a multiple of the preset's planted groups (default: the "
                         "preset's)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    return ap


def _with_clients(preset: Preset, clients: int | None) -> Preset:
    """``preset`` with ``clients`` training clients in total (``clients / n_groups`` per planted group)."""
    if clients is None:
        return preset
    groups = preset.problem.n_groups
    if clients % groups:
        raise cli.UsageError(f"argument --clients: must be a multiple of the preset's {groups} planted groups; "
                             f"got {clients}")
    return replace(preset, problem=replace(preset.problem, n_train=clients // groups))


def main(argv: list[str] | None = None, prog: str = "python -m sim.simulate") -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``; ``prog``: the name its messages give it); returns
    the exit status: 0, 2 on a usage error (found before any work), 130 when interrupted (nothing is written)."""
    with cli.interrupts_recorded():
        try:
            return cli.exit_status(_main(argv, prog), prog)
        except KeyboardInterrupt:  # while the parser is built or the arguments checked
            print(f"{prog}: interrupted", file=sys.stderr, flush=True)
            return cli.EXIT_INTERRUPTED


def _main(argv: list[str] | None, prog: str) -> int:
    ap = build_parser(prog)
    try:
        args = ap.parse_args(argv)
        preset = _with_clients(PRESETS[args.preset], args.clients)
        cli.check_writable_dir(args.out, "--out")
    except cli.UsageError as exc:
        return cli.print_usage_error(exc, ap.prog)
    t0 = time.perf_counter()
    spec = preset.problem
    if not args.quiet:
        print(f"preset {args.preset}, seed {args.seed}: {spec.n_groups * spec.n_train} training and "
              f"{spec.n_groups * spec.n_new} new clients, m={spec.m}, n_w={spec.n_w}", file=sys.stderr, flush=True)
    try:
        res, summary = simulate(preset, args.seed, progress=_Progress(args.quiet))
    except KeyboardInterrupt:
        print(f"interrupted: nothing was written to {args.out}", file=sys.stderr, flush=True)
        return cli.EXIT_INTERRUPTED
    seconds = time.perf_counter() - t0
    summary.update(preset=args.preset, seed=args.seed, seconds=seconds)
    write_run(args.out, res, summary)
    print(_screen(summary, args.out, seconds))
    return cli.EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
