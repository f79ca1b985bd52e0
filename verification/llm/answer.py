r"""The answer of the LLM study: the positive-control gate, the shots curve and where Algorithm 1 beats local-only
and FedAvg (``report --llm-gate DIR``, ``report --llm-sweep DIR``, the "The answer" tables of docs/llm-study.md).

Read-only: this module reads what ``llm_runs`` wrote and never imports it (nor torch).

* **The gate** (:func:`read_gate`): a gate folder's ``gate.json`` (``python -m llm_runs gate --out DIR``, its
  summary): the table objective × budget (held-out margin change ``z`` and accuracy with their 95 % bootstrap
  intervals and one-sided p-values, the pre-registered pass), the rule, and the objectives that entered
  (``passes_at``). :func:`export_gate` copies ``gate.json``, ``params.json`` and the cells into the dashboard's folder.
* **The curve** (:func:`sweep_curve`): when the run directories of an LLM sweep hold the shots records
  (``shots_scores.csv``; :mod:`verification.llm.shots` defines them), the pre-registered analysis
  :func:`~verification.llm.shots.shots_report` on them with the plan the sweep states (:func:`shots_plan`: the seeds
  of ``llm_sweep.json``'s ``by_seed``, the budgets of ``params.json``'s ``preset_config.design.budgets``), its
  figure (:func:`~verification.llm.shots.shots_figure`) and, per budget, what the adaptation records say about the
  paper's adaptation hypotheses (:func:`adaptation_by_budget`).
* **Hypotheses at each budget.** The paper's hypotheses across seeds that
  :func:`verification.llm.sweep.hypotheses_across_seeds` reports — eq 71, Lemma H.20 (ii), ``H_Cn`` against random
  partitions (Remark H.8), H.6, the contraction band — concern the training phases (Phase 1, Phase 2: the training
  clients, their clusters and the meta-learned ``w_I``, ``w_II``), which no new client's budget enters: they are
  *budget-free*, one value per seed, the same at every budget. What depends on the budget is the new client's
  adaptation: per budget, :func:`adaptation_by_budget` gives from ``shots_adaptation.csv`` the share of adaptations
  that lower the client's own Chebyshev objective ψ, the ψ-raising ones, the mean ``ψ_K/ψ_0`` and Lemma H.43's step
  condition (``α·L̂0·p₊²/p₋ ≤ 1``, :func:`~verification.llm.shots.h43_ratio`); the trajectory-based adaptation rows
  of the across-seed table (Pipeline 1 − Pipeline 2 gaps, Spearman of the new clients) are per budget only when a
  run's ``trajectory.csv`` tags its adaptation rows with a ``budget`` column (:data:`TRAJECTORY_BUDGET`).
* **The answer** (:func:`answer_sentences`): per budget, Algorithm 1's (Pipeline 1 from ``w_II``) λ-weighted
  held-out accuracy beside local-only, FedAvg and the oracle, the gains with their intervals, Holm-adjusted p-values
  and verdicts, and the share of the oracle's ceiling; and one sentence naming the budgets where the gain over
  local-only and over FedAvg is supported — every number from the report, none written by hand.

Rendering: :func:`gate_markdown`, :func:`gate_html`, :func:`curve_markdown`, :func:`curve_html`.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from verification.engine.dask_engine import CELLS_DIR
from verification.llm.sweep import (
    _html_table,
    _md_table,
    _project_relative,
    replace_folder,
    temporary_sibling,
)

__all__ = ["GATE_JSON", "GATE_KIND", "GATE_HEADER", "EXPORTED_GATE_FILES", "CURVE_FIGURE", "TRAJECTORY_BUDGET", "read_gate",
           "export_gate", "gate_rows", "gate_table", "gate_entered", "shots_plan", "has_shots", "sweep_curve",
           "adaptation_by_budget", "answer_sentences", "curve_table", "gate_markdown", "gate_html", "curve_markdown", "curve_html"]

GATE_JSON = "gate.json"
#: ``gate.json``'s ``gate`` field (``llm_runs.sweeps.gate.GATE_KIND``).
GATE_KIND = "prefalign-verify llm gate"
#: What :func:`export_gate` copies of a gate folder (``params.json`` where there is one), besides its ``cells/``.
EXPORTED_GATE_FILES = (GATE_JSON, "params.json")
#: The curve's figure in the dashboard's ``figures/``.
CURVE_FIGURE = "llm-shots-curve.png"
#: The ``trajectory.csv`` column that would tag a run's adaptation rows with the new client's budget.
TRAJECTORY_BUDGET = "budget"
_GATE_KEYS = ("settings", "table", "passes_at", "rule")


# ------------------------------------------------------------------------------------------------- the gate


def read_gate(folder) -> dict[str, Any]:
    """``folder/gate.json``, checked: ``ValueError`` naming the path when it is missing, not JSON, not a gate's
    summary or lacks one of the fields the dashboard shows."""
    d = Path(folder)
    path = d / GATE_JSON
    if not d.is_dir():
        raise ValueError(f"{str(d)!r} is not a directory")
    if not path.is_file():
        raise ValueError(f"{str(d)!r} is not a gate folder: it has no {GATE_JSON} (python -m llm_runs gate --out DIR "
                         "writes it)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{str(path)!r} cannot be read as JSON ({exc})") from None
    if not isinstance(summary, dict) or summary.get("gate") != GATE_KIND:
        raise ValueError(f"{str(path)!r} is not the summary of `llm gate` (its 'gate' field is not {GATE_KIND!r})")
    missing = [k for k in _GATE_KEYS if k not in summary]
    if missing:
        raise ValueError(f"{str(path)!r} lacks the field(s) {missing}")
    return summary


def export_gate(folder, out_dir) -> Path:
    """Copy :data:`EXPORTED_GATE_FILES` and every cell result (``cells/<objective>/*.json``, each held-out pair's
    margin change) of the gate folder ``folder`` to ``out_dir`` (replaced as a whole), every absolute path inside
    this project's checkout written relative to it; returns ``out_dir``. The copy is a gate folder in its own right:
    ``gate.json`` can be recomputed from its cells, and further draws added to it, without the original folder."""
    src, dst = Path(folder), Path(out_dir)
    read_gate(src)
    if dst.resolve() == src.resolve():
        return dst
    tmp = temporary_sibling(dst)
    for name in EXPORTED_GATE_FILES:
        if (src / name).is_file():
            (tmp / name).write_text(_project_relative((src / name).read_text(encoding="utf-8")), encoding="utf-8")
    for cell in sorted((src / CELLS_DIR).glob("*/*.json")):  # cells/<objective>/b<budget>-d<draw>.json
        target = tmp / cell.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_project_relative(cell.read_text(encoding="utf-8")), encoding="utf-8")
    return replace_folder(tmp, dst)


def _n(v: Any, fmt: str) -> str:
    return "–" if not isinstance(v, (int, float)) or isinstance(v, bool) else format(v, fmt)


def _iv(iv: Any, fmt: str) -> str:
    return f"[{_n(iv[0], fmt)}, {_n(iv[1], fmt)}]" if isinstance(iv, (list, tuple)) and len(iv) == 2 else "–"


#: The columns of the gate's table (:func:`gate_rows`), in the dashboard, the docs and on the screen.
GATE_HEADER = ("objective", "budget", "draws", "margin change z [95 %]", "p (z)", "MDE (z)", "accuracy [95 %]",
                "p (accuracy)", "MDE (accuracy)", "training accuracy", "gate")


def gate_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per (objective, budget) of ``gate.json``'s table: z and accuracy with intervals, p-values and minimum
    detectable effects (``–`` in a gate.json written before they were recorded), the training accuracy and ``pass`` / ``fail`` (``incomplete`` when a draw is missing)."""
    rows = []
    for e in summary["table"]:
        verdict = "incomplete" if e.get("passed") is None else "pass" if e["passed"] else "fail"
        rows.append([str(e["objective"]), str(e["budget"]), f"{e.get('draws', '–')} of {e.get('of_draws', '–')}",
                     f"{_n(e.get('z'), '+.4f')} {_iv(e.get('z_interval'), '+.4f')}", _n(e.get("p_margin"), ".4f"),
                     _n(e.get("mde_margin"), ".4f"),
                     f"{_n(e.get('accuracy'), '.3f')} {_iv(e.get('accuracy_interval'), '.3f')}",
                     _n(e.get("p_accuracy"), ".4f"), _n(e.get("mde_accuracy"), ".3f"),
                     _n(e.get("train_accuracy"), ".3f"), verdict])
    return rows


def gate_table(summary: dict[str, Any]) -> list[str]:
    """The markdown table of :func:`gate_rows`."""
    return _md_table(GATE_HEADER, gate_rows(summary))


def gate_entered(summary: dict[str, Any], lead: str = "Objectives that entered") -> str:
    """The sentence naming the objectives that entered (the smallest budget at which each passed), those that did
    not (every budget decided, none passed) and those not decided yet (a budget with a missing cell, none passed);
    ``lead`` opens it (a gate run as a measurement, not to admit a study, says what passed instead)."""
    passes = summary["passes_at"]
    open_ = {e["objective"] for e in summary.get("table", ()) if e.get("passed") is None}
    inn = [f"{o} (from budget {b})" for o, b in passes.items() if b is not None]
    out = [o for o, b in passes.items() if b is None and o not in open_]
    pending = [o for o, b in passes.items() if b is None and o in open_]
    cells = summary.get("cells") or {}
    done = f" {cells['complete']} of {cells['requested']} cells complete." if "requested" in cells else ""
    wait = f"; not decided yet (cells missing): {', '.join(pending)}" if pending else ""
    return (f"{lead}: {', '.join(inn) if inn else 'none'}; did not: {', '.join(out) if out else 'none'}"
            f"{wait}." + done)


def _gate_intro(summary: dict[str, Any], source: str | None) -> str:
    s = summary["settings"]
    where = f" (copied from {source!r})" if source else ""
    return (f"Read from `gate.json`{where}: oracle models at target λ {s.get('target')} on each candidate objective "
            f"({', '.join(s.get('objectives') or [])}), budgets {s.get('budgets')} pairs per objective, "
            f"{s.get('draws')} draw(s), {s.get('steps')} steps, responses of {s.get('max_response_tokens')} tokens, "
            f"scored on held-out calibration prompts. The rule: {summary['rule']}.")


# ------------------------------------------------------------------------------------------------ the curve


def has_shots(run_dirs: Sequence) -> bool:
    """Whether any of the run directories holds the shots records (``shots_scores.csv``)."""
    from verification.llm.shots import SCORES

    return any((Path(d) / SCORES).is_file() for d in run_dirs)


def shots_plan(sweep_dir) -> tuple[list[int], list[int]]:
    """The curve's plan as the sweep states it: the seeds the sweep was asked for (``llm_sweep.json``'s
    ``by_seed``) and the budgets of its preset (``params.json``'s ``preset_config.design.budgets``); ``ValueError``
    naming the file and the field when one is missing."""
    d = Path(sweep_dir)
    try:
        sweep = json.loads((d / "llm_sweep.json").read_text(encoding="utf-8"))
        seeds = [int(e["seed"]) for e in sweep["by_seed"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{str(d / 'llm_sweep.json')!r}: the plan's seeds (by_seed[].seed) cannot be read ({exc!r})"
                         ) from None
    try:
        params = json.loads((d / "params.json").read_text(encoding="utf-8"))
        budgets = [int(b) for b in params["preset_config"]["design"]["budgets"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{str(d / 'params.json')!r}: the plan's budgets (preset_config.design.budgets) cannot be "
                         f"read ({exc!r})") from None
    return seeds, budgets


def adaptation_by_budget(adaptation: pd.DataFrame) -> list[dict[str, Any]]:
    """Per (budget, method) of ``shots_adaptation.csv``: ``n`` adaptations, ``psi_lowered`` (ψ_K < ψ_0) and
    ``psi_raised`` (ψ_K > ψ_0) counts, ``psi_ratio_mean`` (mean ψ_K/ψ_0 over those with ψ_0 > 0) and ``h43_held``
    (adaptations whose step meets Lemma H.43's condition with the secant L̂0)."""
    from verification.llm.shots import ADAPTING, h43_ratio

    a = adaptation.assign(h43=h43_ratio(adaptation["alpha"], adaptation["L0_hat"], adaptation["p_minus"],
                                        adaptation["p_plus"]) <= 1.0)
    out = []
    for (b, m), g in sorted(a.groupby(["budget", "method"]), key=lambda k: (k[0][0], ADAPTING.index(k[0][1]))):
        pos = g["psi0"] > 0
        out.append({"budget": int(b), "method": str(m), "n": len(g), "psi_lowered": int((g["psiK"] < g["psi0"]).sum()),
                    "psi_raised": int((g["psiK"] > g["psi0"]).sum()),
                    "psi_ratio_mean": float((g.loc[pos, "psiK"] / g.loc[pos, "psi0"]).mean()) if pos.any() else None,
                    "h43_held": int(g["h43"].sum())})
    return out


def _trajectory_budgets(run_dirs: Sequence) -> bool:
    for d in run_dirs:
        path = Path(d) / "trajectory.csv"
        if path.is_file() and TRAJECTORY_BUDGET in pd.read_csv(path, nrows=0).columns:
            return True
    return False


def sweep_curve(sweep_dir, run_dirs: Sequence, figure: Path | str | None = None, *, n_perm: int | None = None
                ) -> dict[str, Any] | None:
    """The shots curve of an LLM sweep (module docstring): None when no run directory holds shots records;
    otherwise ``report`` (:func:`~verification.llm.shots.shots_report` with :func:`shots_plan`), ``figure`` (the
    PNG written to ``figure``, when given), ``adaptation_by_budget``, ``trajectory_budget`` (whether the runs' trajectory
    rows carry a budget) — or ``unavailable``: why the analysis cannot run (the ValueError's message)."""
    from verification.llm import shots

    if not has_shots(run_dirs):
        return None
    try:
        seeds, budgets = shots_plan(sweep_dir)
        records = shots.read_records(run_dirs)
        kw = {} if n_perm is None else {"n_perm": n_perm}
        report = shots.shots_report(records, seeds=seeds, budgets=budgets, **kw)
    except ValueError as exc:
        return {"unavailable": str(exc)}
    out: dict[str, Any] = {"report": report, "adaptation_by_budget": adaptation_by_budget(records.adaptation),
                           "trajectory_budget": _trajectory_budgets(run_dirs), "figure": None}
    if figure is not None:
        out["figure"] = str(shots.shots_figure(report, figure))
    return out


# ------------------------------------------------------------------------------------------------ the answer


def _cell(report: dict[str, Any], method: str, budget: int) -> dict[str, Any]:
    return next(r for r in report["table"] if r["method"] == method and r["budget"] == budget)


def _line(report: dict[str, Any], stat: str, budget: int) -> dict[str, Any]:
    return next(r for r in report["lines"] if r["statistic"] == stat and r["budget"] == budget)


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def _gi(iv: Sequence[float | None]) -> str:
    return f"[{_g(iv[0])}, {_g(iv[1])}]"


def _budget_list(budgets: list[int]) -> str:
    return ", ".join(map(str, budgets)) if budgets else ""


def answer_sentences(report: dict[str, Any]) -> list[str]:
    """Where Algorithm 1 beats local-only and FedAvg, and by how much against the oracle's ceiling: one summary
    sentence, then one sentence per budget; every number from ``report`` (:func:`~verification.llm.shots.shots_report`).
    "Beats" is the pre-registered verdict ``supported`` (Holm-adjusted one-sided p < 0.05)."""
    budgets = report["plan"]["budgets"]
    n = len(report["plan"]["seeds"])
    beats = {c: [b for b in budgets if _line(report, f"gain_over_{c}", b)["verdict"] == "supported"]
             for c in ("local", "fedavg")}
    names = {"local": "local-only", "fedavg": "its cluster's FedAvg model"}
    parts = [f"{names[c]} at budget{'s' * (len(v) != 1)} {_budget_list(v)}" if v else f"{names[c]} at no budget"
             for c, v in beats.items()]
    out = [f"Over {n} seeds and budgets {_budget_list(budgets)} pairs per objective, Algorithm 1 (Pipeline 1 from "
           f"w_II) beats {parts[0]} and {parts[1]} (pre-registered: Holm-adjusted one-sided p < 0.05 over the "
           f"{report['family_size']} tests)."]
    for b in budgets:
        acc = {m: _cell(report, m, b) for m in ("pipeline1_wII", "local", "fedavg", "oracle", "base")}
        gains = []
        for c in ("local", "fedavg"):
            ln = _line(report, f"gain_over_{c}", b)
            gains.append(f"over {names[c].replace('its cluster', 'the cluster')} {ln['estimate']:+.3g} "
                         f"{_gi(ln['interval'])} (Holm p = {ln['p_holm']:.3g}, {ln['verdict']})")
        share = acc["pipeline1_wII"]
        ceiling = ("the oracle is not above the base model, so there is no ceiling to share"
                   if share["ceiling_share"] is None else
                   f"Algorithm 1 reaches {_g(share['ceiling_share'])} {_gi(share['ceiling_share_interval'])} of the "
                   f"oracle's gain over the base model (local-only {_g(acc['local']['ceiling_share'])}, FedAvg "
                   f"{_g(acc['fedavg']['ceiling_share'])})")
        out.append(f"At budget {b}: λ-weighted held-out accuracy {acc['pipeline1_wII']['acc']:.3f} "
                   f"{_gi(acc['pipeline1_wII']['acc_interval'])} for Algorithm 1, {acc['local']['acc']:.3f} local-only, "
                   f"{acc['fedavg']['acc']:.3f} FedAvg, {acc['oracle']['acc']:.3f} the oracle and "
                   f"{acc['base']['acc']:.3f} the base model; gain {gains[0]}, {gains[1]}; {ceiling}.")
    return out


# ------------------------------------------------------------------------------------------------ rendering


def gate_markdown(summary: dict[str, Any], source: str | None = None) -> list[str]:
    """The gate's part of the LLM section: what was run and the rule, the table objective × budget, the objectives
    that entered."""
    return ["### Positive-control gate", "", _gate_intro(summary, source), "", *gate_table(summary), "",
            gate_entered(summary), ""]


def gate_html(summary: dict[str, Any], source: str | None = None) -> str:
    """:func:`gate_markdown` as HTML."""
    esc = html.escape
    return "\n".join(["<h3>Positive-control gate</h3>", f"<p>{esc(_gate_intro(summary, source))}</p>",
                      _html_table(GATE_HEADER, gate_rows(summary)), f"<p>{esc(gate_entered(summary))}</p>"])


_CURVE_HEADER = ("method", "budget", "λ-weighted accuracy [95 %]", "margin change z [95 %]",
                 "share of the oracle's ceiling [95 %]")
_ADAPT_HEADER = ("budget", "method", "adaptations", "ψ lowered", "ψ raised", "mean ψ_K/ψ_0", "H.43 step condition held")
BUDGET_FREE = ("The paper's hypotheses across seeds below — eq 71, Lemma H.20 (ii), H_Cn against random partitions "
               "(Remark H.8), H.6 and the contraction band — concern the training phases (Phase 1 and Phase 2 of the "
               "training clients), which no new client's budget enters: they are budget-free, the same at every "
               "budget. The new client's adaptation depends on the budget; from the adaptation records, at each "
               "budget:")


def _curve_rows(report: dict[str, Any]) -> list[list[str]]:
    return [[r["method"], str(r["budget"]), f"{r['acc']:.3f} {_gi(r['acc_interval'])}",
             f"{r['z']:+.3g} {_gi(r['z_interval'])}",
             "–" if r["ceiling_share"] is None else f"{_g(r['ceiling_share'])} {_gi(r['ceiling_share_interval'])}"]
            for r in sorted(report["table"], key=lambda r: (r["budget"], report["plan"]["methods"].index(r["method"])))]


def curve_table(report: dict[str, Any]) -> list[str]:
    """The markdown table method × budget of the curve: λ-weighted accuracy, margin change and the share of the
    oracle's ceiling, each with its 95 % interval over seeds."""
    return _md_table(_CURVE_HEADER, _curve_rows(report))


def _adapt_rows(curve: dict[str, Any]) -> list[list[str]]:
    return [[str(r["budget"]), r["method"], str(r["n"]), str(r["psi_lowered"]), str(r["psi_raised"]),
             _g(r["psi_ratio_mean"]), f"{r['h43_held']} of {r['n']}"] for r in curve["adaptation_by_budget"]]


def _psi_text(report: dict[str, Any]) -> str:
    a = report["adaptation"]
    by = "; ".join(f"{m}: " + ", ".join(f"{c} at budget {b}" for b, c in d.items() if c)
                   for m, d in a["psi_raised_by_method_budget"].items() if any(d.values()))
    h = a["h43"]
    return (f"ψ-raising adaptations (ψ_K > ψ_0, flagged, kept in every statistic): {a['n_psi_raised']} of "
            f"{a['n_adaptations']}{' (' + by + ')' if by else ''}; Lemma H.43's step condition with the secant L̂0 "
            f"holds in {h['n_held']} and is violated in {h['n_violated']} (of the ψ-raising ones: "
            f"{h['n_violated_psi_raised']}), largest α·L̂0·p₊²/p₋ {_g(h['ratio_max'])}.")


def _trajectory_note(curve: dict[str, Any]) -> str:
    if curve["trajectory_budget"]:
        return ("The runs' trajectory.csv tags its adaptation rows with a budget column; the across-seed table below "
                "pools them over the budgets.")
    return ("The across-seed table's adaptation rows (Pipeline 1 − Pipeline 2, the new clients' Spearman) are not "
            f"per budget: the runs' trajectory.csv has no `{TRAJECTORY_BUDGET}` column on its adaptation rows.")


def _curve_parts(curve: dict[str, Any]) -> dict[str, Any]:
    """The curve's texts in order, shared by the markdown and the HTML."""
    from verification.llm.shots import line_text

    rep = curve["report"]
    return {"intro": (f"The pre-registered analysis (verification.llm.shots) of the sweep's shots records: seeds "
                      f"{rep['plan']['seeds']}, budgets {rep['plan']['budgets']} pairs per objective, objectives "
                      f"{', '.join(rep['plan']['objectives'])}; 95 % t-intervals over seeds."),
            "answer": answer_sentences(rep),
            "tested": [line_text(ln) for ln in rep["lines"]],
            "notes": list(rep.get("notes") or []),
            "descriptive": [line_text(ln) for ln in rep["descriptive"]],
            "psi": _psi_text(rep), "trajectory": _trajectory_note(curve)}


def curve_markdown(curve: dict[str, Any] | None) -> list[str]:
    """The curve's part of the LLM section (empty when the sweep has no shots records): the figure, one line per
    pre-registered statistic, the ψ-raise flags, w_II − w_I and the ceiling shares, the table method × budget,
    then the hypotheses at each budget."""
    if curve is None:
        return []
    lines = ["### The shots curve", ""]
    if "unavailable" in curve:
        return lines + [f"The shots records are there but the pre-registered analysis cannot run: "
                        f"{curve['unavailable']}", ""]
    p = _curve_parts(curve)
    lines += [p["intro"], ""]
    if curve.get("figure"):
        lines += [f"![The shots curve](figures/{CURVE_FIGURE})", ""]
    lines += [" ".join(p["answer"]), "", "#### Pre-registered statistics", ""]
    lines += [f"* {t}" for t in p["tested"]] + [f"* note: {t}" for t in p["notes"]] + [""]
    lines += [f"* {p['psi']}"] + [f"* {t}" for t in p["descriptive"]] + [""]
    lines += ["<details><summary>Accuracy and margin change per method and budget</summary>", "",
              *curve_table(curve["report"]), "", "</details>", ""]
    lines += ["### Hypotheses at each budget", "", BUDGET_FREE, "", *_md_table(_ADAPT_HEADER, _adapt_rows(curve)), "",
              p["trajectory"], ""]
    return lines


def curve_html(curve: dict[str, Any] | None) -> str:
    """:func:`curve_markdown` as HTML."""
    if curve is None:
        return ""
    esc = html.escape
    parts = ["<h3>The shots curve</h3>"]
    if "unavailable" in curve:
        return "\n".join(parts + [f"<p>The shots records are there but the pre-registered analysis cannot run: "
                                  f"{esc(curve['unavailable'])}</p>"])
    p = _curve_parts(curve)
    parts.append(f"<p>{esc(p['intro'])}</p>")
    if curve.get("figure"):
        parts.append(f"<figure><img src='figures/{CURVE_FIGURE}' alt='The shots curve'></figure>")
    parts += [f"<p>{esc(' '.join(p['answer']))}</p>", "<h4>Pre-registered statistics</h4>",
              "<ul>" + "".join(f"<li>{esc(t)}</li>" for t in p["tested"])
              + "".join(f"<li>note: {esc(t)}</li>" for t in p["notes"]) + "</ul>",
              "<ul>" + "".join(f"<li>{esc(t)}</li>" for t in [p["psi"], *p["descriptive"]]) + "</ul>",
              "<details><summary>Accuracy and margin change per method and budget</summary>"
              + _html_table(_CURVE_HEADER, _curve_rows(curve["report"])) + "</details>",
              "<h3>Hypotheses at each budget</h3>", f"<p>{esc(BUDGET_FREE)}</p>",
              _html_table(_ADAPT_HEADER, _adapt_rows(curve)), f"<p>{esc(p['trajectory'])}</p>"]
    return "\n".join(parts)
