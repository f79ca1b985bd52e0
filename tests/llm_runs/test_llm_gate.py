"""``python -m llm_runs gate`` (``prefalign llm gate``): the positive-control gate (:mod:`llm_runs.sweeps.gate`).

Default tier, in this process:

* the statistics on constructed margins (numpy only): a planted positive effect passes, a null and the base model
  do not, the sign-flip p-values are uniform under the null over many simulated data sets;
* the gate on the tiny random Llama with a tiny budget (2 objectives x 1 budget x 1 draw) through ``--scheduler``
  on an in-process Dask cluster: its cells (base margins exactly 0, held-out prompts disjoint from the training
  part, calibration prompts only) and ``gate.json`` with its fields; the same command again recomputes nothing
  (no cluster, no training, cell files untouched);
* usage errors exit 2 with one line before any work.

``e2e`` tier: on the session's 2-worker cluster, one worker killed while both cells are in flight: the killed
worker's cell is run again and every cell is written once.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from llm_runs.sweeps import gate

SETTINGS_ARGS = ["--objectives", "positivity,density", "--budgets", "2", "--draws", "1", "--steps", "2",
                 "--heldout-prompts", "4", "--heldout-pairs", "8", "--device", "cpu", "--threads", "1"]


# ------------------------------------------------------------------------------------------------ statistics


def _cells(rng, n_draws: int, n_prompts: int, own_shift: float, other_shift: float = 0.0) -> list[dict]:
    """Cells of one oracle (objective 'a') with 2 to 5 pairs per held-out prompt, margins N(shift, 1)."""
    cells = []
    for d in range(n_draws):
        heldout = {}
        for k, shift in (("a", own_shift), ("b", other_shift)):
            ids = [f"p{i}" for i in range(n_prompts) for _ in range(int(rng.integers(2, 6)))]
            heldout[k] = {"prompt_ids": ids, "margins": (shift + rng.standard_normal(len(ids))).tolist()}
        cells.append({"draw": d, "heldout": heldout})
    return cells


def test_prompt_units_are_per_prompt_means_in_first_seen_order():
    u = gate.prompt_units(["x", "y", "x", "z", "y"], [1.0, 2.0, 3.0, 4.0, 6.0])
    assert u.tolist() == [2.0, 4.0, 4.0]


def test_a_planted_effect_passes_and_a_null_does_not():
    rng = np.random.default_rng(1)
    planted = gate.pooled_scores(_cells(rng, 2, 30, own_shift=0.5), "a", n_perm=999, n_boot=500)
    assert planted["units"] == 60 and planted["z"] > 0.3 and planted["accuracy"] > 0.6
    assert planted["p_margin"] < gate.ALPHA and planted["p_accuracy"] < gate.ALPHA and gate.passes(planted)
    assert planted["z_interval"][0] > 0 and planted["accuracy_interval"][0] > 0.5
    null = gate.pooled_scores(_cells(rng, 2, 30, own_shift=0.0), "a", n_perm=999, n_boot=500)
    assert null["p_margin"] > gate.ALPHA and not gate.passes(null)
    # the base model: every margin 0, every pair a tie
    base = gate.pooled_scores([{"heldout": {"a": {"prompt_ids": ["p", "q"], "margins": [0.0, 0.0]}}}], "a",
                              n_perm=99, n_boot=50)
    assert base["z"] == 0.0 and base["accuracy"] == 0.5 and base["p_margin"] == 1.0 == base["p_accuracy"]
    assert not gate.passes(base)
    # a margin effect without an accuracy effect does not pass: both are required
    assert not gate.passes({**planted, "p_accuracy": 0.02})


def test_the_mde_is_the_shift_the_sign_flip_test_detects_with_its_power():
    """The recorded MDE is s (a / sqrt(1 - a^2) + z_0.80 / sqrt(n)), a = z_0.99 / sqrt(n); shifts of the MDE on the
    mean of n normal units are detected at level 0.01 in 80 % of 400 data sets (within 4 binomial sd) for n = 8 and
    40 (the gate's units: 24 and 15 prompts a draw), shifts of half the MDE in far fewer; the plain normal
    (z_0.99 + z_0.80) s / sqrt(n) is too small for this test."""
    u = np.array([0.2, -0.1, 0.4, 0.0, 0.3, 0.1, 0.2])
    got = gate.one_sided(u, n_perm=99, n_boot=50)["mde"]
    s, n, z99, z80 = np.std(u, ddof=1), len(u), 2.3263478740408408, 0.8416212335729143
    a = z99 / np.sqrt(n)
    assert got == pytest.approx(s * (a / np.sqrt(1 - a * a) + z80 / np.sqrt(n)), rel=1e-12)
    assert got > (z99 + z80) * s / np.sqrt(n)
    assert gate.one_sided(np.array([1.0]), n_perm=9, n_boot=9)["mde"] is None
    assert gate.sign_flip_mde(np.arange(5.0)) is None  # z_0.99 / sqrt(5) > 1: no shift reaches the level
    rng = np.random.default_rng(11)
    sets = 400
    for n in (8, 40):
        v = rng.standard_normal(n)
        mde = gate.sign_flip_mde((v - v.mean()) / np.std(v, ddof=1))  # units of sample sd 1, as the draws'
        power = {f: np.mean([gate.sign_flip_p(f * mde + rng.standard_normal(n), n_perm=999, rng=rng) < gate.ALPHA
                             for _ in range(sets)]) for f in (1.0, 0.5)}
        assert abs(power[1.0] - 0.8) < 4 * np.sqrt(0.8 * 0.2 / sets), (n, power)
        assert power[0.5] < 0.5, (n, power)


def test_sign_flip_p_values_are_uniform_under_the_null():
    """500 data sets of 30 symmetric null units: P(p <= alpha) within 4 binomial sd of alpha at every level, and
    the p-values' distribution within the Kolmogorov-Smirnov bound of the uniform (the p-values of 199 flips lie on
    the grid k/200)."""
    rng = np.random.default_rng(7)
    n_sets, n_perm = 500, 199
    p = np.array([gate.sign_flip_p(rng.standard_t(3, size=30), n_perm=n_perm, rng=rng) for _ in range(n_sets)])
    for alpha in (0.01, 0.05, 0.1, 0.25, 0.5, 0.75):
        sd = np.sqrt(alpha * (1 - alpha) / n_sets)
        assert abs(np.mean(p <= alpha) - alpha) < 4 * sd + 1.0 / (n_perm + 1), alpha
    grid = np.arange(1, n_perm + 2) / (n_perm + 1)
    ks = np.max(np.abs(np.searchsorted(np.sort(p), grid, side="right") / n_sets - grid))
    assert ks < 1.63 / np.sqrt(n_sets) + 1.0 / (n_perm + 1)  # the 1 % critical value of KS


def test_settings_refuse_a_target_outside_the_open_interval():
    with pytest.raises(gate.GateSettingsError, match=r"target must lie in \(1/m, 1\) = \(0.3333, 1\)"):
        gate.GateSettings(objectives=("a", "b", "c"), target=1 / 3)
    lam = gate.GateSettings(objectives=("a", "b", "c"), target=0.8).weights("b")
    assert np.allclose(lam, [0.1, 0.8, 0.1]) and abs(lam.sum() - 1) < 1e-15


# ------------------------------------------------------------------------------------------------ the command

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("distributed")

from llm_runs.__main__ import main  # noqa: E402
from llm_runs.preferences.clients import calibration_split  # noqa: E402
from llm_runs.preferences.data import DEFAULT_DATA_FILE  # noqa: E402
from tests.llm_helpers import kill_a_busy_worker, run_cli, tiny_model_dir  # noqa: E402
from verification.engine import dask_engine  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


_cli = run_cli


@pytest.fixture(scope="module")
def gated(dask_inprocess_client, tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("llm-gate") / "g"
    code, screen = _cli("gate", *SETTINGS_ARGS, "--model", str(tiny_dir), "--scheduler",
                        dask_inprocess_client.scheduler.address, "--out", str(out), "--quiet")
    return {"out": out, "code": code, "screen": screen, "model": tiny_dir}


@pytest.mark.e2e
def test_the_gate_writes_its_cells_and_gate_json(gated):
    out = gated["out"]
    assert gated["code"] == 0, gated["screen"]
    files = sorted(p.relative_to(out).as_posix() for p in (out / "cells").rglob("*"))
    assert files == ["cells/density", "cells/density/b2-d0.json", "cells/positivity", "cells/positivity/b2-d0.json"]
    ids = json.loads((out / gate.SUMMARY_JSON).read_text())["calibration_prompt_ids"]
    assert calibration_split(ids)[0] == tuple(ids)  # every id on the calibration side
    calibration = set(ids)
    for o in ("positivity", "density"):
        cell = json.loads(gate.cell_path(out, o, 2, 0).read_text())
        assert cell["status"] == "complete" and cell["objective"] == o and cell["budget"] == 2 and cell["draw"] == 0
        assert cell["base_margins_max_abs"] == 0.0  # the base model's margins are exactly 0
        assert cell["weights"][o] == 0.8 and abs(sum(cell["weights"].values()) - 1) < 1e-12
        assert len(cell["train_loss_history"]) == 2 and cell["train_loss_history"][0] == pytest.approx(np.log(2))
        assert set(cell["train"]) == {"positivity", "density"} and cell["train"][o]["pairs"] == 2
        held = set(cell["heldout_prompt_ids"])
        assert len(held) >= 4 and held <= calibration
        for h in cell["heldout"].values():
            assert h["pairs"] == len(h["margins"]) == len(h["prompt_ids"]) == 8 and set(h["prompt_ids"]) <= held
            assert h["margin_change"] == pytest.approx(np.mean(h["margins"]))
        assert cell["cpu_seconds"] > 0 and cell["threads"] == 1
    summary = json.loads((out / gate.SUMMARY_JSON).read_text())
    assert summary["gate"] == gate.GATE_KIND and summary["rule"] == gate.RULE
    s = summary["settings"]
    assert s["objectives"] == ["positivity", "density"] and s["target"] == 0.8 and s["steps"] == 2
    assert s["lr"] == 5e-4 and s["max_response_tokens"] == 16 and s["budgets"] == [2] and s["draws"] == 1
    assert s["model"] == str(Path(gated["model"]).resolve()) and s["alpha"] == 0.01
    assert s["data"]["path"] == f"shipped: {DEFAULT_DATA_FILE.name}" and len(s["data"]["sha256"]) == 64
    assert len(summary["calibration_prompt_ids"]) == 90  # the calibration side of the shipped file's 240 prompts
    assert summary["cells"] == {"requested": 2, "finished": 2, "complete": 2, "failed": 0, "missing": 0}
    assert [(e["objective"], e["budget"]) for e in summary["table"]] == [("positivity", 2), ("density", 2)]
    for e in summary["table"]:
        for key in ("z", "z_interval", "p_margin", "accuracy", "accuracy_interval", "p_accuracy", "passed",
                    "train_accuracy", "train_loss", "cpu_seconds"):
            assert key in e, key
        assert 0 < e["p_margin"] <= 1 and 0 < e["p_accuracy"] <= 1 and isinstance(e["passed"], bool)
        assert e["passed"] == gate.passes(e["scored"][e["objective"]])
        assert set(e["scored"]) == {"positivity", "density"}
    assert set(summary["matrix"]["2"]["z"]["positivity"]) == {"positivity", "density"}
    assert summary["passes_at"].keys() == {"positivity", "density"}
    assert "2 computed, 0 already in" in gated["screen"] and "spill-over at budget 2" in gated["screen"]


@pytest.mark.e2e
def test_the_same_command_again_recomputes_nothing(gated, monkeypatch):
    out = gated["out"]
    monkeypatch.setattr(dask_engine, "dask_client", lambda *a, **k: pytest.fail("a Dask cluster was started"))
    monkeypatch.setattr(gate, "_train", lambda *a, **k: pytest.fail("an oracle was trained"))
    before = {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("*.json")}
    code, screen = _cli("gate", *SETTINGS_ARGS, "--model", str(gated["model"]), "--workers", "2", "--out", str(out),
                        "--quiet")
    assert code == 0, screen
    assert "2 cells, 0 computed, 2 already in" in screen
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert json.loads((out / gate.SUMMARY_JSON).read_text())["last_run"]["computed"] == 0


@pytest.mark.e2e
def test_other_settings_into_the_folder_are_refused(gated, capsys):
    out = gated["out"]
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    args = [a if a != "2" else "3" for a in SETTINGS_ARGS]  # --budgets 3 is another cell; --steps 3 another setting
    code = main(["gate", *args, "--model", str(gated["model"]), "--workers", "1", "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and "argument --out:" in err[0] and "steps 2 there, 3 now" in err[0], err
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before


@pytest.mark.parametrize("args, match", [
    (["--objectives", "positivity,nonsense"], "argument --objectives: "),
    (["--budgets", "0"], "argument --budgets: budget '0' is not an integer >= 1"),
    (["--budgets", "2,100000"], "argument --budgets: budget 100000 needs 100000 training pairs per objective"),
    (["--target", "0.5"], "argument --target: target must lie in (1/m, 1) = (0.5, 1) for m = 2 objectives; got 0.5"),
    (["--target", "1"], "argument --target: target must lie in (1/m, 1)"),
    (["--draws", "0"], "argument --draws: must be an integer >= 1; got '0'"),
    (["--heldout-pairs", "100000"], "argument --heldout-pairs: the 90 calibration prompts cannot hold out 100000"),
    (["--workers", "0"], "argument --workers: must be an integer >= 1; got '0'"),
])
def test_usage_errors_exit_2_naming_the_value_before_any_work(tmp_path, capsys, monkeypatch, args, match):
    monkeypatch.setattr(gate, "gate_cell", lambda *a, **k: pytest.fail("a cell ran"))
    out = tmp_path / "g"
    code = main(["gate", "--objectives", "positivity,density", "--device", "cpu", *args, "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and match in err[0], err
    assert not out.exists()


def test_the_gate_commands_defaults_are_the_gate_settings(monkeypatch, capsys):
    """The parser takes its defaults from GateSettings (the study's where from_study takes them) and the module's
    budgets and draws, and --help shows them: settings with other defaults give another parser."""
    from dataclasses import dataclass

    from llm_runs.__main__ import build_parser

    @dataclass(frozen=True)
    class Other(gate.GateSettings):
        target: float = 0.7
        steps: int = 9
        lr: float = 0.002
        max_pairs: int = 5

    for settings, budgets, draws in ((gate.GateSettings, gate.DEFAULT_BUDGETS, gate.DEFAULT_DRAWS),
                                     (Other, (3, 7), 4)):
        monkeypatch.setattr(gate, "GateSettings", settings)
        monkeypatch.setattr(gate, "DEFAULT_BUDGETS", budgets)
        monkeypatch.setattr(gate, "DEFAULT_DRAWS", draws)
        d = settings.from_study(("positivity", "density", "readability"))
        args = build_parser().parse_args(["gate", "--out", "x"])
        assert gate.GateSettings.from_study(args.objectives, target=args.target, steps=args.steps, lr=args.lr,
                                            max_response_tokens=args.max_response_tokens,
                                            heldout_prompts=args.heldout_prompts, heldout_pairs=args.heldout_pairs,
                                            max_pairs=args.max_pairs) == d
        assert (args.budgets, args.draws) == (budgets, draws)
        with pytest.raises(SystemExit):
            main(["gate", "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for v in (d.target, d.steps, d.lr, d.max_pairs, d.max_response_tokens, d.heldout_prompts, d.heldout_pairs,
                  draws, ",".join(map(str, budgets)), ",".join(d.objectives)):
            assert re.search(rf"\(default[^)]*\b{re.escape(str(v))}\)", text), (v, text)


def test_prefalign_llm_lists_gate():
    from prefalign.__main__ import COMMANDS

    assert "gate" in COMMANDS["llm"].actions()


# ------------------------------------------------------------------------------------------------ e2e: a killed worker


@pytest.mark.e2e
def test_a_killed_workers_cell_is_run_again_and_every_cell_written_once(dask_client_2, tiny_dir, tmp_path):
    out = tmp_path / "g"
    settings = gate.GateSettings.from_study(("positivity", "density"), steps=8, heldout_prompts=4, heldout_pairs=8)
    writes: dict[str, int] = {}
    killed: dict = {}
    killer = threading.Thread(target=kill_a_busy_worker, args=(dask_client_2, killed), daemon=True,
                              kwargs={"ready": lambda busy: len(busy) == 2, "settle": 1.0, "timeout": 300, "poll": 0.05})
    killer.start()
    run = gate.run_gate(dask_client_2, out, settings, [2], 1, model_dir=str(tiny_dir), device="cpu", progress=False,
                        on_written=lambda cell, _: writes.__setitem__(cell.key, writes.get(cell.key, 0) + 1))
    killer.join(timeout=5)
    assert killed.get("keys"), "no cell was in flight on the killed worker"
    assert run.failed == {} and sorted(run.written) == ["density/b2-d0", "positivity/b2-d0"]
    assert writes == {"density/b2-d0": 1, "positivity/b2-d0": 1}
    files = sorted(p.relative_to(out).as_posix() for p in (out / "cells").rglob("*.json"))
    assert files == ["cells/density/b2-d0.json", "cells/positivity/b2-d0.json"]  # no temporary file left
    for o in ("positivity", "density"):
        cell = json.loads(gate.cell_path(out, o, 2, 0).read_text())
        assert cell["status"] == "complete" and cell["base_margins_max_abs"] == 0.0
        assert gate.cell_path(out, o, 2, 0).stat().st_mtime > killed["at"]


# ------------------------------------------------------------------------------------------------ the committed gate

REPORTS = Path(__file__).resolve().parents[2] / "reports"


@pytest.mark.parametrize("name", ["llm-gate", "llm-gate-curve-oracle"])
def test_the_committed_gate_is_what_its_cells_give(name, tmp_path, monkeypatch):
    """The dashboard's copy of the gate (``reports/llm-gate/``, made by ``make report LLM_GATE=DIR OUT=reports``)
    and the committed measurement of the shots curve's oracle size (``reports/llm-gate-curve-oracle/``) hold their
    cells: the gate's command on a copy of one, with the settings its ``gate.json`` states, computes no cell (no
    cluster, no training) and writes the same table, spill-over matrices, objectives that passed and calibration
    prompts — the committed gate is recomputed from the committed margins, and further draws can be added to such
    a copy."""
    import shutil

    folder = REPORTS / name
    committed = json.loads((folder / gate.SUMMARY_JSON).read_text())
    params = json.loads((folder / "params.json").read_text())
    s = committed["settings"]
    cells = sorted((folder / "cells").glob("*/*.json"))
    assert len(cells) == committed["cells"]["requested"] == committed["cells"]["complete"]
    out = tmp_path / "llm-gate"
    shutil.copytree(folder, out)
    monkeypatch.setattr(dask_engine, "dask_client", lambda *a, **k: pytest.fail("a Dask cluster was started"))
    monkeypatch.setattr(gate, "_train", lambda *a, **k: pytest.fail("an oracle was trained"))
    args = ["--objectives", ",".join(s["objectives"]), "--budgets", ",".join(map(str, s["budgets"])),
            "--draws", str(s["draws"]), "--target", str(s["target"]), "--steps", str(s["steps"]), "--lr", str(s["lr"]),
            "--max-response-tokens", str(s["max_response_tokens"]), "--heldout-prompts", str(s["heldout_prompts"]),
            "--heldout-pairs", str(s["heldout_pairs"]), "--max-pairs", str(s["max_pairs"]),
            "--device", params["device"], "--threads", str(params["threads"])]
    code, screen = _cli("gate", *args, "--workers", "1", "--quiet", "--out", str(out))
    assert code == 0, screen
    assert f"{len(cells)} cells, 0 computed" in screen
    again = json.loads((out / gate.SUMMARY_JSON).read_text())
    assert again["last_run"]["computed"] == 0
    for key in ("settings", "table", "matrix", "passes_at", "passed", "mde", "calibration_prompt_ids"):
        assert again[key] == committed[key], key
