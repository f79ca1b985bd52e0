"""Command-line plumbing shared by the project's command lines (``python -m sim.simulate``,
``python -m verification``, ``python -m llm_runs``): one-line usage errors, argument types, output-path checks,
atomic writes, the writer lock of an output folder (:func:`writer_lock`) and the name of the CPU that speed reports
quote.

Usage errors follow argparse's convention, exit status 2, and are found before any work: the argument types
below reject a bad value while the command line is parsed, and :func:`check_writable_dir` /
:func:`check_writable_file` are called before the first computation, so a run never fails at its end on a path it
could have checked at its start. A :class:`ArgumentParser` raises :class:`UsageError` instead of printing its usage
block; the ``main`` of a command line catches it and prints it as one line with :func:`print_usage_error`::

    python -m verification run: error: argument --seed: must be an integer >= 0; got '-1'

Exit status, the same in every command line (``prefalign`` and the ``python -m`` forms): :data:`EXIT_OK` (0) on
success, :data:`EXIT_FAIL` (1) when the work ran and what it checks failed (a verdict, a negative control, a
regression against a baseline; each command's ``--help`` says what), :data:`EXIT_USAGE` (2) on a usage error and
:data:`EXIT_INTERRUPTED` (130) when interrupted (Ctrl-C). :func:`exit_status_help` writes that list for a
command's ``--help``.

A Ctrl-C is one line and exit 130 from the first line of a command's entry module (:mod:`sim.interrupts`:
:func:`quiet_until_handled`, :func:`interrupts_recorded`, :func:`raise_if_interrupted`, :func:`exit_status`,
re-exported here).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from sim import interrupts as _interrupts

__all__ = [
    "EXIT_OK",
    "EXIT_FAIL",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
    "interrupts_recorded",
    "exit_status",
    "raise_if_interrupted",
    "interrupt_pending",
    "quiet_until_handled",
    "exit_status_help",
    "UsageError",
    "ArgumentParser",
    "print_usage_error",
    "sub_commands",
    "seed",
    "positive_int",
    "nonnegative_float",
    "positive_float",
    "seed_range",
    "check_writable_dir",
    "check_writable_file",
    "writer_lock",
    "atomic_write_text",
    "cpu_name",
]

#: Exit status of a command that ran and whose checks passed.
EXIT_OK = 0
#: Exit status of a command that ran and whose checks failed (a verdict, a negative control, a regression).
EXIT_FAIL = 1
#: Exit status of a usage error (argparse's convention).
EXIT_USAGE = 2
#: Exit status of a command interrupted by Ctrl-C (128 + SIGINT, the shell's convention).
EXIT_INTERRUPTED = _interrupts.EXIT_INTERRUPTED
interrupts_recorded = _interrupts.interrupts_recorded
raise_if_interrupted = _interrupts.raise_if_interrupted
interrupt_pending = _interrupts.interrupt_pending
exit_status = _interrupts.exit_status
quiet_until_handled = _interrupts.quiet_until_handled


def exit_status_help(fail: str | None = None, width: int = 100) -> str:
    """The "exit status" block of a command's ``--help`` (an argparse epilog, for a ``RawDescriptionHelpFormatter``).

    ``fail`` says when the command exits :data:`EXIT_FAIL` (None: it never does)."""
    rows = [(EXIT_OK, "success")] + ([(EXIT_FAIL, fail)] if fail else []) + [
        (EXIT_USAGE, "usage error: one line on stderr naming the argument and the value, found before any work"),
        (EXIT_INTERRUPTED, "interrupted (Ctrl-C)")]
    return "\n".join(["exit status:"] + [textwrap.fill(text, width=width, initial_indent=f"  {code:<5}",
                                                         subsequent_indent=" " * 7) for code, text in rows])


class UsageError(ValueError):
    """A bad command line: printed as one line ``<prog>: error: <message>``, exit status :data:`EXIT_USAGE`.

    The message names the argument (``argument --out: ...``) and the offending value."""

    def __init__(self, message: str, prog: str | None = None):
        super().__init__(message)
        self.prog = prog


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's raw-description formatter that never breaks a word at a hyphen (``mc-calibration``,
    ``--shipped-baseline`` stay whole on one line)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose parse errors raise :class:`UsageError` (subparsers inherit it).

    argparse prints the whole usage block before the error; a command line of this project prints the error
    alone, on one line (``--help`` still shows the usage). The help keeps the line breaks of the description and
    the epilog (the exit-status block of :func:`exit_status_help`); sub-commands added with
    ``add_subparsers().add_parser`` get the same formatter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # noqa: D401 - argparse's hook
        raise UsageError(message, prog=self.prog)


def print_usage_error(exc: UsageError, prog: str) -> int:
    """Print ``exc`` as one line on stderr (prefixed with the parser's prog) and return :data:`EXIT_USAGE`."""
    message = " ".join(str(exc).split())  # one line, whatever the message held
    print(f"{exc.prog or prog}: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def sub_commands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """The sub-commands of ``parser`` as ``(name, help, parser)``, in the order they were added (empty: it has
    none). Read from the parser itself, so that a listing of a command line's actions (``prefalign --help``, the
    documentation) follows the parser when a sub-command is added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


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


#: The most seeds one ``A:B`` range may hold (a sweep lists its cells before the first one runs).
MAX_SEEDS = 1_000_000


def seed_range(text: str) -> range:
    """argparse type of a range of seeds ``A:B``: the seeds ``A, A+1, ..., B-1`` (Python's half-open range), with
    integers ``0 <= A < B`` and at most :data:`MAX_SEEDS` seeds; ``0:4`` is the four seeds 0, 1, 2, 3."""
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
    if b - a > MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"holds {b - a} seeds, more than the {MAX_SEEDS} one range may hold; got "
                                         f"{text!r} (split it into several runs)")
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


@contextlib.contextmanager
def writer_lock(path: str | Path, option: str) -> Iterator[Path]:
    """:func:`check_writable_dir`, then hold the folder's writer lock (:mod:`sim.folder_lock`) until the block ends,
    normally, on an error or on Ctrl-C; yields the folder's path.

    A folder that another running command writes is a :class:`UsageError` naming ``option`` and that command (its
    pid, host, start time and command line): one writer per folder. A lock left by a process that ended without
    releasing it is taken over, with a note on stderr. A command calls this after its argument checks and before it
    reads what the folder holds (``params.json``, cells, a results log to resume), so that what it checked cannot
    change before it writes."""
    from sim.folder_lock import FolderLock, FolderLockError

    p = check_writable_dir(path, option)
    lock = FolderLock(p)
    try:
        lock.acquire(note=lambda msg: print(f"note: {msg}", file=sys.stderr, flush=True))
    except FolderLockError as exc:
        raise UsageError(f"argument {option}: {exc}") from None
    try:
        yield p
    finally:
        lock.release()


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


#: The CPU features a speed report names: vector and matrix extensions that decide float32 and bf16 matmul rates.
MATRIX_EXTENSIONS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16",
                     "amx_int8", "asimd", "sve", "bf16")


def cpu_extensions() -> tuple[str, ...]:
    """Which of :data:`MATRIX_EXTENSIONS` the CPU reports (the ``flags`` or ``Features`` line of ``/proc/cpuinfo``),
    in that order; ``()`` where there is no ``/proc``."""
    try:
        with open("/proc/cpuinfo") as fh:
            for ln in fh:
                key, _, val = ln.partition(":")
                if key.strip() in ("flags", "Features"):
                    have = set(val.split())
                    return tuple(f for f in MATRIX_EXTENSIONS if f in have)
    except OSError:
        pass
    return ()


def cpu_name() -> str:
    """The CPU as speed reports name it: the ``model name`` of ``/proc/cpuinfo`` with its family and model numbers
    (a virtual machine may report only a brand, e.g. ``AMD EPYC``) and the number of logical CPUs, e.g.
    ``AMD EPYC (family 26 model 2, 2 logical CPUs)``; ``platform.processor()`` where there is no ``/proc``."""
    import platform

    try:
        with open("/proc/cpuinfo") as fh:
            info = [ln.split(":", 1) for ln in fh if ":" in ln]
    except OSError:
        return platform.processor() or platform.machine()
    first: dict[str, str] = {}
    for k, v in info:
        first.setdefault(k.strip(), v.strip())
    n = sum(1 for k, _ in info if k.strip() == "processor")
    name = first.get("model name") or platform.processor() or platform.machine()
    detail = [f"family {first['cpu family']} model {first['model']}"] if "cpu family" in first and "model" in first \
        else []
    detail.append(f"{n} logical CPUs")
    return f"{name} ({', '.join(detail)})"
