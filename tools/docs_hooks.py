"""Generated pages of the documentation site (MkDocs ``hooks:``) and the griffe extension of its API pages.

* One page per statement (``statements/<id>.md``), written from the statement module's docstring split into its
  canonical sections (:mod:`verification.report.docsections`), with the statement's verdict, tightness, conclusions and
  negative control from the regression baseline shipped in the package (``verification/data/
  baseline_results.json``) and the figures of the dashboard that illustrate it (``reports/figures/``, drawn by
  ``make report``; ``PREFALIGN_DOCS_REPORT`` names another dashboard folder). Nothing on these pages is written
  by hand: a number that changes changes with the baseline.
* One page per symbolic identity S1-S26 and an index of all statements.
* ``cli.md``: the ``--help`` of ``prefalign`` and of every sub-command, from the parsers themselves.
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
import logging
import os
import re
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
         f"and shows the verdict of {BASELINE_NOTE}. How to read a verdict: [Getting started]"
         "(../getting-started.md#how-to-read-a-verdict).", "",
         "## Statements of the appendix", ""] + head + [line(s, f"{slug(s.id)}.md") for s in numeric]
        + ["", "## Symbolic identities", "",
           "The identities S1–S26 of THEOREMS.md §4, checked with sympy (`verification.statements.symbolic`).", ""]
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


# ------------------------------------------------------------------------------------------- hooks

_STATE: dict = {}


def _report_figures() -> dict[str, tuple[str, str]]:
    """{figure file: (absolute path, caption)} of the dashboard folder (``PREFALIGN_DOCS_REPORT``, default
    ``reports/``), captions from its README.md; empty without a dashboard."""
    folder = Path(os.environ.get("PREFALIGN_DOCS_REPORT", ROOT / "reports"))
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


def on_page_markdown(markdown, page, config, files):
    """Placeholders on a hand-written page: ``{{ baseline_summary }}``, the verdict counts of the shipped baseline;
    ``{{ actions NAME }}``, the table of the actions of ``prefalign NAME`` (:func:`actions_table`)."""
    markdown = re.sub(r"\{\{ actions (\w+) \}\}", lambda m: actions_table(m.group(1)), markdown)
    if "{{ baseline_summary }}" in markdown:
        counts = baseline_summary()
        text = ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        markdown = markdown.replace("{{ baseline_summary }}", f"{sum(counts.values())} statements: {text}")
    return markdown
