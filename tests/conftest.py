"""Fixtures shared by the command-line and report tests: statements that must not run, and a run interrupted
as Ctrl-C would interrupt it."""

from __future__ import annotations

import os

import pytest

from verification import registry

# OpenMP threads that spin on a CPU shared with other jobs multiply torch's CPU time many times over (see
# llm_runs/__main__.py, OMP_ENV); set before any test module imports torch. A value set by the caller is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_RUN_STATEMENT = registry.run_statement


@pytest.fixture
def no_statement_runs(monkeypatch):
    """Fail the test if any statement runs (a usage error must be found before any work)."""

    def fail(*args, **kwargs):
        raise AssertionError("a statement ran after a usage error")

    monkeypatch.setattr(registry, "run_statement", fail)


@pytest.fixture
def interrupt_after(monkeypatch):
    """``interrupt_after(k)``: from now on the (k+1)-th statement to run raises KeyboardInterrupt (as Ctrl-C
    would); returns the list of the ids that ran, filled as they run. Each call starts a new count."""

    def arm(k: int) -> list[str]:
        ran: list[str] = []

        def run(stmt, *args, **kwargs):
            if len(ran) == k:
                raise KeyboardInterrupt
            ran.append(stmt.id)
            return _RUN_STATEMENT(stmt, *args, **kwargs)

        monkeypatch.setattr(registry, "run_statement", run)
        return ran

    return arm
