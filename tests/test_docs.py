"""The documentation: every statement module meets the docstring contract its page is written from, the worked
example of "Write your own statement" runs as documented, docstring roles resolve, and (marker ``docs``) the site
builds with ``mkdocs build --strict`` with one page per statement."""

from __future__ import annotations

import html
import importlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verification.core import catalogue, registry
from verification.report.docsections import REQUIRED, missing_sections, statement_sections
from verification.report.figures import FIGURE_STATEMENTS, FIGURES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
sys.path.insert(0, str(ROOT / "tools"))
import docs_hooks  # noqa: E402

NUMERIC = [s for s in registry.all_statements() if s.module != registry.SYMBOLIC_MODULE]


@pytest.mark.parametrize("stmt", NUMERIC, ids=lambda s: s.id)
def test_statement_docstring_has_every_section(stmt):
    doc = importlib.import_module(stmt.module).__doc__
    assert missing_sections(doc) == [], f"{stmt.module}: the docstring lacks {missing_sections(doc)}"


def test_section_parser_reads_headings_with_qualifiers_and_inline_references():
    doc = ("X.1 — a title\nthat goes on.\n\nSetting\n    the setting\n\n    more\n\nAssumption (eq 51)\n    ``a``::\n\n"
           "        code\n\nHow it is checked (T-X1)\n    rows\n\nNegative controls (each)\n    broken\n\n"
           "Figure data\n    tables\n\nReference: docs/spec/statements.md#catalogue X.1.\n")
    parsed = statement_sections(doc)
    assert parsed.title == "X.1 — a title that goes on."
    assert [(s.name, s.heading) for s in parsed.sections] == [
        ("Setting", "Setting"), ("Hypotheses", "Assumption (eq 51)"), ("What is checked", "How it is checked (T-X1)"),
        ("Negative control", "Negative controls (each)"), (None, "Figure data"), ("Reference", "Reference")]
    assert parsed.get("Setting")[0].text == "the setting\n\nmore"
    assert parsed.get("Reference")[0].text == "docs/spec/statements.md#catalogue X.1."
    assert missing_sections(doc) == []  # an assumption is all hypotheses: no Guarantee needed
    assert missing_sections(doc.replace("Negative controls (each)", "Controls")) == ["Negative control"]
    assert missing_sections(None) == ["docstring"]
    assert len(REQUIRED) == 5


@pytest.fixture
def example_module(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    mod = importlib.import_module("chebyshev_lipschitz")
    yield mod
    catalogue._EXPLICIT[:] = [s for s in catalogue._EXPLICIT if s.module != mod.__name__]
    registry.all_statements(refresh=True)


def test_worked_example_runs_as_documented(example_module):
    assert missing_sections(example_module.__doc__) == []
    (stmt,) = registry.register_module(example_module)
    assert registry.get_statement("EX.1") is stmt and stmt in registry.all_statements()
    ev = registry.run_statement(stmt, seed=0)
    assert ev.verdict == "holds" and ev.negative_control == "detected"
    assert 1.0 - 1e-6 < ev.tightness <= 1.0 + 1e-8  # the bound is attained (to the rounding of |psi - psi'|)
    assert ev.control.verdict == "violated"  # the control sees the claimed bound fail where it flagged


@pytest.mark.e2e
def test_worked_example_from_the_command_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES), registry.STATEMENTS_ENV: "chebyshev_lipschitz"}
    exe = shutil.which("prefalign", path=str(Path(sys.executable).parent))
    proc = subprocess.run([exe, "verify", "run", "EX.1", "--json", "out.json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads((tmp_path / "out.json").read_text())
    assert row["id"] == "EX.1" and row["verdict"] == "holds" and row["negative_control"] == "detected"


def test_a_statement_module_without_the_contract_is_refused(tmp_path, monkeypatch):
    (tmp_path / "not_a_statement.py").write_text("NAME = 'no id, no run'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.StatementImportError, match="lacks STATEMENT_ID, run"):
        registry.register_module("not_a_statement")
    with pytest.raises(registry.StatementImportError, match="cannot import statement module no_such_module"):
        registry.register_module("no_such_module")


def test_roles_resolve_relative_to_module_and_class(caplog):
    assert docs_hooks.resolve("lp_direction", "sim.direction") == "sim.direction.lp_direction"
    assert docs_hooks.resolve("near_active_set", "sim.algorithm") == "sim.hull.near_active_set"  # imported there
    assert docs_hooks.resolve("minibatch", "sim.source", "sim.source.ClientSource") == \
        "sim.source.ClientSource.minibatch"
    assert docs_hooks.resolve("sim.problems.ClientSamples", "sim.cluster") == "sim.problems.quadratic.ClientSamples"
    assert docs_hooks.resolve("ValueError", "sim.cli") == "builtins.ValueError"
    assert docs_hooks.resolve("no_such_thing", "sim.direction") is None
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.prefalign"):
        text = docs_hooks.convert_roles("see :func:`~sim.direction.lp_direction`, :class:`ValueError` and "
                                        ":func:`sim.direction.\n    lp_direktion`::", "sim.hull")
    assert '<autoref identifier="sim.direction.lp_direction" optional><code>lp_direction</code></autoref>' in text
    assert "`ValueError`" in text and text.endswith(":")
    assert [r.getMessage() for r in caplog.records] == [
        "broken reference :func:`sim.direction.lp_direktion` in the docstring of sim.hull"]


def test_llm_page_lists_the_actions_of_the_llm_parser():
    """The LLM runs page lists the actions of ``prefalign llm`` from its parser (an action added to ``python -m
    llm_runs`` appears there by itself), each linked to its options on the command-line page."""
    from llm_runs.__main__ import build_parser

    assert "{{ actions llm }}" in (ROOT / "docs" / "llm-runs.md").read_text()
    leaves = [" ".join(w) for w, _, _ in docs_hooks._leaf_actions(build_parser())]
    assert {"data build", "data stats", "probe dpo"} <= set(leaves)
    table = docs_hooks.actions_table("llm").splitlines()
    assert len(table) == 2 + len(leaves)
    for row, leaf in zip(table[2:], leaves, strict=True):
        title = f"prefalign llm {leaf}"
        assert row.startswith(f"| [`{title}`](cli.md#{docs_hooks.slug(title)}) | ")
    assert f"## `prefalign llm {leaves[-1]}`" in docs_hooks.cli_page()


@pytest.mark.parametrize("text", ["eq48|J\\J*=0", "|log(m lhat) - beta| <= log(m/c)", "a `b` c"])
def test_code_cells_show_their_text_unchanged(text):
    """A conclusion name in a table cell shows as written: its pipes stay inside the code span, no backslash."""
    import markdown

    page = markdown.markdown(f"| x | y |\n|---|---|\n| {docs_hooks.code_cell(text)} | 1 |\n", extensions=["tables"])
    cell = page.split("<td>")[1].split("</td>")[0]
    assert cell == f"<code>{html.escape(text, quote=False)}</code>"


def test_every_figure_names_the_statements_it_illustrates():
    assert set(FIGURE_STATEMENTS) == set(FIGURES)
    ids = {s.id for s in registry.all_statements()}
    assert all(set(v) <= ids for v in FIGURE_STATEMENTS.values())


def test_readme_points_at_the_docs():
    readme = (ROOT / "README.md").read_text()
    intro = readme.split("\n## ", 2)[:2]  # the introduction and the first section
    assert any("make docs" in part for part in intro) and "docs/" in readme


@pytest.mark.docs
def test_site_builds_strictly_with_a_page_per_statement(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PREFALIGN_DOCS_REPORT": str(tmp_path / "no-report")}
    site = tmp_path / "site"
    proc = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir",
                           str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for s in registry.all_statements():
        sub = "statements/symbolic" if s.module == registry.SYMBOLIC_MODULE else "statements"
        page = site / sub / docs_hooks.slug(s.id) / "index.html"
        assert page.is_file(), f"no page for {s.id}"
        assert "Verdict:" in page.read_text(encoding="utf-8")
    h16 = (site / "statements" / "h-16" / "index.html").read_text(encoding="utf-8")
    for section in ("Setting", "Hypotheses", "Guarantee", "What is checked", "Negative control", "Reference"):
        assert f">{section}<" in h16 or f'id="{section.lower().replace(" ", "-")}"' in h16
    assert "FINDING" in h16 and r"<code>eq48|J\J*=0</code>" in h16
    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    assert "prefalign verify run" in cli and "exit status:" in cli
    assert 'href="../cli/#prefalign-llm-data-stats"' in (site / "llm-runs" / "index.html").read_text(encoding="utf-8")
    assert (site / "api" / "direction" / "index.html").read_text(encoding="utf-8").count("lp_direction") > 3


# ------------------------------------------------------------------------------------------- generated tables


def test_pages_use_the_generated_tables():
    """The tables a tool's output file holds are rendered from it, not copied onto the pages."""
    for page, names in {"performance.md": ["bench"], "mutation.md": ["mutation"], "dashboard.md": ["dashboard"],
                        "llm-study.md": ["llm-study", "llm-study-cost", "llm-gate", "llm-curve", "llm-answer"]}.items():
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        for name in names:
            assert f"{{{{ table {name} }}}}" in text and name in docs_hooks.TABLES


def _benchmark(m: int, variant: str, n: int, best_us: float, median_us: float) -> dict:
    """One entry of pytest-benchmark's JSON as ``tests/sim/test_bench_direction.py`` writes it."""
    return {"name": f"test_bench_lp_kernel[{m}-{variant}]", "params": {"m": m, "variant": variant},
            "extra_info": {"m": m, "variant": variant, "instances_per_round": n, "us_per_lp": best_us},
            "stats": {"min": best_us * n / 1e6, "median": median_us * n / 1e6, "rounds": 15}}


def test_bench_table_matches_the_pytest_benchmark_json(tmp_path):
    us = {"highs": (1630.0, 1700.0, 4), "numpy": (4.16, 4.3, 1024), "compiled": (0.418, 0.45, 1024),
          "loop": (0.522, 0.53, 1024), "single": (21.0, 22.0, 256), "single_numpy": (560.0, 580.0, 8)}
    benches = [_benchmark(2, v, n, b, med) for v, (b, med, n) in us.items()]
    benches += [_benchmark(3, "highs", 4, 1510.0, 1600.0),
                {"name": "test_bench_table", "extra_info": {}, "stats": {"min": 1e-7, "median": 1e-7}}]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({
        "machine_info": {"node": "vm", "processor": "", "cpu": {"brand_raw": "AMD EPYC", "count": 2}},
        "commit_info": {"id": "0123456789abcdef", "dirty": True}, "datetime": "2026-12-02T10:00:00+00:00",
        "benchmarks": benches}))
    lines = docs_hooks.bench_table(path).splitlines()
    assert "2026-12-02T10:00:00+00:00" in lines[0] and "AMD EPYC (2 logical CPUs, host `vm`)" in lines[0]
    assert "commit `0123456` with uncommitted changes" in lines[0] and str(path) in lines[0]
    rows = [ln for ln in lines if ln.startswith("| 2 |") or ln.startswith("| 3 |")]
    assert rows == ["| 2 | 1630 (1700) | 4.16 (4.3) | 0.418 (0.45) | 0.522 (0.53) | 21 (22) | 560 (580) | 3900× | 78× "
                    "| 0.80 |",
                    "| 3 | 1510 (1600) | – | – | – | – | – | – | – | – |"]
    missing = docs_hooks.bench_table(tmp_path / "none.json")
    assert "none.json" in missing and "`make bench` writes it" in missing


def test_mutation_table_matches_the_tools_json(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("mutation_tool_docs", ROOT / "tools" / "mutation.py")
    mt = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mt)  # its dataclasses look their module up
    spec.loader.exec_module(mt)
    args = mt.build_parser().parse_args(["--files", "sim/hull.py", "--n", "60", "--seed", "0"])
    rep = mt.FileReport("sim/_lp_compiled.py", "tests/sim/test_direction_twin.py", 2148, 3, 60, 12.0, 120.0,
                        env={"NUMBA_DISABLE_JIT": "1"})
    for k, status in enumerate(["killed"] * 51 + ["timeout"] + ["equivalent"] * 8):
        rep.results.append({"id": str(k), "line": k, "col": 0, "status": status})
    path = tmp_path / "mutation.json"
    path.write_text(json.dumps({"meta": mt.run_meta(args), "files": [rep.to_json()]}))
    meta = json.loads(path.read_text())["meta"]
    lines = docs_hooks.mutation_table(path).splitlines()
    assert meta["date"] in lines[0] and meta["cpu"] in lines[0] and "`--n 60 --seed 0 --jobs 1`" in lines[0]
    assert lines[-1] == ("| sim/_lp_compiled.py (`NUMBA_DISABLE_JIT=1`) | `test_direction_twin.py` | 60 of 2148 | 51 | 0 "
                         "| 1 | 8 | 0 | 100.0 % |")
    assert "`make mutation` writes it" in docs_hooks.mutation_table(tmp_path / "none.json")


def test_llm_study_tables_match_the_committed_sweep():
    from verification.llm.sweep import personalisation_statistics, sweep_run_dirs

    sweep = ROOT / "reports" / "llm-sweep"
    cells = [json.loads(p.read_text()) for p in sorted((sweep / "cells").glob("*/*.json"))]
    stats = docs_hooks.llm_study_table(ROOT / "reports").splitlines()
    assert "`reports/llm-sweep/`" in stats[0] and all(c["cpu"] in stats[0] for c in cells)
    lines = personalisation_statistics(sweep_run_dirs(sweep))["lines"]
    rows = [ln for ln in stats if ln.startswith("| ") and "statistic |" not in ln]
    assert len(rows) == len(lines) == 3
    for row, line in zip(rows, lines, strict=True):
        lo, hi = line["interval"]
        assert row.startswith(f"| {line['label']}") and row.endswith(f" | {line['verdict']} |")
        for x in (line["estimate"], lo, hi, line["p_value"], line["mde"]):
            assert docs_hooks._g(x) in row
    cost = docs_hooks.llm_study_cost_table(ROOT / "reports")
    for c in cells:
        assert (f"| {c['seed']} | {c['status']} | {c['seconds']:.0f} | {c['cpu_seconds']:.0f} | "
                f"{c['gradient_evaluations']['done']} | {c['stage_seconds']['psi_star_estimate']:.0f} |") in cost
    total = json.loads((sweep / "llm_sweep.json").read_text())
    assert f"took {total['last_run']['wall_seconds']:.0f} s" in cost


def test_the_answer_tables_from_a_gate_and_a_curve(tmp_path):
    """The "The answer" tables: computed from a dashboard folder's gate.json and sweep copy with shots records, by
    the dashboard's own functions; the committed dashboard shows its gate where it has one, and its sweep (the old
    study's, without shots records) no curve."""
    import shutil

    from tests.verification.llm import test_llm_answer as T
    from verification.llm import answer
    from verification.llm.shots import line_text
    from verification.llm.sweep import sweep_run_dirs

    for name in ("llm-curve", "llm-answer"):
        assert docs_hooks.TABLES[name](ROOT / "reports").startswith("*No results exist yet: ")
    committed = docs_hooks.TABLES["llm-gate"](ROOT / "reports")
    if (ROOT / "reports" / "llm-gate" / "gate.json").is_file():
        assert committed.startswith("From `reports/llm-gate/gate.json` (committed ") and "| formality | 64 |" in committed
    else:
        assert committed.startswith("*No results exist yet: ")
    folder = tmp_path / "reports"
    T.write_gate(folder / "llm-gate")
    sweep = T.make_shots_sweep(tmp_path / "sweep")
    shutil.copytree(sweep, folder / "llm-sweep")
    gate = docs_hooks.llm_gate_table(folder)
    assert "| positivity | 16 | 2 of 2 | +0.0123 [-0.0077, +0.0323] | 0.0004 |" in gate
    assert "Objectives that entered: positivity (from budget 16); did not: density." in gate
    rep = answer.sweep_curve(folder / "llm-sweep", sweep_run_dirs(folder / "llm-sweep"))["report"]
    curve = docs_hooks.llm_curve_table(folder)
    assert all(f"- {line_text(ln)}" in curve for ln in rep["lines"] + rep["descriptive"])
    assert "\n".join(answer.curve_table(rep)) in curve
    assert docs_hooks.llm_answer_table(folder) == "\n\n".join(answer.answer_sentences(rep))


def test_dashboard_excerpt_matches_the_committed_dashboard():
    results = {r["id"]: r for r in json.loads((ROOT / "reports" / "results.json").read_text())}
    table = docs_hooks.dashboard_table(ROOT / "reports").splitlines()
    assert table[0].startswith("From `reports/README.md`")
    rows = [ln for ln in table if ln.startswith("| H.")]
    assert [r.split(" | ")[0][2:] for r in rows] == list(docs_hooks.DASHBOARD_IDS)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        r = results[cells[0]]
        assert cells[2].strip("*").lower().startswith(r["verdict"])
        assert cells[3] == f"{r['instances'] - r['excluded']} / {r['excluded']}" and cells[4] == f"{r['tightness']:.4g}"
        found, _, kept = cells[7].partition(" (")  # "194 (20 kept)" where the file keeps fewer than were found
        assert cells[6] == r["negative_control"] and found == str(r["counterexamples"])
        if kept:
            cex = json.loads((ROOT / "reports" / "counterexamples" / f"{cells[0]}.json").read_text())
            assert kept == f"{len(cex['counterexamples'])} kept)" and len(cex["counterexamples"]) < int(found)


def test_report_scaling_table_says_which_scale_is_not_measured_yet(tmp_path):
    """The Performance page's table of the report on Dask: a scale without its JSON reads "not measured yet" with
    the command that measures it, beside the table of the scales measured."""
    none = docs_hooks.report_scaling_table(tmp_path)
    assert none.count("not measured yet") == 2 and "--scale paper --workers 1 2" in none and "|" not in none
    rec = {"scale": "default", "cpu": "CPU X", "date": "2025-01-01", "cells": 3, "cells_cpu_seconds": 2.0,
           "runs": [{"workers": 1, "wall_seconds": 2.0, "cpu_seconds": 2.0, "efficiency": 1.0}],
           "critical_path": {"cpu_seconds": 1.0}, "largest_cell": {"key": "H.9/check", "share": 0.5},
           "predicted_wall_seconds": {"8": 1.0, "32": 1.0, "128": 1.0}, "results_equal": True}
    (tmp_path / "report_scaling_default.json").write_text(json.dumps(rec), encoding="utf-8")
    one = docs_hooks.report_scaling_table(tmp_path)
    assert "| default | CPU X, 2025-01-01 | 1 |" in one and "H.9/check (50 %)" in one
    assert one.count("not measured yet") == 1 and "report_scaling_paper.json" in one
