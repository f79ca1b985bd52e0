"""A ``--model`` directory never runs code and an unusable one is one line, exit 2 (llm_runs.model.model_folder).

Crafted folders: custom code that writes a marker file when it is executed (declared in ``config.json`` or in
``tokenizer_config.json``), fed to the real commands as subprocesses with ``y`` piped on stdin (transformers asks
"Do you wish to run the custom code? [y/N]" unless told ``trust_remote_code=False``); and one folder per kind of
unusable model directory, refused by ``data check --model`` and ``run --model`` before any work. Every
``from_pretrained`` in ``llm_runs`` passes the no-code flags.

Cheap by design: every refusal comes before a model is loaded; the valid folder is the tiny random Llama."""

from __future__ import annotations

import ast
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from llm_runs.model.models import save_random_llama  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "fixtures" / "byo_data" / "pku_saferlhf.csv"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_random_llama(tmp_path_factory.mktemp("model") / "tiny", "tiny", dtype="float32")[0]


def _copy(tiny_dir, tmp_path, name="model") -> Path:
    d = tmp_path / name
    shutil.copytree(tiny_dir, d)
    return d


def _edit_json(path: Path, **fields) -> None:
    obj = json.loads(path.read_text())
    obj.update(fields)
    path.write_text(json.dumps(obj))


def _payload(marker: Path) -> str:
    """Python that writes ``marker`` when it is imported."""
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('custom code ran')\n"


def _custom_code_in_config(d: Path, marker: Path) -> None:
    """The issue's folder: ``auto_map`` in config.json with a ``model_type`` transformers does not know."""
    _edit_json(d / "config.json", model_type="evil_llama", architectures=["EvilForCausalLM"],
               auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                         "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    (d / "configuration_evil.py").write_text(_payload(marker) + "from transformers import PretrainedConfig\n"
                                             "class EvilConfig(PretrainedConfig):\n    model_type = 'evil_llama'\n")
    (d / "modeling_evil.py").write_text(_payload(marker))
    (d / "tokenizer_config.json").unlink()  # the tokenizer then needs the config: transformers asks to run it


def _custom_code_in_tokenizer(d: Path, marker: Path) -> None:
    """An otherwise valid model whose tokenizer_config.json declares a tokenizer class of the folder's own code."""
    _edit_json(d / "tokenizer_config.json", tokenizer_class="EvilTokenizer",
               auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    (d / "tokenization_evil.py").write_text(_payload(marker) + "from transformers import PreTrainedTokenizerFast\n"
                                            "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")


CUSTOM_CODE = {"config": (_custom_code_in_config, "config.json declares custom code (field 'auto_map')"),
               "tokenizer": (_custom_code_in_tokenizer, "tokenizer_config.json declares custom code (field 'auto_map')")}
COMMANDS = {
    "data check": ["data", "check", str(DATA)],
    "run": ["run", "--preset", "smoke", "--shrink", "--autocast", "none", "--device", "cpu", "--data", str(DATA),
            "--no-progress"],
}


@pytest.mark.e2e
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("where", sorted(CUSTOM_CODE))
def test_custom_code_in_a_model_folder_never_runs_even_when_y_is_piped(where, command, tiny_dir, tmp_path):
    """``python -m llm_runs data check DATA --model DIR`` and ``run --model DIR`` on a folder whose code writes a
    marker file when imported, with ``y`` on stdin: exit 2, one line naming the file and the field, no marker, no
    output folder, and nothing of the folder copied into the Hugging Face module cache."""
    craft, message = CUSTOM_CODE[where]
    d, marker, hf_home, out = _copy(tiny_dir, tmp_path), tmp_path / "MARKER", tmp_path / "hf", tmp_path / "out"
    craft(d, marker)
    args = [*COMMANDS[command], "--model", str(d)] + (["--out", str(out)] if command == "run" else [])
    env = {**os.environ, "HF_HOME": str(hf_home), "PREFALIGN_NO_REEXEC": "1"}
    res = subprocess.run([sys.executable, "-m", "llm_runs", *args], input="y\n", capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=300)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert not marker.exists(), f"the model folder's code ran: {res.stderr[-2000:]}"
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert "argument --model:" in lines[0] and message in lines[0] and str(d) in lines[0], lines
    assert not out.exists() and not list(hf_home.rglob("*evil*"))


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("where", sorted(CUSTOM_CODE))
def test_custom_code_in_a_model_folder_is_refused_in_this_process(where, command, tiny_dir, tmp_path, capsys,
                                                                  monkeypatch):
    """The refusal above in the default tier: the command line's ``main`` in this process (the real command with
    ``y`` piped on its stdin is in the e2e tier) exits 2 with one line naming the file and the field, before the
    folder's code runs and before any output."""
    from llm_runs.__main__ import main

    monkeypatch.setenv("PREFALIGN_NO_REEXEC", "1")  # a run's malloc re-exec would replace this process
    craft, message = CUSTOM_CODE[where]
    d, marker, out = _copy(tiny_dir, tmp_path), tmp_path / "MARKER", tmp_path / "out"
    craft(d, marker)
    args = [*COMMANDS[command], "--model", str(d)] + (["--out", str(out)] if command == "run" else [])
    code = main(args)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert not marker.exists() and not out.exists()
    assert code == 2 and len(lines) == 1, lines
    assert "argument --model:" in lines[0] and message in lines[0] and str(d) in lines[0], lines


def _garbage_config(d, tmp):
    (d / "config.json").write_text("{'model_type': 'llama',")


def _list_config(d, tmp):
    (d / "config.json").write_text("[1, 2, 3]")


def _no_config(d, tmp):
    (d / "config.json").unlink()


def _config_only(d, tmp):
    for p in d.iterdir():
        if p.name != "config.json":
            p.unlink()


def _no_model_type(d, tmp):
    cfg = json.loads((d / "config.json").read_text())
    del cfg["model_type"]
    (d / "config.json").write_text(json.dumps(cfg))


def _unknown_model_type(d, tmp):
    _edit_json(d / "config.json", model_type="my_llama")


def _weights(d, edit):
    from safetensors.numpy import load_file

    tensors = load_file(str(d / "model.safetensors"))
    safetensors_numpy.save_file(edit(tensors), str(d / "model.safetensors"))


def _wrong_shapes(d, tmp):
    rng = np.random.default_rng(0)
    _weights(d, lambda t: {k: rng.standard_normal([n + 1 for n in v.shape]).astype(np.float32) for k, v in t.items()})


def _wrong_names(d, tmp):
    rng = np.random.default_rng(0)
    _weights(d, lambda t: {f"w{i}": rng.standard_normal((4, 3)).astype(np.float32) for i in range(3)})


def _corrupt_safetensors(d, tmp):
    (d / "model.safetensors").write_bytes(b"\xff" * 64)


class _Evil:
    """A pickle that creates a file when it is unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _pickled_weights(d, tmp):
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(_Evil(tmp / "MARKER")))


def _broken_tokenizer(d, tmp):
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')


def _bad_field_value(d, tmp):  # whatever transformers raises while building the model: one line naming the folder
    _edit_json(d / "config.json", num_hidden_layers="two")


BAD_FOLDERS = {
    "garbage config.json": (_garbage_config, "config.json is not valid JSON"),
    "config.json not an object": (_list_config, "config.json holds a JSON list, not an object"),
    "no config.json": (_no_config, "has no config.json"),
    "config.json only": (_config_only, "has no weights: no *.safetensors file"),
    "no model_type": (_no_model_type, "config.json has no field 'model_type'"),
    "unknown model_type": (_unknown_model_type, "config.json field 'model_type' is 'my_llama'"),
    "weights of wrong shapes": (_wrong_shapes, "the weights do not fit config.json: tensor 'model.embed_tokens.weight' "
                                               "has shape (49153, 65), the config's model needs (49152, 64)"),
    "weights of wrong names": (_wrong_names, "the weights do not fit config.json: 21 parameter(s) of the config's "
                                             "model are not in the weights"),
    "corrupt safetensors": (_corrupt_safetensors, "model.safetensors is not a readable safetensors file"),
    "pickled weights": (_pickled_weights, "its weights pytorch_model.bin are a pickle, which is never loaded"),
    "broken tokenizer": (_broken_tokenizer, "its tokenizer cannot be loaded"),
    "config transformers cannot build": (_bad_field_value, "cannot be loaded as a causal language model"),
}


def _main(capsys, *args):
    from llm_runs.__main__ import main

    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, [ln for ln in out.err.splitlines() if ln.strip()]


@pytest.mark.parametrize("kind", sorted(BAD_FOLDERS))
def test_an_unusable_model_folder_is_one_line_exit_2_before_any_work(kind, tiny_dir, tmp_path, capsys, monkeypatch):
    """``data check --model`` and ``run --model`` refuse each kind of unusable folder with status 2 and one line
    naming the folder and what is wrong, before any work (no output folder, no model loaded); a pickle is never
    unpickled."""
    import llm_runs.model.models

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(llm_runs.model.models, "load_model", no_model)
    monkeypatch.setenv("PREFALIGN_NO_REEXEC", "1")
    craft, message = BAD_FOLDERS[kind]
    d = _copy(tiny_dir, tmp_path)
    craft(d, tmp_path)
    out = tmp_path / "out"
    for command in COMMANDS.values():
        args = [*command, "--model", d] + (["--out", out] if command[0] == "run" else [])
        code, err = _main(capsys, *args)
        assert code == 2 and len(err) == 1, err
        assert "argument --model:" in err[0] and str(d) in err[0] and message in err[0], err
    assert not out.exists() and not (tmp_path / "MARKER").exists()


def test_every_load_in_llm_runs_passes_the_no_code_flags():
    """Every ``from_pretrained`` call in the package passes ``trust_remote_code=False`` (as a keyword, or through
    ``**LOAD_FLAGS`` / ``**MODEL_LOAD_FLAGS`` of llm_runs.model.model_folder); a model's also ``use_safetensors=True``."""
    from llm_runs.model.model_folder import LOAD_FLAGS, MODEL_LOAD_FLAGS

    assert LOAD_FLAGS["trust_remote_code"] is False and MODEL_LOAD_FLAGS["use_safetensors"] is True
    calls = []
    for path in sorted((REPO / "llm_runs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_pretrained":
                flags = {k.arg: k.value for k in node.keywords}
                spread = {k.value.id for k in node.keywords if k.arg is None and isinstance(k.value, ast.Name)}
                safe = (spread & {"LOAD_FLAGS", "MODEL_LOAD_FLAGS"}
                        or (isinstance(flags.get("trust_remote_code"), ast.Constant)
                            and flags["trust_remote_code"].value is False))
                calls.append((f"{path.relative_to(REPO)}:{node.lineno}", bool(safe)))
    assert len(calls) >= 6 and all(ok for _, ok in calls), calls
