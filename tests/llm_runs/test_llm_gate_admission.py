"""``--gate DIR`` of ``python -m llm_runs run`` and ``sweep``: an objective enters a run only if its oracle passed the
positive-control gate (:func:`llm_runs.sweeps.gate.admit`).

Default tier, in this process, on real files: a ``gate.json`` written by :func:`llm_runs.sweeps.gate.summarize` from
synthetic cells (oracles of positivity, readability and second_person with a planted effect, density without one)
for the tiny random Llama and the shipped data file;

* a gated run of the shots preset trains on the objectives that passed, and its preset records the gate (path,
  SHA-256 of gate.json, the objectives that passed); a gated sweep records it in ``params.json`` and
  ``llm_sweep.json``, and a folder made under another gate is refused;
* a gate folder that is missing or not a gate's, made on another model, data file or response length, an objective
  that did not pass it (named with its p-values and minimum detectable effects) or is not among its candidates,
  and a gate that passed fewer objectives than the shots design needs: exit 2 with one line naming the value,
  before any work (no folder created, no model loaded), for ``run`` and ``sweep`` alike.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_runs.__main__ import main  # noqa: E402
from llm_runs.model import models  # noqa: E402
from llm_runs.runs import run as run_module  # noqa: E402
from llm_runs.runs.presets import PRESETS, GateAdmission  # noqa: E402
from llm_runs.sweeps import gate, sweep  # noqa: E402
from tests.llm_helpers import run_cli, tiny_model_dir  # noqa: E402
from verification.engine import dask_engine  # noqa: E402

CANDIDATES = ("positivity", "density", "readability", "second_person")
PASSING = ("positivity", "readability", "second_person")
RUN_ARGS = ["--preset", "shots", "--shrink", "--device", "cpu"]
CELLS = "shots-shrunk"


def write_gate(folder: Path, *, model_dir, passing=PASSING, candidates=CANDIDATES, data_sha256: str | None = None,
               **settings) -> Path:
    """A gate folder whose ``gate.json`` is :func:`gate.summarize` of one draw of synthetic cells at budget 16: the
    oracles of ``passing`` move their own objective's held-out margins by +1 (60 pairs on 30 prompts, N(0, 1) noise),
    the others by nothing."""
    s = gate.GateSettings.from_study(candidates, **settings)
    params = gate.gate_params(s, model_dir=None if model_dir is None else str(model_dir), device="cpu")
    if data_sha256 is not None:
        params["data"]["sha256"] = data_sha256
    rng = np.random.default_rng(0)
    rows = {}
    for o, b, d in gate.coordinates(s, [16], 1):
        held = {}
        for k in candidates:
            ids = [f"p{i}" for i in range(30) for _ in range(2)]
            m = (float(k == o and o in passing) + rng.standard_normal(len(ids))).tolist()
            held[k] = {"prompt_ids": ids, "margins": m, "margin_change": float(np.mean(m)), "accuracy": 0.5}
        rows[(o, b, d)] = {"objective": o, "budget": b, "draw": d, "status": "complete", "seconds": 1.0,
                           "cpu_seconds": 1.0, "heldout": held,
                           "train": {k: {"accuracy": 1.0, "loss": 0.1} for k in candidates}}
    summary = gate.summarize(params, s, [16], 1, rows, ["p0"], n_perm=999, n_boot=200)
    assert [o for o, b in summary["passes_at"].items() if b is not None] == list(passing)
    gate.write_summary(folder, summary)
    return folder


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def gate_dir(tiny_dir, tmp_path_factory):
    return write_gate(tmp_path_factory.mktemp("gate") / "g", model_dir=tiny_dir)


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a model is loaded."""
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


class _Ran(Exception):
    """Raised in place of the run, carrying the preset it was given."""


def test_a_gated_run_trains_on_the_objectives_that_passed_and_records_the_gate(gate_dir, tiny_dir, tmp_path,
                                                                                 monkeypatch, capsys):
    def ran(preset, out, **kw):
        raise _Ran(preset)

    monkeypatch.setattr(run_module, "run", ran)  # a whole run is the e2e tier's: the checks and the preset here
    with pytest.raises(_Ran) as got:
        run_cli("run", *RUN_ARGS, "--model", str(tiny_dir), "--gate", str(gate_dir), "--out", str(tmp_path / "r"))
    preset = got.value.args[0]
    sha = hashlib.sha256((gate_dir / "gate.json").read_bytes()).hexdigest()
    assert preset.design.objectives == PASSING  # not the preset's positivity, density, readability
    assert preset.name == CELLS and preset.max_response_tokens == 16
    recorded = {"path": str(gate_dir.resolve()), "sha256": sha, "passed": list(PASSING)}
    assert json.loads(json.dumps(preset.to_dict()))["gate"] == recorded  # summary.json's preset_config.gate
    assert "gate" not in PRESETS["shots"].to_dict()  # an ungated preset's configuration is as before
    err = capsys.readouterr().err
    assert f"objectives positivity, readability, second_person admitted by the gate {gate_dir.resolve()}" in err
    # given objectives that all passed are kept, in their order
    with pytest.raises(_Ran) as got:
        run_cli("run", *RUN_ARGS, "--model", str(tiny_dir), "--gate", str(gate_dir), "--objectives",
                "second_person,positivity,readability", "--out", str(tmp_path / "r"))
    assert got.value.args[0].design.objectives == ("second_person", "positivity", "readability")


def _sweep_with_every_cell(out: Path, params: dict, seeds=(0,)) -> None:
    """A sweep folder of ``params`` with the cell files of complete runs of the shrunk shots preset (so the sweep
    runs nothing)."""
    dask_engine.write_params(out, params)
    for s in seeds:
        p = sweep.cell_path(out, CELLS, s)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"seed": s, "preset": CELLS, "status": "complete", "run_dir": f"runs/{s}",
                                 "seconds": 1.0, "cpu_seconds": 1.0, "gradient_evaluations": {"done": 1, "planned": 1}}))


def test_a_gated_sweep_records_the_gate_in_params_and_summary(gate_dir, tiny_dir, tmp_path, capsys, no_model):
    """The folder's params.json is the one a sweep of the gated preset writes (the shrunk shots preset on the
    objectives that passed, with the gate's identity): the command accepts it only if its own parameters are
    these, runs nothing, and its summary repeats them."""
    out = tmp_path / "sw"
    sha = hashlib.sha256((gate_dir / "gate.json").read_bytes()).hexdigest()
    shrunk = PRESETS["shots"].shrunk()
    admitted = replace(shrunk, design=replace(shrunk.design, objectives=PASSING),
                       gate=GateAdmission(str(gate_dir.resolve()), sha, PASSING))
    _sweep_with_every_cell(out, sweep.sweep_params(admitted, model_dir=str(tiny_dir), device="cpu", threads=1))
    args = ["sweep", *RUN_ARGS, "--model", str(tiny_dir), "--seeds", "0:1", "--workers", "1", "--out", str(out)]
    code, screen = run_cli(*args, "--gate", str(gate_dir))
    assert code == 0, screen
    params = json.loads((out / "params.json").read_text())
    assert params["preset_config"]["gate"] == {"path": str(gate_dir.resolve()), "sha256": sha, "passed": list(PASSING)}
    assert params["preset_config"]["design"]["objectives"] == list(PASSING)
    assert json.loads((out / sweep.SUMMARY_JSON).read_text())["params"] == params
    capsys.readouterr()
    # the folder's cells were admitted by this gate: another gate (or none) is another configuration
    other = write_gate(tmp_path / "other", model_dir=tiny_dir)  # the same table in another folder
    before = (out / "params.json").read_text()
    for extra in (["--gate", str(other)], ["--objectives", ",".join(PASSING)]):
        code = main([*args, *extra])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert code == 2 and len(err) == 1 and "argument --out:" in err[0] and "preset_config gate" in err[0], err
    assert (out / "params.json").read_text() == before


def _refusals(tmp: Path, tiny_dir, gate_dir):
    """(folder, extra arguments, what the one line says) of each refusal."""
    empty = tmp / "empty"
    empty.mkdir()
    return [
        (tmp / "absent", [], f"argument --gate: {str(tmp / 'absent')!r} is not a directory"),
        (empty, [], "is not a gate folder: it has no gate.json"),
        (write_gate(tmp / "model", model_dir=None), [], "was made with model 'embedded default', this run uses "
                                                        f"{str(Path(tiny_dir).resolve())!r}"),
        (write_gate(tmp / "data", model_dir=tiny_dir, data_sha256="0" * 64), [],
         "was made with the data file of sha256 '" + "0" * 64 + "'"),
        (write_gate(tmp / "length", model_dir=tiny_dir, max_response_tokens=48), [],
         "was made with max_response_tokens 48, this run uses 16"),
        (gate_dir, ["--objectives", "positivity,density,readability"],
         f"objective 'density' did not pass the gate {str(gate_dir.resolve())!r} (budget 16: fail, margin change z "),
        (gate_dir, ["--objectives", "positivity,formality,readability"],
         "objective(s) 'formality' are not among the candidates of the gate"),
        (write_gate(tmp / "two", model_dir=tiny_dir, passing=("positivity", "readability")), [],
         "passed 2 of its candidates (positivity, readability of positivity, density, readability, second_person); "
         "the run needs at least 3 objectives"),
        (gate_dir, ["--objectives", "positivity,readability"],
         "argument --objectives: preset shots-shrunk needs at least 3 objectives; got 'positivity,readability'"),
    ]


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_gate_that_does_not_admit_the_run_is_a_usage_error_before_any_work(command, gate_dir, tiny_dir,
                                                                              tmp_path, capsys, no_model):
    for k, (folder, extra, match) in enumerate(_refusals(tmp_path, tiny_dir, gate_dir)):
        out = tmp_path / f"out{k}"
        more = ["--seeds", "0:1", "--workers", "1"] if command == "sweep" else []
        code = main([command, *RUN_ARGS, *more, "--model", str(tiny_dir), "--gate", str(folder), *extra,
                     "--out", str(out)])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert code == 2 and len(err) == 1 and match in err[0], (folder, err)
        assert not out.exists(), folder
        if "did not pass" in match:  # its p-values and minimum detectable effects, as the gate's table shows them
            assert all(f"{h} " in err[0] for h in ("p (z)", "MDE (z)", "p (accuracy)", "MDE (accuracy)")), err
