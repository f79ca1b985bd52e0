#!/usr/bin/env python3
r"""Mutation testing of the numerical kernels: does each module's own test file notice a small change to it?

For every source file (``sim/cluster.py`` …) or package (``sim/algorithm``: all of its modules) the runner

1. parses the module with :mod:`ast` and enumerates every *mutant*: one small change at one place, made with the
   standard operators below (a package's modules one after the other, in the order of their paths, so
   ``__init__.py`` comes first; each mutant keeps its own module's ``file:line``);
2. samples ``--n`` of them with a seeded :class:`random.Random` (``--n 0``: all of them), so the same seed and the
   same source give the same sample (a package's sample is drawn from the mutants of all its modules at once);
3. runs the file's own test file (``tests/<folder>/test_<name>.py``, the tests mirroring the layout, or the files named with ``SRC=TESTS``, below) against each
   mutant with ``pytest -x -q -p no:cacheprovider`` and a timeout, in a private copy of the tree (one per job; the
   working tree is never written), and classifies the mutant:

   * ``killed``   the tests failed (or could not import the mutated module);
   * ``survived`` the tests passed: a test gap, unless the mutant is *equivalent*;
   * ``timeout``  the tests ran past the timeout (typically an endless loop: detected, but listed apart);
   * ``equivalent`` the tests passed and the mutant is listed in ``tools/mutation_equivalents.toml`` with the
     reason why it cannot change behaviour;
   * ``error``    pytest itself failed to run (usage error, no tests): a defect of the set-up, never counted.

Kill rate, per file: ``(killed + timeout) / (killed + timeout + survived)``, i.e. equivalent (and error) mutants
count as neither killed nor survived. The JSON report (rewritten after every mutant, so an interrupted run keeps what it measured)
lists every sampled mutant with ``file:line``, the enclosing function, the operator, the change and the outcome,
and the run's settings, date and CPU (``meta``).

Operators (the usual relational, arithmetic, logical, constant and statement-deletion ones, plus those that matter
in array code):

* ``compare``     ``<`` → ``<=``, ``>=``; ``<=`` → ``<``, ``>``; ``==`` ↔ ``!=``; ``is`` ↔ ``is not``; ``in`` ↔ ``not in``
* ``reverse``     a comparison turned around: ``<`` ↔ ``>``, ``<=`` ↔ ``>=``
* ``binop``       ``+`` ↔ ``-``, ``*`` ↔ ``/``, ``//`` → ``/``, ``%`` → ``//``, ``**`` → ``*``, ``@`` → ``*``,
  ``&`` ↔ ``|``, ``^`` → ``|`` (also in augmented assignments)
* ``boolop``      ``and`` ↔ ``or``; ``unary``: drop ``-``, ``not``, ``~``
* ``constant``    integers ``n`` → ``n + 1``, ``n - 1``; floats ``x`` → ``x + 1``, ``0``; ``True`` ↔ ``False``;
  strings ``s`` → ``"XX" s "XX"`` (not docstrings, not messages of a ``raise``, not f-strings, not ``__all__``)
* ``scale``       numbers ``x`` → ``2x``; tolerances (floats ``0 < x <= 1e-3``: ``1e-9``, ``1e-6`` …) also → ``1000x``
  (a scaled number that another operator already gives, ``1`` → ``2``, keeps that operator's mutant)
* ``swap-name``   ``min`` ↔ ``max``, ``argmin`` ↔ ``argmax``, ``minimum`` ↔ ``maximum``, ``any`` ↔ ``all``, …
* ``negate-cond`` ``if c`` / ``while c`` / ``a if c else b`` → ``not (c)`` (conditional expressions included)
* ``negate-assert`` ``assert c`` → ``assert not (c)`` (both: not where a ``unary`` or ``compare`` mutant already is
  the negation, i.e. ``c`` is ``not x`` or a single ``==``, ``is``, ``in`` test)
* ``drop-keyword`` remove one keyword argument of a call (``axis=-1``, ``kind="stable"``, ``keepdims=True``)
* ``swap-args``   swap the first two positional arguments of a call
* ``return-none`` ``return x`` → ``return None``
* ``delete``      a simple statement (assignment, call, ``raise``, ``assert``, ``del``) → ``pass``
* ``break-continue`` ``break`` ↔ ``continue``

Annotations, docstrings, imports, ``__all__``, ``...`` bodies (``pass`` is the same no-op) and numba's compile
options (the arguments of ``@njit(cache=True, error_model="numpy", inline="always")``: under ``NUMBA_DISABLE_JIT``
the decorator is not applied, so no test run of that set-up can see them; they are left to the compiled twin
tests of the default tier) are not mutated. A mutant is applied by splicing the unparsed,
mutated node into the original bytes at the node's position, so the rest of the file (and its line numbers) is
unchanged; mutants that do not compile are dropped before sampling (counted as ``invalid``).

Runners: ``--runner fork`` (default on POSIX) keeps one server process per copy that has imported numpy, scipy,
pytest and its plugins once and forks a child per mutant; the child imports the project's modules from the copy
afresh, as a new interpreter would, at a fraction of the start-up cost. ``--runner subprocess`` starts a new
interpreter per mutant; both classify every mutant the same way (checked on the cluster and hull samples).

Usage::

    python tools/mutation.py --files sim/cluster.py sim/hull.py --n 60 --seed 0 --jobs 2 \
        --json reports/mutation.json

A file is given as ``SRC[::FUNCTIONS][=TESTS][@ENV]``, where ``SRC`` is a Python file or a package directory
(``sim/algorithm``, without ``.py``: every ``*.py`` below it is mutated, and its entry is reported as one):

* ``=TESTS`` names its test files, one or several separated by commas
  (``sim/direction.py=tests/sim/test_direction.py,tests/sim/test_direction_twin.py``): they run together in one pytest call;
* ``::FUNCTIONS`` restricts the mutants to those functions (comma-separated qualified names as the report prints
  them, ``Class.method``; a name includes what is nested in it), e.g. the part of a big module that one test file
  covers: ``sim/algorithm::random_partition,same_partition=tests/sim/test_clustering_comparison.py``; the sample
  is drawn from those functions' mutants and the entry is reported as ``SRC::FUNCTIONS``;
* ``@ENV`` sets environment variables for that file's test runs (``NAME=VALUE``, comma-separated), e.g.
  ``sim/_lp_compiled.py=tests/sim/test_direction_twin.py@NUMBA_DISABLE_JIT=1``: the numba twin then runs as Python,
  so a mutant costs a test run instead of a recompilation (the fork runner starts a separate server per
  environment, so the variables are set before any module is imported).
Exit status: 0, or 1 when ``--fail-under`` is given and a file's kill rate is below it; 2 on a usage error.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import copy
import dataclasses
import datetime
import hashlib
import importlib
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The kernels, Algorithm 1 and the kernel boundary, with their test files (the Makefile's MUTATION_FILES).
#: sim/direction.py holds the numpy reference of the LP kernel *and* the backend registry of its compiled twin; the
#: registry's tests and the reference-against-twin equality are in tests/sim/test_direction_twin.py, so both test files
#: are its own. The twin sim/_lp_compiled.py runs as Python under NUMBA_DISABLE_JIT=1 against the twin tests (a
#: compiled mutant would cost minutes of compilation). The package sim/algorithm (all of its modules) runs against
#: Algorithm 1's own tests (one file per layer), the clustering comparison's and the kernel boundary's (Algorithm 1 through an opaque
#: source: divergence, streamed records); Remark H.8's clustering comparison (in sim/algorithm/run.py) is also
#: sampled on its own.
#: Algorithm 1's test files, tests/sim/test_algorithm_<name>.py, in the order of the package's layers
ALGORITHM_TESTS = ("configs", "phases", "adaptation", "run")
CLUSTERING_COMPARISON = "random_partition,comparison_clusterings,same_partition,phase1_by_clustering"
DEFAULT_FILES = ("sim/preference.py", "sim/direction.py=tests/sim/test_direction.py,tests/sim/test_direction_twin.py",
                 "sim/cluster.py", "sim/hull.py",
                 "sim/algorithm=" + ",".join(f"tests/sim/test_algorithm_{m}.py" for m in ALGORITHM_TESTS)
                 + ",tests/sim/test_clustering_comparison.py,tests/sim/test_source.py",
                 f"sim/algorithm::{CLUSTERING_COMPARISON}=tests/sim/test_clustering_comparison.py",
                 "sim/source.py", "sim/_lp_compiled.py=tests/sim/test_direction_twin.py@NUMBA_DISABLE_JIT=1")
DEFAULT_EQUIVALENTS = REPO / "tools" / "mutation_equivalents.toml"
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider")

# ------------------------------------------------------------------------------------------------- operators

_COMPARE = {
    ast.Lt: (ast.LtE, ast.GtE),
    ast.LtE: (ast.Lt, ast.Gt),
    ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
_ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)  # their negation is not among their compare mutants
#: ``reverse``: the comparison turned around (not its negation: ``a < b`` -> ``a > b`` is false at ``a == b`` too)
_REVERSE = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}
#: ``scale``: a positive float at most this is a tolerance (1e-9, 1e-6, 1e-3 …), also scaled by ``_TOL_FACTOR``
_TOL_MAX = 1e-3
_TOL_FACTOR = 1e3
_BINOP = {
    ast.Add: (ast.Sub,),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.Div,),
    ast.Div: (ast.Mult,),
    ast.FloorDiv: (ast.Div,),
    ast.Mod: (ast.FloorDiv,),
    ast.Pow: (ast.Mult,),
    ast.MatMult: (ast.Mult,),
    ast.BitAnd: (ast.BitOr,),
    ast.BitOr: (ast.BitAnd,),
    ast.BitXor: (ast.BitOr,),
    ast.LShift: (ast.RShift,),
    ast.RShift: (ast.LShift,),
}
#: numba's decorators: their arguments are compile options (caching, inlining, error model), not mutated
_COMPILE_DECORATORS = {"njit", "jit", "vectorize", "guvectorize", "cfunc", "stencil"}
_SWAP_NAMES = {}
for _a, _b in (
    ("min", "max"),
    ("argmin", "argmax"),
    ("amin", "amax"),
    ("nanmin", "nanmax"),
    ("minimum", "maximum"),
    ("fmin", "fmax"),
    ("any", "all"),
    ("floor", "ceil"),
):
    _SWAP_NAMES[_a], _SWAP_NAMES[_b] = _b, _a


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One change at one place of one source file."""

    file: str  # path relative to the repository root
    line: int
    col: int
    function: str  # enclosing qualified name, "<module>" at top level
    operator: str
    original: str  # source text of the node that is replaced
    replacement: str  # the text spliced in instead
    source_line: str  # the (stripped) first source line of the node
    span: tuple[int, int]  # byte offsets of the replaced region
    id: str = ""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def change(self) -> str:
        return f"{_one_line(self.original)}  ->  {_one_line(self.replacement)}"

    def apply(self, source: bytes) -> bytes:
        a, b = self.span
        return source[:a] + self.replacement.encode() + source[b:]


def _one_line(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Collector(ast.NodeVisitor):
    """Walk a module and record every candidate mutation as ``(operator, node, replacement_text)``."""

    def __init__(self, source: bytes, rel: str):
        self.source = source
        self.rel = rel
        self.lines = source.split(b"\n")
        self.offsets = [0]
        for ln in self.lines:
            self.offsets.append(self.offsets[-1] + len(ln) + 1)
        self.stack: list[str] = []
        self.found: list[Mutant] = []
        self._skip: set[int] = set()  # ids of nodes (and their subtrees) never mutated
        self._no_string: set[int] = set()  # ids of subtrees whose string constants are messages

    # -- bookkeeping ------------------------------------------------------------------------------------------
    def _span(self, node: ast.AST) -> tuple[int, int]:
        a = self.offsets[node.lineno - 1] + node.col_offset
        b = self.offsets[node.end_lineno - 1] + node.end_col_offset
        return a, b

    def _add(self, operator: str, node: ast.AST, replacement: str, *, wrap: bool = True) -> None:
        a, b = self._span(node)
        original = self.source[a:b].decode()
        text = f"({replacement})" if wrap else replacement
        if _one_line(original) == _one_line(replacement):
            return
        self.found.append(
            Mutant(
                file=self.rel,
                line=node.lineno,
                col=node.col_offset,
                function=".".join(self.stack) or "<module>",
                operator=operator,
                original=original,
                replacement=text,
                source_line=self.lines[node.lineno - 1].decode().strip(),
                span=(a, b),
            )
        )

    def _mutated(self, node: ast.AST, edit) -> str:
        new = copy.deepcopy(node)
        edit(new)
        return ast.unparse(new)

    def _mark_skip(self, node: ast.AST | None) -> None:
        if node is not None:
            for sub in ast.walk(node):
                self._skip.add(id(sub))

    def _body_docstring(self, body: list[ast.stmt]) -> None:
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str):
                self._mark_skip(body[0])

    def visit(self, node: ast.AST):
        if id(node) in self._skip:
            return None
        return super().visit(node)

    # -- scopes -----------------------------------------------------------------------------------------------
    def visit_Module(self, node: ast.Module) -> None:
        self._body_docstring(node.body)
        self.generic_visit(node)

    def _visit_function(self, node) -> None:
        self._body_docstring(node.body)
        for dec in node.decorator_list:  # numba's compile options (@njit(cache=True, ...)): see the docstring
            f = dec.func if isinstance(dec, ast.Call) else dec
            if (f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)) in _COMPILE_DECORATORS:
                self._mark_skip(dec)
        for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            self._mark_skip(a.annotation)
        for a in (node.args.vararg, node.args.kwarg):
            if a is not None:
                self._mark_skip(a.annotation)
        self._mark_skip(node.returns)
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._body_docstring(node.body)
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    def visit_Import(self, node) -> None:
        return None

    visit_ImportFrom = visit_Import

    def visit_JoinedStr(self, node) -> None:
        return None  # f-strings build messages; positions inside them are unreliable before Python 3.12

    # -- statements -------------------------------------------------------------------------------------------
    def _delete(self, node: ast.stmt) -> None:
        self._add("delete", node, "pass", wrap=False)

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return None
        self._delete(node)
        self.generic_visit(node)  # store targets are not mutated (Name/Attribute check the context)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._delete(node)
        for new_op in _BINOP.get(type(node.op), ()):

            def edit(n, new_op=new_op):
                n.op = new_op()

            self._add("binop", node, self._mutated(node, edit), wrap=False)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._mark_skip(node.annotation)
        if node.value is not None:
            self._delete(node)
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and node.value.value is Ellipsis:
            return None  # a `...` body (a Protocol's method): `pass` is the same no-op
        self._delete(node)
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        self._delete(node)
        self._no_string.update(id(sub) for sub in ast.walk(node))
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        self._delete(node)
        self._mark_skip(node.msg)
        self._negate(node.test, "negate-assert")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._delete(node)

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            self._add("return-none", node, "return None", wrap=False)
        self.generic_visit(node)

    def visit_Break(self, node: ast.Break) -> None:
        self._add("break-continue", node, "continue", wrap=False)

    def visit_Continue(self, node: ast.Continue) -> None:
        self._add("break-continue", node, "break", wrap=False)

    def _negate(self, test: ast.expr, operator: str = "negate-cond") -> None:
        if id(test) in self._skip:
            return
        # not a duplicate of a compare or unary mutant: those already give exactly the negation
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and not isinstance(test.ops[0], _ORDERING):
            return
        self._add(operator, test, f"not ({ast.unparse(test)})")

    def visit_If(self, node: ast.If) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_While(self, node: ast.While) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    # -- expressions ------------------------------------------------------------------------------------------
    def visit_Compare(self, node: ast.Compare) -> None:
        for i, op in enumerate(node.ops):
            for new_op in _COMPARE.get(type(op), ()):

                def edit(n, i=i, new_op=new_op):
                    n.ops[i] = new_op()

                self._add("compare", node, self._mutated(node, edit))
            reverse = _REVERSE.get(type(op))
            if reverse is not None:

                def edit(n, i=i, new_op=reverse):
                    n.ops[i] = new_op()

                self._add("reverse", node, self._mutated(node, edit))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        for new_op in _BINOP.get(type(node.op), ()):

            def edit(n, new_op=new_op):
                n.op = new_op()

            self._add("binop", node, self._mutated(node, edit))
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        def edit(n):
            n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()

        self._add("boolop", node, self._mutated(node, edit))
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, (ast.USub, ast.Not, ast.Invert)):
            self._add("unary", node, ast.unparse(node.operand))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        v = node.value
        if isinstance(v, bool):
            self._add("constant", node, repr(not v))
        elif isinstance(v, int):
            for w in (v + 1, v - 1):
                self._add("constant", node, repr(w))
            self._add("scale", node, repr(2 * v))
        elif isinstance(v, float):
            for w in (v + 1.0, 0.0 if v != 0.0 else 1.0):
                self._add("constant", node, repr(w))
            self._add("scale", node, repr(2.0 * v))
            if 0.0 < v <= _TOL_MAX:
                self._add("scale", node, repr(float(f"{v * _TOL_FACTOR:.15g}")))
        elif isinstance(v, str) and id(node) not in self._no_string:
            self._add("constant", node, repr("XX" + v + "XX"))

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in _SWAP_NAMES:
            self._add("swap-name", node, _SWAP_NAMES[node.id])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load) and node.attr in _SWAP_NAMES:

            def edit(n):
                n.attr = _SWAP_NAMES[n.attr]

            self._add("swap-name", node, self._mutated(node, edit))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        for i, kw in enumerate(node.keywords):
            if kw.arg is None:
                continue

            def edit(n, i=i):
                del n.keywords[i]

            self._add("drop-keyword", node, self._mutated(node, edit))
        pos = [a for a in node.args if not isinstance(a, ast.Starred)]
        if len(pos) >= 2 and len(pos) == len(node.args) and ast.unparse(pos[0]) != ast.unparse(pos[1]):

            def edit(n):
                n.args[0], n.args[1] = n.args[1], n.args[0]

            self._add("swap-args", node, self._mutated(node, edit))
        self.generic_visit(node)


def _compiles(source: bytes, rel: str) -> bool:
    try:
        compile(source, rel, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _top_level_spans(tree: ast.Module, col: _Collector) -> list[tuple[int, int]]:
    """Byte spans of the module's top-level statements (decorators included): a mutant is compiled within its own
    statement, which is as strict as compiling the module and an order of magnitude cheaper."""
    spans = []
    for stmt in tree.body:
        first = min([stmt, *getattr(stmt, "decorator_list", [])], key=lambda n: (n.lineno, n.col_offset))
        spans.append((col.offsets[first.lineno - 1] + first.col_offset, col._span(stmt)[1]))
    return spans


def enumerate_mutants(path: Path, rel: str) -> tuple[list[Mutant], int]:
    """Every mutant of ``path`` in source order, with stable ids; also the number dropped as not compiling."""
    source = path.read_bytes()
    col = _Collector(source, rel)
    tree = ast.parse(source, filename=rel)
    col.visit(tree)
    spans = _top_level_spans(tree, col)
    seen: dict[str, int] = {}
    out: list[Mutant] = []
    invalid = 0
    distinct: set[tuple[tuple[int, int], str]] = set()
    for m in sorted(col.found, key=lambda m: (m.span, m.operator, m.replacement)):
        if (m.span, m.replacement) in distinct:  # two operators may propose the same text (0.0 + 1 and 1.0)
            continue
        distinct.add((m.span, m.replacement))
        s, e = next(sp for sp in spans if sp[0] <= m.span[0] and m.span[1] <= sp[1])
        a, b = m.span
        if not _compiles(source[s:a] + m.replacement.encode() + source[b:e], rel):
            invalid += 1
            continue
        # the id survives edits elsewhere in the file: it hashes where (function, source line) and what, not the
        # line number; identical changes on identical lines of one function are told apart by their rank
        key = "\x1f".join((m.file, m.function, m.source_line, m.operator, m.original, m.replacement))
        rank = seen.get(key, 0)
        seen[key] = rank + 1
        digest = hashlib.sha1(f"{key}\x1f{rank}".encode()).hexdigest()[:12]
        out.append(dataclasses.replace(m, id=digest))
    return out, invalid


def source_files(root: Path, src: str) -> list[str]:
    """The Python files that ``src`` names (paths relative to ``root``), in the order their mutants are
    enumerated: ``[src]`` for a file; for a package directory every ``*.py`` below it, sorted by path (so a
    folder's ``__init__.py`` comes before its other modules)."""
    if src.endswith(".py"):
        return [src]
    return sorted(p.relative_to(root).as_posix() for p in (root / src).rglob("*.py")
                  if "__pycache__" not in p.parts)


def enumerate_source(root: Path, src: str) -> tuple[list[Mutant], int]:
    """Every mutant of the file or package ``src`` (:func:`source_files`), module after module, each module's in
    source order (:func:`enumerate_mutants`); also the number dropped as not compiling."""
    mutants: list[Mutant] = []
    invalid = 0
    for rel in source_files(root, src):
        found, dropped = enumerate_mutants(root / rel, rel)
        mutants += found
        invalid += dropped
    return mutants, invalid


def sample_mutants(mutants: list[Mutant], n: int, seed: int, rel: str) -> list[Mutant]:
    """``n`` mutants drawn without replacement by ``random.Random(f"{seed}:{rel}")`` (all when ``n == 0``)."""
    if n == 0 or n >= len(mutants):
        return list(mutants)
    rng = random.Random(f"{seed}:{rel}")
    picked = sorted(rng.sample(range(len(mutants)), n))
    return [mutants[i] for i in picked]


# --------------------------------------------------------------------------------------------- equivalents


def load_equivalents(path: Path | None) -> dict[str, dict]:
    """``{id: entry}`` from a TOML file of ``[[equivalent]]`` tables (``id``, ``file``, ``reason`` required)."""
    if path is None or not path.exists():
        return {}
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    out = {}
    for i, e in enumerate(data.get("equivalent", [])):
        missing = [k for k in ("id", "file", "reason") if not str(e.get(k, "")).strip()]
        if missing:
            raise ValueError(f"{path}: equivalent entry {i} lacks {', '.join(missing)}")
        if e["id"] in out:
            raise ValueError(f"{path}: equivalent id {e['id']!r} listed twice")
        out[e["id"]] = e
    return out


# ------------------------------------------------------------------------------------------------ running


def _tree_files(root: Path) -> list[str]:
    """Files of the working tree that git tracks or would track (ignored build outputs excluded)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=root,
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"mutation: cannot list the files of {root} with git: {exc}") from exc
    return [f for f in out.decode().split("\0") if f and (root / f).is_file()]


def _copy_tree(root: Path, files: list[str], dest: Path) -> None:
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, target)


def _env(tree: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra or {})
    env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a stale .pyc of another mutant must never be imported
    env["PYTHONHASHSEED"] = "0"
    return env


def _module_name(rel: str) -> str:
    name = rel[: -len(".py")].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _check_imports_from(tree: Path, rels: list[str]) -> None:
    """The copy, not an installed or editable package, must be what the tests import."""
    code = "import importlib,sys\nfor n in sys.argv[1:]: print(importlib.import_module(n).__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code, *(_module_name(r) for r in rels)],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"mutation: cannot import the modules under test from the copy:\n{out.stderr}")
    for rel, got in zip(rels, out.stdout.split(), strict=True):
        if Path(got).resolve() != (tree / rel).resolve():
            raise SystemExit(f"mutation: {_module_name(rel)} imports from {got}, not from the copy {tree / rel}")


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def _classify(rc: int | None, output: str, dt: float) -> tuple[str, float, str]:
    """Outcome of one pytest run: ``rc`` None means it ran past the timeout."""
    if rc is None:
        return "timeout", dt, ""
    if rc == 0:
        return "survived", dt, ""
    if rc in (1, 2):  # tests failed, or collecting (importing) the mutated module failed
        m = _FAILED.search(output)
        last = output.strip().splitlines()[-1] if output.strip() else ""
        return "killed", dt, m.group(1) if m else _one_line(last)
    return "error", dt, _one_line(f"pytest exit {rc}: {output[-600:]}", 300)


class SubprocessRunner:
    """One fresh ``python -m pytest`` per mutant (simple, slow: every run re-imports numpy, scipy, pytest)."""

    def __init__(self, tree: Path, preload: list[str], env: dict[str, str] | None = None):
        self.tree = tree
        self.env = _env(tree, env)

    def run(self, test_file: str, timeout: float) -> tuple[str, float, str]:
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", *PYTEST_ARGS, *test_file.split(",")],
                cwd=self.tree,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return _classify(None, "", time.perf_counter() - t0)
        return _classify(proc.returncode, proc.stdout, time.perf_counter() - t0)

    def close(self) -> None:
        pass


class ForkRunner:
    """A single-threaded server process per tree that has imported the third-party modules once (numpy, scipy,
    pytest, …, never the project's own packages) and forks a child per mutant that runs ``pytest.main``: the
    child imports the mutated module from the tree, exactly as a fresh interpreter would, at a fraction of the
    start-up cost. The child runs in its own process group, killed whole on timeout."""

    def __init__(self, tree: Path, preload: list[str], env: dict[str, str] | None = None):
        self.tree = tree
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve", str(tree), *preload],
            cwd=tree,
            env=_env(tree, env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            raise SystemExit(f"mutation: the test server for {tree} did not start ({ready!r})")

    def run(self, test_file: str, timeout: float) -> tuple[str, float, str]:
        self.proc.stdin.write(json.dumps({"test": test_file, "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return _classify(reply["rc"], reply["output"], reply["seconds"])

    def close(self) -> None:
        """End the server; a server still busy (the run was interrupted) is terminated with its test run."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def _serve(tree: str, preload: list[str]) -> int:
    """Body of the ``--serve`` process (see :class:`ForkRunner`); requests and replies are JSON lines."""
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # a module that fails here fails again, visibly, in the test run
            pass
    # pytest plugins (hypothesis, benchmark) and their packages: every run loads them, and pytest would otherwise
    # assertion-rewrite all of a plugin's package again in every child (there is no bytecode cache to reuse)
    for ep in entry_points(group="pytest11"):
        packages = {f.parts[0] for f in (ep.dist.files or ()) if len(f.parts) == 2 and f.parts[1] == "__init__.py"}
        for name in [ep.module, *sorted(packages)]:
            try:
                importlib.import_module(name)
            except Exception:  # as above
                pass
    os.chdir(tree)
    sys.path.insert(0, tree)
    sys.dont_write_bytecode = True
    out = sys.stdout
    current = {"pid": 0}

    def stop(signum, frame):  # terminated by the runner: take the test run in progress along
        if current["pid"]:
            try:
                os.killpg(current["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    print("ready", file=out, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        with tempfile.TemporaryFile(mode="w+b") as log:
            t0 = time.perf_counter()
            pid = os.fork()
            if pid == 0:  # child: run the tests, never return into the server loop
                rc = 70
                try:
                    os.setpgid(0, 0)
                    os.dup2(log.fileno(), 1)
                    os.dup2(log.fileno(), 2)
                    import pytest

                    rc = int(pytest.main([*PYTEST_ARGS, *req["test"].split(",")]))
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(rc)
            current["pid"] = pid
            rc = None
            deadline = t0 + float(req["timeout"])
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    rc = os.waitstatus_to_exitcode(status)
                    break
                if time.perf_counter() > deadline:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.005)
            current["pid"] = 0
            dt = time.perf_counter() - t0
            log.seek(0)
            output = log.read().decode(errors="replace")[-4000:]
        print(json.dumps({"rc": rc, "seconds": dt, "output": output}), file=out, flush=True)
    return 0


def _preload_modules(paths: list[Path]) -> list[str]:
    """Top-level third-party modules imported by the given files (the project's own packages excluded)."""
    own = {p.name for p in REPO.iterdir() if p.is_dir()} | {p.stem for p in REPO.glob("*.py")}
    own |= {q.stem for p in paths for q in p.parent.glob("*.py")}  # helpers imported next to the test files
    names = {"numpy", "pytest"}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return sorted(n for n in names if n.split(".")[0] not in own and n != "__future__")


RUNNERS = {"fork": ForkRunner, "subprocess": SubprocessRunner}


@dataclasses.dataclass
class FileReport:
    file: str
    tests: str
    total_mutants: int
    invalid: int
    sampled: int
    baseline_s: float
    timeout_s: float
    functions: list[str] = dataclasses.field(default_factory=list)  # empty: the whole file
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    results: list[dict] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return self.file + (f"::{','.join(self.functions)}" if self.functions else "")

    def counts(self) -> dict[str, int]:
        c = {k: 0 for k in ("killed", "survived", "timeout", "equivalent", "error")}
        for r in self.results:
            c[r["status"]] += 1
        return c

    def kill_rate(self) -> float | None:
        c = self.counts()
        denom = c["killed"] + c["timeout"] + c["survived"]
        return None if denom == 0 else (c["killed"] + c["timeout"]) / denom

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["counts"] = self.counts()
        d["kill_rate"] = self.kill_rate()
        d["results"] = sorted(self.results, key=lambda r: (r.get("file", self.file), r["line"], r["col"], r["id"]))
        return d


@dataclasses.dataclass(frozen=True)
class Target:
    """One ``--files`` entry ``SRC[::FUNCTIONS][=TESTS][@ENV]`` (module docstring)."""

    src: str
    tests: str  # comma-separated test files
    functions: tuple[str, ...] = ()  # empty: the whole file
    env: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return self.src + (f"::{','.join(self.functions)}" if self.functions else "")

    def selects(self, m: Mutant) -> bool:
        return not self.functions or any(m.function == f or m.function.startswith(f + ".") for f in self.functions)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def default_test_file(src: str) -> str:
    """The test file of a source file when none is named: the tests mirror the layout, so ``sim/hull.py`` is
    tested by ``tests/sim/test_hull.py`` and ``verification/core/search.py`` by
    ``tests/verification/core/test_search.py``."""
    path = Path(src)
    return (Path("tests") / path.parent / f"test_{path.stem}.py").as_posix()


def _parse_files(specs: list[str]) -> list[Target]:
    targets = []
    for spec in specs:
        head, _, env_text = spec.partition("@")
        head, _, tests = head.partition("=")
        src, sep, funcs = head.partition("::")
        src = src.strip().rstrip("/")
        if not src.endswith(".py") and not (REPO / src / "__init__.py").is_file():
            raise ValueError(f"--files: {spec!r} is neither a Python source file nor a package directory")
        functions = tuple(f.strip() for f in funcs.split(",")) if sep else ()
        if any(not f for f in functions):
            raise ValueError(f"--files: {spec!r}: an empty function name after '::'")
        test_files = [t.strip() for t in tests.split(",")] if tests.strip() else [default_test_file(src)]
        for p in ([] if (REPO / src).is_dir() else [src]) + test_files:  # a package's __init__.py is checked above
            if not p or not (REPO / p).is_file():
                raise ValueError(f"--files: {p!r} does not exist (relative to {REPO.name}/)")
        env = []
        for item in env_text.split(",") if env_text.strip() else ():
            name, eq, value = item.strip().partition("=")
            if not eq or not _ENV_NAME.fullmatch(name):
                raise ValueError(f"--files: {spec!r}: {item.strip()!r} after '@' is not NAME=VALUE")
            env.append((name, value))
        targets.append(Target(src, ",".join(test_files), functions, tuple(env)))
    labels = [t.label for t in targets]
    for label in labels:
        if labels.count(label) > 1:
            raise ValueError(f"--files: {label!r} is given twice")
    return targets


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python tools/mutation.py",
        description="Mutation testing: sample mutants of each source file and run its own test file against them.",
    )
    p.add_argument("--files", nargs="+", default=list(DEFAULT_FILES), metavar="SRC[::FUNCTIONS][=TESTS][@ENV]",
                   help="source files or package directories (every module below one) relative to the repository "
                        "root (default: %(default)s); the test file is "
                        "tests/<folder>/test_<name>.py (the mirrored layout) unless given as SRC=TESTS (several test files separated by commas); "
                        "::F1,F2 restricts the mutants to those functions; @NAME=VALUE,... sets environment "
                        "variables for that file's test runs")
    p.add_argument("--n", type=int, default=60, help="mutants sampled per file; 0 for all (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=1, help="parallel test runs, each in its own copy (default: 1)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per mutant (default: max(30, 10 x the unmutated run of that test file))")
    p.add_argument("--json", type=Path, default=Path("reports/mutation.json"),
                   help="JSON report, rewritten after every mutant (default: %(default)s)")
    p.add_argument("--equivalents", type=Path, default=DEFAULT_EQUIVALENTS,
                   help="TOML list of equivalent mutants (default: tools/mutation_equivalents.toml)")
    p.add_argument("--fail-under", type=float, default=None, metavar="RATE",
                   help="exit 1 if a file's kill rate is below RATE (a fraction, e.g. 0.9)")
    p.add_argument("--runner", choices=sorted(RUNNERS), default="fork" if hasattr(os, "fork") else "subprocess",
                   help="fork: a preloaded server forks a pytest per mutant (default on POSIX); subprocess: a fresh "
                        "interpreter per mutant")
    p.add_argument("--rerun", type=Path, default=None, metavar="REPORT",
                   help="run only the mutants that survived (or timed out, or were equivalent) in an earlier JSON "
                        "report, e.g. after adding tests; a quick check, not a kill-rate measurement")
    p.add_argument("--list", action="store_true", help="list the sampled mutants and exit without running tests")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return _serve(argv[1], argv[2:])
    parser = build_parser()
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # clean up copies and servers
    if args.n < 0:
        parser.error(f"argument --n: must be >= 0; got {args.n}")
    if args.jobs < 1:
        parser.error(f"argument --jobs: must be >= 1; got {args.jobs}")
    if args.timeout is not None and not (args.timeout > 0):
        parser.error(f"argument --timeout: must be > 0; got {args.timeout}")
    if args.fail_under is not None and not (0.0 <= args.fail_under <= 1.0):
        parser.error(f"argument --fail-under: must be a fraction in [0, 1]; got {args.fail_under}")
    try:
        targets = _parse_files(args.files)
        equivalents = load_equivalents(args.equivalents)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        parser.error(str(exc))
    out_path = args.json if args.json.is_absolute() else Path.cwd() / args.json
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        with open(out_path, "a"):
            pass
    except OSError as exc:
        parser.error(f"argument --json: cannot write {args.json}: {exc}")

    rerun = None
    if args.rerun is not None:
        try:
            previous = json.loads(args.rerun.read_text())
            rerun = {r["id"] for f in previous["files"] for r in f["results"] if r["status"] != "killed"}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"argument --rerun: cannot read the survivors of {args.rerun}: {exc}")
    plans = []
    all_ids = set()
    for t in targets:
        every, invalid = enumerate_source(REPO, t.src)
        all_ids |= {m.id for m in every}
        mutants = [m for m in every if t.selects(m)]
        if t.functions and not mutants:
            parser.error(f"argument --files: {t.label} selects no mutant (no such function in {t.src})")
        if rerun is None:
            picked = sample_mutants(mutants, args.n, args.seed, t.label)
        else:
            picked = [m for m in mutants if m.id in rerun]
        plans.append((t, mutants, invalid, picked))
        env = "".join(f" {k}={v}" for k, v in t.env)
        print(f"{t.label}: {len(mutants)} mutants ({invalid} of the file not compiling dropped), {len(picked)} "
              f"sampled (seed {args.seed}); tests {t.tests}{env}", file=sys.stderr)
    if args.list:
        for *_, picked in plans:
            for m in picked:
                print(f"{m.where}\t{m.id}\t{m.function}\t{m.operator}\t{m.change}")
        return 0

    files = _tree_files(REPO)
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        trees = []
        for j in range(args.jobs):
            t = Path(tmp) / f"tree{j}"
            _copy_tree(REPO, files, t)
            trees.append(t)
        _check_imports_from(trees[0], sorted({f for t, *_ in plans for f in source_files(REPO, t.src)}))
        preload = _preload_modules([REPO / p for t, *_ in plans
                                    for p in (*source_files(REPO, t.src), *t.tests.split(","))])
        runners: dict = {}  # (tree, env) -> runner, started on first use: one server per environment
        try:
            reports = _run_all(args, plans, trees, runners, preload, equivalents, out_path)
        finally:
            for r in runners.values():
                r.close()

    checked = {f for t, *_ in plans for f in source_files(REPO, t.src)}
    stale = sorted(i for i, e in equivalents.items() if e["file"] in checked and i not in all_ids)
    return _summary(args, reports, equivalents, stale)


def run_meta(args) -> dict:
    """The ``meta`` of the JSON report: when and on which CPU it ran (named as the speed reports name it:
    :func:`sim.cli.cpu_name`; the docs' mutation table shows both), with the settings of the run."""
    from sim.cli import cpu_name

    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "cpu": cpu_name(),
            "rerun_of": None if args.rerun is None else str(args.rerun), "seed": args.seed, "n": args.n,
            "jobs": args.jobs, "runner": args.runner, "python": sys.version.split()[0],
            "pytest_args": list(PYTEST_ARGS), "equivalents": str(args.equivalents),
            "kill_rate": "(killed + timeout) / (killed + timeout + survived); equivalent and error excluded"}


def _run_all(args, plans, trees, runners, preload, equivalents, out_path) -> dict[str, FileReport]:
    """Baseline run of every test file, then every sampled mutant on the free copies; the report is rewritten
    after each mutant. ``runners`` (filled here) maps ``(tree, env)`` to the runner of that copy and environment."""
    lock = threading.Lock()

    def runner_for(tree: Path, env: tuple[tuple[str, str], ...]):
        with lock:
            if (tree, env) not in runners:
                runners[(tree, env)] = RUNNERS[args.runner](tree, preload, dict(env))
            return runners[(tree, env)]

    reports: dict[str, FileReport] = {}
    for t, mutants, invalid, picked in plans:
        status, dt, info = runner_for(trees[0], t.env).run(t.tests, timeout=600)
        if status != "survived":
            raise SystemExit(f"mutation: {t.tests} does not pass on the unmutated tree ({status}: {info})")
        timeout = args.timeout if args.timeout is not None else max(30.0, 10 * dt)
        reports[t.label] = FileReport(t.src, t.tests, len(mutants), invalid, len(picked), round(dt, 2), timeout,
                                      functions=list(t.functions), env=dict(t.env))

    free: queue.Queue = queue.Queue()
    for tree in trees:
        free.put(tree)
    originals = {f: (REPO / f).read_bytes() for t, *_ in plans for f in source_files(REPO, t.src)}
    meta = run_meta(args)
    todo = [(t, m) for t, _, _, picked in plans for m in picked]
    done = 0

    def write_report() -> None:
        payload = {"meta": meta, "files": [r.to_json() for r in reports.values()]}
        tmp_out = out_path.with_suffix(out_path.suffix + ".tmp")
        tmp_out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
        tmp_out.replace(out_path)

    def one(t: Target, m: Mutant) -> None:
        nonlocal done
        tree = free.get()
        try:
            target = tree / m.file
            target.write_bytes(m.apply(originals[m.file]))
            try:
                status, dt, info = runner_for(tree, t.env).run(t.tests, reports[t.label].timeout_s)
            finally:
                target.write_bytes(originals[m.file])
        finally:
            free.put(tree)
        eq = equivalents.get(m.id)
        if eq is not None:
            if status == "survived":
                status, info = "equivalent", eq["reason"]
            else:
                info = f"listed as equivalent but {status}: {info}"
        row = {"id": m.id, "file": m.file, "line": m.line, "col": m.col, "where": m.where, "function": m.function,
               "operator": m.operator, "change": m.change, "source_line": m.source_line,
               "status": status, "seconds": round(dt, 2), "info": info}
        with lock:
            reports[t.label].results.append(row)
            done += 1
            write_report()
            print(f"[{done}/{len(todo)}] {status:10s} {m.where} {m.operator}: {m.change}", file=sys.stderr)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for fut in [pool.submit(one, *t) for t in todo]:
            fut.result()
    write_report()
    return reports


def _summary(args, reports: dict[str, FileReport], equivalents: dict[str, dict], stale: list[str]) -> int:
    failed = False
    print("\nfile                    total sampled  killed survived timeout equivalent error  kill rate")
    for r in reports.values():
        c = r.counts()
        rate = r.kill_rate()
        print(f"{r.label:24s}{r.total_mutants:5d} {r.sampled:7d} {c['killed']:7d} {c['survived']:8d} "
              f"{c['timeout']:7d} {c['equivalent']:10d} {c['error']:5d}  "
              + ("   n/a" if rate is None else f"{100 * rate:6.1f} %"))
        if args.fail_under is not None and rate is not None and rate < args.fail_under:
            failed = True
    survivors = [(r.label, x) for r in reports.values() for x in r.to_json()["results"] if x["status"] == "survived"]
    if survivors:
        print("\nsurvivors:")
        for _, x in survivors:
            print(f"  {x['where']} [{x['id']}] {x['function']} {x['operator']}: {x['change']}")
    odd = [x for r in reports.values() for x in r.results if x["info"].startswith("listed as equivalent")]
    for x in odd:
        print(f"warning: {x['where']} [{x['id']}] {x['info']}", file=sys.stderr)
    for i in stale:
        print(f"warning: equivalent entry {i} ({equivalents[i]['file']}) matches no current mutant", file=sys.stderr)
    print(f"\nreport: {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
