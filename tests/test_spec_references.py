"""Every reference to the specification resolves inside the project.

The specification is the set of pages ``docs/spec/*.md`` of the documentation site; each item has a stable anchor
(an attr_list ``{#id}`` on a heading or a table cell, or a heading's own slug). The code cites it as
``docs/spec/<page>.md#<anchor>`` (statement docstrings' ``Reference`` sections, module docstrings, comments), the
documentation by relative Markdown links. This test reads every tracked text file of the project, finds each such
reference and fails on one whose page or anchor does not exist; it also fails on a citation of a text the project
does not ship. The strict docs build checks the same links on the site (the generated statement pages turn their
``Reference`` sections into links, ``tools/docs_hooks.py``), this test without building it.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = "docs/spec"
#: Files that record history or generated output, not citations of the current specification.
SKIP = ("CHANGELOG.md", "docs/changelog.md", "reports/", "verification/data/")
TEXT = (".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".sh", ".yml", ".yaml", ".rst")

CODE_REF = re.compile(r"(?<![\w/.-])docs/spec/([\w-]+\.md)(?:#([\w-]+))?")
MD_LINK = re.compile(r"\]\(([^)\s]*?spec/[\w-]+\.md|[\w-]+\.md|)(#[\w-]+)?\)")
EXPLICIT_ID = re.compile(r"\{:?\s*#([\w-]+)\s*\}")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)
# Citations of a text the project does not ship; built from parts so that this file does not match itself.
FOREIGN = ("THEO" + "REMS.md", "shared" + " folder", "../" + "shared", "seed" + " l.", "seed" + " line")


def slugify(title: str) -> str:
    """The id the toc extension gives a heading without an explicit one (Python-Markdown's default slugify)."""
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def page_anchors(path: Path) -> set[str]:
    """The anchors of one Markdown page: every explicit ``{#id}`` and the slug of every heading without one."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # headings inside code blocks are not headings
    ids = set(EXPLICIT_ID.findall(text))
    for title in HEADING.findall(text):
        if not EXPLICIT_ID.search(title):
            ids.add(slugify(title))
    return ids


def spec_anchors(root: Path) -> dict[str, set[str]]:
    """Page name (``statements.md``) -> its anchors, for every page of the specification."""
    return {p.name: page_anchors(p) for p in sorted((root / SPEC).glob("*.md"))}


def project_files(root: Path) -> list[str]:
    """The tracked text files of the project (untracked ones of a fresh checkout do not exist)."""
    if (root / ".git").exists():
        out = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
        names = out.split()
    else:
        names = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    return [n for n in names if n.endswith(TEXT) and not n.startswith(SKIP) and (root / n).is_file()]


def references(root: Path, name: str) -> list[tuple[int, str, str | None]]:
    """``(line, page, anchor)`` of every reference to a spec page in file ``name``."""
    text = (root / name).read_text(encoding="utf-8", errors="replace")
    found = []
    for m in CODE_REF.finditer(text):
        found.append((text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)))
    if name.endswith(".md"):
        here = Path(name).parent
        for m in MD_LINK.finditer(text):
            target, anchor = m.group(1), m.group(2)
            if not target and not anchor:
                continue
            resolved = (here / target).as_posix() if target else name
            resolved = _normalise(resolved)
            if not resolved.startswith(SPEC + "/"):
                continue
            found.append((text.count("\n", 0, m.start()) + 1, resolved.split("/")[-1],
                          anchor[1:] if anchor else None))
    return found


def _normalise(path: str) -> str:
    parts: list[str] = []
    for p in path.split("/"):
        if p == "..":
            if parts:
                parts.pop()
        elif p not in ("", "."):
            parts.append(p)
    return "/".join(parts)


def broken_references(root: Path) -> list[str]:
    """Every reference to a spec page or anchor that does not exist, and every citation of an unshipped text."""
    anchors = spec_anchors(root)
    bad = []
    for name in project_files(root):
        for line, page, anchor in references(root, name):
            if page not in anchors:
                bad.append(f"{name}:{line}: no page {SPEC}/{page}")
            elif anchor is not None and anchor not in anchors[page]:
                bad.append(f"{name}:{line}: no anchor #{anchor} on {SPEC}/{page}")
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        for word in FOREIGN:
            if word in text:
                bad.append(f"{name}: cites {word!r}, a text the project does not ship")
    return bad


def test_every_spec_reference_resolves():
    anchors = spec_anchors(ROOT)
    assert {"index.md", "notation.md", "lp.md", "statements.md"} <= set(anchors)
    assert sum(len(v) for v in anchors.values()) > 100
    refs = [r for n in project_files(ROOT) for r in references(ROOT, n)]
    assert len(refs) > 150  # the project does cite the specification
    assert broken_references(ROOT) == []


def test_every_statement_references_its_catalogue_entry():
    """Each statement module's ``Reference`` section names the statement's entry in the catalogue."""
    from verification.core.registry import all_statements
    from verification.report.docsections import statement_sections

    anchors = spec_anchors(ROOT)["statements.md"]
    seen = 0
    for stmt in all_statements():
        if stmt.module.endswith(".symbolic"):
            continue
        import importlib

        doc = statement_sections(importlib.import_module(stmt.module).__doc__ or "")
        text = " ".join(s.text + " " + s.heading for s in doc.get("Reference"))
        entries = re.findall(r"docs/spec/statements\.md#(t-[\w-]+)", text)
        assert entries, f"{stmt.id}: its Reference section names no catalogue entry: {text!r}"
        assert set(entries) <= anchors, f"{stmt.id}: {set(entries) - anchors}"
        seen += 1
    assert seen >= 30


def _tree(tmp_path: Path, citation: str) -> Path:
    (tmp_path / SPEC).mkdir(parents=True)
    (tmp_path / SPEC / "lp.md").write_text("# The LP {#lp}\n\n## Roundoff rules\n\n| rule | text |\n|---|---|\n"
                                           "| R1 {#r1} | on the ray |\n", encoding="utf-8")
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "mod.py").write_text(f'"""A module.\n\nReference: {citation}\n"""\n', encoding="utf-8")
    (tmp_path / "docs" / "page.md").write_text("See [the rules](spec/lp.md#roundoff-rules).\n", encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("citation, problem", [
    ("docs/spec/lp.md#r1, docs/spec/lp.md#lp", None),
    # the broken ones are built from parts, so that this file itself cites nothing broken
    ("docs/spec/lp.md" + "#r9", "no anchor #r9 on docs/spec/lp.md"),
    ("docs/spec/" + "notation.md#beta", "no page docs/spec/notation.md"),
    ("THEO" + "REMS.md \u00a71.5", "a text the project does not ship"),
])
def test_a_planted_broken_reference_is_caught(tmp_path, citation, problem):
    root = _tree(tmp_path, citation)
    bad = broken_references(root)
    if problem is None:
        assert bad == []
    else:
        assert len(bad) == 1 and problem in bad[0] and bad[0].startswith("sim/mod.py")


def test_a_planted_broken_markdown_link_is_caught(tmp_path):
    root = _tree(tmp_path, "docs/spec/lp.md#r1")
    (root / "docs" / "page.md").write_text("See [R7](spec/lp.md#r7) and [ok](spec/lp.md#r1).\n", encoding="utf-8")
    assert broken_references(root) == ["docs/page.md:1: no anchor #r7 on docs/spec/lp.md"]
