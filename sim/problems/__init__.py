"""Problem families with known optima (docs/spec/problems.md#families).

* F1 :class:`PlantedQuadraticCluster` — common quadratic objectives, planted per-client Chebyshev optima.
* F2 :class:`PerturbedClients` — client-specific centre shifts (H.5 fails), exact ``δ_g``.
* :class:`ClientSamples` — sample-level F1/F2 (finite client datasets whose mean loss is the population loss).
* F3 :class:`CommonMinimizer` — new-client adaptation family with exact moments.
* F4 :class:`DoubleWell`, F5 :class:`Kink` — the 1-D examples of H.18.
* F6 :func:`random_lp_instances`, :func:`lp_instance_family` — LP-level instance generators.
* :func:`with_min_entry` — preferences with a given smallest entry (the search's tiny-``λ_min`` corner).
* F-OPT :func:`chebyshev_optimum`, :func:`grid_minimize_1d`.
"""

from sim.problems._quadratic import with_min_entry
from sim.problems.adaptation import CommonMinimizer
from sim.problems.fopt import ChebyshevOptimum, GridMinima, chebyshev_optimum, grid_minimize_1d
from sim.problems.generic import LP_FAMILIES, LPInstances, lp_instance_family, random_lp_instances
from sim.problems.onedim import DoubleWell, Kink
from sim.problems.quadratic import ClientSamples, PerturbedClients, PlantedQuadraticCluster, planted_mixing

__all__ = [
    "PlantedQuadraticCluster",
    "PerturbedClients",
    "ClientSamples",
    "planted_mixing",
    "with_min_entry",
    "CommonMinimizer",
    "DoubleWell",
    "Kink",
    "LP_FAMILIES",
    "LPInstances",
    "random_lp_instances",
    "lp_instance_family",
    "ChebyshevOptimum",
    "chebyshev_optimum",
    "GridMinima",
    "grid_minimize_1d",
]
