"""``make report``'s command line (``make -n``, nothing runs): with no arguments it rebuilds the committed dashboard
``reports/`` from the committed LLM sweep summaries; any other LLM source writes to a folder of its own."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _report_command(tmp_path, *variables: str) -> subprocess.CompletedProcess:
    stamp = tmp_path / "stamp"
    stamp.touch()  # newer than pyproject.toml and constraints.txt: make does not build a venv
    return subprocess.run(["make", "-n", "-C", str(ROOT), "report", "BIN=bin", f"STAMP={stamp}", *variables],
                          capture_output=True, text=True, timeout=60)


def _words(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.replace("\\\n", " ").splitlines() if "-m verification report" in ln]
    return line.split()


def _after(words: list[str], option: str) -> str | None:
    return words[words.index(option) + 1] if option in words else None


#: The committed dashboard's own copy of the gate, which make report reads for reports/ where there is one.
GATE = ("--llm-gate", "reports/llm-gate") if (ROOT / "reports" / "llm-gate" / "gate.json").is_file() else ()


@pytest.mark.parametrize("variables, out, llm", [
    ((), "reports", ("--llm-sweep", "reports/llm-sweep", *GATE)),
    (("LLM=smoke",), "runs/report-smoke", ()),
    (("LLM=none",), "runs/report-none", ("--no-llm",)),
    (("LLM_RUN=runs/llm-cpu",), "runs/report", ("--llm-run", "runs/llm-cpu")),
    (("LLM_RUN=none",), "runs/report", ("--no-llm",)),
    (("LLM_SWEEP=runs/llm-study",), "runs/report", ("--llm-sweep", "runs/llm-study")),
    (("LLM_SWEEP=runs/llm-study", "OUT=reports"), "reports", ("--llm-sweep", "runs/llm-study", *GATE)),
    (("LLM_GATE=runs/gate",), "runs/report", ("--llm-sweep", "reports/llm-sweep", "--llm-gate", "runs/gate")),
    (("SCALE=paper",), "runs/report", ("--llm-sweep", "reports/llm-sweep")),
])
def test_make_report_writes_reports_only_from_the_committed_inputs(tmp_path, variables, out, llm):
    words = _words(_report_command(tmp_path, *variables))
    assert _after(words, "--out") == out
    shown = [w for w in words if w in ("--llm-sweep", "--llm-run", "--llm-gate", "--no-llm")]
    assert shown == [w for w in llm if w.startswith("--")]
    for option, value in zip(llm, llm[1:], strict=False):
        if option.startswith("--") and not value.startswith("--"):
            assert _after(words, option) == value


def test_make_report_refuses_an_unknown_llm_source(tmp_path):
    proc = _report_command(tmp_path, "LLM=smok")
    assert proc.returncode == 2 and "LLM must be smoke or none" in proc.stderr and "'smok'" in proc.stderr
    assert "verification report" not in proc.stdout


def test_the_committed_dashboard_opens_with_its_own_copy_of_the_gate(tmp_path):
    """With no arguments the report reads the gate the committed dashboard was made with (reports/llm-gate/, where
    there is one); a named gate is read from its folder, and a dashboard of its own folder takes no gate unasked."""
    committed = (ROOT / "reports" / "llm-gate" / "gate.json").is_file()
    assert _after(_words(_report_command(tmp_path)), "--llm-gate") == ("reports/llm-gate" if committed else None)
    words = _words(_report_command(tmp_path, "LLM_GATE=runs/g", "OUT=reports"))
    assert _after(words, "--llm-gate") == "runs/g" and _after(words, "--out") == "reports"
    assert _after(_words(_report_command(tmp_path, "LLM=smoke")), "--llm-gate") is None
