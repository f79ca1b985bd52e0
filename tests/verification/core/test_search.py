"""The falsification search: the box, the search itself on toy checks, counterexamples, determinism, and the
statements' declared boxes (each evaluates its check at the centre of the box)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys

import numpy as np
import pytest

from verification.core import catalogue, registry, search
from verification.core.evidence import Evidence, HypothesisMonitor
from verification.core.search import BUDGETS, Budget, Param, SearchSpace, apply, falsify


def test_param_decoding_and_validation():
    assert Param("x", 2.0, 4.0).decode(0.5) == pytest.approx(3.0)
    assert Param("x", 1e-4, 1.0, "log").decode(0.5) == pytest.approx(1e-2)
    assert Param("m", 2, 6, "int").decode(0.26) == 3
    assert Param("k", scale="choice", choices=("a", "b")).decode(0.99) == "b"
    assert Param("x", 0.0, 1.0).decode(7.0) == 1.0  # clipped to the box
    with pytest.raises(ValueError, match="log scale"):
        Param("x", 0.0, 1.0, "log")
    with pytest.raises(ValueError, match="scale"):
        Param("x", 0.0, 1.0, "cubic")
    with pytest.raises(ValueError, match="unique"):
        SearchSpace(params=(Param("a"), Param("a")), config=dict)


def _toy_statement(run):
    return registry.Statement("T.9", "9", "toy", run, module="tests")


def _toy_run(config, rng):
    """lhs/rhs = a·b on a held instance set (the bound is approached only near a = b = 1); instances with
    a hypothesis failing (c > 0.9) are excluded, and there lhs is far above rhs (they must not count)."""
    a, b, c = config["a"], config["b"], config["c"]
    x = rng.uniform(0.9, 1.0, 20)
    mon = HypothesisMonitor(20)
    mon.record("c <= 0.9", np.full(20, c <= 0.9))
    lhs = np.where(c <= 0.9, a * b * x, 10.0)
    return Evidence.from_implication("T.9", "toy", mon, lhs, np.ones(20), conclusion="lhs <= rhs")


TOY_SPACE = SearchSpace(params=(Param("a", 0.01, 1.0, "log"), Param("b", 0.0, 1.0), Param("c", 0.0, 1.0)),
                        config=lambda p: p, family="toy")


def test_search_approaches_the_bound_and_never_counts_excluded_instances():
    res = falsify(_toy_statement(_toy_run), TOY_SPACE, "default", seed=0)
    assert res.evaluations <= BUDGETS["default"].initial + 3 * BUDGETS["default"].refine
    paper = falsify(_toy_statement(_toy_run), TOY_SPACE, Budget("small DE", initial=8, refine=12, de_maxiter=4,
                                                                de_popsize=5), seed=0)
    for r in (res, paper):
        best = r.best["lhs <= rhs"]
        assert best["best_ratio"] <= 1.0 and best["params"]["c"] <= 0.9  # excluded instances (ratio 10) never count
        assert r.n_counterexamples == 0
    assert paper.best["lhs <= rhs"]["best_ratio"] > 0.8  # differential evolution approaches the bound
    again = falsify(_toy_statement(_toy_run), TOY_SPACE, "default", seed=0)
    assert again.best == res.best  # same seed, same search


def _toy_false(config, rng):
    """A 'theorem' false for b > 0.8: lhs/rhs = 1.2 there, with every hypothesis held."""
    ratio = 1.2 if config["b"] > 0.8 else 0.5 * config["b"]
    return Evidence.from_implication("T.9", "toy", None, np.full(3, ratio), np.ones(3), conclusion="eq 1")


def test_a_counterexample_found_by_the_search_makes_the_verdict_violated():
    stmt = _toy_statement(_toy_false)
    res = falsify(stmt, SearchSpace(params=(Param("b", 0.0, 1.0),), config=lambda p: p), "default", seed=0)
    assert res.n_counterexamples > 0
    cex = res.counterexamples[0]
    assert cex["conclusion"] == "eq 1" and cex["params"]["b"] > 0.8 and cex["seed"] == 0  # data to reproduce it
    base = _toy_false({"b": 0.5}, np.random.default_rng(0))
    assert base.verdict == "holds"
    out = apply(base, res)
    assert out.verdict == "violated" and out.n_counterexamples > 0
    assert out.conclusion("eq 1").search["best_ratio"] == pytest.approx(1.2)
    assert out.counterexamples[0]["source"] == "falsification search"


def test_worst_file_holds_the_data_to_reproduce():
    res = falsify(_toy_statement(_toy_run), TOY_SPACE, "default", seed=3)
    wf = res.worst_file()
    rec = wf["conclusions"]["lhs <= rhs"]
    ev = _toy_run(rec["config"], np.random.default_rng(rec["seed"]))
    assert ev.conclusion("lhs <= rhs").detect_factor == pytest.approx(rec["best_ratio"])


SEARCHED = [s.id for s in registry.all_statements() if s.search is not None]


def test_every_statement_with_a_numeric_bound_declares_a_search_space():
    numeric_free = {"H.30", "H.42", "H.5", "H.6"}  # identities and boolean conclusions only
    missing = [s.id for s in registry.all_statements()
               if s.id.startswith(("H.", "Cor", "Thm")) and s.id not in numeric_free and s.search is None]
    assert not missing, missing


@pytest.mark.parametrize("sid", SEARCHED)
def test_search_space_evaluates_the_check_at_the_centre(sid):
    stmt = registry.get_statement(sid)
    cfg = stmt.search.config(stmt.search.decode([0.5] * stmt.search.dim))
    ev = stmt.run(cfg, np.random.default_rng(0))
    assert ev.id == sid and ev.verdict in ("holds", "finding"), (ev.verdict, ev.counterexamples[:1])
    assert any(c.numeric for c in ev.conclusions)


def test_tight_points_join_the_check(default_run):
    """The points the search found (TIGHT_POINTS) run with the check; their instances are in its evidence."""
    stmt = registry.get_statement("H.15")
    assert stmt.tight_points
    ev = default_run("H.15")
    pts = ev.details["added_points"]
    assert len(pts) == len(stmt.tight_points) * stmt.tight_seeds
    assert ev.instances == 300 + sum(p["instances"] for p in pts)
    c = ev.conclusion("eq 42: dbar^T g_i^(j) >= -B delta_g")
    assert c.detect_factor > 0.5
    # each point runs at TIGHT_SEEDS seeds: the run's own, then independent streams derived from it
    assert stmt.tight_seeds > 1
    seeds = [p.get("seed") for p in pts if p["point"] == dict(stmt.tight_points[0])]
    assert seeds == [registry.DEFAULT_SEED] + [[registry.DEFAULT_SEED, j] for j in range(1, stmt.tight_seeds)]
    assert c.n_detecting >= 10, c.n_detecting  # the reason for the seeds: a detection on more than a few draws
    # the worst instance comes from a tight point (the family's is lower) and names the point and seed it ran at
    assert c.family_detect_factor < c.detect_factor
    assert c.worst["added_point"] in [dict(p) for p in stmt.tight_points] and "seed" in c.worst


def test_tight_point_seeds_are_the_run_seed_then_independent_streams(default_run):
    assert registry.tight_point_seed(7, 0) == 7
    assert registry.tight_point_seed(7, 2) == [7, 2]
    draws = {str(registry.statement_rng(registry.tight_point_seed(7, j)).random(3)) for j in range(4)}
    assert len(draws) == 4
    # one seed per point (the default) is the plain run at the run's seed
    stmt = registry.get_statement("H.28")
    assert stmt.tight_seeds == 1
    ev = default_run("H.28")
    assert [p["seed"] for p in ev.details["added_points"]] == [registry.DEFAULT_SEED] * len(stmt.tight_points)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3"])
def test_tight_seeds_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=rf"statement X.1: TIGHT_SEEDS must be an integer >= 1; got {bad!r}"):
        registry.Statement(id="X.1", number="1", name="x", run=lambda c, r: None, tight_seeds=bad)


@pytest.mark.parametrize("sid", SEARCHED)
def test_every_box_reaches_the_stress_corners_or_says_why_not(sid):
    """Each box reaches m >= 10, conditioning >= 1e6, lambda_min <= 1e-12 and near-collinear Gram matrices, or its
    ``excluded`` says why not (the dashboard shows the reasons)."""
    from verification.core.search import REACH

    reach = registry.get_statement(sid).search.reach()
    assert list(reach) == list(REACH)
    missing = [k for k, v in reach.items() if v == "NOT REACHED"]
    assert not missing, f"{sid}: the box neither reaches nor excludes {missing}"
    for v in reach.values():
        assert v.startswith("excluded: ") and len(v) > 40 or " in [" in v


def test_reach_is_decided_from_the_box():
    from verification.core.search import F1_SHAPE

    space = SearchSpace(params=(Param("m", 2, 12, "int"), *F1_SHAPE, Param("lambda_min", 1e-13, 1e-2, "log")),
                        config=dict)
    assert all(v != "NOT REACHED" and not v.startswith("excluded") for v in space.reach().values())
    narrow = SearchSpace(params=(Param("m", 2, 4, "int"),), config=dict, excluded={"m >= 10": "m is fixed"})
    r = narrow.reach()
    assert r["m >= 10"] == "excluded: m is fixed" and r["conditioning >= 1e6"] == "NOT REACHED"
    with pytest.raises(ValueError, match="excluded keys"):
        SearchSpace(params=(Param("m", 2, 4, "int"),), config=dict, excluded={"m > 3": "no"})
    # a point without a parameter takes its default; an unknown name is refused
    sp = SearchSpace(params=(Param("a", 0, 1), Param("b", 0, 1, default=0.25)), config=dict)
    assert sp.make_config({"a": 0.5}) == {"a": 0.5, "b": 0.25}
    with pytest.raises(ValueError, match="unknown parameter"):
        sp.make_config({"a": 0.5, "c": 1})
    with pytest.raises(ValueError, match="no default"):
        sp.make_config({"b": 0.5})


#: Instances the falsification search met at the stress corners where a comparison was decided by roundoff; the
#: checks now carry the rounding allowances computed from the data (each statement's docstring states them).
ROUNDOFF_POINTS = {
    "H.16": {"shift": 0.1532517081750301, "spread_f1": 0.0215001577703955, "m": 12, "n_w_max": 11,
             "radius": 0.001, "rho_alpha": 13.365050715688163, "n_clients": 3, "kappa_Q": 334655.24309772835,
             "s_c": 0.9806136739415932},  # eq 48': the LP's certificate at a Gram matrix of ~1e11
    "H.20": {"s_c": 0.8569, "kappa_Q": 49414.3334, "radius": 0.0184, "eta_factor": 0.0179, "spread": 0.012, "m": 12,
             "n_w": 11},  # the KKT row: a minimum-norm point of norm 1e-6 among gradients of ~1e2
    "H.10": {"m": 2, "log_loss_halfwidth": 3.86031, "near_eps": 3e-05, "pref_concentration": 4.34714,
             "lambda_min": 0.0},  # the mean-value link: near pairs at lambda_min 1e-9 differ by 1e-14
}


@pytest.mark.parametrize("sid", sorted(ROUNDOFF_POINTS))
def test_roundoff_decided_search_instances_are_decided_by_the_allowances(sid):
    stmt = registry.get_statement(sid)
    ev = stmt.run(stmt.search.make_config(ROUNDOFF_POINTS[sid]), np.random.default_rng(0))
    bad = [(c.name, c.counterexamples) for c in ev.conclusions if c.role == "contract" and c.counterexamples]
    assert not bad, bad


def test_the_search_finds_region_sampled_constants_optimistic_on_the_trajectory(default_run):
    """A finding of the search (H.19, O-8): with m = 10 objectives in n_w = 2 dimensions the iterates approach the
    optimum, where the descent margin is worst, and the constants from 2000 uniform points of the region miss it:
    c_d r_i - m_i exceeds b_i by a factor ~37 at iterate 145."""
    stmt = registry.get_statement("H.19")
    point = {"spread": 0.003901087335833972, "eta_factor": 0.010065412817091616, "start_noise": 0.0829989593382643,
             "m": 10, "n_w": 2, "n_clients": 2, "kappa_Q": 2.8934469261993674, "s_c": 0.009882068106619735}
    ev = stmt.run(stmt.search.make_config(point), np.random.default_rng(0))
    c = ev.conclusion("eq 51 at the iterates with region constants: c_d r_i - m_i <= b_i")
    assert ev.verdict == "violated" and c.counterexamples > 0
    assert c.detect_factor == pytest.approx(36.927103185189246, rel=1e-9)
    assert default_run("H.19").verdict == "holds"  # the default family does not reach it


def test_every_statement_with_a_config_has_a_larger_paper_preset():
    """`--scale paper` scales every statement whose conclusions are counted over samples: each Config has a
    ``paper()`` preset that changes at least one size of the default; only the exact (symbolic) statements have
    no Config."""
    import dataclasses

    for stmt in registry.all_statements():
        if stmt.config_factory is None:
            assert stmt.module == registry.SYMBOLIC_MODULE, stmt.id
            continue
        default, paper = registry.statement_config(stmt, "default"), registry.statement_config(stmt, "paper")
        grown = [f.name for f in dataclasses.fields(default)
                 if isinstance(getattr(default, f.name), int) and getattr(paper, f.name) > getattr(default, f.name)]
        assert grown, f"{stmt.id}: its paper() preset enlarges no sample size of the default Config"


# ------------------------------------------------------------------------------ the stored search and the check's code

_CHECK = '''"""A check whose code is in two modules: this one and its helper."""
from dataclasses import dataclass

from verification.core.evidence import Evidence
from verification.core.search import Param, SearchSpace
from {pkg} import helper

STATEMENT_ID = "CK.1"
NAME = "a check keyed on its code"


@dataclass(frozen=True)
class Config:
    a: float = 0.5


def run(config, rng):
    cfg = config or Config()
    x = rng.uniform(0.0, cfg.a, 8)
    return Evidence.from_implication(STATEMENT_ID, NAME, None, helper.scale(x), [1.0] * 8, conclusion="x <= 1")


SEARCH = SearchSpace((Param("a", 0.1, 1.0),), lambda p: Config(**p), family="uniform draws")
'''


def _check_package(root, name, scale="0.9 * x", newline="\n"):
    pkg = root / name
    pkg.mkdir(exist_ok=True)
    for fname, text in (("__init__.py", ""), ("helper.py", f"def scale(x):\n    return {scale}\n"),
                        ("check.py", _CHECK.replace("{pkg}", name))):
        (pkg / fname).write_bytes(text.replace("\n", newline).encode())
    return f"{name}.check"


def test_check_code_follows_the_imports_and_reads_the_same_on_every_checkout(tmp_path, monkeypatch):
    """The digest of a check: its module and the modules of sim/, verification/statements/ and its own package
    that it imports, directly, lazily (sim.direction's compiled twin) or through each other, with the packages
    above them; not verification/core. Newlines are normalised (a CRLF checkout gives the same digest); a changed
    helper changes it and is named."""
    code = search.check_code("verification.statements.h13_simultaneous_balancing")
    mods = set(code["modules"])
    assert {"verification.statements.h13_simultaneous_balancing", "verification.statements._cluster_common",
            "verification.statements", "sim", "sim.direction", "sim._lp_compiled", "sim.problems"} <= mods
    assert not any(m.startswith(("verification.core", "verification.report", "llm_runs")) for m in mods)
    monkeypatch.syspath_prepend(str(tmp_path))
    lf = search.check_code(_check_package(tmp_path, "ckcode"))
    assert set(lf["modules"]) == {"ckcode", "ckcode.check", "ckcode.helper"}  # verification.core is not followed
    crlf = search.check_code(_check_package(tmp_path, "ckcode", newline="\r\n"))
    assert crlf == lf
    changed = search.check_code(_check_package(tmp_path, "ckcode", scale="1.1 * x"))
    assert changed["digest"] != lf["digest"]
    assert search.code_changes({"code_modules": lf["modules"]}, changed) == "changed: ckcode.helper"


def _store_search(stmt, out, store, evaluations=6, seed=0):
    """The search of ``stmt`` as the command makes it, its cells computed in this process, then stored."""
    from sim.cli import atomic_write_text
    from verification.engine import search_cells

    for cells in (search_cells.design_cells, search_cells.refine_cells):
        for c in cells(out, [stmt], evaluations, seed):
            c.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(c.path, json.dumps(c.func(*c.args)))
    search_cells.write_results(out, [stmt], evaluations, seed)
    search.store_results(out, store)


def test_a_changed_check_does_not_use_its_stored_search(tmp_path, monkeypatch):
    """A stored search counts only for the code it was made by: once the check's helper changes, the store is
    stale (the report searches here, saying why) and the search folder's cells are computed afresh."""
    from verification.engine import search_cells

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(catalogue, "_EXPLICIT", [])
    monkeypatch.setattr(catalogue, "_CACHE", None)
    (stmt,) = registry.register_module(_check_package(tmp_path, "ckstore"))
    out, store = tmp_path / "se", tmp_path / "store"
    _store_search(stmt, out, store)
    rec, why = search.load_stored(stmt, store)
    assert why == "" and rec["code_digest"] == search.check_code(stmt.module)["digest"]
    assert set(rec["code_modules"]) == {"ckstore", "ckstore.check", "ckstore.helper"}
    res = search.search_statement(stmt, store=store)
    assert "missing" not in res.stored and res.evaluations_split() == (res.stored["refinement_evaluations"],
                                                                       rec["evaluations"])
    assert search_cells.pending_cells(out, [stmt], 6, 0) == 0

    _check_package(tmp_path, "ckstore", scale="3.0 * x")  # the check changes: its helper scales by 3
    importlib.reload(sys.modules["ckstore.helper"])  # as a new process (the next report) would import it
    rec, why = search.load_stored(stmt, store)
    assert rec is None and "was made by other code" in why and "changed: ckstore.helper" in why
    res = search.search_statement(stmt, store=store)
    assert res.stored["missing"] == why and res.evaluations_split()[1] == 0 and res.evaluations > 0
    assert res.best["x <= 1"]["best_ratio"] > 1.0  # the changed check's counterexample, found here
    assert search_cells.pending_cells(out, [stmt], 6, 0) > 0  # the old code's cells are not taken


TINY_DE = Budget("tiny DE", initial=4, refine=2, de_maxiter=1, de_popsize=2, max_refined=2)


def _untimed(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k != "cpu_seconds"}


def test_search_parts_do_not_depend_on_their_order_and_make_up_falsify():
    """The parts of a search with a DE (design, islands, chains) run in reversed order give the same records, and
    merged they are falsify's result; each island and chain draws from its own stream."""
    stmt = registry.get_statement("H.15")  # one conclusion below TARGET after the design and the islands
    parts = search.search_parts(stmt.search.dim, TINY_DE)  # 8 × 2 members -> 16, two islands of 8
    assert parts == [("design", 0), ("de", 0), ("de", 1), ("chain", 0), ("chain", 1)]
    base = [p for p in parts if p[0] != "chain"]
    forward = [search.search_part("H.15", 0, TINY_DE, part, k) for part, k in base]
    backward = [search.search_part("H.15", 0, TINY_DE, part, k) for part, k in reversed(base)][::-1]
    assert [_untimed(r) for r in forward] == [_untimed(r) for r in backward]
    chains = [search.search_part("H.15", 0, TINY_DE, "chain", k, *backward) for k in (1, 0)][::-1]
    assert [_untimed(c) for c in chains] == [_untimed(search.search_part("H.15", 0, TINY_DE, "chain", k, *forward))
                                             for k in (0, 1)]
    assert chains[0]["evaluations"] > 0 and chains[1]["evaluations"] == 0  # one conclusion to refine, not two
    assert forward[1]["best"] != forward[2]["best"]  # the islands have their own streams
    res = falsify(stmt, stmt.search, TINY_DE, seed=0)
    merged = search.search_result(stmt, stmt.search, TINY_DE, 0, forward + chains)
    assert dataclasses.replace(merged, seconds=0.0) == dataclasses.replace(res, seconds=0.0)
    assert res.evaluations == sum(r["evaluations"] for r in forward + chains)


def test_refuted_conclusions_split_documented_findings_from_what_to_act_on():
    """The store's H.19 search holds counterexamples of eq 51: with H.19's SEARCH_FINDINGS they are a documented
    finding (``search`` exits 0 on them), without it they are to be acted on (exit 1)."""
    from verification.engine.search_cells import refuted_conclusions

    rec = json.loads((search.STORE / "H.19.json").read_text())
    stmt = registry.get_statement("H.19")
    (eq51,) = [k for k, v in rec["conclusions"].items() if v.get("counterexamples")]
    assert refuted_conclusions(rec, stmt.search_findings) == ([eq51], [])
    assert refuted_conclusions(rec, {}) == ([], [eq51])
    assert refuted_conclusions({"conclusions": {"a": {"counterexamples": 0}}}, {}) == ([], [])
