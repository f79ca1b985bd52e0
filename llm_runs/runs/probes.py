r"""Measurements on real data: gradient conflict at the base model, and a short single-objective DPO run.

**Synthetic clients** (:func:`synthetic_clients`): client ``i`` holds ``prompts_per_client`` prompts drawn
without replacement (disjoint across clients) and, per objective, up to ``pairs_per_objective`` preference pairs
from its prompts. All objectives' pairs of a client are built on the same few candidate responses.

**Gradient conflict** (:func:`gradient_conflict`): per client, the normalised Gram matrix
``C_jk / sqrt(C_jj C_kk)`` (the cosine between the per-objective gradients ``∇l_j`` and ``∇l_k`` over the LoRA
parameters) at the current parameters; at the LoRA initialisation (``B = 0``) the policy is the reference model.
A negative off-diagonal entry means that a step that lowers one objective's loss raises the other's, to first
order.

**Which prompts** (:func:`select_prompts`): a probe can be held to one side of
:func:`llm_runs.preferences.clients.calibration_split`: the calibration prompts, on which objectives are chosen, or the study
prompts, which a choice must never see. The pair margin's within-prompt sd is then pooled over that side only.

**DPO probe** (:func:`dpo_probe`): full-batch conservative-DPO steps on one objective's pairs with AdamW, the
training loss and the held-out loss and accuracy of every objective recorded each step, and the minimum training
loss against the floor ``H(ε)``.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from llm_runs.preferences.data import Candidates, preference_pairs

__all__ = ["PROMPT_SIDES", "dpo_probe", "gradient_conflict", "select_prompts", "synthetic_clients"]

#: The prompt sets :func:`select_prompts` can keep (the ``--prompts`` option of ``probe`` and ``data stats``).
PROMPT_SIDES = ("calibration", "study", "all")


def select_prompts(cands: Candidates, side: str) -> Candidates:
    """``cands`` with only the prompts of ``side`` (``"calibration"`` or ``"study"``: that side of
    :func:`llm_runs.preferences.clients.calibration_split` of the file's prompt ids; ``"all"``: every prompt), in file order.
    Raises ``ValueError`` naming an unknown side, or a side without prompts."""
    from llm_runs.preferences.clients import calibration_split

    if side not in PROMPT_SIDES:
        raise ValueError(f"unknown prompt side {side!r}; choose one of {', '.join(PROMPT_SIDES)}")
    if side == "all":
        return cands
    calibration, study = calibration_split(cands.prompt_ids)
    keep = set(calibration if side == "calibration" else study)
    idx = [i for i, p in enumerate(cands.prompt_ids) if p in keep]
    if not idx:
        raise ValueError(f"data file {cands.path} has no {side} prompts (of {len(cands.prompt_ids)})")

    def rows(x):
        return tuple(x[i] for i in idx) if isinstance(x, tuple) else x[idx]

    return replace(
        cands, prompt_ids=rows(cands.prompt_ids), prompts=rows(cands.prompts), responses=rows(cands.responses),
        n_tokens=rows(cands.n_tokens), finished=rows(cands.finished),
        scores={k: rows(v) for k, v in cands.scores.items()},
        cut_off=rows(cands.cut_off) if cands.cut_off else cands.cut_off,
        calls=rows(cands.calls) if len(cands.calls) else cands.calls,
        call_seconds=rows(cands.call_seconds) if len(cands.call_seconds) else cands.call_seconds,
        full_scores={k: rows(v) for k, v in cands.full_scores.items()},
        present=None if cands.present is None else rows(cands.present),
    )


def synthetic_clients(
    cands: Candidates,
    objectives,
    *,
    n_clients: int,
    prompts_per_client: int,
    pairs_per_objective: int,
    rng: np.random.Generator,
    margin: float = 0.25,
    exclude=(),
) -> list[dict[str, list]]:
    """Per client, ``{objective: pairs}`` drawn from disjoint random prompt sets (see the module docstring)."""
    objectives = cands.check_objectives(objectives)
    pool = [p for p in cands.prompt_ids if p not in set(exclude)]
    need = n_clients * prompts_per_client
    if need > len(pool):
        raise ValueError(f"{n_clients} clients x {prompts_per_client} prompts need {need} prompts; {len(pool)} available")
    chosen = rng.choice(len(pool), size=need, replace=False)
    clients = []
    for i in range(n_clients):
        ids = [pool[k] for k in chosen[i * prompts_per_client : (i + 1) * prompts_per_client]]
        batches = {}
        for o in objectives:
            pairs = preference_pairs(cands, o, margin=margin, prompt_ids=ids)
            if not pairs:
                raise ValueError(f"client {i}: objective {o!r} has no pair on prompts {ids}")
            take = rng.choice(len(pairs), size=min(pairs_per_objective, len(pairs)), replace=False)
            batches[o] = [pairs[k] for k in sorted(take)]
        clients.append(batches)
    return clients


def gradient_conflict(pm, clients, *, layout: str | None = None, progress=None) -> list[dict]:
    """Per client: losses, gradient norms and the normalised Gram matrix (cosines) of the objectives."""
    from llm_runs.training.objectives import DEFAULT_LAYOUT, objective_gradients

    out = []
    for i, batches in enumerate(clients):
        t0 = time.perf_counter()
        res = objective_gradients(pm, batches, layout=layout or DEFAULT_LAYOUT)
        C = res.gram
        if C is None:  # pragma: no cover - objective_gradients forms the Gram unless told not to
            raise AssertionError("objective_gradients returned no Gram")
        norms = np.sqrt(np.diag(C))
        cos = C / np.outer(norms, norms)
        out.append({
            "client": i,
            "objectives": list(res.objectives),
            "losses": res.losses.tolist(),
            "grad_norms": norms.tolist(),
            "cosine": cos.tolist(),
            "pairs": {o: len(p) for o, p in batches.items()},
            "seconds": time.perf_counter() - t0,
        })
        if progress is not None:
            progress(out[-1])
    return out


def dpo_probe(pm, train_pairs, heldout: dict, *, steps: int, lr: float, objective: str, weight_decay: float = 0.0,
              eval_every: int = 5, progress=None) -> dict:
    """Full-batch conservative-DPO steps on ``train_pairs`` (AdamW); the training loss before every step, the
    held-out loss and accuracy of every objective before step 0, every ``eval_every`` steps and at the end."""
    import torch

    from llm_runs.training.objectives import dpo_step

    opt = torch.optim.AdamW(pm.params, lr=lr, weight_decay=weight_decay)
    history = []
    ev = pm.evaluate(heldout)
    for step in range(steps):
        t0 = time.perf_counter()
        loss = dpo_step(pm, train_pairs, opt, objective)
        history.append({"step": step, "train_loss": loss, "seconds": time.perf_counter() - t0, "heldout": ev})
        ev = pm.evaluate(heldout) if (step + 1) % eval_every == 0 or step + 1 == steps else None
        if progress is not None:
            progress(history[-1])
    with torch.no_grad():
        final = pm.pair_losses(train_pairs)[0].mean().item()
    history.append({"step": steps, "train_loss": final, "heldout": ev})
    losses = [h["train_loss"] for h in history]
    return {"objective": objective, "floor": pm.settings.floor, "min_train_loss": min(losses),
            "history": history}
