"""A researcher's own data (llm_runs.preferences.formats, docs/your-data.md): the four schemas on the committed fixtures
(tests/fixtures/byo_data, written by make_fixtures.py with the public data sets' column names), the truncation rule
for annotations, ``data check``, the one-line errors before any model is loaded, a run of each schema on the tiny
Llama from the command line, its records and the dashboard's LLM section built from those runs.

Cheap by design: the runs are the smoke preset's ``--shrink`` variant in float32 on the tiny random Llama, made
once per schema (a module fixture), in this process (``PREFALIGN_NO_REEXEC``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
datasets = pytest.importorskip("datasets")

from llm_runs.model.models import save_random_llama  # noqa: E402
from llm_runs.model.tokenizer import smollm2_tokenizer  # noqa: E402
from llm_runs.preferences.data import DataFileError, preference_pairs, trained_candidates, within_prompt_scale  # noqa: E402
from llm_runs.preferences.formats import load_data, parse_columns  # noqa: E402
from llm_runs.runs.presets import PRESETS  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "byo_data"
#: schema -> (fixture, its objectives, the --objectives of its run or None: every aspect)
SCHEMAS = {
    "candidates": ("candidates.jsonl", ("helpful", "concise", "friendly"), None),
    "responses": ("helpsteer2.parquet", ("helpfulness", "correctness", "coherence", "complexity", "verbosity"),
                  ("helpfulness", "correctness", "verbosity")),
    "completions": ("ultrafeedback", ("helpfulness", "honesty", "instruction_following", "truthfulness"), None),
    "pairs": ("pku_saferlhf.csv", ("better", "safer"), None),
}
T = PRESETS["smoke"].shrunk().max_response_tokens


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def _n_tokens(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def _raw(name: str) -> list[dict]:
    """The fixture's rows as the datasets library reads them, independently of llm_runs.preferences.formats."""
    p = FIXTURES / name
    if p.is_dir():
        return datasets.load_from_disk(str(p)).to_list()
    return pd.read_csv(p).to_dict("records") if p.suffix == ".csv" else (
        pd.read_parquet(p).to_dict("records") if p.suffix == ".parquet" else
        [json.loads(ln) for ln in p.read_text().splitlines()])


# ------------------------------------------------------------------------------------------------ loading


@pytest.mark.parametrize("schema", sorted(SCHEMAS))
def test_each_schema_is_read_with_the_public_column_names(schema):
    """Every fixture loads as its schema, with the objectives of its annotation columns and, response by response,
    the scores the raw rows hold (a pair's label as 1 for the response it names, 0 for the other)."""
    name, objectives, _ = SCHEMAS[schema]
    c = load_data(FIXTURES / name)
    assert c.labels == "annotations" and c.header["schema"] == schema and c.objectives == objectives
    rows = _raw(name)
    got = {(p, t): {o: c.scores[o][i, k] for o in objectives}
           for i, p in enumerate(c.prompts) for k, t in enumerate(c.responses[i]) if c.present_mask[i, k]}
    want = {}
    for r in rows:
        if schema == "candidates":
            for x in r["responses"]:
                want[(r["prompt"], x["text"])] = {o: float(x["scores"][o]) for o in objectives}
        elif schema == "responses":
            want[(r["prompt"], r["response"])] = {o: float(r[o]) for o in objectives}
        elif schema == "completions":
            for x in r["completions"]:
                want[(r["instruction"], x["response"])] = {o: float(x["annotations"][o]["Rating"]) for o in objectives}
        else:
            for j in (0, 1):
                want[(r["prompt"], r[f"response_{j}"])] = {o: float(r[f"{o}_response_id"] == j) for o in objectives}
    assert got == want
    assert int(c.present_mask.sum()) == len(want) and len(set(c.prompts)) == len(c.prompts)


def test_a_pair_label_becomes_scores_and_the_margin_keeps_every_label():
    """Schema pairs: the preferred response scores 1, the other 0; the within-prompt sd is 1/2, so at the default
    margin every row gives exactly its labelled pair (full texts)."""
    rows = _raw("pku_saferlhf.csv")
    c = load_data(FIXTURES / "pku_saferlhf.csv")
    for o in c.objectives:
        assert within_prompt_scale(c.scores_of(o)) == 0.5
        pairs = preference_pairs(c, o, margin=PRESETS["smoke"].design.margin)
        assert len(pairs) == len(rows)
        for p, r in zip(pairs, rows, strict=True):
            assert p.chosen == r[f"response_{r[f'{o}_response_id']}"] and p.prompt == r["prompt"]


@pytest.mark.parametrize("schema", sorted(SCHEMAS))
def test_annotations_of_a_cut_response_are_left_out(schema, tok):
    """The truncation rule for annotations: a response longer than T tokens keeps no label; every other keeps its
    own, and every pair built is of two responses the model sees whole."""
    c = load_data(FIXTURES / SCHEMAS[schema][0])
    tc = trained_candidates(c, tok, T)
    cut = np.array([[_n_tokens(tok, r) > T for r in row] for row in c.responses])
    assert cut.any() and (~cut & c.present_mask).any()  # the fixtures hold both kinds
    for o in c.objectives:
        np.testing.assert_array_equal(np.isnan(tc.scores[o]), cut | ~c.present_mask)
        keep = ~np.isnan(tc.scores[o])
        np.testing.assert_array_equal(tc.scores[o][keep], c.scores[o][keep])
        for p in preference_pairs(tc, o):
            assert _n_tokens(tok, p.chosen) <= T and _n_tokens(tok, p.rejected) <= T


def test_the_column_mapping_reads_other_names(tmp_path):
    """HelpSteer2's columns renamed (prompt -> question, response -> answer): refused without --columns, naming
    the missing column; read with it, to the same data."""
    df = pd.read_parquet(FIXTURES / "helpsteer2.parquet").rename(columns={"prompt": "question", "response": "answer"})
    p = tmp_path / "renamed.jsonl"
    df.to_json(p, orient="records", lines=True)
    with pytest.raises(DataFileError, match="fit no schema"):
        load_data(p)
    c = load_data(p, columns="prompt=question,response=answer", objectives=("helpfulness", "verbosity"))
    ref = load_data(FIXTURES / "helpsteer2.parquet", objectives=("helpfulness", "verbosity"))
    assert c.prompts == ref.prompts and c.responses == ref.responses
    for o in ref.objectives:
        np.testing.assert_array_equal(c.scores[o], ref.scores[o])
    assert parse_columns("prompt=question, response=answer") == {"prompt": "question", "response": "answer"}
    for bad, match in [("prompt", "not canonical=column"), ("question=prompt", "'question' is not one of"),
                       ("prompt=a,prompt=b", "twice")]:
        with pytest.raises(ValueError, match=match):
            parse_columns(bad)


# ------------------------------------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_random_llama(tmp_path_factory.mktemp("model") / "tiny", "tiny", dtype="float32")[0]


def _main(capsys, *args, prog="python -m llm_runs"):
    from llm_runs.__main__ import main

    code = main([str(a) for a in args], prog=prog)
    out = capsys.readouterr()
    return code, out.out, [ln for ln in out.err.splitlines() if ln.strip()]


def test_data_check_prints_what_a_run_would_use(capsys, tok):
    """``data check --json``: prompts, responses, the pairs per objective on the full and on the trained text
    (as counted here from the loader and the truncation rule), rank agreement and the correlation with length;
    ``prefalign llm data check`` is the same command."""
    from prefalign.__main__ import main as prefalign

    path = FIXTURES / "helpsteer2.parquet"
    code, out, err = _main(capsys, "data", "check", path, "--json", "--preset", "smoke")
    assert code == 0, err
    rep = json.loads(out)
    c = load_data(path)
    tc = trained_candidates(c, tok, PRESETS["smoke"].max_response_tokens)
    assert rep["prompts"] == len(c.prompts) and rep["responses"] == int(c.present_mask.sum())
    assert rep["objectives"] == list(c.objectives)
    for o in c.objectives:
        v = rep["per_objective"][o]
        assert v["pairs_full_text"] == len(preference_pairs(c, o)) > v["pairs_trained_text"] == len(
            preference_pairs(tc, o)) > 0
        assert -1 <= v["tau_with_length"] <= 1
    assert len(rep["agreement"]["pairs"]) == 10 and rep["split"]["held-out"] >= 1
    assert prefalign(["llm", "data", "check", str(path)]) == 0
    text = capsys.readouterr().out
    assert "within-prompt Kendall tau_b" in text and "tau(length)" in text and "schema responses" in text
    code, out, err = _main(capsys, "data", "stats", "--data", path, "--json", "--tokens", "16")
    assert code == 0, err
    rows = {r["objective"]: r for r in json.loads(out)["truncation"]["rows"]}
    for o in c.objectives:  # data stats reads the same file: the same pairs; no agreement for annotations
        assert rows[o]["pairs_trained_text"] == rep["per_objective"][o]["pairs_trained_text"]
        assert np.isnan(rows[o]["full_label_agreement"])


def _edit_rows(name, tmp_path, edit):
    """The fixture's rows after ``edit(rows)``, written as CSV (flat rows) or JSON Lines (nested ones)."""
    rows = _raw(name)
    edit(rows)
    if (FIXTURES / name).is_dir():
        p = tmp_path / "bad.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        p = tmp_path / "bad.csv"
        pd.DataFrame(rows).to_csv(p, index=False)
    return p


def _set(i, key, value):
    def edit(rows):
        rows[i][key] = value
    return edit


def _rating(i, j, aspect, value):
    def edit(rows):
        rows[i]["completions"][j]["annotations"][aspect]["Rating"] = value
    return edit


def _drop_rows(prompt_index):
    def edit(rows):
        prompt = rows[prompt_index]["prompt"]
        first = next(k for k, r in enumerate(rows) if r["prompt"] == prompt)
        rows[:] = [r for k, r in enumerate(rows) if r["prompt"] != prompt or k == first]
    return edit


def _constant(col):
    def edit(rows):
        for r in rows:
            r[col] = 3
    return edit


def _drop_col(col):
    def edit(rows):
        for r in rows:
            r.pop(col)
    return edit


def _duplicate(i, j):
    def edit(rows):
        rows[j]["prompt"] = "  " + rows[i]["prompt"].replace(" ", "  ") + "\n"
    return edit


BAD = {
    "missing column": ("pku_saferlhf.csv", _drop_col("response_1"), (), "column 'response_1' is missing"),
    "missing objective": ("pku_saferlhf.csv", lambda rows: None, ("--objectives", "better,harmless"),
                          "column 'harmless' is missing"),
    "non-numeric score": ("helpsteer2.parquet", _set(2, "helpfulness", "high"), (),
                          "row 3: column 'helpfulness' is 'high', not a finite number"),
    "non-numeric rating": ("ultrafeedback", _rating(4, 1, "honesty", "N/A"), (),
                           "row 5: column 'completions[1].annotations.honesty.Rating' is 'N/A', not a finite number"),
    "label not 0/1": ("pku_saferlhf.csv", _set(6, "safer_response_id", 2), (),
                      "row 7: column 'safer_response_id' is 2, not 0 or 1"),
    "one response": ("helpsteer2.parquet", _drop_rows(0), (), "has 1 response(s); every prompt needs at least two"),
    "no pair": ("helpsteer2.parquet", _constant("verbosity"), (), "column 'verbosity': objective 'verbosity' has no "
                "preference pair on the trained text"),
    "duplicate prompt": ("pku_saferlhf.csv", _duplicate(1, 4), (), "row 5: column 'prompt' is"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_data_is_one_line_exit_2_before_any_model_is_loaded(case, tmp_path, capsys, tiny_dir, monkeypatch):
    """``data check`` and ``run`` refuse each fault with status 2 and one line naming the column, the row and
    the value; ``run`` before loading any model (load_model raises if called) and without writing a record."""
    import llm_runs.model.models

    name, edit, extra, match = BAD[case]
    path = _edit_rows(name, tmp_path, edit)

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(llm_runs.model.models, "load_model", no_model)
    code, _, err = _main(capsys, "data", "check", path, *extra)
    assert code == 2 and len(err) == 1 and match in err[0], err
    out = tmp_path / "out"
    code, _, err = _main(capsys, "run", "--preset", "smoke", "--shrink", "--data", path, "--model", tiny_dir,
                         "--out", out, *extra)
    assert code == 2 and len(err) == 1 and "argument --data:" in err[0] and match in err[0], err
    assert not (out / "summary.json").exists()
    if case == "duplicate prompt":
        assert "the prompt of row 2 again" in err[0] and "train / held-out / evaluation split" in err[0]


# ------------------------------------------------------------------------------------------------ the runs


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory):
    """``python -m llm_runs run --preset smoke --shrink --autocast none --data FIXTURE --model TINY`` per schema
    (in this process: no re-exec), with ``--objectives`` where given."""
    from llm_runs.__main__ import main

    mp = pytest.MonkeyPatch()
    mp.setenv("PREFALIGN_NO_REEXEC", "1")
    out = {}
    try:
        for schema, (name, _, objectives) in SCHEMAS.items():
            d = tmp_path_factory.mktemp(f"run-{schema}")
            args = ["run", "--preset", "smoke", "--shrink", "--autocast", "none", "--device", "cpu", "--data",
                    str(FIXTURES / name), "--model", str(tiny_dir), "--out", str(d), "--seed", "1", "--no-progress"]
            if objectives:
                args += ["--objectives", ",".join(objectives)]
            assert main(args) == 0
            out[schema] = d
    finally:
        mp.undo()
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("schema", sorted(SCHEMAS))
def test_a_run_on_each_schema_records_its_objectives_and_labels(schema, runs, tok):
    """The run trains on the file's objectives (or --objectives), records every loss and held-out column of them,
    says its labels are annotations, skips the generation evaluation (no reward scores a generated text) and
    trains on exactly the pairs the truncation rule keeps (as many as ``data check`` counts)."""
    from llm_runs.runs.presets import data_check

    name, objectives, picked = SCHEMAS[schema]
    objectives = picked or objectives
    d = runs[schema]
    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "complete" and s["objectives"] == list(objectives)
    assert s["data_file"]["labels"] == "annotations" and s["data_file"]["schema"] == schema
    assert "skipped" in s["generation_rewards"] and not (d / "generations.csv").exists()
    assert s["preset_config"]["generation"] is None and s["preset_config"]["design"]["objectives"] == list(objectives)
    rec = pd.read_csv(d / "trajectory.csv")
    for o in objectives:
        for k in ("loss", "heldout_loss", "heldout_acc"):
            assert rec[f"{k}_{o}"].notna().any()
    assert (rec["gap"] >= 0).all() and s["gradient_evaluations"]["done"] == s["gradient_evaluations"]["planned"]
    check = data_check(FIXTURES / name, objectives=picked, preset=PRESETS["smoke"].shrunk(), tokenizer=tok, seed=1)
    trunc = {r["objective"]: r for r in s["labels"]["truncation"]}
    c = load_data(FIXTURES / name)
    for o in objectives:
        assert trunc[o]["pairs_trained_text"] == len(preference_pairs(trained_candidates(c, tok, T, objectives), o))
        assert np.isnan(trunc[o]["full_label_agreement"])  # annotations are not recomputed
    assert check["max_response_tokens"] == T and check["preset"] == s["preset"] == "smoke-shrunk"
    held = set(s["clients"]["heldout_prompts"])
    client_prompts = [p for cl in s["clients"]["clients"] for p in cl["prompts"]]
    assert held and not held & set(client_prompts) and len(set(client_prompts)) == len(client_prompts)
    assert held == set(check["clients"]["heldout_prompts"])  # the check deals the run's clients (same seed)


@pytest.mark.e2e
def test_the_dashboards_llm_section_reads_the_runs(runs, tmp_path):
    """The LLM section built from the four runs: it reads them, runs the studies on the first and fills the LLM
    column of the headline table; the generation-reward rows say not recorded."""
    from verification.report.llm_section import build_llm_section, headline_rows, section_markdown

    dirs = [runs[s] for s in sorted(SCHEMAS)]
    sec = build_llm_section(tmp_path, llm_runs=dirs)
    assert sec.status == "read" and all(str(d) in sec.message for d in dirs)
    sources, rows = headline_rows(sec)
    assert sources[0] == "LLM"
    by = {r[0]: r[1] for r in rows}
    assert any(k.startswith("eq 71 holds") and v not in ("–", "") for k, v in by.items())
    assert any(k.startswith("Pipeline 1 (w_II)") and v not in ("–", "") for k, v in by.items())
    assert all(v == "–" for k, v in by.items() if k.startswith("Rewards of generated responses"))
    md = "\n".join(section_markdown(sec))
    assert "--data" in md and sec.figures


def test_a_sweep_records_the_data_and_refuses_bad_data_before_any_work(tmp_path, capsys, tiny_dir):
    """The sweep of runs takes the same --data / --columns / --objectives: its params.json names the data (the
    sha256 of a saved dataset's files, the column mapping) and the objectives (in the preset's configuration);
    bad data is the same one-line exit 2, before any cluster starts or any model is loaded."""
    from llm_runs.sweeps.sweep import sweep_params

    preset = PRESETS["smoke"].shrunk()
    folder = FIXTURES / "ultrafeedback"
    a = sweep_params(preset, data=folder, columns={"instruction": "instruction"})
    b = sweep_params(preset, data=folder)
    assert a["data"]["columns"] == {"instruction": "instruction"} and "columns" not in b["data"]
    assert a["data"]["sha256"] == b["data"]["sha256"] and len(a["data"]["sha256"]) == 64
    bad = _edit_rows("pku_saferlhf.csv", tmp_path, _set(6, "safer_response_id", 2))
    out = tmp_path / "sweep"
    code, _, err = _main(capsys, "sweep", "--preset", "smoke", "--shrink", "--seeds", "0:1", "--workers", "1",
                         "--data", bad, "--model", tiny_dir, "--out", out)
    assert code == 2 and len(err) == 1 and "row 7: column 'safer_response_id' is 2" in err[0], err
    assert not (out / "params.json").exists()
    code, _, err = _main(capsys, "sweep", "--preset", "smoke", "--seeds", "0:1", "--data", FIXTURES / "pku_saferlhf.csv",
                         "--objectives", "better", "--out", out)
    assert code == 2 and len(err) == 1 and "argument --objectives: need at least two objectives" in err[0], err


# ------------------------------------------------------------------------------------- issue 43: data and arguments


def test_non_utf8_json_lines_is_one_line_exit_2_naming_the_byte(tmp_path, capsys, tiny_dir):
    """A JSON Lines file with a Latin-1 byte: ``data check`` and ``run`` name the file, the line and the byte."""
    p = tmp_path / "latin1.jsonl"
    rows = _raw("helpsteer2.parquet")
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    p.write_bytes(text.replace(b"Describe", b"D\xe9scribe", 1))
    code, _, err = _main(capsys, "data", "check", p)
    assert code == 2 and len(err) == 1 and "line 1: byte 14 is b'\\xe9', not UTF-8" in err[0], err
    out = tmp_path / "out"
    code, _, err = _main(capsys, "run", "--preset", "smoke", "--shrink", "--data", p, "--model", tiny_dir, "--out", out)
    assert code == 2 and len(err) == 1 and "not UTF-8" in err[0] and not out.exists(), err


def test_scores_of_any_size_give_the_same_pairs(tmp_path):
    """The same file with every score multiplied by 1e290 (squares overflow) or 1e-290: the same pairs."""
    rows = _raw("helpsteer2.parquet")
    ref = load_data(FIXTURES / "helpsteer2.parquet")
    for k, factor in enumerate((1e290, 1e-290)):
        scaled = [{**r, **{o: float(r[o]) * factor for o in ref.objectives}} for r in rows]
        p = tmp_path / f"scaled{k}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in scaled))
        c = load_data(p)
        for o in ref.objectives:
            key = [(x.prompt_id, x.chosen_index, x.rejected_index) for x in preference_pairs(ref, o)]
            assert [(x.prompt_id, x.chosen_index, x.rejected_index) for x in preference_pairs(c, o)] == key
            assert within_prompt_scale(c.scores[o]) == pytest.approx(within_prompt_scale(ref.scores[o]) * factor,
                                                                     rel=1e-12)


def test_an_outlying_score_is_named_when_the_prompts_run_out(tmp_path, capsys):
    """One score of 1e30 among ordinary ones makes the pair margin that large: the refusal names the score."""
    p = _edit_rows("helpsteer2.parquet", tmp_path, _set(3, "helpfulness", 1e30))
    code, _, err = _main(capsys, "data", "check", p)
    assert code == 2 and len(err) == 1 and "runs out of prompts" in err[0], err
    assert "'helpfulness' has pairs in" in err[0] and "score 1e+30" in err[0], err


@pytest.mark.parametrize("mapping, match", [
    ("prompt=response,response=response", "mapping prompt=response,response=response maps the one column "
                                          "'response' to two roles"),
    ("prompt=response", "--columns prompt=response: the column 'response' would be both 'prompt' and 'response'")])
def test_one_column_for_two_roles_names_the_mapping(mapping, match, capsys):
    code, _, err = _main(capsys, "data", "check", FIXTURES / "helpsteer2.parquet", "--columns", mapping)
    assert code == 2 and len(err) == 1 and match in err[0], err


def _saved_copy(tmp_path, filename=None):
    import shutil

    d = tmp_path / "saved"
    shutil.copytree(FIXTURES / "ultrafeedback", d)
    if filename is not None:
        state = json.loads((d / "state.json").read_text())
        state["_data_files"] = [{"filename": filename}]
        (d / "state.json").write_text(json.dumps(state))
    return d


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_a_saved_dataset_naming_a_file_outside_its_folder_is_refused(where, tmp_path, capsys, tiny_dir):
    import shutil

    outside = tmp_path / "elsewhere" / "data.arrow"
    outside.parent.mkdir()
    shutil.copy(FIXTURES / "ultrafeedback" / "data-00000-of-00001.arrow", outside)
    name = str(outside) if where == "absolute" else "../elsewhere/data.arrow"
    d = _saved_copy(tmp_path, name)
    code, _, err = _main(capsys, "data", "check", d)
    assert code == 2 and len(err) == 1 and f"state.json names {name!r}, outside the folder" in err[0], err
    out = tmp_path / "sweep"
    code, _, err = _main(capsys, "sweep", "--preset", "smoke", "--shrink", "--seeds", "0:1", "--workers", "1",
                         "--data", d, "--model", tiny_dir, "--out", out)
    assert code == 2 and len(err) == 1 and "outside the folder" in err[0] and not out.exists(), err


def test_the_sweep_digest_covers_the_bytes_read_not_the_folder(tmp_path):
    from llm_runs.sweeps.sweep import sweep_params

    preset = PRESETS["smoke"].shrunk()
    d = _saved_copy(tmp_path)
    ref = sweep_params(preset, data=d)["data"]["sha256"]
    (d / "notes.txt").write_text("not read")
    (d / "cache-1234.arrow").write_bytes(b"stale cache, not named in state.json")
    assert sweep_params(preset, data=d)["data"]["sha256"] == ref
    arrow = d / "data-00000-of-00001.arrow"
    arrow.write_bytes(arrow.read_bytes() + b"\0")
    assert sweep_params(preset, data=d)["data"]["sha256"] != ref


def test_a_bad_objective_of_a_sweep_exits_2_before_hashing_or_creating_the_folder(tmp_path, capsys, tiny_dir,
                                                                                   monkeypatch):
    import llm_runs.sweeps.sweep

    def no_hash(path):
        raise AssertionError("the data was hashed")

    monkeypatch.setattr(llm_runs.sweeps.sweep, "_sha256", no_hash)
    out = tmp_path / "sweep"
    code, _, err = _main(capsys, "sweep", "--preset", "smoke", "--shrink", "--seeds", "0:1", "--workers", "1",
                         "--data", FIXTURES / "ultrafeedback", "--objectives", "helpfulness,nonexistent",
                         "--model", tiny_dir, "--out", out)
    assert code == 2 and len(err) == 1 and "'nonexistent'" in err[0] and not out.exists(), err
