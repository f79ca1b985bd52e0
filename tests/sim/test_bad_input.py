"""Inputs that a demanding user tries: each gives the right answer or a clear error naming the value."""

from __future__ import annotations

import numpy as np
import pytest

from sim.cluster import cluster_clients
from sim.direction import lp_direction
from sim.preference import adjustment, check_preferences, preference_uniformity, ray_point


def test_float32_preferences_are_accepted_and_renormalised_in_float64():
    """A caller holding torch/float32 tensors: [0.2, 0.3, 0.5] in float32 sums to 1 + 1.5e-8 (refused by the float64
    tolerance 1e-9 before); every float32 Dirichlet row is accepted now and comes back on the simplex in float64."""
    lam32 = np.array([0.2, 0.3, 0.5], dtype=np.float32)
    lam = check_preferences(lam32)
    assert lam.dtype == np.float64 and abs(lam.sum() - 1.0) <= 2e-16
    rows = np.random.default_rng(0).dirichlet(np.ones(3), size=2000).astype(np.float32)
    out = check_preferences(rows)
    assert np.all(np.abs(out.sum(axis=1) - 1.0) <= 4e-16)
    res = lp_direction(np.ones(3), lam32, np.eye(3))
    assert str(res.status) == "optimal"
    # a float32 row that is really off the simplex is still refused, naming the dtype's tolerance
    with pytest.raises(ValueError, match=r"tolerance 7\.2e-07 for float32 input\); \[0\.2.*\] sums to 1\.0100000"):
        check_preferences(np.array([0.2, 0.31, 0.5], dtype=np.float32))
    # float64 keeps its tight tolerance
    with pytest.raises(ValueError, match=r"tolerance 1\.0e-09 for float64"):
        check_preferences(np.array([0.2, 0.3, 0.5 + 1e-8]))


def test_complex_and_boolean_inputs_are_refused():
    with pytest.raises(ValueError, match=r"losses must be real; got a complex array"):
        preference_uniformity(np.array([1.0 + 1j, 2.0, 3.0]), [1 / 3] * 3)
    with pytest.raises(ValueError, match=r"prefs must be real; got a complex array"):
        adjustment([1.0, 2.0], np.array([0.5 + 0j, 0.5]))
    with pytest.raises(ValueError, match=r"gram must be real; got a complex array"):
        lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2) * (1 + 0j))
    with pytest.raises(ValueError, match=r"losses must be a real numeric array, not booleans"):
        preference_uniformity(np.array([True, True]), [0.5, 0.5])


def test_subnormal_and_extreme_losses():
    for l in ([1e300, 1e-300, 1.0], [5e-324, 1e-323, 2e-323], [1e-310] * 3):
        res = lp_direction(l, [0.2, 0.3, 0.5], np.eye(3))
        assert np.isfinite(res.beta) and np.all(np.isfinite(res.weights)) and str(res.status) == "optimal"
    assert preference_uniformity([1e300, 1e-300, 1.0], [1 / 3] * 3) == pytest.approx(np.log(3), rel=1e-15)


def test_ray_point_overflow_is_an_error_naming_the_values():
    with pytest.raises(ValueError, match=r"ray_point overflows.*psi = 1e\+308.*prefs entry 0\.001"):
        ray_point(1e308, [0.001, 0.999])


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(max_iter=-1), "max_iter must be an integer >= 1 or None; got -1"),
        (dict(max_iter=2.5), "max_iter must be an integer >= 1 or None; got 2.5"),
        (dict(max_iter=True), "max_iter must be an integer >= 1 or None; got True"),
        (dict(eps_mode="1e-4"), "eps_mode must be a real number; got '1e-4'"),
        (dict(eps_mode=float("nan")), "eps_mode must be a finite number >= 0; got nan"),
        (dict(tol_Jstar=-0.1), "tol_Jstar must be a finite number >= 0; got -0.1"),
        (dict(descent="fast"), "descent must be one of"),
    ],
)
def test_lp_direction_options_are_validated(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        lp_direction([1.0, 2.0], [0.5, 0.5], np.eye(2), **kwargs)


def test_mixed_good_and_bad_batches_name_the_bad_row():
    rng = np.random.default_rng(0)
    l = np.exp(rng.normal(size=(6, 3)))
    lam = rng.dirichlet(np.ones(3), size=6)
    C = np.broadcast_to(np.eye(3), (6, 3, 3)).copy()
    bad = l.copy()
    bad[4, 1] = -1.0
    with pytest.raises(ValueError, match=r"losses must be strictly positive; entry \(4, 1\) is -1\.0"):
        lp_direction(bad, lam, C)
    badp = lam.copy()
    badp[2] = [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match=r"row \(2,\)"):
        lp_direction(l, badp, C)
    badC = C.copy()
    badC[5] = [[1, 0, 0], [0, -1, 0], [0, 0, 1]]
    with pytest.raises(ValueError, match=r"positive semi-definite; instance \(5,\)"):
        lp_direction(l, lam, badC)


def test_cluster_clients_without_clients():
    with pytest.raises(ValueError, match=r"losses_ref must hold at least one client; got shape \(0, 3\)"):
        cluster_clients(np.zeros((0, 3)), np.zeros((0, 3)), threshold=0.2)


def test_diverging_phase1_names_phase_round_client_and_step_size():
    from sim.algorithm import DivergenceError, Phase1Config, ProblemSpec, build_problem, phase1

    src, w_ref, train, _new, _g = build_problem(ProblemSpec(), np.random.default_rng(0))
    with pytest.raises(DivergenceError, match=r"phase1 cluster 0 round \d+ .*client \d+ .*step size 3\.0.*diverged"):
        phase1(src, train, w_ref, Phase1Config(rounds=400, eta_local=3.0), np.random.default_rng(0))


# ------------------------------------------------------------------- one line, never a traceback (issue 22 item 1)


@pytest.mark.parametrize("backend", ["auto", "numpy"])
def test_ragged_preferences_are_named_on_every_backend(backend):
    with pytest.raises(ValueError, match=r"^prefs must be a numeric array; got \[\[0\.5, 0\.5\], \[1\.0\]\]"):
        lp_direction([1.0, 2.0, 3.0], [[0.5, 0.5], [1.0]], np.eye(3), backend=backend)


def test_a_tensor_that_requires_grad_is_named_with_the_fix():
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    for call in (lambda: lp_direction(t, [0.5, 0.5], np.eye(2)), lambda: adjustment(t, [0.5, 0.5])):
        with pytest.raises(ValueError, match=r"losses must be a numeric array \(a tensor that requires grad: pass "
                                             r"tensor\.detach\(\)\)"):
            call()
    assert np.allclose(adjustment(t.detach(), [0.5, 0.5]), adjustment(np.array([1.0, 2.0]), [0.5, 0.5]))


def test_ray_point_names_shapes_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"psi of shape \(5,\) does not broadcast against prefs of shape \(4, 3\)"):
        ray_point(np.ones(5), np.full((4, 3), 1 / 3))
    assert ray_point(np.ones(4), np.full((4, 3), 1 / 3)).shape == (4, 3)


def test_prefalign_names_an_unknown_option_before_the_command(capsys):
    from prefalign.__main__ import main

    assert main(["--bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'--bogus'" in err[0], err


def test_a_seed_range_is_bounded_before_it_is_listed(tmp_path, capsys):
    from verification.__main__ import main

    assert main(["sweep", "H.9", "--seeds", "0:1000000000000", "--workers", "1", "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than the 1000000 one range may hold" in err[0], err
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("bad_row", [{"id": "S10"}, "a string"])
def test_resume_refuses_a_malformed_row_and_leaves_the_log(tmp_path, capsys, bad_row):
    import json

    from verification.__main__ import main

    out = tmp_path / "a.json"
    assert main(["run", "S10", "--json", str(out)]) == 0
    log = tmp_path / "a.json.jsonl"
    header = log.read_text().splitlines()[0]
    log.write_text(header + "\n" + json.dumps({"id": "S10", "row": bad_row}) + "\n")
    before = log.read_bytes()
    capsys.readouterr()
    for _ in range(2):  # the same answer on a retry: the bad record is not written back
        assert main(["run", "S10", "--json", str(out), "--resume"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "line 2: its row is not a result row of 'S10'" in err[0], err
        assert log.read_bytes() == before


@pytest.mark.e2e
def test_an_interrupt_while_the_modules_import_is_one_line_and_exit_130(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    # A test run started as a background job (`make test &`, nohup) inherits SIGINT ignored, and Python then installs
    # no KeyboardInterrupt handler: the script installs the one Python installs at start-up from a terminal.
    script = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "from prefalign.__main__ import main; sys.exit(main(sys.argv[1:]))")
    p = subprocess.Popen([sys.executable, "-c", script, "verify", "run", "H.4", "--json", str(tmp_path / "s.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.8)  # within the imports of the verification modules (a second or two), or the run just after
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert lines and "Traceback" not in err and "interrupted" in lines[-1], err


@pytest.fixture
def python_handles_ctrl_c():
    """SIGINT handled by Python's default handler for the test, whatever the test process inherited: a job started
    in the background by a shell without job control (``cmd &`` in a script, as a CI runner may start the suite)
    ignores SIGINT from its start, and Python then leaves it ignored (a Ctrl-C there is nobody's to record)."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _lose_a_ctrl_c_in_a_weakref_callback():
    """Deliver SIGINT while Python runs a weak-reference callback, as the import system's module locks run one:
    its KeyboardInterrupt is raised there, where Python prints "Exception ignored" and goes on."""
    import os
    import signal
    import weakref

    class _Target:
        pass

    target = _Target()
    ref = weakref.ref(target, lambda _: (os.kill(os.getpid(), signal.SIGINT), sum(range(100))))
    del target
    return ref


def test_a_ctrl_c_that_python_swallows_is_raised_at_the_next_check(monkeypatch, python_handles_ctrl_c):
    import signal
    import sys

    from sim import cli

    lost: list = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: lost.append(u.exc_type))
    with cli.interrupts_recorded():
        _lose_a_ctrl_c_in_a_weakref_callback()
        assert lost == []  # swallowed, the code after it ran, and Python's "Exception ignored" report of a recorded Ctrl-C is dropped, not printed
        with pytest.raises(KeyboardInterrupt):
            cli.raise_if_interrupted()
        cli.raise_if_interrupted()  # raised once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # the control: without the recorder the same Ctrl-C is lost, Python reports it, and nothing raises it
    _lose_a_ctrl_c_in_a_weakref_callback()
    assert lost == [KeyboardInterrupt]
    cli.raise_if_interrupted()


def test_the_interrupt_recorder_passes_other_unraisable_reports_on(monkeypatch, python_handles_ctrl_c):
    """Within :func:`interrupts_recorded` only a recorded Ctrl-C's report is dropped: any other exception that Python
    cannot raise (here in a weak-reference callback) still reaches the hook that was in place, which is back after."""
    import sys
    import weakref

    from sim import cli

    seen: list = []
    hook = seen.append
    monkeypatch.setattr(sys, "unraisablehook", hook)

    class _Target:
        pass

    def fail(_):
        raise ValueError("planted")

    with cli.interrupts_recorded():
        target = _Target()
        ref = weakref.ref(target, fail)
        del target
        assert [u.exc_type for u in seen] == [ValueError]
    assert sys.unraisablehook is hook and ref() is None


def test_the_interrupt_recorder_keeps_a_handler_it_did_not_install():
    import signal

    from sim import cli

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a job started in the background
    try:
        with cli.interrupts_recorded():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_ctrl_c_swallowed_while_a_command_imports_stops_it_before_it_runs(tmp_path, monkeypatch, capsys,
                                                                            python_handles_ctrl_c):
    import inspect
    import sys

    import prefalign.__main__ as top

    ran = tmp_path / "ran"
    (tmp_path / "swallowing_command.py").write_text(
        "import inspect, textwrap\n"  # the helper above, run as the module imports
        f"exec(textwrap.dedent({inspect.getsource(_lose_a_ctrl_c_in_a_weakref_callback)!r}))\n"
        "_lose_a_ctrl_c_in_a_weakref_callback()\n"
        "def main(argv, prog):\n"
        f"    open({str(ran)!r}, 'w').close()\n"
        "    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "unraisablehook", lambda u: None)
    monkeypatch.setitem(top.COMMANDS, "verify", top.Command("swallowing_command", "python -m x", "test"))
    assert top.main(["verify"]) == 130
    assert not ran.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["prefalign verify: interrupted while starting (nothing ran)"], err


def _swallow_a_ctrl_c(*_args, **_kwargs) -> int:
    """A command that receives a Ctrl-C and swallows its ``KeyboardInterrupt`` without a word, as a library's ``try:
    import x / except ImportError: pass`` does when the Ctrl-C lands in the import of a C extension (it comes out as
    that module's ``ImportError``), then runs to its end: status 0."""
    import os
    import signal

    try:
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # Python runs the handler at a call
    except KeyboardInterrupt:
        pass
    return 0


def _succeed(*_args, **_kwargs) -> int:
    return 0


def _main_with(command: str, body, monkeypatch, tmp_path):
    """The ``main`` of the command line ``command`` with its work replaced by ``body``, and its argv."""
    import sys
    from pathlib import Path

    if command == "llm_runs":
        import llm_runs.__main__ as m

        monkeypatch.setattr(m, "_data_check", body)
        data = Path(__file__).resolve().parents[1] / "fixtures" / "byo_data" / "helpsteer2.parquet"
        return m.main, ["data", "check", str(data)]
    if command == "sim.simulate":
        import sim.simulate as m

        monkeypatch.setattr(m, "_main", body)
        return m.main, []
    if command == "verification":
        import verification.__main__ as m

        monkeypatch.setattr(m, "_cmd_list", body)
        return m.main, ["list"]
    import prefalign.__main__ as top

    (tmp_path / "body_command.py").write_text(f"from {__name__} import {body.__name__} as main\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(top.COMMANDS, "verify", top.Command("body_command", "python -m x", "test"))
    sys.modules.pop("body_command", None)
    return top.main, ["verify"]


@pytest.mark.parametrize("command", ["llm_runs", "sim.simulate", "verification", "prefalign"])
def test_a_ctrl_c_that_a_command_swallowed_is_never_a_silent_exit_0(command, tmp_path, monkeypatch, capsys,
                                                                    python_handles_ctrl_c):
    """A Ctrl-C whose ``KeyboardInterrupt`` something swallowed, in a command that then ran to its end, ends the
    command with exit 130 and one line (``sim.interrupts.exit_status``), not with a silent 0; the control: the same
    command without the Ctrl-C exits 0 and prints nothing on stderr."""
    main, argv = _main_with(command, _succeed, monkeypatch, tmp_path)
    assert main(argv) == 0
    assert capsys.readouterr().err == ""
    main, argv = _main_with(command, _swallow_a_ctrl_c, monkeypatch, tmp_path)
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted (the command had run to its end" in err[0], err
    main, argv = _main_with(command, _succeed, monkeypatch, tmp_path)
    assert main(argv) == 0  # the recorded Ctrl-C was answered once, not carried into the next command


def _python_start_only(err: str) -> bool:
    """Whether a traceback ends before the project's first handler statement ran: in Python's own start (no frame
    of the project or the console script), or in runpy or the package's first import line (sim.interrupts) before
    the handler is installed. A Ctrl-C there is outside the project's reach."""
    frames = [ln for ln in err.splitlines() if ln.startswith("  File ")]
    ours = [ln for ln in frames if any(k in ln for k in ("/prefalign", "/sim/", "/llm_runs/", "/verification/"))]
    return bool(frames) and all("interrupts.py" in ln or "__init__.py" in ln for ln in ours) and (
        not ours or "quiet_until_handled" not in err and "_record_interrupt" not in err)


@pytest.mark.e2e
@pytest.mark.parametrize("command", [["prefalign", "llm", "data", "check", "FILE"],
                                     ["-m", "llm_runs", "data", "check", "FILE"],
                                     ["-m", "verification", "run", "H.4", "--json", "OUT"]])
def test_a_ctrl_c_in_the_first_instants_of_a_command_is_one_line_and_exit_130(tmp_path, command):
    """SIGINT at 50-300 ms after the start of a command (the imports of its package, its parser, its first checks):
    exit 130 and one line, never a traceback. Python runs without ``site`` (``-S``, the packages on PYTHONPATH), so
    that the interpreter's own start (an editable install's finder alone takes 30 ms) is over within the first
    delays; a sample whose traceback lies wholly in Python's start (a loaded machine) is drawn again."""
    import os
    import signal
    import subprocess
    import sys
    import sysconfig
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    data = root / "tests" / "fixtures" / "byo_data" / "helpsteer2.parquet"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), sysconfig.get_paths()["purelib"]])}
    script = Path(sys.executable).with_name("prefalign")
    subs = {"prefalign": str(script), "FILE": str(data), "OUT": str(tmp_path / "out.json")}
    args = [subs.get(a, a) for a in command]
    for delay in (0.05, 0.1, 0.2, 0.3):
        for _ in range(5):
            p = subprocess.Popen([sys.executable, "-S", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            time.sleep(delay)
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=120)
            if not _python_start_only(err):
                break
        lines = err.strip().splitlines()
        assert "Traceback" not in err, (delay, err)
        assert p.returncode in (130, -signal.SIGINT) and len(lines) <= 1, (delay, p.returncode, err)
        assert p.returncode != 130 or "interrupted" in lines[0], err
