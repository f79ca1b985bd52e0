"""Generated pages of the documentation site (MkDocs ``hooks:``) and the griffe extension of its API pages.

* One page per statement (``statements/<id>.md``), written from the statement module's docstring split into its
  canonical sections (:mod:`verification.report.docsections`), with the statement's verdict, tightness, conclusions and
  negative control from the regression baseline shipped in the package (``verification/data/
  baseline_results.json``) and the figures of the dashboard that illustrate it (``reports/figures/``, drawn by
  ``make report``; ``PREFALIGN_DOCS_REPORT`` names another dashboard folder). Nothing on these pages is written
  by hand: a number that changes changes with the baseline.
* One page per symbolic identity S1-S26 and an index of all statements.
* ``cli.md``: the ``--help`` of ``prefalign`` and of every sub-command, from the parsers themselves.
* Tables of the hand-written pages that a tool's output file holds (``{{ table NAME }}``, :data:`TABLES`): the last
  ``make bench`` (``reports/bench.json``), the last ``make mutation`` (``reports/mutation.json``), the LLM study
  (``reports/llm-sweep/``) and the top of the committed dashboard (``reports/README.md``), each rendered from that file with its source, date and machine, never copied by hand.
* :class:`SphinxRoles`: the docstrings use Sphinx roles (``:func:`lp_direction```); the extension resolves each
  target by importing it, relative to the module (and class) whose docstring names it, and writes a cross-reference
  to its API entry. A target that names nothing is a broken reference: a warning, which fails
  ``mkdocs build --strict``.
"""

from __future__ import annotations

import builtins
import dataclasses
import html
import importlib
import inspect
import json
import logging
import os
import re
import subprocess
from pathlib import Path

import griffe

log = logging.getLogger("mkdocs.plugins.prefalign")

ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("sim", "verification", "llm_runs", "prefalign")
ROLE = re.compile(r":(?:py:)?(func|class|meth|mod|data|attr|obj|exc|const):`(~?)([^`]+)`")

# ------------------------------------------------------------------------------------------- Sphinx roles


def _lookup(path: str):
    """The object a dotted path names (importing its module), or ``None``."""
    parts = path.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif dataclasses.is_dataclass(obj) and attr in obj.__dataclass_fields__:
                obj = obj.__dataclass_fields__[attr]
            else:
                return None
        return obj
    return None


def _identifier(obj, found: str) -> str:
    """The identifier of ``obj``'s API entry: where it is defined (functions, classes, modules), else ``found``."""
    if inspect.ismodule(obj):
        return obj.__name__
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if (inspect.isclass(obj) or inspect.isfunction(obj)) and module and qualname and "<locals>" not in qualname:
        ident = f"{module}.{qualname}"
        if not any(p.startswith("_") for p in ident.split(".")):
            return ident
    return found


def resolve(target: str, module: str, cls: str | None = None) -> str | None:
    """The identifier that ``target`` names in a docstring of ``module`` (and class ``cls``, a dotted path):
    tried relative to the class, the module and its parent packages, then as written. ``None``: nothing."""
    target = target.strip().lstrip(".")
    scopes = ([cls] if cls else []) + [".".join(module.split(".")[:k]) for k in range(module.count(".") + 1, 0, -1)]
    for path in [f"{s}.{target}" for s in scopes] + [target]:
        obj = _lookup(path)
        if obj is not None:
            return _identifier(obj, path)
    if hasattr(builtins, target):
        return f"builtins.{target}"
    return None


def convert_roles(text: str, module: str, cls: str | None = None, where: str = "") -> str:
    """``text`` with every Sphinx role replaced by Markdown: a cross-reference to the project's API entry (an
    optional autoref: plain code where the entry is not on the site), plain code for an object of another package;
    a target that names nothing is logged as a warning (``where`` says whose docstring). reST literal-block markers
    (``::``) become a colon."""

    def repl(m: re.Match) -> str:
        short, target = m.group(2) == "~", re.sub(r"\s+", "", m.group(3))
        shown = target.split(".")[-1] if short else target
        ident = resolve(target, module, cls)
        if ident is None:
            log.warning(f"broken reference :{m.group(1)}:`{target}` in the docstring of {where or module}")
            return f"`{shown}`"
        if ident.split(".")[0] not in PROJECT_PACKAGES:
            return f"`{shown}`"
        return (f'<autoref identifier="{html.escape(ident)}" optional><code>{html.escape(shown)}</code>'
                "</autoref>")

    text = ROLE.sub(repl, text)
    text = re.sub(r"(?m)(\S)::$", r"\1:", text)
    return re.sub(r"(?m)^(\s*)::$", "", text)


class SphinxRoles(griffe.Extension):
    """Griffe extension (mkdocstrings ``extensions:``): Sphinx roles in the docstrings of the project's packages
    become cross-references (:func:`convert_roles`)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        self._convert(pkg)

    def _convert(self, obj) -> None:
        if obj.is_alias:
            return
        if obj.docstring is not None:
            cls = obj.path if obj.is_class else (obj.parent.path if obj.parent is not None and obj.parent.is_class
                                                 else None)
            obj.docstring.value = convert_roles(obj.docstring.value, obj.module.path, cls, where=obj.path)
        for member in obj.members.values():
            self._convert(member)


# ------------------------------------------------------------------------------------------- statement pages

VERDICT_ADMONITION = {"holds": "success", "finding": "warning", "violated": "failure", "vacuous": "danger",
                      "error": "bug"}
BASELINE_NOTE = ("the regression baseline shipped in the package, `verification/data/baseline_results.json`: "
                 "`prefalign verify run` of every statement at seed 0 with the pinned versions of "
                 "`constraints.txt`")


def slug(stmt_id: str) -> str:
    """The page name of a statement id: ``H.9`` -> ``h-9``, ``H.39-41`` -> ``h-39-41``, ``ThmA`` -> ``thma``."""
    return re.sub(r"[^a-z0-9]+", "-", stmt_id.lower()).strip("-")


def _fmt(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _verdict_box(row: dict | None) -> list[str]:
    if row is None:
        return ['!!! note "No baseline row"', "    This statement is not in the shipped baseline yet: "
                "regenerate the baseline (see [Regression in your CI](../regression.md)).", ""]
    verdict = row["verdict"]
    label = "FINDING: the literal statement is false; the repaired statement holds" if verdict == "finding" else verdict
    facts = [f"tightness **{_fmt(row['tightness'])}**", f"{row['instances']} instance(s) with the hypotheses held",
             f"{row['excluded']} excluded", f"negative control **{row['negative_control']}**",
             f"{row['counterexamples']} counterexample(s)"]
    return [f'!!! {VERDICT_ADMONITION.get(verdict, "note")} "Verdict: {label}"',
            "    " + " · ".join(facts),
            "",
            f"    From {BASELINE_NOTE}; `prefalign verify run {row['id']}` reproduces it.", ""]


def code_cell(text) -> str:
    """``text`` as a code span in a Markdown table cell. The table extension keeps the pipes inside a code span, so
    none is escaped (a backslash would show); a text with a backtick gets a double-backtick span."""
    text = " ".join(str(text).split())
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _conclusions_table(row: dict | None) -> list[str]:
    if not row or not row.get("conclusions"):
        return []
    out = ["## Conclusions", "", "| conclusion | kind | tightness | held / excluded | counterexamples | power |",
           "|---|---|---|---|---|---|"]
    for c in row["conclusions"]:
        power = (c.get("power") or {}).get("status", "–")
        out.append(f"| {code_cell(c['name'])} | {c['kind']} | {_fmt(c.get('tightness'))} | {c['instances']} / {c['excluded']} | "
                   f"{c['counterexamples']} | {power} |")
    return out + ["", "Power: whether a bound made too small by half is detected by the same run "
                  "(`prefalign verify power`).", ""]


def _figures(stmt_id: str, figures: dict[str, tuple[str, str]], names: dict[str, tuple[str, ...]]) -> list[str]:
    mine = [f for f, ids in names.items() if stmt_id in ids]
    if not mine:
        return []
    out = ["## Figures", ""]
    if any(f in figures for f in mine):
        out += ["From the dashboard that `make report` (`prefalign verify report --out reports`) writes, with the figure "
                "data of its own run of the checks (same seed as the baseline).", ""]
    for f in mine:
        if f in figures:
            caption = figures[f][1]
            out += [f"![{caption}](figures/{f})", "", f"*{caption}*", ""]
        else:
            out += [f"* `{f}` is drawn by `make report` (into `reports/figures/`); this site was built without a "
                    "dashboard. `make report docs` shows it here.", ""]
    return out


def statement_page(stmt, row: dict | None, figures, figure_names) -> str:
    """The Markdown page of a statement module: title, verdict, the docstring's sections in canonical order,
    conclusions, figures, the source and the command that reproduces it."""
    from verification.report.docsections import SECTIONS, statement_sections

    mod = importlib.import_module(stmt.module)
    doc = statement_sections(mod.__doc__ or "")
    conv = lambda text: convert_roles(text, stmt.module, where=stmt.module)  # noqa: E731
    lines = [f"# {stmt.id} — {stmt.name}", "", conv(doc.title), ""] + _verdict_box(row)
    for name in SECTIONS:
        for sec in doc.get(name):
            lines += [f"## {name}", ""]
            if sec.heading.lower() != name.lower() and not sec.heading.startswith("Reference"):
                lines += [f"*{conv(sec.heading)}*", ""]
            lines += [conv(sec.text), ""]
        if name == "Negative control":
            lines += _conclusions_table(row) + _figures(stmt.id, figures, figure_names)
    for sec in doc.sections:
        if sec.name is None:
            lines += [f"## {conv(sec.heading)}", "", conv(sec.text), ""]
    path = stmt.module.replace(".", "/") + ".py"
    lines += ["## Run it", "", "```bash", f"prefalign verify run {stmt.id} --json {slug(stmt.id)}.json",
              f"prefalign verify power {stmt.id}", "```", "",
              f"Source: `{path}` (`run`, `negative_control`, `Config`).", ""]
    return "\n".join(lines)


def symbolic_page(stmt, row: dict | None) -> str:
    """The page of a symbolic identity: its statement (the function's docstring), the method, the sub-checks."""
    sym = importlib.import_module("verification.statements.symbolic")
    fn = getattr(sym, stmt.id.lower(), None)
    doc = inspect.getdoc(fn) or stmt.name
    lines = [f"# {stmt.id} — {stmt.name}", "", convert_roles(doc, "verification.statements.symbolic"), ""] + _verdict_box(row)
    checks = ((row or {}).get("details") or {}).get("checks") or {}
    if checks:
        lines += ["## Sub-checks", "", "| sub-check | verified | residual |", "|---|---|---|"]
        for name, c in checks.items():
            lines.append(f"| {code_cell(name)} | {'yes' if c.get('ok') else '**no**'} | "
                         f"{code_cell(c.get('residual', ''))} |")
        lines.append("")
    lines += _conclusions_table(row)
    lines += ["## Method", "", "Every identity is decided by sympy as described in "
              "[the symbolic identities](../index.md#symbolic-identities): "
              + convert_roles(sym.__doc__.split("\n\n")[2], "verification.statements.symbolic").replace("\n", " "), "",
              "```bash", f"prefalign verify run {stmt.id}", "```", ""]
    return "\n".join(lines)


def index_page(stmts, rows: dict[str, dict]) -> str:
    head = ["| statement | name | verdict | tightness | negative control | counterexamples |",
            "|---|---|---|---|---|---|"]

    def line(s, link):
        r = rows.get(s.id)
        verdict = (f"**{r['verdict'].upper()}**" if r and r["verdict"] != "holds" else (r or {}).get("verdict", "–"))
        return (f"| [{s.id}]({link}) | {s.name.replace('|', chr(92) + '|')} | {verdict} | "
                f"{_fmt((r or {}).get('tightness'))} | {(r or {}).get('negative_control', '–')} | "
                f"{(r or {}).get('counterexamples', '–')} |")

    numeric = [s for s in stmts if s.module != "verification.statements.symbolic"]
    symbolic = [s for s in stmts if s.module == "verification.statements.symbolic"]
    return "\n".join(
        ["# Statements", "",
         "Every statement of the appendix is an executable check: its hypotheses monitored, its conclusion evaluated "
         "on the instances where they held, its tightness reported, and a negative control that breaks a hypothesis "
         "on purpose to show the check can fail. Each page below is written from the statement module's docstring "
         f"and shows the verdict of {BASELINE_NOTE}. How to read a verdict: [The dashboard]"
         "(../dashboard.md#how-to-read-a-verdict).", "",
         "## Statements of the appendix", ""] + head + [line(s, f"{slug(s.id)}.md") for s in numeric]
        + ["", "## Symbolic identities", "",
           "The identities S1–S26 of the specification ([Symbolic identities](../spec/identities.md)), checked with "
           "sympy (`verification.statements.symbolic`).", ""]
        + head + [line(s, f"symbolic/{slug(s.id)}.md") for s in symbolic] + [""])


# ------------------------------------------------------------------------------------------- command line


def _leaf_actions(parser, words: tuple[str, ...] = ()):
    """``(words, help, parser)`` of every action of ``parser`` that has no sub-actions, depth first, in the order
    the parser defines them (``(("data", "build"), ...)``); read from the parser, so a new action appears by itself."""
    from sim.cli import sub_commands

    for name, text, sub in sub_commands(parser):
        if sub_commands(sub):
            yield from _leaf_actions(sub, (*words, name))
        else:
            yield (*words, name), text, sub


def _command_parser(name: str):
    """The parser of ``prefalign NAME`` (its package's own ``build_parser``, with the ``prefalign`` name)."""
    from prefalign.__main__ import COMMANDS

    return importlib.import_module(COMMANDS[name].module).build_parser(f"prefalign {name}")


def actions_table(name: str) -> str:
    """A Markdown table of the actions of ``prefalign NAME``, each with its help and a link to its options on
    the command-line page (``{{ actions NAME }}`` on a hand-written page)."""
    rows = ["| command | what it does |", "|---|---|"]
    for words, text, _ in _leaf_actions(_command_parser(name)):
        title = " ".join(("prefalign", name, *words))
        rows.append(f"| [`{title}`](cli.md#{slug(title)}) | {text.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def cli_page() -> str:
    """``--help`` of every command, from the parsers (the exit status is in each)."""
    os.environ["COLUMNS"] = "110"  # argparse wraps at the terminal width; the page has a fixed one
    from prefalign.__main__ import COMMANDS, build_parser

    def block(title: str, parser, python_m: str | None) -> list[str]:
        out = [f"## `{title}`", ""]
        if python_m:
            out += [f"Also `{python_m}`.", ""]
        return out + ["```text", parser.format_help().rstrip(), "```", ""]

    lines = ["# Command line", "",
             "`pip install prefalign-verify` (or `make venv`) installs one command, `prefalign`, whose sub-commands "
             "are the command lines of the three packages; each also runs as `python -m MODULE`. Every command "
             "exits 0 on success, 1 when it ran and what it checks failed, 2 on a usage error (one line on stderr "
             "naming the argument, before any work) and 130 when interrupted. The help texts below are generated "
             "from the parsers.", ""]
    lines += block("prefalign", build_parser(), None)
    for name, cmd in COMMANDS.items():
        parser = _command_parser(name)
        lines += block(f"prefalign {name}", parser, cmd.python_m)
        for words, _, sub in _leaf_actions(parser):
            lines += block(" ".join(("prefalign", name, *words)), sub, " ".join((cmd.python_m, *words)))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- generated tables


def _report_folder() -> Path:
    """The dashboard folder the generated tables read (``PREFALIGN_DOCS_REPORT``, default ``reports/``)."""
    return Path(os.environ.get("PREFALIGN_DOCS_REPORT", ROOT / "reports"))


def _shown(path: Path) -> str:
    """``path`` relative to the checkout where it lies inside it, else as given."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def _g(x, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits, whole numbers from 100 on (``1630``, ``4.16``, ``0.418``)."""
    if x is None:
        return "–"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.{digits}g}"


def _absent(path: Path, make: str, what: str) -> str:
    return (f"*No `{_shown(path)}` in this checkout: `{make}` writes it ({what}, not committed), and `make docs` "
            "then shows its table here. The recorded measurement on this page names the machine and date it was "
            "measured on.*")


#: The variants of ``tests/sim/test_bench_direction.py`` in the order of its table, with their column names.
BENCH_VARIANTS = {"highs": "HiGHS", "numpy": "numpy batch", "compiled": "compiled batch", "loop": "straight loop",
                  "single": "single call", "single_numpy": "single call, numpy"}


def bench_table(path: Path) -> str:
    """The LP kernel's table of a pytest-benchmark JSON (``make bench`` writes ``reports/bench.json``): µs per LP,
    best round and median, of every ``test_bench_lp_kernel`` case (its ``extra_info``: ``m``, ``variant``,
    ``instances_per_round``) and the ratios of ``tests/sim/test_bench_direction.py``'s table, with the file's date,
    CPU and commit."""
    if not path.is_file():
        return _absent(path, "make bench", "pytest-benchmark's JSON")
    data = json.loads(path.read_text(encoding="utf-8"))
    us: dict[tuple[int, str], tuple[float, float]] = {}
    for b in data.get("benchmarks", []):
        info = b.get("extra_info") or {}
        if b.get("name", "").startswith("test_bench_lp_kernel[") and info.get("instances_per_round"):
            n = info["instances_per_round"]
            us[info["m"], info["variant"]] = (b["stats"]["min"] / n * 1e6, b["stats"]["median"] / n * 1e6)
    machine = data.get("machine_info") or {}
    cpu = machine.get("cpu") or {}
    commit = data.get("commit_info") or {}
    lines = [f"From `{_shown(path)}` (pytest-benchmark's JSON of `make bench`), {data.get('datetime', 'no date')}, "
             f"{cpu.get('brand_raw') or machine.get('processor') or 'CPU not recorded'} "
             f"({cpu.get('count', '?')} logical CPUs, host `{machine.get('node', '?')}`), commit "
             f"`{(commit.get('id') or '?')[:7]}`{' with uncommitted changes' if commit.get('dirty') else ''}: µs per "
             "LP, best round (median in brackets); the load is not recorded.", "",
             "| m | " + " | ".join(BENCH_VARIANTS.values()) + " | HiGHS / compiled batch | HiGHS / single call | "
             "compiled batch / loop |", "|---" * (len(BENCH_VARIANTS) + 4) + "|"]

    def ratio(a: str, b: str, m: int, fmt: str) -> str:
        if (m, a) not in us or (m, b) not in us:
            return "–"
        return format(us[m, a][0] / us[m, b][0], fmt) + ("×" if fmt == ".0f" else "")

    for m in sorted({m for m, _ in us}):
        cells = [f"{_g(us[m, v][0])} ({_g(us[m, v][1])})" if (m, v) in us else "–" for v in BENCH_VARIANTS]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {ratio('highs', 'compiled', m, '.0f')} | "
                     f"{ratio('highs', 'single', m, '.0f')} | {ratio('compiled', 'loop', m, '.2f')} |")
    if not us:
        lines.append("| – | " + " | ".join("–" for _ in range(len(BENCH_VARIANTS) + 3)) + " |")
    return "\n".join(lines)


def mutation_table(path: Path) -> str:
    """The per-file table of a ``tools/mutation.py --json`` report (``make mutation`` writes
    ``reports/mutation.json``): sample, outcome counts and kill rate of every file, with the run's settings, date
    and CPU (``meta``)."""
    if not path.is_file():
        return _absent(path, "make mutation", "`tools/mutation.py --json`")
    data = json.loads(path.read_text(encoding="utf-8"))
    meta = data.get("meta") or {}
    rerun = f"; a rerun of the survivors of `{meta['rerun_of']}`" if meta.get("rerun_of") else ""
    lines = [f"From `{_shown(path)}` (`tools/mutation.py --json`), {meta.get('date') or 'no date in the file'}, "
             f"{meta.get('cpu') or 'no machine in the file'}: `--n {meta.get('n', '?')} --seed "
             f"{meta.get('seed', '?')} --jobs {meta.get('jobs', '?')}`{rerun}. Kill rate: "
             f"{meta.get('kill_rate', '(killed + timeout) / (killed + timeout + survived)')}.", "",
             "| file | tests | sample | killed | survived | timeout | equivalent | error | kill rate |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in data.get("files", []):
        label = f["file"] + (f"::{','.join(f['functions'])}" if f.get("functions") else "")
        env = " ".join(f"`{k}={v}`" for k, v in (f.get("env") or {}).items())
        tests = ", ".join(f"`{Path(t.strip()).name}`" for t in f["tests"].split(","))
        c, rate = f["counts"], f.get("kill_rate")
        lines.append(f"| {label}{f' ({env})' if env else ''} | {tests} | {f['sampled']} of {f['total_mutants']} | "
                     f"{c['killed']} | {c['survived']} | {c['timeout']} | {c['equivalent']} | {c['error']} | "
                     + ("–" if rate is None else f"{100 * rate:.1f} %") + " |")
    return "\n".join(lines)


def _committed(path: Path) -> str:
    """The date of the last commit of ``path`` (``git log``), or a note that there is none."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", str(path)], cwd=ROOT, capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"committed {out}" if out else "not committed"


def _llm_sweep(folder: Path) -> tuple[Path, list[dict], str] | str:
    """The LLM sweep copy of the dashboard folder, its cells and the line that names them; or the note that
    there is none."""
    sweep = folder / "llm-sweep"
    if not (sweep / "llm_sweep.json").is_file():
        return (f"*No LLM sweep in `{_shown(folder)}`: `make llm-study` runs the 8 seeds into `runs/llm-study` and "
                "`make report LLM_SWEEP=runs/llm-study` copies their summaries to `reports/llm-sweep/`, from which "
                "this table is computed.*")
    cells = sorted((json.loads(p.read_text(encoding="utf-8")) for p in (sweep / "cells").glob("*/*.json")),
                   key=lambda c: c["seed"])
    cpus = sorted({c["cpu"] for c in cells if c.get("cpu")})
    threads = sorted({str(c["threads"]) for c in cells if c.get("threads") is not None})
    source = (f"`{_shown(sweep)}/` ({len(cells)} seeds; the files record no date: "
              f"{_committed(sweep / 'llm_sweep.json')}), machine as the cells record it: "
              f"{'; '.join(cpus) or 'not recorded'}, {'/'.join(threads) or '?'} torch thread(s) a seed")
    return sweep, cells, source


def llm_study_table(folder: Path) -> str:
    """The pre-registered statistics of the LLM study, computed from the committed copy of its sweep
    (``reports/llm-sweep/runs/<seed>/``) by :func:`verification.llm.sweep.personalisation_statistics`, the
    function the dashboard calls."""
    found = _llm_sweep(folder)
    if isinstance(found, str):
        return found
    sweep, _, source = found
    from verification.llm.sweep import personalisation_statistics, sweep_run_dirs

    res = personalisation_statistics(sweep_run_dirs(sweep))
    if not res.get("lines"):
        return f"*The pre-registered statistics cannot be computed from {source}: {res.get('unavailable')}*"
    lines = [f"Computed from {source}, by `verification.llm.sweep.personalisation_statistics` (as the dashboard):",
             "", "| pre-registered statistic | estimate | 95 % interval | p | MDE (80 %) | verdict |",
             "|---|---|---|---|---|---|"]
    for r in res["lines"]:
        chance = f" (chance {_g(r['null'])})" if r.get("null") else ""
        lo, hi = r["interval"] or (None, None)
        lines.append(f"| {r['label']}{chance} | {_g(r['estimate'])} | [{_g(lo)}, {_g(hi)}] | {_g(r['p_value'])} | "
                     f"{_g(r['mde'])}{' above chance' if r.get('null') else ''} | {r['verdict']} |")
    return "\n".join(lines)


_NO_ANSWER = ("*No results exist yet: {what} Until then this page states no answer.*")


def llm_gate_table(folder: Path, name: str = "llm-gate", lead: str = "Objectives that entered") -> str:
    """The positive-control gate's table objective × budget and the objectives that entered, from the dashboard's
    copy of a gate folder's ``gate.json`` (``reports/llm-gate/``, :func:`verification.llm.answer.read_gate`), or
    from the committed record ``reports/<name>/`` of an earlier gate round or of another gate measurement (the
    curve's oracle at its own budget, whose last sentence opens with ``lead``)."""
    from verification.llm import answer

    gate = folder / name
    if not (gate / answer.GATE_JSON).is_file():
        how = ("`prefalign llm gate --out runs/llm-gate` runs it and `make report LLM_GATE=runs/llm-gate` copies it "
               "there" if name == "llm-gate" else "that record is not in this checkout")
        return _NO_ANSWER.format(what=f"no gate in `{_shown(gate)}/` ({how}).")
    summary = answer.read_gate(gate)
    return "\n".join([f"From `{_shown(gate / answer.GATE_JSON)}` ({_committed(gate / answer.GATE_JSON)}); the rule: "
                      f"{summary['rule']}.", "", *answer.gate_table(summary), "", answer.gate_entered(summary, lead)])


def _shots_curve(folder: Path) -> dict | str:
    """The shots curve of the dashboard's sweep copy (:func:`verification.llm.answer.sweep_curve`), or the note
    that none exists yet."""
    from verification.llm import answer
    from verification.llm.sweep import sweep_run_dirs

    sweep = folder / "llm-sweep"
    dirs = sweep_run_dirs(sweep) if (sweep / "runs").is_dir() else []
    curve = answer.sweep_curve(sweep, dirs) if dirs else None
    if curve is None:
        return _NO_ANSWER.format(what=f"the shots curve has not been run: no run of `{_shown(sweep)}/` holds its "
                                 "records (`shots_scores.csv`; the committed sweep there is the old study's). Its "
                                 "sweep, then `make report LLM_SWEEP=DIR`, puts them there.")
    if "unavailable" in curve:
        return f"*The shots records in `{_shown(sweep)}/` cannot be analysed: {curve['unavailable']}*"
    return curve


def llm_curve_table(folder: Path) -> str:
    """The shots curve's table method × budget and one line per pre-registered statistic, computed from the
    dashboard's sweep copy by :func:`verification.llm.shots.shots_report` (as the dashboard)."""
    from verification.llm import answer
    from verification.llm.shots import line_text

    curve = _shots_curve(folder)
    if isinstance(curve, str):
        return curve
    rep = curve["report"]
    return "\n".join([f"Computed from `{_shown(folder / 'llm-sweep')}/` ({_committed(folder / 'llm-sweep')}) by "
                      "`verification.llm.shots.shots_report` with the plan the sweep states:", "",
                      *answer.curve_table(rep), "", *[f"- {line_text(ln)}" for ln in rep["lines"]],
                      *[f"- {line_text(ln)}" for ln in rep["descriptive"]]])


def llm_answer_table(folder: Path) -> str:
    """Where Algorithm 1 beats local-only and FedAvg, and by how much against the oracle's ceiling: the sentences
    of :func:`verification.llm.answer.answer_sentences`, computed from the dashboard's sweep copy."""
    from verification.llm import answer

    curve = _shots_curve(folder)
    if isinstance(curve, str):
        return curve
    return "\n\n".join(answer.answer_sentences(curve["report"]))


#: The stages of an LLM run's ``stage_seconds`` that the cost table shows, with their column names.
LLM_STAGES = {"psi_star_estimate": "ψ* estimate", "algorithm_1": "Algorithm 1",
              "personalisation": "personalisation evaluation", "generation_rewards": "generation"}


def llm_study_cost_table(folder: Path) -> str:
    """The cost of every seed of the LLM study as its sweep cell records it (``cells/<preset>/<seed>.json``):
    wall and CPU seconds, gradient evaluations and the wall seconds of the main stages; the totals of
    ``llm_sweep.json``."""
    found = _llm_sweep(folder)
    if isinstance(found, str):
        return found
    sweep, cells, source = found
    totals = json.loads((sweep / "llm_sweep.json").read_text(encoding="utf-8"))
    cpu, wall = totals["totals"]["cpu_seconds_per_seed"], totals["totals"]["seconds_per_seed"]
    lines = [f"From {source}; seconds:", "",
             "| seed | status | wall | CPU | gradient evaluations | " + " | ".join(LLM_STAGES.values()) + " |",
             "|---" * (5 + len(LLM_STAGES)) + "|"]
    for c in cells:
        stages = c.get("stage_seconds") or {}
        lines.append(f"| {c['seed']} | {c['status']} | {c['seconds']:.0f} | {c['cpu_seconds']:.0f} | "
                     f"{(c.get('gradient_evaluations') or {}).get('done', '–')} | "
                     + " | ".join(f"{stages[k]:.0f}" if k in stages else "–" for k in LLM_STAGES) + " |")
    lines += ["", f"Per seed (`llm_sweep.json`): CPU {cpu['mean']:.0f} on average, {cpu['max']:.0f} at most; wall "
              f"{wall['mean']:.0f} on average; the sweep's last run took {totals['last_run']['wall_seconds']:.0f} s "
              "of wall time."]
    return "\n".join(lines)


#: The statements of the excerpt of the dashboard on "The dashboard" page.
DASHBOARD_IDS = ("H.4", "H.7", "H.13", "H.16", "H.19", "H.29", "H.43", "H.44")
_CELL = re.compile(r"(?<!\\)\|")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _CELL.split(line.strip())[1:-1]]


def dashboard_table(folder: Path, ids: tuple[str, ...] = DASHBOARD_IDS) -> str:
    """The rows ``ids`` of the statement table of a dashboard (``README.md`` of ``make report``), as it wrote them,
    without the seconds column and with its links to the dashboard's own files left out."""
    path = folder / "README.md"
    if not path.is_file():
        return (f"*No dashboard in `{_shown(folder)}`: `make report` writes `reports/README.md` (committed), whose "
                "statement table this excerpt is taken from.*")
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next((k for k, ln in enumerate(lines) if ln.startswith("| # | statement |")), None)
    if start is None:
        return f"*`{_shown(path)}` has no statement table.*"
    head = _cells(lines[start])
    keep = [k for k, name in enumerate(head) if name != "s"]
    rows = {}
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        cells = _cells(ln)
        rows[cells[0]] = [_LINK.sub(r"\1", cells[k]) for k in keep]
    made = next((ln.split(" in ")[0] for ln in lines if ln.startswith("Generated by")), "Generated by `make report`")
    out = [f"From `{_shown(path)}` ({made[0].lower() + made[1:]}; the file records no date or machine: "
           f"{_committed(path)}):", "", "| " + " | ".join(head[k] for k in keep) + " |",
           "|---" * len(keep) + "|"]
    out += ["| " + " | ".join(rows[i]) + " |" for i in ids if i in rows]
    return "\n".join(out)


def report_scaling_table(folder: Path) -> str:
    """The report on Dask at each scale measured (``tools/bench_report.py`` writes
    ``reports/report_scaling_<scale>.json``): wall time, CPU time (the whole process tree) and efficiency
    ``CPU / (W · wall)`` per W, the critical path, the largest cell's share and the wall time predicted on 8, 32 and
    128 workers from the cells' recorded costs, with the CPU and date."""
    paths = [folder / f"report_scaling_{s}.json" for s in ("default", "paper")]
    missing = [f"*The {s} scale: not measured yet (`python tools/bench_report.py --scale {s} --workers 1 2` writes "
               f"`{_shown(p)}`).*" for s, p in zip(("default", "paper"), paths, strict=True) if not p.is_file()]
    if len(missing) == len(paths):
        return "\n\n".join(missing)
    lines = ["| scale | CPU, date | W | wall s | CPU s | efficiency | cells, CPU-s | critical path s | largest cell "
             "| predicted wall s on 8 / 32 / 128 | results equal |", "|---" * 11 + "|"]
    for p in paths:
        if not p.is_file():
            continue
        d = json.loads(p.read_text(encoding="utf-8"))
        pred = " / ".join(_g(d["predicted_wall_seconds"][str(w)]) for w in (8, 32, 128))
        for k, r in enumerate(d["runs"]):
            tail = (f"{d['cells']}, {_g(d['cells_cpu_seconds'])} | {_g(d['critical_path']['cpu_seconds'])} | "
                    f"{d['largest_cell']['key']} ({100 * d['largest_cell']['share']:.0f} %) | {pred} | "
                    f"{'yes' if d['results_equal'] else 'NO'}") if k == 0 else " | | | | "
            lines.append(f"| {d['scale'] if k == 0 else ''} | {d['cpu'] + ', ' + d['date'] if k == 0 else ''} | "
                         f"{r['workers']} | {_g(r['wall_seconds'])} | {_g(r['cpu_seconds'])} | "
                         f"{r['efficiency']:.2f} | {tail} |")
    return "\n\n".join(["\n".join(lines), *missing])


#: ``{{ table NAME }}`` on a hand-written page: the function that renders it from the dashboard folder.
TABLES = {"bench": lambda folder: bench_table(folder / "bench.json"),
          "mutation": lambda folder: mutation_table(folder / "mutation.json"),
          "llm-study": llm_study_table,
          "llm-study-cost": llm_study_cost_table,
          "llm-gate": llm_gate_table,
          "llm-gate-round-1": lambda folder: llm_gate_table(folder, "llm-gate-round-1"),
          "llm-gate-curve-oracle": lambda folder: llm_gate_table(folder, "llm-gate-curve-oracle",
                                                                 "Passed the gate's rule at this size"),
          "llm-curve": llm_curve_table,
          "llm-answer": llm_answer_table,
          "dashboard": dashboard_table,
          "report-scaling": report_scaling_table}


def _table(name: str, page: str) -> str:
    if name not in TABLES:
        log.warning(f"{page}: unknown generated table {{{{ table {name} }}}} (known: {', '.join(TABLES)})")
        return ""
    return TABLES[name](_report_folder())


# ------------------------------------------------------------------------------------------- hooks

_STATE: dict = {}


def _report_figures() -> dict[str, tuple[str, str]]:
    """{figure file: (absolute path, caption)} of the dashboard folder (``PREFALIGN_DOCS_REPORT``, default
    ``reports/``), captions from its README.md; empty without a dashboard."""
    folder = _report_folder()
    fig_dir = folder / "figures"
    if not fig_dir.is_dir():
        return {}
    captions = {}
    readme = folder / "README.md"
    if readme.is_file():
        for cap, name in re.findall(r"!\[(.*?)\]\(figures/([^)]+)\)", readme.read_text(encoding="utf-8")):
            captions[name] = cap
    return {p.name: (str(p), captions.get(p.name, p.stem.replace("_", " "))) for p in sorted(fig_dir.glob("*.png"))}


def _short(name: str, width: int = 48) -> str:
    """``name`` cut at a word boundary to at most ``width`` characters (for the navigation)."""
    if len(name) <= width:
        return name
    return name[:width].rsplit(" ", 1)[0].rstrip(",;:") + " …"


def on_config(config):
    """Load the statements, the baseline and the figures; expand the "Statements" entry of the nav."""
    from verification.core import registry
    from verification.core.regression import load_results, shipped_baseline
    from verification.report.figures import FIGURE_STATEMENTS

    stmts = registry.all_statements()
    rows = {r["id"]: r for r in load_results(shipped_baseline())}
    _STATE.update(stmts=stmts, rows=rows, figures=_report_figures(), figure_names=FIGURE_STATEMENTS)
    numeric = [{f"{s.id} — {_short(s.name)}": f"statements/{slug(s.id)}.md"} for s in stmts
               if s.module != "verification.statements.symbolic"]
    symbolic = [{f"{s.id} — {s.name}": f"statements/symbolic/{slug(s.id)}.md"} for s in stmts
                if s.module == "verification.statements.symbolic"]
    for k, item in enumerate(config["nav"]):
        if isinstance(item, dict) and item.get("Statements") == "statements/index.md":
            config["nav"][k] = {"Statements": ["statements/index.md", *numeric,
                                               {"Symbolic identities S1–S26": symbolic}]}
    return config


def on_files(files, config):
    """Add the generated pages and the dashboard's figures to the site."""
    from mkdocs.structure.files import File

    stmts, rows = _STATE["stmts"], _STATE["rows"]
    for s in stmts:
        if s.module == "verification.statements.symbolic":
            files.append(File.generated(config, f"statements/symbolic/{slug(s.id)}.md",
                                        content=symbolic_page(s, rows.get(s.id))))
        else:
            files.append(File.generated(config, f"statements/{slug(s.id)}.md",
                                        content=statement_page(s, rows.get(s.id), _STATE["figures"],
                                                               _STATE["figure_names"])))
    files.append(File.generated(config, "statements/index.md", content=index_page(stmts, rows)))
    files.append(File.generated(config, "cli.md", content=cli_page()))
    for name, (path, _) in _STATE["figures"].items():
        if _STATE["figure_names"].get(name):  # a figure that illustrates a statement
            files.append(File.generated(config, f"statements/figures/{name}", abs_src_path=path))
    return files


def baseline_summary() -> dict:
    """Counts of the shipped baseline by verdict (for the home page)."""
    counts: dict[str, int] = {}
    for r in _STATE.get("rows", {}).values():
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return counts


#: A reference into the specification pages as the code writes it: ``docs/spec/<page>.md#<anchor>``.
SPEC_REF = re.compile(r"(?<![\w/(\[])docs/spec/([\w-]+\.md)(#[\w-]+)?")


def spec_links(markdown: str, src_uri: str) -> str:
    """Every ``docs/spec/<page>.md#<anchor>`` of a generated page (a statement's ``Reference`` section, written
    from its docstring) as a link relative to the page ``src_uri``: the strict build then fails on a reference
    whose page or anchor does not exist."""
    rel = os.path.relpath("spec", os.path.dirname(src_uri) or ".").replace(os.sep, "/")
    return SPEC_REF.sub(lambda m: f"[{m.group(1)[:-3]}{m.group(2) or ''}]({rel}/{m.group(1)}{m.group(2) or ''})",
                        markdown)


def on_page_markdown(markdown, page, config, files):
    """Placeholders on a hand-written page: ``{{ baseline_summary }}``, the verdict counts of the shipped baseline;
    ``{{ actions NAME }}``, the table of the actions of ``prefalign NAME`` (:func:`actions_table`); ``{{ table
    NAME }}``, a table rendered from a tool's output file (:data:`TABLES`)."""
    if page.file.src_uri.startswith("statements/"):
        markdown = spec_links(markdown, page.file.src_uri)
    markdown = re.sub(r"\{\{ actions (\w+) \}\}", lambda m: actions_table(m.group(1)), markdown)
    markdown = re.sub(r"\{\{ table ([\w-]+) \}\}", lambda m: _table(m.group(1), page.file.src_uri), markdown)
    if "{{ baseline_summary }}" in markdown:
        counts = baseline_summary()
        text = ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        markdown = markdown.replace("{{ baseline_summary }}", f"{sum(counts.values())} statements: {text}")
    return markdown
