r"""The positive-control gate: can the instrument see an objective at all? (``python -m llm_runs gate``,
``prefalign llm gate``).

.. code-block:: text

    python -m llm_runs gate [--objectives A,B,...] [--budgets 16,64] [--draws N] [--target 0.8] [--steps 16]
                            [--lr 5e-4] [--max-response-tokens 16] [--heldout-prompts 25] [--heldout-pairs 100]
                            [--max-pairs 32] [--workers K | --scheduler ADDRESS] [--threads T] [--model DIR] [--data PATH]
                            [--device auto|cpu|cuda] --out DIR

Pre-registration (written before any run; the code below implements it as written)
===================================================================================

**Question.** For a candidate objective ``o`` (a reward of the data file) and a budget ``b`` (training pairs per
objective), does an *oracle* — a model trained for a client who wants ``o`` — move the held-out implicit-reward
margins and the preference accuracy of ``o`` above the base model's? An objective the instrument cannot see this
way cannot show personalisation in a study either: the gate runs before any study, and an objective enters a study
only if it passes.

**Prompts.** Only the *calibration* prompts of the data file (:func:`llm_runs.preferences.clients.calibration_split`: a
prompt's side depends on its id alone); a study deals its clients and held-out pairs from the other side, so no
choice made here saw a study's held-out prompt. Per draw ``d = 0, 1, ..., N-1`` the calibration prompts are
shuffled with ``numpy.random.default_rng(d)`` and dealt: held-out prompts first, until there are at least
``heldout_prompts`` of them and every candidate objective has at least ``heldout_pairs`` pairs on them
(:func:`llm_runs.preferences.data.preference_pairs` on the trained text, margin ``margin`` within-prompt sd's); then
``heldout_pairs`` pairs per objective drawn from those (the same generator); the remaining calibration prompts are
the draw's *training part*, whose pairs of each objective are put in a random order (the same generator). Budget
``b`` trains on the first ``b`` pairs of every candidate objective in that order (the budgets of a draw are
nested), never on a held-out prompt. Every cell of a draw shares its split, so the objectives and budgets of a
draw are scored on the same held-out pairs.

**Oracle.** One cell per (objective ``o``, budget ``b``, draw ``d``): from the base model (LoRA at ``B = 0``,
adapter seed ``d``; the study's rank, scaling, β, label smoothing, float32), ``steps`` full-batch AdamW steps (no
weight decay, learning rate ``lr``) on the λ-weighted conservative-DPO loss ``Σ_k λ_k l_k``
(:func:`llm_runs.training.objectives.weighted_gradient`) at the target preference ``λ_o = target``,
``λ_k = (1 − target)/(m − 1)`` for every other candidate ``k``, over ``b`` pairs of each candidate; a step's
pairs go forward and backward in chunks of at most ``max_pairs`` and their gradients are summed (the full batch's
gradient up to roundoff, in the memory of one chunk).

**Scores.** Every pair held out in the draw, of every candidate objective, is scored under the base model and the
oracle (:meth:`~llm_runs.training.objectives.PreferenceModel.grouped_pair_losses`, the study's scoring, float32). The base
model's margins must be exactly 0 (checked: a cell whose base margins are not fails). Per pair: the margin change
``Δ = margin(oracle) − margin(base)`` and the accuracy ``a`` (1 if the oracle's margin is positive, 1/2 for a
tie, 0 otherwise: :func:`~llm_runs.training.objectives.pair_accuracy`; the base model scores 1/2 on every pair). A cell
records per objective the pairs' prompt ids and margin changes, their means, and the training loss and accuracy
the oracle reached on its training pairs.

**Pooling the draws: prompts of all draws as units.** For ``(o, b)`` and a scored objective ``k`` the units are the
pairs ``(draw, held-out prompt)`` over the draws; a unit's value is the mean of ``Δ`` (respectively of ``a − 1/2``)
over its pairs of ``k``. A prompt held out in two draws is two units, each scored by its own draw's oracle. The
statistic is the mean of the unit values: ``z`` (the margin change) and ``accuracy = 1/2 + mean(a − 1/2)``.

* *p-value* (one-sided, H1: above the base model): a sign-flip permutation test over the units, ``P = 9999``
  flips of every unit's sign drawn from ``numpy.random.default_rng(0)``, ``p = (1 + #{T_flip ≥ T}) / (1 + P)``;
  under H0 (each unit's value symmetric about 0, the oracle fixed) ``p`` is valid at every level.
* *interval*: the 95 % percentile bootstrap over the units (2000 resamples with replacement from
  ``numpy.random.default_rng(0)``).

**The rule.** Objective ``o`` *passes at budget b* when, for its own objective ``k = o``, the margin change and the
accuracy are both above the base model's (``z > 0``, ``accuracy > 1/2``) with ``p < 0.01`` each. An objective
*passes the gate* at the smallest budget at which it passes (none: it does not). There is no correction across
objectives or budgets: each objective's entry is its own decision, and the budgets are reported side by side.
The spill-over (an oracle of ``o`` scored on every other candidate ``k``: the objective × objective matrix of ``z``
and accuracy, with their intervals and p-values) is reported, not gated.

Admission
=========

An objective enters a run or a sweep only through the gate: ``--gate DIR`` of ``python -m llm_runs run`` and
``sweep`` (:func:`admit`) refuses, before any work, a gate made on another model, data file (SHA-256), response
length or pair margin than the run's and an objective that did not pass it or is not among its candidates; without
``--objectives`` the run's objectives are those that passed (at least the preset's
:attr:`~llm_runs.runs.presets.RunPreset.min_objectives`). The gate's folder, the SHA-256 of its ``gate.json`` and the
objectives that passed are recorded in the preset's configuration (``preset_config.gate``).

Folder
======

``DIR/cells/<objective>/b<budget>-d<draw>.json``: one cell's result (:func:`gate_cell`), written atomically by the
Dask engine (:mod:`verification.engine.dask_engine`, the engine of ``llm sweep``) when the cell finishes;
``params.json``: what every cell depends on besides its coordinates (:func:`gate_params`: the settings — the
candidate objectives in order, target, steps, lr, response length, held-out sizes, DPO and LoRA settings —, the
model, the data file's path and SHA-256, the device, the threads, the package version); a folder made with other
parameters is refused before any work, other budgets and draws may be added. ``gate.json``: the summary
(:func:`summarize`): the settings, the calibration prompt ids, per cell its status and CPU seconds, the table
objective × budget (``z``, accuracy, intervals, p-values, pass, training loss and accuracy, CPU seconds), the
objective × objective matrices per budget and the objectives that pass. As for ``llm sweep``
(:mod:`llm_runs.sweeps.sweep`): a rerun recomputes nothing, a killed worker's cell is run again, a cell that raised is a
``failed`` cell kept until its file is removed, one writer per folder, ``--workers K | --scheduler ADDRESS``,
``--threads``; exit 0 when every cell is complete, 1 when one failed or is missing, 2 on a usage error (one line,
before any work), 130 when interrupted.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from llm_runs.runs.oracle import train_oracle
from sim import cli
from verification.core.evidence import to_jsonable
from verification.engine import dask_engine
from verification.engine.dask_engine import CELLS_DIR, Cell, CellFolderError, CellRun, read_cell
from verification.llm.answer import GATE_HEADER, gate_rows
from verification.llm.personalisation import N_BOOT, POWER, _percentile, _resample

__all__ = ["GATE_KIND", "SUMMARY_JSON", "ALPHA", "N_PERM", "GateSettings", "GateSettingsError", "DrawSplit", "GateDataError",
           "draw_split", "gate_candidates", "cell_path", "gate_params", "gate_cell", "gate_cells", "read_cells",
           "run_gate", "train_oracle", "prompt_units", "sign_flip_p", "one_sided", "pooled_scores", "passes", "summarize",
           "write_summary", "screen", "command", "GateRefusal", "admit", "DEFAULT_BUDGETS", "DEFAULT_DRAWS"]

GATE_KIND = "prefalign-verify llm gate"
SUMMARY_JSON = "gate.json"
#: The gate's one-sided level (pre-registered).
ALPHA = 0.01
#: Sign flips of the permutation test; the bootstrap resamples are the study's (N_BOOT).
N_PERM = 9999
#: The seed of the permutation and bootstrap draws of every test.
STAT_SEED = 0
CELL_KEYS = ("objective", "budget", "draw", "status", "seconds", "cpu_seconds")
#: The budgets (training pairs per objective) and draws of ``gate`` when not given.
DEFAULT_BUDGETS = (16, 64)
DEFAULT_DRAWS = 2


def _study():
    from llm_runs.runs.presets import PRESETS

    return PRESETS["study"]


class GateSettingsError(ValueError):
    """A bad gate setting; ``field``: the setting's name."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class GateSettings:
    """Everything a gate cell depends on besides its objective, budget and draw (module docstring); the defaults
    not given here are the ``study`` preset's (:func:`from_study`)."""

    objectives: tuple[str, ...]
    target: float = 0.8
    steps: int = 16
    lr: float = 5e-4
    max_response_tokens: int = 16
    heldout_prompts: int = 25
    heldout_pairs: int = 100
    margin: float = 0.25
    beta: float = 1.0
    label_smoothing: float = 0.1
    lora_r: int = 8
    lora_alpha: float = 16.0
    max_pairs: int = 32

    def __post_init__(self):
        objs = tuple(self.objectives)
        object.__setattr__(self, "objectives", objs)
        m = len(objs)
        if m < 2 or len(set(objs)) != m:
            raise GateSettingsError("objectives", "the gate needs at least two distinct candidate objectives; got "
                                    f"{list(objs)!r}")
        for o in objs:
            if not o or any(not (ch.isalnum() or ch in "-_.") for ch in o) or o[0] == ".":
                raise GateSettingsError("objectives", f"objective name {o!r} cannot name a folder")
        if not 1.0 / m < float(self.target) < 1.0:
            raise GateSettingsError("target", f"target must lie in (1/m, 1) = ({1 / m:.4g}, 1) for m = {m} "
                                              f"objectives; got {self.target!r}")
        for name in ("steps", "max_response_tokens", "heldout_prompts", "heldout_pairs", "lora_r", "max_pairs"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise GateSettingsError(name, f"{name} must be an integer >= 1; got {v!r}")
        if not (self.lr > 0 and np.isfinite(self.lr)):
            raise GateSettingsError("lr", f"lr must be a finite number > 0; got {self.lr!r}")

    @classmethod
    def from_study(cls, objectives: Sequence[str], **kw: Any) -> GateSettings:
        """The settings with the ``study`` preset's DPO loss, LoRA adapter, pair margin, response length and
        held-out sizes, overridden by ``kw``."""
        s = _study()
        base = dict(max_response_tokens=s.max_response_tokens, heldout_prompts=s.design.heldout_prompts,
                    heldout_pairs=s.design.heldout_pairs, margin=s.design.margin, beta=s.beta,
                    label_smoothing=s.label_smoothing, lora_r=s.lora_r, lora_alpha=s.lora_alpha)
        return cls(objectives=tuple(objectives), **{**base, **kw})

    def weights(self, objective: str) -> np.ndarray:
        """λ of the oracle of ``objective``: ``target`` on it, ``(1 − target)/(m − 1)`` on each other candidate."""
        m = len(self.objectives)
        lam = np.full(m, (1.0 - self.target) / (m - 1))
        lam[self.objectives.index(objective)] = self.target
        return lam

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(asdict(self))


class GateDataError(ValueError):
    """The calibration prompts cannot give the held-out pairs or a budget; the message names what is missing."""


def gate_candidates(settings: GateSettings, tokenizer, data=None, columns=None, *, model_dir=None):
    """The calibration side of the data file as the gate trains on it: ``(trained candidates, calibration prompt
    ids)`` (:func:`llm_runs.runs.presets.training_candidates` at the gate's response length and objectives; ``tokenizer``:
    the one of ``model_dir``'s model). The last result of a data file is kept for the next call in the process."""
    from llm_runs.preferences.clients import calibration_split
    from llm_runs.runs.presets import training_candidates

    key = _candidates_key(settings, model_dir, data, columns)
    if key is not None and key in _CANDIDATES:
        return _CANDIDATES[key]
    s = _study()
    preset = replace(s, max_response_tokens=settings.max_response_tokens,
                     design=replace(s.design, objectives=settings.objectives, margin=settings.margin))
    _, cands = training_candidates(preset, tokenizer, data, columns)
    found = cands, calibration_split(cands.prompt_ids)[0]
    if key is not None:
        _CANDIDATES.clear()
        _CANDIDATES[key] = found
    return found


#: The last trained candidates of this process (a worker runs many cells of one gate): key -> (candidates,
#: calibration prompt ids).
_CANDIDATES: dict[tuple, tuple] = {}


def _candidates_key(settings: GateSettings, model_dir, data, columns) -> tuple | None:
    """What the trained candidates depend on: the objectives, response length and pair margin, the model directory
    (its tokenizer), the data file's path, size and modification time (None: a folder, not cached) and the column
    mapping."""
    from llm_runs.preferences.data import DEFAULT_DATA_FILE

    path = Path(data if data is not None else DEFAULT_DATA_FILE).expanduser().resolve()
    if not path.is_file():
        return None
    st = path.stat()
    return (settings.objectives, settings.max_response_tokens, settings.margin,
            None if model_dir is None else str(Path(model_dir).expanduser().resolve()), str(path), st.st_size,
            st.st_mtime_ns, tuple(sorted((columns or {}).items())))


@dataclass(frozen=True)
class DrawSplit:
    """Draw ``draw``'s held-out prompts and pairs (per objective) and its training part's pairs in random order."""

    draw: int
    heldout_prompt_ids: tuple[str, ...]
    train_prompt_ids: tuple[str, ...]
    heldout: dict[str, tuple]
    train_pool: dict[str, tuple]

    def train_batches(self, budget: int) -> dict[str, list]:
        """The first ``budget`` training pairs of every objective (:class:`GateDataError` if one has fewer)."""
        short = {o: len(p) for o, p in self.train_pool.items() if len(p) < budget}
        if short:
            o, n = next(iter(short.items()))
            raise GateDataError(f"budget {budget} needs {budget} training pairs per objective; in draw {self.draw} "
                                f"{o!r} has {n} on the {len(self.train_prompt_ids)} calibration prompts not held out")
        return {o: list(p[:budget]) for o, p in self.train_pool.items()}


def draw_split(cands, settings: GateSettings, calibration_ids: Sequence[str], draw: int) -> DrawSplit:
    """The split of the calibration prompts of draw ``draw`` (module docstring, "Prompts"). Raises
    :class:`GateDataError` when the calibration prompts cannot give the held-out pairs."""
    from llm_runs.preferences.data import preference_pairs

    rng = np.random.default_rng(int(draw))
    objectives = settings.objectives
    ids = list(calibration_ids)
    by_prompt: dict[str, dict[str, list]] = {p: {o: [] for o in objectives} for p in ids}
    for o in objectives:
        for pair in preference_pairs(cands, o, margin=settings.margin, prompt_ids=ids):
            by_prompt[pair.prompt_id][o].append(pair)
    order = [ids[k] for k in rng.permutation(len(ids))]
    have = np.cumsum([[len(by_prompt[p][o]) for o in objectives] for p in order], axis=0).min(axis=1)
    enough = np.flatnonzero(have >= settings.heldout_pairs)
    n_held = max(settings.heldout_prompts, int(enough[0]) + 1 if len(enough) else len(order) + 1)
    if n_held >= len(order):
        raise GateDataError(f"the {len(order)} calibration prompts cannot hold out {settings.heldout_pairs} pairs "
                            f"per objective on at least {settings.heldout_prompts} prompts and keep prompts to train "
                            f"on (draw {draw}, objectives {list(objectives)})")
    held, train = order[:n_held], order[n_held:]

    def pool(prompts, o):
        return [pair for p in prompts for pair in by_prompt[p][o]]

    heldout = {}
    for o in objectives:
        pairs = pool(held, o)
        take = np.sort(rng.choice(len(pairs), size=settings.heldout_pairs, replace=False))
        heldout[o] = tuple(pairs[k] for k in take)
    train_pool = {}
    for o in objectives:
        pairs = pool(train, o)
        train_pool[o] = tuple(pairs[k] for k in rng.permutation(len(pairs)))
    return DrawSplit(int(draw), tuple(held), tuple(train), heldout, train_pool)


# ------------------------------------------------------------------------------------------------ the cells


def cell_path(out: str | Path, objective: str, budget: int, draw: int) -> Path:
    """``DIR/cells/<objective>/b<budget>-d<draw>.json``."""
    return Path(out) / CELLS_DIR / objective / f"b{int(budget)}-d{int(draw)}.json"


def gate_params(settings: GateSettings, *, model_dir: str | None = None, data: str | Path | None = None,
                device: str = "auto", threads: int = 1, columns: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``params.json`` of a gate folder (module docstring). Raises ``OSError`` when the data cannot be read."""
    from llm_runs.sweeps.sweep import data_entry, model_entry

    return dask_engine.folder_params(GATE_KIND, **settings.to_dict(), model=model_entry(model_dir),
                                     data=data_entry(data, columns), device=device, threads=int(threads))


def _margins(pm, heldout: Mapping[str, Sequence]) -> dict[str, np.ndarray]:
    """The held-out margins ``z/β`` per objective (float64), scored as the study scores them."""
    return {o: (z / pm.settings.beta).numpy().astype(np.float64)
            for o, (_, z) in pm.grouped_pair_losses(heldout).items()}


def _train(pm, settings: GateSettings, objective: str, batches: dict[str, list]) -> list[float]:
    """``settings.steps`` full-batch AdamW steps on the λ-weighted loss at the oracle's target preference."""
    return train_oracle(pm, batches, settings.weights(objective), steps=settings.steps, lr=settings.lr,
                        max_pairs=settings.max_pairs)


def gate_cell(settings: GateSettings, objective: str, budget: int, draw: int, *, model_dir: str | None = None,
              data: str | None = None, device: str = "auto", threads: int = 1, cache_dir: str | None = None,
              columns: dict[str, str] | None = None) -> dict[str, Any]:
    """The oracle of ``objective`` at ``budget`` and ``draw``, trained and scored (module docstring; runs on a
    worker): the keys of :data:`CELL_KEYS`, the host, the CPU, the threads, λ, the held-out prompts, the weighted
    training loss before each step, the training loss and accuracy reached per objective, and per scored objective
    the held-out pairs' prompt ids and margin changes with their means; ``status: failed`` with ``error`` when it
    raised (the traceback on the worker's stderr)."""
    import traceback

    import torch

    row: dict[str, Any] = {"objective": objective, "budget": int(budget), "draw": int(draw), "status": "failed",
                           "seconds": None, "cpu_seconds": None, "host": socket.gethostname(), "cpu": cli.cpu_name(),
                           "threads": int(threads)}
    torch.set_num_threads(int(threads))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        row.update(_oracle(settings, objective, int(budget), int(draw), model_dir=model_dir, data=data,
                           device=device, cache_dir=cache_dir, columns=columns))
    except Exception as exc:  # noqa: BLE001 - a failed cell is a result: it says why
        traceback.print_exception(exc, file=sys.stderr)
        row["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())
    else:
        row["status"] = "complete"
    row.update(seconds=time.perf_counter() - wall0, cpu_seconds=time.process_time() - cpu0)
    return to_jsonable(row)


def _oracle(settings: GateSettings, objective: str, budget: int, draw: int, *, model_dir, data, device, cache_dir,
            columns) -> dict[str, Any]:
    from llm_runs.model.models import LoraSettings, add_lora, load_model
    from llm_runs.training.objectives import DPOSettings, PreferenceModel, pair_accuracy

    with _LOADING:
        model, tok = load_model(model_dir, cache_dir=cache_dir, device=device)
        cands, calibration = gate_candidates(settings, tok, data, columns, model_dir=model_dir)
    split = draw_split(cands, settings, calibration, draw)
    batches = split.train_batches(budget)
    pm = PreferenceModel(add_lora(model, LoraSettings(r=settings.lora_r, alpha=settings.lora_alpha, seed=draw)), tok,
                         DPOSettings(beta=settings.beta, label_smoothing=settings.label_smoothing,
                                     max_response_tokens=settings.max_response_tokens, autocast=None))
    heldout = {o: list(p) for o, p in split.heldout.items()}
    base = _margins(pm, heldout)
    for o, z in base.items():
        if not np.all(z == 0.0):
            raise AssertionError(f"the base model's held-out margins of {o!r} are not exactly 0 (max |z| "
                                 f"{np.abs(z).max():.3g}): policy and reference were not the same computation")
    history = _train(pm, settings, objective, batches)
    trained = pm.evaluate(batches)
    after = _margins(pm, heldout)
    scored = {}
    for o, z in after.items():
        change = z - base[o]
        scored[o] = {"pairs": len(change), "margin_change": float(change.mean()),
                     "accuracy": float(pair_accuracy(change).mean()),
                     "prompt_ids": [p.prompt_id for p in heldout[o]], "margins": change.tolist()}
    return {"weights": dict(zip(settings.objectives, settings.weights(objective).tolist(), strict=True)),
            "model": {"name": "embedded default" if model_dir is None else Path(model_dir).name,
                      "device": str(pm.device), "lora_parameters": pm.n_params},
            "base_margins_max_abs": max(float(np.abs(z).max()) for z in base.values()),
            "heldout_prompt_ids": list(split.heldout_prompt_ids), "train_prompts": len(split.train_prompt_ids),
            "train_loss_history": history, "train": trained, "heldout": scored}


#: Loading a model is not thread-safe in transformers (its meta-device context is process-wide: two loads at once
#: in one process raised "Cannot copy out of meta tensor"): the cells of one process (a Dask worker with several
#: threads) load their model and data one at a time.
_LOADING = threading.Lock()


def _call_gate_cell(settings, objective, budget, draw, kw):
    return gate_cell(settings, objective, budget, draw, **kw)


def coordinates(settings: GateSettings, budgets: Sequence[int], draws: int) -> list[tuple[str, int, int]]:
    """Every cell's ``(objective, budget, draw)``, draw-major (the draws' first cells start first)."""
    return [(o, int(b), d) for d in range(int(draws)) for b in budgets for o in settings.objectives]


def gate_cells(out: str | Path, settings: GateSettings, budgets: Sequence[int], draws: int, **kw: Any) -> list[Cell]:
    """The cells of the gate (``kw``: the keywords of :func:`gate_cell` besides the coordinates)."""
    return [Cell(f"{o}/b{b}-d{d}", cell_path(out, o, b, d), _call_gate_cell, (settings, o, b, d, kw))
            for o, b, d in coordinates(settings, budgets, draws)]


def read_cells(out: str | Path, settings: GateSettings, budgets: Sequence[int], draws: int
               ) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The finished cells ``{(objective, budget, draw): result}``; :class:`CellFolderError` for a cell file that is
    not the result of its coordinates."""
    found = {}
    for key in coordinates(settings, budgets, draws):
        p = cell_path(out, *key)
        if not p.is_file():
            continue
        row = read_cell(p)
        if not isinstance(row, dict) or any(k not in row for k in CELL_KEYS) \
                or (row["objective"], row["budget"], row["draw"]) != key:
            raise CellFolderError(f"{str(p)!r} is not the gate cell of objective {key[0]!r}, budget {key[1]}, draw "
                                  f"{key[2]}: remove it to compute the cell again")
        found[key] = row
    return found


def run_gate(client, out: str | Path, settings: GateSettings, budgets: Sequence[int], draws: int, *,
             model_dir: str | None = None, data: str | None = None, device: str = "auto", threads: int = 1,
             cache_dir: str | None = None, columns: dict[str, str] | None = None, progress: bool = True,
             on_written: Callable[[Cell, Any], None] | None = None) -> CellRun:
    """Run the cells not yet in ``out`` on the cluster of ``client`` (``params.json`` checked and written first; with
    every cell present ``client`` may be None)."""
    out = Path(out)
    model_dir = None if model_dir is None else str(Path(model_dir).expanduser().resolve())
    data = None if data is None else str(Path(data).expanduser().resolve())
    params = gate_params(settings, model_dir=model_dir, data=data, device=device, threads=threads, columns=columns)
    dask_engine.check_params(out, params)
    dask_engine.write_params(out, params)
    read_cells(out, settings, budgets, draws)
    cells = gate_cells(out, settings, budgets, draws, model_dir=model_dir, data=data, device=device,
                       threads=int(threads), cache_dir=cache_dir, columns=columns or None)
    return dask_engine.run_cells(client, cells, desc="llm-gate", progress=progress, on_written=on_written)


# ------------------------------------------------------------------------------------------------ statistics


def prompt_units(prompt_ids: Sequence[str], values: Any) -> np.ndarray:
    """The mean of ``values`` per prompt (in the order the prompts first appear): one unit per prompt."""
    v = np.asarray(values, dtype=np.float64)
    ids = list(dict.fromkeys(prompt_ids))
    index = {p: k for k, p in enumerate(ids)}
    at = np.array([index[p] for p in prompt_ids], dtype=np.int64)
    return np.bincount(at, weights=v, minlength=len(ids)) / np.bincount(at, minlength=len(ids))


def sign_flip_p(units: np.ndarray, *, n_perm: int = N_PERM, rng: np.random.Generator) -> float:
    """One-sided p-value of ``mean(units) > 0``: ``(1 + #{T_flip ≥ T}) / (1 + n_perm)`` over ``n_perm`` random sign
    flips of the units (module docstring)."""
    u = np.asarray(units, dtype=np.float64)
    if u.ndim != 1 or not len(u):
        raise ValueError(f"sign_flip_p needs a non-empty vector of unit values; got shape {u.shape}")
    signs = rng.choice(np.array([-1.0, 1.0]), size=(int(n_perm), len(u)))
    observed = float(u.sum())
    flipped = signs @ u
    tol = 1e-12 * max(1.0, float(np.abs(u).sum()))
    return float((1 + np.count_nonzero(flipped >= observed - tol)) / (1 + int(n_perm)))


def sign_flip_mde(units: np.ndarray, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest shift δ of the units' mean that the one-sided sign-flip test (:func:`sign_flip_p`) detects at
    level ``alpha`` with probability ``power``, for units of the sample sd ``s`` of ``units`` (normal approximation).
    The test compares ``Σu`` with ``z_(1-alpha) sqrt(Σu²)``, the sd of its sign-flip null, so it rejects when the
    mean exceeds ``c = s a / sqrt(1 - a²)`` with ``a = z_(1-alpha)/√n``; the mean, of sd ``s/√n``, exceeds ``c`` with
    probability ``power`` at ``δ = c + z_power s/√n``. None for fewer than two units, or where ``a ≥ 1`` (so few
    units that no shift reaches the level)."""
    u = np.asarray(units, dtype=np.float64)
    n = len(u)
    if n < 2:
        return None
    s = float(np.std(u, ddof=1))
    a = float(stats.norm.ppf(1 - alpha)) / np.sqrt(n)
    if a >= 1:
        return None
    return float(s * (a / np.sqrt(1 - a * a) + float(stats.norm.ppf(power)) / np.sqrt(n)))


def one_sided(units: np.ndarray, *, shift: float = 0.0, n_perm: int = N_PERM, n_boot: int = N_BOOT
              ) -> dict[str, Any]:
    """``estimate`` (``shift`` + the mean of the units), its 95 % bootstrap ``interval`` over the units, the
    sign-flip ``p_value`` of mean > 0, from ``default_rng(STAT_SEED)`` each, and ``mde``: the effect on the mean that
    the test detects with power :data:`POWER` at level :data:`ALPHA` (:func:`sign_flip_mde`)."""
    u = np.asarray(units, dtype=np.float64)
    boot = _resample(np.random.default_rng(STAT_SEED), len(u), int(n_boot)) @ u / len(u)
    lo, hi = _percentile(boot)
    mde = sign_flip_mde(u)
    return {"estimate": shift + float(u.mean()),
            "interval": [None if lo is None else shift + lo, None if hi is None else shift + hi],
            "p_value": sign_flip_p(u, n_perm=n_perm, rng=np.random.default_rng(STAT_SEED)), "units": len(u),
            "mde": mde}


def pooled_scores(cells: Sequence[Mapping[str, Any]], objective: str, *, n_perm: int = N_PERM,
                  n_boot: int = N_BOOT) -> dict[str, Any]:
    """The pooled margin change ``z`` and accuracy of the scored ``objective`` over ``cells`` (the draws of one
    objective and budget): units the (draw, held-out prompt) pairs (module docstring)."""
    from llm_runs.training.objectives import pair_accuracy

    margin, acc = [], []
    for c in cells:
        h = c["heldout"][objective]
        margin.append(prompt_units(h["prompt_ids"], h["margins"]))
        acc.append(prompt_units(h["prompt_ids"], pair_accuracy(h["margins"]) - 0.5))
    z = one_sided(np.concatenate(margin), n_perm=n_perm, n_boot=n_boot)
    a = one_sided(np.concatenate(acc), shift=0.5, n_perm=n_perm, n_boot=n_boot)
    return {"z": z["estimate"], "z_interval": z["interval"], "p_margin": z["p_value"],
            "accuracy": a["estimate"], "accuracy_interval": a["interval"], "p_accuracy": a["p_value"],
            "mde_margin": z["mde"], "mde_accuracy": a["mde"], "units": z["units"], "pairs": int(sum(len(c["heldout"][objective]["margins"]) for c in cells))}


def passes(own: Mapping[str, Any], alpha: float = ALPHA) -> bool:
    """The gate's rule on an oracle's own objective: margin change and accuracy above the base model's, p < alpha
    each."""
    return bool(own["z"] > 0 and own["p_margin"] < alpha and own["accuracy"] > 0.5 and own["p_accuracy"] < alpha)


# ------------------------------------------------------------------------------------------------ summary


RULE = (f"objective o passes at budget b when its oracle's held-out margin change and preference accuracy on o are "
        f"both above the base model's with one-sided p < {ALPHA} each (sign-flip permutation over the held-out prompts "
        "of all draws as units); it passes the gate at the smallest budget at which it passes; the spill-over onto "
        "the other objectives is reported, not gated")


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def summarize(params: dict[str, Any], settings: GateSettings, budgets: Sequence[int], draws: int,
              rows: Mapping[tuple[str, int, int], dict[str, Any]], calibration_ids: Sequence[str],
              run: CellRun | None = None, *, n_perm: int = N_PERM, n_boot: int = N_BOOT) -> dict[str, Any]:
    """The object of ``gate.json`` from the finished cells (module docstring)."""
    objectives = settings.objectives
    by_cell, table = [], []
    matrix: dict[str, dict[str, dict[str, dict[str, float | None]]]] = {}
    for o, b, d in coordinates(settings, budgets, draws):
        r = rows.get((o, b, d))
        entry = {"objective": o, "budget": b, "draw": d, "status": "missing" if r is None else r["status"]}
        if r is not None:
            entry.update(seconds=r["seconds"], cpu_seconds=r["cpu_seconds"])
            if r.get("error"):
                entry["error"] = r["error"]
        by_cell.append(entry)
    for b in budgets:
        mz: dict[str, dict[str, float | None]] = {}
        ma: dict[str, dict[str, float | None]] = {}
        for o in objectives:
            cells = [rows.get((o, int(b), d)) for d in range(draws)]
            done = [c for c in cells if c is not None and c["status"] == "complete"]
            line: dict[str, Any] = {"objective": o, "budget": int(b), "draws": len(done), "of_draws": int(draws),
                                    "cpu_seconds": [c["cpu_seconds"] for c in cells if c is not None]}
            if len(done) < draws:
                line.update(status="incomplete", passed=None)
                mz[o] = {k: None for k in objectives}
                ma[o] = {k: None for k in objectives}
                table.append(line)
                continue
            scores = {k: pooled_scores(done, k, n_perm=n_perm, n_boot=n_boot) for k in objectives}
            own = scores[o]
            line.update(status="complete", **{k: own[k] for k in ("z", "z_interval", "p_margin", "accuracy",
                                                                  "accuracy_interval", "p_accuracy", "mde_margin", "mde_accuracy",
                                                                  "units", "pairs")},
                        passed=passes(own),
                        train_accuracy=_mean([c["train"][o]["accuracy"] for c in done]),
                        train_loss=_mean([c["train"][o]["loss"] for c in done]),
                        per_draw=[{"draw": c["draw"], "margin_change": c["heldout"][o]["margin_change"],
                                   "accuracy": c["heldout"][o]["accuracy"],
                                   "train_accuracy": c["train"][o]["accuracy"], "train_loss": c["train"][o]["loss"]}
                                  for c in done],
                        scored=scores)
            mz[o] = {k: scores[k]["z"] for k in objectives}
            ma[o] = {k: scores[k]["accuracy"] for k in objectives}
            table.append(line)
        matrix[str(int(b))] = {"z": mz, "accuracy": ma}
    passed = {}
    for o in objectives:
        ok = [e["budget"] for e in table if e["objective"] == o and e.get("passed")]
        passed[o] = min(ok) if ok else None
    cpu = [float(e["cpu_seconds"]) for e in by_cell if isinstance(e.get("cpu_seconds"), (int, float))]
    n_done = sum(e["status"] != "missing" for e in by_cell)
    n_complete = sum(e["status"] == "complete" for e in by_cell)
    summary: dict[str, Any] = {
        "gate": GATE_KIND, "params": params,
        "settings": {**settings.to_dict(), "model": params.get("model"), "data": params.get("data"),
                     "budgets": [int(b) for b in budgets], "draws": int(draws), "optimizer": "AdamW, weight decay 0",
                     "alpha": ALPHA, "power": POWER, "n_perm": int(n_perm), "n_boot": int(n_boot), "stat_seed": STAT_SEED},
        "rule": RULE,
        "mde": f"the shift of the units' mean (margin change z, accuracy above 0.5) that each sign-flip test detects "
               f"with power {POWER} at level {ALPHA}, for units of the observed sample sd (normal approximation: "
               "llm_runs.sweeps.gate.sign_flip_mde)",
        "pooling": "units are the (draw, held-out prompt) pairs of all draws; a unit's value is the mean over its "
                   "pairs; statistic the mean of the units",
        "calibration_prompt_ids": list(calibration_ids),
        "cells": {"requested": len(by_cell), "finished": n_done, "complete": n_complete,
                  "failed": n_done - n_complete, "missing": len(by_cell) - n_done},
        "by_cell": by_cell, "table": table, "matrix": matrix, "passes_at": passed,
        "passed": [o for o in objectives if passed[o] is not None],
        "cpu_seconds_per_cell": {"mean": _mean(cpu), "max": max(cpu, default=None)},
    }
    if run is not None:
        from llm_runs.sweeps.sweep import last_run

        summary["last_run"] = last_run(run)
    return to_jsonable(summary)


def write_summary(out: str | Path, summary: dict[str, Any]) -> Path:
    """Write ``gate.json`` to ``out`` (atomically); returns its path."""
    from llm_runs.sweeps.sweep import write_json

    return write_json(Path(out) / SUMMARY_JSON, summary)


def _num(v: Any, fmt: str) -> str:
    return "-" if not isinstance(v, (int, float)) else format(v, fmt)


def _interval(iv: Any, fmt: str) -> str:
    return f"[{_num(iv[0], fmt)}, {_num(iv[1], fmt)}]" if iv else "-"


def screen(summary: dict[str, Any], out: Path, run: CellRun | None) -> str:
    """The short summary the command line prints: the table objective × budget and the spill-over matrices."""
    lines = []
    if run is not None:
        lines += run.screen_lines("llm gate", Path(out) / CELLS_DIR)
    for e in summary["by_cell"]:
        if e.get("error"):
            lines.append(f"  cell {e['objective']}/b{e['budget']}-d{e['draw']}: {e['error']} (remove "
                         f"{cell_path(out, e['objective'], e['budget'], e['draw'])} to run it again)")
    table = [[*GATE_HEADER, "CPU s"]] + [
        [*row, f"{sum(v for v in e['cpu_seconds'] if isinstance(v, (int, float))):.1f}"]
        for row, e in zip(gate_rows(summary), summary["table"], strict=True)]
    widths = [max(len(r[k]) for r in table) for k in range(len(table[0]))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    objectives = summary["settings"]["objectives"]
    for b, m in summary["matrix"].items():
        lines.append(f"  spill-over at budget {b}: z of the oracle of each row on each column")
        lines.append("    " + " " * 16 + "".join(f" {k[:12]:>12}" for k in objectives))
        for o in objectives:
            lines.append(f"    {o:<16}" + "".join(f" {_num(m['z'][o][k], '+.4f'):>12}" for k in objectives))
    passed = ", ".join(f"{o} (budget {b})" for o, b in summary["passes_at"].items() if b is not None) or "none"
    lines.append(f"  pass the gate: {passed}; {summary['cells']['complete']} of {summary['cells']['requested']} "
                 f"cells complete; wrote {Path(out) / SUMMARY_JSON}")
    return "\n".join(lines)


def failed(summary: dict[str, Any], run: CellRun | None) -> bool:
    """True iff a cell is missing or failed."""
    return (run is not None and not run.complete) or summary["cells"]["complete"] < summary["cells"]["requested"]


# ------------------------------------------------------------------------------------------------ admission


class GateRefusal(ValueError):
    """A gate folder does not admit a run: not a gate's, made on another model, data file, response length or pair
    margin, or an objective of the run did not pass it; the message names the folder and why."""


def _differs(what: str, there: Any, here: Any, path: str) -> GateRefusal:
    return GateRefusal(f"the gate {path!r} was made with {what} {there!r}, this run uses {here!r}: run the gate on "
                       "the run's model, data and response length (python -m llm_runs gate)")


def _failing(summary: dict[str, Any], objective: str) -> str:
    """``objective``'s rows of the gate's table, as the dashboard shows them (:func:`~verification.llm.answer.gate_rows`:
    z, accuracy, their p-values and minimum detectable effects, the verdict)."""
    rows = [(e, r) for e, r in zip(summary["table"], gate_rows(summary), strict=True) if e["objective"] == objective]
    return "; ".join(f"budget {e['budget']}: {r[-1]}, " + ", ".join(f"{h} {v}" for h, v in zip(GATE_HEADER[3:9],
                                                                                             r[3:9], strict=True))
                     for e, r in rows) or "no row in its table"


def admit(folder: str | Path, *, objectives: Sequence[str] | None, min_objectives: int, model_dir: str | None,
          max_response_tokens: int, margin: float, data: str | Path | None = None,
          columns: dict[str, str] | None = None) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The objectives a run may train on by the gate in ``folder`` (its ``gate.json``,
    :func:`verification.llm.answer.read_gate`) and the gate's identity: ``(objectives, {"path", "sha256",
    "passed"})``. The gate must have been made on the run's model (``model_dir``), data file (the SHA-256 of the
    bytes a run reads and the ``columns`` mapping, :func:`llm_runs.sweeps.sweep.data_entry`; hashed last), response
    length and pair margin; every one of ``objectives`` must have passed it (an objective that did not is named with
    its rows of the gate's table); without ``objectives`` the run's are those that passed, in the gate's order, and
    there must be at least ``min_objectives`` of them (given ``objectives`` are the caller's to count). Raises
    :class:`GateRefusal`."""
    import hashlib

    from llm_runs.sweeps.sweep import data_entry, model_entry
    from verification.llm.answer import GATE_JSON, read_gate

    try:
        summary = read_gate(folder)
    except ValueError as exc:
        raise GateRefusal(str(exc)) from None
    path = str(Path(folder).expanduser().resolve())
    s = summary["settings"]
    for what, there, here in (("model", s.get("model"), model_entry(model_dir)),
                              ("max_response_tokens", s.get("max_response_tokens"), int(max_response_tokens)),
                              ("pair margin", s.get("margin"), float(margin))):
        if there != here:
            raise _differs(what, there, here, path)
    found = s.get("data") or {}
    entry = data_entry(data, columns)
    if found.get("sha256") != entry["sha256"]:
        raise _differs("the data file of sha256", found.get("sha256"), f"{entry['path']} of sha256 {entry['sha256']}",
                       path)
    if found.get("columns") != entry.get("columns"):
        raise _differs("the data columns", found.get("columns"), entry.get("columns"), path)
    candidates = list(s.get("objectives") or [])
    passed = tuple(o for o in candidates if summary["passes_at"].get(o) is not None)
    if objectives is not None:
        unknown = [o for o in objectives if o not in candidates]
        if unknown:
            raise GateRefusal(f"objective(s) {', '.join(map(repr, unknown))} are not among the candidates of the gate "
                              f"{path!r} ({', '.join(candidates)}): run the gate on them first")
        failing = [o for o in objectives if o not in passed]
        if failing:
            raise GateRefusal("; ".join(f"objective {o!r} did not pass the gate {path!r} ({_failing(summary, o)})"
                                        for o in failing))
        chosen = tuple(objectives)
    else:
        chosen = passed
    if objectives is None and len(chosen) < int(min_objectives):
        raise GateRefusal(f"the gate {path!r} passed {len(passed)} of its candidates ({', '.join(passed) or 'none'} "
                          f"of {', '.join(candidates)}); the run needs at least {int(min_objectives)} objectives")
    digest = hashlib.sha256((Path(folder) / GATE_JSON).read_bytes()).hexdigest()
    return chosen, {"path": path, "sha256": digest, "passed": passed}


# ------------------------------------------------------------------------------------------------ command line


def command(args, settings: GateSettings, params: dict[str, Any], calibration_ids: Sequence[str],
            prog: str = "python -m llm_runs") -> int:
    """``gate`` after the usage checks (:mod:`llm_runs.__main__`): under the folder's writer lock, run the cells
    still missing, write and print the summary; returns the exit status."""
    from llm_runs.sweeps.sweep import locked, on_cluster, where

    def body() -> int:
        out = Path(args.out)
        keys = coordinates(settings, args.budgets, args.draws)
        pending = sum(not cell_path(out, *k).is_file() for k in keys)
        print(f"llm gate: {len(settings.objectives)} objective(s) x {len(args.budgets)} budget(s) x {args.draws} "
              f"draw(s) = {len(keys)} cells: {pending} to compute{where(args, pending)}, results in {out}",
              file=sys.stderr, flush=True)

        def go(client):
            return run_gate(client, out, settings, args.budgets, args.draws, model_dir=args.model, data=args.data,
                            device=args.device, threads=args.threads, cache_dir=args.cache_dir,
                            columns=args.columns, progress=not args.quiet)

        run = on_cluster(args, pending, go, prog)
        if isinstance(run, int):
            return run
        summary = summarize(params, settings, args.budgets, args.draws,
                            read_cells(out, settings, args.budgets, args.draws), calibration_ids, run=run)
        write_summary(out, summary)
        print(screen(summary, out, run))
        return cli.EXIT_FAIL if failed(summary, run) else cli.EXIT_OK

    return locked(args, body, prog)
