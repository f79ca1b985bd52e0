r"""Falsification search: try to break every numeric conclusion on its problem family.

A check that passes because its instances never come near the bound proves little, and the one thing a
verification suite can find that a proof reader cannot — a false statement — needs a search that tries to break
it. Every statement with a numeric bound declares a :class:`SearchSpace` (module attribute ``SEARCH``): a box of
its family's parameters (dimensions, spreads, conditioning, step sizes, preference spread, ``S``, ``K``, ``τ``, …)
and a map from a point of the box to the check's ``Config`` (small instance counts, so one evaluation takes a
fraction of a second). :func:`falsify` evaluates the check itself — the same code, the same hypothesis monitors
— at points of the box and maximises, per conclusion, the detection factor ``1 − (rhs − lhs)/|rhs|``
(``= lhs/rhs`` for ``rhs > 0``; the Monte Carlo crossing factor for Monte Carlo rows) over the instances where
every hypothesis held:

* ``default`` budget: a scrambled Halton design of the box, then a (1+1) evolution strategy from the best point of
  each conclusion still below :data:`TARGET` (step halved on failure);
* ``paper`` budget: the design, and :func:`scipy.optimize.differential_evolution` on the box (the objective is the
  mean over the conclusions of ``log min(ratio, 1)``, so every conclusion pulls) run as islands of
  :data:`DE_ISLAND` members of one Sobol population, each evolved on its own; then the same refinement with more
  steps and more conclusions.

A search is made of independent parts (:func:`search_parts`: the design, the DE's islands, then one refinement
chain per conclusion refined, each from the best point the design and the islands found), every part with its own
random stream that depends on the seed and the part's index only, merged in part order (:func:`search_result`);
so the report at the paper scale runs each part as a cell of the Dask engine and gets the result :func:`falsify`
gets in one process.

Every evaluation uses the same seed (common random numbers: the objective is a deterministic function of the
point), so the search is reproducible. The best instance of every conclusion is kept with the data to reproduce
it (the point, the ``Config``, the seed and the instance record), and written by the report to
``worst/<id>.json``. A ratio ``> 1`` on an instance where every hypothesis held is a counterexample: the
evaluation's own verdict is ``violated`` and :func:`apply` makes the statement's verdict ``violated`` (or, where the
statement is a FINDING whose repaired statement holds there, leaves it a finding).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verification.core.catalogue import get_statement
from verification.core.evidence import (
    MAX_STORED_COUNTEREXAMPLES,
    Evidence,
    bound_factor,
    kept_counterexamples,
    to_jsonable,
)

__all__ = ["TARGET", "Param", "SearchSpace", "Budget", "BUDGETS", "STORED", "SearchResult", "falsify", "apply",
           "design", "search_parts", "search_part", "search_result", "de_population", "weakest", "DE_ISLAND", "PARTS",
           "store_results", "load_stored", "refine_stored", "search_statement",
           "DEFAULT_EVALUATIONS", "STORE", "REACH", "F1_SHAPE", "PLANTED_LAMBDA", "DIGEST_PACKAGES", "check_code"]

#: The tightness every numeric conclusion should reach on its family (a halved bound is then detected).
TARGET = 0.5
_FLOOR = 1e-6  # ratios below this (or missing) count as this in the scalar objective


@dataclass(frozen=True)
class Param:
    """One coordinate of the box: ``linear`` or ``log`` on ``[low, high]``, ``int`` (rounded), or ``choice``
    (one of ``choices``). ``default``: the value of a point that does not name this parameter (a ``TIGHT_POINTS``
    entry written before the parameter joined the box; ``None``: such a point is refused)."""

    name: str
    low: float = 0.0
    high: float = 1.0
    scale: str = "linear"
    choices: tuple = ()
    default: Any = None

    def __post_init__(self):
        if self.scale not in ("linear", "log", "int", "choice"):
            raise ValueError(f"Param {self.name!r}: scale must be linear, log, int or choice; got {self.scale!r}")
        if self.scale == "choice":
            if not self.choices:
                raise ValueError(f"Param {self.name!r}: a choice parameter needs choices")
        elif not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"Param {self.name!r}: need finite low <= high; got [{self.low}, {self.high}]")
        if self.scale == "log" and self.low <= 0:
            raise ValueError(f"Param {self.name!r}: a log scale needs low > 0; got {self.low}")

    def decode(self, u: float):
        u = float(min(max(u, 0.0), 1.0))
        if self.scale == "choice":
            return self.choices[min(int(u * len(self.choices)), len(self.choices) - 1)]
        if self.scale == "log":
            return float(math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low))))
        x = self.low + u * (self.high - self.low)
        return int(round(x)) if self.scale == "int" else float(x)

    def describe(self) -> str:
        if self.scale == "choice":
            return f"{self.name} in {list(self.choices)}"
        return f"{self.name} in [{self.low:g}, {self.high:g}] ({self.scale})"


#: What a search box should reach where the statement's hypotheses allow it (issue of the search's budget): each
#: box reaches each of these or says in ``SearchSpace.excluded`` why not. :meth:`SearchSpace.reach` decides the
#: first three from the box: a parameter ``m`` up to 10 or more, ``kappa_Q`` up to 1e6 or more, ``lambda_min``
#: down to 1e-12 or less; near-collinear Gram matrices from ``kappa_Q`` down to 1 with ``s_c`` down to 1e-3 or
#: less (identical Hessians and nearly common centres: the gradients nearly parallel), or a ``collinearity``
#: parameter.
M_10, CONDITIONING, LAMBDA_MIN, COLLINEAR = ("m >= 10", "conditioning >= 1e6", "lambda_min <= 1e-12",
                                            "near-collinear Gram")
REACH = (M_10, CONDITIONING, LAMBDA_MIN, COLLINEAR)


@dataclass(frozen=True)
class SearchSpace:
    """A family's parameter box and the map to the check's ``Config``.

    ``config(params) -> Config`` builds the configuration evaluated at a point (``params``: name → value);
    ``family`` says what is searched; ``targets`` (optional) restricts the conclusions that drive the search
    (default: every numeric conclusion that is not the literal statement of a FINDING); ``scores`` (optional)
    maps an evaluation's Evidence to further named quantities to maximise and record (e.g. the smallest ratio a
    hypothesis needs, to show that it fails on the whole box)."""

    params: tuple[Param, ...]
    config: Callable[[dict[str, Any]], Any]
    family: str = ""
    targets: tuple[str, ...] = ()
    scores: Callable[[Evidence], dict[str, float]] | None = None
    #: for each of :data:`REACH` the box does not reach, why (the statement's hypotheses or family exclude it)
    excluded: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        names = [p.name for p in self.params]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"SearchSpace: parameter names must be non-empty and unique; got {names}")
        unknown = sorted(set(self.excluded) - set(REACH))
        if unknown:
            raise ValueError(f"SearchSpace: excluded keys must be among {list(REACH)}; got {unknown}")

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def reach(self) -> dict[str, str]:
        """For each of :data:`REACH`: the parameter range that reaches it, ``"excluded: <why>"``, or
        ``"NOT REACHED"`` (a box that neither reaches nor excludes it; a test refuses such a box)."""
        def hi(name, at_least):
            p = self.param(name)
            return p is not None and p.scale != "choice" and p.high >= at_least

        def lo(name, at_most):
            p = self.param(name)
            return p is not None and p.scale != "choice" and p.low <= at_most

        got = {M_10: hi("m", 10), CONDITIONING: hi("kappa_Q", 1e6), LAMBDA_MIN: lo("lambda_min", 1e-12),
               COLLINEAR: (lo("kappa_Q", 1.0) and lo("s_c", 1e-3)) or self.param("collinearity") is not None}
        names = {M_10: ("m",), CONDITIONING: ("kappa_Q",), LAMBDA_MIN: ("lambda_min",),
                 COLLINEAR: ("kappa_Q", "s_c", "collinearity")}
        out = {}
        for key in REACH:
            if got[key]:
                out[key] = "; ".join(p.describe() for p in map(self.param, names[key]) if p is not None)
            elif key in self.excluded:
                out[key] = f"excluded: {self.excluded[key]}"
            else:
                out[key] = "NOT REACHED"
        return out

    @property
    def dim(self) -> int:
        return len(self.params)

    def decode(self, u: Sequence[float]) -> dict[str, Any]:
        return {p.name: p.decode(x) for p, x in zip(self.params, u, strict=True)}

    def make_config(self, params: dict[str, Any]) -> Any:
        """The ``Config`` at the point ``params`` (name -> value): a parameter it does not name takes its
        ``default``; an unknown name, or a missing one without a default, is a ``ValueError`` naming it."""
        names = {p.name for p in self.params}
        unknown = sorted(set(params) - names)
        if unknown:
            raise ValueError(f"{self.family or 'search box'}: unknown parameter(s) {unknown}; the box has "
                             f"{sorted(names)}")
        full = dict(params)
        for p in self.params:
            if p.name not in full:
                if p.default is None:
                    raise ValueError(f"{self.family or 'search box'}: the point {params} does not give {p.name!r}, "
                                     "which has no default")
                full[p.name] = p.default
        return self.config(full)

    def describe(self) -> list[str]:
        return [p.describe() for p in self.params]


#: The F1 shape parameters of a box (``sim.problems.PlantedQuadraticCluster.make``): the conditioning ``κ_Q`` of
#: every ``Q_j`` and the centre spread ``s_c``; at ``κ_Q = 1`` and small ``s_c`` the gradients are nearly
#: collinear. Their defaults are the family's (a ``TIGHT_POINTS`` entry without them keeps the family).
F1_SHAPE = (Param("kappa_Q", 1.0, 1e6, "log", default=3.0), Param("s_c", 1e-4, 1.0, "log", default=1.0))
#: Why a planted F1/F2 box does not reach a tiny ``λ_min``.
PLANTED_LAMBDA = ("lambda is planted, lambda_j proportional to 1/l_j(w*) with l_j >= b_j >= 0.3 and l_j(w*) bounded "
                  "on the box: lambda_min cannot approach 1e-12 in this family; tiny lambda_min is searched on the "
                  "LP families (H.4, H.10)")


@dataclass(frozen=True)
class Budget:
    """``initial`` design points, ``refine`` (1+1)-ES steps for each of the ``max_refined`` weakest conclusions
    below :data:`TARGET`, and for the paper budget ``de_maxiter``/``de_popsize`` of differential evolution (0: no
    DE)."""

    name: str
    initial: int
    refine: int
    de_maxiter: int = 0
    de_popsize: int = 0
    max_refined: int = 3  # conclusions refined (the weakest first)


#: The budget name of a search that starts from the stored results (:func:`search_statement`).
STORED = "stored"

BUDGETS = {
    "default": Budget("default", initial=6, refine=3),
    "paper": Budget("paper", initial=16, refine=12, de_maxiter=8, de_popsize=6, max_refined=8),
}


@dataclass
class SearchResult:
    """Outcome of :func:`falsify`: per conclusion the best point (``best``: name → record), the counterexamples
    found (hypotheses held, ratio > 1, contract conclusions), the evaluations spent and the errors met."""

    statement: str
    budget: str
    seed: int
    space: list[str]
    family: str
    best: dict[str, dict] = field(default_factory=dict)
    counterexamples: list[dict] = field(default_factory=list)
    n_counterexamples: int = 0
    evaluations: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: where a stored search was refined (:func:`refine_stored`): the stored search's budget, evaluations, seed
    #: and date, and the refinement's evaluations; None for a search made in full here
    stored: dict[str, Any] | None = None

    def evaluations_split(self) -> tuple[int, int]:
        """The evaluations the result rests on: ``(now, stored)``, those made in this process and those of the
        stored search it refines (0 for a search made in full here)."""
        stored = int((self.stored or {}).get("evaluations", 0))
        return self.evaluations - stored, stored

    def summary(self) -> dict[str, Any]:
        now, stored = self.evaluations_split()
        out = {
            "statement": self.statement, "budget": self.budget, "seed": self.seed, "family": self.family,
            "box": self.space, "evaluations": self.evaluations, "evaluations_now": now, "evaluations_stored": stored,
            "counterexamples": self.n_counterexamples, "errors": self.errors[:5],
            "best_ratio": {k: v["best_ratio"] for k, v in self.best.items()},
        }
        if self.stored is not None:
            out["stored"] = self.stored
        return to_jsonable(out)

    def worst_file(self) -> dict[str, Any]:
        """The content of ``worst/<id>.json``: the best instance of every conclusion with the data to reproduce
        it (``run(Config(**config), numpy.random.default_rng(seed))``)."""
        return to_jsonable({**self.summary(), **kept_counterexamples(self.n_counterexamples, len(self.counterexamples)),
                            "conclusions": self.best, "search_counterexamples": self.counterexamples})


def _scores(ev: Evidence, targets: Sequence[str]) -> dict[str, tuple[float | None, dict | None, int]]:
    out = {}
    for c in ev.conclusions:
        if not c.numeric or c.role == "literal" or (targets and c.name not in targets):
            continue
        out[c.name] = (c.detect_factor, c.worst, c.counterexamples if c.role == "contract" else 0)
    return out


def weakest(best: dict[str, dict], limit: int | None = None, target: float = TARGET) -> list[str]:
    """The conclusions of ``best`` (name → best record) below ``target`` (the scores below 0), weakest first
    (those without a ratio first; ties in the order of ``best``)."""
    weak = [name for name, rec in best.items()
            if rec["best_ratio"] is None or rec["best_ratio"] < (0.0 if name.startswith("score: ") else target)]
    weak.sort(key=lambda nm: -1.0 if best[nm]["best_ratio"] is None else best[nm]["best_ratio"])
    return weak if limit is None else weak[:limit]


class _Evaluations:
    """The evaluations of one search (or one cell of it): the check at points ``u`` of the unit cube, the best
    record of every conclusion, the counterexamples met, the errors; every evaluation uses the same seed (common
    random numbers), and a point evaluated twice is taken from the cache."""

    def __init__(self, stmt, space: SearchSpace, seed: int):
        self.stmt, self.space, self.seed = stmt, space, int(seed)
        self.best: dict[str, dict] = {}
        self.counterexamples: list[dict] = []
        self.n_counterexamples = 0
        self.evaluations = 0
        self.errors: list[str] = []
        self.cache: dict[tuple, dict] = {}
        #: per conclusion, the evaluated points where its ratio exceeds TARGET (instances of the family, found
        #: by the search, at which a bound too small by half is detected)
        self.detecting: dict[str, int] = {}

    def __call__(self, u) -> dict[str, tuple]:
        u = np.clip(np.asarray(u, dtype=np.float64), 0.0, 1.0)
        params = self.space.decode(u)
        key = tuple(sorted((k, v if not isinstance(v, float) else round(v, 12)) for k, v in params.items()))
        if key in self.cache:
            return self.cache[key]
        self.evaluations += 1
        try:
            cfg = self.space.make_config(params)
            with bound_factor(1.0):
                ev = self.stmt.run(cfg, np.random.default_rng(self.seed))
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            self.errors.append(f"{params}: {exc!r}")
            self.cache[key] = {}
            return {}
        sc = _scores(ev, self.space.targets)
        if self.space.scores is not None:
            sc.update({f"score: {k}": (float(v), None, 0) for k, v in self.space.scores(ev).items()})
        for name, (ratio, worst, n_cex) in sc.items():
            if ratio is not None and ratio > TARGET and not name.startswith("score: "):
                self.detecting[name] = self.detecting.get(name, 0) + 1
            rec = self.best.get(name)
            if ratio is not None and (rec is None or rec["best_ratio"] is None or ratio > rec["best_ratio"]):
                self.best[name] = {"best_ratio": float(ratio), "point": u.tolist(), "params": params,
                                   "config": _config_record(cfg), "seed": self.seed, "instance": worst,
                                   "counterexamples": int(n_cex)}
            elif rec is None:
                self.best[name] = {"best_ratio": None, "point": u.tolist(), "params": params,
                                   "config": _config_record(cfg), "seed": self.seed, "instance": None,
                                   "counterexamples": 0}
            if n_cex:
                self.n_counterexamples += n_cex
                for c in ev.counterexamples:
                    if c.get("conclusion") == name and len(self.counterexamples) < MAX_STORED_COUNTEREXAMPLES:
                        self.counterexamples.append({"conclusion": name, "params": params,
                                                     "config": _config_record(cfg), "seed": self.seed, **c})
        self.cache[key] = sc
        return sc

    def objective(self, u) -> float:
        """The scalar the differential evolution minimises: the mean over the conclusions of ``log min(ratio, 1)``
        scaled to ``[0, 1]`` (0: every conclusion attains its bound)."""
        sc = self(u)
        if not sc:
            return 0.0  # an invalid or empty evaluation scores like the floor everywhere
        vals = [math.log(min(max(r if not k.startswith("score: ") else 0.5 + 0.5 * math.tanh(r), _FLOOR), 1.0))
                if r is not None else math.log(_FLOOR) for k, (r, _, _) in sc.items()]
        return -float(np.mean(vals)) / -math.log(_FLOOR)

    def chain(self, name: str, start, best: float | None, steps: int, rng: np.random.Generator) -> None:
        """A (1+1) evolution strategy for conclusion ``name`` from ``start`` (ratio ``best`` there): a Gaussian step
        in the unit cube, kept when it raises the ratio (the step then grows by 1.5, up to 0.5), else halved."""
        u, step = np.asarray(start, dtype=np.float64), 0.2
        for _ in range(int(steps)):
            cand = np.clip(u + step * rng.standard_normal(u.size), 0.0, 1.0)
            r = self(cand).get(name, (None,))[0]
            if r is not None and (best is None or r > best):
                u, best, step = cand, r, min(step * 1.5, 0.5)
            else:
                step *= 0.5

    def weakest(self, limit: int | None = None, target: float = TARGET) -> list[str]:
        """:func:`weakest` of these evaluations' best records."""
        return weakest(self.best, limit, target)

    def record(self) -> dict[str, Any]:
        """A JSON-ready record of these evaluations (a cell of :func:`verification.engine.search_cells.run_search`)."""
        return to_jsonable({"evaluations": self.evaluations, "best": self.best, "detecting": self.detecting,
                            "counterexamples": self.counterexamples, "n_counterexamples": self.n_counterexamples,
                            "errors": self.errors[:20]})

    def result(self, budget: str, seconds: float) -> SearchResult:
        return SearchResult(statement=self.stmt.id, budget=budget, seed=self.seed, space=self.space.describe(),
                            family=self.space.family, best=self.best, counterexamples=self.counterexamples,
                            n_counterexamples=self.n_counterexamples, evaluations=self.evaluations,
                            errors=self.errors, seconds=seconds)


def design(dim: int, n: int, seed: int, start: int = 0) -> np.ndarray:
    """Points ``start, ..., start + n − 1`` of the search's design: a scrambled Halton sequence of the unit cube
    (scramble seeded by ``seed``) whose point 0 is the centre of the box."""
    from scipy.stats import qmc

    if n <= 0:
        return np.zeros((0, dim))
    gen = qmc.Halton(dim, scramble=True, seed=seed)
    if start:
        gen.fast_forward(start)
    pts = gen.random(n)
    if start == 0:
        pts[0] = 0.5
    return pts


#: Members of each differential-evolution island of a search with a DE budget: the population (``de_popsize`` ×
#: the box's dimension, rounded up to a power of 2 by its Sobol start) is split into islands of this many, each
#: evolved on its own (:func:`search_part`), so that no single computation holds the whole DE.
DE_ISLAND = 8
#: The tags of the parts' random streams: island ``k`` of the DE draws from ``default_rng([seed, 3, k])``, the
#: refinement chain ``k`` from ``default_rng([seed, 4, k])``; the population from ``default_rng([seed, 3])``.
_DE_STREAM, _CHAIN_STREAM = 3, 4
#: The parts of a search (:func:`search_parts`): its design, the DE's islands, the refinement chains.
PARTS = ("design", "de", "chain")


def _budget(budget: str | Budget) -> Budget:
    if isinstance(budget, Budget):
        return budget
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {sorted(BUDGETS)}; got {budget!r}")
    return BUDGETS[budget]


def _de_members(dim: int, b: Budget) -> int:
    """Members of the DE's population: ``de_popsize · dim`` rounded up to a power of 2 (at least an island)."""
    return 2 ** int(math.ceil(math.log2(max(b.de_popsize * dim, DE_ISLAND)))) if b.de_maxiter else 0


def de_population(dim: int, budget: str | Budget, seed: int) -> np.ndarray:
    """The start of the search's differential evolution: ``de_popsize · dim`` points of a scrambled Sobol sequence
    of the unit cube (rounded up to a power of 2; scramble from ``default_rng([seed, 3])``); empty without DE."""
    from scipy.stats import qmc

    b = _budget(budget)
    if not b.de_maxiter:
        return np.zeros((0, dim))
    m = _de_members(dim, b).bit_length() - 1
    return qmc.Sobol(dim, scramble=True, seed=np.random.default_rng([int(seed), _DE_STREAM])).random_base2(m)


def search_parts(dim: int, budget: str | Budget) -> list[tuple[str, int]]:
    """The parts of :func:`falsify` in a box of dimension ``dim`` at ``budget``, in their order: ``("design", 0)``,
    one ``("de", k)`` per island of :data:`DE_ISLAND` members of :func:`de_population`, one ``("chain", k)`` per
    refined conclusion (``max_refined``). The design and the islands are independent of each other; the chains
    start from what those found."""
    b = _budget(budget)
    islands = _de_members(dim, b) // DE_ISLAND
    return [("design", 0), *(("de", k) for k in range(islands)), *(("chain", k) for k in range(b.max_refined))]


def _run_part(stmt, space: SearchSpace, b: Budget, seed: int, part: str, k: int,
              earlier: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ev = _Evaluations(stmt, space, seed)
    t0 = time.process_time()
    if part == "design":
        for u in design(space.dim, max(1, b.initial), seed):
            ev(u)
    elif part == "de":
        from scipy.optimize import differential_evolution

        init = de_population(space.dim, b, seed)[k * DE_ISLAND:(k + 1) * DE_ISLAND]
        differential_evolution(ev.objective, [(0.0, 1.0)] * space.dim, maxiter=b.de_maxiter, init=init,
                               rng=np.random.default_rng([int(seed), _DE_STREAM, int(k)]), polish=False, tol=0.0,
                               updating="immediate")
    elif part == "chain":
        best = merge_records(earlier)["best"]
        names = weakest(best, b.max_refined)
        if k < len(names):
            rec = best[names[k]]
            ev.chain(names[k], rec["point"], rec["best_ratio"], b.refine,
                     np.random.default_rng([int(seed), _CHAIN_STREAM, int(k)]))
    else:
        raise ValueError(f"part must be one of {PARTS}; got {part!r}")
    return {**ev.record(), "cpu_seconds": time.process_time() - t0}


def search_part(stmt_id: str, seed: int, budget: str | Budget, part: str, k: int,
                *earlier: dict[str, Any]) -> dict[str, Any]:
    """Part ``(part, k)`` of :func:`falsify` of statement ``stmt_id`` over its box (a cell of the report at the
    paper scale, :mod:`verification.report.cells`), as a record (:meth:`_Evaluations.record`, ``cpu_seconds``):

    * ``("design", 0)``: the check at the ``initial`` points of the Halton :func:`design`;
    * ``("de", k)``: :func:`scipy.optimize.differential_evolution` (``updating="immediate"``, ``de_maxiter``
      generations, no polish) of the island ``k``: members ``8k .. 8k + 7`` of :func:`de_population`, its random
      stream ``default_rng([seed, 3, k])``;
    * ``("chain", k)``: given the records ``earlier`` of the design and the islands, the (1+1)-ES chain of ``refine``
      steps from the best point of the ``k``-th weakest conclusion of their merge (:func:`weakest`), its random
      stream ``default_rng([seed, 4, k])``; an empty record when fewer than ``k + 1`` conclusions are weak.

    Each part has its own evaluations (no cache shared between parts) and its own stream, which depend on the
    statement, the seed and ``k`` only: never on the process, the worker or the order the parts run in."""
    stmt = _statement(stmt_id)
    return _run_part(stmt, stmt.search, _budget(budget), int(seed), part, int(k), earlier)


def search_result(stmt, space: SearchSpace, budget: str | Budget, seed: int,
                  records: Sequence[dict[str, Any]]) -> SearchResult:
    """The :class:`SearchResult` of the records of a search's parts (:func:`search_parts` order), merged by
    :func:`merge_records` (per conclusion the first of the largest ratios in part order; evaluations, errors and
    counterexamples added up; ``seconds``: the parts' CPU seconds)."""
    m = merge_records(records)
    return SearchResult(statement=stmt.id, budget=_budget(budget).name, seed=int(seed), space=space.describe(),
                        family=space.family, best=m["best"], counterexamples=m["counterexamples"],
                        n_counterexamples=m["n_counterexamples"], evaluations=m["evaluations"], errors=m["errors"],
                        seconds=m["cpu_seconds"])


def falsify(stmt, space: SearchSpace, budget: str | Budget = "default", seed: int = 0,
            progress: Callable[[str], None] | None = None) -> SearchResult:
    """Search the box of ``space`` for instances of ``stmt`` (a :class:`verification.core.registry.Statement`) where
    its numeric conclusions come closest to (or beyond) their bounds, in this process: the parts of
    :func:`search_parts` one after the other (:func:`search_part`), merged by :func:`search_result`. The report at
    the paper scale runs the same parts as cells of the Dask engine and merges them the same way, so its result
    is this one whatever the number of workers. (Since the DE is split into islands and every chain has its own
    stream, the paper budget's numbers differ from those of the single DE with one shared stream used before.)"""
    b = _budget(budget)
    parts = search_parts(space.dim, b)
    base = [_run_part(stmt, space, b, int(seed), part, k, ()) for part, k in parts if part != "chain"]
    chains = [_run_part(stmt, space, b, int(seed), part, k, base) for part, k in parts if part == "chain"]
    res = search_result(stmt, space, b, seed, base + chains)
    if progress is not None:
        progress(f"  search {stmt.id}: {res.evaluations} evaluations, {res.seconds:.1f} s, "
                 f"{res.n_counterexamples} counterexamples")
    return res


def _config_record(cfg) -> Any:
    if cfg is None:
        return None
    if dataclasses.is_dataclass(cfg):
        return to_jsonable({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    return to_jsonable(cfg)


def apply(ev: Evidence, result: SearchResult, findings: Mapping[str, str] | None = None) -> Evidence:
    """The statement's Evidence with the search's outcome: each conclusion's ``search`` record (best ratio, point,
    evaluations), and — if the search met a counterexample of a contract conclusion — its counterexamples appended
    and the verdict ``violated``, or ``finding`` when every conclusion the search refutes is one of ``findings``
    (the statement's ``SEARCH_FINDINGS``: conclusion name -> the documented finding, written to
    ``details["finding"]``) and the check itself was not already violated, vacuous or a finding of its own literal
    statement (a FINDING stays a finding only if the counterexamples are to its literal statement, which the
    search does not count)."""
    conclusions = []
    for c in ev.conclusions:
        rec = result.best.get(c.name)
        if rec is not None:
            now, stored = result.evaluations_split()
            srec = {"best_ratio": rec["best_ratio"], "params": rec["params"], "evaluations": result.evaluations,
                    "evaluations_now": now, "evaluations_stored": stored,
                    "budget": result.budget, "counterexamples": rec["counterexamples"]}
            if result.stored is not None:
                srec.update({k: result.stored[k] for k in ("date", "missing") if k in result.stored})
                if "detecting_points" in result.stored:
                    srec["detecting_points"] = int(result.stored["detecting_points"].get(c.name, 0))
                    srec["design_points"] = int(result.stored.get("design_points", 0))
            c = dataclasses.replace(c, search=srec)
        conclusions.append(c)
    details = dict(ev.details)
    details["search"] = result.summary()
    out = dataclasses.replace(ev, conclusions=tuple(conclusions), details=to_jsonable(details))
    if result.n_counterexamples:
        cex = list(ev.counterexamples) + [dict(c, source="falsification search") for c in result.counterexamples]
        refuted = sorted(name for name, rec in result.best.items() if rec["counterexamples"])
        documented = dict(findings or {})
        if ev.verdict == "holds" and refuted and all(name in documented for name in refuted):
            verdict = "finding"
            details["finding"] = "; ".join(f"{name}: {documented[name]}" for name in refuted)
        else:
            verdict = "violated"
        out = dataclasses.replace(out, verdict=verdict, counterexamples=to_jsonable(cex[:MAX_STORED_COUNTEREXAMPLES]),
                                  n_counterexamples=ev.n_counterexamples + result.n_counterexamples,
                                  details=to_jsonable(details))
    return out


# ------------------------------------------------------------------------------- the search as a step of its own

#: Evaluations per statement of ``python -m verification search`` by default.
DEFAULT_EVALUATIONS = 200
#: Design points per cell of the search (the design is split into cells of this size).
DESIGN_CELL = 50
#: Fewest steps of a refinement chain.
MIN_CHAIN = 4
#: Steps of the short refinement the report runs from each stored best point still below :data:`TARGET`.
SHORT_REFINE = 3
#: Identifies a search folder (``params.json``).
SEARCH_KIND = "prefalign-verify falsification search"
SUMMARY_NAME = "search.json"
#: The stored search results the report and the power report start from (the output of
#: ``python -m verification search ... --store``), one ``<id>.json`` per statement and ``search.json``.
STORE = Path(__file__).parents[1] / "data" / "search"


#: The packages whose modules enter a check's code digest (:func:`check_code`) besides the statement's own module
#: and package: those of them it imports, directly or through each other.
DIGEST_PACKAGES = ("sim", "verification.statements")
_SOURCES: dict[tuple[str, int, int], str] = {}  # (path, mtime_ns, size) -> sha256 of the normalised source
_IMPORTS: dict[tuple[str, int, int], tuple[str, ...]] = {}


def _module_file(name: str) -> Path | None:
    """The source file of the module ``name`` (a package: its ``__init__.py``), found from its top-level package's
    location without importing anything below it; None where there is none."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin)
    for part in parts[1:]:
        if path.name != "__init__.py":
            return None  # the parent is a module, not a package: ``part`` is a name in it
        for cand in (path.parent / f"{part}.py", path.parent / part / "__init__.py"):
            if cand.is_file():
                path = cand
                break
        else:
            return None
    return path


def _in_digest(name: str, packages: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _imported_names(name: str, path: Path, tree: ast.Module) -> list[str]:
    """Every module name an import statement of ``tree`` (the module ``name`` at ``path``; at any depth: lazy
    imports in functions count) may bring in, with the packages above it (their ``__init__`` runs first)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bases = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            bases = [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]
        else:
            continue
        for b in bases:
            parts = b.split(".")
            out.extend(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    return out


def _source_facts(name: str, path: Path) -> tuple[str, tuple[str, ...]]:
    """The sha256 of the module's source (bytes, newlines normalised to ``\\n``) and the names it imports; cached
    per file version (path, modification time, size)."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _SOURCES:
        src = path.read_bytes().replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        _SOURCES[key] = hashlib.sha256(src).hexdigest()
        _IMPORTS[key] = tuple(_imported_names(name, path, ast.parse(src, filename=str(path))))
    return _SOURCES[key], _IMPORTS[key]


def check_code(module: str, packages: Sequence[str] = DIGEST_PACKAGES) -> dict[str, Any]:
    """What a statement's check is made of, as a digest to key its stored search on: the statement module
    ``module`` and every module of ``packages`` and of ``module``'s own package (its helpers: for the suite's
    statements ``verification.statements``) it imports, directly or through those modules (found from the source's
    import statements, lazy ones included, with the packages above each module), each named by its dotted name
    with the sha256 of its source bytes (newlines normalised: the same on every machine and checkout, independent
    of ``.pyc`` files). Returns ``{"digest": sha256 of the sorted (name, sha256) lines, "modules": {name:
    sha256}}``. Raises ``ValueError`` when ``module``'s source cannot be found."""
    path = _module_file(module)
    if path is None:
        raise ValueError(f"check_code: no source file for the statement module {module!r}")
    own = module.rpartition(".")[0]
    packages = tuple(packages) + ((own,) if own else ())
    hashes: dict[str, str] = {}
    todo = [(module, path)]
    parts = module.split(".")
    todo += [(m, f) for m in (".".join(parts[:k]) for k in range(1, len(parts)))
             if _in_digest(m, packages) and (f := _module_file(m)) is not None]
    while todo:
        name, path = todo.pop()
        if name in hashes:
            continue
        hashes[name], imports = _source_facts(name, path)
        for imp in imports:
            if imp not in hashes and _in_digest(imp, packages) and (f := _module_file(imp)) is not None:
                todo.append((imp, f))
    lines = "".join(f"{n} {h}\n" for n, h in sorted(hashes.items()))
    return {"digest": hashlib.sha256(lines.encode()).hexdigest(), "modules": dict(sorted(hashes.items()))}


def code_changes(stored: dict[str, Any], now: dict[str, Any]) -> str:
    """What differs between a stored search's ``code_modules`` and :func:`check_code`'s ``modules`` now, in words
    (the modules changed, added and gone)."""
    old = stored.get("code_modules") or {}
    new = now["modules"]
    bits = []
    for what, names in (("changed", [n for n in new if n in old and old[n] != new[n]]),
                        ("new", [n for n in new if n not in old]), ("gone", [n for n in old if n not in new])):
        if names:
            bits.append(f"{what}: {', '.join(names[:6])}" + (f" and {len(names) - 6} more" if len(names) > 6 else ""))
    return "; ".join(bits)


def _statement(stmt_id: str):
    stmt = get_statement(stmt_id)
    if stmt.search is None:
        raise ValueError(f"statement {stmt_id} declares no search box (SEARCH)")
    return stmt


def design_cell(stmt_id: str, seed: int, start: int, count: int) -> dict[str, Any]:
    """A cell of the search: the check of ``stmt_id`` at design points ``start .. start + count − 1``
    (:func:`design`)."""
    stmt = _statement(stmt_id)
    ev = _Evaluations(stmt, stmt.search, seed)
    t0 = time.process_time()
    for u in design(stmt.search.dim, count, seed, start):
        ev(u)
    return {**ev.record(), "cpu_seconds": time.process_time() - t0}


def refine_cell(stmt_id: str, seed: int, starts: list[list], steps: int) -> dict[str, Any]:
    """The refinement cell of the search: for each ``(conclusion, point, ratio)`` of ``starts`` a (1+1)-ES chain
    of ``steps`` steps (:meth:`_Evaluations.chain`; generator ``default_rng([seed, 1])``)."""
    stmt = _statement(stmt_id)
    ev = _Evaluations(stmt, stmt.search, seed)
    rng = np.random.default_rng([int(seed), 1])
    t0 = time.process_time()
    for name, point, ratio in starts:
        ev.chain(name, point, ratio, steps, rng)
    # the chains' points cluster around their starts: only the design's points are counted as detecting
    return {**ev.record(), "detecting": {}, "cpu_seconds": time.process_time() - t0}


def merge_records(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The cells' records of one statement merged: per conclusion the best record (the first of the largest
    ratios, in cell order), the counterexamples and evaluations added up."""
    best: dict[str, dict] = {}
    cex: list[dict] = []
    detecting: dict[str, int] = {}
    out: dict[str, Any] = {"evaluations": 0, "n_counterexamples": 0, "errors": [], "cpu_seconds": 0.0}
    for r in records:
        for name, n in r.get("detecting", {}).items():
            detecting[name] = detecting.get(name, 0) + int(n)
        out["evaluations"] += int(r["evaluations"])
        out["n_counterexamples"] += int(r["n_counterexamples"])
        out["errors"] += list(r["errors"])
        out["cpu_seconds"] += float(r.get("cpu_seconds", 0.0))
        cex += r["counterexamples"]
        for name, rec in r["best"].items():
            old = best.get(name)
            if old is None or (rec["best_ratio"] is not None
                               and (old["best_ratio"] is None or rec["best_ratio"] > old["best_ratio"])):
                best[name] = rec
    out["best"] = best
    out["detecting"] = detecting
    out["counterexamples"] = cex[:MAX_STORED_COUNTEREXAMPLES]
    return out


def design_size(evaluations: int) -> int:
    """Design points of a search of ``evaluations`` evaluations per statement: half of them (the rest refine)."""
    return max(1, (int(evaluations) + 1) // 2)


def refine_plan(merged_design: dict[str, Any], evaluations: int) -> tuple[list[list], int]:
    """The refinement cell's chains after the design: every conclusion, weakest first (the scores of a box
    only while below 0), from its best design point; ``steps`` per chain so that the evaluations left over by the
    design (``evaluations`` minus those it spent) are shared out, at least :data:`MIN_CHAIN` each (the
    weakest chains first when they do not all fit)."""
    left = max(0, int(evaluations) - int(merged_design["evaluations"]))
    best = merged_design["best"]
    names = [n for n in best if not n.startswith("score: ")
             or best[n]["best_ratio"] is None or best[n]["best_ratio"] < 0.0]
    names.sort(key=lambda nm: (-1.0 if best[nm]["best_ratio"] is None else best[nm]["best_ratio"], nm))
    if not names or left < MIN_CHAIN:
        return [], 0
    steps = max(MIN_CHAIN, left // len(names))
    names = names[: max(1, left // steps)]
    return [[n, best[n]["point"], best[n]["best_ratio"]] for n in names], steps


def store_results(out: str | Path, store: str | Path = STORE) -> list[str]:
    """Copy the statement results of the search folder ``out`` (``worst/<id>.json``) into the store ``store`` and
    rewrite its ``search.json`` from what the store then holds; returns the statements copied."""
    from sim.cli import atomic_write_text

    src, dst = Path(out), Path(store)
    dst.mkdir(parents=True, exist_ok=True)
    copied = []
    for p in sorted((src / "worst").glob("*.json")):
        atomic_write_text(dst / p.name, p.read_text(encoding="utf-8"))
        copied.append(p.stem)
    index = {}
    for p in sorted(dst.glob("*.json")):
        if p.name == SUMMARY_NAME:
            continue
        rec = json.loads(p.read_text(encoding="utf-8"))
        index[rec["statement"]] = {k: rec.get(k) for k in ("budget", "evaluations", "date", "seed", "counterexamples",
                                                           "best_ratio", "code_digest")}
    atomic_write_text(dst / SUMMARY_NAME, json.dumps({"kind": SEARCH_KIND, "statements": index}, indent=1,
                                                     allow_nan=False) + "\n")
    return copied


def _shown_path(p: Path) -> Path:
    """``p`` as the reports show it: relative to the checkout when inside it (the store of this project), so that
    a report names no folder of the machine it ran on."""
    root = STORE.parents[2]
    try:
        return p.resolve().relative_to(root.resolve())
    except ValueError:
        return p


def load_stored(stmt, store: str | Path = STORE) -> tuple[dict[str, Any] | None, str]:
    """The stored search result of ``stmt`` and a word on it: ``(record, "")``, or ``(None, why)`` when there is
    none or it is stale: its box is not the statement's box today, or its ``code_digest`` is not the digest of the
    check's code today (:func:`check_code`: the statement module and the modules of :data:`DIGEST_PACKAGES` it
    imports; a stored search without one counts as made by other code)."""
    p = Path(store) / f"{stmt.id}.json"
    shown = _shown_path(p)
    if not p.is_file():
        return None, f"no stored search in {shown.parent}"
    try:
        rec = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"cannot read {shown}: {exc}"
    if rec.get("box") != stmt.search.describe():
        return None, f"the stored search of {stmt.id} ({shown}) searched another box: run the search again"
    code = check_code(stmt.module)
    if rec.get("code_digest") != code["digest"]:
        what = code_changes(rec, code) if rec.get("code_modules") else "it records no code digest"
        return None, (f"the stored search of {stmt.id} ({shown}) was made by other code than the check's today ({what}): "
                      "run the search again")
    return rec, ""


def refine_stored(stmt, stored: dict[str, Any], seed: int | None = None, steps: int = SHORT_REFINE,
                  progress: Callable[[str], None] | None = None) -> SearchResult:
    """The short refinement the report runs: re-evaluate every stored best point (its ratio is then this code's,
    not the stored number), then a chain of ``steps`` steps from each conclusion still below :data:`TARGET`.
    The result carries the stored search's budget, evaluations and date (``stored``)."""
    t0 = time.perf_counter()
    seed = int(stored["seed"]) if seed is None else int(seed)
    ev = _Evaluations(stmt, stmt.search, seed)
    for rec in stored["conclusions"].values():
        ev(rec["point"])
    rng = np.random.default_rng([seed, 2])
    for name in ev.weakest():
        rec = ev.best[name]
        ev.chain(name, rec["point"], rec["best_ratio"], steps, rng)
    res = ev.result(f"stored ({stored['budget']} per statement) + refinement", time.perf_counter() - t0)
    res.stored = {"budget": stored["budget"], "evaluations": stored["evaluations"], "date": stored["date"],
                  "seed": stored["seed"], "refinement_evaluations": ev.evaluations,
                  "stored_best_ratio": stored["best_ratio"], "counterexamples": int(stored["counterexamples"]),
                  "detecting_points": stored.get("detecting_points", {}),
                  "design_points": stored.get("design_points", 0)}
    res.evaluations = int(stored["evaluations"]) + ev.evaluations
    if progress is not None:
        progress(f"  search {stmt.id}: stored ({stored['evaluations']} evaluations, {stored['date']}) refined by "
                 f"{ev.evaluations} evaluations in {res.seconds:.1f} s")
    return res


def search_statement(stmt, budget: str = STORED, seed: int = 0,
                     progress: Callable[[str], None] | None = None, store: str | Path = STORE) -> SearchResult | None:
    """The falsification search of ``stmt`` (None without a ``SEARCH`` box): with ``budget`` ``"stored"`` the
    short refinement of its stored result in ``store`` (:func:`refine_stored`; without a current stored result,
    :func:`load_stored`: none, another box or other code, the ``default`` budget in this process, the result saying
    why in ``stored["missing"]``), otherwise :func:`falsify` with that budget."""
    if stmt.search is None:
        return None
    if budget != STORED:
        return falsify(stmt, stmt.search, budget, seed, progress=progress)
    rec, why = load_stored(stmt, store)
    if rec is not None:
        return refine_stored(stmt, rec, progress=progress)
    res = falsify(stmt, stmt.search, "default", seed, progress=progress)
    res.stored = {"missing": why}
    return res


def screen(summary: dict[str, Any]) -> str:
    """The search's screen summary: per statement the evaluations, CPU seconds, counterexamples and how many
    conclusions reach :data:`TARGET` (with the weakest)."""
    lines = [f"falsification search: {summary['budget']} evaluations per statement, seed {summary['seed']}",
             f"{'id':<8} {'evals':>5} {'cpu s':>7} {'cex':>4}  conclusions >= {TARGET:g}   weakest"]
    for sid, v in summary["statements"].items():
        if not v["complete"]:
            lines.append(f"{sid:<8} incomplete: the same command computes the missing cells")
            continue
        ratios = {k: r for k, r in v["best_ratio"].items() if not k.startswith("score: ")}
        reach = sum(r is not None and r >= TARGET for r in ratios.values())
        weakest = min(ratios.items(), key=lambda kv: -1.0 if kv[1] is None else kv[1]) if ratios else None
        wtxt = "" if weakest is None else (f"{'-' if weakest[1] is None else f'{weakest[1]:.3g}'}  "
                                           f"{weakest[0][:60]}")
        lines.append(f"{sid:<8} {v['evaluations']:>5} {v['cpu_seconds']:>7.1f} {v['counterexamples']:>4}  "
                     f"{reach:>3} of {len(ratios):<3}           {wtxt}")
    lines.append(f"counterexamples in all: {summary['counterexamples']}")
    return "\n".join(lines)
