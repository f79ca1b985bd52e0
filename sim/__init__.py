"""prefalign-verify numerical kernels (float64 numpy/scipy; no I/O, no plotting, no global state).

Modules: :mod:`sim.preference` (β, A, ψ, ray points), :mod:`sim.direction` (the EPO direction LP),
:mod:`sim.hull` (near-active set, minimum-norm hull element), :mod:`sim.cluster` (aggregation, dispersion,
mixed-cluster blocks, Stage-1/Stage-2 clustering), :mod:`sim.constants` (estimators of the constants),
:mod:`sim.problems` (problem families F1–F6 and F-OPT of docs/spec/problems.md#families), :mod:`sim.source`
(the kernel boundary of Algorithm 1: client sources supplying losses, Gram matrices and ``d = Gμ``),
:mod:`sim.algorithm` (Algorithm 1: clustering, Phase 1, Phase 2, new-client Pipelines 1 and 2, baselines,
records) and the command line :mod:`sim.simulate`.
"""

from sim.interrupts import quiet_if_started_as

# the command `python -m sim.simulate`: a Ctrl-C from here until it handles it is one line and exit 130
quiet_if_started_as("sim.simulate", "python -m sim.simulate")

#: The version of prefalign-verify: the one place it is written (``pyproject.toml`` reads it from here).
__version__ = "0.1.0"
