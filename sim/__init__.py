"""prefalign-verify numerical kernels (float64 numpy/scipy; no I/O, no plotting, no global state).

Modules: :mod:`sim.preference` (β, A, ψ, ray points), :mod:`sim.direction` (the EPO direction LP),
:mod:`sim.hull` (near-active set, minimum-norm hull element), :mod:`sim.problems` (problem families
F1–F6 and F-OPT of THEOREMS.md §3.0).
"""
