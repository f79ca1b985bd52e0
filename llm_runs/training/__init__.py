"""The torch side of the LP step: per-objective DPO losses, their gradients over the LoRA parameters and the Gram
matrix (:mod:`~llm_runs.training.objectives`), and the torch source of Algorithm 1 at the kernel boundary
(:mod:`~llm_runs.training.source`).

Imports only the layers below it (:mod:`llm_runs.model`, :mod:`llm_runs.preferences`).
"""
