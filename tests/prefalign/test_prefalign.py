"""The console script ``prefalign``: its sub-commands are the packages' command lines under one name (same options,
messages and exit status), its help states the exit status, and it works from any directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import sim
from prefalign.__main__ import COMMANDS, main

BIN = Path(sys.executable).parent


def _prefalign(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    exe = shutil.which("prefalign", path=str(BIN))
    assert exe is not None, f"the console script prefalign is not installed next to {sys.executable}"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_version_is_written_once():
    assert metadata.version("prefalign-verify") == sim.__version__
    res = _prefalign("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"prefalign {sim.__version__}"


def test_version_and_usage_errors_import_no_command_line():
    """Only ``--help`` lists each command line's actions, which imports its package (``verify``'s about a second
    and a half); ``--version`` and a usage error import none of them."""
    code = ("import sys\nfrom prefalign.__main__ import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
            "assert main(['bogus']) == 2\n"
            "print(sorted(m for m in ('verification.__main__', 'sim.simulate', 'llm_runs.__main__')\n"
            "             if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"prefalign {sim.__version__}", "[]"]


def test_help_lists_the_sub_commands_and_the_exit_status(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name, cmd in COMMANDS.items():
        assert name in out and cmd.python_m in " ".join(out.split())  # the help may wrap inside it
    for line in ("  0    success", "  1    the command ran and what it checks failed", "  2    usage error",
                 "  130  interrupted"):
        assert line in out


@pytest.mark.parametrize("argv, fail", [
    (["verify", "run"], "a verdict is violated, vacuous or error, a negative control is missed, or (--baseline)"),
    (["verify", "report"], "the dashboard was written and needs acting on: a verdict is violated"),
    (["verify", "power"], "a weak conclusion has no stated reason"),
    (["verify", "sweep"], "a cell failed"),
    (["verify", "grid"], "a cell raised"),
    (["verify", "list"], None),
    (["simulate"], None),
    (["llm"], None),
])
def test_sub_command_help_states_its_exit_status(argv, fail, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: prefalign {' '.join(argv)}")
    assert "exit status:\n  0    success\n" in out and "  2    usage error" in out
    if fail is None:
        assert "\n  1    " not in out
    else:
        assert f"  1    {fail}" in " ".join(out.split("\n       "))  # the wrapped line, joined


@pytest.mark.parametrize("argv, fragment", [
    ([], "prefalign: error: the following arguments are required: COMMAND"),
    (["bogus"], "prefalign: error: argument COMMAND: invalid choice: 'bogus'"),
    (["verify", "run", "--seed", "-1"], "prefalign verify run: error: argument --seed: must be an integer >= 0"),
    (["verify", "run", "NOPE.1"], "prefalign verify run: error: argument ID: unknown statement id(s): NOPE.1"),
    (["verify", "run", "--baseline", "b.json", "--shipped-baseline"], "not allowed with argument --baseline"),
    (["simulate", "--seed", "x", "--out", "o"], "prefalign simulate: error: argument --seed"),
    (["llm", "data", "stats", "--bogus"], "prefalign llm: error: unrecognized arguments: --bogus"),
])
def test_usage_errors_are_one_line_with_exit_2(argv, fragment, capsys, no_statement_runs):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


@pytest.mark.e2e
def test_python_m_forms_are_the_same_command_lines():
    proc = subprocess.run([sys.executable, "-m", "verification", "list"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    res = _prefalign("verify", "list")
    assert res.returncode == 0 and res.stdout == proc.stdout
    # `python -m sim.simulate`: tests/verification/test_cli.py::test_usage_error_exit_status_of_the_real_command_lines


@pytest.mark.e2e
def test_llm_commands_import_no_torch_until_an_action_runs(tmp_path):
    pytest.importorskip("vaderSentiment")
    from tests.llm_helpers import (
        small_data_file,  # a data file of two prompts: the statistics' code, in seconds
    )

    data = small_data_file(tmp_path / "cands.jsonl.gz")
    code = ("import sys\nfrom prefalign.__main__ import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"  # lists the llm actions from their parser
            "try:\n    main(['llm', 'data', 'build', '--help'])\nexcept SystemExit:\n    pass\n"
            f"main(['llm', 'data', 'stats', '--json', '--data', {str(data)!r}])\n"
            "print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "usage: prefalign llm data build" in proc.stdout
    stats = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])
    assert stats["full_text"]["objectives"] and stats["trained_text"]  # the stats ran, trained texts included
    assert "torch imported: False" in proc.stderr


@pytest.mark.e2e
def test_works_from_any_directory(tmp_path):
    """Run from a directory outside the checkout: the statements, the shipped baseline and the output paths do
    not depend on the working directory."""
    env_cwd = tmp_path / "elsewhere"
    env_cwd.mkdir()
    res = _prefalign("verify", "run", "S4", "H.9", "--json", "out.json", "--shipped-baseline", cwd=env_cwd)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 statement(s) compared, 0 regression(s)" in res.stdout
    assert [r["id"] for r in json.loads((env_cwd / "out.json").read_text())] == ["S4", "H.9"]
    assert not os.path.relpath(env_cwd, Path(__file__).parents[2]).startswith("tests")


def test_the_same_command_lines_from_another_directory_in_this_process(tmp_path, monkeypatch, capsys):
    """The two tests above in the default tier, in this process (their console-script processes are in the e2e
    tier): ``prefalign verify list`` prints what ``python -m verification list`` prints, and a run with the shipped
    baseline from a directory outside the checkout reads its statements and baseline and writes where it is told."""
    from verification.__main__ import main as verification_main

    assert verification_main(["list"]) == 0
    listed = capsys.readouterr().out
    assert main(["verify", "list"]) == 0 and capsys.readouterr().out == listed and listed
    monkeypatch.chdir(tmp_path)
    assert main(["verify", "run", "S4", "--json", "out.json", "--shipped-baseline"]) == 0
    assert "1 statement(s) compared, 0 regression(s)" in capsys.readouterr().out
    assert [r["id"] for r in json.loads((tmp_path / "out.json").read_text())] == ["S4"]


def test_help_names_the_actions_of_each_command_line(capsys):
    """``prefalign --help`` lists the actions of ``verify`` and ``llm`` as their own parsers define them."""
    import importlib

    from sim.cli import sub_commands

    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name in ("verify", "llm"):
        parser = importlib.import_module(COMMANDS[name].module).build_parser()
        actions = [f"{a} {'|'.join(n for n, _, _ in sub_commands(p))}".rstrip() for a, _, p in sub_commands(parser)]
        assert actions and COMMANDS[name].actions() == actions
        assert ", ".join(actions) in out, (name, actions)
    assert "data build|stats|rescore|check" in COMMANDS["llm"].actions()


def test_an_action_added_to_a_command_line_needs_no_edit_here(tmp_path, monkeypatch, capsys):
    """A new action of a package's parser (e.g. ``python -m llm_runs run``) is listed by ``prefalign --help`` and
    runs as ``prefalign llm run`` through the package's own ``main``, with nothing added to ``prefalign``."""
    (tmp_path / "fake_llm_cli.py").write_text(
        "import argparse\n"
        "CALLS = []\n"
        "def build_parser(prog='python -m fake_llm_cli'):\n"
        "    p = argparse.ArgumentParser(prog=prog)\n"
        "    sub = p.add_subparsers(dest='command', required=True)\n"
        "    data = sub.add_parser('data').add_subparsers(dest='action', required=True)\n"
        "    data.add_parser('stats')\n"
        "    sub.add_parser('run', help='the run').add_argument('--steps', type=int)\n"
        "    return p\n"
        "def main(argv=None, prog='python -m fake_llm_cli'):\n"
        "    CALLS.append((build_parser(prog).parse_args(argv), prog))\n"
        "    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(COMMANDS, "llm", COMMANDS["llm"].__class__("fake_llm_cli", "python -m fake_llm_cli",
                                                                   "the LLM runs", list_actions=True))
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "the LLM runs: data stats, run (python -m fake_llm_cli)" in " ".join(capsys.readouterr().out.split())
    assert main(["llm", "run", "--steps", "3"]) == 0
    import fake_llm_cli

    (args, prog), = fake_llm_cli.CALLS
    assert args.command == "run" and args.steps == 3 and prog == "prefalign llm"
