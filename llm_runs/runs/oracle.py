"""An oracle's training: plain λ-weighted conservative DPO on given pairs, the positive control against which a
personalised model is measured. The gate's oracles (:mod:`llm_runs.sweeps.gate`) and the shots curve's
(:mod:`llm_runs.runs.shots`) are trained by :func:`train_oracle`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["train_oracle"]


def train_oracle(pm, batches: Mapping[str, Sequence], lam, *, steps: int, lr: float,
                 max_pairs: int | None = None) -> list[float]:
    """An oracle's training (the "Oracle" of :mod:`llm_runs.sweeps.gate`), in place on ``pm``'s LoRA parameters from wherever they
    are: ``steps`` full-batch AdamW steps (no weight decay, learning rate ``lr``) on the λ-weighted conservative-DPO
    loss ``Σ_k λ_k l_k`` (:func:`llm_runs.training.objectives.weighted_gradient`) over ``batches`` (``{objective: pairs}``, in
    the order of ``lam``), a step's pairs in chunks of at most ``max_pairs`` (None: one pass); returns the weighted
    loss before every step."""
    import torch

    from llm_runs.training.objectives import weighted_gradient

    opt = torch.optim.AdamW(pm.params, lr=float(lr), weight_decay=0.0)
    history = []
    for _ in range(int(steps)):
        loss, grad = weighted_gradient(pm, batches, lam, max_pairs=max_pairs)
        pm.apply_flat(grad, optimizer=opt)
        history.append(loss)
    return history
