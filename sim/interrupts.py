"""Ctrl-C in the project's command lines: one line and exit status 130, never a traceback, from the first line of a
command's own code to its end (the conventions of :mod:`sim.cli`, which re-exports these names).

The first code of the project that a command runs, its package's ``__init__`` (``python -m llm_runs``, ``python
-m sim.simulate``, ``python -m verification``, ``python -m prefalign`` and the ``prefalign`` console script), calls
:func:`quiet_if_started_as`: from there until the command takes over the handling, a Ctrl-C prints ``<prog>: interrupted while starting (nothing ran)`` and
exits 130 at once, wherever it lands (an import of numpy or torch, the parser's construction). The command takes
over with :func:`interrupts_recorded` around its work, where a Ctrl-C raises ``KeyboardInterrupt`` as usual, which
the command turns into its own one line (what was kept, what to run again). Only what runs before the entry
package's first line, Python's own start (the interpreter and ``site``), is outside the project's reach.

A Ctrl-C that arrives while Python runs a weak-reference callback (the import system's module locks use one) raises
its ``KeyboardInterrupt`` where Python only prints "Exception ignored" and goes on, so the command would run to its
end. Under :func:`interrupts_recorded` every Ctrl-C is also recorded, and :func:`raise_if_interrupted`, called at
the points where a command can stop cleanly, raises the one that was lost. A command line's ``main`` passes the
status its command returned through :func:`exit_status`, so that a Ctrl-C lost after the last such point still ends
the command with the one line and 130, not with 0 (a Ctrl-C that lands in the import of a C extension comes out as
that module's ``ImportError``, which a library's ``try: import ... except ImportError`` swallows without a word).

This module imports only ``os``, ``signal`` and ``sys`` (``threading`` when a command takes over), so that the
packages reach the handler in about a millisecond.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

__all__ = ["EXIT_INTERRUPTED", "quiet_if_started_as", "quiet_until_handled", "interrupts_recorded",
           "interrupt_pending", "raise_if_interrupted", "exit_status"]

#: Exit status of a command interrupted by Ctrl-C (128 + SIGINT, the shell's convention).
EXIT_INTERRUPTED = 130

#: Set by the SIGINT handler of :func:`interrupts_recorded`, cleared by :func:`raise_if_interrupted`.
_interrupt_pending = False
#: The name the start handler's line gives the command (:func:`quiet_until_handled`).
_starting_prog = ""


def _exit_while_starting(signum: int, frame: FrameType | None) -> None:
    os.write(2, f"{_starting_prog}: interrupted while starting (nothing ran)\n".encode())
    os._exit(EXIT_INTERRUPTED)  # nothing to flush or clean: the command has not begun its work


def quiet_until_handled(prog: str) -> None:
    """From now until a command enters :func:`interrupts_recorded`, a Ctrl-C prints ``<prog>: interrupted while
    starting (nothing ran)`` on stderr and exits with status 130 (no traceback, no cleanup: nothing ran yet).

    Called by an entry module as its first statement, and only there (it replaces the process's SIGINT handler).
    Only where Python's own handler is installed, in the main thread: a process that ignores SIGINT (a job started
    in the background) or handles it itself keeps its handler."""
    global _starting_prog
    if signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, _exit_while_starting):
        return
    _starting_prog = prog
    try:
        signal.signal(signal.SIGINT, _exit_while_starting)
    except ValueError:  # not the main thread
        pass


def quiet_if_started_as(module: str, prog: str, script: str | None = None) -> None:
    """:func:`quiet_until_handled` (``prog``) when this process is the command ``python -m module`` and Python is
    still importing it (``sys.argv[0]`` is ``"-m"`` until ``runpy`` has found the module: the package's
    ``__init__``, the first code of the project such a command runs, calls this), or the console script named
    ``script`` (``sys.argv[0]``); a no-op in any other process (a library import, a test)."""
    before = signal.getsignal(signal.SIGINT)
    quiet_until_handled(prog)  # first, then look: the window before the handler is a few bytecodes
    argv = list(getattr(sys, "orig_argv", ()))
    k = next((i for i, a in enumerate(argv) if a.startswith("-m")), None)
    name = None if k is None else argv[k][2:] or (argv[k + 1] if k + 1 < len(argv) else None)
    ours = (sys.argv[:1] == ["-m"] and name == module) or (
        script is not None and bool(sys.argv[:1]) and os.path.basename(sys.argv[0]) == script)
    if not ours and signal.getsignal(signal.SIGINT) is _exit_while_starting and before is not None:
        signal.signal(signal.SIGINT, before)


def _record_interrupt(signum: int, frame: FrameType | None) -> None:
    global _interrupt_pending
    _interrupt_pending = True
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt where the signal lands


class interrupts_recorded:  # noqa: N801 - used as a function: ``with interrupts_recorded():``
    """Within the block, a Ctrl-C raises ``KeyboardInterrupt`` as usual and is also recorded, so that
    :func:`raise_if_interrupted` raises one that Python swallowed (in a weak-reference callback or a ``__del__``).
    Python reports such a swallowed ``KeyboardInterrupt`` through ``sys.unraisablehook`` ("Exception ignored in ...",
    with its traceback); within the block that report is dropped, since the Ctrl-C is recorded and ends the command
    with its one line (:func:`raise_if_interrupted`, :func:`exit_status`); every other report goes to the hook that
    was in place, which is back on exit.

    Only where Python's own handler (or the start handler of :func:`quiet_until_handled`, which it replaces) is
    installed, in the main thread: a process that ignores SIGINT (a job started in the background) or handles it
    itself keeps its handler. Nested blocks keep the outer one's. On exit Python's own handler is back."""

    def __enter__(self) -> None:
        import threading

        global _interrupt_pending
        self.installed = (threading.current_thread() is threading.main_thread()
                          and signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _exit_while_starting))
        if self.installed:
            _interrupt_pending = False
            signal.signal(signal.SIGINT, _record_interrupt)
            self.hook = sys.unraisablehook
            sys.unraisablehook = self._report

    def _report(self, unraisable) -> None:
        if unraisable.exc_type is KeyboardInterrupt and _interrupt_pending:
            return  # a recorded Ctrl-C: it ends the command with its one line, not with a traceback
        self.hook(unraisable)

    def __exit__(self, *exc: object) -> None:
        global _interrupt_pending
        if self.installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.unraisablehook = self.hook
            _interrupt_pending = False


def interrupt_pending() -> bool:
    """Whether a Ctrl-C was recorded under :func:`interrupts_recorded` and not yet raised by
    :func:`raise_if_interrupted`: an exception raised then is that Ctrl-C in disguise (a ``KeyboardInterrupt`` inside
    the import of a C extension, e.g. numpy's import of ``datetime``, comes out as that module's ``ImportError``)."""
    return _interrupt_pending


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` if a Ctrl-C was recorded under :func:`interrupts_recorded` since the last call
    (whether or not its own ``KeyboardInterrupt`` reached a handler); a no-op otherwise, and in any thread but the
    main one (where the handler runs)."""
    import threading

    global _interrupt_pending
    if _interrupt_pending and threading.current_thread() is threading.main_thread():
        _interrupt_pending = False
        raise KeyboardInterrupt


def exit_status(status: int, prog: str) -> int:
    """The exit status of a command that returned ``status`` under :func:`interrupts_recorded` (called inside the
    block): ``status``, unless the command ended in success while a Ctrl-C was recorded that nothing raised (Python
    or a library swallowed its ``KeyboardInterrupt``). Then it prints ``<prog>: interrupted (the command had run to
    its end: what it wrote is complete)`` on stderr and returns :data:`EXIT_INTERRUPTED`, so that a Ctrl-C is never
    answered by a silent 0. A failure or usage status stands (its own line says more than the interrupt would), and
    so does 130 (the command printed its line). The recorded Ctrl-C is cleared either way."""
    global _interrupt_pending
    lost, _interrupt_pending = _interrupt_pending, False
    if lost and status == 0:
        sys.stdout.flush()
        print(f"{prog}: interrupted (the command had run to its end: what it wrote is complete)", file=sys.stderr,
              flush=True)
        return EXIT_INTERRUPTED
    return status
