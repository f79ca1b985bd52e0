r"""A user's model folder (``--model DIR``): checked before any work, and loaded without running code from it.

Every command that takes a model folder checks it with :func:`check_model_folder` before it does anything else,
and every load of a model, a config or a tokenizer in the project passes ``trust_remote_code=False`` (transformers
then never asks "Do you wish to run the custom code?") and ``local_files_only=True``; model weights are read from
safetensors files only (``use_safetensors=True``), never from a pickle. The check refuses, with one line naming
the folder and the file or field (:class:`ModelFolderError`, a ``ValueError``; :class:`ModelNotFoundError` for a
folder that is not there):

- a folder that does not exist, is not a directory, or has no ``config.json``;
- a ``config.json`` (or any other ``*config.json`` of the folder, e.g. ``tokenizer_config.json``) that is not a
  JSON object, or that declares custom code (a field ``auto_map``, at any depth);
- a ``config.json`` without a ``model_type`` or with one transformers does not know (its code would have to come
  from the folder);
- no ``*.safetensors`` weights: a folder whose weights are only pickles (``.bin``, ``.pt``, ``.pth``, ``.ckpt``,
  ``.pkl``, ``.pickle``) is refused naming the file (a pickle next to safetensors weights is never read); a
  safetensors file whose header does not parse;
- weights that do not fit the config: transformers builds the config's causal LM on the meta device (no memory,
  no tensor data read) and loads the weights' names and shapes into it; a tensor of another shape or a parameter
  the weights lack is named (tensors the model does not use are ignored, as transformers does);
- a tokenizer that transformers cannot load from the folder.

Whatever else transformers raises while building the model or the tokenizer becomes a :class:`ModelFolderError`
naming the folder (the command line prints it as one line and exits 2). The check imports transformers (and so
torch) only after the file checks.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "LOAD_FLAGS",
    "MODEL_LOAD_FLAGS",
    "PICKLE_SUFFIXES",
    "ModelFolderError",
    "ModelNotFoundError",
    "check_model_folder",
    "load_causal_lm",
    "load_tokenizer",
    "read_model_config",
]

#: Flags of every ``from_pretrained`` of a config or tokenizer: no code from the folder (and no prompt asking to run
#: it), nothing from a model hub.
LOAD_FLAGS: dict = {"trust_remote_code": False, "local_files_only": True}
#: Flags of every ``from_pretrained`` of a model: :data:`LOAD_FLAGS` and weights from safetensors files only.
MODEL_LOAD_FLAGS: dict = {**LOAD_FLAGS, "use_safetensors": True}
#: Weight files that are Python pickles (loading one can run code): refused, never handed to torch.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


class ModelNotFoundError(FileNotFoundError):
    """A model directory, model file or model package is missing; the message says which and how to fix it."""


class ModelFolderError(ValueError):
    """A model folder that cannot be used: custom code, a bad ``config.json``, missing, pickled or ill-fitting
    weights, a tokenizer that does not load. The message is one line naming the folder and the file or field."""


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= limit else text[:limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _custom_code_field(obj, path: str = "") -> str | None:
    """The dotted path of the first ``auto_map`` field in a parsed JSON value, or None."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            here = f"{path}.{key}" if path else str(key)
            if key == "auto_map":
                return here
            found = _custom_code_field(value, here)
            if found:
                return found
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found = _custom_code_field(value, f"{path}[{i}]")
            if found:
                return found
    return None


def _read_json_object(folder: Path, name: str) -> dict:
    where = f"model directory {str(folder)!r}: {name}"
    try:
        obj = json.loads((folder / name).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelFolderError(f"{where} cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ModelFolderError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise ModelFolderError(f"{where} is not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ModelFolderError(f"{where} holds a JSON {type(obj).__name__}, not an object")
    field = _custom_code_field(obj)
    if field:
        raise ModelFolderError(f"{where} declares custom code (field {field!r}); code from a model folder is never "
                               f"run: use a model of an architecture that transformers ships")
    return obj


def _check_weight_files(folder: Path) -> None:
    where = f"model directory {str(folder)!r}"
    files = sorted(p for p in folder.iterdir() if p.is_file())
    weights = [p for p in files if p.name.endswith(".safetensors")]
    if not weights:
        pickles = [p.name for p in files if p.name.endswith(PICKLE_SUFFIXES)]
        if pickles:
            raise ModelFolderError(f"{where}: its weights {pickles[0]} are a pickle, which is never loaded (it can "
                                   f"run code); save the model as safetensors (save_pretrained(DIR, "
                                   f"safe_serialization=True))")
        raise ModelFolderError(f"{where} has no weights: no *.safetensors file next to config.json")
    from safetensors import safe_open

    for p in weights:
        try:
            with safe_open(str(p), framework="numpy") as f:
                f.keys()
        except Exception as exc:  # noqa: BLE001  (safetensors raises its own error type, or OSError)
            raise ModelFolderError(f"{where}: {p.name} is not a readable safetensors file ({_one_line(exc)})") from None


def read_model_config(folder: str | os.PathLike) -> dict:
    """The file checks of :func:`check_model_folder` (no transformers, no torch): the folder, its JSON config files
    (objects, no custom code), a ``model_type`` field, safetensors weights (no pickles). Returns ``config.json``."""
    path = Path(folder).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"model directory {str(folder)!r} does not exist")
    if not path.is_dir():
        raise ModelNotFoundError(f"model directory {str(folder)!r} is not a directory")
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"model directory {str(folder)!r} has no config.json: it is not a Hugging Face model "
                                 f"directory")
    config = _read_json_object(path, "config.json")
    for other in sorted(path.glob("*config.json")):
        if other.name != "config.json" and other.is_file():
            _read_json_object(path, other.name)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelFolderError(f"model directory {str(folder)!r}: config.json has no field 'model_type' (a string "
                               f"naming the architecture); got {model_type!r}")
    _check_weight_files(path)
    return config


@contextmanager
def _quiet_transformers():
    """transformers' warnings, load report and progress bars off (the check prints nothing but its one line)."""
    import warnings

    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _reraise_fatal(exc: BaseException) -> None:
    """Errors that are not the folder's fault (out of memory) go on as they are."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        raise exc


def load_tokenizer(folder: str | os.PathLike):
    """The folder's tokenizer (``AutoTokenizer`` with :data:`LOAD_FLAGS`); any failure is a :class:`ModelFolderError`
    naming the folder. Call :func:`read_model_config` (or :func:`check_model_folder`) first."""
    from transformers import AutoTokenizer

    try:
        with _quiet_transformers():
            return AutoTokenizer.from_pretrained(Path(folder).expanduser(), **LOAD_FLAGS)
    except Exception as exc:  # noqa: BLE001  (whatever transformers raises, the folder is named)
        _reraise_fatal(exc)
        raise ModelFolderError(f"model directory {str(folder)!r}: its tokenizer cannot be loaded "
                               f"({_one_line(exc)})") from None


def load_causal_lm(folder: str | os.PathLike, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(folder, **MODEL_LOAD_FLAGS, **kwargs)``; a failure is a
    :class:`ModelFolderError` naming the folder. With ``output_loading_info=True``: ``(model, info)``."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(Path(folder).expanduser(), **MODEL_LOAD_FLAGS, **kwargs)
    except Exception as exc:  # noqa: BLE001  (whatever transformers raises, the folder is named)
        _reraise_fatal(exc)
        raise ModelFolderError(f"model directory {str(folder)!r} cannot be loaded as a causal language model "
                               f"({_one_line(exc)})") from None


def _check_weights_fit(folder: str | os.PathLike) -> None:
    """Build the config's causal LM on the meta device and load the weights' names and shapes into it."""
    where = f"model directory {str(folder)!r}"
    with _quiet_transformers():
        _, info = load_causal_lm(folder, device_map="meta", output_loading_info=True, ignore_mismatched_sizes=True)
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: m[0])
    if mismatched:
        name, got, want = mismatched[0]
        raise ModelFolderError(f"{where}: the weights do not fit config.json: tensor {name!r} has shape "
                               f"{tuple(got)}, the config's model needs {tuple(want)} ({len(mismatched)} tensor(s) "
                               f"of another shape)")
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelFolderError(f"{where}: the weights do not fit config.json: {len(missing)} parameter(s) of the "
                               f"config's model are not in the weights, e.g. {missing[0]!r}")


def check_model_folder(folder: str | os.PathLike, *, tokenizer: bool = True):
    """Check a user's model folder before any work (see the module docstring) and return its tokenizer (loaded to
    check it; None with ``tokenizer=False``, for a run that brings its own). Raises :class:`ModelNotFoundError` or
    :class:`ModelFolderError` with one line naming the folder and the file or field."""
    config = read_model_config(folder)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if config["model_type"] not in CONFIG_MAPPING_NAMES:
        import transformers

        raise ModelFolderError(f"model directory {str(folder)!r}: config.json field 'model_type' is "
                               f"{config['model_type']!r}, which transformers {transformers.__version__} does not "
                               f"know (its code would come from the folder, which is never run)")
    _check_weights_fit(folder)
    return load_tokenizer(folder) if tokenizer else None
