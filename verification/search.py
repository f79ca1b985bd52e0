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
* ``paper`` budget: :func:`scipy.optimize.differential_evolution` on the box (the objective is the mean over the
  conclusions of ``log min(ratio, 1)``, so every conclusion pulls), then the same refinement with more steps.

Every evaluation uses the same seed (common random numbers: the objective is a deterministic function of the
point), so the search is reproducible. The best instance of every conclusion is kept with the data to reproduce
it (the point, the ``Config``, the seed and the instance record), and written by the report to
``worst/<id>.json``. A ratio ``> 1`` on an instance where every hypothesis held is a counterexample: the
evaluation's own verdict is ``violated`` and :func:`apply` makes the statement's verdict ``violated`` (or, where the
statement is a FINDING whose repaired statement holds there, leaves it a finding).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .evidence import MAX_STORED_COUNTEREXAMPLES, Evidence, bound_factor, to_jsonable

__all__ = ["TARGET", "Param", "SearchSpace", "Budget", "BUDGETS", "SearchResult", "falsify", "apply"]

#: The tightness every numeric conclusion should reach on its family (a halved bound is then detected).
TARGET = 0.5
_FLOOR = 1e-6  # ratios below this (or missing) count as this in the scalar objective


@dataclass(frozen=True)
class Param:
    """One coordinate of the box: ``linear`` or ``log`` on ``[low, high]``, ``int`` (rounded), or ``choice``
    (one of ``choices``)."""

    name: str
    low: float = 0.0
    high: float = 1.0
    scale: str = "linear"
    choices: tuple = ()

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

    def __post_init__(self):
        names = [p.name for p in self.params]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"SearchSpace: parameter names must be non-empty and unique; got {names}")

    @property
    def dim(self) -> int:
        return len(self.params)

    def decode(self, u: Sequence[float]) -> dict[str, Any]:
        return {p.name: p.decode(x) for p, x in zip(self.params, u, strict=True)}

    def describe(self) -> list[str]:
        return [p.describe() for p in self.params]


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

    def summary(self) -> dict[str, Any]:
        return to_jsonable({
            "statement": self.statement, "budget": self.budget, "seed": self.seed, "family": self.family,
            "box": self.space, "evaluations": self.evaluations,
            "counterexamples": self.n_counterexamples, "errors": self.errors[:5],
            "best_ratio": {k: v["best_ratio"] for k, v in self.best.items()},
        })

    def worst_file(self) -> dict[str, Any]:
        """The content of ``worst/<id>.json``: the best instance of every conclusion with the data to reproduce
        it (``run(Config(**config), numpy.random.default_rng(seed))``)."""
        return to_jsonable({**self.summary(), "conclusions": self.best, "search_counterexamples": self.counterexamples})


def _scores(ev: Evidence, targets: Sequence[str]) -> dict[str, tuple[float | None, dict | None, int]]:
    out = {}
    for c in ev.conclusions:
        if not c.numeric or c.role == "literal" or (targets and c.name not in targets):
            continue
        out[c.name] = (c.detect_factor, c.worst, c.counterexamples if c.role == "contract" else 0)
    return out


def falsify(stmt, space: SearchSpace, budget: str | Budget = "default", seed: int = 0,
            progress: Callable[[str], None] | None = None) -> SearchResult:
    """Search the box of ``space`` for instances of ``stmt`` (a :class:`verification.registry.Statement`) where
    its numeric conclusions come closest to (or beyond) their bounds. See the module docstring."""
    if isinstance(budget, str) and budget not in BUDGETS:
        raise ValueError(f"budget must be one of {sorted(BUDGETS)}; got {budget!r}")
    b = BUDGETS[budget] if isinstance(budget, str) else budget
    res = SearchResult(statement=stmt.id, budget=b.name, seed=int(seed), space=space.describe(), family=space.family)
    t0 = time.perf_counter()
    cache: dict[tuple, dict] = {}

    def evaluate(u) -> dict[str, tuple]:
        u = np.clip(np.asarray(u, dtype=np.float64), 0.0, 1.0)
        params = space.decode(u)
        key = tuple(sorted((k, v if not isinstance(v, float) else round(v, 12)) for k, v in params.items()))
        if key in cache:
            return cache[key]
        res.evaluations += 1
        try:
            cfg = space.config(params)
            with bound_factor(1.0):
                ev = stmt.run(cfg, np.random.default_rng(seed))
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            res.errors.append(f"{params}: {exc!r}")
            cache[key] = {}
            return {}
        sc = _scores(ev, space.targets)
        if space.scores is not None:
            sc.update({f"score: {k}": (float(v), None, 0) for k, v in space.scores(ev).items()})
        for name, (ratio, worst, n_cex) in sc.items():
            rec = res.best.get(name)
            if ratio is not None and (rec is None or rec["best_ratio"] is None or ratio > rec["best_ratio"]):
                res.best[name] = {"best_ratio": float(ratio), "point": u.tolist(), "params": params,
                                  "config": _config_record(cfg), "seed": int(seed), "instance": worst,
                                  "counterexamples": int(n_cex)}
            elif rec is None:
                res.best[name] = {"best_ratio": None, "point": u.tolist(), "params": params,
                                  "config": _config_record(cfg), "seed": int(seed), "instance": None,
                                  "counterexamples": 0}
            if n_cex:
                res.n_counterexamples += n_cex
                for c in ev.counterexamples:
                    if c.get("conclusion") == name and len(res.counterexamples) < MAX_STORED_COUNTEREXAMPLES:
                        res.counterexamples.append({"conclusion": name, "params": params,
                                                    "config": _config_record(cfg), "seed": int(seed), **c})
        cache[key] = sc
        return sc

    def objective(u) -> float:
        sc = evaluate(u)
        if not sc:
            return 0.0  # an invalid or empty evaluation scores like the floor everywhere
        vals = [math.log(min(max(r if not k.startswith("score: ") else 0.5 + 0.5 * math.tanh(r), _FLOOR), 1.0))
                if r is not None else math.log(_FLOOR) for k, (r, _, _) in sc.items()]
        return -float(np.mean(vals)) / -math.log(_FLOOR)  # in [0, 1]: 0 = every conclusion attains its bound

    from scipy.stats import qmc

    d = space.dim
    design = qmc.Halton(d, scramble=True, seed=seed).random(max(1, b.initial))
    design[0] = 0.5  # the centre of the box first
    for u in design:
        evaluate(u)
    if b.de_maxiter:
        from scipy.optimize import differential_evolution

        differential_evolution(objective, [(0.0, 1.0)] * d, maxiter=b.de_maxiter, popsize=b.de_popsize,
                               seed=seed, polish=False, init="sobol", tol=0.0, updating="immediate")
    rng = np.random.default_rng(seed)
    weak = [name for name, rec in res.best.items()
            if rec["best_ratio"] is None or rec["best_ratio"] < (0.0 if name.startswith("score: ") else TARGET)]
    weak.sort(key=lambda nm: -1.0 if res.best[nm]["best_ratio"] is None else res.best[nm]["best_ratio"])
    for name in weak[: b.max_refined]:
        rec = res.best[name]
        u, best, step = np.asarray(rec["point"]), rec["best_ratio"], 0.2
        for _ in range(b.refine):
            cand = np.clip(u + step * rng.standard_normal(d), 0.0, 1.0)
            r = evaluate(cand).get(name, (None,))[0]
            if r is not None and (best is None or r > best):
                u, best, step = cand, r, min(step * 1.5, 0.5)
            else:
                step *= 0.5
    res.seconds = time.perf_counter() - t0
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


def apply(ev: Evidence, result: SearchResult) -> Evidence:
    """The statement's Evidence with the search's outcome: each conclusion's ``search`` record (best ratio, point,
    evaluations), and — if the search met a counterexample of a contract conclusion — the verdict ``violated``
    with the search's counterexamples appended (a FINDING stays a finding only if the counterexamples are to its
    literal statement, which the search does not count)."""
    conclusions = []
    for c in ev.conclusions:
        rec = result.best.get(c.name)
        if rec is not None:
            c = dataclasses.replace(c, search={"best_ratio": rec["best_ratio"], "params": rec["params"],
                                               "evaluations": result.evaluations, "budget": result.budget,
                                               "counterexamples": rec["counterexamples"]})
        conclusions.append(c)
    details = dict(ev.details)
    details["search"] = result.summary()
    out = dataclasses.replace(ev, conclusions=tuple(conclusions), details=to_jsonable(details))
    if result.n_counterexamples:
        cex = list(ev.counterexamples) + [dict(c, source="falsification search") for c in result.counterexamples]
        out = dataclasses.replace(out, verdict="violated", counterexamples=to_jsonable(cex[:MAX_STORED_COUNTEREXAMPLES]),
                                  n_counterexamples=ev.n_counterexamples + result.n_counterexamples)
    return out
