"""Command-line plumbing shared by the project's command lines (``python -m sim.simulate``,
``python -m verification``): one-line usage errors, argument types, output-path checks and atomic writes.

Usage errors follow argparse's convention, exit status 2, and are found before any work: the argument types
below reject a bad value while the command line is parsed, and :func:`check_writable_dir` /
:func:`check_writable_file` are called before the first computation, so a run never fails at its end on a path it
could have checked at its start. A :class:`ArgumentParser` raises :class:`UsageError` instead of printing its usage
block; the ``main`` of a command line catches it and prints it as one line with :func:`print_usage_error`::

    python -m verification run: error: argument --seed: must be an integer >= 0; got '-1'
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

__all__ = [
    "EXIT_USAGE",
    "UsageError",
    "ArgumentParser",
    "print_usage_error",
    "seed",
    "positive_int",
    "nonnegative_float",
    "positive_float",
    "seed_range",
    "check_writable_dir",
    "check_writable_file",
    "atomic_write_text",
]

#: Exit status of a usage error (argparse's convention).
EXIT_USAGE = 2


class UsageError(ValueError):
    """A bad command line: printed as one line ``<prog>: error: <message>``, exit status :data:`EXIT_USAGE`.

    The message names the argument (``argument --out: ...``) and the offending value."""

    def __init__(self, message: str, prog: str | None = None):
        super().__init__(message)
        self.prog = prog


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose parse errors raise :class:`UsageError` (subparsers inherit it).

    argparse prints the whole usage block before the error; a command line of this project prints the error
    alone, on one line (``--help`` still shows the usage)."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise UsageError(message, prog=self.prog)


def print_usage_error(exc: UsageError, prog: str) -> int:
    """Print ``exc`` as one line on stderr (prefixed with the parser's prog) and return :data:`EXIT_USAGE`."""
    message = " ".join(str(exc).split())  # one line, whatever the message held
    print(f"{exc.prog or prog}: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def seed(text: str) -> int:
    """argparse type of a seed: an integer >= 0.

    Seeds go to ``numpy.random.default_rng`` (a ``SeedSequence``), whose domain is the non-negative integers; a
    negative seed is refused here rather than mapped to some other seed, so that every accepted seed names one
    stream and ``--seed N`` reads the same in every command."""
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0; got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"must be an integer >= 0 (numpy.random.default_rng takes no negative seed); got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type of a count: an integer >= 1."""
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse type of a tolerance: a finite float >= 0 (``nan``, ``inf`` and negatives are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0; got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0; got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type of a duration or a scale: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {text!r}")
    return value


def seed_range(text: str) -> range:
    """argparse type of a range of seeds ``A:B``: the seeds ``A, A+1, ..., B-1`` (Python's half-open range), with
    integers ``0 <= A < B``; ``0:4`` is the four seeds 0, 1, 2, 3."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        a, b = (int(x.strip(), 10) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be A:B with integers 0 <= A < B (the seeds A, ..., B-1); got {text!r}"
                                         ) from None
    if a < 0 or b <= a:
        raise argparse.ArgumentTypeError(f"must be A:B with integers 0 <= A < B (the seeds A, ..., B-1); got {text!r}")
    return range(a, b)


def _dir_problem(p: Path) -> str | None:
    """Why directory ``p`` cannot be created or written (None: it can; it is created if missing)."""
    if p.exists() and not p.is_dir():
        return "it exists and is not a directory"
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def check_writable_dir(path: str | Path, option: str) -> Path:
    """Create directory ``path`` (and its parents) if missing and check that a file can be created in it.

    Raises :class:`UsageError` naming ``option``, the path and the reason otherwise. The probe file is removed."""
    p = Path(path)
    problem = _dir_problem(p)
    if problem is not None:
        raise UsageError(f"argument {option}: cannot write to directory {str(p)!r}: {problem}")
    return p


def check_writable_file(path: str | Path, option: str) -> Path:
    """Check that file ``path`` can be written: not a directory, its directory creatable and writable, and, if
    the file exists, openable for writing (its content is left as it is). Raises :class:`UsageError`."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"argument {option}: {str(p)!r} is a directory, not a file")
    problem = _dir_problem(p.parent)
    if problem is not None:
        raise UsageError(f"argument {option}: cannot write {str(p)!r}: directory {str(p.parent)!r}: {problem}")
    if p.exists():
        try:
            with open(p, "a"):
                pass
        except OSError as exc:
            raise UsageError(f"argument {option}: cannot write {str(p)!r}: {exc.strerror or exc}") from None
    return p


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file in the same directory, flushed to disk, then
    renamed over ``path`` (``os.replace``), so that readers see the old file or the new one, never a part."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # the permissions of a plain open(), not mkstemp's 0600
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
