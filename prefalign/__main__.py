"""The console script ``prefalign``: one command with the command lines of the project as sub-commands.

``prefalign verify ARGS`` runs ``python -m verification ARGS``, ``prefalign simulate ARGS`` runs ``python -m
sim.simulate ARGS`` and ``prefalign llm ARGS`` runs ``python -m llm_runs ARGS``: each sub-command hands the rest of
the command line to the ``main`` of its package, which parses it with its own parser (``build_parser``), so the
options are defined once and both forms of every command behave the same. Only the sub-command that runs is
imported: ``prefalign verify`` imports no torch, and ``prefalign llm`` imports torch only when an LLM action runs.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from sim import __version__, cli

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

PROG = "prefalign"


@dataclass(frozen=True)
class Command:
    """A sub-command: ``module.main(argv, prog)`` runs it; ``python_m`` is its ``python -m`` form.

    ``list_actions``: the top-level help lists the actions of the module's own parser (``module.build_parser``)
    after ``help``, so that an action added to that command line appears without an edit here."""

    module: str
    python_m: str
    help: str
    list_actions: bool = False

    def main(self) -> Callable[..., int]:
        return importlib.import_module(self.module).main

    def actions(self) -> list[str]:
        """The actions of the module's parser: ``name``, or ``name a|b`` for an action with sub-actions."""
        parser = importlib.import_module(self.module).build_parser()
        return [f"{name} {'|'.join(n for n, _, _ in cli.sub_commands(sub))}".rstrip()
                for name, _, sub in cli.sub_commands(parser)]

    def summary(self) -> str:
        """The line of the top-level help: what it does (with the actions), and its ``python -m`` form."""
        text = f"{self.help}: {', '.join(self.actions())}" if self.list_actions else self.help
        return f"{text} ({self.python_m})"


#: The sub-commands, by name.
COMMANDS: dict[str, Command] = {
    "verify": Command("verification.__main__", "python -m verification",
                      "the executable statements, their dashboard and sweeps", list_actions=True),
    "simulate": Command("sim.simulate", "python -m sim.simulate",
                        "Algorithm 1 end to end on a planted problem (trajectory.csv, summary.json)"),
    "llm": Command("llm_runs.__main__", "python -m llm_runs",
                   "the LLM runs (the actions that load the model need the llm extra)", list_actions=True),
}

_DESCRIPTION = """\
One command for prefalign-verify: the executable statements of the theory, Algorithm 1 on planted problems and
the LLM fine-tuning runs. `prefalign COMMAND --help` shows the options of a command; each is also available as
`python -m MODULE` (verify: verification, simulate: sim.simulate, llm: llm_runs)."""


def build_parser(*, summaries: bool = True) -> cli.ArgumentParser:
    """The top-level parser: ``--version``, ``--help`` and the names of the sub-commands (each sub-command parses
    its own arguments). ``summaries``: the help line of each sub-command, which lists the actions of its package's
    parser and so imports that package (about a second and a half for ``verify``); without them (``--version``,
    a usage error) the help lines are the bare descriptions."""
    parser = cli.ArgumentParser(
        prog=PROG, description=_DESCRIPTION,
        epilog=cli.exit_status_help("the command ran and what it checks failed: a verdict, a negative control, a "
                                    "regression against a baseline (see each command's --help)"))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        sub.add_parser(name, help=cmd.summary() if summaries else cmd.help, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``prefalign`` on ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        name = argv[0]
        with cli.interrupts_recorded():  # a Ctrl-C that Python swallows in an import is raised when it is done
            try:
                run = COMMANDS[name].main()
                cli.raise_if_interrupted()
                return cli.exit_status(run(argv[1:], prog=f"{PROG} {name}"), f"{PROG} {name}")
            except ImportError:  # a Ctrl-C inside a C extension's import (e.g. numpy's) comes out as its ImportError
                if not cli.interrupt_pending():
                    raise
                print(f"{PROG} {name}: interrupted while starting (nothing ran)", file=sys.stderr, flush=True)
                return cli.EXIT_INTERRUPTED
            except KeyboardInterrupt:  # before the command took over its own handling (its modules import for a
                # second or two): one line instead of a traceback; a command that was running handles it itself
                print(f"{PROG} {name}: interrupted while starting (nothing ran)", file=sys.stderr, flush=True)
                return cli.EXIT_INTERRUPTED
            except BrokenPipeError:  # output piped into a reader that closed early (e.g. `| head`)
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at interpreter exit
                return cli.EXIT_OK
    parser = build_parser(summaries=any(a in ("-h", "--help") for a in argv))
    try:
        unknown = next((a for a in argv if a.startswith("-") and a not in ("-h", "--help", "--version")), None)
        if unknown is not None:  # name it (argparse would only say that COMMAND is missing)
            raise cli.UsageError(f"unrecognized argument {unknown!r} before a command (one of "
                                 f"{', '.join(COMMANDS)}; prefalign COMMAND --help shows its options)")
        parser.parse_args(argv)  # --help, --version or a usage error: no sub-command was named
    except cli.UsageError as exc:
        return cli.print_usage_error(exc, PROG)
    return cli.EXIT_USAGE  # pragma: no cover - parse_args exits or raises without a known sub-command


if __name__ == "__main__":
    sys.exit(main())
