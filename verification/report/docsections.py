"""The sections of a statement module's docstring: the statement and its check, read side by side with the code.

Every module of :mod:`verification.statements` states its statement in its docstring (docs/write-your-own.md, "The
contract"): a title line, then sections, each an unindented heading line followed by its indented text::

    H.9 — floor of the normalised weighted losses ...

    Setting
        Clients with preferences ...

    Hypothesis (Assumption H.9)
        There is ``c ∈ (0, 1)`` ...

    Reference: docs/spec/statements.md#t-h9, docs/spec/open-points.md#o-4.

A heading may carry a qualifier in parentheses or after a word (``Guarantee (eq 53)``, ``How it is checked``),
and ``Reference: ...`` may hold its text on the heading line. :func:`statement_sections` maps the headings onto the
canonical sections of :data:`SECTIONS` (the documentation site shows one page per statement in this order), and
:func:`missing_sections` is the contract a statement module's docstring must meet.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

__all__ = ["SECTIONS", "REQUIRED", "Section", "StatementDoc", "statement_sections", "missing_sections"]

#: The canonical sections, in the order a statement's page shows them; each with the heading words that name it.
SECTIONS: dict[str, tuple[str, ...]] = {
    "Setting": ("setting",),
    "Hypotheses": ("hypotheses", "hypothesis", "assumption", "assumptions"),
    "Guarantee": ("guarantee", "statement", "statements"),
    "What is checked": ("what is checked", "how it is checked", "check", "checks"),
    "Negative control": ("negative control", "negative controls"),
    "Reference": ("reference", "references"),
}

#: The sections every statement module's docstring must have: the setting, what is claimed (its hypotheses or its
#: guarantee: an assumption is all hypotheses, a theorem without premises all guarantee), what the code checks, the
#: negative control that shows the check can fail, and the reference into the specification
#: (docs/spec/index.md).
REQUIRED = ("Setting", ("Hypotheses", "Guarantee"), "What is checked", "Negative control", "Reference")


@dataclass(frozen=True)
class Section:
    """One section: its canonical name, the heading as the module writes it, and its text (dedented)."""

    name: str | None  # None: a heading that names no canonical section (e.g. "Figure data")
    heading: str
    text: str


@dataclass(frozen=True)
class StatementDoc:
    """A statement module's docstring: the title paragraph and the sections in the order written."""

    title: str
    sections: tuple[Section, ...]

    def get(self, name: str) -> list[Section]:
        """The sections with canonical name ``name`` (a docstring may have two, e.g. two "Guarantee" parts)."""
        return [s for s in self.sections if s.name == name]


_INLINE = re.compile(r"^(Reference|References)\s*:\s*(.+)$")


def _canonical(heading: str) -> str | None:
    h = heading.lower().strip()
    for name, words in SECTIONS.items():
        for w in words:
            if h == w or re.match(rf"{re.escape(w)}\b", h):
                return name
    return None


def statement_sections(doc: str) -> StatementDoc:
    """Split a statement module's docstring into its title paragraph and sections (see the module docstring).

    A heading is an unindented line followed (after blank lines) by an indented line, or a ``Reference: ...`` line.
    Unindented lines before the first heading belong to the title paragraph."""
    lines = textwrap.dedent(doc).strip("\n").splitlines()
    title: list[str] = []
    sections: list[tuple[str, list[str]]] = []

    def next_nonblank(k: int) -> str | None:
        for line in lines[k + 1:]:
            if line.strip():
                return line
        return None

    for k, line in enumerate(lines):
        unindented = bool(line.strip()) and not line[0].isspace()
        inline = _INLINE.match(line) if unindented else None
        nxt = next_nonblank(k)
        if inline:
            sections.append((inline.group(1), [inline.group(2)]))
        elif unindented and nxt is not None and nxt[0].isspace() and (sections or _canonical(line)):
            sections.append((line.strip(), []))
        elif sections:
            sections[-1][1].append(line)
        else:
            title.append(line)
    out = tuple(Section(_canonical(h), h, textwrap.dedent("\n".join(body)).strip("\n")) for h, body in sections)
    return StatementDoc(" ".join(x.strip() for x in title if x.strip()), out)


def missing_sections(doc: str | None) -> list[str]:
    """The required sections (:data:`REQUIRED`) that ``doc`` lacks, by canonical name (``"Hypotheses or
    Guarantee"`` when it has neither); empty when the docstring meets the contract."""
    if not doc:
        return ["docstring"]
    names = {s.name for s in statement_sections(doc).sections if s.text.strip()}
    missing = []
    for req in REQUIRED:
        alternatives = (req,) if isinstance(req, str) else req
        if not names.intersection(alternatives):
            missing.append(" or ".join(alternatives))
    return missing
